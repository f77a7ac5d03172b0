// Time source of every timer and deadline. Production code reads a monotonic clock; tests
// inject a FakeClock and advance it by hand, so timer logic is deterministic.
#pragma once

#include <atomic>
#include <cstdint>

namespace optireduce {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual uint64_t now_ns() const = 0;
};

// CLOCK_MONOTONIC in nanoseconds.
class SteadyClock final : public Clock {
 public:
  uint64_t now_ns() const override;
  static const SteadyClock& instance();
};

// A clock that moves only when told. Thread-safe so that a test can advance it while a
// progress thread reads it.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(uint64_t start_ns = 1'000'000'000) : now_(start_ns) {}
  uint64_t now_ns() const override { return now_.load(std::memory_order_acquire); }
  void advance_ns(uint64_t d) { now_.fetch_add(d, std::memory_order_acq_rel); }
  void advance_us(uint64_t d) { advance_ns(d * 1000); }
  void advance_ms(uint64_t d) { advance_ns(d * 1'000'000); }
  void set_ns(uint64_t t) { now_.store(t, std::memory_order_release); }

 private:
  std::atomic<uint64_t> now_;
};

}  // namespace optireduce
