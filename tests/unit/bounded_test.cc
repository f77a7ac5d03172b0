// BoundedGroup: calibration of tB, adaptation of tC both ways, size scaling, the peers'
// median, early timeout; and the policy driving real connections (early timeout, calibration
// steps running exact).
#include <gtest/gtest.h>

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
  s.how = how;
  s.bounded = bounded;
  return s;
}

// Without headroom, so that tB is the calibration's P95 itself.
Config calib(int steps) {
  Config c;
  c.calibration_steps = steps;
  c.timeout_headroom = 1.0;
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
  // ... but never beyond the hard bound.
  for (int i = 0; i < 30; ++i) g.on_complete(step(kMiB, 0, 30 * kMs, RecvEnd::kDeadline, true));
  EXPECT_NEAR(static_cast<double>(g.tc_ns(kMiB)), 40.0 * kMs, 0.1 * kMs);
  EXPECT_LE(g.tc_ns(kMiB), 40 * kMs);
  EXPECT_EQ(g.budget_ns(kMiB), 40 * kMs);
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

// The policy on real connections over the in-memory link.
struct Rig {
  FakeClock clock;
  Config cfg;
  std::unique_ptr<BoundedGroup> group;
  testing::MemEndpoint* tx_ep;
  std::unique_ptr<SendConn> s;
  std::unique_ptr<RecvConn> r;
  explicit Rig(int calibration_steps) {
    cfg.calibration_steps = calibration_steps;
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
  Rig rig(3);
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
    if (step < 3) {
      EXPECT_EQ(src, dst) << "calibration steps are exact despite loss, step " << step;
    } else {
      EXPECT_NE(src, dst) << "bounded steps do not retransmit, step " << step;
    }
  }
  EXPECT_FALSE(rig.group->calibrating());
  EXPECT_GT(rig.r->stats().bytes_lost, 0u);
  EXPECT_EQ(rig.group->stats().bounded_steps, 2u);
}

TEST(BoundedConn, BoundedPacketsArePacedAtTheMeasuredDeliveryRate) {
  Rig rig(3);
  std::vector<uint8_t> src(1 << 20, 0x5A);
  std::vector<uint8_t> dst(src.size());
  // Three exact calibration steps, 100 us per polling round: the path delivers about one
  // congestion window per round, which the sender measures.
  for (int step = 0; step < 3; ++step) {
    Request *sr, *rr;
    ASSERT_TRUE(rig.r->irecv(dst.data(), dst.size(), &rr).is_ok());
    ASSERT_TRUE(rig.s->isend(src.data(), src.size(), &sr).is_ok());
    ASSERT_TRUE(run_both(rig, sr, rr, 100000, 100)) << step;
  }
  ASSERT_FALSE(rig.group->calibrating());
  // The first bounded step: one call must not put the whole megabyte on the wire at once.
  Request *sr, *rr;
  ASSERT_TRUE(rig.r->irecv(dst.data(), dst.size(), &rr).is_ok());
  const uint64_t before = rig.tx_ep->counters().tx_datagrams;
  ASSERT_TRUE(rig.s->isend(src.data(), src.size(), &sr).is_ok());
  bool done = false;
  size_t sz;
  ASSERT_TRUE(rig.s->test(sr, &done, &sz).is_ok());
  const uint64_t burst = rig.tx_ep->counters().tx_datagrams - before;
  const uint64_t npkts = (src.size() + 999) / 1000;
  EXPECT_FALSE(done);
  EXPECT_LT(burst, npkts / 2) << "bounded packets left in one burst";
  // ... and time lets the rest go.
  for (int i = 0; i < 100000 && !done; ++i) {
    rig.clock.advance_us(100);
    ASSERT_TRUE(rig.s->test(sr, &done, &sz).is_ok());
  }
  EXPECT_TRUE(done);
}

// The measured delivery rate is the rate while data is in flight: an application that computes
// between its calls (here 50 ms idle after each 1 MiB exact step) must not see its bounded
// packets paced at bytes / (busy + idle). It was: on loopback, bounded TAR then delivered 25%
// at 10x the exact call's time.
TEST(BoundedConn, IdleTimeBetweenCallsDoesNotSlowThePacing) {
  Rig rig(3);
  std::vector<uint8_t> src(1 << 20, 0x3C);
  std::vector<uint8_t> dst(src.size());
  uint64_t busy_ns = 0;
  for (int step = 0; step < 3; ++step) {
    Request *sr, *rr;
    ASSERT_TRUE(rig.r->irecv(dst.data(), dst.size(), &rr).is_ok());
    const uint64_t t0 = rig.clock.now_ns();
    ASSERT_TRUE(rig.s->isend(src.data(), src.size(), &sr).is_ok());
    ASSERT_TRUE(run_both(rig, sr, rr, 100000, 20)) << step;
    busy_ns = std::max(busy_ns, rig.clock.now_ns() - t0);
    rig.clock.advance_ms(50);
  }
  ASSERT_FALSE(rig.group->calibrating());
  Request *sr, *rr;
  ASSERT_TRUE(rig.r->irecv(dst.data(), dst.size(), &rr).is_ok());
  const uint64_t t0 = rig.clock.now_ns();
  ASSERT_TRUE(rig.s->isend(src.data(), src.size(), &sr).is_ok());
  bool done = false;
  size_t sz;
  while (!done && rig.clock.now_ns() - t0 < 1'000'000'000) {
    ASSERT_TRUE(rig.s->test(sr, &done, &sz).is_ok());
    if (!done) rig.clock.advance_us(20);
  }
  ASSERT_TRUE(done);
  // Paced at 1.25x the busy rate it takes about 0.8x the exact step; allow 1.5x.
  EXPECT_LE(rig.clock.now_ns() - t0, busy_ns * 3 / 2)
      << "exact step " << busy_ns / 1000 << " us";
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
  // Lose one packet in the middle; the tail arrives, so the step closes after
  // early_fraction x tC (0.1 x 50 ms = 5 ms), well before the 50 ms deadline.
  int k = 0;
  rig.tx_ep->policy = [&](const std::vector<uint8_t>& d) {
    PacketHeader h;
    decode(d.data(), d.size(), &h);
    return (h.type == PacketType::kData && k++ == 40) ? 0 : 1;
  };
  std::vector<uint8_t> dst(src.size());
  Request *sr, *rr;
  ASSERT_TRUE(rig.r->irecv(dst.data(), dst.size(), &rr).is_ok());
  ASSERT_TRUE(rig.s->isend(src.data(), src.size(), &sr).is_ok());
  bool done = false;
  size_t sz;
  // Bounded packets are paced: let them leave (10 us steps), the tail last.
  for (int i = 0; i < 1000 && !done; ++i) {
    ASSERT_TRUE(rig.s->test(sr, &done, &sz).is_ok());
    rig.clock.advance_us(10);
  }
  ASSERT_TRUE(done);
  done = false;
  ASSERT_TRUE(rig.r->test(rr, &done, &sz).is_ok());
  EXPECT_FALSE(done);
  rig.clock.advance_ms(4);
  ASSERT_TRUE(rig.r->test(rr, &done, &sz).is_ok());
  EXPECT_FALSE(done);
  rig.clock.advance_ms(2);
  ASSERT_TRUE(rig.r->test(rr, &done, &sz).is_ok());
  EXPECT_TRUE(done);
  EXPECT_EQ(rig.r->stats().early_timeouts, 1u);
  EXPECT_EQ(rig.r->stats().bytes_lost, 1000u);
}

}  // namespace
}  // namespace optireduce
