// The host path's Exchange over the transport (transport.h): per ordered pair of ranks one exact
// and one bounded connection (bounded receives fill holes with the erasure marker), all bounded
// connections of a communicator sharing one BoundedGroup (deadline estimates).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "collectives/exchange.h"
#include "collectives/poll_backoff.h"
#include "collectives/store.h"
#include "transport/transport.h"

namespace optireduce {
class BoundedGroup;
}

namespace optireduce::coll {

class HostExchange final : public Exchange {
 public:
  ~HostExchange() override;
  // Collective: connects every ordered pair, swapping handles through `store` under `prefix`.
  static Status create(Store* store, const std::string& prefix, int rank, int nranks,
                       int timeout_ms, std::unique_ptr<HostExchange>* out, std::string* error);

  int rank() const override { return rank_; }
  int size() const override { return nranks_; }
  Status begin_phase(Mode mode, int phase, std::span<RecvOp> recvs,
                     std::span<const uint32_t> round_end) override;
  Status post_sends(std::span<const SendOp> sends) override;
  Status end_phase() override;
  bool pipelined() const override { return true; }
  Status release_send(size_t k, size_t ready) override;
  uint64_t sent_bytes(size_t k) override;
  Status wait_arrivals(size_t n, uint64_t step) override;
  void timing(uint32_t* tb_us, uint32_t* tc_us) const override;

 private:
  HostExchange() = default;
  Status connect_all(Store* store, const std::string& prefix, int timeout_ms);
  Status wait(Request* req, size_t* size, bool is_send, int peer);
  Status post_round(size_t q);
  Status post_sends_now(std::span<const SendOp> sends);
  Status wait_recvs_now(size_t n);
  Status wait_arrivals_now(size_t n, uint64_t step);
  Status post_ready_rounds();
  // Receive i ended with `got` bytes: its outcome into recvs_[i], and the done prefix moved on.
  Status finish_recv(size_t i, size_t got);
  Status wait_phase();
  // A failed phase closes every connection (no request outlives the call that failed) and
  // later phases fail at once.
  Status abandon_unless_ok(Status s);
  Status failed_earlier();
  // The phase's requests, receives then sends, for a wait between tests (wait_for_work).
  std::span<Request* const> phase_requests();

  int rank_ = 0;
  int nranks_ = 1;
  bool abandoned_ = false;
  std::shared_ptr<Engine> engine_;
  std::unique_ptr<BoundedGroup> group_;
  // [mode][peer]; null at [*][rank_].
  std::vector<std::unique_ptr<ListenComm>> listen_[2];
  std::vector<std::unique_ptr<SendComm>> send_[2];
  std::vector<std::unique_ptr<RecvComm>> recv_[2];
  // The phase in progress (reused between phases: nothing is allocated per call).
  int mode_ = 0;
  // How this phase's receives are posted on the bounded connections (kUntilStarted's phase 2).
  MsgDelivery recv_how_ = MsgDelivery::kAsConnection;
  std::span<RecvOp> recvs_;
  std::span<const uint32_t> round_end_;
  size_t recvs_done_ = 0;      // receives [0, recvs_done_) complete (later ones may be too)
  size_t round_ = 0;           // the latest round posted
  size_t arrival_turn_ = 0;    // wait_arrivals: which receive the next pass tests
  PollBackoff arrival_backoff_;  // wait_arrivals: one wait per phase, not per call
  std::vector<SendOp> sends_;    // every post_sends of the phase, in order (ready: released)
  std::vector<Request*> send_reqs_;
  std::vector<Request*> recv_reqs_;
  std::vector<ConnStats> recv_before_;  // each receive's connection counters when posted
  std::vector<Request*> wait_set_;      // phase_requests()' list, kept to reuse its memory
};

}  // namespace optireduce::coll
