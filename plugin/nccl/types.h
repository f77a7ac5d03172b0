// Our own declarations of the NCCL net-plugin ABI pieces shared by every version we export
// (v8..v11): result codes, logger, constants and the small structs. Written from the layout
// facts in shared/reference/nccl-net.md; every size and offset is pinned by a static_assert.
#pragma once

#include <cstddef>
#include <cstdint>

// Kept in a namespace so that plugin/abi_check.cc can include NCCL's own nccl.h beside these
// declarations and compare the two without name clashes.
namespace optireduce::nccl {

// Result codes: the values are ABI (checked against nccl.h by abi_check.cc).
enum ncclResult_t : int {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
};
static_assert(sizeof(ncclResult_t) == 4);

// Logger handed to init. Levels and subsystem bits as NCCL defines them.
enum ncclDebugLogLevel : int {
  NCCL_LOG_NONE = 0,
  NCCL_LOG_VERSION = 1,
  NCCL_LOG_WARN = 2,
  NCCL_LOG_INFO = 3,
  NCCL_LOG_ABORT = 4,
  NCCL_LOG_TRACE = 5,
};
inline constexpr unsigned long NCCL_INIT = 0x1;
inline constexpr unsigned long NCCL_NET = 0x10;
inline constexpr unsigned long NCCL_ENV = 0x80;
using ncclDebugLogger_t = void (*)(ncclDebugLogLevel level, unsigned long flags, const char* file,
                                   int line, const char* fmt, ...);
// Profiler hook given to v10+ init: the plugin reports its own events through it. `type`:
// 0 start (event_handle out, parent = the request's profiler handle, ext_data = the plugin's
// descriptor), 1 stop, 2 update (ext_data = update data), 3 update and stop.
inline constexpr int ncclProfilerNetEventStart = 0;
inline constexpr int ncclProfilerNetEventStop = 1;
inline constexpr int ncclProfilerNetEventUpdate = 2;
inline constexpr int ncclProfilerNetEventUpdateAndStop = 3;
using ncclProfilerCallback_t = ncclResult_t (*)(void** event_handle, int type, void* parent,
                                                int64_t plugin_id, void* ext_data);

// Constants.
inline constexpr int NCCL_NET_HANDLE_MAXSIZE = 128;
inline constexpr int NCCL_PTR_HOST = 0x1;
inline constexpr int NCCL_PTR_CUDA = 0x2;
inline constexpr int NCCL_PTR_DMABUF = 0x4;
inline constexpr int NCCL_NET_MAX_REQUESTS = 32;
inline constexpr int NCCL_NET_OPTIONAL_RECV_COMPLETION = 0x1;
inline constexpr int NCCL_NET_TRAFFIC_CLASS_UNDEF = -1;
inline constexpr int NCCL_NET_MAX_DEVS_PER_NIC = 4;  // devs[] of the virtual-device props
inline constexpr int NCCL_NET_DEVICE_HOST = 0;
inline constexpr int NCCL_NET_DEVICE_VERSION_HOST = 0;
// Upper bound NCCL accepts for maxP2pBytes / maxCollBytes (the lower bound is exclusive 0).
inline constexpr size_t NCCL_MAX_NET_SIZE_BYTES = size_t{1} << 40;
// Protocol bits of ncclNetAttr_v11_t::proto.
inline constexpr uint32_t NCCL_NET_PROTO_LL = 1u << 0;
inline constexpr uint32_t NCCL_NET_PROTO_LL128 = 1u << 1;
inline constexpr uint32_t NCCL_NET_PROTO_SIMPLE = 1u << 2;
// An attribute field NCCL has not set (its connect-time attribute leaves op/algo/proto so).
inline constexpr uint32_t NCCL_NET_ATTR_UNDEF_BITS = 0xFFFFFFFFu;
// Bits of ncclNetAttr_v11_t::op below 1 << NCCL_NUM_FUNCTIONS (5) are collectives (Broadcast,
// Reduce, AllGather, ReduceScatter, AllReduce); the ones above are point-to-point operations.
inline constexpr uint32_t NCCL_NET_OP_COLLECTIVES = (1u << 5) - 1;
// What NCCL may pre-store in *request before an LL/LL128 irecv.
inline void* const kOptionalRecvSentinel =
    reinterpret_cast<void*>(static_cast<uintptr_t>(NCCL_NET_OPTIONAL_RECV_COMPLETION));

// Virtual-device properties (v9, v10 and v11 share the layout).
struct ncclNetVDeviceProps_v11_t {
  int ndevs;
  int devs[NCCL_NET_MAX_DEVS_PER_NIC];
};
using ncclNetVDeviceProps_v10_t = ncclNetVDeviceProps_v11_t;
using ncclNetVDeviceProps_v9_t = ncclNetVDeviceProps_v11_t;
static_assert(sizeof(ncclNetVDeviceProps_v11_t) == 20);
static_assert(offsetof(ncclNetVDeviceProps_v11_t, devs) == 4);

// Per-communicator configuration (v11: init; v10: connect).
struct ncclNetCommConfig_v11_t {
  int trafficClass;  // NCCL_NET_TRAFFIC_CLASS_UNDEF when the user left it unset
};
using ncclNetCommConfig_v10_t = ncclNetCommConfig_v11_t;
static_assert(sizeof(ncclNetCommConfig_v11_t) == 4);

// Device-side handle of device-offload plugins. A HOST plugin leaves the out pointer NULL.
struct ncclNetDeviceHandle_v11_t {
  int netDeviceType;
  int netDeviceVersion;
  void* handle;
  size_t size;
  int needsProxyProgress;
};
using ncclNetDeviceHandle_v10_t = ncclNetDeviceHandle_v11_t;
using ncclNetDeviceHandle_v9_t = ncclNetDeviceHandle_v11_t;
using ncclNetDeviceHandle_v8_t = ncclNetDeviceHandle_v11_t;
static_assert(sizeof(ncclNetDeviceHandle_v11_t) == 32);
static_assert(offsetof(ncclNetDeviceHandle_v11_t, netDeviceVersion) == 4);
static_assert(offsetof(ncclNetDeviceHandle_v11_t, handle) == 8);
static_assert(offsetof(ncclNetDeviceHandle_v11_t, size) == 16);
static_assert(offsetof(ncclNetDeviceHandle_v11_t, needsProxyProgress) == 24);

// v11 setNetAttr: what the communicator will run over this network.
struct ncclNetCommAttr_v11_t {
  int32_t maxConcurrentPeers;
  int32_t minConcurrentPeers;
  int32_t maxFlowsPerPeer;
  int32_t minFlowsPerPeer;
};
static_assert(sizeof(ncclNetCommAttr_v11_t) == 16);
static_assert(offsetof(ncclNetCommAttr_v11_t, minConcurrentPeers) == 4);
static_assert(offsetof(ncclNetCommAttr_v11_t, maxFlowsPerPeer) == 8);
static_assert(offsetof(ncclNetCommAttr_v11_t, minFlowsPerPeer) == 12);

struct ncclNetAttr_v11_t {
  ncclNetCommAttr_v11_t sendCommAttr;
  ncclNetCommAttr_v11_t recvCommAttr;
  uint32_t op;     // bitmask over ncclFunc
  uint32_t algo;   // bitmask over algorithms
  uint32_t proto;  // NCCL_NET_PROTO_* bits
};
static_assert(sizeof(ncclNetAttr_v11_t) == 44);
static_assert(offsetof(ncclNetAttr_v11_t, recvCommAttr) == 16);
static_assert(offsetof(ncclNetAttr_v11_t, op) == 32);
static_assert(offsetof(ncclNetAttr_v11_t, algo) == 36);
static_assert(offsetof(ncclNetAttr_v11_t, proto) == 40);

}  // namespace optireduce::nccl
