// NCCL net-plugin ABI version 8: int message sizes, smaller properties, no virtual devices.
#pragma once

#include "plugin/nccl/types.h"

namespace optireduce::nccl {

struct ncclNetProperties_v8_t {
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int regIsGlobal;
  int speed;
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
  int netDeviceType;
  int netDeviceVersion;
};
static_assert(sizeof(ncclNetProperties_v8_t) == 64);
static_assert(offsetof(ncclNetProperties_v8_t, pciPath) == 8);
static_assert(offsetof(ncclNetProperties_v8_t, guid) == 16);
static_assert(offsetof(ncclNetProperties_v8_t, ptrSupport) == 24);
static_assert(offsetof(ncclNetProperties_v8_t, regIsGlobal) == 28);
static_assert(offsetof(ncclNetProperties_v8_t, speed) == 32);
static_assert(offsetof(ncclNetProperties_v8_t, port) == 36);
static_assert(offsetof(ncclNetProperties_v8_t, latency) == 40);
static_assert(offsetof(ncclNetProperties_v8_t, maxComms) == 44);
static_assert(offsetof(ncclNetProperties_v8_t, maxRecvs) == 48);
static_assert(offsetof(ncclNetProperties_v8_t, netDeviceType) == 52);
static_assert(offsetof(ncclNetProperties_v8_t, netDeviceVersion) == 56);

struct ncclNet_v8_t {
  const char* name;
  ncclResult_t (*init)(ncclDebugLogger_t logFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v8_t* props);
  ncclResult_t (*listen)(int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(int dev, void* handle, void** sendComm,
                          ncclNetDeviceHandle_v8_t** sendDevComm);
  ncclResult_t (*accept)(void* listenComm, void** recvComm, ncclNetDeviceHandle_v8_t** recvDevComm);
  ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset,
                              int fd, void** mhandle);
  ncclResult_t (*deregMr)(void* comm, void* mhandle);
  ncclResult_t (*isend)(void* sendComm, void* data, int size, int tag, void* mhandle,
                        void** request);
  ncclResult_t (*irecv)(void* recvComm, int n, void** data, int* sizes, int* tags, void** mhandles,
                        void** request);
  ncclResult_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles,
                         void** request);
  ncclResult_t (*test)(void* request, int* done, int* sizes);
  ncclResult_t (*closeSend)(void* sendComm);
  ncclResult_t (*closeRecv)(void* recvComm);
  ncclResult_t (*closeListen)(void* listenComm);
  ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void* recvComm, int n, void* request);
};
static_assert(sizeof(ncclNet_v8_t) == 152);
static_assert(offsetof(ncclNet_v8_t, connect) == 5 * sizeof(void*));
static_assert(offsetof(ncclNet_v8_t, isend) == 10 * sizeof(void*));
static_assert(offsetof(ncclNet_v8_t, test) == 13 * sizeof(void*));
static_assert(offsetof(ncclNet_v8_t, irecvConsumed) == 18 * sizeof(void*));

}  // namespace optireduce::nccl
