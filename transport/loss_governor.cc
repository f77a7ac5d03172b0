// LossGovernor implementation.
#include "transport/loss_governor.h"

#include <algorithm>

namespace optireduce {

void LossGovernor::on_step(uint64_t bytes, uint64_t received, uint64_t network_ns,
                           uint64_t unstretched_ns) {
  if (bytes == 0) return;
  const double lost =
      1.0 - static_cast<double>(std::min(received, bytes)) / static_cast<double>(bytes);
  if (lost > target_) {
    stretch_ = std::min(kMaxStretch, stretch_ * (1.0 + lost));
  } else if (received >= bytes && network_ns <= unstretched_ns) {
    stretch_ = std::max(1.0, stretch_ * (1.0 - kGiveBack));
  }
}

}  // namespace optireduce
