// RttEstimator: smoothing, clamping, backoff.
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace optireduce
