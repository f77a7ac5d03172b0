// The exported ncclNetPlugin_v10 table: one process-wide init (no finalize), the traffic class
// arrives with each connect. Adapters shim onto plugin/api.h with the shared legacy context.
#include "plugin/nccl/net_v10.h"
#include "plugin/api.h"
#include "plugin/convert.h"

namespace optireduce::plugin {
namespace {

using namespace optireduce::nccl;  // NOLINT: the ABI's own type names read best unqualified

ncclResult_t init_v10(ncclDebugLogger_t logger, ncclProfilerCallback_t profiler) {
  return init_legacy(logger, 10, profiler);
}
ncclResult_t get_properties_v10(int dev, ncclNetProperties_v10_t* props) {
  ncclNetProperties_v11_t p;
  const ncclResult_t r = get_properties(dev, &p);
  if (r == ncclSuccess && props != nullptr) *props = to_v10(p);
  return props == nullptr ? ncclInternalError : r;
}
ncclResult_t listen_v10(int dev, void* handle, void** listen_comm) {
  return listen(legacy_context(), dev, handle, listen_comm);
}
ncclResult_t connect_v10(int dev, ncclNetCommConfig_v10_t* config, void* handle, void** send_comm,
                         ncclNetDeviceHandle_v10_t** dev_comm) {
  return connect(legacy_context(), dev, config, handle, send_comm, dev_comm);
}
ncclResult_t isend_v10(void* comm, void* data, size_t size, int tag, void* mhandle,
                       void* /*phandle*/, void** request) {
  return isend(comm, data, size, tag, mhandle, request);
}
ncclResult_t irecv_v10(void* comm, int n, void** data, size_t* sizes, int* tags, void** mhandles,
                       void** phandles, void** request) {
  return irecv(comm, n, data, sizes, tags, mhandles, phandles != nullptr ? phandles[0] : nullptr,
               request);
}

}  // namespace
}  // namespace optireduce::plugin

// Outside any braced extern "C" block, so that the const object is exported (see net_v11.cc).
extern "C" __attribute__((visibility("default")))
const optireduce::nccl::ncclNet_v10_t ncclNetPlugin_v10 = {
    .name = optireduce::plugin::kPluginName,
    .init = optireduce::plugin::init_v10,
    .devices = optireduce::plugin::devices,
    .getProperties = optireduce::plugin::get_properties_v10,
    .listen = optireduce::plugin::listen_v10,
    .connect = optireduce::plugin::connect_v10,
    .accept = optireduce::plugin::accept,
    .regMr = optireduce::plugin::reg_mr,
    .regMrDmaBuf = optireduce::plugin::reg_mr_dmabuf,
    .deregMr = optireduce::plugin::dereg_mr,
    .isend = optireduce::plugin::isend_v10,
    .irecv = optireduce::plugin::irecv_v10,
    .iflush = optireduce::plugin::iflush,
    .test = optireduce::plugin::test,
    .closeSend = optireduce::plugin::close_send,
    .closeRecv = optireduce::plugin::close_recv,
    .closeListen = optireduce::plugin::close_listen,
    .getDeviceMr = nullptr,
    .irecvConsumed = nullptr,
    .makeVDevice = nullptr,
};
