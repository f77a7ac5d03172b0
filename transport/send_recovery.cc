// SendConn: acknowledgements (SACK), loss detection, the retransmission timer and the tail loss
// probe. Bounded messages go through the same machinery as exact ones, so a packet lost early
// in a bounded step is sent again while the deadline leaves time; the receiver's word that it
// completed a message (FINAL) ends its recovery.
#include <algorithm>

#include "transport/log.h"
#include "transport/send.h"

namespace optireduce {

namespace {
// A hole is declared lost once this many packets above it have been acknowledged (TCP's
// duplicate-ACK threshold: tolerates mild reordering without spurious retransmissions).
constexpr uint32_t kDupThresh = 3;
// Shortest tail-loss-probe delay. The probe otherwise follows the measured RTT (two of them,
// see arm_probe_locked), which already keeps it from duplicating packets still in flight; this
// only keeps it above what a timer served by polling can resolve on a busy host.
constexpr uint64_t kMinProbeNs = 20'000;
// Expiries of the retransmission timer in a row, and the time since the first, with no ACK to
// decide, after which a timeout is taken as real (on_rto_locked).
constexpr uint8_t kOpenExpiries = 3;
constexpr uint64_t kOpenNs = 50'000'000;
}  // namespace

void SendConn::ack_packet_locked(Msg& m, uint32_t i, AckTally* t) {
  if (!m.acked.set(i)) return;
  const uint32_t len = flight_len(m, i);
  t->acked += len;
  if (m.resent.test(i))
    t->newest_first_resent = std::max(t->newest_first_resent, m.first_ns[i]);
  else
    t->oldest_original = std::min(t->oldest_original, m.first_ns[i]);
  // A packet queued for retransmission was already taken out of the bytes in flight.
  if (m.sent_ns[i] != kQueued) {
    inflight_ -= std::min<uint64_t>(inflight_, len);
    t->left_flight += len;
    if (!m.resent.test(i) && m.sent_ns[i] >= t->newest_sent) {
      t->newest_sent = m.sent_ns[i];
      t->newest_full = len == params_.pkt_payload;
    }
  }
  m.high = std::max(m.high, i + 1);
}

void SendConn::on_ack_locked(const PacketHeader& h, const uint8_t* sack, uint64_t now) {
  if (h.flags & kFlagDup) on_dup_report_locked(h.msg_seq);
  // The message first: a FINAL's floor may cover its own message, which the FINAL ends with
  // more to tell than the floor does (what arrived, a round-trip sample).
  on_ack_msg_locked(h, sack, now);
  on_receiver_floor_locked(h.msg_floor);
}

void SendConn::on_ack_msg_locked(const PacketHeader& h, const uint8_t* sack, uint64_t now) {
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
  if (m.state != State::kSending) {
    if (m.state == State::kDone)
      ++stats_.drop_stale;
    else
      ++stats_.drop_unexpected;
    return;
  }
  if ((h.flags & kFlagFinal) && (h.flags & kFlagBounded)) {
    // The receiver completed a bounded message without all of it (its deadline passed):
    // nothing more is wanted. Only a bounded message may end so; for any other it is a lie.
    if (!m.bounded) {
      ++stats_.drop_unexpected;
      return;
    }
    on_receiver_done_locked(m);
    return;
  }
  AckTally t;
  if (h.flags & kFlagFinal) {
    if (m.next_new < m.npkts) {
      // Acknowledging packets we never sent is a protocol violation; refuse it.
      ++stats_.drop_bounds;
      return;
    }
    // The receiver holds the whole message; packets we never saw acknowledged arrived anyway.
    for (uint32_t i = m.acked.first_clear(m.cum); i < m.npkts; i = m.acked.first_clear(i + 1))
      ack_packet_locked(m, i, &t);
  } else {
    if (h.msg_size != m.npkts || h.offset > m.next_new) {
      ++stats_.drop_bounds;
      return;
    }
    for (uint32_t i = m.acked.first_clear(m.cum); i < h.offset; i = m.acked.first_clear(i + 1))
      ack_packet_locked(m, i, &t);
    // Bits ascend, so the first one beyond what we sent ends the walk: the rest are too.
    for_each_set_bit(sack, std::min(h.payload_len, kSackBytes), [&](uint32_t bit) {
      const uint64_t i = uint64_t{h.offset} + bit;
      if (i >= m.next_new) {
        ++stats_.drop_bounds;
        return false;
      }
      ack_packet_locked(m, static_cast<uint32_t>(i), &t);
      return true;
    });
  }
  // The receiver's credit counts from the ACK's cumulative point; an older ACK's smaller grant
  // never takes back what a newer one gave.
  if (m.bounded && h.credit != 0 && !(h.flags & kFlagFinal))
    m.grant = static_cast<uint32_t>(
        std::max<uint64_t>(m.grant, std::min<uint64_t>(uint64_t{h.offset} + h.credit, UINT32_MAX)));
  const uint32_t old_cum = m.cum;
  m.cum = m.acked.first_clear(m.cum);
  const uint64_t rtt = t.newest_sent != 0 ? now - t.newest_sent : 0;
  // The timers need the whole round trip, host delays included (a timeout must outwait a busy
  // receiver); the congestion controller only the network's part of it: without the time the
  // ACK waited for this process and the receiver's hold. Under CPU contention those are
  // milliseconds, which a delay-based controller read as a full queue and answered by cutting
  // the window to its floor (p2p_bench's proxy pattern fell to 0.1x TCP on a loaded host).
  if (rtt != 0) {
    rtt_.sample(rtt);
  } else if (t.newest_first_resent != 0) {
    // Every packet this ACK covered had gone twice, so Karn's rule gives no sample. Without one,
    // a timeout that fired because a queue grew (5-14 ms behind a background burst in the lab,
    // against an RTT of 1 ms before it) stayed at 2 ms: each window went again before its ACKs
    // could come back, no packet was ever acknowledged before being resent, and three in four
    // packets sent during the burst were duplicates. The time since the first copy left is
    // never shorter than the round trip of the copy that arrived: the timeout may follow it.
    rtt_.sample_bound(now - t.newest_first_resent);
  }
  // The base RTT (the whole round trip's minimum) only from packets of the full size: at 1
  // Gbit/s a 9 KB packet spends 72 us on each link, a message's short last packet almost none,
  // and a base set by those (30-40 us in bench/lab) puts every full packet's RTT above target.
  if (t.acked != 0)
    path_->on_acked(t.left_flight, t.acked, network_rtt(rtt, now, h.hold_ns),
                    t.newest_full ? rtt : 0, now);
  if (rto_open_ns_ != 0 && t.acked != 0) on_timeout_verdict_locked(t, now);
  if (m.cum != old_cum) {
    m.progress_ns = now;
    rtt_.on_progress();
  }
  if (m.cum != old_cum || t.newest_sent != 0) {
    rto_deadline_ = now + rtt_.rto_ns();
    arm_probe_locked(now);  // progress: push the probe out again
  }
  if (m.acked.full()) {
    finish_locked(m);
    return;
  }
  detect_losses_locked(m, now);
}

uint64_t SendConn::network_rtt(uint64_t rtt, uint64_t now, uint32_t hold_ns) const {
  if (rtt == 0) return 0;
  const uint64_t host = (now - std::min(now, rx_arrival_ns_)) + hold_ns;
  // More host time than the whole round trip can only be readings that disagree (a kernel
  // timestamp, taken on the wall clock, from before that clock stepped). No sample then.
  return host < rtt ? rtt - host : 0;
}

void SendConn::on_receiver_done_locked(Msg& m) {
  if (m.bounded && !m.acked.full()) ++stats_.cut_sends;  // not whole: a later ACK was lost
  // Ended before our first packet left: we came after the receiver's deadline (its FINAL or
  // floor waited for us with the CTS), and it counted us as exactly as late as it waited. It
  // is told that we came, and so when (DeadlinePolicy::on_late_sender).
  if (m.bounded && m.next_new == 0) send_expired_notice_locked(m.req.seq);
  forget_outstanding_locked(m);
  finish_locked(m);
}

void SendConn::forget_outstanding_locked(Msg& m) {
  uint64_t bytes = 0;
  for (uint32_t i = m.acked.first_clear(m.cum); i < m.next_new; i = m.acked.first_clear(i + 1))
    if (m.sent_ns[i] != kQueued) bytes += flight_len(m, i);
  inflight_ -= std::min(inflight_, bytes);
  path_->release(bytes);
}

void SendConn::detect_losses_locked(Msg& m, uint64_t now) {
  // Holes with kDupThresh acknowledged packets above them are lost. Once the whole message
  // has left, nothing more can arrive to push `high` up, so every aged hole below it counts.
  uint32_t limit = m.high >= kDupThresh + 1 ? m.high - kDupThresh : 0;
  if (m.next_new == m.npkts) limit = m.high;
  if (limit == 0) return;
  // A packet sent less than one smoothed RTT ago cannot have been acknowledged yet. No
  // reordering window beyond it, learned from the receiver's reports as RACK's is (RFC 8985):
  // tried, it sent 4% fewer packets twice in the lossy demonstration and cost its proxy
  // pattern about a tenth of its throughput, since every real loss then waited longer to be
  // repaired. Here a needless copy costs little more than its bytes: a loss cuts the window
  // only with the queue above its delay target (DelayController::on_loss), where TCP halves
  // it for every loss. Late packets sent again are counted (reordered_losses,
  // on_dup_report_locked).
  const uint64_t min_age = rtt_.has_sample() ? rtt_.srtt_ns() : rtt_.rto_ns();
  for (uint32_t i = m.acked.first_clear(m.cum); i < limit; i = m.acked.first_clear(i + 1)) {
    if (m.sent_ns[i] == kQueued || now - m.sent_ns[i] < min_age) continue;
    if (retx_.size() >= kRetxCap) break;  // the RTO will find the rest
    m.sack_resent = true;
    mark_lost_locked(m, i, true, now);
  }
}

// A packet believed lost leaves the bytes in flight (so the windows do not stay shut on packets
// that are no longer in the network: new packets keep ACKs, and so loss detection, flowing) and
// waits in the retransmission queue. loss_signal: a SACK hole, which tells the path's controller
// something; a timeout or a probe has told it already, or tells it nothing.
void SendConn::mark_lost_locked(Msg& m, uint32_t i, bool loss_signal, uint64_t now) {
  const uint32_t len = flight_len(m, i);
  inflight_ -= std::min<uint64_t>(inflight_, len);
  if (loss_signal)
    path_->on_lost(len, now);
  else
    path_->release(len);
  m.sent_ns[i] = kQueued;
  retx_.push_back({m.req.seq, i});
}

// The receiver lost the place this message's DATA were steered to (RecvConn::check_aim_locked)
// and asked again with steer 0. What is in flight went where no request takes it: it goes
// again now, the common way, rather than at timeouts backed off by the silence so far. Not a
// loss signal: the path dropped nothing.
void SendConn::resteer_locked(Msg& m, uint64_t now) {
  m.steer = 0;
  ++stats_.resteers;
  OR_INFO("message %u: its receiver lost the place it had for it; the rest goes the common way",
          m.req.seq);
  requeue_in_flight_locked(m, UINT64_MAX, now);  // past the queue's cap, the timeout finds them
}

uint64_t SendConn::requeue_in_flight_locked(Msg& m, uint64_t budget, uint64_t now) {
  for (uint32_t i = m.acked.first_clear(m.cum); i < m.next_new && budget > 0;
       i = m.acked.first_clear(i + 1)) {
    if (m.sent_ns[i] == kQueued) continue;  // already queued
    if (retx_.size() >= kRetxCap) break;
    mark_lost_locked(m, i, false, now);
    budget -= std::min<uint64_t>(budget, flight_len(m, i));
  }
  return budget;
}

// Retransmission timeout. Its verdict stays open (rto_open_ns_) while each expiry sends only the
// oldest packet in flight again: for kOpenExpiries expiries in a row and kOpenNs at least. A
// process descheduled on a loaded host, or a queue that grew tenfold behind a burst (5-14 ms in
// bench/lab, against timeouts of 1-2 ms), is silent for several timeouts; a path silent for
// longer is taken as lost. Only a path that returns any ACK has something to recover, and then
// the ACK decides (on_timeout_verdict_locked).
void SendConn::on_rto_locked(uint64_t now) {
  rto_deadline_ = 0;
  if (inflight_ == 0) {  // everything was acknowledged meanwhile: nothing to time out
    rto_open_ns_ = 0;
    return;
  }
  ++stats_.rto_events;
  rtt_.backoff();
  uint32_t pkt = 0;
  Msg* m = oldest_in_flight_locked(&pkt);
  // A verdict still open from an episode whose packets are all gone (a bounded receiver ended
  // them) says nothing about the packets in flight now.
  const bool same = rto_open_ns_ != 0 && m != nullptr && m->first_ns[pkt] < rto_open_ns_;
  if (!same) {
    rto_open_ns_ = now;
    rto_open_expiries_ = 0;
  }
  if (++rto_open_expiries_ >= kOpenExpiries && now - rto_open_ns_ >= kOpenNs) {
    rto_open_ns_ = 0;
    timeout_locked(now);
    return;
  }
  if (m != nullptr && retx_.size() < kRetxCap) mark_lost_locked(*m, pkt, false, now);
}

SendConn::Msg* SendConn::oldest_in_flight_locked(uint32_t* pkt) {
  for (uint32_t s = oldest_; s != next_seq_; ++s) {
    Msg& m = slot(s);
    if (m.state != State::kSending) continue;
    for (uint32_t i = m.acked.first_clear(m.cum); i < m.next_new; i = m.acked.first_clear(i + 1))
      if (m.sent_ns[i] != kQueued) {
        *pkt = i;
        return &m;
      }
  }
  return nullptr;
}

void SendConn::on_timeout_verdict_locked(const AckTally& t, uint64_t now) {
  // An ACK of copies only may answer the original or the copy: the packet the timeout resent is
  // the oldest in flight, so behind a queue that grew the first late ACK is usually its own.
  // A later one decides (or, if none comes, the timer's later expiries).
  if (t.oldest_original == UINT64_MAX) return;
  const bool spurious = t.oldest_original < rto_open_ns_;
  rto_open_ns_ = 0;
  if (spurious) {
    stats_.spurious_rtos += rto_open_expiries_;  // every expiry of the episode
    return;
  }
  if (inflight_ != 0) timeout_locked(now);
}

// The oldest unacknowledged packets of every message under way go again, up to one (shrunken)
// window.
void SendConn::timeout_locked(uint64_t now) {
  path_->on_timeout(now);
  uint64_t budget = std::max<uint64_t>(path_->snapshot().window, params_.pkt_payload);
  for (uint32_t s = oldest_; s != next_seq_ && budget > 0; ++s) {
    Msg& m = slot(s);
    if (m.state == State::kSending) budget = requeue_in_flight_locked(m, budget, now);
  }
}

// Loss probe: when nothing has been acknowledged for about two RTTs although packets are in
// flight, either the last packets or the ACKs for a whole burst were lost. No later packet
// will reveal it, and the RTO would shrink the window, so resend the highest outstanding
// packet of the oldest message: the receiver answers any packet with a complete SACK, which
// exposes every hole at once.
void SendConn::send_probe_locked(uint64_t now) {
  probe_deadline_ = 0;
  for (uint32_t s = oldest_; s != next_seq_; ++s) {
    Msg& m = slot(s);
    if (m.state != State::kSending || m.acked.full()) continue;
    uint32_t last = m.next_new;
    for (uint32_t i = m.acked.first_clear(m.cum); i < m.next_new; i = m.acked.first_clear(i + 1))
      last = i;
    if (last == m.next_new) continue;  // nothing outstanding in this message
    if (m.sent_ns[last] != kQueued && retx_.size() < kRetxCap) {
      mark_lost_locked(m, last, false, now);
      ++stats_.probes;
      if (probe_seq_ != s) probes_open_ = 0;
      probe_seq_ = s;
      ++probes_open_;
      probe_srtts_.on_quiet();
    }
    break;
  }
}

void SendConn::on_dup_report_locked(uint32_t seq) {
  // One report covers every probe of the message since the last: a pause long enough for two
  // saw the packet thrice.
  if (probes_open_ != 0 && seq == probe_seq_) {
    stats_.spurious_probes += probes_open_;
    probes_open_ = 0;
    probe_srtts_.on_needless();
    return;
  }
  // Else SACK's verdict on a hole of this message was wrong: the packet was late, not lost.
  // Counted once per message, which tells a user how often the network reorders beyond what
  // the loss detector tolerates. The report often rides on a FINAL after the one that
  // completed the message (the late original made it whole, then the copy came), so a message
  // already done still counts while its slot is not reused. A timeout's duplicates are
  // F-RTO's to judge (on_timeout_verdict_locked).
  Msg& m = slot(seq);
  if (m.req.seq != seq || !m.sack_resent || m.reorder_reported) return;
  m.reorder_reported = true;
  ++stats_.reordered_losses;
}

void SendConn::arm_probe_locked(uint64_t now) {
  const uint64_t srtt = rtt_.has_sample() ? rtt_.srtt_ns() : rtt_.rto_ns() / 2;
  // Twice the smoothed RTT (probe_srtts_), as TCP's tail-loss probe, and always before the RTO
  // would fire, so that a lost tail costs a probe, not a window collapse. Not also past the RTT's
  // variation and the largest recent sample, as it once was: behind a background burst's queue
  // those put the probe 10-20 ms after the last ACK, and the slow phases of TAR exact in bench/lab
  // had about 1.4 probes per send (docs/lab.md, "Findings"); at twice the smoothed RTT its
  // P99 / Gloo ring's went from a median of 1.10 to 0.97 over seeds 5-14, lower in 8, higher
  // in 1. A probe that a receiver's pause makes spurious costs one packet sent twice, and the
  // receiver's reports of such probes stretch the two RTTs for a receiver that pauses often
  // (probe_srtts_); the timeout, which cuts the window, keeps its margin (RttEstimator).
  const uint64_t pto = probe_srtts_.steps() * srtt;
  probe_deadline_ = now + std::max(kMinProbeNs, std::min(pto, rtt_.rto_ns() * 3 / 4));
}

}  // namespace optireduce
