// SendConn: a message's life (isend, CTS, start, finish, test) and its state machine. The other
// concerns of the sending side live beside it: send_tx.cc (packetising and transmit under the
// windows and the pacer), send_recovery.cc (acknowledgements, loss detection, retransmission
// timer, loss probe), send_expiry.cc (bounded messages that run out of time).
#include "transport/send.h"

#include "transport/deadline.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <vector>

#include "transport/log.h"

namespace optireduce {

namespace {
// Before the first RTT sample, retransmit after this long: conservative, as for a millisecond
// network. The first ACK of the first message gives a sample, and from then on every timer of
// the connection follows the measured RTT (rtt.h).
constexpr uint64_t kInitialRtoNs = 20'000'000;
}  // namespace

SendConn::SendConn(const Config& cfg, const Clock& clock, std::unique_ptr<Endpoint> ep,
                   const ConnParams& p, std::shared_ptr<Registry> registry,
                   std::shared_ptr<Path> path)
    : Conn(cfg, clock, std::move(ep), p, std::move(registry), ConnSide::kSender),
      rtt_(static_cast<uint64_t>(cfg.rto_min_us) * 1000,
           static_cast<uint64_t>(cfg.rto_max_us) * 1000,
           std::max<uint64_t>(kInitialRtoNs, static_cast<uint64_t>(cfg.rto_min_us) * 1000)),
      path_(path ? std::move(path)
                 : std::make_shared<Path>(make_default_controller(p.pkt_payload), p.pkt_payload,
                                          cfg.rate_gbps / 8.0)),
      flow_window_(std::max<uint64_t>(
          std::min<uint64_t>(static_cast<uint64_t>(cfg.window_bytes), p.peer_window),
          4 * uint64_t{p.pkt_payload})) {
  fences_.reset(new TxFence[kMaxRequests]);
  retx_.reserve(kRetxCap);
  for (auto& m : msgs_) m.req.conn = this;
  path_->attach();
}

SendConn::~SendConn() {
  deactivate();
  std::lock_guard<std::mutex> lock(mu_);
  say_close_locked();
  path_->release(inflight_);  // what is still out there no longer counts against the others
  path_->detach();
  // Sends posted from a caller's buffer that the device has not finished (a close with sends in
  // flight; a send is never reported done before). Their completions usually come within
  // microseconds: a few receive calls reap them. Should any stay, the fences are left to the
  // endpoint that will release them, 32 words leaked rather than written after being freed.
  auto pending = [this] {
    for (int i = 0; i < kMaxRequests; ++i)
      if (!fences_[i].idle()) return true;
    return false;
  };
  RxPacket scratch[kBatch];
  for (int tries = 0; tries < 64 && pending(); ++tries) (void)ep_->rx_burst(scratch, kBatch);
  if (pending()) {
    OR_INFO("connection %016llx closed while the device still read one of its send buffers",
            static_cast<unsigned long long>(params_.token));
    // Kept reachable (never freed, never destroyed: the endpoint may release into them at any
    // time, at exit too), so that a leak checker sees a deliberate keep, not a lost block.
    static std::mutex kept_mu;
    static auto* kept = new std::vector<std::unique_ptr<TxFence[]>>;
    std::lock_guard<std::mutex> keep(kept_mu);
    kept->push_back(std::move(fences_));
  }
}

bool SendConn::legal_transition(State from, State to) {
  switch (from) {
    case State::kFree: return to == State::kWaitCts;
    case State::kWaitCts: return to == State::kSending || to == State::kDone;
    case State::kSending: return to == State::kDone;
    case State::kDone: return to == State::kFree;
  }
  return false;
}

bool SendConn::set_state_locked(Msg& m, State to) {
  if (!legal_transition(m.state, to)) {
    OR_WARN("send message %u: illegal state change %d -> %d", m.req.seq, static_cast<int>(m.state),
            static_cast<int>(to));
    fail_locked(Status(Errc::kInternal), "illegal send state change");
    return false;
  }
  m.state = to;
  if (to == State::kDone) last_done_ns_ = clock_.now_ns();
  return true;
}

// Constant for the connection's life (the handshake's), so no lock on NCCL's hot path.
Delivery SendConn::delivery() const {
  return params_.delivery;
}

void SendConn::set_group(DeadlinePolicy* group) {
  std::lock_guard<std::mutex> lock(mu_);
  group_ = group;
}

uint64_t SendConn::inflight_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return inflight_;
}

uint32_t SendConn::pkt_len(const Msg& m, uint32_t i) const {
  if (i + 1 < m.npkts) return params_.pkt_payload;
  return static_cast<uint32_t>(m.size - uint64_t{i} * params_.pkt_payload);
}

// The message may end without all its data: its connection is bounded and neither end pinned
// it exact.
bool SendConn::may_expire_locked(const Msg& m) const {
  return params_.delivery == Delivery::kBounded && !m.exact;
}

Status SendConn::isend(const void* data, size_t size, MsgDelivery how, const MemoryRegion* mr,
                       Request** req) {
  std::lock_guard<std::mutex> lock(mu_);
  return post_locked(data, size, how, mr, size, req);
}

Status SendConn::isend_held(const void* data, size_t size, size_t ready, Request** req) {
  std::lock_guard<std::mutex> lock(mu_);
  *req = nullptr;
  if (ready > size) return Status(Errc::kInvalidUsage);
  return post_locked(data, size, MsgDelivery::kAsConnection, nullptr, ready, req);
}

SendConn::Msg* SendConn::outstanding_locked(Request* req) {
  if (req == nullptr) return nullptr;
  const uint32_t s = req->seq;
  if (&slot(s).req != req || s - oldest_ >= next_seq_ - oldest_) return nullptr;
  return &slot(s);
}

Status SendConn::release(Request* req, size_t ready) {
  std::lock_guard<std::mutex> lock(mu_);
  Msg* m = outstanding_locked(req);
  if (m == nullptr || ready > m->size) return Status(Errc::kInvalidUsage);
  if (m->state == State::kDone) return Status::ok();
  const uint32_t r = packets_below(*m, ready);
  if (r <= m->ready) return Status::ok();
  m->ready = r;
  progress_locked(clock_.now_ns());
  return Status::ok();
}

uint64_t SendConn::sent_prefix(Request* req) {
  std::lock_guard<std::mutex> lock(mu_);
  const Msg* m = outstanding_locked(req);
  if (m == nullptr) return 0;
  if (m->state == State::kDone) return m->size;
  return std::min<uint64_t>(uint64_t{m->next_new} * params_.pkt_payload, m->size);
}

uint32_t SendConn::packets_below(const Msg& m, uint64_t bytes) const {
  if (bytes >= m.size) return m.npkts;
  return static_cast<uint32_t>(bytes / params_.pkt_payload);
}

Status SendConn::post_locked(const void* data, size_t size, MsgDelivery how, const MemoryRegion* mr,
                             size_t ready, Request** req) {
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
  m.req.caller_data = nullptr;
  if (!set_state_locked(m, State::kWaitCts)) return fatal_;
  m.bounded = m.whole = false;  // decided by the receiver's CTS
  m.exact = how == MsgDelivery::kExact;
  // kUntilStarted is the receiver's choice; a sender that passes it means kAsConnection.
  m.expire_early = how == MsgDelivery::kAsConnection || how == MsgDelivery::kUntilStarted;
  m.expired = false;
  bool earlier_done = true;
  for (uint32_t s = oldest_; s != next_seq_; ++s) earlier_done &= slot(s).state == State::kDone;
  m.burst_head = starts_burst(earlier_done, last_done_ns_, now);
  m.error = Status::ok();
  m.data = static_cast<const uint8_t*>(data);
  m.mr = size != 0 ? mr : nullptr;
  m.size = size;
  m.npkts = static_cast<uint32_t>(npkts64);
  m.ready = packets_below(m, ready);
  m.next_new = m.cum = m.high = 0;
  m.posted_ns = now;
  m.wait_ns = params_.delivery == Delivery::kBounded && m.expire_early && group_ != nullptr
                  ? group_->start_allowance_ns(size)
                  : 0;
  m.started_ns = m.progress_ns = 0;
  m.sack_resent = m.reorder_reported = false;
  expired_mask_ &= ~(uint64_t{1} << (next_seq_ % 64));  // the bit now belongs to this message
  ++next_seq_;
  CtsRecord& c = cts_[m.req.seq % kCtsRing];
  if (params_.delivery == Delivery::kBounded &&
      static_cast<int32_t>(m.req.seq - receiver_floor_) < 0) {
    // The receiver's deadline ended this message before we posted it (see
    // on_receiver_floor_locked): nothing of it is wanted any more. Where it had asked for it,
    // it is told that we came, and when (DeadlinePolicy::on_late_sender): it counted us as
    // exactly as late as it waited, and a straggler beyond any allowance must not teach it to
    // wait longer.
    expire_unstarted_locked(m);
    if (c.valid && c.seq == m.req.seq) send_expired_notice_locked(m.req.seq);
  } else if (c.valid && c.seq == m.req.seq) {
    start_locked(m, c, now);
  }
  progress_locked(now);
  *req = &m.req;
  return Status::ok();
}

void SendConn::start_locked(Msg& m, const CtsRecord& cts, uint64_t now) {
  // How long the receiver had been asking when this burst's first send came (0: the sender was
  // first): the skew as the later rank sees it (DeadlinePolicy::on_send_lateness).
  if (m.burst_head && group_ != nullptr && params_.delivery == Delivery::kBounded)
    group_->on_send_lateness(m.posted_ns - std::min(m.posted_ns, cts.arrived_ns));
  if (cts.exact) m.exact = true;  // the receiver will wait for every byte
  m.bounded = cts.bounded && may_expire_locked(m);
  m.whole = m.bounded && cts.whole;
  m.grant = m.bounded && cts.credit != 0 ? cts.credit : UINT32_MAX;
  m.steer = cts.steer;
  const uint64_t capacity = cts.capacity;
  if (m.size > capacity) {
    // Never truncate silently: NCCL posted a receive smaller than the send, a caller bug.
    m.error = Status(Errc::kInternal);
    set_state_locked(m, State::kDone);
    OR_WARN("message %u of %llu bytes is larger than the posted receive (%llu bytes)",
            m.req.seq, static_cast<unsigned long long>(m.size),
            static_cast<unsigned long long>(capacity));
    return;
  }
  if (!set_state_locked(m, State::kSending)) return;
  m.started_ns = m.progress_ns = now;
  m.acked.reset(m.npkts);
  m.resent.reset(m.npkts);
  if (m.sent_ns.size() < m.npkts) {
    m.sent_ns.resize(m.npkts);
    m.first_ns.resize(m.npkts);
  }
  std::fill(m.sent_ns.begin(), m.sent_ns.begin() + m.npkts, 0);
}

void SendConn::finish_locked(Msg& m) {
  if (!set_state_locked(m, State::kDone)) return;
  ++stats_.msgs;
  stats_.bytes += m.size;
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

// Every posted message needs the receiver: its CTS, then its ACKs (bounded ones too).
bool SendConn::waiting_on_peer_locked() const {
  for (uint32_t s = oldest_; s != next_seq_; ++s) {
    const State st = msgs_[s % kMaxRequests].state;
    if (st == State::kWaitCts || st == State::kSending) return true;
  }
  return false;
}

// The receiver left. What its CLOSE's floor says it completed is done: a receiver may close as
// soon as its message is complete (NCCL does, once its own requests are done), before a lost
// final ACK was repaired. On a bounded connection what it never took ends as expired, as it
// would have at its deadline; an exact message can never be delivered now, which is an error.
void SendConn::on_peer_closed_locked(uint32_t floor, uint64_t) {
  // A floor outside [oldest_, next_seq_] completes nothing (an older peer's CLOSE carries 0).
  const bool floor_ok = floor - oldest_ <= next_seq_ - oldest_;
  for (uint32_t s = oldest_; s != next_seq_; ++s) {
    Msg& m = slot(s);
    if (m.state == State::kSending && floor_ok && static_cast<int32_t>(s - floor) < 0) {
      // Only its ACK is missing (a bounded one may have been cut there: no ACK says which,
      // so it is not counted as cut).
      forget_outstanding_locked(m);
      finish_locked(m);
      continue;
    }
    if (m.state != State::kWaitCts && m.state != State::kSending) continue;
    if (!may_expire_locked(m)) {
      peer_gone_locked("it closed the connection while a send was pending");
      return;
    }
    if (m.state == State::kSending) {
      give_up_locked(m);
    } else {
      expire_unstarted_locked(m);
    }
  }
}

// The receiver's floor (its CTS and ACKs carry it): every message below it is complete there.
// On a bounded connection a message below it that still waits here was ended by the
// receiver's deadline with none or only part of our data, so it is done: without this, a send
// that waits for its CTS without expiring (MsgDelivery::kAskReceiver) would wait for a CTS that
// never comes. A message under way below it is done in every mode (see the loop).
void SendConn::on_receiver_floor_locked(uint32_t floor) {
  if (static_cast<int32_t>(floor - receiver_floor_) <= 0) return;  // old news (reordered)
  // A receiver may be any number of messages ahead of us: while we straggled it cut every
  // receive we were late for, and posted (and cut) the next ones. Only a floor beyond what any
  // run could reach is refused.
  if (static_cast<int32_t>(floor - oldest_) > kFloorAheadMax) {
    ++stats_.drop_bounds;
    return;
  }
  receiver_floor_ = floor;
  for (uint32_t s = oldest_; s != next_seq_ && static_cast<int32_t>(s - floor) < 0; ++s) {
    Msg& m = slot(s);
    if (m.state == State::kWaitCts && !m.exact && params_.delivery == Delivery::kBounded) {
      if (!expire_unstarted_locked(m)) return;
    } else if (m.state == State::kSending) {
      // Bounded, the receiver ended it (its deadline); otherwise it ended it whole, which the
      // FINAL said too unless it was lost: this, the next CTS, repairs a lost FINAL within a
      // round trip, where the sender would otherwise retransmit after its RTO for the
      // receiver's answer to a late DATA.
      on_receiver_done_locked(m);
    }
  }
}

void SendConn::on_cts_locked(const PacketHeader& h, uint64_t now) {
  on_receiver_floor_locked(h.msg_floor);
  const uint32_t s = h.msg_seq;
  const bool bounded = (h.flags & kFlagBounded) != 0;
  heard_cts_ = true;
  presumed_dead_ = false;
  receiver_absent_ = false;
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
    // Beyond the 64 outcomes we keep, a CTS means the receiver has no byte of that message
    // (it would not ask again otherwise) and we will send none: it ended here long ago. A
    // receiver that straggled far behind us catches up through these answers, one per receive
    // it posts late, instead of waiting its allowance for each.
    const uint32_t behind = oldest_ - s;
    if (behind <= 64 ? (expired_mask_ >> (s % 64) & 1) != 0
                     : params_.delivery == Delivery::kBounded && behind <= uint32_t(kFloorAheadMax))
      send_expired_notice_locked(s);
    else
      ++stats_.drop_stale;
    return;
  }
  if (s - oldest_ >= kCtsRing) {
    ++stats_.drop_bounds;
    return;
  }
  CtsRecord cts;
  cts.seq = s;
  cts.capacity = h.msg_size;
  cts.bounded = bounded;
  cts.exact = (h.flags & kFlagExact) != 0;
  cts.whole = (h.flags & kFlagWhole) != 0;
  cts.credit = h.credit;
  cts.steer = h.steer;
  cts.valid = true;
  const CtsRecord& had = cts_[s % kCtsRing];
  cts.arrived_ns = had.valid && had.seq == s ? had.arrived_ns : rx_arrival_ns_;
  if (s < next_seq_) {
    Msg& m = slot(s);
    if (m.state == State::kWaitCts)
      start_locked(m, cts, now);
    else if (m.state == State::kDone && m.expired)
      send_expired_notice_locked(s);
    else if (m.state == State::kSending && m.steer != 0 && cts.steer == 0)
      resteer_locked(m, now);
    // else: a repeated CTS for a message already under way. A steer only ever goes to 0: a
    // receive is aimed before its first CTS or never, so an older CTS naming the lost place
    // that arrives late changes nothing.
    return;
  }
  cts_[s % kCtsRing] = cts;
}

void SendConn::on_timers_locked(uint64_t now) {
  if (params_.delivery == Delivery::kBounded) expire_bounded_locked(now);
  if (probe_deadline_ != 0 && now >= probe_deadline_) {
    if (inflight_ > 0) send_probe_locked(now);
    else probe_deadline_ = 0;
  }
  if (rto_deadline_ != 0 && now >= rto_deadline_) on_rto_locked(now);
}

uint64_t SendConn::next_timer_locked() const {
  uint64_t next = 0;
  auto consider = [&next](uint64_t t) {
    if (t != 0 && (next == 0 || t < next)) next = t;
  };
  consider(rto_deadline_);
  consider(probe_deadline_);
  // With packets in flight, their ACKs may bring the retry's pass instead (pace_retry_locked).
  if (pace_retry_locked() == 0) consider(retry_ns_);
  if (params_.delivery != Delivery::kBounded) return next;
  // The bounded give-ups of expire_bounded_locked() that a budget sets (the 10 s fallback is
  // left to the periodic pass).
  const uint64_t give_up = give_up_ns_locked();
  for (uint32_t s = oldest_; s != next_seq_; ++s) {
    const Msg& m = msgs_[s % kMaxRequests];
    if (!may_expire_locked(m)) continue;
    if (m.state == State::kWaitCts && m.expire_early)
      consider(cts_deadline_ns_locked(m));
    else if (m.state == State::kSending && m.bounded)
      consider(m.started_ns + give_up);
  }
  return next;
}

Status SendConn::test_locked(Request* req, bool* done, size_t* size, uint64_t) {
  *done = false;
  Msg* mp = outstanding_locked(req);
  if (mp == nullptr) return Status(Errc::kInternal);
  Msg& m = *mp;
  // A message that finished before the connection failed is still reported as finished.
  if (m.state != State::kDone) return fatal_;
  if (!m.error.is_ok()) return m.error;
  // Done for the protocol is not done with the buffer while the device still reads it (a
  // zero-copy post not yet completed): a bounded send given up at its deadline, or a
  // retransmission posted just before the ACK that made it redundant. Handing the buffer back
  // then would let the caller rewrite bytes that are still leaving. The pass above reaped what
  // completed; the rest is a later test's, which never blocks.
  if (!fence(req->seq).idle()) return fatal_;
  *done = true;
  if (size) *size = m.size;
  set_state_locked(m, State::kFree);
  while (oldest_ != next_seq_ && slot(oldest_).state == State::kFree) ++oldest_;
  return Status::ok();
}

}  // namespace optireduce
