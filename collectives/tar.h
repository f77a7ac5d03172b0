// Transpose AllReduce: the schedule (shard plan, two phases, incast rounds), the erasure logic,
// Hadamard encoding, the safeguard and the non-finite verdict. Written once against Exchange and
// Kernels (exchange.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "collectives/block_progress.h"
#include "collectives/exchange.h"
#include "collectives/incast.h"
#include "collectives/optireduce.h"

namespace optireduce::coll {

struct TarOptions {
  Mode mode = Mode::kExact;
  int incast = 0;        // >= 1 fixed, 0 = N-1, -1 = adaptive per receiver
  bool hadamard = true;  // bounded mode only: exact calls never encode
  uint64_t hadamard_block = 4096;
  Erasure erasure = Erasure::kRescale;
  double safeguard = 0.05;
  bool safeguard_redo = false;
  uint64_t exact_below_bytes = 4096;
  // Bounded calls: the ranks agree exactly whether some input held a NaN or Inf, and if so
  // every rank's output is the quiet NaN (or, with safeguard_redo, the exact result).
  bool nonfinite_agree = false;
  // How bounded calls run phase 2, the all-gather (OPTIREDUCE_ALLGATHER_MODE):
  // kUntilStarted (the default): a peer's shard that has not begun to arrive by the deadline is
  //   cut (a straggler costs the others at most a deadline there), one that began arrives whole
  //   (a slow but live peer costs time, not data; the ranks' results stay the same bits);
  // kBounded: cut at the deadline like phase 1; a rank's estimate of what it lost in phase 2 is
  //   its own, and data-parallel replicas drift apart;
  // kExact: every rank's result is the same, and a straggler is waited for.
  Mode allgather = Mode::kUntilStarted;
  // An element lost in phase 2 is this rank's own contribution x N, and with Hadamard a partly
  // kept block is rescaled by d/k: unbiased, but as noisy as one rank's minibatch gradient
  // scaled by N. Off (the default): 0, this rank skips that element's update, and a partly
  // kept block is decoded unscaled (OPTIREDUCE_GATHER_FILL; tar.cc, phase2).
  bool gather_fill_own = false;
  // Where the exchange tells arrivals (the host path): how much more of a receive must have
  // arrived before the schedule reduces or decodes it (tar.cc; tests make it small).
  uint64_t arrival_step_bytes = 64 << 10;
  // Where the exchange takes a send before its bytes are written (the host path), with
  // Hadamard: phase 1 encodes and releases each peer's shard this many bytes at a time, and no
  // further than the lead past what of it has left (tar.cc, encode_and_release; tests make
  // both small).
  uint64_t release_bytes = 256 << 10;
  uint64_t release_lead_bytes = 1 << 20;
};

class Tar {
 public:
  // `comm_seed` must be equal on every rank (agreed at init): it seeds D for every call.
  Tar(Exchange* ex, Kernels* k, uint64_t comm_seed);

  // recv[i] = op over ranks of send[i]. On error *error holds a message.
  Status allreduce(const void* send, void* recv, size_t count, DType t, RedOp op,
                   const TarOptions& o, optiStats_t* stats, std::string* error);

  uint64_t calls() const { return calls_; }

 private:
  struct Pass;  // one run of the two phases
  Status run_pass(Pass& p, std::string* error);
  Status phase1(Pass& p, std::string* error);
  Status phase2(Pass& p, std::string* error);
  Status agree(uint8_t* flags, std::string* error);
  void encode_blocks(Pass& p, uint64_t b0, uint64_t b1);
  Status encode_and_release(Pass& p, bool all);
  void reduce_range(Pass& p, uint64_t from, uint64_t to);
  Status reduce_as_arrived(Pass& p);
  Status fail(const char* what, Status s, std::string* error);

  Exchange* ex_;
  Kernels* k_;
  uint64_t comm_seed_;
  uint64_t calls_ = 0;
  IncastController incast_;
  // Reused between calls so that the data path does not allocate.
  std::vector<SendOp> sends_;
  std::vector<uint32_t> send_round_end_;  // phase 1's sends by round, as round_end1_ its receives
  std::vector<uint64_t> released_;        // elements of each of phase 1's sends released
  std::vector<RecvOp> recvs1_;  // phase 1's receives stay alive while phase 2 is posted
  std::vector<RecvOp> recvs2_;
  std::vector<uint32_t> round_end1_;
  std::vector<uint32_t> round_end2_;
  std::vector<const void*> srcs_;
  std::vector<uint8_t> lossy_;
  std::vector<uint8_t> flags_host_;
  BlockProgress blocks_;  // the pass's encode (phase 1) or decode (phase 2)
};

}  // namespace optireduce::coll
