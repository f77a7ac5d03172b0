// SendConn: packetising and transmit. Retransmissions go first (they unblock the receiver's
// oldest message), paced by the path; new packets go in message order within the receiver's
// buffer (flow window), its credit (bounded), the path's congestion window and its pacer.
#include <algorithm>

#include "transport/deadline.h"
#include "transport/send.h"

namespace optireduce {

// A packet goes out from the caller's buffer itself where the datapath can (verbs: a work
// request whose payload SGE points into the registered buffer), so it carries the message's
// registration and the fence that keeps test() from handing the buffer back too early.
// Retransmissions post from the same buffer again, under the same fence.
//
// A packet goes where the receiver's CTS said (its receive lane, which places it without a copy),
// except a packet's first retransmission, which goes the common way. A lane's requests take
// datagrams in the order they come, one each, so a duplicate there shifts every later packet of the
// message into the request before its own, and the rest of the message is copied (aim_lane.h). A
// first retransmission is mostly a guess on a host that pauses (in the Soft-RoCE guest nearly all
// were spurious; docs/architecture.md, "Registered memory", has the figures). The common way a
// spurious copy is dropped as a duplicate. A copy of a packet truly lost where the lane has not yet
// taken another datagram in its place (a lost tail) finds the place still owned by the lane and is
// dropped there (verbs/endpoint.cc); the packet's next retransmission (the timer's, after the
// probe's) goes to the lane and repairs it. Lost in mid-message, the lane's request was taken by
// the next packet, and the common-way copy is taken as any.
void SendConn::name_payload(TxPacket* p, const Msg& m, uint32_t seq, bool common_way) {
  if (p == nullptr) return;
  p->steer = common_way ? 0 : m.steer;
  if (m.mr == nullptr) return;
  p->payload_mr = m.mr;
  p->payload_fence = &fence(seq);
}

void SendConn::transmit_locked(uint64_t now) {
  // Exactly one of these records what a batch entry is, so that a short send (the datapath's
  // queue full) can be rolled back precisely.
  struct Pending {
    uint32_t seq, pkt;
    bool retx;
    size_t retx_index;  // position in retx_ (retransmissions only)
  } pend[kBatch];
  // Work that the path held back (its pacer, or its window full of other connections' bytes)
  // must come back by itself: nothing of ours may be in flight to bring an ACK, and a shared
  // endpoint's connection is visited only for a timer (next_timer_locked) or its owner's call.
  retry_ns_ = 0;
  uint32_t held = 0;  // bytes of the packet the path held back (0: none)
  for (;;) {
    uint64_t tokens = path_->tokens(now);
    int n = 0;
    while (retx_head_ < retx_.size() && n < kBatch) {
      const Retx r = retx_[retx_head_];
      Msg& m = slot(r.seq);
      if (m.req.seq != r.seq || m.state != State::kSending || m.acked.test(r.pkt)) {
        ++retx_head_;  // finished meanwhile
        continue;
      }
      const uint32_t len = pkt_len(m, r.pkt);
      if (len > tokens) {
        held = len;
        break;
      }
      PacketHeader h;
      h.type = PacketType::kData;
      h.flags = kFlagRetx | (m.bounded ? kFlagBounded : 0);
      h.msg_seq = r.seq;
      h.msg_size = m.size;
      h.offset = uint64_t{r.pkt} * params_.pkt_payload;
      h.msg_floor = oldest_;
      name_payload(batch_slot_locked(h, m.data + h.offset, len), m, r.seq,
                   /*common_way=*/!m.resent.test(r.pkt));
      pend[n++] = {r.seq, r.pkt, true, retx_head_};
      tokens -= len;
      ++retx_head_;
    }
    // New packets: the path's room (window and pacer, shared with every connection to the same
    // host) and this receiver's buffer; at least one packet when nothing of ours is in flight
    // and the path has room for it.
    uint64_t room = std::min(tokens, path_->room(now));
    uint64_t flow = flow_window_ > inflight_ ? flow_window_ - inflight_ : 0;
    for (int k = 0; k < n; ++k) flow -= std::min<uint64_t>(flow, pkt_len(slot(pend[k].seq), pend[k].pkt));
    for (uint32_t s = oldest_; s != next_seq_ && n < kBatch; ++s) {
      Msg& m = slot(s);
      if (m.state != State::kSending) continue;
      if (m.bounded && group_ != nullptr) timeout_hint_us_ = group_->estimate_us(m.size);
      while (m.next_new < m.npkts && n < kBatch) {
        const uint32_t i = m.next_new;
        const uint32_t len = pkt_len(m, i);
        if (len > flow) break;  // our own packets in flight: their ACKs come back to us
        if (len > room) {
          held = len;
          break;
        }
        if (i >= m.cum + kSackBits) break;  // beyond what one SACK can describe
        if (i >= m.grant) break;            // beyond the receiver's credit
        if (i >= m.ready) break;            // its bytes are still being written (release)
        PacketHeader h;
        h.type = PacketType::kData;
        h.flags = m.bounded ? kFlagBounded : 0;
        // The last ~1% of a message carries the tail flag (early-timeout hint).
        if (uint64_t{i} * 100 >= uint64_t{m.npkts} * 99 || i + 1 == m.npkts) h.flags |= kFlagTail;
        h.msg_seq = s;
        h.msg_size = m.size;
        h.offset = uint64_t{i} * params_.pkt_payload;
        h.msg_floor = oldest_;
        name_payload(batch_slot_locked(h, m.data + h.offset, len), m, s);
        pend[n++] = {s, i, false, 0};
        room -= len;
        flow -= len;
        ++m.next_new;
      }
      if (m.next_new < m.npkts) break;  // keep message order on the wire
    }
    if (n == 0) {
      if (held != 0) retry_ns_ = path_->retry_ns(now, held, retry_fallback_ns());
      return;
    }
    const int sent = flush_locked();
    // Roll back what the datapath did not take (in reverse, so next_new rewinds correctly).
    for (int k = n - 1; k >= sent; --k) {
      Msg& m = slot(pend[k].seq);
      if (pend[k].retx) {
        retx_head_ = pend[k].retx_index;  // still queued (sent_ns stays kQueued)
      } else {
        m.next_new = pend[k].pkt;
      }
    }
    uint64_t sent_bytes = 0;
    for (int k = 0; k < sent; ++k) {
      Msg& m = slot(pend[k].seq);
      const uint32_t len = flight_len(m, pend[k].pkt);
      ++stats_.data_pkts;
      if (pend[k].retx) {
        ++stats_.retx_pkts;
        if (m.bounded) ++stats_.repaired_pkts;
        m.resent.set(pend[k].pkt);
      } else {
        m.first_ns[pend[k].pkt] = now;
      }
      sent_bytes += len;
      inflight_ += len;
      m.sent_ns[pend[k].pkt] = now;
      if (rto_deadline_ == 0) rto_deadline_ = now + rtt_.rto_ns();
      if (probe_deadline_ == 0) arm_probe_locked(now);
    }
    path_->on_sent(sent_bytes);
    if (retx_head_ == retx_.size()) {
      retx_.clear();
      retx_head_ = 0;
    }
    if (sent < n) {  // the datapath is full; try again on the next call, or after a while
      retry_ns_ = now + retry_fallback_ns();
      return;
    }
    held = 0;  // the next batch asks the path again
  }
}

}  // namespace optireduce
