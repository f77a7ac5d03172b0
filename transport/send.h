// The sending side of a connection. Messages wait for the receiver's clear-to-send (CTS), are
// cut into packets on the connection's packet grid, and leave within the receiver's buffer
// (the flow window), the path's congestion window and its pacer (congestion.h), and, bounded,
// within the receiver's credit (credit.h: its CTS and every ACK grant packets beyond the
// cumulative point). Every packet,
// exact or bounded, is acknowledged by SACK, so that the path's window follows the network in
// bounded steps too, and lost packets (a hole with >= 3 acknowledged packets above it, a loss
// probe, the retransmission timer) are sent again.
//
// Exact mode: a message is done when every packet is acknowledged. Bounded mode: also when the
// receiver says it completed the message (its deadline passed: what is still missing is not
// sent again), and, without that word, when the receiver's budget has passed since the CTS
// (the packets still unacknowledged then are given up) or since the isend without a CTS (the
// message "expires" and the receiver is told so). A bounded loss is therefore repaired while
// the deadline leaves time, and costs data only when time is short.
//
// Message slot states. The legal edges, the only ones set_state_locked() accepts:
//   Free    -> WaitCts   isend
//   WaitCts -> Sending   its CTS arrived
//   WaitCts -> Done      bounded (and not pinned exact, and sent as kAsConnection): it expired
//                        without a CTS, or its receiver left; bounded: the receiver's floor
//                        passed it (it ended the receive by its deadline); any mode: the
//                        CTS's buffer is too small (an error)
//   Sending -> Done      acknowledged, completed by the receiver, or given up (bounded, and
//                        not whole: a whole one only after the long fallback without progress)
//   Done    -> Free      test() reported it
// Meanings:
//   Free      unused
//   WaitCts   posted by isend; no CTS for its sequence yet
//   Sending   CTS received; packets leave and are acknowledged
//   Done      complete; test() reports it and frees the slot
#pragma once

#include <algorithm>
#include <memory>
#include <vector>

#include "transport/congestion.h"
#include "transport/conn.h"
#include "transport/learned_wait.h"
#include "transport/rtt.h"
#include "transport/sack.h"

namespace optireduce {

class DeadlinePolicy;

class SendConn final : public Conn, public SendComm {
 public:
  // `path`: the congestion state shared with every connection to the same host (PathTable);
  // null gives the connection a path of its own.
  SendConn(const Config& cfg, const Clock& clock, std::unique_ptr<Endpoint> ep,
           const ConnParams& p, std::shared_ptr<Registry> registry,
           std::shared_ptr<Path> path = nullptr);
  ~SendConn() override;

  using SendComm::isend;
  Status isend(const void* data, size_t size, MsgDelivery how, const MemoryRegion* mr,
               Request** req) override;
  Status isend_held(const void* data, size_t size, size_t ready, Request** req) override;
  Status release(Request* req, size_t ready) override;
  uint64_t sent_prefix(Request* req) override;
  Status test(Request* req, bool* done, size_t* size) override {
    return test_request(req, done, size);
  }
  ConnStats stats() const override { return stats_snapshot(); }
  Delivery delivery() const override;

  // Bounded mode: whose tC estimate DATA packets carry to the receiver (null: none).
  void set_group(DeadlinePolicy* group);

  // For tests: bytes sent but not yet acknowledged, and the path this connection sends on.
  uint64_t inflight_bytes() const;
  const std::shared_ptr<Path>& path() const { return path_; }

  enum class State : uint8_t { kFree, kWaitCts, kSending, kDone };
  // The edges listed above; anything else is a bug that set_state_locked() turns into a
  // failed connection instead of a silent corruption.
  static bool legal_transition(State from, State to);

 private:
  struct Msg {
    Request req;
    State state = State::kFree;
    bool bounded = false;
    bool exact = false;         // pinned exact: by the isend or by the receiver's CTS
    // Bounded, but the receiver waits for every byte once it started (its CTS said kFlagWhole,
    // MsgDelivery::kUntilStarted): never cut at the budget, only the receiver's FINAL ends it.
    bool whole = false;
    bool expire_early = false;  // may expire before its CTS (MsgDelivery::kAsConnection)
    bool expired = false;
    bool burst_head = false;  // it started a burst when posted (starts_burst, deadline.h)
    Status error;
    const uint8_t* data = nullptr;
    const MemoryRegion* mr = nullptr;  // data's registration (zero-copy sends), or null
    uint32_t steer = 0;  // where its DATA go at the receiver (its CTS's; TxPacket::steer)
    uint64_t size = 0;
    uint32_t npkts = 0;
    uint32_t ready = 0;     // packets below it hold final bytes (isend_held, release)
    uint32_t next_new = 0;  // packets below it have left at least once
    uint32_t cum = 0;       // packets below it are acknowledged
    uint32_t high = 0;      // one past the highest acknowledged packet
    uint32_t grant = 0;     // bounded: new packets only below it (receiver credit, credit.h)
    PacketBitmap acked;
    PacketBitmap resent;            // sent more than once: no RTT sample (Karn)
    std::vector<uint64_t> sent_ns;  // last transmission time per packet; kQueued: lost, queued
    std::vector<uint64_t> first_ns;  // first transmission time per packet
    uint64_t posted_ns = 0;
    uint64_t wait_ns = 0;      // bounded: how long the group would wait for a late CTS (0: none)
    uint64_t started_ns = 0;   // CTS arrived
    uint64_t progress_ns = 0;  // last acknowledgement progress
    bool sack_resent = false;  // SACK declared a packet of it lost
    bool reorder_reported = false;  // the receiver called one of those needless
  };
  struct CtsRecord {  // CTS may arrive before the matching isend
    uint32_t seq = 0;
    uint64_t capacity = 0;
    bool bounded = false;
    bool exact = false;
    bool whole = false;
    bool valid = false;
    uint16_t credit = 0;
    uint32_t steer = 0;
    uint64_t arrived_ns = 0;  // the first CTS for `seq` (a repeated one keeps it)
  };
  // Outcome of recent messages, to answer a late CTS for an expired one.
  static constexpr uint32_t kCtsRing = 2 * kMaxRequests;
  // How far a receiver's floor may run ahead of our oldest message, and how far behind it a
  // late CTS may be answered (on_receiver_floor_locked, on_cts_locked): far more than any
  // straggler falls behind (NCCL's 128 KiB chunks make thousands of messages a second), far
  // less than the sequence space's half.
  static constexpr int32_t kFloorAheadMax = 1 << 24;
  // sent_ns of a packet found lost and waiting in the retransmission queue.
  static constexpr uint64_t kQueued = UINT64_MAX;

  // Conn hooks.
  void on_packet_locked(const PacketHeader& h, const uint8_t* payload, uint64_t now) override;
  bool waiting_on_peer_locked() const override;
  void on_peer_closed_locked(uint32_t floor, uint64_t now) override;
  void after_rx_burst_locked(uint64_t) override {}
  void on_timers_locked(uint64_t now) override;
  void transmit_locked(uint64_t now) override;
  Status test_locked(Request* req, bool* done, size_t* size, uint64_t now) override;
  uint64_t next_timer_locked() const override;
  uint64_t pace_retry_locked() const override { return inflight_ != 0 ? retry_ns_ : 0; }

  // send.cc: the message's life.
  Status post_locked(const void* data, size_t size, MsgDelivery how, const MemoryRegion* mr,
                     size_t ready, Request** req);
  // The message of `req` if it is one of ours that test() has not reported done, else null.
  Msg* outstanding_locked(Request* req);
  // Packets of `m` whose every byte lies below `bytes` (all of them at its size).
  uint32_t packets_below(const Msg& m, uint64_t bytes) const;
  bool set_state_locked(Msg& m, State to);
  void on_cts_locked(const PacketHeader& h, uint64_t now);
  void start_locked(Msg& m, const CtsRecord& cts, uint64_t now);
  void on_receiver_floor_locked(uint32_t floor);
  void finish_locked(Msg& m);
  bool may_expire_locked(const Msg& m) const;
  uint32_t pkt_len(const Msg& m, uint32_t i) const;
  // What a packet counts in flight (inflight_, the path's window): its payload, and 1 for the
  // only packet of an empty message. Counted as 0, a lost one left nothing in flight, and the
  // timeout and the probe, which act only on something in flight, never sent it again: a
  // zero-byte send under loss hung for good.
  uint32_t flight_len(const Msg& m, uint32_t i) const { return std::max(pkt_len(m, i), 1u); }
  Msg& slot(uint32_t seq) { return msgs_[seq % kMaxRequests]; }
  TxFence& fence(uint32_t seq) { return fences_[seq % kMaxRequests]; }
  // Sets where a DATA packet of `m` goes and what it needs for a zero-copy send (none without a
  // registration). A packet's first retransmission goes the common way (send_tx.cc says why).
  void name_payload(TxPacket* p, const Msg& m, uint32_t seq, bool common_way = false);

  // send_recovery.cc: acknowledgements and loss recovery.
  void on_ack_locked(const PacketHeader& h, const uint8_t* sack, uint64_t now);
  void on_ack_msg_locked(const PacketHeader& h, const uint8_t* sack, uint64_t now);
  // An RTT sample less the host delays at both ends (rx_arrival_ns_, the ACK's hold_ns); 0: none.
  uint64_t network_rtt(uint64_t rtt, uint64_t now, uint32_t hold_ns) const;
  void on_receiver_done_locked(Msg& m);
  struct AckTally {
    uint64_t acked = 0;        // bytes newly acknowledged
    uint64_t left_flight = 0;  // of which were still counted in flight
    uint64_t newest_sent = 0;  // latest send time among them that may give an RTT sample
    bool newest_full = false;  // that packet carried a whole pkt_payload (see on_ack_locked)
    // Latest first transmission among them that went more than once: its ACK may answer any
    // copy, so it bounds the round trip only from above (RttEstimator::sample_bound).
    uint64_t newest_first_resent = 0;
    // Earliest transmission among them that went only once: such a packet arrived as sent,
    // whatever timer fired since (a timeout's verdict, on_timeout_verdict_locked).
    uint64_t oldest_original = UINT64_MAX;
  };
  void ack_packet_locked(Msg& m, uint32_t i, AckTally* t);
  void detect_losses_locked(Msg& m, uint64_t now);
  void mark_lost_locked(Msg& m, uint32_t i, bool loss_signal, uint64_t now);
  // The receiver's CTS moved a message under way off the place its DATA were steered to.
  void resteer_locked(Msg& m, uint64_t now);
  // Queues m's packets still in flight for resending, oldest first, while `budget` bytes last
  // and the retransmission queue has room; returns the budget left.
  uint64_t requeue_in_flight_locked(Msg& m, uint64_t budget, uint64_t now);
  void on_rto_locked(uint64_t now);
  // The message of the oldest packet in flight, and that packet in *pkt; null when none is.
  Msg* oldest_in_flight_locked(uint32_t* pkt);
  // A timeout taken as real: the path's window is cut and up to one window of the oldest
  // outstanding packets goes again.
  void timeout_locked(uint64_t now);
  // After a timeout fired, the first ACK that acknowledges a packet sent only once decides
  // whether it was real.
  void on_timeout_verdict_locked(const AckTally& t, uint64_t now);
  void send_probe_locked(uint64_t now);
  void arm_probe_locked(uint64_t now);
  // The receiver got a retransmission of message `seq` that it already had (kFlagDup): if our
  // last probe was of that message, it came too early, and later ones wait longer
  // (probe_srtts_); else, if SACK declared packets of it lost, one was reordered, not lost
  // (counted: reordered_losses).
  void on_dup_report_locked(uint32_t seq);
  // Takes a message's unacknowledged packets out of flight (it will send none of them again).
  void forget_outstanding_locked(Msg& m);

  // send_expiry.cc: bounded messages that run out of time.
  void expire_bounded_locked(uint64_t now);
  void send_expired_notice_locked(uint32_t seq);
  uint64_t give_up_ns_locked() const;
  // How long `m` may wait for its CTS: the receiver's announced wait, or the group's own start
  // allowance for its size if longer (the last CTS may have been for a smaller message).
  uint64_t cts_wait_ns_locked(const Msg& m) const;
  // When `m`, waiting for its CTS, expires: its wait after its isend, or at once when it
  // continues a burst whose receiver is absent.
  uint64_t cts_deadline_ns_locked(const Msg& m) const;
  void give_up_locked(Msg& m);
  // Ends a message that never started (no CTS, or its receiver no longer wants it): done,
  // counted as expired. False if the state machine refused (the connection then failed).
  bool expire_unstarted_locked(Msg& m);

  Msg msgs_[kMaxRequests];
  // One per message slot: the datapath holds it while the device still reads the message's
  // buffer (datapath.h), and test() does not report a send done, nor frees its slot, before it
  // is idle. Apart from msgs_ and on the heap: a connection destroyed while the device reads
  // leaves them behind, never freed, since the endpoint (shared: it outlives us; our own:
  // destroyed after our members) releases them later (see ~SendConn).
  std::unique_ptr<TxFence[]> fences_;
  uint32_t next_seq_ = 0;  // sequence of the next isend
  uint32_t oldest_ = 0;    // oldest sequence not yet reported done
  CtsRecord cts_[kCtsRing];
  uint64_t expired_mask_ = 0;  // bit (seq % 64) set: that seq expired (valid for seq >= next_seq_-64)

  // Retransmission queue: (seq, packet) pairs found lost, bounded; overflow is left to the RTO.
  struct Retx {
    uint32_t seq, pkt;
  };
  static constexpr uint32_t kRetxCap = 4096;
  std::vector<Retx> retx_;  // reserved once, used as a FIFO via retx_head_
  size_t retx_head_ = 0;

  RttEstimator rtt_;
  std::shared_ptr<Path> path_;
  // The receiver's buffering (and OPTIREDUCE_WINDOW_BYTES): a per-connection cap on the bytes
  // in flight, whatever the path's window allows.
  const uint64_t flow_window_;
  uint64_t inflight_ = 0;        // this connection's bytes sent and not acknowledged or lost
  uint64_t rto_deadline_ = 0;    // 0 = disarmed
  // When the retransmission timer fired with its verdict still open (0: none open). The timer
  // fires spuriously whenever an ACK is later than the timeout allows, and not only on a queue
  // that grew (a busy receiver's host, a descheduled process): 97% of TAR exact's
  // retransmissions under bench/lab's background traffic arrived twice. So a timeout first
  // sends only the oldest packet in flight again, and the next ACK that acknowledges a packet
  // sent only once decides: if that packet left before the timer fired, the packets were not
  // lost, and nothing is cut; if only packets sent after it arrived (or the path stays silent
  // through more expiries, send_recovery.cc), the timeout is real (F-RTO's idea, RFC 5682,
  // with SACK's per-packet evidence).
  uint64_t rto_open_ns_ = 0;
  uint8_t rto_open_expiries_ = 0;  // expiries since rto_open_ns_, that one included
  // When transmit_locked() should run again for work the path or the datapath held back; 0:
  // none (send_tx.cc).
  uint64_t retry_ns_ = 0;
  // How soon to look again when no pacer time says: a quarter of the RTT (an ACK of another
  // connection on the path frees the window within one), within [20 us, 1 ms].
  uint64_t retry_fallback_ns() const {
    return std::clamp<uint64_t>(rtt_.srtt_ns() / 4, 20'000, 1'000'000);
  }
  uint64_t probe_deadline_ = 0;  // tail loss probe; 0 = disarmed
  // The probe's delay in smoothed RTTs: 2 as TCP's, one more for each probe the receiver shows
  // was not needed (its packet had arrived: a receiver that pauses between passes, an ACK
  // delayed by its host), up to 8; one less after 16 probes with no such report.
  LearnedWait probe_srtts_{2, 8, 16};
  uint32_t probe_seq_ = 0;    // the last probe's message
  uint32_t probes_open_ = 0;  // probes of it that no ACK has called spurious yet
  // Bounded mode. The receiver decides per message whether it is bounded (its CTS says so) and
  // tells us its budget; a posted send that waits longer than that for its CTS expires (before
  // any budget is known, after the fallback of give_up_ns_locked()).
  uint64_t expiry_budget_ns_ = 0;  // the receiver's announced start allowance; 0 = none yet
  bool heard_cts_ = false;         // the receiver ever sent a CTS
  bool presumed_dead_ = false;     // a message expired before the receiver ever spoke
  // A bounded send expired for want of a CTS and no CTS came since: the receiver is absent
  // (a straggler), and the rest of the burst expires at once.
  bool receiver_absent_ = false;
  uint64_t last_done_ns_ = 0;      // when a send last became done (0: never)
  uint32_t receiver_floor_ = 0;    // every message below it is complete at the receiver
  DeadlinePolicy* group_ = nullptr;
};

}  // namespace optireduce
