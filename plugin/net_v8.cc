// The exported ncclNetPlugin_v8 table: int message sizes and v8 properties, converted here and
// shimmed onto plugin/api.h with the shared legacy context.
#include "plugin/nccl/net_v8.h"
#include "plugin/api.h"
#include "plugin/convert.h"

namespace optireduce::plugin {
namespace {

using namespace optireduce::nccl;  // NOLINT: the ABI's own type names read best unqualified

ncclResult_t init_v8(ncclDebugLogger_t logger) {
  return init_legacy(logger, 8, nullptr);
}
ncclResult_t get_properties_v8(int dev, ncclNetProperties_v8_t* props) {
  ncclNetProperties_v11_t p;
  const ncclResult_t r = get_properties(dev, &p);
  if (r == ncclSuccess && props != nullptr) *props = to_v8(p);
  return props == nullptr ? ncclInternalError : r;
}
ncclResult_t listen_v8(int dev, void* handle, void** listen_comm) {
  return listen(legacy_context(), dev, handle, listen_comm);
}
ncclResult_t connect_v8(int dev, void* handle, void** send_comm,
                        ncclNetDeviceHandle_v8_t** dev_comm) {
  return connect(legacy_context(), dev, nullptr, handle, send_comm, dev_comm);
}
// A negative int size can only be NCCL misuse; every valid one fits size_t, and the reverse
// direction (test's int sizes) is safe because maxP2pBytes < 2^31.
ncclResult_t isend_v8(void* comm, void* data, int size, int tag, void* mhandle, void** request) {
  if (size < 0) return isend(comm, data, kMaxMessageBytes + 1, tag, mhandle, request);
  return isend(comm, data, static_cast<size_t>(size), tag, mhandle, request);
}
ncclResult_t irecv_v8(void* comm, int n, void** data, int* sizes, int* tags, void** mhandles,
                      void** request) {
  // maxRecvs is 1: only sizes[0] exists. Any other n (or a negative size) is refused by api.cc,
  // which checks n before it reads sizes.
  size_t size = kMaxMessageBytes + 1;
  if (n == 1 && sizes != nullptr && sizes[0] >= 0) size = static_cast<size_t>(sizes[0]);
  return irecv(comm, n, data, sizes != nullptr ? &size : nullptr, tags, mhandles, nullptr, request);
}

}  // namespace
}  // namespace optireduce::plugin

// Outside any braced extern "C" block, so that the const object is exported (see net_v11.cc).
extern "C" __attribute__((visibility("default")))
const optireduce::nccl::ncclNet_v8_t ncclNetPlugin_v8 = {
    .name = optireduce::plugin::kPluginName,
    .init = optireduce::plugin::init_v8,
    .devices = optireduce::plugin::devices,
    .getProperties = optireduce::plugin::get_properties_v8,
    .listen = optireduce::plugin::listen_v8,
    .connect = optireduce::plugin::connect_v8,
    .accept = optireduce::plugin::accept,
    .regMr = optireduce::plugin::reg_mr,
    .regMrDmaBuf = optireduce::plugin::reg_mr_dmabuf,
    .deregMr = optireduce::plugin::dereg_mr,
    .isend = optireduce::plugin::isend_v8,
    .irecv = optireduce::plugin::irecv_v8,
    .iflush = optireduce::plugin::iflush,
    .test = optireduce::plugin::test,
    .closeSend = optireduce::plugin::close_send,
    .closeRecv = optireduce::plugin::close_recv,
    .closeListen = optireduce::plugin::close_listen,
    .getDeviceMr = nullptr,
    .irecvConsumed = nullptr,
};
