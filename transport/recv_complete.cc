// RecvConn: how a receive ends. ACKs (a SACK per message per received burst, the FINAL that
// releases the sender's buffer), the holes a bounded receive leaves filled with zeros or the
// erasure marker, the outcome and the step report for the group's DeadlinePolicy, and test(),
// which hands the buffer back once the datapath writes into it no more.
#include <algorithm>
#include <cstring>

#include "transport/deadline.h"
#include "transport/recv.h"

namespace optireduce {

namespace {
// The erasure marker: 0x7FF1 repeated is a NaN read as fp16, bf16, fp32 or fp64 at any even
// offset, so liboptireduce can find every lost element in its own buffers.
constexpr uint16_t kMarker16 = 0x7FF1;
}  // namespace

void RecvConn::after_rx_burst_locked(uint64_t now) {
  if (burst_bytes_ != 0) {
    downlink_->on_bytes(burst_bytes_, now);
    burst_bytes_ = 0;
  }
  // One SACK per message per received burst: enough feedback for loss detection without an
  // ACK per packet (and, in bounded mode, a fresh credit per burst).
  while (dirty_) {
    const int k = __builtin_ctz(dirty_);
    dirty_ &= dirty_ - 1;
    Msg& m = msgs_[k];
    if (m.state == State::kPosted && m.started) send_ack_locked(m, false);
  }
}

uint32_t RecvConn::hold_ns_locked() const {
  if (last_data_arrival_ns_ == 0) return 0;
  const uint64_t now = clock_.now_ns();
  const uint64_t hold = now > last_data_arrival_ns_ ? now - last_data_arrival_ns_ : 0;
  return static_cast<uint32_t>(std::min<uint64_t>(hold, UINT32_MAX));
}

uint32_t RecvConn::settled_floor_locked() const {
  uint32_t f = floor_;
  while (f != next_seq_ && slot(f).state != State::kPosted) ++f;
  return f;
}

void RecvConn::send_ack_locked(Msg& m, bool final_ack) {
  PacketHeader h;
  h.type = PacketType::kAck;
  h.hold_ns = hold_ns_locked();
  h.msg_seq = m.req.seq;
  h.msg_floor = final_ack ? settled_floor_locked() : floor_;
  if (m.dup_seen) h.flags |= kFlagDup;
  m.dup_seen = false;
  if (final_ack) {
    h.flags |= kFlagFinal;
    h.msg_size = m.npkts;
    h.offset = m.npkts;
    send_ctrl_locked(h);
    return;
  }
  uint8_t sack[kSackBytes];
  h.msg_size = m.npkts;
  h.offset = m.cum;
  h.credit = credit_locked(m, false);
  const uint32_t used = m.got.export_bits(m.cum, kSackBits, sack);
  send_ctrl_locked(h, sack, used);
  m.pkts_since_ack = 0;
}

void RecvConn::send_final_for_locked(uint32_t seq, bool bounded, bool dup) {
  PacketHeader h;
  h.type = PacketType::kAck;
  h.flags = kFlagFinal | (bounded ? kFlagBounded : 0) | (dup ? kFlagDup : 0);
  h.msg_seq = seq;
  // Past this message where it was the oldest: a sender still to post it (a straggler that
  // reads only this FINAL) then knows it ended and sends none of it (SendConn::isend).
  h.msg_floor = settled_floor_locked();
  h.hold_ns = hold_ns_locked();
  send_ctrl_locked(h);
}

bool RecvConn::needless_retx_locked(uint32_t seq, uint64_t offset) {
  // The fault injector's 1% duplication copied about one retransmission in a hundred, and each
  // copy, reported, counted its message as reordered (570-600 of the lossy demonstration's 804)
  // and, for a probe, stretched the probe's delay for nothing. What came as a retransmission
  // and arrives again is such a copy.
  const Msg& m = slot(seq);
  const uint64_t idx = offset / params_.pkt_payload;
  if (m.req.seq != seq || !m.started || idx >= m.by_retx.size()) return true;
  return !m.by_retx.test(static_cast<uint32_t>(idx));
}

void RecvConn::fill_holes_locked(Msg& m) {
  const uint64_t size = m.started ? m.size : m.capacity;
  auto fill = [&](uint64_t off, uint64_t len) {
    if (params_.fill == Fill::kZero) {
      std::memset(m.buf + off, 0, len);
      return;
    }
    // Offsets are multiples of 8 (packet grid), so the pattern starts on an even byte.
    uint8_t* p = m.buf + off;
    for (uint64_t i = 0; i + 1 < len; i += 2) std::memcpy(p + i, &kMarker16, 2);
    if (len & 1) p[len - 1] = static_cast<uint8_t>(kMarker16 & 0xFF);
  };
  if (!m.started) {
    if (size) fill(0, size);
    return;
  }
  for (uint32_t i = m.got.first_clear(0); i < m.npkts; i = m.got.first_clear(i + 1)) {
    const uint64_t off = uint64_t{i} * params_.pkt_payload;
    fill(off, std::min<uint64_t>(params_.pkt_payload, size - off));
  }
}

void RecvConn::complete_locked(Msg& m, End how, uint64_t now) {
  if (m.state != State::kPosted) return;
  // The datapath starts taking back what it posted into the buffer; test() hands the buffer
  // back once that is done (unaim_locked). Only exact receives are aimed, and they have no
  // holes to fill below.
  unaim_locked(m, false);
  const uint64_t size = m.started ? m.size : m.capacity;
  if (how != End::kAll) fill_holes_locked(m);
  if (how == End::kDeadline && m.bounded && !m.started) sender_cut_ns_ = now;
  last_complete_ns_ = now;
  if (!m.started) m.size = size;
  last_filled_ = m.started && m.size == m.capacity;
  if (!set_msg_state_locked(m, State::kComplete, now)) return;
  ++stats_.msgs;
  stats_.bytes += m.bytes_got;
  RecvOutcome& o = m.req.outcome;
  o.bounded = m.bounded || how != End::kAll;
  o.end = static_cast<uint8_t>(how);
  o.expected = size;
  o.lost = size - std::min(size, m.bytes_got);
  if (o.bounded) {
    stats_.bytes_expected += o.expected;
    stats_.bytes_lost += o.lost;
    if (how == End::kDeadline) ++stats_.deadline_hits;
    if (how == End::kEarly) ++stats_.early_timeouts;
  }
  // FINAL releases the sender's buffer: a plain one when everything arrived, a bounded one when
  // the deadline came first (nothing more is wanted; the sender stops repairing). A sender that
  // expired the message already knows.
  if (how == End::kAll)
    send_ack_locked(m, true);
  else if (m.bounded && how != End::kExpired)
    send_final_for_locked(m.req.seq, true);
  if (policy_ != nullptr) {
    const uint64_t start = m.head_ns ? m.head_ns : m.posted_ns;
    StepReport st;
    st.bytes = size;
    st.received = m.bytes_got;
    st.elapsed_ns = now - start;
    if (m.first_data_ns != 0) st.network_ns = now - std::max(start, m.first_data_ns);
    st.how = static_cast<RecvEnd>(how);
    st.bounded = m.bounded;
    st.pipelined = m.pipelined;
    st.burst_head = m.burst_head;
    policy_->on_complete(st);
    // The skew samples a cut sender left (BoundedGroup::on_complete): a burst's first receive
    // alone, so that NCCL's chunks cut after it do not push it out of the records.
    if (how == End::kDeadline && !m.started && m.burst_head && !m.pipelined)
      cut_[ncut_++ % kCutRecords] = CutUnstarted{m.req.seq, start, st.elapsed_ns, true};
    const DeadlineQuote q = policy_->quote(size);
    auto gauge_us = [](uint64_t ns) {
      return static_cast<uint32_t>(std::min<uint64_t>(ns / 1000, UINT32_MAX));
    };
    stats_.tb_us = gauge_us(q.tb_ns);
    stats_.tc_us = gauge_us(q.tc_ns);
    stats_.budget_us = gauge_us(q.budget_ns);
    stats_.allowance_us = gauge_us(q.allowance_ns);
  }
  dirty_ &= ~(1u << (m.req.seq % kMaxRequests));
}

uint64_t RecvConn::arrived_prefix(Request* req) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint32_t s = req->seq;
  if (&slot(s).req != req || s - oldest_ >= next_seq_ - oldest_) return 0;
  const Msg& m = slot(s);
  if (m.state == State::kFree || !m.started || m.steer != 0) return 0;
  return std::min<uint64_t>(uint64_t{m.cum} * params_.pkt_payload, m.size);
}

Status RecvConn::test_locked(Request* req, bool* done, size_t* size, uint64_t now) {
  *done = false;
  const uint32_t s = req->seq;
  if (&slot(s).req != req || s - oldest_ >= next_seq_ - oldest_) return Status(Errc::kInternal);
  Msg& m = slot(s);
  // A receive that completed before the connection failed is still reported as complete.
  if (m.state != State::kComplete) return fatal_;
  // Its buffer is the caller's again only once the datapath writes into it no more: asked
  // again at the next test, also after a failure (a receive complete before it is reported
  // complete).
  if (!unaim_locked(m, false)) return Status::ok();
  if (!set_msg_state_locked(m, State::kFree, now)) return fatal_;
  *done = true;
  if (size) *size = m.size;
  while (oldest_ != next_seq_ && slot(oldest_).state == State::kFree) ++oldest_;
  return Status::ok();
}

}  // namespace optireduce
