// A wait that the receiver's reports of needless retransmissions teach. Loss recovery guesses:
// a hole with later packets acknowledged above it, or silence after the last ACK, may be a loss
// or a packet that is only late (reordered, or held by a receiver that paused). The receiver
// says which when a retransmission finds its packet already there (kFlagDup, wire.h). Each
// such report lengthens the wait by one step; a run of recoveries without one shortens it by
// one. So the wait settles where about one guess in `quiet_per_step` is needless, instead of
// being set by hand for a network nobody measured. RFC 8985 (RACK) adapts its reordering
// window to D-SACKs the same way (section 7.2). SendConn's tail-loss probe waits so (send.h);
// a reordering window for SACK's holes was tried with it and not kept (send_recovery.cc).
#pragma once
#include <algorithm>
#include <cstdint>

namespace optireduce {

class LearnedWait {
 public:
  constexpr LearnedWait(uint32_t min_steps, uint32_t max_steps, uint32_t quiet_per_step)
      : min_(min_steps), max_(max_steps), quiet_per_step_(quiet_per_step), steps_(min_steps) {}

  uint32_t steps() const { return steps_; }

  // The receiver reported a retransmission it did not need: wait one step longer.
  void on_needless() {
    quiet_ = 0;
    steps_ = std::min(max_, steps_ + 1);
  }
  // A recovery the receiver did not call needless: quiet_per_step of them in a row take a step
  // off.
  void on_quiet() {
    if (++quiet_ < quiet_per_step_) return;
    quiet_ = 0;
    if (steps_ > min_) --steps_;
  }

 private:
  uint32_t min_, max_, quiet_per_step_;
  uint32_t steps_;
  uint32_t quiet_ = 0;  // recoveries since the last report or step down
};

}  // namespace optireduce
