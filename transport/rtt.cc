// RttEstimator implementation.
#include "transport/rtt.h"

#include <algorithm>

namespace optireduce {

void RttEstimator::sample(uint64_t r) {
  if (r == 0) r = 1;
  if (srtt_ns_ == 0) {
    srtt_ns_ = r;
    rttvar_ns_ = r / 2;
  } else {
    const uint64_t err = srtt_ns_ > r ? srtt_ns_ - r : r - srtt_ns_;
    rttvar_ns_ = (3 * rttvar_ns_ + err) / 4;  // beta = 1/4
    srtt_ns_ = (7 * srtt_ns_ + r) / 8;        // alpha = 1/8
  }
  note_max(r);
  rto_ns_ = computed_rto();
}

void RttEstimator::sample_bound(uint64_t r) {
  if (srtt_ns_ == 0) return;  // no RTT yet: the initial timeout stands
  note_max(r);
  rto_ns_ = std::max(rto_ns_, computed_rto());
}

void RttEstimator::note_max(uint64_t r) {
  cur_max_ = std::max(cur_max_, r);
  if (++in_cur_ == kMaxWindow) {
    prev_max_ = cur_max_;
    cur_max_ = 0;
    in_cur_ = 0;
  }
}

uint64_t RttEstimator::computed_rto() const {
  const uint64_t rto = std::max({srtt_ns_ + 4 * rttvar_ns_, 2 * srtt_ns_, recent_max_ns() * 5 / 4});
  return std::clamp(rto, rto_min_ns_, rto_max_ns_);
}

void RttEstimator::backoff() {
  rto_ns_ = std::min(rto_ns_ * 2, rto_max_ns_);
}

void RttEstimator::on_progress() {
  if (srtt_ns_ != 0) rto_ns_ = computed_rto();
}

}  // namespace optireduce
