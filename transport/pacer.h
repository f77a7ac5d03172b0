// Sender rate control: a congestion window (AIMD on loss, slow start below ssthresh) that
// bounds the bytes in flight, and a token-bucket pacer that spreads a window over the round
// trip so that bursts do not overflow the receiver's socket buffer or a switch queue.
#pragma once

#include <algorithm>
#include <cstdint>

namespace optireduce {

class CongestionWindow {
 public:
  // `mss` = payload bytes per packet; `ceiling` = most bytes in flight ever allowed (the
  // peer's receive buffering, the configured window).
  CongestionWindow(uint32_t mss, uint64_t ceiling);

  uint64_t cwnd() const { return cwnd_; }
  uint64_t ceiling() const { return ceiling_; }
  void on_ack(uint64_t acked_bytes);
  // A loss detected by SACK: multiplicative decrease, at most once per recovery epoch (the
  // caller passes the current send sequence; losses of packets sent before the epoch began
  // do not cut again).
  void on_loss(uint64_t now_send_seq, uint64_t lost_pkt_send_seq);
  // A retransmission timeout: restart from a small window.
  void on_timeout();

 private:
  uint32_t mss_;
  uint64_t ceiling_;
  uint64_t cwnd_;
  uint64_t ssthresh_;
  uint64_t recovery_end_ = 0;
};

class Pacer {
 public:
  // rate_bps = 0: unlimited.
  void set_rate(double bytes_per_ns, uint64_t burst_bytes);
  // Bytes that may leave now.
  uint64_t available(uint64_t now_ns);
  void consume(uint64_t bytes) { tokens_ = tokens_ > bytes ? tokens_ - bytes : 0; }
  // When `bytes` will be available (for the progress thread's sleep).
  uint64_t next_time_ns(uint64_t now_ns, uint64_t bytes) const;
  bool unlimited() const { return rate_ == 0; }

 private:
  double rate_ = 0;  // bytes per ns
  uint64_t burst_ = 0;
  uint64_t tokens_ = 0;
  uint64_t last_ns_ = 0;
};

}  // namespace optireduce
