// RecvConn: when a receive may end without all its data, and the timers that end it. A bounded
// receive gets a deadline: the start allowance while its sender has not started, the transfer's
// budget once it has (both from the group's DeadlinePolicy, else OPTIREDUCE_TIMEOUT_MS, else a
// second). An exact receive on a bounded connection (calibration) gets a generous fallback bound
// so that a dead sender never hangs it; one pinned exact (NCCL's LL/LL128) waits for its data,
// and a dead sender is found by the keepalive instead. A CTS that no DATA followed is repeated.
// A sender cut before it started is timed when it shows up, for the policy's skew.
#include <algorithm>

#include "transport/deadline.h"
#include "transport/recv.h"

namespace optireduce {

namespace {
// Without a policy, a bounded receive gets this budget (OPTIREDUCE_TIMEOUT_MS overrides).
constexpr uint64_t kDefaultBudgetNs = 1'000'000'000;
// A CTS is repeated after this many RTTs without DATA (the CTS's own round trip, the sender's
// poll, one to spare), doubling up to the RTO maximum. A repeat the sender did not need costs
// one small datagram, which it ignores, so the timer may be short.
constexpr uint64_t kCtsRtts = 3;
// ... but never sooner than this: a software timer served by polling, on a host that
// schedules other threads, is no finer.
constexpr uint64_t kCtsResendMinNs = 20'000;
// Before the connection measured an RTT: a conservative first repeat, as for a millisecond
// network.
constexpr uint64_t kCtsResendInitialNs = 5'000'000;
// Bound of an exact receive on a bounded connection (calibration), and of a whole one (a
// kUntilStarted receive whose sender started), as kFallbackGiveUpNs of the sending side: never
// cuts a live step, never lets a dead sender hang us.
constexpr uint64_t kFallbackNs = 10'000'000'000;
}  // namespace

// A sender's expiry notice ends a receive that is bounded, or exact only because the group is
// calibrating (the sender gave up on it just as we would at the fallback bound). A receive
// pinned exact (NCCL's LL/LL128) never ends without its data; its CTS told the sender so.
void RecvConn::fail_expired_pinned_locked() {
  fail_locked(Status(Errc::kRemote),
              "the sender expired a message this receiver pinned exact (LL/LL128)");
}

bool RecvConn::expiry_allowed_locked(const Msg& m) const {
  return m.bounded || (params_.delivery == Delivery::kBounded && !m.exact);
}

void RecvConn::arm_deadline_locked(Msg& m, uint64_t now) {
  // Every receive's step time is measured from here (calibration needs exact ones too); only
  // bounded ones get a deadline.
  if (m.head_ns == 0) {
    m.head_ns = now;
    m.pipelined = m.bytes_got > 0;
  }
  if (m.deadline_ns != 0) return;
  if (!m.bounded) {
    // An exact (calibration) receive on a bounded connection still may not hang on a dead
    // sender: it gets the generous fallback bound.
    if (expiry_allowed_locked(m)) m.deadline_ns = now + kFallbackNs;
    return;
  }
  // Data already under way: the transfer's budget from now. Otherwise the sender may still be
  // on its way to this step: it gets the start allowance, and the budget once it starts
  // (on_data_locked). While the sender is absent (a receive of it was cut for never starting,
  // and no DATA came since), the rest of the burst is cut at once: NCCL posts a step as dozens
  // of chunks, and an allowance for each made a 1.5 s straggler cost the other rank 2 s
  // (GpuChunks.AStragglerCostsTheOtherAboutOneDeadlinePerPhase). A new burst waits the
  // allowance again, so that a straggler that is back (its isends expire at once against our
  // floor, sending nothing) is heard again instead of being cut for good.
  if (!m.started && !m.burst_head && sender_absent_locked()) {
    m.deadline_ns = now;
    return;
  }
  m.deadline_ns = now + (m.started ? started_budget_locked(m) : start_allowance_locked(m.capacity));
}

uint64_t RecvConn::budget_locked(uint64_t bytes) const {
  if (policy_ != nullptr) return policy_->budget_ns(bytes);
  if (cfg_.timeout_ms > 0) return static_cast<uint64_t>(cfg_.timeout_ms * 1e6);
  return kDefaultBudgetNs;
}

uint64_t RecvConn::started_budget_locked(const Msg& m) const {
  return m.whole() ? kFallbackNs : budget_locked(m.size);
}

uint64_t RecvConn::start_allowance_locked(uint64_t bytes) const {
  if (policy_ != nullptr) return policy_->start_allowance_ns(bytes);
  return budget_locked(bytes);
}

uint64_t RecvConn::cts_resend_ns_locked() const {
  if (!rtt_.has_sample()) return kCtsResendInitialNs;
  return std::clamp(kCtsRtts * rtt_.min_ns(), kCtsResendMinNs, kCtsResendInitialNs);
}

uint64_t RecvConn::next_timer_locked() const {
  uint64_t next = 0;
  auto consider = [&next](uint64_t t) {
    if (t != 0 && (next == 0 || t < next)) next = t;
  };
  for (uint32_t s = floor_; s != next_seq_; ++s) {
    const Msg& m = msgs_[s % kMaxRequests];
    if (m.state != State::kPosted) continue;
    consider(m.deadline_ns);
    if (m.bounded) consider(m.early_ns);
    if (!m.started || (m.resteered && m.bytes_got == m.cts_bytes))
      consider(m.cts_ns + m.cts_backoff_ns);
    if (m.steer != 0 && m.last_byte_ns != 0) consider(m.last_byte_ns + aim_stall_ns());
  }
  return next;
}

void RecvConn::advance_floor_locked(uint64_t now) {
  for (;;) {
    floor_ = settled_floor_locked();
    if (floor_ == next_seq_) return;
    Msg& m = slot(floor_);
    arm_deadline_locked(m, now);
    if (m.deadline_ns == 0 || now < m.deadline_ns) return;
    complete_locked(m, End::kDeadline, now);  // the rest of an absent sender's burst
  }
}

void RecvConn::on_timers_locked(uint64_t now) {
  const uint64_t moves = ep_->aim_moves();
  bool aims_settled = true;
  bool completed = false;
  for (uint32_t s = floor_; s != next_seq_; ++s) {
    Msg& m = slot(s);
    if (m.state != State::kPosted) continue;
    if (m.steer != 0 && !check_aim_locked(m, moves != aim_moves_seen_, now)) aims_settled = false;
    if (m.deadline_ns != 0 && now >= m.deadline_ns) {
      complete_locked(m, End::kDeadline, now);
      completed = true;
      continue;
    }
    if (m.bounded && m.early_ns != 0 && now >= m.early_ns) {
      complete_locked(m, End::kEarly, now);
      completed = true;
      continue;
    }
    // No DATA since the CTS: the CTS may be lost; say it again (backing off). The CTS that
    // moved a message under way (check_aim_locked) is repeated the same way while no byte
    // follows it, since its sender's DATA reach nothing until it hears it; while bytes do
    // follow, its window moves on without a CTS, so that a later stall is still seen.
    const bool unanswered = !m.started || (m.resteered && m.bytes_got == m.cts_bytes);
    if (m.resteered && !unanswered && now - m.cts_ns >= m.cts_backoff_ns) {
      m.cts_ns = now;
      m.cts_bytes = m.bytes_got;
    }
    if (unanswered && now - m.cts_ns >= m.cts_backoff_ns) {
      ++stats_.cts_resent;
      m.cts_backoff_ns =
          std::min<uint64_t>(m.cts_backoff_ns * 2, static_cast<uint64_t>(cfg_.rto_max_us) * 1000);
      send_cts_locked(m, now);
    }
  }
  if (aims_settled) aim_moves_seen_ = moves;
  if (completed) advance_floor_locked(now);
}

void RecvConn::on_late_sign_locked(uint32_t seq) {
  for (CutUnstarted& c : cut_) {
    if (!c.valid || c.seq != seq) continue;
    c.valid = false;
    if (policy_ != nullptr)
      policy_->on_late_sender(c.counted_ns, rx_arrival_ns_ - std::min(rx_arrival_ns_, c.start_ns));
    return;
  }
}

}  // namespace optireduce
