// RecvConn: posting a receive, its CTS and the datapath's place for it, and placement of what
// arrives, by offset with every bounds check. Its deadlines and timers are in recv_deadline.cc,
// how it ends (ACKs, hole filling, completion, test) in recv_complete.cc.
#include "transport/recv.h"

#include <algorithm>
#include <cstring>

#include "transport/deadline.h"
#include "transport/log.h"

namespace optireduce {

namespace {
constexpr uint32_t kAckEveryPkts = 16;
// An aimed receive that took no byte for this many of the sender's longest retransmission
// timeouts is moved off its place (check_aim_locked): a sender resends at least once per
// timeout while anything is unacknowledged, so several in a row with nothing arriving means
// the place drops what comes.
constexpr uint64_t kAimStallRtoMax = 4;
}  // namespace

RecvConn::RecvConn(const Config& cfg, const Clock& clock, std::unique_ptr<Endpoint> ep,
                   const ConnParams& p, std::shared_ptr<Registry> registry)
    : Conn(cfg, clock, std::move(ep), p, std::move(registry), ConnSide::kReceiver) {
  for (auto& m : msgs_) m.req.conn = this;
}

RecvConn::~RecvConn() {
  deactivate();
  std::lock_guard<std::mutex> lock(mu_);
  // Receives that never ended, or whose lane was still taking its requests back: their
  // buffers go back now.
  for (Msg& m : msgs_) unaim_locked(m, true);
  say_close_locked(floor_);
  if (downlink_ && bounded_posted_ > 0) downlink_->leave();
}

bool RecvConn::legal_transition(State from, State to) {
  switch (from) {
    case State::kFree:
      return to == State::kPosted;
    case State::kPosted:
      return to == State::kComplete;
    case State::kComplete:
      return to == State::kFree;
  }
  return false;
}

bool RecvConn::set_msg_state_locked(Msg& m, State to, uint64_t now) {
  if (!legal_transition(m.state, to)) {
    OR_WARN("receive message %u: illegal state change %d -> %d", m.req.seq,
            static_cast<int>(m.state), static_cast<int>(to));
    fail_locked(Status(Errc::kInternal), "illegal receive state change");
    return false;
  }
  // A connection with bounded receives outstanding is one of its downlink's senders.
  if (m.bounded && downlink_) {
    if (to == State::kPosted && bounded_posted_++ == 0) downlink_->join(now);
    if (to == State::kComplete && --bounded_posted_ == 0) downlink_->leave();
  }
  m.state = to;
  return true;
}

// Constant for the connection's life (the handshake's), so no lock on NCCL's hot path.
Delivery RecvConn::delivery() const {
  return params_.delivery;
}

void RecvConn::set_deadline_policy(DeadlinePolicy* policy) {
  std::lock_guard<std::mutex> lock(mu_);
  policy_ = policy;
}

void RecvConn::set_downlink(std::shared_ptr<Downlink> downlink) {
  std::lock_guard<std::mutex> lock(mu_);
  downlink_ = std::move(downlink);
}

void RecvConn::set_hello_ack(const uint8_t* body) {
  std::lock_guard<std::mutex> lock(mu_);
  std::memcpy(hello_ack_, body, kHelloBodyBytes);
  have_hello_ack_ = true;
}

Status RecvConn::irecv(void* data, size_t capacity, MsgDelivery how, const MemoryRegion* mr,
                       Request** req) {
  std::lock_guard<std::mutex> lock(mu_);
  *req = nullptr;
  if (Status st = check_peer_locked(); !st) return st;
  if (data == nullptr && capacity != 0) return Status(Errc::kInternal);
  const uint64_t now = clock_.now_ns();
  if (next_seq_ - oldest_ >= static_cast<uint32_t>(kMaxRequests)) {
    progress_locked(now);
    return Status::ok();
  }
  Msg& m = slot(next_seq_);
  m.req.seq = next_seq_;
  m.req.outcome = RecvOutcome{};
  m.req.caller_data = nullptr;
  m.exact = how == MsgDelivery::kExact;
  m.bounded = params_.delivery == Delivery::kBounded && !m.exact &&
              !(policy_ != nullptr && policy_->calibrating());
  m.until_started = m.bounded && (how == MsgDelivery::kUntilStarted ||
                                  (how == MsgDelivery::kAsConnection && params_.until_started));
  if (!set_msg_state_locked(m, State::kPosted, now)) return fatal_;
  m.started = m.tail_seen = false;
  m.buf = static_cast<uint8_t*>(data);
  m.capacity = capacity;
  m.size = 0;
  m.npkts = 0;
  m.cum = m.high = 0;
  m.bytes_got = 0;
  m.posted_ns = now;
  m.first_cts_ns = 0;
  m.last_byte_ns = 0;
  m.head_ns = m.first_data_ns = m.deadline_ns = m.early_ns = 0;
  m.pipelined = false;
  m.burst_head = starts_burst(m.req.seq == floor_, last_complete_ns_, now);
  m.pkts_since_ack = 0;
  m.dup_seen = false;
  m.cts_backoff_ns = cts_resend_ns_locked();
  m.steer = 0;
  m.resteered = false;
  ++next_seq_;
  *req = &m.req;
  // The sender told us it gave up on this message before we posted it: done, fully missing,
  // unless this receive needs it whole (see on_data_locked).
  if (m.req.seq - expired_base_ < 64 && (expired_mask_ >> (m.req.seq % 64) & 1)) {
    if (m.exact) {
      fail_expired_pinned_locked();
      return Status::ok();  // the request fails at its first test
    }
    if (expiry_allowed_locked(m)) {
      complete_locked(m, End::kExpired, now);
      advance_floor_locked(now);
      return Status::ok();
    }
  }
  if (m.req.seq == floor_) arm_deadline_locked(m, now);
  aim_locked(m, mr);
  send_cts_locked(m, now);
  progress_locked(now);
  return Status::ok();
}

void RecvConn::aim_locked(Msg& m, const MemoryRegion* mr) {
  // Below a few packets the lane's set-up and the close's check cost more than the copy. A
  // bounded receive is not aimed: a lane's first set-up can take longer than its sender waits
  // for the CTS, and a receive cut at its deadline leaves its sender's stragglers in flight to
  // shift the lane's next receive (docs/architecture.md, "Registered memory").
  constexpr uint64_t kMinAimPackets = 8;
  if (mr == nullptr || m.bounded || m.capacity < kMinAimPackets * params_.pkt_payload) return;
  // A receive that ends short of its capacity leaves requests aimed into its buffer, and the
  // datapath must take them back before the buffer is final: on verbs a queue pair's trip
  // through the error state, which costs the NIC's firmware more than the copy it saves. NCCL
  // posts every receive at the step's full size; LL and LL128 steps, and the last step of a
  // collective, arrive short. Aiming only after a receive that arrived full gives lanes to the
  // streams of full steps, which carry the bytes, and pays for one take-back per run of them.
  if (!last_filled_) return;
  if (!mr->contains(m.buf, m.capacity)) return;
  AimTarget t;
  t.token = rx_token_;
  t.msg_seq = m.req.seq;
  t.base = m.buf;
  t.capacity = m.capacity;
  t.pkt_payload = params_.pkt_payload;
  t.mr = mr;
  m.steer = ep_->aim_open(t);
  if (m.steer != 0) ++stats_.aimed_msgs;
}

bool RecvConn::unaim_locked(Msg& m, bool wait) {
  if (m.steer == 0) return true;
  if (!ep_->aim_close(m.steer, wait)) return false;
  m.steer = 0;
  return true;
}

uint64_t RecvConn::aim_stall_ns() const {
  return kAimStallRtoMax * static_cast<uint64_t>(cfg_.rto_max_us) * 1000;
}

bool RecvConn::check_aim_locked(Msg& m, bool moved, uint64_t now) {
  if (moved && !ep_->aim_reachable(m.steer)) {
    if (!resteer_locked(m, now)) return false;
    OR_INFO(
        "receive %u: its place in the datapath was lost in mid-receive (%llu of its "
        "bytes in): its sender is asked to send the rest the common way",
        m.req.seq, static_cast<unsigned long long>(m.bytes_got));
  } else if (m.last_byte_ns != 0 && now - m.last_byte_ns >= aim_stall_ns()) {
    const std::string place = ep_->aim_text(m.steer);  // before the place is given back
    if (!resteer_locked(m, now)) return true;          // asked again on the next pass
    OR_WARN(
        "receive %u: no byte arrived in place for %llu ms (%llu of %llu bytes in) while "
        "its sender was alive: its sender is asked to send the rest the common way (%s)",
        m.req.seq, static_cast<unsigned long long>((now - m.last_byte_ns) / 1000000),
        static_cast<unsigned long long>(m.bytes_got), static_cast<unsigned long long>(m.size),
        place.empty() ? "no datapath detail" : place.c_str());
  }
  return true;
}

// The datapath still taking its requests back: false, and asked again on the next pass.
bool RecvConn::resteer_locked(Msg& m, uint64_t now) {
  if (!unaim_locked(m, false)) return false;
  ++stats_.resteers;
  m.resteered = true;
  m.cts_backoff_ns = cts_resend_ns_locked();
  send_cts_locked(m, now);
  return true;
}

void RecvConn::send_cts_locked(Msg& m, uint64_t now) {
  PacketHeader h;
  h.type = PacketType::kCts;
  h.msg_seq = m.req.seq;
  h.msg_size = m.capacity;
  h.msg_floor = floor_;
  h.steer = m.steer;  // its DATA go to the place the datapath gave (aim_locked), if any
  if (m.bounded) h.flags = kFlagBounded | (m.until_started ? kFlagWhole : 0);
  if (m.exact && params_.delivery == Delivery::kBounded) h.flags = kFlagExact;
  // The sender learns from this how long it may wait for a CTS before expiring a message: as
  // long as this side waits for a sender that has not started.
  if (m.bounded) {
    const uint64_t wait = start_allowance_locked(m.capacity);
    timeout_hint_us_ = static_cast<uint32_t>(std::min<uint64_t>(wait / 1000, UINT32_MAX));
  }
  h.credit = credit_locked(m, true);
  send_ctrl_locked(h);
  m.cts_ns = now;
  m.cts_bytes = m.bytes_got;
  if (m.first_cts_ns == 0) m.first_cts_ns = now;
}

// Packets the sender may have sent beyond the cumulative point `m.cum`: what already arrived
// above it plus this connection's share of the downlink. 0 (no limit) for exact receives.
uint16_t RecvConn::credit_locked(const Msg& m, bool first) const {
  if (!m.bounded || !downlink_) return 0;
  const uint64_t above = m.high > m.cum ? m.high - m.cum : 0;
  const uint64_t c = above + downlink_->credit_pkts(params_.pkt_payload, first);
  return static_cast<uint16_t>(std::min<uint64_t>(c, Downlink::kMaxCreditPkts));
}

void RecvConn::on_packet_locked(const PacketHeader& h, const uint8_t* payload, uint64_t now) {
  switch (h.type) {
    case PacketType::kData:
      on_data_locked(h, payload, now);
      break;
    case PacketType::kHello:
      // Our HELLO_ACK was lost and the sender asks again.
      if (have_hello_ack_) {
        PacketHeader a;
        a.type = PacketType::kHelloAck;
        send_ctrl_locked(a, hello_ack_, kHelloBodyBytes);
      }
      break;
    default:
      ++stats_.drop_unexpected;
      break;
  }
}

bool RecvConn::waiting_on_peer_locked() const {
  for (uint32_t s = floor_; s != next_seq_; ++s) {
    if (msgs_[s % kMaxRequests].state == State::kPosted) return true;
  }
  return false;
}

// The sender left: nothing more will arrive. A receive that may end without all its data
// (bounded, or calibrating on a bounded connection) ends now as if the sender had expired it,
// holes filled and counted; one that may not (exact) is an error.
void RecvConn::on_peer_closed_locked(uint32_t /*floor*/, uint64_t now) {
  for (uint32_t s = floor_; s != next_seq_; ++s) {
    Msg& m = slot(s);
    if (m.state != State::kPosted) continue;
    if (!expiry_allowed_locked(m)) {
      peer_gone_locked("it closed the connection while a receive was pending");
      return;
    }
    complete_locked(m, End::kExpired, now);
  }
  advance_floor_locked(now);
}

// The next packets of the posted receives, oldest receive first, each from one past the highest
// packet that arrived: in order, that is what comes next (repairs of holes below are not
// guessed). Every region guessed is one no packet has filled yet, within the message's size, so
// a wrong guess only scribbles where the right packet, or the hole fill, writes later. Not a
// receive whose first packet has not come: its size is unknown, and the bytes past a message
// are the caller's (harness_test.cc checks a canary there). Receives not started whose buffer
// holds one packet are counted instead (`whole`): their one datagram each comes next.
int RecvConn::rx_guesses(RxGuesses* out) {
  out->split = kHeaderBytes;
  out->n = 0;
  out->whole = 0;
  out->first_pending = false;
  if (!fatal_.is_ok()) return 0;
  const uint64_t pkt = params_.pkt_payload;
  for (uint32_t s = floor_; s != next_seq_ && out->n < RxGuesses::kMax; ++s) {
    const Msg& m = slot(s);
    if (m.state != State::kPosted) continue;
    if (!m.started) {
      // Nothing of it can be guessed, but when it is one datagram at most nothing later waits
      // on its size either.
      if (m.capacity <= pkt) {
        ++out->whole;
        continue;
      }
      // Its size is unknown until its first packet: guessing past it could write into the
      // caller's bytes beyond the message. Messages arrive in order, so the first packet of the
      // oldest one not started is what comes once those guessed above are in.
      out->first_pending = true;
      break;
    }
    // Under way behind a receive whose datagram has not come: not in order, so not guessed.
    if (out->whole > 0) break;
    for (uint64_t off = uint64_t{m.high} * pkt; off < m.size && out->n < RxGuesses::kMax;
         off += pkt) {
      RxGuesses::Guess& g = out->g[out->n++];
      g.dst = m.buf + off;
      g.len = static_cast<uint32_t>(std::min(pkt, m.size - off));
      g.msg_seq = s;
      g.offset = off;
    }
  }
  return out->n;
}

void RecvConn::on_data_locked(const PacketHeader& h, const uint8_t* payload, uint64_t now) {
  last_data_arrival_ns_ = std::max(last_data_arrival_ns_, rx_arrival_ns_);
  const uint32_t s = h.msg_seq;
  if (static_cast<int32_t>(s - floor_) < 0 ||
      (s - floor_ < next_seq_ - floor_ && slot(s).state != State::kPosted)) {
    // For a message already complete: a late bounded packet, or a retransmission whose FINAL
    // was lost. Answer it (for bounded ones, the first and then only retransmissions: a sender
    // cut off by the deadline may have a window of new packets in flight) so that the sender
    // can finish.
    on_late_sign_locked(s);
    if (h.flags & kFlagExpired) {
      ++stats_.drop_stale;
    } else if (h.flags & kFlagBounded) {
      ++stats_.late_pkts;
      // A retransmission is a sender still waiting (our FINAL was lost): always answered.
      if (!(answered_late_ && answered_seq_ == s) || (h.flags & kFlagRetx)) {
        send_final_for_locked(s, true);
        answered_late_ = true;
        answered_seq_ = s;
      }
    } else {
      ++stats_.drop_stale;
      send_final_for_locked(s, false,
                            /*dup=*/(h.flags & kFlagRetx) && needless_retx_locked(s, h.offset));
    }
    return;
  }
  if (s - floor_ >= next_seq_ - floor_) {
    // Not posted yet. Only an expiry notice may legitimately come this early.
    if ((h.flags & kFlagExpired) && s - floor_ < 2 * kMaxRequests) {
      if (s - expired_base_ >= 64) {
        expired_base_ = floor_;
        expired_mask_ = 0;
      }
      if (s - expired_base_ < 64) expired_mask_ |= uint64_t{1} << (s % 64);
    } else {
      ++stats_.drop_unexpected;
    }
    return;
  }
  Msg& m = slot(s);
  if (h.flags & kFlagExpired) {
    if (expiry_allowed_locked(m)) {
      complete_locked(m, End::kExpired, now);
      advance_floor_locked(now);
    } else if (m.exact) {
      // The sender gave up on a message this receive needs whole: its bytes will never come,
      // and waiting would hang the caller. The two ends disagreed on the transfer's kind (a
      // sender without the protocol of the transfer that expired it before our CTS).
      fail_expired_pinned_locked();
    } else {
      ++stats_.drop_unexpected;
    }
    return;
  }
  if (!m.started) {
    if (h.msg_size > m.capacity) {
      ++stats_.drop_bounds;
      return;
    }
    const uint64_t npkts =
        std::max<uint64_t>(1, (h.msg_size + params_.pkt_payload - 1) / params_.pkt_payload);
    m.started = true;
    // One peer estimate per message per connection: per packet, one large message would fill
    // the policy's memory of its peers and decide the median alone.
    if (policy_ != nullptr && h.timeout_us != 0 && (h.flags & kFlagBounded))
      policy_->on_peer_estimate(h.timeout_us, h.msg_size);
    m.size = h.msg_size;
    m.npkts = static_cast<uint32_t>(npkts);
    m.got.reset(m.npkts);
    m.by_retx.reset(m.npkts);
  } else if (h.msg_size != m.size) {
    ++stats_.drop_bounds;
    return;
  }
  if (h.offset % params_.pkt_payload != 0) {
    ++stats_.drop_bounds;
    return;
  }
  const uint64_t idx = h.offset / params_.pkt_payload;
  const uint64_t expect =
      idx + 1 < m.npkts ? params_.pkt_payload : m.size - idx * params_.pkt_payload;
  if (idx >= m.npkts || h.payload_len != expect) {
    ++stats_.drop_bounds;
    return;
  }
  if (!m.got.set(static_cast<uint32_t>(idx))) {
    ++stats_.drop_duplicate;
    // Only a retransmission is reported: a copy the network made, or an original that a
    // reordering made arrive after its probe, says nothing about the sender's guesses.
    if ((h.flags & kFlagRetx) && needless_retx_locked(s, h.offset)) m.dup_seen = true;
    // A retransmission of something we hold means our ACK was lost: acknowledge again.
    dirty_ |= 1u << (s % kMaxRequests);
    return;
  }
  if (h.flags & kFlagRetx) m.by_retx.set(static_cast<uint32_t>(idx));
  // Every field has been checked against the posted buffer: offset + len <= size <= capacity.
  // A payload received into its place (rx_guesses) is there already.
  if (h.payload_len && payload != m.buf + h.offset)
    std::memcpy(m.buf + h.offset, payload, h.payload_len);
  else if (h.payload_len)
    ++stats_.placed_pkts;
  // The sender's first packet: the network's part of the step starts here, early or late, and
  // the deadline becomes the transfer's budget from now (until here it was the start
  // allowance). A sender merely behind is waited for, so that this rank falls behind with it
  // instead of cutting it: cut ranks drift apart, and every later step then loses whole
  // messages (docs/lab.md, 1% loss). Before the receive is the oldest, arm_deadline_locked
  // gives it the budget when it gets there.
  if (m.bytes_got == 0 && m.first_data_ns == 0) {
    m.first_data_ns = now;
    // A receive bounded only until its sender starts is whole from here: its deadline becomes
    // the fallback bound (a sender that falls silent mid-message; a dead one fails sooner, by
    // the keepalive), and the early timeout never arms.
    if (m.bounded && m.deadline_ns != 0) m.deadline_ns = now + started_budget_locked(m);
  }
  // The first DATA a CTS unlocked: a sample of the RTT, never below it (the sender may have
  // posted or polled late; the first CTS is the one it may have answered). Retransmissions
  // may have been sent long before; only a fresh packet times the path.
  const bool rtt_sample = m.bytes_got == 0 && !(h.flags & kFlagRetx) && m.first_cts_ns != 0;
  if (rtt_sample) rtt_.sample(now - m.first_cts_ns);
  if (m.bounded && downlink_) {
    if (rtt_sample) downlink_->on_rtt(now - m.first_cts_ns, now);
    burst_bytes_ += h.payload_len + kHeaderBytes;
  }
  m.bytes_got += h.payload_len;
  m.last_byte_ns = now;
  m.high = std::max(m.high, static_cast<uint32_t>(idx) + 1);
  ++stats_.data_pkts;
  ++m.pkts_since_ack;
  m.cum = m.got.first_clear(m.cum);
  // Early timeout: a quiet period after the tail. Every packet that still arrives (a repair of
  // an early loss) starts it again, so repairs in flight are waited for; only a sender that
  // fell silent with holes left (lost repairs, a dead sender) meets it before the deadline.
  if ((h.flags & kFlagTail) && m.bounded && !m.whole()) m.tail_seen = true;
  if (m.tail_seen) {
    // Without a policy, the fraction applies to the receive's own budget (its estimate).
    const uint64_t budget = m.deadline_ns > m.head_ns && m.head_ns != 0 ? m.deadline_ns - m.head_ns
                                                                        : budget_locked(m.size);
    const uint64_t early =
        policy_ ? policy_->early_ns(m.size)
                : static_cast<uint64_t>(cfg_.early_fraction * static_cast<double>(budget));
    m.early_ns = now + early;
  }
  if (m.got.full()) {
    complete_locked(m, End::kAll, now);
    advance_floor_locked(now);
    return;
  }
  // Bounded packets are acknowledged too: the sender's congestion window needs the feedback
  // during bounded steps, and a packet lost early in a step is repaired from it.
  // Normally one SACK per burst (after_rx_burst_locked); within a long burst also every
  // kAckEveryPkts packets, so that one lost ACK never hides a whole window.
  if (m.pkts_since_ack >= kAckEveryPkts)
    send_ack_locked(m, false);
  else
    dirty_ |= 1u << (s % kMaxRequests);
}

}  // namespace optireduce
