// The adaptive incast controller (OPTIREDUCE_INCAST=auto): each receiver chooses how many senders
// it admits per round from what its own receives observed. Pure logic, no clock, unit-tested.
//
// Control law (AIMD on the per-call outcome of a receiver, bounded calls only):
//  - congested call = a receive hit its deadline, or the lost fraction exceeded kLossTarget:
//    I <- max(1, floor(I / 2))                              (multiplicative decrease)
//  - kCleanCallsToGrow consecutive clean calls: I <- min(N-1, I + 1)   (additive increase)
// Loss caused by a straggler (a whole sender missing) says nothing about incast, so a call whose
// loss is entirely whole-message deadline misses from fewer than all senders halves only once
// per kCleanCallsToGrow calls (hysteresis), not on every call.
#pragma once

#include <algorithm>
#include <cstdint>

namespace optireduce::coll {

class IncastController {
 public:
  // Below this lost fraction a call counts as clean: a little loss is the price of a short
  // deadline, not a sign of incast overload.
  static constexpr double kLossTarget = 0.002;
  static constexpr int kCleanCallsToGrow = 2;

  explicit IncastController(int nranks = 2) { reset(nranks); }
  void reset(int nranks) {
    max_ = std::max(1, nranks - 1);
    incast_ = max_;
    clean_ = 0;
    since_cut_ = kCleanCallsToGrow;
  }
  int incast() const { return incast_; }

  // One bounded call's outcome at this receiver.
  void update(double lost_fraction, uint64_t deadline_hits, bool whole_sender_missing) {
    const bool congested = deadline_hits > 0 || lost_fraction > kLossTarget;
    ++since_cut_;
    if (congested) {
      clean_ = 0;
      if (whole_sender_missing && since_cut_ < kCleanCallsToGrow) return;
      incast_ = std::max(1, incast_ / 2);
      since_cut_ = 0;
      return;
    }
    if (++clean_ >= kCleanCallsToGrow) {
      incast_ = std::min(max_, incast_ + 1);
      clean_ = 0;
    }
  }

 private:
  int max_ = 1;
  int incast_ = 1;
  int clean_ = 0;
  int since_cut_ = 0;
};

}  // namespace optireduce::coll
