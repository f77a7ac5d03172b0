// The exported ncclNetPlugin_v12 table (NCCL 2.30's native version): v11's adapters, with the
// properties converted to the v12 layout. Config, device handle and attributes are v11's types
// (plugin/nccl/net_v12.h proves the layouts equal), so they reach plugin/api.h unchanged.
#include "plugin/nccl/net_v12.h"
#include "plugin/api.h"
#include "plugin/convert.h"

namespace optireduce::plugin {
namespace {

using namespace optireduce::nccl;  // NOLINT: the ABI's own type names read best unqualified

ncclResult_t init_v12(void** ctx, uint64_t comm_id, ncclNetCommConfig_v12_t* config,
                      ncclDebugLogger_t logger, ncclProfilerCallback_t profiler) {
  return init(ctx, comm_id, config, logger, 12, profiler);
}
ncclResult_t get_properties_v12(int dev, ncclNetProperties_v12_t* props) {
  ncclNetProperties_v11_t p;
  const ncclResult_t r = get_properties(dev, &p);
  if (r == ncclSuccess && props != nullptr) *props = to_v12(p);
  return props == nullptr ? ncclInternalError : r;
}
ncclResult_t connect_v12(void* ctx, int dev, void* handle, void** send_comm,
                         ncclNetDeviceHandle_v12_t** dev_comm) {
  // The traffic class came with init: the context carries it.
  return connect(ctx, dev, nullptr, handle, send_comm, dev_comm);
}
ncclResult_t isend_v12(void* comm, void* data, size_t size, int tag, void* mhandle,
                       void* /*phandle*/, void** request) {
  return isend(comm, data, size, tag, mhandle, request);
}
ncclResult_t irecv_v12(void* comm, int n, void** data, size_t* sizes, int* tags, void** mhandles,
                       void** phandles, void** request) {
  return irecv(comm, n, data, sizes, tags, mhandles, phandles != nullptr ? phandles[0] : nullptr,
               request);
}

}  // namespace
}  // namespace optireduce::plugin

// Outside any braced extern "C" block, so that the const object is exported (see net_v11.cc).
extern "C" __attribute__((visibility("default")))
const optireduce::nccl::ncclNet_v12_t ncclNetPlugin_v12 = {
    .name = optireduce::plugin::kPluginName,
    .init = optireduce::plugin::init_v12,
    .devices = optireduce::plugin::devices,
    .getProperties = optireduce::plugin::get_properties_v12,
    .listen = optireduce::plugin::listen,
    .connect = optireduce::plugin::connect_v12,
    .accept = optireduce::plugin::accept,
    .regMr = optireduce::plugin::reg_mr,
    .regMrDmaBuf = optireduce::plugin::reg_mr_dmabuf,
    .deregMr = optireduce::plugin::dereg_mr,
    .isend = optireduce::plugin::isend_v12,
    .irecv = optireduce::plugin::irecv_v12,
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
