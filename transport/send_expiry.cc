// SendConn: bounded messages that run out of time. A message of a bounded connection that its
// sender knows to be bounded never waits forever: without a CTS it expires (and the receiver is
// told); under way, a bounded message stops at the receiver's budget, and an exact one
// (calibration) or a whole one (send.h) whose receiver stopped acknowledging is abandoned after
// a long fallback. A message pinned exact (MsgDelivery::kExact, or the receiver's CTS said so)
// never expires, and one whose sender asked the receiver waits for its CTS: a receiver that died
// is found by the keepalive (liveness.h) and fails the connection instead. Normally the
// receiver's FINAL ends a bounded message first (send_recovery.cc); these timers are for a
// receiver that went quiet.
#include <algorithm>

#include "transport/send.h"

namespace optireduce {

namespace {
// On a bounded connection, how long a message may wait when no receiver budget is known yet
// (the receiver died before its first bounded CTS, or during calibration): long enough never
// to cut a live calibration step, finite so that a dead peer never hangs anyone.
constexpr uint64_t kFallbackGiveUpNs = 10'000'000'000;
}  // namespace

void SendConn::expire_bounded_locked(uint64_t now) {
  const uint64_t give_up = give_up_ns_locked();
  for (uint32_t s = oldest_; s != next_seq_; ++s) {
    Msg& m = slot(s);
    if (!may_expire_locked(m)) continue;
    if (m.state == State::kWaitCts && m.expire_early && now >= cts_deadline_ns_locked(m)) {
      if (!heard_cts_) presumed_dead_ = true;
      receiver_absent_ = true;
      expired_mask_ |= uint64_t{1} << (s % 64);
      if (!expire_unstarted_locked(m)) return;
      send_expired_notice_locked(s);
    } else if (m.state == State::kSending && m.bounded && !m.whole &&
               now - m.started_ns >= give_up) {
      give_up_locked(m);
    } else if (m.state == State::kSending && (!m.bounded || m.whole) &&
               now - m.progress_ns >= std::max(give_up, kFallbackGiveUpNs)) {
      give_up_locked(m);
    }
  }
}

void SendConn::send_expired_notice_locked(uint32_t seq) {
  PacketHeader h;
  h.type = PacketType::kData;
  h.flags = kFlagExpired | kFlagBounded;
  h.msg_seq = seq;
  send_ctrl_locked(h);
}

// How long a message of a bounded connection may wait. With a wait announced in the
// receiver's CTS (its start allowance: as long as it waits for a sender that has not started),
// that wait; the receiver's FINAL normally ends a started message much sooner. Before the receiver ever spoke, the long fallback: a receiver that never spoke
// might still be starting up, so only one silent for that long is presumed dead; after that first
// expiry the later messages expire at 2 x OPTIREDUCE_TIMEOUT_MS (else 1 s) instead of 10 s each.
uint64_t SendConn::give_up_ns_locked() const {
  if (expiry_budget_ns_ != 0) return expiry_budget_ns_;
  if (!presumed_dead_) return kFallbackGiveUpNs;
  return cfg_.timeout_ms > 0 ? static_cast<uint64_t>(2e6 * cfg_.timeout_ms) : 1'000'000'000;
}

uint64_t SendConn::cts_wait_ns_locked(const Msg& m) const {
  const uint64_t give_up = give_up_ns_locked();
  return expiry_budget_ns_ != 0 ? std::max(give_up, m.wait_ns) : give_up;
}

// NCCL posts a step as dozens of chunks, 8 at a time; each later chunk waiting its own full
// allowance for a straggler that has not posted its receives made the step cost several
// allowances (GpuChunks.AStragglerCostsTheOtherAboutOneDeadlinePerPhase). Its next CTS ends
// the absence; a new burst waits again.
uint64_t SendConn::cts_deadline_ns_locked(const Msg& m) const {
  if (receiver_absent_ && !m.burst_head) return m.posted_ns;
  return m.posted_ns + cts_wait_ns_locked(m);
}

bool SendConn::expire_unstarted_locked(Msg& m) {
  m.expired = true;
  ++stats_.expired_sends;
  return set_state_locked(m, State::kDone);
}

// Ends a message under way that ran out of time: packets not yet sent never will be, and
// unacknowledged ones stop counting as in flight.
void SendConn::give_up_locked(Msg& m) {
  if (m.bounded) ++stats_.cut_sends;
  else ++stats_.expired_sends;
  forget_outstanding_locked(m);
  finish_locked(m);
}

}  // namespace optireduce
