// BoundedGroup: calibration of tB, adaptation of tC both ways, size scaling, the peers'
// median, early timeout; and the policy driving real connections (early timeout, calibration
// steps running exact).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "tests/unit/mem_link.h"
#include "transport/bounded.h"
#include "transport/recv.h"
#include "transport/send.h"

namespace optireduce {
namespace {

constexpr uint64_t kMs = 1'000'000;
constexpr uint64_t kMiB = 1 << 20;

StepReport step(uint64_t bytes, uint64_t received, uint64_t elapsed_ns, RecvEnd how, bool bounded) {
  StepReport s;
  s.bytes = bytes;
  s.received = received;
  s.elapsed_ns = elapsed_ns;
  // The sender started as the receive became the oldest (skew: see the test that sets both).
  s.network_ns = received > 0 ? elapsed_ns : 0;
  s.how = how;
  s.bounded = bounded;
  s.burst_head = true;  // one message per step and connection, as on the host path
  return s;
}

// A bounded step of 1 MiB on `g` whose sender came `late` ns after the receive became the
// oldest and took 10 ms on the network; or, where `late` reaches the start allowance, was cut
// there (counted as exactly that late), and with `report_late` showed up afterwards to say how
// late it was (on_late_sender). True: it was received.
bool skew_step(BoundedGroup& g, uint64_t late, bool report_late) {
  const uint64_t allowance = g.start_allowance_ns(kMiB);
  if (late >= allowance) {
    g.on_complete(step(kMiB, 0, allowance, RecvEnd::kDeadline, true));
    if (report_late) g.on_late_sender(allowance, late);
    return false;
  }
  StepReport s = step(kMiB, kMiB, late + 10 * kMs, RecvEnd::kAll, true);
  s.network_ns = 10 * kMs;
  g.on_complete(s);
  return true;
}

// Without headroom, so that tB is the calibration's P95 itself, and without the loss governor,
// so that the budget is tB's and tC's alone (the governor's tests turn it on).
Config calib(int steps) {
  Config c;
  c.calibration_steps = steps;
  c.timeout_headroom = 1.0;
  c.loss_target = 1.0;
  return c;
}

TEST(BoundedGroup, CalibratesTbAsP95OfExactSteps) {
  BoundedGroup g(calib(20));
  EXPECT_TRUE(g.calibrating());
  for (int i = 1; i <= 20; ++i) g.on_complete(step(kMiB, kMiB, i * kMs, RecvEnd::kAll, false));
  EXPECT_FALSE(g.calibrating());
  EXPECT_EQ(g.tb_ns(kMiB), 19 * kMs);      // P95 of 1..20 ms
  EXPECT_EQ(g.budget_ns(kMiB), 19 * kMs);  // tC (smoothed, capped) x headroom stays under tB
}

TEST(BoundedGroup, HeadroomScalesTheCalibratedBound) {
  Config c = calib(20);
  c.timeout_headroom = 1.5;
  BoundedGroup g(c);
  for (int i = 1; i <= 20; ++i) g.on_complete(step(kMiB, kMiB, i * kMs, RecvEnd::kAll, false));
  ASSERT_FALSE(g.calibrating());
  EXPECT_EQ(g.tb_ns(kMiB), 19 * kMs * 3 / 2);
  // A step as slow as the calibration's P95 now completes inside the budget.
  EXPECT_GT(g.budget_ns(kMiB), 19 * kMs);
}

TEST(BoundedGroup, CalibrationLeavesOutCongestionOutliers) {
  BoundedGroup g(calib(20));
  // One call of six receives met a burst (4x slower): without the cut they would be the P95.
  for (int i = 0; i < 14; ++i)
    g.on_complete(step(kMiB, kMiB, (20 + i % 3) * kMs, RecvEnd::kAll, false));
  for (int i = 0; i < 6; ++i) g.on_complete(step(kMiB, kMiB, 80 * kMs, RecvEnd::kAll, false));
  ASSERT_FALSE(g.calibrating());
  EXPECT_EQ(g.tb_ns(kMiB), 22 * kMs);  // P95 of the 14 normal ones
}

TEST(BoundedGroup, CalibrationKeepsOrdinarySpread) {
  BoundedGroup g(calib(20));
  // Up to twice the median is the path's own variation and stays in the P95.
  for (int i = 0; i < 18; ++i) g.on_complete(step(kMiB, kMiB, 20 * kMs, RecvEnd::kAll, false));
  for (int i = 0; i < 2; ++i) g.on_complete(step(kMiB, kMiB, 39 * kMs, RecvEnd::kAll, false));
  ASSERT_FALSE(g.calibrating());
  EXPECT_EQ(g.tb_ns(kMiB), 39 * kMs);  // P95 of 20 samples is the 19th
}

TEST(BoundedGroup, FixedTimeoutSkipsCalibration) {
  Config c;
  c.timeout_ms = 7;
  BoundedGroup g(c);
  EXPECT_FALSE(g.calibrating());
  EXPECT_EQ(g.tb_ns(4096), 7 * kMs);
  EXPECT_EQ(g.tb_ns(64 * kMiB), 7 * kMs);
}

TEST(BoundedGroup, EstimateShrinksWhenQuietAndGrowsWhenBusy) {
  BoundedGroup g(calib(20));
  for (int i = 0; i < 20; ++i) g.on_complete(step(kMiB, kMiB, 40 * kMs, RecvEnd::kAll, false));
  ASSERT_EQ(g.tb_ns(kMiB), 40 * kMs);
  for (int i = 0; i < 30; ++i) g.on_complete(step(kMiB, kMiB, 4 * kMs, RecvEnd::kAll, true));
  const uint64_t quiet = g.tc_ns(kMiB);
  EXPECT_LT(quiet, 5 * kMs);
  EXPECT_LT(g.budget_ns(kMiB), 8 * kMs);  // the deadline follows the network down
  // Busy: half the bytes in 10 ms projects 20 ms for the whole step.
  for (int i = 0; i < 30; ++i)
    g.on_complete(step(kMiB, kMiB / 2, 10 * kMs, RecvEnd::kDeadline, true));
  EXPECT_NEAR(static_cast<double>(g.tc_ns(kMiB)), 20.0 * kMs, 0.5 * kMs);
  // ... but never beyond the hard bound (1% in 30 ms projects 3 s).
  for (int i = 0; i < 30; ++i)
    g.on_complete(step(kMiB, kMiB / 100, 30 * kMs, RecvEnd::kDeadline, true));
  EXPECT_NEAR(static_cast<double>(g.tc_ns(kMiB)), 40.0 * kMs, 0.1 * kMs);
  EXPECT_LE(g.tc_ns(kMiB), 40 * kMs);
  EXPECT_EQ(g.budget_ns(kMiB), 40 * kMs);
}

// Steps whose time swings get a budget that covers the swing (tC + 4 deviations); steady ones
// keep 1.5 x tC, so a quiet network's tail is still cut close.
TEST(BoundedGroup, TheBudgetCoversHowMuchStepsVary) {
  BoundedGroup g(calib(20));
  for (int i = 0; i < 20; ++i) g.on_complete(step(kMiB, kMiB, 100 * kMs, RecvEnd::kAll, false));
  ASSERT_EQ(g.tb_ns(kMiB), 100 * kMs);
  const uint64_t steady = kMiB + 4096, swinging = kMiB + 8192;
  for (int i = 0; i < 60; ++i) {
    g.on_complete(step(steady, steady, 20 * kMs, RecvEnd::kAll, true));
    g.on_complete(step(swinging, swinging, (i % 2 ? 10 : 30) * kMs, RecvEnd::kAll, true));
  }
  EXPECT_NEAR(static_cast<double>(g.budget_ns(steady)), 30.0 * kMs, 0.5 * kMs);
  // tC ~20 ms, deviation ~10 ms: a 30 ms step, routine here, is not cut.
  EXPECT_GT(g.budget_ns(swinging), 50 * kMs);
  EXPECT_LE(g.budget_ns(swinging), 100 * kMs);  // never beyond tB
}

// Two sizes of one class calibrate apart: the slow one's steps (DDP's first bucket, which
// overlaps the backward pass) are not the fast one's congestion outliers, and tB covers both.
TEST(BoundedGroup, SizesOfOneClassCalibrateTheirOwnP95) {
  BoundedGroup g(calib(30));
  const uint64_t fast = kMiB + 4096, slow = kMiB + 8192;
  for (int i = 0; i < 20; ++i) g.on_complete(step(fast, fast, 20 * kMs, RecvEnd::kAll, false));
  for (int i = 0; i < 10; ++i) g.on_complete(step(slow, slow, 60 * kMs, RecvEnd::kAll, false));
  ASSERT_FALSE(g.calibrating());
  EXPECT_EQ(g.tb_ns(fast), 60 * kMs);  // pooled, 60 ms was beyond 2x the median: tB 20 ms
}

TEST(BoundedGroup, DeadlinesScaleWithMessageSize) {
  BoundedGroup g(calib(20));
  for (int i = 0; i < 10; ++i) g.on_complete(step(4096, 4096, 2 * kMs, RecvEnd::kAll, false));
  for (int i = 0; i < 10; ++i) g.on_complete(step(kMiB, kMiB, 20 * kMs, RecvEnd::kAll, false));
  EXPECT_EQ(g.tb_ns(4096), 2 * kMs);
  EXPECT_EQ(g.tb_ns(kMiB), 20 * kMs);
  // An uncalibrated larger class scales from the nearest smaller one.
  EXPECT_EQ(g.tb_ns(4 * kMiB), 80 * kMs);
  EXPECT_LT(g.budget_ns(4096), g.budget_ns(kMiB));
}

TEST(BoundedGroup, AgreesOnTheMedianOfPeers) {
  BoundedGroup g(calib(1));
  g.on_complete(step(kMiB, kMiB, 100 * kMs, RecvEnd::kAll, false));  // tB = 100 ms
  for (int i = 0; i < 20; ++i) g.on_complete(step(kMiB, kMiB, 10 * kMs, RecvEnd::kAll, true));
  const uint64_t own = g.tc_ns(kMiB);
  g.on_peer_estimate(50'000, kMiB);  // two slow peers and one fast one
  g.on_peer_estimate(60'000, kMiB);
  g.on_peer_estimate(1'000, kMiB);
  // median of {own ~10 ms, 50, 60, 1} = the upper middle = own or 50 ms
  EXPECT_GE(g.tc_ns(kMiB), own);
  EXPECT_LE(g.tc_ns(kMiB), 50 * kMs);
  EXPECT_EQ(g.estimate_us(kMiB), static_cast<uint32_t>(own / 1000));  // we send our own
}

TEST(BoundedGroup, EarlyTimeoutIsAFractionOfTheEstimate) {
  Config c = calib(1);
  c.early_fraction = 0.1;
  BoundedGroup g(c);
  g.on_complete(step(kMiB, kMiB, 30 * kMs, RecvEnd::kAll, false));
  for (int i = 0; i < 40; ++i) g.on_complete(step(kMiB, kMiB, 10 * kMs, RecvEnd::kAll, true));
  EXPECT_NEAR(static_cast<double>(g.early_ns(kMiB)), 1.0 * kMs, 0.05 * kMs);
}

// ... but never shorter than the budget's floor: a 20 us chunk's tenth (2 us) would close it
// before a repair of its tail could arrive.
TEST(BoundedGroup, EarlyTimeoutWaitsForARepairOfAShortStep) {
  BoundedGroup g(calib(1));
  g.on_complete(step(kMiB, kMiB, 30 * kMs, RecvEnd::kAll, false));
  for (int i = 0; i < 40; ++i) g.on_complete(step(kMiB, kMiB, kMs / 50, RecvEnd::kAll, true));
  EXPECT_LT(g.tc_ns(kMiB), kMs / 10);
  EXPECT_GE(g.early_ns(kMiB), kMs);
}

TEST(BoundedGroup, PipelinedStepsNeitherCalibrateNorMoveTheEstimate) {
  BoundedGroup g(calib(2));
  StepReport p = step(kMiB, kMiB, kMs / 10, RecvEnd::kAll, false);
  p.pipelined = true;  // its data arrived before it became the oldest receive
  for (int i = 0; i < 5; ++i) g.on_complete(p);
  EXPECT_TRUE(g.calibrating());
  g.on_complete(step(kMiB, kMiB, 30 * kMs, RecvEnd::kAll, false));
  g.on_complete(step(kMiB, kMiB, 30 * kMs, RecvEnd::kAll, false));
  ASSERT_FALSE(g.calibrating());
  EXPECT_EQ(g.tb_ns(kMiB), 30 * kMs);
  p.bounded = true;
  for (int i = 0; i < 50; ++i) g.on_complete(p);
  EXPECT_EQ(g.tc_ns(kMiB), 30 * kMs);  // near-zero tails of pipelined steps are not step times
}

TEST(BoundedGroup, AFullyPipelinedStreamStillEndsCalibration) {
  BoundedGroup g(calib(2));
  StepReport p = step(kMiB, kMiB, 3 * kMs, RecvEnd::kAll, false);
  p.pipelined = true;
  for (int i = 0; i < 20; ++i) g.on_complete(p);
  EXPECT_FALSE(g.calibrating());
  EXPECT_EQ(g.tb_ns(kMiB), 3 * kMs);
}

TEST(BoundedGroup, ExpiredStepsDoNotMoveTheEstimate) {
  BoundedGroup g(calib(1));
  g.on_complete(step(kMiB, kMiB, 30 * kMs, RecvEnd::kAll, false));
  const uint64_t before = g.tc_ns(kMiB);
  for (int i = 0; i < 10; ++i) g.on_complete(step(kMiB, 0, 0, RecvEnd::kExpired, true));
  EXPECT_EQ(g.tc_ns(kMiB), before);
  EXPECT_EQ(g.stats().expired, 10u);
}

// A sender's lateness (the ranks' compute skew) is not the network's: tC follows the network
// time alone, and a sender that never started (a straggler) leaves it alone. The lateness sets
// the start allowance instead: the budget plus twice the P95 of the start delays seen.
TEST(BoundedGroup, SkewIsNotChargedToTheNetworkEstimate) {
  BoundedGroup g(calib(20));
  for (int i = 0; i < 20; ++i) g.on_complete(step(kMiB, kMiB, 40 * kMs, RecvEnd::kAll, false));
  ASSERT_EQ(g.tb_ns(kMiB), 40 * kMs);
  for (int i = 0; i < 30; ++i) {
    StepReport late = step(kMiB, kMiB, 30 * kMs, RecvEnd::kAll, true);
    late.network_ns = 4 * kMs;  // 26 ms waiting for the sender, 4 ms on the network
    g.on_complete(late);
  }
  const uint64_t tc = g.tc_ns(kMiB);
  EXPECT_LT(tc, 5 * kMs);
  // 20 calibration steps on time and 30 steps 26 ms late: the P95 is 26 ms. Skew is the ranks',
  // so a small message waits as long for its sender.
  EXPECT_EQ(g.start_allowance_ns(kMiB), g.budget_ns(kMiB) + 52 * kMs);
  EXPECT_EQ(g.start_allowance_ns(4096), g.budget_ns(4096) + 52 * kMs);
  for (int i = 0; i < 30; ++i) g.on_complete(step(kMiB, 0, 40 * kMs, RecvEnd::kDeadline, true));
  EXPECT_EQ(g.tc_ns(kMiB), tc);
  EXPECT_EQ(g.stats().deadline_hits, 30u);
  EXPECT_LT(g.budget_ns(kMiB), 8 * kMs);
  // Senders cut after 40 ms were at least that late, in 30 steps of 80: the P95 is 40 ms.
  EXPECT_EQ(g.start_allowance_ns(kMiB), g.budget_ns(kMiB) + 80 * kMs);
}

// A sender cut at the start allowance counts as exactly that late. One such straggler among
// a ring of routine skew leaves the allowance alone; a skew that outgrew it for good raises it
// within two refreshes. Left out instead (as once), the ring only ever saw the senders that
// came in time and the allowance never rose: every step of a 30 ms skew was cut for good
// (GpuChunks.ComputeSkewIsWaitedFor lost 57% of its sends so on a slow CI host).
TEST(BoundedGroup, SendersCutAtTheAllowanceRaiseItOnlyWhenRoutine) {
  BoundedGroup g(calib(20));
  for (int i = 0; i < 20; ++i) g.on_complete(step(kMiB, kMiB, 10 * kMs, RecvEnd::kAll, false));
  auto late_step = [&g](uint64_t late) { return skew_step(g, late, false); };
  for (int i = 0; i < 256; ++i) ASSERT_TRUE(late_step(5 * kMs));
  const uint64_t routine = g.start_allowance_ns(kMiB);
  EXPECT_EQ(routine, g.budget_ns(kMiB) + 10 * kMs);
  EXPECT_FALSE(late_step(3000 * kMs));  // a straggler
  for (int i = 0; i < 31; ++i) ASSERT_TRUE(late_step(5 * kMs));
  EXPECT_EQ(g.start_allowance_ns(kMiB), routine);
  int cut = 0;
  for (int i = 0; i < 64; ++i) cut += late_step(30 * kMs) ? 0 : 1;
  EXPECT_LE(cut, 32) << "steps cut before the allowance covered the new skew";
  EXPECT_GE(g.start_allowance_ns(kMiB), g.budget_ns(kMiB) + 60 * kMs);
}

// A cut sender counted at the allowance is a lower bound; when it shows up, its real lateness
// replaces it. A straggler 2 s late in one step of ten is beyond any allowance (the 1 s cap):
// left as a bound it is 10% of the samples and raised the allowance, doubling per refresh,
// to the cap, so each of its later straggles cost a second; corrected it leaves the ring.
// A sender 100 ms late as often is within the cap, and the allowance learns to wait for it.
TEST(BoundedGroup, ACutSendersRealLatenessReplacesItsBound) {
  struct Run {
    uint64_t skew_ns;  // the allowance beyond the budget at the end
    uint64_t learned;  // GroupStats::late_senders
  };
  auto run = [](uint64_t straggle, bool learn) {
    BoundedGroup g(calib(20));
    for (int i = 0; i < 20; ++i) g.on_complete(step(kMiB, kMiB, 10 * kMs, RecvEnd::kAll, false));
    for (int i = 0; i < 320; ++i) {
      skew_step(g, i % 10 == 9 ? straggle : 5 * kMs, learn);
    }
    return Run{g.start_allowance_ns(kMiB) - g.budget_ns(kMiB), g.stats().late_senders};
  };
  const Run corrected = run(2000 * kMs, true);
  EXPECT_EQ(corrected.skew_ns, 10 * kMs) << "twice the routine 5 ms";
  EXPECT_EQ(corrected.learned, 32u);
  const Run bounds = run(2000 * kMs, false);
  EXPECT_GE(bounds.skew_ns, 200 * kMs) << "the bounds alone climb towards the cap";
  EXPECT_EQ(bounds.learned, 0u);
  const Run within = run(100 * kMs, true);
  EXPECT_EQ(within.skew_ns, 200 * kMs) << "a lateness within the cap is waited for";
  EXPECT_LE(within.learned, 4u) << "steps cut before the allowance covered it";
  // A report that matches no bound (a sender that came in time, or one already corrected)
  // changes nothing.
  BoundedGroup g(calib(20));
  for (int i = 0; i < 20; ++i) g.on_complete(step(kMiB, kMiB, 10 * kMs, RecvEnd::kAll, false));
  g.on_complete(step(kMiB, kMiB, 10 * kMs, RecvEnd::kAll, true));
  const uint64_t before = g.start_allowance_ns(kMiB);
  g.on_late_sender(0, 900 * kMs);
  g.on_late_sender(10 * kMs, 900 * kMs);
  EXPECT_EQ(g.start_allowance_ns(kMiB), before);
  EXPECT_EQ(g.stats().late_senders, 0u);
}

// The later of two ranks never waits for the other's data: its sends find their CTS waiting
// instead. That lateness is the same skew seen from its side, and counts: a rank that was
// always the later one learned no skew at all and cut its peer's data the first time the
// peer came late.
TEST(BoundedGroup, TheLaterRankLearnsTheSkewFromItsSends) {
  BoundedGroup g(calib(20));
  for (int i = 0; i < 20; ++i) g.on_complete(step(kMiB, kMiB, 10 * kMs, RecvEnd::kAll, false));
  for (int i = 0; i < 30; ++i) {
    g.on_complete(step(kMiB, kMiB, 10 * kMs, RecvEnd::kAll, true));  // its peer's data at once
    g.on_send_lateness(26 * kMs);
  }
  // 80 samples, 30 of them 26 ms.
  EXPECT_EQ(g.start_allowance_ns(kMiB), g.budget_ns(kMiB) + 52 * kMs);
  // Its own lateness beyond the cap (it straggled) is no skew to wait for: counted, its
  // allowance, which its CTS announces to its peers' sends, rose to the cap.
  for (int i = 0; i < 30; ++i) g.on_send_lateness(2000 * kMs);
  EXPECT_EQ(g.start_allowance_ns(kMiB), g.budget_ns(kMiB) + 52 * kMs);
}

// NCCL cuts each step into chunks: one receive per connection waits for the peer's skew, the
// dozens after it only for the sender's pipeline between chunks. Only the first of a burst
// teaches the start allowance: counted with the rest, a 26 ms skew in 1 sample of 32 fell out
// of the P95 and senders expired waiting for their clear-to-send (5-26% of every call lost
// with two ranks on an H200).
TEST(BoundedGroup, ChunkedStepsTeachTheSkewThroughTheirFirstChunk) {
  BoundedGroup g(calib(20));
  for (int i = 0; i < 20; ++i) g.on_complete(step(kMiB, kMiB, 40 * kMs, RecvEnd::kAll, false));
  for (int i = 0; i < 32 * 16; ++i) {
    StepReport chunk = step(128 * 1024, 128 * 1024, kMs / 10, RecvEnd::kAll, true);
    chunk.burst_head = i % 32 == 0;                      // 4 MiB per step and peer
    if (chunk.burst_head) chunk.elapsed_ns += 26 * kMs;  // its sender came 26 ms late
    // The others' senders were between chunks for a tenth of that time: a pipeline's delay.
    chunk.network_ns = chunk.burst_head ? kMs / 10 : kMs / 20;
    g.on_complete(chunk);
  }
  EXPECT_GE(g.start_allowance_ns(128 * 1024), g.budget_ns(128 * 1024) + 52 * kMs);
}

// Two sizes of one class (two DDP buckets: the first overlaps the backward pass, the last does
// not) keep estimates of their own; a size not seen yet starts from its class's.
TEST(BoundedGroup, EachMessageSizeHasItsOwnEstimate) {
  BoundedGroup g(calib(20));
  for (int i = 0; i < 20; ++i) g.on_complete(step(kMiB, kMiB, 60 * kMs, RecvEnd::kAll, false));
  ASSERT_EQ(g.tb_ns(kMiB), 60 * kMs);
  const uint64_t slow = kMiB + 4096, fast = kMiB + 8192;
  for (int i = 0; i < 40; ++i) {
    g.on_complete(step(slow, slow, 30 * kMs, RecvEnd::kAll, true));
    g.on_complete(step(fast, fast, 5 * kMs, RecvEnd::kAll, true));
  }
  EXPECT_NEAR(static_cast<double>(g.tc_ns(slow)), 30.0 * kMs, 0.5 * kMs);
  EXPECT_NEAR(static_cast<double>(g.tc_ns(fast)), 5.0 * kMs, 0.5 * kMs);
  EXPECT_GT(g.budget_ns(slow), 40 * kMs);  // the slow bucket is not cut at the fast one's pace
  EXPECT_LT(g.budget_ns(fast), 10 * kMs);  // nor the fast one waited for at the slow one's
  const uint64_t fresh = kMiB + 12288;
  EXPECT_GT(g.tc_ns(fresh), g.tc_ns(fast));
  EXPECT_LT(g.tc_ns(fresh), g.tc_ns(slow));
  // Peers' estimates count for their own size.
  for (int i = 0; i < 15; ++i) g.on_peer_estimate(50'000, slow);
  EXPECT_EQ(g.tc_ns(slow), 50 * kMs);
  EXPECT_NEAR(static_cast<double>(g.tc_ns(fast)), 5.0 * kMs, 0.5 * kMs);
}

// With OPTIREDUCE_TIMEOUT_MS the user set what a step may cost whatever the reason: a late
// sender is waited for that long, not longer.
TEST(BoundedGroup, AFixedTimeoutIsTheStartAllowance) {
  Config c;
  c.timeout_ms = 50;
  BoundedGroup g(c);
  for (int i = 0; i < 30; ++i) {
    StepReport late = step(kMiB, kMiB, 45 * kMs, RecvEnd::kAll, true);
    late.network_ns = kMs;
    g.on_complete(late);
  }
  EXPECT_EQ(g.start_allowance_ns(kMiB), 50 * kMs);
}

// The loss governor (transport/loss_governor.h): a burst of background traffic makes several
// steps in a row slower than tB; each one cut there would lose most of its bytes. The stretch
// integrates each started step's lost fraction minus the target, so it settles where the
// long-run loss is the target.
Config governed(int steps) {
  Config c = calib(steps);
  c.loss_target = Config().loss_target;
  return c;
}

TEST(LossGovernor, MovesByEachStepsLossMinusTheTargetWithinItsBounds) {
  LossGovernor g(0.01);
  g.on_step(1000, 500);  // lost half
  EXPECT_DOUBLE_EQ(g.stretch(), std::exp(0.49));
  g.on_step(1000, 800);  // lost a fifth
  EXPECT_DOUBLE_EQ(g.stretch(), std::exp(0.49) * std::exp(0.19));
  const double held = g.stretch();
  g.on_step(1000, 990);  // lost the target: holds
  EXPECT_DOUBLE_EQ(g.stretch(), held);
  g.on_step(1000, 1000);  // lost nothing: gives the target back
  EXPECT_DOUBLE_EQ(g.stretch(), held * std::exp(-0.01));
  for (int i = 0; i < 10; ++i) g.on_step(1000, 0);
  EXPECT_DOUBLE_EQ(g.stretch(), LossGovernor::kMaxStretch);
  // From the ceiling back to 1 takes ln 4 / 0.01 = 139 steps that lose nothing.
  for (int i = 0; i < 130; ++i) g.on_step(1000, 1000);
  EXPECT_GT(g.stretch(), 1.05);
  for (int i = 0; i < 10; ++i) g.on_step(1000, 1000);
  EXPECT_DOUBLE_EQ(g.stretch(), 1.0);
  LossGovernor off(1.0);
  off.on_step(1000, 0);
  EXPECT_DOUBLE_EQ(off.stretch(), 1.0);
}

// Slow steps far apart (one in 20 needs 3x the budget, the rest fit): the old rule gave the
// stretch back between them and lost 2/3 of every slow step (3.3% of all bytes against a 1%
// target). The integral law settles where the loss averages the target: a slow step loses a
// fifth (20 x 1%), at a stretch of 2.4.
TEST(LossGovernor, SparseSlowStepsLoseTheTargetOnAverage) {
  const double target = 0.01;
  LossGovernor g(target);
  double lost = 0;
  int steps = 0;
  for (int i = 0; i < 20000; ++i) {
    const bool slow = i % 20 == 0;
    const double got = slow ? std::min(1.0, g.stretch() / 3.0) : 1.0;
    if (i >= 10000) {  // after it settled
      lost += 1.0 - got;
      ++steps;
    }
    g.on_step(1'000'000, static_cast<uint64_t>(got * 1'000'000));
  }
  EXPECT_NEAR(lost / steps, target, target * 0.1);
  EXPECT_NEAR(g.stretch(), 2.4, 0.1);
}

TEST(BoundedGroup, ABurstStretchesTheBudgetAndQuietStepsGiveItBack) {
  BoundedGroup g(governed(20));
  for (int i = 0; i < 20; ++i) g.on_complete(step(kMiB, kMiB, 10 * kMs, RecvEnd::kAll, false));
  ASSERT_EQ(g.tb_ns(kMiB), 10 * kMs);
  for (int i = 0; i < 20; ++i) g.on_complete(step(kMiB, kMiB, 8 * kMs, RecvEnd::kAll, true));
  const uint64_t quiet = g.budget_ns(kMiB);
  EXPECT_EQ(quiet, 10 * kMs);  // 1.5 x 8 ms, capped at tB
  // A burst: the link gives a third of its rate. Three receives cut at tB with a third of
  // their bytes (one TAR phase of 4 ranks) stretch the budget past the 24 ms a step now needs.
  for (int i = 0; i < 3; ++i)
    g.on_complete(step(kMiB, kMiB / 3, 10 * kMs, RecvEnd::kDeadline, true));
  EXPECT_GE(g.budget_ns(kMiB), 24 * kMs);
  EXPECT_LE(g.budget_ns(kMiB), 4 * quiet);
  EXPECT_NEAR(g.stats().stretch, g.budget_ns(kMiB) / static_cast<double>(quiet), 1e-6);
  // The rest of the burst delivers in full, in the stretched time: the stretch still covers it.
  for (int i = 0; i < 10; ++i) g.on_complete(step(kMiB, kMiB, 24 * kMs, RecvEnd::kAll, true));
  EXPECT_GE(g.budget_ns(kMiB), 24 * kMs);
  // After the burst, quiet steps give the stretch back, 0.5% each (the default target).
  for (int i = 0; i < 400; ++i) g.on_complete(step(kMiB, kMiB, 8 * kMs, RecvEnd::kAll, true));
  EXPECT_EQ(g.budget_ns(kMiB), quiet);
  EXPECT_DOUBLE_EQ(g.stats().stretch, 1.0);
}

TEST(BoundedGroup, LossUnderTheTargetStretchesNothing) {
  BoundedGroup g(governed(20));
  for (int i = 0; i < 20; ++i) g.on_complete(step(kMiB, kMiB, 10 * kMs, RecvEnd::kAll, false));
  const uint64_t before = g.budget_ns(kMiB);
  const uint64_t almost = kMiB - kMiB / 256;  // 0.4% lost, under the default 0.5%
  for (int i = 0; i < 20; ++i)
    g.on_complete(step(kMiB, almost, 10 * kMs, RecvEnd::kDeadline, true));
  EXPECT_EQ(g.budget_ns(kMiB), before);
}

// A straggler (a sender that never started) is the start allowance's: stretching for it would
// make every straggler cost the others more. Nor does a bound the user fixed ever stretch.
TEST(BoundedGroup, StragglersAndFixedTimeoutsStretchNothing) {
  BoundedGroup g(governed(20));
  for (int i = 0; i < 20; ++i) g.on_complete(step(kMiB, kMiB, 10 * kMs, RecvEnd::kAll, false));
  const uint64_t before = g.budget_ns(kMiB);
  for (int i = 0; i < 20; ++i) g.on_complete(step(kMiB, 0, 30 * kMs, RecvEnd::kDeadline, true));
  EXPECT_EQ(g.budget_ns(kMiB), before);
  Config c;
  c.timeout_ms = 10;
  BoundedGroup fixed(c);
  for (int i = 0; i < 20; ++i)
    fixed.on_complete(step(kMiB, kMiB / 2, 10 * kMs, RecvEnd::kDeadline, true));
  EXPECT_EQ(fixed.budget_ns(kMiB), 10 * kMs);
}

// The policy on real connections over the in-memory link.
struct Rig {
  FakeClock clock;
  Config cfg;
  std::unique_ptr<BoundedGroup> group;
  testing::MemEndpoint* tx_ep;
  std::unique_ptr<SendConn> s;
  std::unique_ptr<RecvConn> r;
  explicit Rig(int calibration_steps, double early_fraction = Config().early_fraction) {
    cfg.calibration_steps = calibration_steps;
    cfg.early_fraction = early_fraction;
    cfg.timeout_headroom = 1.0;
    group = std::make_unique<BoundedGroup>(cfg);
    auto p = testing::make_mem_pair(1048);
    tx_ep = p.a.get();
    ConnParams cp;
    cp.token = 99;
    cp.pkt_payload = payload_for_datagram(1048);
    cp.peer_window = 1 << 20;
    cp.delivery = Delivery::kBounded;
    s = std::make_unique<SendConn>(cfg, clock, std::move(p.a), cp, nullptr);
    r = std::make_unique<RecvConn>(cfg, clock, std::move(p.b), cp, nullptr);
    r->set_deadline_policy(group.get());
    s->set_group(group.get());
  }
  // The sender sends as it closes; a test's policy may capture locals declared after the rig.
  ~Rig() {
    if (s) tx_ep->policy = nullptr;  // the endpoint lives as long as the connection
  }
};

// Tests both requests (and serves the sender) until both are done, advancing the clock by
// `step_us` per round.
::testing::AssertionResult run_both(Rig& rig, Request* sr, Request* rr, int rounds,
                                    uint64_t step_us) {
  bool sd = false, rd = false;
  size_t sz;
  for (int i = 0; i < rounds && !(sd && rd); ++i) {
    if (!sd && !rig.s->test(sr, &sd, &sz).is_ok()) return ::testing::AssertionFailure() << "send";
    if (!rd && !rig.r->test(rr, &rd, &sz).is_ok()) return ::testing::AssertionFailure() << "recv";
    rig.s->poll();
    rig.clock.advance_us(step_us);
  }
  if (!(sd && rd)) return ::testing::AssertionFailure() << "not done after " << rounds << " rounds";
  return ::testing::AssertionSuccess();
}

TEST(BoundedConn, CalibrationStepsRunExactThenBounded) {
  // Repairs here take a few 100 us polling rounds; the early timeout's quiet period must be
  // longer than that (it is in a real network: a tenth of a step against a few RTTs).
  Rig rig(3, 0.5);
  int drop_next = 0;
  rig.tx_ep->policy = [&](const std::vector<uint8_t>& d) {
    PacketHeader h;
    decode(d.data(), d.size(), &h);
    return (h.type == PacketType::kData && !(h.flags & kFlagRetx) && drop_next++ % 3 == 0) ? 0 : 1;
  };
  std::vector<uint8_t> src(20'000, 0xAB);
  for (int step = 0; step < 5; ++step) {
    std::vector<uint8_t> dst(src.size(), 0);
    Request *sr, *rr;
    ASSERT_TRUE(rig.r->irecv(dst.data(), dst.size(), &rr).is_ok());
    ASSERT_TRUE(rig.s->isend(src.data(), src.size(), &sr).is_ok());
    ASSERT_TRUE(run_both(rig, sr, rr, 100000, 100)) << step;
    // Calibration steps are exact; bounded ones repair what the deadline leaves time for,
    // which here (a loss-free-looking RTT, a deadline of whole calibration steps) is all.
    EXPECT_EQ(src, dst) << "step " << step;
  }
  EXPECT_FALSE(rig.group->calibrating());
  EXPECT_EQ(rig.r->stats().bytes_lost, 0u);
  EXPECT_GT(rig.s->stats().repaired_pkts, 0u);
  EXPECT_EQ(rig.group->stats().bounded_steps, 2u);
}

// Bounded packets are acknowledged and leave within the path's window, as exact ones do: the
// rate follows the network during bounded steps instead of a figure frozen at calibration.
TEST(BoundedConn, BoundedPacketsStayWithinThePathWindow) {
  Rig rig(3);
  std::vector<uint8_t> src(1 << 20, 0x5A);
  std::vector<uint8_t> dst(src.size());
  for (int step = 0; step < 4; ++step) {
    Request *sr, *rr;
    ASSERT_TRUE(rig.r->irecv(dst.data(), dst.size(), &rr).is_ok());
    ASSERT_TRUE(rig.s->isend(src.data(), src.size(), &sr).is_ok());
    bool sd = false, rd = false;
    size_t sz;
    uint64_t most = 0;
    for (int i = 0; i < 100000 && !(sd && rd); ++i) {
      if (!sd) {
        ASSERT_TRUE(rig.s->test(sr, &sd, &sz).is_ok());
      }
      if (!rd) {
        ASSERT_TRUE(rig.r->test(rr, &rd, &sz).is_ok());
      }
      const PathSnapshot p = rig.s->path()->snapshot();
      EXPECT_LE(p.inflight, p.window + 32 * 1000) << "one batch beyond the window at most";
      most = std::max(most, p.inflight);
      rig.clock.advance_us(100);
    }
    ASSERT_TRUE(sd && rd) << step;
    EXPECT_EQ(src, dst);
    EXPECT_GT(most, 0u);
  }
  ASSERT_FALSE(rig.group->calibrating());
  EXPECT_EQ(rig.group->stats().bounded_steps, 1u);
  EXPECT_EQ(rig.s->path()->snapshot().inflight, 0u);
}

// The sender's side of the skew on real connections: its receiver asked 30 ms before the send
// came, and the sender's group (its own here, so that the receiver's samples stay out of it)
// learns 30 ms from the CTS that waited, with no receive of its own on the connection.
TEST(BoundedConn, ASenderLearnsItsLatenessFromTheCtsThatWaited) {
  Rig rig(0);
  BoundedGroup sender_group(rig.cfg);
  rig.s->set_group(&sender_group);
  std::vector<uint8_t> src(20'000, 0x3C);
  const uint64_t before = sender_group.start_allowance_ns(src.size());
  for (int step = 0; step < 3; ++step) {
    std::vector<uint8_t> dst(src.size());
    Request *sr, *rr;
    ASSERT_TRUE(rig.r->irecv(dst.data(), dst.size(), &rr).is_ok());
    rig.s->poll();  // the CTS arrives
    rig.clock.advance_ms(30);
    ASSERT_TRUE(rig.s->isend(src.data(), src.size(), &sr).is_ok());
    ASSERT_TRUE(run_both(rig, sr, rr, 1000, 10)) << step;
    EXPECT_EQ(src, dst);
  }
  EXPECT_EQ(sender_group.start_allowance_ns(src.size()), before + 60 * kMs);
}

// The receiver's side of a straggler on real connections: it cuts a step whose sender has not
// started, counts it as exactly as late as it waited, and learns the real lateness from the
// sender's first packet after the cut: its notice that it found the step ended (whether it
// heard so before posting the send or only after, from the CTS, FINAL and floor that waited
// for it together). A step of 8 chunks, NCCL's way, is learned through its first chunk, the one
// the policy counted.
TEST(BoundedConn, AReceiverLearnsHowLateTheSenderItCutWas) {
  struct Case {
    bool floor_first;
    int chunks;
  };
  for (const Case c : {Case{true, 1}, Case{false, 1}, Case{true, 8}}) {
    SCOPED_TRACE(::testing::Message()
                 << (c.floor_first ? "the sender knew the step ended" : "it heard so after posting")
                 << ", " << c.chunks << " chunks");
    Rig rig(0);
    std::vector<uint8_t> src(20'000, 0x3C);
    std::vector<std::vector<uint8_t>> dst(c.chunks, std::vector<uint8_t>(src.size()));
    Request *sr, *rr;
    // Steps on time: the allowance is the budget. Between steps the ranks compute (10 ms), so
    // each step's receive starts a burst and its start delay is a skew sample.
    for (int warm = 0; warm < 3; ++warm) {
      rig.clock.advance_ms(10);
      ASSERT_TRUE(rig.r->irecv(dst[0].data(), src.size(), &rr).is_ok());
      ASSERT_TRUE(rig.s->isend(src.data(), src.size(), &sr).is_ok());
      ASSERT_TRUE(run_both(rig, sr, rr, 1000, 10));
    }
    const uint64_t allowance = rig.group->start_allowance_ns(src.size());
    ASSERT_LT(allowance, 100 * kMs);
    // The sender straggles: the step's receives are cut.
    rig.clock.advance_ms(10);
    const uint64_t cut_at = rig.clock.now_ns();
    std::vector<Request*> cut(c.chunks);
    for (int k = 0; k < c.chunks; ++k)
      ASSERT_TRUE(rig.r->irecv(dst[k].data(), src.size(), &cut[k]).is_ok());
    size_t sz;
    for (int k = 0; k < c.chunks; ++k) {
      bool done = false;
      for (int i = 0; i < 100000 && !done; ++i) {
        ASSERT_TRUE(rig.r->test(cut[k], &done, &sz).is_ok());
        rig.clock.advance_us(100);
      }
      ASSERT_TRUE(done) << k;
      EXPECT_EQ(cut[k]->outcome.end, static_cast<uint8_t>(RecvEnd::kDeadline)) << k;
    }
    // Counted as a bound, one cut in four samples is their P95: the allowance doubles.
    EXPECT_GT(rig.group->start_allowance_ns(src.size()), allowance);
    // The next receive (the next phase) waits, and is cut too; its CTS carries the floor.
    Request* next;
    ASSERT_TRUE(rig.r->irecv(dst[0].data(), src.size(), &next).is_ok());
    bool done = false;
    while (rig.clock.now_ns() < cut_at + 2000 * kMs) {
      if (!done) {
        ASSERT_TRUE(rig.r->test(next, &done, &sz).is_ok());
      }
      rig.clock.advance_ms(1);
    }
    ASSERT_TRUE(done);
    // 2 s after the step began, the sender comes, and posts the step and the next phase.
    if (c.floor_first) rig.s->poll();
    for (int k = 0; k <= c.chunks; ++k)
      ASSERT_TRUE(rig.s->isend(src.data(), src.size(), &sr).is_ok());
    for (int i = 0; i < 100; ++i) {
      rig.r->poll();
      rig.s->poll();
      rig.clock.advance_us(10);
    }
    EXPECT_GE(rig.group->stats().late_senders, 1u);
    // 2 s is beyond the cap: the samples leave the ring, and the allowance is what it was.
    EXPECT_EQ(rig.group->start_allowance_ns(src.size()), allowance);
  }
}

// A straggler that hears of its cut step only through the FINAL (the receiver posted nothing
// after it, as after a collective's last step) sends none of it: the FINAL's floor is past the
// step, so the send that comes 2 s late expires at once and tells the receiver how late it was.
TEST(BoundedConn, AStragglerThatReadsOnlyTheFinalSendsNoneOfItsCutStep) {
  Rig rig(0);
  std::vector<uint8_t> src(20'000, 0x3C);
  std::vector<uint8_t> dst(src.size());
  Request *sr, *rr;
  size_t sz;
  for (int warm = 0; warm < 3; ++warm) {
    rig.clock.advance_ms(10);
    ASSERT_TRUE(rig.r->irecv(dst.data(), dst.size(), &rr).is_ok());
    ASSERT_TRUE(rig.s->isend(src.data(), src.size(), &sr).is_ok());
    ASSERT_TRUE(run_both(rig, sr, rr, 1000, 10));
  }
  rig.clock.advance_ms(10);
  ASSERT_TRUE(rig.r->irecv(dst.data(), dst.size(), &rr).is_ok());
  bool done = false;
  for (int i = 0; i < 100000 && !done; ++i) {
    ASSERT_TRUE(rig.r->test(rr, &done, &sz).is_ok());
    rig.clock.advance_us(100);
  }
  ASSERT_TRUE(done);
  ASSERT_EQ(rr->outcome.end, static_cast<uint8_t>(RecvEnd::kDeadline));
  int data_sent = 0;
  rig.tx_ep->policy = [&](const std::vector<uint8_t>& d) {
    PacketHeader h;
    decode(d.data(), d.size(), &h);
    if (h.type == PacketType::kData && !(h.flags & kFlagExpired)) ++data_sent;
    return 1;
  };
  rig.clock.advance_ms(2000);
  rig.s->poll();  // the CTS and the FINAL, and nothing after them
  ASSERT_TRUE(rig.s->isend(src.data(), src.size(), &sr).is_ok());
  bool sent = false;
  for (int i = 0; i < 100 && !sent; ++i) {
    ASSERT_TRUE(rig.s->test(sr, &sent, &sz).is_ok());
    rig.r->poll();
    rig.clock.advance_us(10);
  }
  EXPECT_TRUE(sent);
  EXPECT_EQ(data_sent, 0);
  EXPECT_EQ(rig.s->stats().expired_sends, 1u);
  rig.r->poll();
  EXPECT_EQ(rig.group->stats().late_senders, 1u);
}

TEST(BoundedConn, EarlyTimeoutAfterTailPackets) {
  Rig rig(1);
  std::vector<uint8_t> src(100'000, 0x11);
  {  // one exact calibration step of 50 ms
    std::vector<uint8_t> dst(src.size());
    Request *sr, *rr;
    ASSERT_TRUE(rig.r->irecv(dst.data(), dst.size(), &rr).is_ok());
    rig.clock.advance_ms(50);
    ASSERT_TRUE(rig.s->isend(src.data(), src.size(), &sr).is_ok());
    ASSERT_TRUE(run_both(rig, sr, rr, 100, 0));
  }
  ASSERT_FALSE(rig.group->calibrating());
  // Lose one packet in the middle, and every repair of it; the tail arrives, so the step
  // closes after early_fraction x tC (0.1 x 50 ms = 5 ms), well before the 50 ms deadline.
  rig.tx_ep->policy = [&](const std::vector<uint8_t>& d) {
    PacketHeader h;
    decode(d.data(), d.size(), &h);
    return (h.type == PacketType::kData && h.offset == 40'000) ? 0 : 1;
  };
  std::vector<uint8_t> dst(src.size());
  Request *sr, *rr;
  ASSERT_TRUE(rig.r->irecv(dst.data(), dst.size(), &rr).is_ok());
  ASSERT_TRUE(rig.s->isend(src.data(), src.size(), &sr).is_ok());
  bool done = false, sdone = false;
  size_t sz;
  uint64_t t0 = rig.clock.now_ns();
  for (int i = 0; i < 10000 && !done; ++i) {
    ASSERT_TRUE(rig.s->test(sr, &sdone, &sz).is_ok());
    ASSERT_TRUE(rig.r->test(rr, &done, &sz).is_ok());
    rig.clock.advance_us(10);
  }
  ASSERT_TRUE(done);
  const uint64_t took = rig.clock.now_ns() - t0;
  EXPECT_GE(took, 5 * kMs);
  EXPECT_LT(took, 7 * kMs);
  rig.s->poll();  // the receiver's FINAL ends the send
  ASSERT_TRUE(rig.s->test(sr, &sdone, &sz).is_ok());
  EXPECT_TRUE(sdone);
  EXPECT_EQ(rig.r->stats().early_timeouts, 1u);
  EXPECT_EQ(rig.r->stats().bytes_lost, 1000u);
}

}  // namespace
}  // namespace optireduce
