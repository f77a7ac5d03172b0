// CongestionWindow (slow start, AIMD, one cut per recovery epoch) and Pacer (token bucket).
#include <gtest/gtest.h>

#include "transport/pacer.h"

namespace optireduce {
namespace {

TEST(CongestionWindow, SlowStartThenCeiling) {
  CongestionWindow w(1000, 100'000);
  EXPECT_EQ(w.cwnd(), 64'000u);
  w.on_ack(30'000);
  EXPECT_EQ(w.cwnd(), 94'000u);
  w.on_ack(30'000);
  EXPECT_EQ(w.cwnd(), 100'000u);  // never above the peer's buffering
}

TEST(CongestionWindow, OneDecreasePerEpochAndAFloor) {
  CongestionWindow w(1000, 1'000'000);
  const uint64_t before = w.cwnd();
  w.on_loss(/*now=*/100, /*lost sent at=*/50);
  const uint64_t after = w.cwnd();
  EXPECT_EQ(after, static_cast<uint64_t>(before * 0.7));
  w.on_loss(110, 60);  // sent before the epoch began: same congestion event
  EXPECT_EQ(w.cwnd(), after);
  w.on_loss(200, 150);  // a new event
  EXPECT_LT(w.cwnd(), after);
  for (int i = 0; i < 50; ++i) w.on_timeout();
  EXPECT_EQ(w.cwnd(), 4'000u);
}

TEST(CongestionWindow, AdditiveIncreaseAboveSsthresh) {
  CongestionWindow w(1000, 1'000'000);
  w.on_loss(10, 5);  // ssthresh = cwnd = 44800
  const uint64_t c = w.cwnd();
  w.on_ack(c);  // one window acknowledged: about one packet more
  EXPECT_NEAR(static_cast<double>(w.cwnd()), static_cast<double>(c + 1000), 50);
}

TEST(Pacer, UnlimitedByDefault) {
  Pacer p;
  EXPECT_TRUE(p.unlimited());
  EXPECT_EQ(p.available(123), UINT64_MAX);
}

TEST(Pacer, RefillsAtRateUpToBurst) {
  Pacer p;
  p.set_rate(1.0, 10'000);  // 1 byte per ns = 8 Gbit/s
  EXPECT_EQ(p.available(1'000), 10'000u);
  p.consume(10'000);
  EXPECT_EQ(p.available(1'000), 0u);
  EXPECT_EQ(p.next_time_ns(1'000, 500), 1'501u);
  EXPECT_EQ(p.available(1'500), 500u);
  EXPECT_EQ(p.available(1'000'000), 10'000u);
}

}  // namespace
}  // namespace optireduce
