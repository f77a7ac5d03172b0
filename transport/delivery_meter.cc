// DeliveryMeter: epochs and the best-rate filter.
#include "transport/delivery_meter.h"

#include <algorithm>

namespace optireduce {

void DeliveryMeter::on_acked(uint64_t bytes, uint64_t now) {
  std::lock_guard<std::mutex> l(mu_);
  if (epoch_start_ns_ == 0 || now - last_ack_ns_ > kIdleNs) {
    // The first acknowledgement, or the first after an idle spell: the epoch starts here.
    epoch_start_ns_ = now;
    epoch_bytes_ = 0;
  }
  last_ack_ns_ = now;
  epoch_bytes_ += bytes;
  const uint64_t len = now - epoch_start_ns_;
  if (len < kEpochNs) return;
  last_ = static_cast<double>(epoch_bytes_) / static_cast<double>(len);
  epoch_start_ns_ = now;
  epoch_bytes_ = 0;
  if (best_epoch_ns_ == 0 || now - best_epoch_ns_ >= kBestWindowNs) {
    best_prev_ = best_cur_;
    best_cur_ = 0;
    best_epoch_ns_ = now;
  }
  best_cur_ = std::max(best_cur_, last_);
}

double DeliveryMeter::last_rate() const {
  std::lock_guard<std::mutex> l(mu_);
  return last_;
}

double DeliveryMeter::best_rate() const {
  std::lock_guard<std::mutex> l(mu_);
  return std::max(best_cur_, best_prev_);
}

void DeliveryMeter::set_rates(double last, double best) {
  std::lock_guard<std::mutex> l(mu_);
  last_ = last;
  best_cur_ = best;
  best_prev_ = 0;
}

}  // namespace optireduce
