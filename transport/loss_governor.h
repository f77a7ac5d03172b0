// LossGovernor: how far a bounded group stretches its deadlines when its steps lose more than
// the user's loss target to them.
//
// tB and tC describe the network the group calibrated on. Background traffic that arrives in
// bursts (other jobs' allreduces, a checkpoint upload) makes every step it overlaps take 2-4x
// as long, for hundreds of milliseconds: several steps in a row. Cut at the calibrated bound,
// each of them loses 30-80% of its bytes. In the tail lab's time-to-accuracy runs (4 DDP ranks,
// bursts in about a fifth of the steps) that cost 25-30% of all gradients, and the model
// never reached the accuracy the exact runs reached; nor did cutting save time, because the
// ranks' compute slowed in the same bursts. A deadline exists to cut a tail, not a network that
// is slow for a while: once a step lost more than the target, the next ones get more time, and
// the stretch is given back as soon as steps fit the calibrated budget again.
//
// The law, per bounded step that started on the network (a sender that never started is a
// straggler: the start allowance covers it, and stretching for it would make every straggler
// cost more):
// - it lost a fraction f > target: stretch *= 1 + f (a step that lost half its bytes widens
//   the next ones by half; several receives of one call compound, so a burst is covered within
//   a call or two), up to kMaxStretch;
// - it delivered everything within the budget it would have had without the stretch: the
//   stretch was not needed, stretch *= 1 - kGiveBack, down to 1;
// - otherwise (it needed the stretch, or lost less than the target) the stretch holds.
#pragma once

#include <cstdint>

namespace optireduce {

class LossGovernor {
 public:
  // `target`: the fraction of a step's bytes it may lose to its deadline before the group
  // stretches (OPTIREDUCE_LOSS_TARGET); 1 never stretches.
  explicit LossGovernor(double target) : target_(target) {}

  // A bounded step that started ended: `bytes` expected, `received` of them arrived, in
  // `network_ns` from its sender's first packet; `unstretched_ns` is the budget it would have
  // had with a stretch of 1.
  void on_step(uint64_t bytes, uint64_t received, uint64_t network_ns, uint64_t unstretched_ns);

  // The factor every budget is multiplied by, in [1, kMaxStretch].
  double stretch() const { return stretch_; }

  // Bursty background traffic in the tail lab made steps 2-4x slower than their calibrated P95
  // (Gloo ring's P99/P50 about 3); tB is already 1.5x that P95. Four times more covers such a
  // burst with room; beyond it the network is not in a burst but broken, and the group would
  // only wait longer for data it will not get.
  static constexpr double kMaxStretch = 4.0;
  // The share of the stretch given back per step that did not need it: from 4x to 1x in about
  // ten such steps, under two TAR calls of 4 ranks, so the tail is cut again soon after a burst.
  static constexpr double kGiveBack = 0.125;

 private:
  const double target_;
  double stretch_ = 1.0;
};

}  // namespace optireduce
