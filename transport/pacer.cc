// Pacer implementation.
#include "transport/pacer.h"

namespace optireduce {

void Pacer::set_rate(double bytes_per_ns, uint64_t burst_bytes) {
  rate_ = bytes_per_ns;
  burst_ = burst_bytes;
  if (tokens_ > burst_) tokens_ = burst_;
}

uint64_t Pacer::available(uint64_t now) {
  if (rate_ == 0) return UINT64_MAX;
  if (last_ns_ == 0) {
    last_ns_ = now;
    tokens_ = burst_;
  }
  if (now <= last_ns_) return tokens_;
  const auto add = static_cast<uint64_t>(static_cast<double>(now - last_ns_) * rate_);
  if (add > 0) {  // keep the remainder for later instead of truncating it away
    tokens_ = std::min<uint64_t>(burst_, tokens_ + add);
    last_ns_ = now;
  }
  return tokens_;
}

uint64_t Pacer::next_time_ns(uint64_t now, uint64_t bytes) const {
  if (rate_ == 0 || tokens_ >= bytes) return now;
  return now + static_cast<uint64_t>((bytes - tokens_) / rate_) + 1;
}

}  // namespace optireduce
