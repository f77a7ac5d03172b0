// ConnGroup's rank-wide pacer: the group's measured delivery rate governs how fast bounded
// packets of all its connections may leave. The measurement (DeliveryRate) counts only busy
// time and needs several ACKs per window.
#include <gtest/gtest.h>

#include "transport/group.h"

namespace optireduce {
namespace {

// One busy stretch as the group sees it: an ACK at t0 opens the window (its bytes are not
// counted), then `n` ACKs of bytes/n evenly until t1; the last says the connection went idle
// when `idle_at_end`.
void busy(ConnGroup& g, uint64_t t0, uint64_t t1, uint64_t bytes, int n, uint64_t window_ns,
          bool restart, bool idle_at_end) {
  g.add_delivered(0, t0, window_ns, restart, false);
  for (int i = 1; i <= n; ++i)
    g.add_delivered(bytes / n, t0 + (t1 - t0) * i / n, window_ns, false, idle_at_end && i == n);
}

// Bytes the shared bucket refills in 100 us, after draining it at `now`.
double refill_100us(ConnGroup& g, uint64_t now) {
  g.consume_bounded(g.bounded_tokens(now));
  return static_cast<double>(g.bounded_tokens(now + 100'000));
}

TEST(ConnGroup, UnpacedUntilSomethingWasMeasured) {
  ConnGroup g;
  EXPECT_EQ(g.bounded_tokens(1'000), UINT64_MAX);
  g.add_delivered(1000, 1'000, 500'000, false, false);  // opens the first window only
  EXPECT_EQ(g.bounded_tokens(2'000), UINT64_MAX);
}

TEST(ConnGroup, SharedBucketFollowsTheAggregateDeliveryRate) {
  ConnGroup g;
  // The connections together deliver 1 MB per ms (1 byte/ns) over a 1 ms window.
  busy(g, 1'000'000, 2'000'000, 1'000'000, 4, 1'000'000, false, false);
  // Burst first, then 1.25 bytes/ns.
  const uint64_t burst = g.bounded_tokens(2'000'000);
  EXPECT_EQ(burst, 256u * 1024);
  g.consume_bounded(burst);
  EXPECT_EQ(g.bounded_tokens(2'000'000), 0u);
  EXPECT_NEAR(static_cast<double>(g.bounded_tokens(2'100'000)), 125'000.0, 2.0);
  // Whoever consumes, everyone's share shrinks: one bucket for the rank.
  g.consume_bounded(100'000);
  EXPECT_NEAR(static_cast<double>(g.bounded_tokens(2'100'000)), 25'000.0, 2.0);
}

TEST(ConnGroup, SlowWindowsDecayTheEstimateGradually) {
  ConnGroup g;
  busy(g, 1'000'000, 2'000'000, 1'000'000, 4, 1'000'000, false, false);  // 1 byte/ns
  // The window goes on at 2'000'000: a slow one (0.1 byte/ns) keeps 0.9 of the estimate.
  for (int i = 1; i <= 4; ++i)
    g.add_delivered(25'000, 2'000'000 + i * 250'000, 1'000'000, false, false);
  EXPECT_NEAR(refill_100us(g, 3'000'000), 1.25 * 0.9 * 100'000, 2.0);
}

TEST(ConnGroup, ARestartLeavesTheIdleTimeOut) {
  ConnGroup g;
  busy(g, 1'000'000, 2'000'000, 1'000'000, 4, 1'000'000, false, false);  // 1 byte/ns
  // The connections come back after 50 ms of the application computing: the first ACK restarts
  // the window instead of closing one of 50 ms at 0.02 byte/ns (which would decay the estimate
  // to 0.9)...
  g.add_delivered(1'000'000, 52'000'000, 1'000'000, true, false);
  EXPECT_NEAR(refill_100us(g, 52'000'000), 1.25 * 1 * 100'000, 2.0);
  // ...and the busy time after it measures 2 bytes/ns.
  for (int i = 1; i <= 4; ++i)
    g.add_delivered(500'000, 52'000'000 + i * 250'000, 1'000'000, false, false);
  EXPECT_NEAR(refill_100us(g, 53'000'000), 1.25 * 2 * 100'000, 2.0);
}

TEST(ConnGroup, ABusyPeriodShorterThanTheWindowIsASample) {
  ConnGroup g;
  // A call's 1 MB is acknowledged within 1 ms, less than the 2 ms window, then the connection
  // is idle. The busy period itself is the sample: 1 byte/ns.
  busy(g, 1'000'000, 2'000'000, 1'000'000, 4, 2'000'000, true, true);
  EXPECT_NEAR(refill_100us(g, 2'000'000), 1.25 * 1 * 100'000, 2.0);
}

TEST(ConnGroup, AnAckBatchIsNoSample) {
  ConnGroup g;
  // Four ACKs handled in one batch, 2 us apart: 1 MB "in 8 us" says nothing about the path.
  busy(g, 1'000'000, 1'008'000, 1'000'000, 4, 500'000, true, true);
  EXPECT_EQ(g.bounded_tokens(1'100'000), UINT64_MAX);
}

TEST(ConnGroup, FewAcksAreNoSampleAndNeverStretchOverIdleTime) {
  ConnGroup g;
  // Two ACKs say little (the first one's bytes are not counted): no sample, still unpaced...
  busy(g, 1'000'000, 1'020'000, 1'000'000, 2, 500'000, true, true);
  EXPECT_EQ(g.bounded_tokens(1'100'000), UINT64_MAX);
  // ...and the next ACKs, 10 ms later without a restart flag (the next call's packets left
  // before the last ACK came back), do not close a 10 ms window over the pause: they open one.
  for (int i = 1; i <= 4; ++i)
    g.add_delivered(10'000, 11'000'000 + i * 1000, 500'000, false, false);
  EXPECT_EQ(g.bounded_tokens(11'100'000), UINT64_MAX);
}

}  // namespace
}  // namespace optireduce
