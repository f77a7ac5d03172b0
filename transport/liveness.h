// Whether the peer of a connection is still there. A datagram transport never learns of a
// peer's death from the network the way TCP learns of a reset, and a peer that is merely busy
// (an application computing for minutes between two NCCL calls) sends nothing for as long as
// a dead one. So silence alone proves nothing; what proves death is silence in answer to a
// question. While a request waits on the peer and nothing has been heard from it for a ping
// interval, the connection sends PINGs, which the peer's transport answers from its progress
// thread whatever its application is doing. The peer is dead when:
//   - PINGs went unanswered for OPTIREDUCE_PEER_TIMEOUT_MS (and at least kMinUnansweredPings
//     of them), or
//   - its host reported the peer's port closed (ICMP port unreachable) kUnreachableLimit times
//     with nothing heard in between, or
//   - it said CLOSE (handled by the connection, which owns the requests; see conn.h).
// Anything heard from the peer, any valid datagram, clears the suspicion.
//
// A pure state machine over time stamps the caller passes in: deterministic under a FakeClock.
#pragma once

#include <algorithm>
#include <cstdint>

namespace optireduce {

class PeerLiveness {
 public:
  // PINGs per timeout: under 5% loss in each direction a PING/PONG pair fails 10% of the
  // time, so a live peer is condemned only if about kPingsPerTimeout pairs in a row fail
  // (0.1^7 = 1e-7 per timeout of silence).
  static constexpr uint64_t kPingsPerTimeout = 8;
  static constexpr uint32_t kMinUnansweredPings = 3;
  // ICMP errors are rate-limited per destination by the sending host (a burst of 6, then
  // about 1 per second), so three arrive at once for a dead process yet never by accident:
  // one stale datagram to a port being reused can make one, not three in a row.
  static constexpr uint32_t kUnreachableLimit = 3;

  enum class Verdict : uint8_t { kAlive, kPing, kDead };
  enum class Why : uint8_t { kNone, kSilent, kUnreachable };

  explicit PeerLiveness(uint64_t timeout_ns)
      : timeout_ns_(timeout_ns),
        interval_ns_(std::max<uint64_t>(1, timeout_ns / kPingsPerTimeout)) {}

  void on_heard(uint64_t now) {
    last_heard_ns_ = now;
    first_unanswered_ns_ = 0;
    unanswered_ = 0;
    unreachable_ = 0;
  }
  // `reports` ICMP errors the datapath saw since the last call.
  void on_unreachable(uint64_t reports) { unreachable_ += reports; }

  // Called on every progress pass. `waiting`: a request of this connection waits for the peer.
  // kPing: send one now (the caller then calls on_ping_sent). kDead: see why().
  Verdict poll(uint64_t now, bool waiting) {
    if (unreachable_ >= kUnreachableLimit) {
      why_ = Why::kUnreachable;
      return Verdict::kDead;
    }
    if (!waiting) {
      if (waiting_) idle_since_ns_ = now;
      waiting_ = false;
      return Verdict::kAlive;
    }
    if (!waiting_) {
      waiting_ = true;
      // Silence counts from the start of a busy period, not from the last packet of a
      // connection that was idle (and rightly silent) before. Waits separated by less than a
      // ping interval form one period: a stream of bounded steps to a dead peer, each ended
      // by its deadline, must add up to the timeout rather than restart it every step.
      if (!ever_waited_ || now - idle_since_ns_ >= interval_ns_) {
        ever_waited_ = true;
        busy_since_ns_ = now;
        first_unanswered_ns_ = 0;
        unanswered_ = 0;
      }
    }
    if (first_unanswered_ns_ != 0 && unanswered_ >= kMinUnansweredPings &&
        now - first_unanswered_ns_ + interval_ns_ >= timeout_ns_) {
      why_ = Why::kSilent;
      return Verdict::kDead;
    }
    const uint64_t quiet_since = std::max({last_heard_ns_, busy_since_ns_, last_ping_ns_});
    return now - quiet_since >= interval_ns_ ? Verdict::kPing : Verdict::kAlive;
  }
  void on_ping_sent(uint64_t now) {
    if (first_unanswered_ns_ == 0) first_unanswered_ns_ = now;
    last_ping_ns_ = now;
    ++unanswered_;
  }

  Why why() const { return why_; }
  uint64_t timeout_ns() const { return timeout_ns_; }
  uint32_t unanswered_pings() const { return unanswered_; }
  uint64_t unreachable_reports() const { return unreachable_; }

 private:
  const uint64_t timeout_ns_;
  const uint64_t interval_ns_;
  uint64_t last_heard_ns_ = 0;
  uint64_t busy_since_ns_ = 0;
  uint64_t idle_since_ns_ = 0;
  uint64_t last_ping_ns_ = 0;
  uint64_t first_unanswered_ns_ = 0;  // first PING since the peer was last heard; 0 = none
  uint32_t unanswered_ = 0;           // PINGs since the peer was last heard
  uint64_t unreachable_ = 0;          // ICMP reports since the peer was last heard
  bool waiting_ = false;
  bool ever_waited_ = false;  // idle_since_ns_ means something only after a first wait
  Why why_ = Why::kNone;
};

}  // namespace optireduce
