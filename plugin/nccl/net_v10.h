// NCCL net-plugin ABI version 10: one process-wide init, the traffic class arrives in connect.
#pragma once

#include "plugin/nccl/types.h"

namespace optireduce::nccl {

// v9 and v10 properties: the v11 layout without maxMultiRequestSize.
struct ncclNetProperties_v10_t {
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int regIsGlobal;
  int forceFlush;
  int speed;
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
  int netDeviceType;
  int netDeviceVersion;
  ncclNetVDeviceProps_v10_t vProps;
  size_t maxP2pBytes;
  size_t maxCollBytes;
};
using ncclNetProperties_v9_t = ncclNetProperties_v10_t;
static_assert(sizeof(ncclNetProperties_v10_t) == 104);
static_assert(offsetof(ncclNetProperties_v10_t, pciPath) == 8);
static_assert(offsetof(ncclNetProperties_v10_t, guid) == 16);
static_assert(offsetof(ncclNetProperties_v10_t, ptrSupport) == 24);
static_assert(offsetof(ncclNetProperties_v10_t, regIsGlobal) == 28);
static_assert(offsetof(ncclNetProperties_v10_t, forceFlush) == 32);
static_assert(offsetof(ncclNetProperties_v10_t, speed) == 36);
static_assert(offsetof(ncclNetProperties_v10_t, port) == 40);
static_assert(offsetof(ncclNetProperties_v10_t, latency) == 44);
static_assert(offsetof(ncclNetProperties_v10_t, maxComms) == 48);
static_assert(offsetof(ncclNetProperties_v10_t, maxRecvs) == 52);
static_assert(offsetof(ncclNetProperties_v10_t, netDeviceType) == 56);
static_assert(offsetof(ncclNetProperties_v10_t, netDeviceVersion) == 60);
static_assert(offsetof(ncclNetProperties_v10_t, vProps) == 64);
static_assert(offsetof(ncclNetProperties_v10_t, maxP2pBytes) == 88);
static_assert(offsetof(ncclNetProperties_v10_t, maxCollBytes) == 96);

struct ncclNet_v10_t {
  const char* name;
  ncclResult_t (*init)(ncclDebugLogger_t logFunction, ncclProfilerCallback_t profFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v10_t* props);
  ncclResult_t (*listen)(int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(int dev, ncclNetCommConfig_v10_t* config, void* handle, void** sendComm,
                          ncclNetDeviceHandle_v10_t** sendDevComm);
  ncclResult_t (*accept)(void* listenComm, void** recvComm,
                         ncclNetDeviceHandle_v10_t** recvDevComm);
  ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset,
                              int fd, void** mhandle);
  ncclResult_t (*deregMr)(void* comm, void* mhandle);
  ncclResult_t (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle,
                        void* phandle, void** request);
  ncclResult_t (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags,
                        void** mhandles, void** phandles, void** request);
  ncclResult_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles,
                         void** request);
  ncclResult_t (*test)(void* request, int* done, int* sizes);
  ncclResult_t (*closeSend)(void* sendComm);
  ncclResult_t (*closeRecv)(void* recvComm);
  ncclResult_t (*closeListen)(void* listenComm);
  ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void* recvComm, int n, void* request);
  ncclResult_t (*makeVDevice)(int* d, ncclNetVDeviceProps_v10_t* props);
};
static_assert(sizeof(ncclNet_v10_t) == 160);
static_assert(offsetof(ncclNet_v10_t, connect) == 5 * sizeof(void*));
static_assert(offsetof(ncclNet_v10_t, isend) == 10 * sizeof(void*));
static_assert(offsetof(ncclNet_v10_t, test) == 13 * sizeof(void*));
static_assert(offsetof(ncclNet_v10_t, makeVDevice) == 19 * sizeof(void*));

}  // namespace optireduce::nccl
