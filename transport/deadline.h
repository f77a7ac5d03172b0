// Where a bounded receive's deadline comes from. A policy is shared by the connections of one
// group (a communicator) so they calibrate and adapt together; see bounded.h for the one the
// plugin and liboptireduce use, and docs/architecture.md ("Deadlines") for the reasoning.
#pragma once

#include <cstdint>

namespace optireduce {

enum class RecvEnd : uint8_t { kAll, kDeadline, kEarly, kExpired };

// How many budgets a bounded transfer may start late, on both sides: a receiver waits this long
// for a sender it has not heard from at all before cutting it, and a sender waits this long for
// a receiver's CTS before expiring its message. The budget measures the network (a transfer
// once under way); ranks also reach a step at different times (compute skew: a training step's
// buckets become ready at different moments on different ranks, tens of milliseconds apart on
// a loaded host), and cutting a peer that is merely behind loses its whole contribution for
// nothing. A real straggler still costs at most (1 + this) budgets.
inline constexpr uint64_t kLateStartBudgets = 8;

// What one finished receive tells the policy.
struct StepReport {
  uint64_t bytes = 0;       // message size (capacity when nothing arrived)
  uint64_t received = 0;    // bytes that arrived
  uint64_t elapsed_ns = 0;  // from becoming the oldest incomplete receive to the end
  RecvEnd how = RecvEnd::kAll;
  bool bounded = false;
  // Data was already arriving when the receive became the oldest: the elapsed time then
  // covers only the end of the transfer, not a whole step, and must not feed the estimates.
  bool pipelined = false;
};

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
  // A receive finished.
  virtual void on_complete(const StepReport& step) = 0;
  // A peer's piggybacked estimate tC (microseconds; 0 = none) for messages of `bytes`.
  virtual void on_peer_estimate(uint32_t tc_us, uint64_t bytes) = 0;
  // Our current estimate tC for messages of `bytes`, to piggyback (microseconds).
  virtual uint32_t estimate_us(uint64_t bytes) = 0;
  // The current hard bound tB and the agreed estimate tC for messages of `bytes`.
  virtual uint64_t tb_ns(uint64_t bytes) = 0;
  virtual uint64_t tc_ns(uint64_t bytes) = 0;
};

}  // namespace optireduce
