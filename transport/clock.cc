// Monotonic clock implementation.
#include "transport/clock.h"

#include <ctime>

namespace optireduce {

uint64_t SteadyClock::now_ns() const {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(ts.tv_nsec);
}

const SteadyClock& SteadyClock::instance() {
  static const SteadyClock clock;
  return clock;
}

}  // namespace optireduce
