// The exported ncclNetPlugin_v11 table (NCCL 2.28's native version): one-line adapters onto
// plugin/api.h, which already speaks the v11 types.
#include "plugin/nccl/net_v11.h"
#include "plugin/api.h"

namespace optireduce::plugin {
namespace {

using namespace optireduce::nccl;  // NOLINT: the ABI's own type names read best unqualified

ncclResult_t init_v11(void** ctx, uint64_t comm_id, ncclNetCommConfig_v11_t* config,
                      ncclDebugLogger_t logger, ncclProfilerCallback_t profiler) {
  return init(ctx, comm_id, config, logger, 11, profiler);
}
ncclResult_t connect_v11(void* ctx, int dev, void* handle, void** send_comm,
                         ncclNetDeviceHandle_v11_t** dev_comm) {
  // The traffic class came with init: the context carries it.
  return connect(ctx, dev, nullptr, handle, send_comm, dev_comm);
}
ncclResult_t isend_v11(void* comm, void* data, size_t size, int tag, void* mhandle,
                       void* /*phandle*/, void** request) {
  return isend(comm, data, size, tag, mhandle, request);
}
ncclResult_t irecv_v11(void* comm, int n, void** data, size_t* sizes, int* tags, void** mhandles,
                       void** phandles, void** request) {
  return irecv(comm, n, data, sizes, tags, mhandles, phandles != nullptr ? phandles[0] : nullptr,
               request);
}

}  // namespace
}  // namespace optireduce::plugin

// Defined outside any braced extern "C" block: there a const object would get internal linkage
// and never reach the dynamic symbol table.
extern "C" __attribute__((visibility("default")))
const optireduce::nccl::ncclNet_v11_t ncclNetPlugin_v11 = {
    .name = optireduce::plugin::kPluginName,
    .init = optireduce::plugin::init_v11,
    .devices = optireduce::plugin::devices,
    .getProperties = optireduce::plugin::get_properties,
    .listen = optireduce::plugin::listen,
    .connect = optireduce::plugin::connect_v11,
    .accept = optireduce::plugin::accept,
    .regMr = optireduce::plugin::reg_mr,
    .regMrDmaBuf = optireduce::plugin::reg_mr_dmabuf,
    .deregMr = optireduce::plugin::dereg_mr,
    .isend = optireduce::plugin::isend_v11,
    .irecv = optireduce::plugin::irecv_v11,
    .iflush = optireduce::plugin::iflush,
    .test = optireduce::plugin::test,
    .closeSend = optireduce::plugin::close_send,
    .closeRecv = optireduce::plugin::close_recv,
    .closeListen = optireduce::plugin::close_listen,
    .getDeviceMr = nullptr,
    .irecvConsumed = nullptr,
    .makeVDevice = nullptr,
    .finalize = optireduce::plugin::finalize,
    .setNetAttr = optireduce::plugin::set_net_attr,
};
