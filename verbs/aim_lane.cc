// The receive lane's set-up, posting, completion checks and reset (see aim_lane.h).
#include "verbs/aim_lane.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "transport/log.h"
#include "transport/wire.h"
#include "verbs/ring.h"

namespace optireduce::verbs {

Status AimLane::open(PortContext* port, ibv_cq* send_cq, uint32_t depth, uint32_t max_datagram,
                     uint64_t* stop_clock, LaneFlusher* flusher, std::unique_ptr<AimLane>* out) {
  if (!is_pow2(depth) || depth < 4 * kHandout) return Status(Errc::kInternal, EINVAL);
  std::unique_ptr<AimLane> lane(new AimLane(port, depth, max_datagram, stop_clock, flusher));
  Status st = lane->create(send_cq);
  if (st.is_ok()) *out = std::move(lane);
  return st;
}

AimLane::~AimLane() {
  if (qp_) ibv_->destroy_qp(qp_);
  if (cq_) ibv_->destroy_cq(cq_);
  if (hdr_mr_) ibv_->dereg_mr(hdr_mr_);
  if (plain_mr_) ibv_->dereg_mr(plain_mr_);
  std::free(hdr_mem_);
  std::free(plain_mem_);
  std::free(stage_mem_);
}

Status AimLane::create(ibv_cq* send_cq) {
  plain_stride_ = round_up(kGrhBytes + max_datagram_, kCacheLineBytes);
  hdr_mem_ = alloc_ring_pages(size_t{depth_} * kHdrStride);
  plain_mem_ = alloc_ring_pages(size_t{kPlainSlots} * plain_stride_);
  stage_mem_ = alloc_ring_pages(size_t{kStageSlots} * max_datagram_);
  if (!hdr_mem_ || !plain_mem_ || !stage_mem_) return Status(Errc::kSystem, ENOMEM);
  hdr_mr_ =
      ibv_->reg_mr(port_->pd(), hdr_mem_, size_t{depth_} * kHdrStride, IBV_ACCESS_LOCAL_WRITE);
  if (hdr_mr_ == nullptr) return Status(Errc::kSystem, errno);
  plain_mr_ = ibv_->reg_mr(port_->pd(), plain_mem_, size_t{kPlainSlots} * plain_stride_,
                           IBV_ACCESS_LOCAL_WRITE);
  if (plain_mr_ == nullptr) return Status(Errc::kSystem, errno);
  cq_ = ibv_->create_cq(port_->context(), static_cast<int>(depth_), nullptr, nullptr, 0);
  if (cq_ == nullptr) return Status(Errc::kSystem, errno);
  send_cq_ = send_cq;
  entries_.reset(new Entry[depth_]());
  wr_.reset(new ibv_recv_wr[depth_]());
  sge_.reset(new ibv_sge[2 * size_t{depth_}]());
  for (uint32_t i = 0; i < depth_; ++i) wr_[i].sg_list = &sge_[2 * size_t{i}];
  return make_qp();
}

Status AimLane::make_qp() {
  ibv_qp_init_attr ia{};
  ia.send_cq = send_cq_;
  ia.recv_cq = cq_;
  ia.qp_type = IBV_QPT_UD;
  ia.cap.max_send_wr = 1;
  ia.cap.max_recv_wr = depth_;
  ia.cap.max_send_sge = 1;
  ia.cap.max_recv_sge = 2;
  qp_ = ibv_->create_qp(port_->pd(), &ia);
  if (qp_ == nullptr) return Status(Errc::kSystem, errno);
  return bring_up();
}

void AimLane::recreate(LaneCounters& c) {
  // Destroyed, the QP holds no request and the device writes into no place of ours once the
  // call returns; its completions still queued are discarded here, trailing ones by their
  // stale sequence. A QP reset would do the same on paper, but rxe (Linux 6.1) keeps the reset
  // QP's posted receive slots in its queue, zeroed, and the next datagrams fall into them.
  if (qp_ != nullptr) ibv_->destroy_qp(qp_);
  qp_ = nullptr;
  ibv_wc wc[16];
  while (ibv_poll_cq(cq_, 16, wc) > 0) ++c.stale;
  done_ = posted_;
  pdone_ = pposted_;
  aimed_out_ = 0;
  ++c.recreated;
  if (active()) moved_ = true;  // its sender's DATA go to the old QPN
  if (Status st = make_qp(); !st.is_ok()) {
    if (qp_ != nullptr) ibv_->destroy_qp(qp_);
    qp_ = nullptr;
    OR_WARN("verbs: %s: a receive lane could not be recreated (%s, errno %d): not lent again",
            port_->name.c_str(), errc_name(st.code()), st.sys_errno());
  }
}

Status AimLane::bring_up() {
  return ud_qp_to_rts(*ibv_, qp_, port_->port);
}

bool AimLane::move_to(LaneState to) {
  using S = LaneState;
  const S from = state_;
  const bool ok =
      (from == S::kIdle && to == S::kLent) ||
      (from == S::kLent && (to == S::kDraining || to == S::kIdle || to == S::kRecovering)) ||
      (from == S::kRecovering && (to == S::kLent || to == S::kDraining)) ||
      (from == S::kDraining && to == S::kIdle);
  if (!ok) {
    OR_WARN("verbs: %s: receive lane qpn %u: no move from state %d to %d", port_->name.c_str(),
            qp_ ? qp_->qp_num : 0u, static_cast<int>(from), static_cast<int>(to));
    return false;
  }
  state_ = to;
  return true;
}

void AimLane::start(const AimTarget& t, uint32_t lkey) {
  if (!move_to(LaneState::kLent)) return;
  t_ = t;
  lkey_ = lkey;
  lent_qpn_ = qpn();
  nfull_ = t.pkt_payload != 0 ? t.capacity / t.pkt_payload : 0;
  // The plain slots an idle lane keeps posted for stragglers (stop()) come first: the receive's
  // first packets land there, copied, and the aimed requests begin after them.
  const uint64_t leftover = posted_ - done_;
  next_aim_ = aim_from_ = leftover < nfull_ ? leftover : nfull_;
  first_seq_ = done_;
  tail_pending_ = t.pkt_payload != 0 && t.capacity % t.pkt_payload != 0;
  missed_ = false;
  top_up();
}

bool AimLane::stop(bool wait) {
  switch (state_) {
    case LaneState::kIdle:
      return true;
    case LaneState::kDraining:
      return finish_drain(wait);
    case LaneState::kLent:
    case LaneState::kRecovering:
      break;
  }
  // Whatever still waits belongs to the receive that ended: nothing wants it.
  for (int i = 0; i < held_n_; ++i) {
    stage_used_[held_[i].stage] = false;
    ++counters_.dropped;
  }
  held_n_ = 0;
  if (resetting_) {  // a recovery's reset is under way: it becomes this flush
    resetting_ = false;
    move_to(LaneState::kDraining);
    return finish_drain(wait);
  }
  if (state_ == LaneState::kLent && aimed_out_ == 0) {
    finish_stop();
    return true;
  }
  // Requests are still posted into the buffer: the flush takes them back, on the worker's
  // thread (a Recovering lane's QP is in the error state already; the flush's move there is a
  // no-op). Until the lane says it is flushed, nothing here touches its QP or CQ.
  move_to(LaneState::kDraining);
  hand_to_flusher(posted_ - done_);
  return finish_drain(wait);
}

void AimLane::hand_to_flusher(uint64_t left) {
  drain_left_ = left;
  flush_counts_ = LaneCounters{};
  flush_done_.store(false, std::memory_order_relaxed);
  if (flusher_ == nullptr || !flusher_->submit(this)) {
    ++counters_.flushed_inline;
    flush_now();
  }
}

void AimLane::take_flush_counts(uint64_t LaneCounters::*in_place) {
  counters_.stale += flush_counts_.stale;
  counters_.recreated += flush_counts_.recreated;
  counters_.*in_place += flush_counts_.flushed;
}

bool AimLane::finish_drain(bool wait) {
  if (!flush_done_.load(std::memory_order_acquire)) {
    if (!wait) return false;
    // A connection that closes: the flush's own wait is bounded (kFlushWait).
    while (!flush_done_.load(std::memory_order_acquire)) std::this_thread::yield();
  }
  take_flush_counts(&LaneCounters::flushed);
  finish_stop();
  return true;
}

void AimLane::flush_now() {
  // The error state completes every posted request (flushed, or with a datagram the device was
  // already writing); once all of them are back no write is in flight and the queue is empty.
  // Waiting for them is bounded: past it the QP is recreated, which also ends every write into
  // the buffer, at the cost of a new QPN.
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_ERR;
  bool broken = qp_ == nullptr || ibv_->modify_qp(qp_, &a, IBV_QP_STATE) != 0;
  const auto give_up = std::chrono::steady_clock::now() + kFlushWait;
  ibv_wc wc[16];
  for (int empty = 0; !broken && drain_left_ > 0;) {
    const int n = ibv_poll_cq(cq_, 16, wc);
    if (n < 0) {
      broken = true;
    } else if (n > 0) {
      drain_left_ -= std::min<uint64_t>(drain_left_, static_cast<uint64_t>(n));
      empty = 0;
    } else if (++empty % 64 == 0) {
      if (std::chrono::steady_clock::now() > give_up) broken = true;
      std::this_thread::yield();
    }
  }
  if (broken) {
    recreate(flush_counts_);
  } else {
    done_ = posted_;
    pdone_ = pposted_;
    aimed_out_ = 0;
    a.qp_state = IBV_QPS_RESET;
    if (ibv_->modify_qp(qp_, &a, IBV_QP_STATE) != 0 || !bring_up().is_ok())
      recreate(flush_counts_);
    else
      ++flush_counts_.flushed;
  }
  flush_done_.store(true, std::memory_order_release);
}

void AimLane::finish_stop() {
  t_ = AimTarget{};
  stopped_tick_ = ++*stop_clock_;
  move_to(LaneState::kIdle);
  // Idle, the lane still catches what its last receive's sender sends late (a retransmission
  // that crossed the final ACK) and hands it up: the connection answers a late DATA with the
  // FINAL the sender missed.
  top_up();
}

void AimLane::top_up() {
  // Draining or Recovering, the QP is in the error state (or the flusher's): what is posted now
  // would only come back flushed.
  if (qp_ == nullptr || state_ == LaneState::kDraining || state_ == LaneState::kRecovering) return;
  const uint64_t room = depth_ - kHandout;
  ibv_recv_wr* first = nullptr;
  ibv_recv_wr* prev = nullptr;
  const uint64_t from = posted_;
  uint64_t seq = posted_;
  while (seq - done_ < room) {
    const uint32_t slot = static_cast<uint32_t>(seq & (depth_ - 1));
    ibv_recv_wr* wr = &wr_[slot];
    ibv_sge* sge = wr->sg_list;
    Entry& e = entries_[slot];
    if (active() && next_aim_ < nfull_) {
      e = Entry{true, next_aim_};
      ++aimed_out_;
      sge[0] = ibv_sge{reinterpret_cast<uintptr_t>(hdr_slot(seq)), kHdrSge, hdr_mr_->lkey};
      sge[1] = ibv_sge{reinterpret_cast<uintptr_t>(t_.base + next_aim_ * t_.pkt_payload),
                       t_.pkt_payload, lkey_};
      wr->num_sge = 2;
      ++next_aim_;
    } else if (active() ? (tail_pending_ || missed_) && pposted_ - pdone_ < kPlainSlots - kHandout
                        : pposted_ - pdone_ < kIdlePlain) {
      tail_pending_ = false;
      e = Entry{false, pposted_};
      sge[0] = ibv_sge{reinterpret_cast<uintptr_t>(plain_slot(pposted_)), kGrhBytes + max_datagram_,
                       plain_mr_->lkey};
      wr->num_sge = 1;
      ++pposted_;
    } else {
      break;
    }
    wr->wr_id = seq;
    wr->next = nullptr;
    if (prev)
      prev->next = wr;
    else
      first = wr;
    prev = wr;
    ++seq;
  }
  if (first == nullptr) return;
  ibv_recv_wr* bad = nullptr;
  if (ibv_post_recv(qp_, first, &bad) == 0) {
    posted_ = seq;
    return;
  }
  // A refused chain is posted up to `bad`; what follows is taken back, to be posted later.
  uint64_t ok = from;
  for (ibv_recv_wr* w = first; w != nullptr && w != bad; w = w->next) ++ok;
  for (uint64_t s = ok; s < seq; ++s) {
    const Entry& e = entries_[s & (depth_ - 1)];
    if (e.aimed) {
      if (e.index < next_aim_) next_aim_ = e.index;
      --aimed_out_;
    } else {
      --pposted_;
      if (!missed_) tail_pending_ = true;
    }
  }
  posted_ = ok;
}

std::string AimLane::text() const {
  static constexpr const char* kStates[] = {"idle", "lent", "recovering", "draining"};
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "lane qpn %u %s%s: requests %llu posted, %llu done (%llu aimed out, plain "
                "%llu/%llu), packets aimed %llu of %llu, %s, %d held, %llu placed, %llu missed",
                qpn(), kStates[static_cast<int>(state_)], resetting_ ? " (resetting)" : "",
                static_cast<unsigned long long>(posted_), static_cast<unsigned long long>(done_),
                static_cast<unsigned long long>(aimed_out_),
                static_cast<unsigned long long>(pdone_), static_cast<unsigned long long>(pposted_),
                static_cast<unsigned long long>(next_aim_), static_cast<unsigned long long>(nfull_),
                missed_ ? "missed" : "no miss", held_n_,
                static_cast<unsigned long long>(counters_.placed),
                static_cast<unsigned long long>(counters_.missed));
  return buf;
}

int AimLane::alloc_stage() {
  for (int i = 0; i < static_cast<int>(kStageSlots); ++i) {
    if (!stage_used_[i]) {
      stage_used_[i] = true;
      return i;
    }
  }
  return -1;
}

int AimLane::poll(RxPacket* out, int max, SourceCheck& src) {
  for (int i = 0; i < handed_n_; ++i) stage_used_[handed_[i]] = false;
  handed_n_ = 0;
  // Draining, the QP and the CQ are the flush's (flush_now), and what comes back belongs to
  // the receive that ended.
  if (state_ == LaneState::kDraining) return 0;
  if (resetting_) {
    if (!flush_done_.load(std::memory_order_acquire)) return 0;  // the QP is the flusher's
    end_recovery();
  }
  if (error_seen_ && qp_ != nullptr) {
    error_seen_ = false;
    ibv_qp_attr a{};
    ibv_qp_init_attr ia{};
    if (state_ != LaneState::kRecovering &&
        (ibv_->query_qp(qp_, &a, IBV_QP_STATE, &ia) != 0 || a.qp_state != IBV_QPS_RTS)) {
      // In mid-receive the QPN must stay: the receive's sender keeps sending to it. An idle
      // lane's has nobody waiting on it.
      if (state_ == LaneState::kLent)
        begin_recovery();
      else
        recreate(counters_);
    }
  }
  top_up();
  int n = emit_due(out, max);
  ibv_wc wc[kHandout];
  const uint64_t done_before = done_;
  while (n < max) {
    // Each completion may free one waiting datagram besides its own: room for both.
    const int room = (max - n) / 2;
    if (room <= 0) break;
    const int want = room < static_cast<int>(kHandout) ? room : static_cast<int>(kHandout);
    const int got = ibv_poll_cq(cq_, want, wc);
    if (got < 0) return -EIO;
    for (int i = 0; i < got; ++i) n += take(wc[i], out + n, src);
    if (got < want) break;
  }
  if (state_ == LaneState::kRecovering) {
    recover_idle_ = done_ != done_before ? 0 : recover_idle_ + 1;
    if (done_ == posted_) {
      start_reset();
      if (flush_done_.load(std::memory_order_acquire)) end_recovery();
    } else if (recover_idle_ >= kMaxEmptyPolls) {
      // A device that does not give the requests back: a new QP (and QPN) ends every write.
      recreate(counters_);
      move_to(LaneState::kLent);
      top_up();
    }
  }
  return n;
}

void AimLane::begin_recovery() {
  recover_idle_ = 0;
  // The requests still posted come back flushed, in order, through take(): a completion
  // already written before the error is handed out as any other, and a datagram that waits
  // for its place is freed when that place's request comes back. No request is aimed again in
  // this receive: its places are not known to be unfilled, so what comes next is copied.
  move_to(LaneState::kRecovering);
  nfull_ = next_aim_;
  missed_ = true;
  // The QP is in the error state already, but rxe (Linux 6.1) gives the posted requests back
  // only when told so: after a responder error they stay queued and never complete.
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_ERR;
  if (ibv_->modify_qp(qp_, &a, IBV_QP_STATE) != 0) {
    recreate(counters_);
    move_to(LaneState::kLent);
  }
}

void AimLane::start_reset() {
  // Every request is back: the flush has nothing to wait for, only the reset and the way back
  // to RTS (firmware commands on a NIC), which run on the flusher's thread.
  resetting_ = true;
  hand_to_flusher(0);
}

void AimLane::end_recovery() {
  resetting_ = false;
  // A reset keeps the QPN; a recreated QP (the fallback) strands the receive's sender until
  // the receive moves it (take_moved).
  take_flush_counts(&LaneCounters::recovered);
  move_to(LaneState::kLent);
  top_up();
}

bool AimLane::owns(uint64_t token, uint32_t msg_seq, uint64_t offset) const {
  if (!active() || resetting_ || token != t_.token || msg_seq != t_.msg_seq || t_.pkt_payload == 0)
    return false;
  if (offset % t_.pkt_payload != 0) return false;
  // Also a place whose request is yet to be posted: a copy there now would be overwritten.
  const uint64_t q = offset / t_.pkt_payload;
  return aimed_posted(q) || (q >= next_aim_ && q < nfull_);
}

int AimLane::take(const ibv_wc& wc, RxPacket* out, SourceCheck& src) {
  if (wc.wr_id != done_) {  // a request a reset discarded
    ++counters_.stale;
    return 0;
  }
  const uint64_t seq = done_++;
  const Entry e = entries_[seq & (depth_ - 1)];
  if (e.aimed)
    --aimed_out_;
  else
    ++pdone_;
  // Whatever this completion brought, the place of packet e.index has no request posted any
  // more: a datagram that waited for it may go now, after this one.
  const int n = take_one(wc, e, seq, out, src);
  for (int i = 0; i < held_n_; ++i)
    if (held_[i].wait_seq == seq) held_[i].due = true;
  return n + emit_due(out + n, 1);
}

int AimLane::take_one(const ibv_wc& wc, const Entry& e, uint64_t seq, RxPacket* out,
                      SourceCheck& src) {
  if (wc.status != IBV_WC_SUCCESS) {
    if (wc.status != IBV_WC_WR_FLUSH_ERR) {
      ++counters_.errors;
      // Whatever the device wrote of it is in a place whose packet now comes another way, as
      // after a miss.
      note_miss();
    }
    error_seen_ = true;
    return 0;
  }
  if (wc.byte_len < kGrhBytes) {
    ++counters_.dropped;
    note_miss();
    return 0;
  }
  const uint32_t dlen = wc.byte_len - kGrhBytes;  // the datagram, header included
  RxPacket p;
  if (!e.aimed) {
    const uint8_t* slot = plain_slot(e.index);
    if (!src.fill_source(wc, slot, &p)) {
      ++counters_.dropped;
      note_miss();
      return 0;
    }
    p.data = slot + kGrhBytes;
    p.len = dlen;
    if (!expected_in(seq, p.data, dlen)) {
      ++counters_.missed;
      note_miss();
    }
    return hand_out(p, -1, out);
  }
  uint8_t* hdr = hdr_slot(seq);
  if (!src.fill_source(wc, hdr, &p)) {
    ++counters_.dropped;
    note_miss();
    return 0;
  }
  const uint8_t* head = hdr + kGrhBytes;
  if (dlen <= kHeaderBytes) {  // all of it in the header slot (a bare header, a runt)
    note_miss();
    p.data = head;
    p.len = dlen;
    out[0] = p;
    return 1;
  }
  const uint32_t pb = dlen - kHeaderBytes;  // payload bytes the device put in the place
  uint8_t* place = t_.base + e.index * t_.pkt_payload;
  PacketHeader h;
  const bool ours = decode(head, dlen, &h) == DecodeError::kNone && h.type == PacketType::kData &&
                    h.token == t_.token && h.msg_seq == t_.msg_seq;
  const uint64_t size = h.msg_size;
  const uint64_t at = e.index * t_.pkt_payload;
  const bool hit = ours && h.offset == at && size <= t_.capacity && at < size &&
                   pb == (size - at < t_.pkt_payload ? size - at : t_.pkt_payload);
  if (hit) {
    p.data = head;
    p.len = dlen;
    p.rest = place;
    p.placed = pb;
    p.aimed = true;
    ++counters_.placed;
    out[0] = p;
    return 1;
  }
  // A miss: the datagram is made whole in a stage buffer before its place is used again.
  ++counters_.missed;
  note_miss();
  const int st = alloc_stage();
  if (st < 0) {
    ++counters_.dropped;
    return 0;
  }
  std::memcpy(stage(st), head, kHeaderBytes);
  std::memcpy(stage(st) + kHeaderBytes, place, pb);
  p.data = stage(st);
  p.len = dlen;
  return hand_out(p, st, out);
}

void AimLane::note_miss() {
  if (!active()) return;
  missed_ = true;
  // No request is aimed from here on: what comes next lands one or more requests off anyway,
  // and a packet that overtook the requests posted so far is copied into its place at once
  // (hand_out), which a request aimed there later could overwrite with another datagram.
  // And plain requests stay posted from now on (top_up): the request this datagram took was
  // some packet's only one (aim_lane.h), and without more an exact receive would wait for
  // ever on a peer that answers every PING.
  nfull_ = next_aim_;
}

bool AimLane::expected_in(uint64_t seq, const uint8_t* dgram, uint32_t len) const {
  // Until a miss, request first_seq_ + q takes packet q, plain (the idle lane's leftovers
  // below aim_from_, the partial last packet's) or aimed.
  if (!active() || missed_ || t_.pkt_payload == 0) return true;
  PacketHeader h;
  return decode(dgram, len, &h) == DecodeError::kNone && h.type == PacketType::kData &&
         h.token == t_.token && h.msg_seq == t_.msg_seq &&
         h.offset == (seq - first_seq_) * t_.pkt_payload;
}

int AimLane::hand_out(RxPacket p, int st, RxPacket* out) {
  // A packet of the receive whose own place still has its aimed request posted came early
  // (a loss ahead of it shifts every later packet one request early, into the request before
  // its own, or into a plain slot posted ahead of the aimed ones): the connection's copy into
  // its place would be overwritten by whatever that request takes. It waits in a stage buffer
  // until that request completes, which the lane's next datagram brings (the lost packet's
  // repair at the latest). Every other datagram goes at once: its place, if any, is free.
  PacketHeader h;
  const bool early = active() && decode(p.data, p.len, &h) == DecodeError::kNone &&
                     h.type == PacketType::kData && h.token == t_.token &&
                     h.msg_seq == t_.msg_seq && t_.pkt_payload != 0 &&
                     h.offset % t_.pkt_payload == 0 && aimed_posted(h.offset / t_.pkt_payload);
  if (!early) {
    out[0] = p;
    if (st >= 0) handed_[handed_n_++] = st;
    return 1;
  }
  if (st < 0) {  // from a plain slot, which is posted again before the wait ends
    st = alloc_stage();
    if (st < 0) {
      ++counters_.dropped;
      return 0;
    }
    std::memcpy(stage(st), p.data, p.len);
    p.data = stage(st);
  }
  ++counters_.waited;
  Held& w = held_[held_n_++];
  w.stage = st;
  w.wait_seq = first_seq_ + h.offset / t_.pkt_payload;
  w.due = false;
  w.pkt = p;
  return 0;
}

int AimLane::emit_due(RxPacket* out, int max) {
  int n = 0;
  for (int i = 0; i < held_n_ && n < max;) {
    if (!held_[i].due) {
      ++i;
      continue;
    }
    out[n++] = held_[i].pkt;
    handed_[handed_n_++] = held_[i].stage;
    held_[i] = held_[--held_n_];
  }
  return n;
}

}  // namespace optireduce::verbs
