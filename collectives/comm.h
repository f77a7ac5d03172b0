// The communicator behind optiComm_t and the seams between the C API (api.cc) and the GPU part
// (cuda/gpu_comm.cc when CUDA is built, gpu_none.cc otherwise).
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "collectives/exchange.h"
#include "collectives/optireduce.h"
#include "collectives/store.h"
#include "collectives/tar.h"

namespace optireduce::coll {

// The exchange of a one-rank communicator: there is nothing to exchange.
class SoloExchange final : public Exchange {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  Status begin_phase(Mode, int, std::span<RecvOp> recvs, std::span<const uint32_t>) override {
    return recvs.empty() ? Status::ok() : no_peers();
  }
  Status post_sends(std::span<const SendOp> sends) override {
    return sends.empty() ? Status::ok() : no_peers();
  }
  Status end_phase() override { return Status::ok(); }

 private:
  Status no_peers() {
    error_ = "a communicator of one rank has no peers";
    return Status(Errc::kInternal);
  }
};

struct GpuState;  // owned by the GPU part

}  // namespace optireduce::coll

struct optiComm {
  // The exchange goes first: until its connections are closed the transport may still write
  // into the scratch the kernels own (receives a failed or aborted call left posted).
  ~optiComm() {
    tar.reset();
    exchange.reset();
    kernels.reset();
  }

  int rank = 0;
  int nranks = 1;
  bool gpu = false;
  uint64_t seed = 0;  // equal on every rank: seeds D of every call
  optiOptions_t options{};
  std::string prefix;  // this communicator's keys in the store
  std::unique_ptr<optireduce::coll::Store> store;
  std::unique_ptr<optireduce::coll::Exchange> exchange;
  std::unique_ptr<optireduce::coll::Kernels> kernels;
  std::unique_ptr<optireduce::coll::Tar> tar;
  optireduce::coll::GpuState* gpu_state = nullptr;
  std::mutex mu;  // one call at a time: the ranks' calls must stay in the same order
  optiStats_t last{};
  optiStats_t total{};
  // Sticky failure: after a failed exchange the ranks are out of step, so later calls fail too.
  optiResult_t failed = optiSuccess;
  std::string failed_msg;
};

namespace optireduce::coll {

// Implemented by the GPU part.
optiResult_t gpu_init(optiComm* comm, struct ncclComm* nccl, const optiOptions_t& opts);
optiResult_t gpu_allreduce(optiComm* comm, const void* send, void* recv, size_t count, DType t,
                           RedOp op, struct CUstream_st* stream);
optiResult_t gpu_collect_stats(optiComm* comm);
// abort: ncclCommAbort instead of ncclCommDestroy (optiCommAbort: no waiting for the peers).
optiResult_t gpu_destroy(optiComm* comm, bool abort);

// Implemented by api.cc for the GPU part.
optiResult_t api_fail(optiResult_t r, const std::string& msg);
optiResult_t api_resolve_options(const optiOptions_t* given, optiOptions_t* out);
TarOptions api_tar_options(const optiOptions_t& o);
void api_add_stats(optiStats_t* total, const optiStats_t& c);

}  // namespace optireduce::coll
