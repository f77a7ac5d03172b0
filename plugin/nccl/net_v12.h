// NCCL net-plugin ABI version 12 (NCCL 2.30): v11 with virtual NICs of up to 8 devices and the
// NIC's rail and plane at the end of the properties. Everything else NCCL declares anew for v12
// (config, device handle, attributes) has exactly v11's layout, so it is v11's type here: the
// adapters pass those through untouched, and the asserts below pin the v12 facts on them.
#pragma once

#include "plugin/nccl/net_v11.h"
#include "plugin/nccl/types.h"

namespace optireduce::nccl {

inline constexpr int NCCL_NET_MAX_DEVS_PER_NIC_V12 = 8;
// railId / planeId value NCCL's topology code skips: the plugin knows no rail or plane.
inline constexpr int16_t NCCL_NET_ID_UNDEF = -1;

struct ncclNetVDeviceProps_v12_t {
  int ndevs;
  int devs[NCCL_NET_MAX_DEVS_PER_NIC_V12];
};
static_assert(sizeof(ncclNetVDeviceProps_v12_t) == 36);
static_assert(offsetof(ncclNetVDeviceProps_v12_t, devs) == 4);

using ncclNetCommConfig_v12_t = ncclNetCommConfig_v11_t;
static_assert(sizeof(ncclNetCommConfig_v12_t) == 4);
static_assert(offsetof(ncclNetCommConfig_v12_t, trafficClass) == 0);

using ncclNetDeviceHandle_v12_t = ncclNetDeviceHandle_v11_t;
static_assert(sizeof(ncclNetDeviceHandle_v12_t) == 32);

using ncclNetCommAttr_v12_t = ncclNetCommAttr_v11_t;
using ncclNetAttr_v12_t = ncclNetAttr_v11_t;
static_assert(sizeof(ncclNetCommAttr_v12_t) == 16);
static_assert(sizeof(ncclNetAttr_v12_t) == 44);
static_assert(offsetof(ncclNetAttr_v12_t, sendCommAttr) == 0);
static_assert(offsetof(ncclNetAttr_v12_t, recvCommAttr) == 16);
static_assert(offsetof(ncclNetAttr_v12_t, op) == 32);
static_assert(offsetof(ncclNetAttr_v12_t, algo) == 36);
static_assert(offsetof(ncclNetAttr_v12_t, proto) == 40);

// The v11 fields in the v11 order; the wider vProps moves every later field by 16 bytes.
struct ncclNetProperties_v12_t {
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
  ncclNetVDeviceProps_v12_t vProps;
  size_t maxP2pBytes;
  size_t maxCollBytes;
  int maxMultiRequestSize;
  int16_t railId;   // NCCL_NET_ID_UNDEF: unknown
  int16_t planeId;  // NCCL_NET_ID_UNDEF: unknown
};
static_assert(sizeof(ncclNetProperties_v12_t) == 128);
static_assert(offsetof(ncclNetProperties_v12_t, name) == 0);
static_assert(offsetof(ncclNetProperties_v12_t, pciPath) == 8);
static_assert(offsetof(ncclNetProperties_v12_t, guid) == 16);
static_assert(offsetof(ncclNetProperties_v12_t, ptrSupport) == 24);
static_assert(offsetof(ncclNetProperties_v12_t, regIsGlobal) == 28);
static_assert(offsetof(ncclNetProperties_v12_t, forceFlush) == 32);
static_assert(offsetof(ncclNetProperties_v12_t, speed) == 36);
static_assert(offsetof(ncclNetProperties_v12_t, port) == 40);
static_assert(offsetof(ncclNetProperties_v12_t, latency) == 44);
static_assert(offsetof(ncclNetProperties_v12_t, maxComms) == 48);
static_assert(offsetof(ncclNetProperties_v12_t, maxRecvs) == 52);
static_assert(offsetof(ncclNetProperties_v12_t, netDeviceType) == 56);
static_assert(offsetof(ncclNetProperties_v12_t, netDeviceVersion) == 60);
static_assert(offsetof(ncclNetProperties_v12_t, vProps) == 64);
static_assert(offsetof(ncclNetProperties_v12_t, maxP2pBytes) == 104);
static_assert(offsetof(ncclNetProperties_v12_t, maxCollBytes) == 112);
static_assert(offsetof(ncclNetProperties_v12_t, maxMultiRequestSize) == 120);
static_assert(offsetof(ncclNetProperties_v12_t, railId) == 124);
static_assert(offsetof(ncclNetProperties_v12_t, planeId) == 126);

// v11's table with the v12 argument types: same slots, same order.
struct ncclNet_v12_t {
  const char* name;
  ncclResult_t (*init)(void** ctx, uint64_t commId, ncclNetCommConfig_v12_t* config,
                       ncclDebugLogger_t logFunction, ncclProfilerCallback_t profFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v12_t* props);
  ncclResult_t (*listen)(void* ctx, int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(void* ctx, int dev, void* handle, void** sendComm,
                          ncclNetDeviceHandle_v12_t** sendDevComm);
  ncclResult_t (*accept)(void* listenComm, void** recvComm,
                         ncclNetDeviceHandle_v12_t** recvDevComm);
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
  ncclResult_t (*makeVDevice)(int* d, ncclNetVDeviceProps_v12_t* props);
  ncclResult_t (*finalize)(void* ctx);
  ncclResult_t (*setNetAttr)(void* ctx, ncclNetAttr_v12_t* netAttr);
};
static_assert(sizeof(ncclNet_v12_t) == 176);
static_assert(offsetof(ncclNet_v12_t, init) == 1 * sizeof(void*));
static_assert(offsetof(ncclNet_v12_t, getProperties) == 3 * sizeof(void*));
static_assert(offsetof(ncclNet_v12_t, listen) == 4 * sizeof(void*));
static_assert(offsetof(ncclNet_v12_t, isend) == 10 * sizeof(void*));
static_assert(offsetof(ncclNet_v12_t, test) == 13 * sizeof(void*));
static_assert(offsetof(ncclNet_v12_t, getDeviceMr) == 17 * sizeof(void*));
static_assert(offsetof(ncclNet_v12_t, makeVDevice) == 19 * sizeof(void*));
static_assert(offsetof(ncclNet_v12_t, finalize) == 20 * sizeof(void*));
static_assert(offsetof(ncclNet_v12_t, setNetAttr) == 21 * sizeof(void*));

}  // namespace optireduce::nccl
