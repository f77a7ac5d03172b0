// Round-trip time estimate and retransmission timeout (RFC 6298 smoothing, Karn's rule applied
// by the caller: only packets sent once give samples).
#pragma once

#include <cstdint>

namespace optireduce {

class RttEstimator {
 public:
  RttEstimator(uint64_t rto_min_ns, uint64_t rto_max_ns, uint64_t initial_rto_ns)
      : rto_min_ns_(rto_min_ns), rto_max_ns_(rto_max_ns), rto_ns_(initial_rto_ns) {}

  void sample(uint64_t rtt_ns);
  // Doubles the timeout after an expiry (exponential backoff), up to the maximum.
  void backoff();

  bool has_sample() const { return srtt_ns_ != 0; }
  uint64_t srtt_ns() const { return srtt_ns_; }
  uint64_t rttvar_ns() const { return rttvar_ns_; }
  uint64_t rto_ns() const { return rto_ns_; }

 private:
  uint64_t rto_min_ns_, rto_max_ns_;
  uint64_t srtt_ns_ = 0;
  uint64_t rttvar_ns_ = 0;
  uint64_t rto_ns_;
};

}  // namespace optireduce
