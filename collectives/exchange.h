// The two small interfaces the Transpose AllReduce schedule (tar.cc) is written against, so that
// one schedule and one erasure logic serve every path: Exchange ("move these shards to and from
// these peers, exactly or under a deadline, and say what was lost") and Kernels ("run these
// local kernels on these buffers"). Host path: host_exchange.cc over the transport + host
// kernels; GPU path: cuda/ (grouped ncclSend/ncclRecv + CUDA kernels); tests: an in-process
// exchange with a seeded loss model.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "collectives/elem.h"
#include "collectives/kernels_host.h"
#include "transport/status.h"

namespace optireduce::coll {

enum class Mode : uint8_t {
  kExact = 0,    // every byte arrives; receives never report loss
  kBounded = 1,  // a receive ends by its deadline; missing bytes hold the erasure marker
  // Bounded until each sender starts: a receive whose first bytes have not arrived by its
  // deadline ends (all of it missing, the erasure marker); one that started arrives whole
  // (MsgDelivery::kUntilStarted). The GPU path's exchange carries it on a sibling communicator
  // of its own (cuda/gpu_comm.cc); where that sibling is missing it runs as kBounded.
  kUntilStarted = 2,
};

// Whether a phase of this mode may report lost bytes.
inline bool lossy(Mode m) {
  return m != Mode::kExact;
}

struct SendOp {
  int peer = -1;
  const void* data = nullptr;
  size_t bytes = 0;
  // Bytes [0, ready) are written when the send is posted; the rest follow through
  // release_send (pipelined exchanges only). At least `bytes`: all of it.
  size_t ready = SIZE_MAX;
};

struct RecvOp {
  int peer = -1;
  void* data = nullptr;
  size_t bytes = 0;
  // Filled by the exchange:
  uint64_t lost_bytes = 0;    // bytes of this receive that hold the marker (bounded only)
  bool deadline_hit = false;  // the receive was closed by its deadline, not by completion
  bool done = false;          // ended (wait_arrivals, or end_phase at the latest)
  uint64_t arrived = 0;  // bytes at its start in place and final (wait_arrivals); all once done
};

// Moves the shards of one phase. A phase is begin_phase (post the receives), post_sends,
// end_phase (wait for everything); the schedule posts a phase's receives before it has the data
// to send, so that a peer's early sends find their receive already posted (a bounded send the
// receiver has not posted in time expires). Contract:
//  - Every rank runs the same phases in the same order; the k-th message from a peer matches
//    the k-th receive posted for that peer (FIFO per ordered pair). Empty shards are never
//    posted, on either side (both sides derive the same plan).
//  - `recvs` are admitted round by round: round q is recvs[round_end[q-1], round_end[q]);
//    begin_phase posts round 0 and end_phase posts round q+1 once round q completed. This is
//    how a receiver bounds its incast. Receiver-paced exchanges let each rank choose its rounds
//    independently; exchanges that are not (grouped NCCL calls) need the same incast on every
//    rank. The spans must stay valid until end_phase returns.
//  - `sends` start at once, in the given order (the order of the receivers' rounds).
//    post_sends may be called several times in one phase: each call's sends follow the
//    earlier calls'. The sends' buffers, not the span, must stay valid until end_phase
//    returns.
//  - A pipelined exchange (pipelined()) moves a phase's data as it comes, both ways:
//    release_send(k, ready) says bytes [0, ready) of the phase's k-th send (in the order of
//    every post_sends call of the phase) are written now, and no byte past them leaves before
//    (the schedule posts a shard before it encodes it, and releases it piece by piece); every
//    send must be released whole before end_phase. sent_bytes(k) tells how much of it has
//    left, so that the schedule keeps its encode a lead ahead of the wire. And wait_arrivals(n,
//    step) returns once one of receives [0, n) that was not done ended (done, lost_bytes,
//    deadline_hit set, arrived = bytes) or grew its `arrived` by at least `step` bytes, or at once
//    when all n are done (or, in an exchange that must, without either: the schedule looks again
//    and releases more): the schedule starts on the head of a shard while its tail is on the wire.
//    Bytes below `arrived` are final (no hole below them, nothing writes there again).
//  - end_phase returns when every send and receive is done, each receive's done set (in
//    stream order on the GPU). In bounded mode a receive that ended with holes is not an
//    error: lost_bytes/deadline_hit say so. A non-ok Status is a
//    hard failure (peer gone, OS error); error() then holds a message, and nothing the phase
//    was given is read or written any more (the caller may free it at once).
class Exchange {
 public:
  virtual ~Exchange() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual Status begin_phase(Mode mode, int phase, std::span<RecvOp> recvs,
                             std::span<const uint32_t> round_end) = 0;
  virtual Status post_sends(std::span<const SendOp> sends) = 0;
  virtual Status end_phase() = 0;
  // Whether release_send and wait_arrivals work here: grouped NCCL calls take their data
  // when posted and complete together, in end_phase.
  virtual bool pipelined() const { return false; }
  virtual Status release_send(size_t, size_t) {
    error_ = "this exchange sends only what was written when it was posted";
    return Status(Errc::kInternal);
  }
  virtual uint64_t sent_bytes(size_t) { return 0; }
  virtual Status wait_arrivals(size_t, uint64_t) {
    error_ = "this exchange completes its receives only in end_phase";
    return Status(Errc::kInternal);
  }
  virtual bool receiver_paced() const { return true; }
  // The transport's current hard bound tB and estimate tC (0 when it has none).
  virtual void timing(uint32_t* tb_us, uint32_t* tc_us) const {
    *tb_us = 0;
    *tc_us = 0;
  }
  virtual const std::string& error() const { return error_; }

  // A whole phase when the data to send is ready up front.
  Status run_phase(Mode mode, int phase, std::span<const SendOp> sends, std::span<RecvOp> recvs,
                   std::span<const uint32_t> round_end) {
    Status s = begin_phase(mode, phase, recvs, round_end);
    if (s) s = post_sends(sends);
    if (s) s = end_phase();
    return s;
  }

 protected:
  std::string error_;
};

// Local work on buffers of the path's memory kind (host or device). Semantics of each call are
// those of the host kernel of the same name (kernels_host.h), which is the oracle.
class Kernels {
 public:
  virtual ~Kernels() = default;
  // Scratch that lives as long as the communicator; a call may move earlier scratch pointers.
  // `slot` selects one of a few independent regions.
  virtual void* scratch(int slot, size_t bytes) = 0;
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  virtual void encode(DType t, const void* in, void* out, const HadamardGeometry& g,
                      uint64_t seed) = 0;
  virtual void decode(DType t, const void* in, void* out, const HadamardGeometry& g, uint64_t seed,
                      double scale, const void* fallback, double fallback_scale,
                      Erasure policy) = 0;
  // srcs/lossy are host arrays of nranks entries, in rank order.
  virtual void reduce(DType t, const void* const* srcs, const uint8_t* lossy, int nranks, void* out,
                      size_t n, RedOp op, Erasure policy) = 0;
  virtual void fill_lost(DType t, void* dst, const void* received, const void* own, size_t n,
                         double own_scale, Erasure policy) = 0;
  // This rank's flag byte `flag` (elem.h's Flag; memory of the path's kind) starts here, in
  // order with the kernels around it: kFlagNonFinite when data[0, n) holds a NaN or an Inf
  // (counted in kNonFiniteElements), else 0. n = 0 only clears the byte. A bounded call writes
  // it before its first pass, while an in-place input still holds the input.
  virtual void flag_nonfinite(DType t, const void* data, size_t n, void* flag) = 0;
  // The safeguard's verdict, in order with the kernels before it: ORs kFlagLost into the byte
  // `flag` (which flag_nonfinite started) when the elements counted lost since the last
  // take_counters exceed threshold x expected (and counts it in kSafeguardFlags).
  virtual void flag_lost(double threshold, uint64_t expected, void* flag) = 0;
  // The agreed non-finite verdict, in order with the agreement that filled flags[0, nranks)
  // (memory of the path's kind): when some rank's byte has kFlagNonFinite, counts the call in
  // kNonFiniteCalls and sets out[0, n) to the quiet NaN (apply_nonfinite_verdict); n = 0 only
  // counts. Nothing here reads the flags on the host: the GPU keeps running ahead.
  virtual void nonfinite_verdict(DType t, void* out, size_t n, const void* flags, int nranks) = 0;
  // Copies `bytes` of the path's memory to the host once the work before it has produced them
  // (waits for it).
  virtual void read_back(void* host_dst, const void* src, size_t bytes) = 0;
  // Adds the counters of the kernels run since the last call into out[kNumCounters] and zeroes
  // them (may wait for outstanding device work).
  virtual void take_counters(uint64_t* out) = 0;
};

}  // namespace optireduce::coll
