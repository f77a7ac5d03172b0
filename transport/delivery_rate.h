// DeliveryRate: how fast a path delivered, from the bytes its ACKs acknowledge. Bounded packets
// are paced at a multiple of it (SendConn per connection, ConnGroup per communicator).
//
// Two things make the naive bytes-per-window figure wrong. ACKs come in batches, so a window
// needs several of them. And an application computes between its calls: a window across that
// pause measures bytes / (busy + idle), which on loopback paced bounded TAR at a tenth of the
// path (25% delivered at 10x the exact call's time). So a window never spans idle time: it
// restarts at the first ACK after the sender was idle, and it closes when the sender runs out of
// data in flight (a whole busy period, shorter than the usual minimum span, is a fair sample).
#pragma once

#include <algorithm>
#include <cstdint>

namespace optireduce {

class DeliveryRate {
 public:
  // `bytes` newly acknowledged at `now`. restart: the sender had nothing in flight before
  // them (the window starts here). idle_after: nothing is in flight after them. A window that
  // holds kMinAcks ACKs closes after `min_span` (a few RTTs average out ACK batching) or at the
  // end of its busy period. Returns true when a window closed (the estimate may have changed).
  bool on_ack(uint64_t bytes, uint64_t now, uint64_t min_span, bool restart, bool idle_after) {
    if (restart || start_ns_ == 0 || now < start_ns_) {
      start_ns_ = now;
      bytes_ = 0;
      acks_ = 0;
      return false;
    }
    bytes_ += bytes;
    ++acks_;
    const uint64_t span = now - start_ns_;
    // Few ACKs say little: the bytes of the window's first ACK are not counted, so with two of
    // them the figure is whatever share the second one happened to carry. And ACKs processed
    // in one batch arrive microseconds apart: a busy period's window needs a quarter of the
    // minimum span (measured in the tail lab: such windows read up to 500x the link rate).
    const bool enough = acks_ >= kMinAcks && span >= min_span / 4 && span > 0;
    if (!enough || (span < min_span && !idle_after)) {
      // A busy period too short for a sample is dropped, never stretched over the idle time
      // that follows it (the next call's first packets may leave before this ACK arrives, so
      // the sender's restart flag alone does not catch every pause).
      if (idle_after) start_ns_ = 0;
      return false;
    }
    const double sample = static_cast<double>(bytes_) / static_cast<double>(span);
    // A decaying maximum: application-limited windows (a sender with little to send) measure
    // less than the path can carry and must not drag the estimate down at once.
    rate_ = std::max(sample, kDecay * rate_);
    start_ns_ = idle_after ? 0 : now;
    bytes_ = 0;
    acks_ = 0;
    return true;
  }

  // Bytes per ns; 0 until a window closed.
  double rate() const { return rate_; }

 private:
  static constexpr uint32_t kMinAcks = 4;
  static constexpr double kDecay = 0.9;
  uint64_t start_ns_ = 0;  // 0: the next ACK starts a window
  uint64_t bytes_ = 0;
  uint32_t acks_ = 0;
  double rate_ = 0;
};

}  // namespace optireduce
