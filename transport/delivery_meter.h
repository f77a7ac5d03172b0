// How fast a device's paths together deliver: the yardstick by which a path tells that it is
// starved (congestion.h, competing with loss-based traffic).
//
// Why per device and not per path: a sender's paths share its uplink, and how they split it
// changes from step to step (TAR's three paths of a rank each get a third while all run, the
// last one the whole link), so a path's own rate says little. What they deliver together
// does: about the link's rate whenever they have data, whatever their number, and a fraction of
// it when someone else holds the queue.
//
// Rates are measured over epochs of kEpochNs (long enough that acknowledgements arriving in
// bunches average out) and remembered as a maximum over the current and the previous
// kBestWindowNs. Time the device spent idle (no acknowledgement for kIdleNs) is left out of
// every epoch: it says how much there was to send, not what the network gives.
//
// One per local device, shared by its paths (PathTable); its mutex is a leaf taken once per
// acknowledgement a path processes.
#pragma once

#include <cstdint>
#include <mutex>

namespace optireduce {

class DeliveryMeter {
 public:
  static constexpr uint64_t kEpochNs = 10'000'000;
  // A gap between acknowledgements this long is idleness: the epoch restarts after it.
  static constexpr uint64_t kIdleNs = kEpochNs / 2;
  static constexpr uint64_t kBestWindowNs = 2'000'000'000;

  void on_acked(uint64_t bytes, uint64_t now);
  // Bytes per ns of the last measured epoch, and the best of recent ones (0: none yet).
  double last_rate() const;
  double best_rate() const;
  // Seeds a measurement (tests).
  void set_rates(double last, double best);

 private:
  mutable std::mutex mu_;
  uint64_t epoch_start_ns_ = 0, epoch_bytes_ = 0, last_ack_ns_ = 0;
  double last_ = 0;
  double best_cur_ = 0, best_prev_ = 0;
  uint64_t best_epoch_ns_ = 0;
};

}  // namespace optireduce
