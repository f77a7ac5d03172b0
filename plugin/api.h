// Version-neutral entry points of the NCCL plugin. The net_vN.cc tables are one-line adapters
// onto these; they speak the newest ABI's types (v11). Every function validates its arguments,
// catches every exception and maps transport Status onto ncclResult_t in one place.
#pragma once

#include <cstddef>
#include <cstdint>

#include "plugin/nccl/net_v11.h"
#include "plugin/nccl/types.h"
#include "plugin/optireduce_net.h"
#include "transport/status.h"

namespace optireduce::plugin {

using nccl::ncclDebugLogger_t;
using nccl::ncclNetAttr_v11_t;
using nccl::ncclNetCommConfig_v11_t;
using nccl::ncclNetDeviceHandle_v11_t;
using nccl::ncclNetProperties_v11_t;
using nccl::ncclResult_t;

inline constexpr const char* kPluginName = OPTIREDUCE_NET_NAME;

// Largest message (maxP2pBytes and maxCollBytes). test() reports sizes as int, so a message
// must stay below 2^31; NCCL cuts larger transfers at this bound. A power of two keeps NCCL's
// own chunk arithmetic aligned, and 1 GiB is far above any chunk NCCL really posts (<= 4 MiB).
inline constexpr size_t kMaxMessageBytes = size_t{1} << 30;
static_assert(kMaxMessageBytes > 0 && kMaxMessageBytes <= nccl::NCCL_MAX_NET_SIZE_BYTES);
static_assert(kMaxMessageBytes <= static_cast<size_t>(INT32_MAX));

// The one map from the core's error classes to NCCL's.
ncclResult_t to_nccl(Status s) noexcept;

// v11+: one context per communicator. `config` may be null (treated as trafficClass unset).
// `abi`: the version of the table NCCL loaded (what NCCL can tell about each transfer).
// `profiler`: NCCL's callback for the plugin's own events (v10+; null otherwise).
ncclResult_t init(void** ctx, uint64_t comm_id, const ncclNetCommConfig_v11_t* config,
                  ncclDebugLogger_t logger, int abi,
                  nccl::ncclProfilerCallback_t profiler) noexcept;
ncclResult_t finalize(void* ctx) noexcept;
// v8..v10: NCCL calls init once per process and never finalize; one shared context stands for
// every communicator (comm id 0) and is released when the library is unloaded.
ncclResult_t init_legacy(ncclDebugLogger_t logger, int abi,
                         nccl::ncclProfilerCallback_t profiler) noexcept;
void* legacy_context() noexcept;

ncclResult_t devices(int* ndev) noexcept;
ncclResult_t get_properties(int dev, ncclNetProperties_v11_t* props) noexcept;

ncclResult_t listen(void* ctx, int dev, void* handle, void** listen_comm) noexcept;
// `config` is v10's per-connection traffic class; null for the other versions.
ncclResult_t connect(void* ctx, int dev, const ncclNetCommConfig_v11_t* config, void* handle,
                     void** send_comm, ncclNetDeviceHandle_v11_t** dev_comm) noexcept;
ncclResult_t accept(void* listen_comm, void** recv_comm,
                    ncclNetDeviceHandle_v11_t** dev_comm) noexcept;

ncclResult_t reg_mr(void* comm, void* data, size_t size, int type, void** mhandle) noexcept;
ncclResult_t reg_mr_dmabuf(void* comm, void* data, size_t size, int type, uint64_t offset, int fd,
                           void** mhandle) noexcept;
ncclResult_t dereg_mr(void* comm, void* mhandle) noexcept;

ncclResult_t isend(void* send_comm, void* data, size_t size, int tag, void* mhandle,
                   void** request) noexcept;
// `phandle`: NCCL's profiler handle of the (single) receive, v10+; null otherwise.
ncclResult_t irecv(void* recv_comm, int n, void** data, size_t* sizes, int* tags, void** mhandles,
                   void* phandle, void** request) noexcept;
ncclResult_t iflush(void* recv_comm, int n, void** data, int* sizes, void** mhandles,
                    void** request) noexcept;
ncclResult_t test(void* request, int* done, int* sizes) noexcept;

ncclResult_t close_send(void* send_comm) noexcept;
ncclResult_t close_recv(void* recv_comm) noexcept;
ncclResult_t close_listen(void* listen_comm) noexcept;

ncclResult_t set_net_attr(void* ctx, ncclNetAttr_v11_t* attr) noexcept;

}  // namespace optireduce::plugin
