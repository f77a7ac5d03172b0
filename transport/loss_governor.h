// LossGovernor: how far a bounded group stretches its deadlines so that, over many steps, the
// bytes its started steps lose to their deadlines average the user's loss target.
//
// tB and tC describe the network the group calibrated on. Background traffic that arrives in
// bursts (other jobs' allreduces, a checkpoint upload) makes every step it overlaps take 2-4x
// as long, for hundreds of milliseconds: several steps in a row. Cut at the calibrated bound,
// each of them loses 30-80% of its bytes. In the tail lab's time-to-accuracy runs (4 DDP ranks,
// bursts in about a fifth of the steps) that cost 25-30% of all gradients, and the model
// never reached the accuracy the exact runs reached; nor did cutting save time, because the
// ranks' compute slowed in the same bursts.
//
// Why an integral law and not "stretch after a loss, give it back after a step that fit": the
// give-back rule (an eighth per step that fit the unstretched budget) had returned to 1 long
// before the next slow step, so every slow step that was not part of a burst was cut at the
// calibrated bound as if no governor existed. In the time-to-accuracy runs (4 ranks sharing a
// 2-core host beside bursty background traffic) steps lost 1.8-1.9% of their elements against
// a target of 0.5%: 57% of the bytes lost were started steps cut with 50-90% of their bytes
// missing, one step in thirty, far apart. A controller that integrates the error (lost
// fraction minus target) instead settles where the long-run loss equals the target, whatever
// the pattern of slow steps, and a stretch it does not need costs nothing: a step that fits
// completes before its deadline, however far away that deadline is.
//
// The law, per bounded step that started on the network (a sender that never started is a
// straggler: the start allowance covers it, and stretching for it would make every straggler
// cost more): it lost a fraction f of its bytes, and stretch *= exp(f - target), within
// [1, kMaxStretch]. A step that lost half its bytes widens the next ones by 1.65x (several
// receives of one call compound, so a burst is covered within a call or two); a step that
// lost nothing gives back exp(-target) (0.5% per step at the default target: from 4x to 1x in
// under 300 steps of a quiet network). In log space the stretch moves by f - target per step,
// so it stops moving only where the mean of f is the target.
#pragma once

#include <cstdint>

namespace optireduce {

class LossGovernor {
 public:
  // `target`: the fraction of its bytes a started bounded step may lose to its deadline, on
  // average (OPTIREDUCE_LOSS_TARGET); 1 never stretches, 0 stretches to the ceiling and keeps it.
  explicit LossGovernor(double target) : target_(target) {}

  // A bounded step that started ended: `bytes` expected, `received` of them arrived.
  void on_step(uint64_t bytes, uint64_t received);

  // The factor every budget is multiplied by, in [1, kMaxStretch].
  double stretch() const { return stretch_; }

  // Bursty background traffic in the tail lab made steps 2-4x slower than their calibrated P95
  // (Gloo ring's P99/P50 about 3); tB is already 1.5x that P95. Four times more covers such a
  // burst with room; beyond it the network is not in a burst but broken, and the group would
  // only wait longer for data it will not get.
  static constexpr double kMaxStretch = 4.0;

 private:
  const double target_;
  double stretch_ = 1.0;
};

}  // namespace optireduce
