// The sending side of a connection. Messages wait for the receiver's clear-to-send (CTS), are
// cut into packets on the connection's packet grid, and leave under the congestion window and
// the pacer. Exact mode: a message is done when every packet is acknowledged; lost packets are
// found by SACK (a hole with >= 3 acknowledged packets above it) or by the retransmission
// timer. Bounded mode: done when every packet has left once, or, without a CTS, when the send
// deadline passes (the message is then "expired" and the receiver is told so).
//
// Message slot states (legal orders: Free -> WaitCts -> Sending -> Done -> Free, and
// WaitCts -> Done in bounded mode when the send deadline passes):
//   Free      unused
//   WaitCts   posted by isend; no CTS for its sequence yet
//   Sending   CTS received; packets leave (and, exact mode, are acknowledged)
//   Done      complete; test() reports it and frees the slot
#pragma once

#include <vector>

#include "transport/delivery_rate.h"
#include "transport/conn.h"
#include "transport/pacer.h"
#include "transport/rtt.h"
#include "transport/sack.h"

namespace optireduce {

class DeadlinePolicy;

class SendConn final : public Conn, public SendComm {
 public:
  SendConn(const Config& cfg, const Clock& clock, std::unique_ptr<Endpoint> ep,
           const ConnParams& p, std::shared_ptr<Registry> registry);
  ~SendConn() override;

  Status isend(const void* data, size_t size, Request** req) override;
  Status test(Request* req, bool* done, size_t* size) override {
    return test_request(req, done, size);
  }
  ConnStats stats() const override { return stats_snapshot(); }
  Delivery delivery() const override;
  void force_exact() override;

  // Bounded mode: whose tC estimate DATA packets carry to the receiver (null: none).
  void set_group(DeadlinePolicy* group);

  // For tests: bytes sent but not yet acknowledged, and the congestion window.
  uint64_t inflight_bytes() const;
  uint64_t cwnd_bytes() const;

 private:
  enum class State : uint8_t { kFree, kWaitCts, kSending, kDone };
  struct Msg {
    Request req;
    State state = State::kFree;
    bool bounded = false;
    bool expired = false;
    Status error;
    const uint8_t* data = nullptr;
    uint64_t size = 0;
    uint32_t npkts = 0;
    uint32_t next_new = 0;  // packets below it have left at least once
    uint32_t cum = 0;       // packets below it are acknowledged
    uint32_t high = 0;      // one past the highest acknowledged packet
    PacketBitmap acked;
    PacketBitmap resent;            // sent more than once: no RTT sample (Karn)
    std::vector<uint64_t> sent_ns;  // last transmission time per packet
    uint64_t posted_ns = 0;
    uint64_t started_ns = 0;   // CTS arrived
    uint64_t progress_ns = 0;  // last acknowledgement progress (exact)
  };
  struct CtsRecord {  // CTS may arrive before the matching isend
    uint32_t seq = 0;
    uint64_t capacity = 0;
    bool bounded = false;
    bool valid = false;
  };
  // Outcome of recent messages, to answer a late CTS for an expired one.
  static constexpr uint32_t kCtsRing = 2 * kMaxRequests;

  void on_packet_locked(const PacketHeader& h, const uint8_t* payload, uint64_t now) override;
  bool waiting_on_peer_locked() const override;
  void on_peer_closed_locked(uint64_t now) override;
  void after_rx_burst_locked(uint64_t) override {}
  void on_timers_locked(uint64_t now) override;
  void transmit_locked(uint64_t now) override;
  Status test_locked(Request* req, bool* done, size_t* size, uint64_t now) override;

  void on_cts_locked(const PacketHeader& h, uint64_t now);
  void on_ack_locked(const PacketHeader& h, const uint8_t* sack, uint64_t now);
  void start_locked(Msg& m, uint64_t capacity, bool bounded, uint64_t now);
  void ack_packet_locked(Msg& m, uint32_t i, uint64_t* newest_sent);
  void finish_locked(Msg& m);
  void mark_lost_locked(Msg& m, uint32_t i);
  void detect_losses_locked(Msg& m, uint64_t now);
  void send_expired_notice_locked(uint32_t seq);
  void send_probe_locked();
  void arm_probe_locked(uint64_t now);
  void set_bounded_rate_locked();
  void sample_delivery_rate_locked(uint64_t newly_acked, uint64_t now);
  uint64_t give_up_ns_locked() const;
  void give_up_locked(Msg& m);
  uint32_t pkt_len(const Msg& m, uint32_t i) const;
  Msg& slot(uint32_t seq) { return msgs_[seq % kMaxRequests]; }

  Msg msgs_[kMaxRequests];
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
  CongestionWindow cwnd_;
  Pacer pacer_;          // OPTIREDUCE_RATE_GBPS for every packet
  Pacer bounded_pacer_;  // bounded packets, which no window governs
  // Delivery rate of exact traffic: what the path actually carried, the pace for bounded
  // packets. rate_restart_: the connection just left idle (its next ACK starts a window).
  DeliveryRate delivery_;
  bool rate_restart_ = true;
  uint64_t acked_bytes_ = 0;  // every byte ever acknowledged (exact mode)
  uint64_t inflight_ = 0;      // bytes sent at least once and not acknowledged (exact mode)
  uint64_t rto_deadline_ = 0;    // 0 = disarmed
  uint64_t probe_deadline_ = 0;  // tail loss probe; 0 = disarmed
  // Bounded mode. The receiver decides per message whether it is bounded (its CTS says so) and
  // tells us its budget; a posted send that waits longer than that for its CTS expires (before
  // any budget is known, after the fallback of give_up_ns_locked()).
  uint64_t expiry_budget_ns_ = 0;  // the receiver's announced budget; 0 = none yet
  bool heard_cts_ = false;         // the receiver ever sent a CTS
  bool presumed_dead_ = false;     // a message expired before the receiver ever spoke
  bool force_exact_ = false;
  DeadlinePolicy* group_ = nullptr;
};

}  // namespace optireduce
