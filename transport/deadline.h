// Where a bounded receive's deadline comes from. A policy is shared by the connections of one
// group (a communicator) so they calibrate and adapt together; see bounded.h for the one the
// plugin and liboptireduce use, and docs/architecture.md ("Deadlines") for the reasoning.
#pragma once

#include <cstdint>

namespace optireduce {

enum class RecvEnd : uint8_t { kAll, kDeadline, kEarly, kExpired };

class DeadlinePolicy {
 public:
  virtual ~DeadlinePolicy() = default;
  // True while the group measures tB: receives then run exact.
  virtual bool calibrating() = 0;
  // Time a bounded receive of `bytes` may take, counted from when it became the connection's
  // oldest incomplete receive.
  virtual uint64_t budget_ns(uint64_t bytes) = 0;
  // Early timeout: how long to wait after the tail packets arrived.
  virtual uint64_t early_ns(uint64_t bytes) = 0;
  // A receive finished: `elapsed_ns` from head to end, `received` of `bytes` arrived.
  virtual void on_complete(uint64_t bytes, uint64_t received, uint64_t elapsed_ns, RecvEnd how,
                           bool bounded) = 0;
  // A peer's piggybacked estimate tC (microseconds; 0 = none) for messages of `bytes`.
  virtual void on_peer_estimate(uint32_t tc_us, uint64_t bytes) = 0;
  // Our current estimate tC for messages of `bytes`, to piggyback (microseconds).
  virtual uint32_t estimate_us(uint64_t bytes) = 0;
};

}  // namespace optireduce
