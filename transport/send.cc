// SendConn: CTS matching, packetisation, SACK processing, loss recovery, bounded expiry.
#include "transport/send.h"

#include <algorithm>
#include <cstring>

#include "transport/deadline.h"
#include "transport/log.h"

namespace optireduce {

namespace {
// A hole is declared lost once this many packets above it have been acknowledged (TCP's
// duplicate-ACK threshold: tolerates mild reordering without spurious retransmissions).
constexpr uint32_t kDupThresh = 3;
// Before the first RTT sample, retransmit after this long.
constexpr uint64_t kInitialRtoNs = 20'000'000;
// On a bounded connection, how long a message may wait when no receiver budget is known yet
// (the receiver died before its first bounded CTS, or during calibration): long enough never
// to cut a live calibration step, finite so that a dead peer never hangs anyone.
constexpr uint64_t kFallbackGiveUpNs = 10'000'000'000;
// Shortest tail-loss-probe delay: below this a probe mostly duplicates packets still in flight.
constexpr uint64_t kMinProbeNs = 100'000;
}  // namespace

SendConn::SendConn(const Config& cfg, const Clock& clock, std::unique_ptr<Endpoint> ep,
                   const ConnParams& p, std::shared_ptr<Registry> registry)
    : Conn(cfg, clock, std::move(ep), p, std::move(registry)),
      rtt_(static_cast<uint64_t>(cfg.rto_min_us) * 1000, static_cast<uint64_t>(cfg.rto_max_us) * 1000,
           std::max<uint64_t>(kInitialRtoNs, static_cast<uint64_t>(cfg.rto_min_us) * 1000)),
      cwnd_(p.pkt_payload,
            std::min<uint64_t>(static_cast<uint64_t>(cfg.window_bytes), p.peer_window)) {
  retx_.reserve(kRetxCap);
  for (auto& m : msgs_) m.req.conn = this;
  if (cfg.rate_gbps > 0) pacer_.set_rate(cfg.rate_gbps / 8.0, 16 * uint64_t{p.pkt_payload});
}

SendConn::~SendConn() {
  deactivate();
  std::lock_guard<std::mutex> lock(mu_);
  say_close_locked();
}

Delivery SendConn::delivery() const {
  std::lock_guard<std::mutex> lock(mu_);
  return force_exact_ ? Delivery::kExact : params_.delivery;
}

void SendConn::force_exact() {
  std::lock_guard<std::mutex> lock(mu_);
  force_exact_ = true;
}

void SendConn::set_group(DeadlinePolicy* group) {
  std::lock_guard<std::mutex> lock(mu_);
  group_ = group;
}

uint64_t SendConn::inflight_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return inflight_;
}

uint64_t SendConn::cwnd_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cwnd_.cwnd();
}

uint32_t SendConn::pkt_len(const Msg& m, uint32_t i) const {
  if (i + 1 < m.npkts) return params_.pkt_payload;
  return static_cast<uint32_t>(m.size - uint64_t{i} * params_.pkt_payload);
}

Status SendConn::isend(const void* data, size_t size, Request** req) {
  std::lock_guard<std::mutex> lock(mu_);
  *req = nullptr;
  if (Status st = check_peer_locked(); !st) return st;
  if (data == nullptr && size != 0) return Status(Errc::kInternal);
  const uint64_t now = clock_.now_ns();
  if (next_seq_ - oldest_ >= static_cast<uint32_t>(kMaxRequests)) {
    progress_locked(now);
    return Status::ok();  // back-pressure: NCCL retries
  }
  const uint64_t npkts64 = std::max<uint64_t>(1, (size + params_.pkt_payload - 1) / params_.pkt_payload);
  if (npkts64 > UINT32_MAX) return Status(Errc::kInternal);
  Msg& m = slot(next_seq_);
  m.req.seq = next_seq_;
  m.state = State::kWaitCts;
  m.bounded = false;  // decided by the receiver's CTS
  m.expired = false;
  m.error = Status::ok();
  m.data = static_cast<const uint8_t*>(data);
  m.size = size;
  m.npkts = static_cast<uint32_t>(npkts64);
  m.next_new = m.cum = m.high = 0;
  m.posted_ns = now;
  m.started_ns = m.progress_ns = 0;
  expired_mask_ &= ~(uint64_t{1} << (next_seq_ % 64));  // the bit now belongs to this message
  ++next_seq_;
  CtsRecord& c = cts_[m.req.seq % kCtsRing];
  if (c.valid && c.seq == m.req.seq) start_locked(m, c.capacity, c.bounded, now);
  progress_locked(now);
  *req = &m.req;
  return Status::ok();
}

void SendConn::start_locked(Msg& m, uint64_t capacity, bool bounded, uint64_t now) {
  m.bounded = bounded && params_.delivery == Delivery::kBounded && !force_exact_;
  if (m.size > capacity) {
    // Never truncate silently: NCCL posted a receive smaller than the send, a caller bug.
    m.error = Status(Errc::kInternal);
    m.state = State::kDone;
    OR_WARN("message %u of %llu bytes is larger than the posted receive (%llu bytes)",
            m.req.seq, static_cast<unsigned long long>(m.size),
            static_cast<unsigned long long>(capacity));
    return;
  }
  m.state = State::kSending;
  m.started_ns = m.progress_ns = now;
  if (m.bounded) set_bounded_rate_locked();
  if (!m.bounded) {
    m.acked.reset(m.npkts);
    m.resent.reset(m.npkts);
    if (m.sent_ns.size() < m.npkts) m.sent_ns.resize(m.npkts);
    std::fill(m.sent_ns.begin(), m.sent_ns.begin() + m.npkts, 0);
  }
}

// Bounded packets get no ACKs, so no window governs them; unpaced, a large message would leave
// in one burst, overflow a bottleneck queue or the receiver's socket buffer, and the deadline
// would absorb self-inflicted loss. They are paced instead at the delivery rate the
// connection's exact traffic (calibration, small control-sized steps) measured, with 25%
// headroom so that pacing itself is not the bottleneck; before any measurement, one receive
// window per smoothed RTT. OPTIREDUCE_RATE_GBPS, when set, replaces the measurement (and the
// group's shared bucket, see ConnGroup): on a known link it is the better figure.
void SendConn::set_bounded_rate_locked() {
  double rate = 0;
  if (cfg_.rate_gbps > 0) {
    rate = cfg_.rate_gbps / 8.0;  // the operator knows the link: no measurement overrides it
  } else if (delivery_.rate() > 0) {
    rate = 1.25 * delivery_.rate();
  } else if (rtt_.has_sample()) {
    rate = 1.25 * static_cast<double>(cwnd_.ceiling()) / static_cast<double>(rtt_.srtt_ns());
  }
  if (rate <= 0) return;  // nothing measured, nothing configured: unpaced
  bounded_pacer_.set_rate(rate,
                          std::max<uint64_t>(cwnd_.ceiling() / 4, 16 * uint64_t{params_.pkt_payload}));
}

void SendConn::sample_delivery_rate_locked(uint64_t newly_acked, uint64_t now) {
  const bool restart = rate_restart_;
  rate_restart_ = false;
  const bool idle_after = inflight_ == 0 && retx_head_ == retx_.size();
  // Windows of at least one RTT (and 0.5 ms) average out ACK batching.
  const uint64_t min_span = std::max<uint64_t>(500'000, rtt_.srtt_ns());
  if (ConnGroup* g = conn_group(); g != nullptr)
    g->add_delivered(newly_acked, now, min_span, restart, idle_after);
  delivery_.on_ack(newly_acked, now, min_span, restart, idle_after);
}

void SendConn::on_packet_locked(const PacketHeader& h, const uint8_t* payload, uint64_t now) {
  switch (h.type) {
    case PacketType::kCts:
      on_cts_locked(h, now);
      break;
    case PacketType::kAck:
      on_ack_locked(h, payload, now);
      break;
    case PacketType::kHelloAck:
      break;  // a repeated handshake answer: nothing to do
    default:
      ++stats_.drop_unexpected;
      break;
  }
}

// A bounded message under way waits on nobody (it is done once its packets have left); every
// other posted message needs the receiver: its CTS, or (exact) its ACKs.
bool SendConn::waiting_on_peer_locked() const {
  for (uint32_t s = oldest_; s != next_seq_; ++s) {
    const Msg& m = msgs_[s % kMaxRequests];
    if (m.state == State::kWaitCts || (m.state == State::kSending && !m.bounded)) return true;
  }
  return false;
}

// The receiver left. On a bounded connection what it never took ends as expired, as it would
// have at its deadline; an exact message can never be delivered now, which is an error.
void SendConn::on_peer_closed_locked(uint64_t) {
  const bool may_expire = params_.delivery == Delivery::kBounded && !force_exact_;
  for (uint32_t s = oldest_; s != next_seq_; ++s) {
    Msg& m = slot(s);
    if (m.state != State::kWaitCts && m.state != State::kSending) continue;
    if (!may_expire) {
      peer_gone_locked("it closed the connection while a send was pending");
      return;
    }
    if (m.state == State::kSending) {
      give_up_locked(m);
    } else {
      m.state = State::kDone;
      m.expired = true;
      ++stats_.expired_sends;
    }
  }
}

void SendConn::on_cts_locked(const PacketHeader& h, uint64_t now) {
  const uint32_t s = h.msg_seq;
  const bool bounded = (h.flags & kFlagBounded) != 0;
  heard_cts_ = true;
  presumed_dead_ = false;
  if (h.flags & kFlagExact) force_exact_ = true;  // the receiver will wait for every byte
  if (bounded && params_.delivery == Delivery::kBounded) {
    // A send waits for its CTS at most as long as the receiver would wait for its data, so
    // that a stalled peer costs either side one deadline per step, not more.
    if (h.timeout_us) expiry_budget_ns_ = uint64_t{h.timeout_us} * 1000;
  }
  // Valid CTS sequences: not older than our oldest live message, and at most one receive
  // window (kMaxRequests) beyond the newest message the receiver may have seen completed.
  if (static_cast<int32_t>(s - oldest_) < 0) {
    // For a message we already finished. In bounded mode, answer a late CTS for an expired
    // message so that the receiver completes it at once instead of waiting for its deadline.
    if (oldest_ - s <= 64 && (expired_mask_ >> (s % 64) & 1)) send_expired_notice_locked(s);
    else ++stats_.drop_stale;
    return;
  }
  if (s - oldest_ >= kCtsRing) {
    ++stats_.drop_bounds;
    return;
  }
  if (s < next_seq_) {
    Msg& m = slot(s);
    if (m.state == State::kWaitCts) start_locked(m, h.msg_size, bounded, now);
    else if (m.state == State::kDone && m.expired) send_expired_notice_locked(s);
    // else: a repeated CTS for a message already under way.
    return;
  }
  CtsRecord& c = cts_[s % kCtsRing];
  c.seq = s;
  c.capacity = h.msg_size;
  c.bounded = bounded;
  c.valid = true;
}

void SendConn::ack_packet_locked(Msg& m, uint32_t i, uint64_t* newest_sent) {
  if (!m.acked.set(i)) return;
  const uint32_t len = pkt_len(m, i);
  acked_bytes_ += len;
  // A packet queued for retransmission was already taken out of the bytes in flight.
  if (m.sent_ns[i] != UINT64_MAX) inflight_ -= std::min<uint64_t>(inflight_, len);
  cwnd_.on_ack(len);
  if (!m.resent.test(i) && m.sent_ns[i] != UINT64_MAX)
    *newest_sent = std::max(*newest_sent, m.sent_ns[i]);
  m.high = std::max(m.high, i + 1);
}

void SendConn::on_ack_locked(const PacketHeader& h, const uint8_t* sack, uint64_t now) {
  const uint32_t s = h.msg_seq;
  if (static_cast<int32_t>(s - oldest_) < 0) {
    ++stats_.drop_stale;
    return;
  }
  if (s - oldest_ >= static_cast<uint32_t>(kMaxRequests) || s >= next_seq_) {
    ++stats_.drop_unexpected;
    return;
  }
  Msg& m = slot(s);
  if (m.state != State::kSending || m.bounded) {
    if (m.state == State::kDone) ++stats_.drop_stale;
    else ++stats_.drop_unexpected;
    return;
  }
  uint64_t newest_sent = 0;
  const uint64_t acked_before = acked_bytes_;
  if (h.flags & kFlagFinal) {
    if (m.next_new < m.npkts) {
      // Acknowledging packets we never sent is a protocol violation; refuse it.
      ++stats_.drop_bounds;
      return;
    }
    // The receiver holds the whole message; packets we never saw acknowledged arrived anyway.
    for (uint32_t i = m.acked.first_clear(m.cum); i < m.npkts; i = m.acked.first_clear(i + 1))
      ack_packet_locked(m, i, &newest_sent);
  } else {
    if (h.msg_size != m.npkts || h.offset > m.next_new) {
      ++stats_.drop_bounds;
      return;
    }
    for (uint32_t i = m.acked.first_clear(m.cum); i < h.offset; i = m.acked.first_clear(i + 1))
      ack_packet_locked(m, i, &newest_sent);
    const uint32_t nbytes = std::min(h.payload_len, kSackBytes);
    for (uint32_t byte = 0; byte < nbytes; ++byte) {
      if (sack[byte] == 0) continue;
      for (uint32_t bit = 0; bit < 8; ++bit) {
        if (!(sack[byte] >> bit & 1)) continue;
        const uint64_t i = uint64_t{h.offset} + byte * 8 + bit;
        if (i >= m.next_new) {
          ++stats_.drop_bounds;
          break;
        }
        ack_packet_locked(m, static_cast<uint32_t>(i), &newest_sent);
      }
    }
  }
  const uint32_t old_cum = m.cum;
  m.cum = m.acked.first_clear(m.cum);
  sample_delivery_rate_locked(acked_bytes_ - acked_before, now);
  if (newest_sent != 0) rtt_.sample(now - newest_sent);
  if (m.cum != old_cum) m.progress_ns = now;
  if (m.cum != old_cum || newest_sent != 0) {
    rto_deadline_ = now + rtt_.rto_ns();
    arm_probe_locked(now);  // progress: push the probe out again
  }
  if (m.acked.full()) {
    finish_locked(m);
    return;
  }
  detect_losses_locked(m, now);
}

void SendConn::detect_losses_locked(Msg& m, uint64_t now) {
  // Holes with kDupThresh acknowledged packets above them are lost. Once the whole message
  // has left, nothing more can arrive to push `high` up, so every aged hole below it counts.
  uint32_t limit = m.high >= kDupThresh + 1 ? m.high - kDupThresh : 0;
  if (m.next_new == m.npkts) limit = m.high;
  if (limit == 0) return;
  // A packet resent less than one smoothed RTT ago cannot have been acknowledged yet.
  const uint64_t min_age = rtt_.has_sample() ? rtt_.srtt_ns() : rtt_.rto_ns();
  for (uint32_t i = m.acked.first_clear(m.cum); i < limit; i = m.acked.first_clear(i + 1)) {
    if (m.sent_ns[i] == UINT64_MAX || now - m.sent_ns[i] < min_age) continue;
    if (retx_.size() >= kRetxCap) break;  // the RTO will find the rest
    cwnd_.on_loss(now, m.sent_ns[i]);
    mark_lost_locked(m, i);
  }
}

// A packet believed lost leaves the bytes in flight (so the window does not stay shut on
// packets that are no longer in the network: new packets keep ACKs, and so loss detection,
// flowing) and waits in the retransmission queue. sent_ns = UINT64_MAX marks it queued.
void SendConn::mark_lost_locked(Msg& m, uint32_t i) {
  inflight_ -= std::min<uint64_t>(inflight_, pkt_len(m, i));
  m.sent_ns[i] = UINT64_MAX;
  retx_.push_back({m.req.seq, i});
}

void SendConn::finish_locked(Msg& m) {
  m.state = State::kDone;
  ++stats_.msgs;
  stats_.bytes += m.size;
}

void SendConn::send_expired_notice_locked(uint32_t seq) {
  PacketHeader h;
  h.type = PacketType::kData;
  h.flags = kFlagExpired | kFlagBounded;
  h.msg_seq = seq;
  send_ctrl_locked(h);
}

// How long a message of a bounded connection may wait. With a budget from the receiver's CTS,
// that budget. Before the receiver ever spoke, the long fallback: a receiver may still turn out
// to be forced exact (NCCL using LL/LL128 on it), and an expired message would then hang it,
// so only a receiver silent for that long is presumed dead; after that first expiry the later
// messages expire at 2 x OPTIREDUCE_TIMEOUT_MS (else 1 s) instead of 10 s each.
uint64_t SendConn::give_up_ns_locked() const {
  if (expiry_budget_ns_ != 0) return expiry_budget_ns_;
  if (!presumed_dead_) return kFallbackGiveUpNs;
  return cfg_.timeout_ms > 0 ? static_cast<uint64_t>(2e6 * cfg_.timeout_ms) : 1'000'000'000;
}

// Ends a message of a bounded connection that ran out of time: packets not yet sent never
// will be, and (exact calibration message) unacknowledged ones stop counting as in flight.
void SendConn::give_up_locked(Msg& m) {
  if (!m.bounded) {
    for (uint32_t i = m.acked.first_clear(m.cum); i < m.next_new; i = m.acked.first_clear(i + 1))
      if (m.sent_ns[i] != UINT64_MAX) inflight_ -= std::min<uint64_t>(inflight_, pkt_len(m, i));
  }
  ++stats_.expired_sends;
  finish_locked(m);
}

void SendConn::on_timers_locked(uint64_t now) {
  // A bounded connection never lets a message wait forever: without a CTS it expires (and the
  // receiver is told); under way, a bounded message stops sending at its budget, and an exact
  // one (calibration) whose receiver stopped acknowledging is abandoned after the fallback.
  if (params_.delivery == Delivery::kBounded && !force_exact_) {
    const uint64_t give_up = give_up_ns_locked();
    for (uint32_t s = oldest_; s != next_seq_; ++s) {
      Msg& m = slot(s);
      if (m.state == State::kWaitCts && now - m.posted_ns >= give_up) {
        if (!heard_cts_) presumed_dead_ = true;
        m.state = State::kDone;
        m.expired = true;
        expired_mask_ |= uint64_t{1} << (s % 64);
        ++stats_.expired_sends;
        send_expired_notice_locked(s);
      } else if (m.state == State::kSending && m.bounded && now - m.started_ns >= give_up) {
        give_up_locked(m);
      } else if (m.state == State::kSending && !m.bounded &&
                 now - m.progress_ns >= std::max(give_up, kFallbackGiveUpNs)) {
        give_up_locked(m);
      }
    }
  }
  if (probe_deadline_ != 0 && now >= probe_deadline_) {
    if (inflight_ > 0) send_probe_locked();
    else probe_deadline_ = 0;
  }
  if (rto_deadline_ == 0 || now < rto_deadline_) return;
  if (inflight_ == 0) {  // everything was acknowledged meanwhile: nothing to time out
    rto_deadline_ = 0;
    return;
  }
  // Retransmission timeout: the oldest unacknowledged packets of every message under way go
  // again, up to one (shrunken) window.
  ++stats_.rto_events;
  rtt_.backoff();
  cwnd_.on_timeout();
  rto_deadline_ = 0;
  uint64_t budget = std::max<uint64_t>(cwnd_.cwnd(), params_.pkt_payload);
  for (uint32_t s = oldest_; s != next_seq_ && budget > 0; ++s) {
    Msg& m = slot(s);
    if (m.state != State::kSending || m.bounded) continue;
    for (uint32_t i = m.acked.first_clear(m.cum); i < m.next_new && budget > 0;
         i = m.acked.first_clear(i + 1)) {
      if (m.sent_ns[i] == UINT64_MAX) continue;  // already queued
      if (retx_.size() >= kRetxCap) break;
      mark_lost_locked(m, i);
      budget -= std::min<uint64_t>(budget, pkt_len(m, i));
    }
  }
}

// Loss probe: when nothing has been acknowledged for about two RTTs although packets are in
// flight, either the last packets or the ACKs for a whole burst were lost. No later packet
// will reveal it, and the RTO would collapse the window, so resend the highest outstanding
// packet of the oldest message: the receiver answers any packet with a complete SACK, which
// exposes every hole at once.
void SendConn::send_probe_locked() {
  probe_deadline_ = 0;
  for (uint32_t s = oldest_; s != next_seq_; ++s) {
    Msg& m = slot(s);
    if (m.state != State::kSending || m.bounded || m.acked.full()) continue;
    uint32_t last = m.next_new;
    for (uint32_t i = m.acked.first_clear(m.cum); i < m.next_new; i = m.acked.first_clear(i + 1))
      last = i;
    if (last == m.next_new) continue;  // nothing outstanding in this message
    if (m.sent_ns[last] != UINT64_MAX && retx_.size() < kRetxCap) {
      mark_lost_locked(m, last);
      ++stats_.probes;
    }
    break;
  }
}

void SendConn::arm_probe_locked(uint64_t now) {
  const uint64_t srtt = rtt_.has_sample() ? rtt_.srtt_ns() : rtt_.rto_ns() / 2;
  // Always before the RTO would fire, so a lost burst costs a probe, not a window collapse.
  probe_deadline_ = now + std::max(kMinProbeNs, std::min(2 * srtt, rtt_.rto_ns() * 3 / 4));
}

void SendConn::transmit_locked(uint64_t now) {
  // Exactly one of these three records what a batch entry is, so that a short send (the
  // datapath's queue full) can be rolled back precisely.
  struct Pending {
    uint32_t seq, pkt;
    bool retx;
    size_t retx_index;  // position in retx_ (retransmissions only)
  } pend[kBatch];
  for (;;) {
    uint64_t tokens = pacer_.available(now);
    int n = 0;
    // Retransmissions first: they unblock the receiver's oldest message.
    while (retx_head_ < retx_.size() && n < kBatch) {
      const Retx r = retx_[retx_head_];
      Msg& m = slot(r.seq);
      if (m.req.seq != r.seq || m.state != State::kSending || m.acked.test(r.pkt)) {
        ++retx_head_;  // finished meanwhile
        continue;
      }
      const uint32_t len = pkt_len(m, r.pkt);
      if (len > tokens) break;
      PacketHeader h;
      h.type = PacketType::kData;
      h.flags = kFlagRetx;
      h.msg_seq = r.seq;
      h.msg_size = m.size;
      h.offset = uint64_t{r.pkt} * params_.pkt_payload;
      h.msg_floor = oldest_;
      batch_slot_locked(h, m.data + h.offset, len);
      pend[n++] = {r.seq, r.pkt, true, retx_head_};
      tokens -= len;
      ++retx_head_;
    }
    // New packets, oldest message first, within the window (bounded: within their pacer).
    uint64_t inflight = inflight_;
    ConnGroup* group = conn_group();
    uint64_t btokens = bounded_pacer_.available(now);
    if (group != nullptr && cfg_.rate_gbps <= 0) btokens = std::min(btokens, group->bounded_tokens(now));
    uint64_t bounded_sent = 0;
    for (uint32_t s = oldest_; s != next_seq_ && n < kBatch; ++s) {
      Msg& m = slot(s);
      if (m.state != State::kSending) continue;
      if (m.bounded && group_ != nullptr) timeout_hint_us_ = group_->estimate_us(m.size);
      while (m.next_new < m.npkts && n < kBatch) {
        const uint32_t i = m.next_new;
        const uint32_t len = pkt_len(m, i);
        if (len > tokens) break;
        if (m.bounded) {
          if (len > btokens) break;
          btokens -= len;
        } else {
          // The window counts bytes; the SACK range limits how far past the first hole we go.
          if (inflight + len > cwnd_.cwnd() && inflight > 0) break;
          if (i >= m.cum + kSackBits) break;
        }
        PacketHeader h;
        h.type = PacketType::kData;
        h.flags = m.bounded ? kFlagBounded : 0;
        // The last ~1% of a message carries the tail flag (early-timeout hint).
        if (uint64_t{i} * 100 >= uint64_t{m.npkts} * 99 || i + 1 == m.npkts) h.flags |= kFlagTail;
        h.msg_seq = s;
        h.msg_size = m.size;
        h.offset = uint64_t{i} * params_.pkt_payload;
        h.msg_floor = oldest_;
        batch_slot_locked(h, m.data + h.offset, len);
        pend[n++] = {s, i, false, 0};
        tokens -= len;
        if (!m.bounded) inflight += len;
        ++m.next_new;
      }
      if (m.next_new < m.npkts) break;  // keep message order on the wire
    }
    if (n == 0) return;
    const int sent = flush_locked();
    // Roll back what the datapath did not take (in reverse, so next_new rewinds correctly).
    for (int k = n - 1; k >= sent; --k) {
      Msg& m = slot(pend[k].seq);
      if (pend[k].retx) {
        retx_head_ = pend[k].retx_index;  // still queued (sent_ns stays UINT64_MAX)
      } else {
        m.next_new = pend[k].pkt;
      }
    }
    for (int k = 0; k < sent; ++k) {
      Msg& m = slot(pend[k].seq);
      const uint32_t len = pkt_len(m, pend[k].pkt);
      pacer_.consume(len);
      ++stats_.data_pkts;
      if (m.bounded) {
        bounded_pacer_.consume(len);
        bounded_sent += len;
        continue;
      }
      if (pend[k].retx) {
        ++stats_.retx_pkts;
        m.resent.set(pend[k].pkt);
      } else if (inflight_ == 0 && retx_head_ == retx_.size()) {
        rate_restart_ = true;  // leaving idle (DeliveryRate: no window spans idle time)
      }
      inflight_ += len;
      m.sent_ns[pend[k].pkt] = now;
      if (rto_deadline_ == 0) rto_deadline_ = now + rtt_.rto_ns();
      if (probe_deadline_ == 0) arm_probe_locked(now);
    }
    if (group != nullptr && bounded_sent > 0 && cfg_.rate_gbps <= 0) group->consume_bounded(bounded_sent);
    // A bounded message is done once all of its packets have left.
    for (uint32_t s = oldest_; s != next_seq_; ++s) {
      Msg& m = slot(s);
      if (m.state == State::kSending && m.bounded && m.next_new == m.npkts) finish_locked(m);
    }
    if (retx_head_ == retx_.size()) {
      retx_.clear();
      retx_head_ = 0;
    }
    if (sent < n) return;  // the datapath is full; try again on the next call
  }
}

Status SendConn::test_locked(Request* req, bool* done, size_t* size, uint64_t) {
  *done = false;
  const uint32_t s = req->seq;
  if (&slot(s).req != req || s - oldest_ >= next_seq_ - oldest_) return Status(Errc::kInternal);
  Msg& m = slot(s);
  // A message that finished before the connection failed is still reported as finished.
  if (m.state != State::kDone) return fatal_;
  if (!m.error.is_ok()) return m.error;
  *done = true;
  if (size) *size = m.size;
  m.state = State::kFree;
  while (oldest_ != next_seq_ && slot(oldest_).state == State::kFree) ++oldest_;
  return Status::ok();
}

}  // namespace optireduce
