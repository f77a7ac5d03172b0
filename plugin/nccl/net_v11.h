// NCCL net-plugin ABI version 11 (NCCL 2.28): properties and the function table. Native
// version of our plugin: api.h speaks these types, older versions convert onto them.
#pragma once

#include "plugin/nccl/types.h"

namespace optireduce::nccl {

struct ncclNetProperties_v11_t {
  char* name;
  char* pciPath;  // NULL when the device has none
  uint64_t guid;
  int ptrSupport;   // NCCL_PTR_* bits
  int regIsGlobal;  // 1: a registration covers every comm of the device
  int forceFlush;   // 1: NCCL must flush even without GPUDirect
  int speed;        // Mbit/s
  int port;
  float latency;  // microseconds
  int maxComms;
  int maxRecvs;  // >1 only for grouped receives
  int netDeviceType;
  int netDeviceVersion;
  ncclNetVDeviceProps_v11_t vProps;
  size_t maxP2pBytes;
  size_t maxCollBytes;
  int maxMultiRequestSize;
};
static_assert(sizeof(ncclNetProperties_v11_t) == 112);
static_assert(offsetof(ncclNetProperties_v11_t, name) == 0);
static_assert(offsetof(ncclNetProperties_v11_t, pciPath) == 8);
static_assert(offsetof(ncclNetProperties_v11_t, guid) == 16);
static_assert(offsetof(ncclNetProperties_v11_t, ptrSupport) == 24);
static_assert(offsetof(ncclNetProperties_v11_t, regIsGlobal) == 28);
static_assert(offsetof(ncclNetProperties_v11_t, forceFlush) == 32);
static_assert(offsetof(ncclNetProperties_v11_t, speed) == 36);
static_assert(offsetof(ncclNetProperties_v11_t, port) == 40);
static_assert(offsetof(ncclNetProperties_v11_t, latency) == 44);
static_assert(offsetof(ncclNetProperties_v11_t, maxComms) == 48);
static_assert(offsetof(ncclNetProperties_v11_t, maxRecvs) == 52);
static_assert(offsetof(ncclNetProperties_v11_t, netDeviceType) == 56);
static_assert(offsetof(ncclNetProperties_v11_t, netDeviceVersion) == 60);
static_assert(offsetof(ncclNetProperties_v11_t, vProps) == 64);
static_assert(offsetof(ncclNetProperties_v11_t, maxP2pBytes) == 88);
static_assert(offsetof(ncclNetProperties_v11_t, maxCollBytes) == 96);
static_assert(offsetof(ncclNetProperties_v11_t, maxMultiRequestSize) == 104);

struct ncclNet_v11_t {
  const char* name;
  ncclResult_t (*init)(void** ctx, uint64_t commId, ncclNetCommConfig_v11_t* config,
                       ncclDebugLogger_t logFunction, ncclProfilerCallback_t profFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v11_t* props);
  ncclResult_t (*listen)(void* ctx, int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(void* ctx, int dev, void* handle, void** sendComm,
                          ncclNetDeviceHandle_v11_t** sendDevComm);
  ncclResult_t (*accept)(void* listenComm, void** recvComm,
                         ncclNetDeviceHandle_v11_t** recvDevComm);
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
  ncclResult_t (*makeVDevice)(int* d, ncclNetVDeviceProps_v11_t* props);
  ncclResult_t (*finalize)(void* ctx);
  ncclResult_t (*setNetAttr)(void* ctx, ncclNetAttr_v11_t* netAttr);
};
static_assert(sizeof(ncclNet_v11_t) == 176);
static_assert(offsetof(ncclNet_v11_t, init) == 1 * sizeof(void*));
static_assert(offsetof(ncclNet_v11_t, listen) == 4 * sizeof(void*));
static_assert(offsetof(ncclNet_v11_t, isend) == 10 * sizeof(void*));
static_assert(offsetof(ncclNet_v11_t, test) == 13 * sizeof(void*));
static_assert(offsetof(ncclNet_v11_t, getDeviceMr) == 17 * sizeof(void*));
static_assert(offsetof(ncclNet_v11_t, makeVDevice) == 19 * sizeof(void*));
static_assert(offsetof(ncclNet_v11_t, finalize) == 20 * sizeof(void*));
static_assert(offsetof(ncclNet_v11_t, setNetAttr) == 21 * sizeof(void*));

}  // namespace optireduce::nccl
