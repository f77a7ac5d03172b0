// A token-bucket pacer: spreads a path's window over its round trip (congestion.h) so that a
// window's worth of packets does not leave as one burst and overflow a switch queue or the
// receiver's socket buffer.
#pragma once

#include <algorithm>
#include <cstdint>

namespace optireduce {

class Pacer {
 public:
  // bytes_per_ns = 0: unlimited.
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
