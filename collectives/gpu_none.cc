// The GPU part of a build without CUDA: optiCommInit reports optiUnsupported.
#include "collectives/comm.h"

namespace optireduce::coll {

optiResult_t gpu_init(optiComm*, struct ncclComm*, const optiOptions_t&) {
  return api_fail(optiUnsupported,
                  "optiCommInit: liboptireduce was built without CUDA (nvcc "
                  "not found); use optiHostCommInit for host buffers");
}
optiResult_t gpu_allreduce(optiComm*, const void*, void*, size_t, DType, RedOp,
                           struct CUstream_st*) {
  return api_fail(optiUnsupported, "optiAllReduce: no CUDA in this build");
}
optiResult_t gpu_collect_stats(optiComm*) {
  return optiSuccess;
}
optiResult_t gpu_destroy(optiComm*, bool) {
  return optiSuccess;
}

}  // namespace optireduce::coll
