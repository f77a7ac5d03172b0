// The exported ncclNetPlugin_v9 table: like v10 without traffic class or profiler handles, so
// bounded delivery is reachable only through OPTIREDUCE_MODE=bounded (every communicator).
#include "plugin/nccl/net_v9.h"
#include "plugin/api.h"
#include "plugin/convert.h"

namespace optireduce::plugin {
namespace {

using namespace optireduce::nccl;  // NOLINT: the ABI's own type names read best unqualified

ncclResult_t init_v9(ncclDebugLogger_t logger) {
  return init_legacy(logger, 9, nullptr);
}
ncclResult_t get_properties_v9(int dev, ncclNetProperties_v9_t* props) {
  ncclNetProperties_v11_t p;
  const ncclResult_t r = get_properties(dev, &p);
  if (r == ncclSuccess && props != nullptr) *props = to_v10(p);
  return props == nullptr ? ncclInternalError : r;
}
ncclResult_t listen_v9(int dev, void* handle, void** listen_comm) {
  return listen(legacy_context(), dev, handle, listen_comm);
}
ncclResult_t connect_v9(int dev, void* handle, void** send_comm,
                        ncclNetDeviceHandle_v9_t** dev_comm) {
  return connect(legacy_context(), dev, nullptr, handle, send_comm, dev_comm);
}
ncclResult_t irecv_v9(void* comm, int n, void** data, size_t* sizes, int* tags, void** mhandles,
                      void** request) {
  return irecv(comm, n, data, sizes, tags, mhandles, nullptr, request);
}

}  // namespace
}  // namespace optireduce::plugin

// Outside any braced extern "C" block, so that the const object is exported (see net_v11.cc).
extern "C" __attribute__((visibility("default")))
const optireduce::nccl::ncclNet_v9_t ncclNetPlugin_v9 = {
    .name = optireduce::plugin::kPluginName,
    .init = optireduce::plugin::init_v9,
    .devices = optireduce::plugin::devices,
    .getProperties = optireduce::plugin::get_properties_v9,
    .listen = optireduce::plugin::listen_v9,
    .connect = optireduce::plugin::connect_v9,
    .accept = optireduce::plugin::accept,
    .regMr = optireduce::plugin::reg_mr,
    .regMrDmaBuf = optireduce::plugin::reg_mr_dmabuf,
    .deregMr = optireduce::plugin::dereg_mr,
    .isend = optireduce::plugin::isend,
    .irecv = optireduce::plugin::irecv_v9,
    .iflush = optireduce::plugin::iflush,
    .test = optireduce::plugin::test,
    .closeSend = optireduce::plugin::close_send,
    .closeRecv = optireduce::plugin::close_recv,
    .closeListen = optireduce::plugin::close_listen,
    .getDeviceMr = nullptr,
    .irecvConsumed = nullptr,
    .makeVDevice = nullptr,
};
