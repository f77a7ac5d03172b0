// LossGovernor implementation.
#include "transport/loss_governor.h"

#include <algorithm>
#include <cmath>

namespace optireduce {

void LossGovernor::on_step(uint64_t bytes, uint64_t received) {
  if (bytes == 0) return;
  const double lost =
      1.0 - static_cast<double>(std::min(received, bytes)) / static_cast<double>(bytes);
  stretch_ = std::clamp(stretch_ * std::exp(lost - target_), 1.0, kMaxStretch);
}

}  // namespace optireduce
