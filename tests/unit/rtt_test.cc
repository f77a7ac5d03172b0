// RttEstimator: smoothing, clamping, backoff and its end on progress, the 2 x srtt floor, the
// recent largest sample, upper bounds from packets sent twice.
// MinRttFilter: windowed minimum.
// LearnedWait: the waits that the receiver's reports of needless retransmissions teach.
#include <gtest/gtest.h>

#include "transport/learned_wait.h"
#include "transport/rtt.h"

namespace optireduce {
namespace {

TEST(RttEstimator, FirstSampleSetsSrttAndHalfVariance) {
  RttEstimator r(1000, 1'000'000, 50'000);
  EXPECT_FALSE(r.has_sample());
  EXPECT_EQ(r.rto_ns(), 50'000u);
  r.sample(10'000);
  EXPECT_EQ(r.srtt_ns(), 10'000u);
  EXPECT_EQ(r.rttvar_ns(), 5'000u);
  EXPECT_EQ(r.rto_ns(), 30'000u);
}

TEST(RttEstimator, ConvergesAndClampsToMinimum) {
  RttEstimator r(20'000, 1'000'000, 50'000);
  for (int i = 0; i < 100; ++i) r.sample(1'000);
  EXPECT_NEAR(static_cast<double>(r.srtt_ns()), 1'000, 50);
  EXPECT_EQ(r.rto_ns(), 20'000u);
}

TEST(RttEstimator, BackoffDoublesUpToMaximum) {
  RttEstimator r(1000, 100'000, 40'000);
  r.backoff();
  EXPECT_EQ(r.rto_ns(), 80'000u);
  r.backoff();
  EXPECT_EQ(r.rto_ns(), 100'000u);
}

// New data acknowledged after timeouts: the timeout is the samples' again, not the backed-off
// one (no sample may come while every packet in flight is a retransmission). Before any
// sample there is nothing to return to.
TEST(RttEstimator, ProgressEndsTheBackoff) {
  RttEstimator r(1000, 1'000'000'000, 40'000);
  r.on_progress();
  EXPECT_EQ(r.rto_ns(), 40'000u);
  r.sample(10'000);
  const uint64_t rto = r.rto_ns();
  r.backoff();
  r.backoff();
  EXPECT_EQ(r.rto_ns(), 4 * rto);
  r.on_progress();
  EXPECT_EQ(r.rto_ns(), rto);
}

// On a steady path rttvar decays to nearly nothing; the timeout stays at twice the smoothed
// RTT (above the absolute floor), whatever the RTT's scale.
TEST(RttEstimator, SteadyPathKeepsTwiceTheSmoothedRtt) {
  for (const uint64_t rtt : {10'000ull, 2'000'000ull}) {
    RttEstimator r(5'000, 200'000'000, 20'000'000);
    for (int i = 0; i < 200; ++i) r.sample(rtt);
    EXPECT_LE(r.rttvar_ns(), rtt / 100);
    EXPECT_EQ(r.rto_ns(), 2 * r.srtt_ns()) << rtt;
  }
}

// A receiver that pauses for 400 us every 60 packets of a 30 us path: between pauses the
// smoothed variation decays to almost nothing, and without the recent maximum the timeout fell
// to ~60 us, so the next pause timed out packets that were only waiting for it.
TEST(RttEstimator, AReceiversPausesKeepTheTimeoutAboveThem) {
  RttEstimator r(1'000, 1'000'000'000, 20'000'000);
  for (int round = 0; round < 5; ++round) {
    r.sample(400'000);
    for (int i = 0; i < 59; ++i) r.sample(30'000);
    EXPECT_GE(r.rto_ns(), 500'000u) << round;                           // 5/4 of the pause
    EXPECT_LT(2 * r.srtt_ns() + 4 * r.rttvar_ns(), 400'000u) << round;  // what RFC 6298 gives
  }
  // The pauses stop: within two windows the timeout is the path's again.
  for (uint32_t i = 0; i < 2 * RttEstimator::kMaxWindow; ++i) r.sample(30'000);
  EXPECT_LT(r.rto_ns(), 80'000u);
  EXPECT_EQ(r.recent_max_ns(), 30'000u);
}

// The ACK of a packet sent twice, timed from its first copy: an upper bound of the round trip.
// It lifts the timeout (to 5/4 of it, as the largest recent sample) and leaves the smoothed RTT
// alone; it never shortens a backed-off timeout, and before any sample it means nothing.
TEST(RttEstimator, ABoundLiftsTheTimeoutOnly) {
  RttEstimator r(1'000, 1'000'000'000, 20'000'000);
  r.sample_bound(10'000'000);
  EXPECT_EQ(r.rto_ns(), 20'000'000u);
  EXPECT_FALSE(r.has_sample());
  for (int i = 0; i < 100; ++i) r.sample(1'000'000);
  EXPECT_LT(r.rto_ns(), 2'100'000u);
  const uint64_t srtt = r.srtt_ns(), var = r.rttvar_ns();
  r.sample_bound(10'000'000);
  EXPECT_EQ(r.rto_ns(), 12'500'000u);
  EXPECT_EQ(r.srtt_ns(), srtt);
  EXPECT_EQ(r.rttvar_ns(), var);
  r.on_progress();  // what the samples say now includes the bound
  EXPECT_EQ(r.rto_ns(), 12'500'000u);
  r.backoff();
  r.sample_bound(1'000'000);
  EXPECT_EQ(r.rto_ns(), 25'000'000u);
  // Like any sample, it is forgotten within two windows of real ones.
  for (uint32_t i = 0; i < 2 * RttEstimator::kMaxWindow; ++i) r.sample(1'000'000);
  EXPECT_LT(r.rto_ns(), 2'100'000u);
}

TEST(MinRttFilter, KeepsTheSmallestRecentSampleAndForgetsOldOnes) {
  MinRttFilter f;
  EXPECT_FALSE(f.has_sample());
  f.sample(50'000);
  f.sample(10'000);   // a sender that was waiting: the RTT itself
  f.sample(900'000);  // one that posted late
  EXPECT_EQ(f.min_ns(), 10'000u);
  // The path's RTT grows: within two windows the old minimum is gone.
  for (uint32_t i = 0; i < 2 * MinRttFilter::kWindow; ++i) f.sample(40'000 + i);
  EXPECT_EQ(f.min_ns(), 40'000u + MinRttFilter::kWindow - 3);
  f.sample(0);  // below the clock's resolution: counted as 1 ns, never "no sample"
  EXPECT_EQ(f.min_ns(), 1u);
}

// A report lengthens the wait by one step at once, up to the most; only a whole run of quiet
// recoveries takes one off, and a report within the run starts the count again.
TEST(LearnedWait, ReportsLengthenAtOnceAndQuietRunsShortenOneStepEach) {
  LearnedWait w(2, 4, 3);
  EXPECT_EQ(w.steps(), 2u);
  w.on_quiet();
  EXPECT_EQ(w.steps(), 2u) << "never below the least";
  for (int i = 0; i < 5; ++i) w.on_needless();
  EXPECT_EQ(w.steps(), 4u) << "never above the most";
  w.on_quiet();
  w.on_quiet();
  w.on_needless();  // the run of quiet ones starts again
  w.on_quiet();
  w.on_quiet();
  EXPECT_EQ(w.steps(), 4u);
  w.on_quiet();
  EXPECT_EQ(w.steps(), 3u);
  for (int i = 0; i < 3; ++i) w.on_quiet();
  EXPECT_EQ(w.steps(), 2u);

  LearnedWait from_zero(0, 4, 2);  // none until taught: never below zero
  for (int i = 0; i < 4; ++i) from_zero.on_quiet();
  EXPECT_EQ(from_zero.steps(), 0u);
  from_zero.on_needless();
  EXPECT_EQ(from_zero.steps(), 1u);
  for (int i = 0; i < 6; ++i) from_zero.on_quiet();
  EXPECT_EQ(from_zero.steps(), 0u);
}

}  // namespace
}  // namespace optireduce
