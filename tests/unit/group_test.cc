// ConnGroup's rank-wide pacer: the group's measured delivery rate governs how fast bounded
// packets of all its connections may leave.
#include <gtest/gtest.h>

#include "transport/group.h"

namespace optireduce {
namespace {

TEST(ConnGroup, UnpacedUntilSomethingWasMeasured) {
  ConnGroup g;
  EXPECT_EQ(g.bounded_tokens(1'000), UINT64_MAX);
  g.add_delivered(1000, 1'000, 500'000);  // opens the first window only
  EXPECT_EQ(g.bounded_tokens(2'000), UINT64_MAX);
}

TEST(ConnGroup, SharedBucketFollowsTheAggregateDeliveryRate) {
  ConnGroup g;
  // Two connections together deliver 1 MB per ms (1 byte/ns) over a 1 ms window.
  g.add_delivered(0, 1'000'000, 1'000'000);
  g.add_delivered(500'000, 1'500'000, 1'000'000);
  g.add_delivered(500'000, 2'000'000, 1'000'000);
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
  g.add_delivered(0, 1'000'000, 1'000'000);
  g.add_delivered(1'000'000, 2'000'000, 1'000'000);  // 1 byte/ns
  g.add_delivered(0, 3'000'000, 1'000'000);          // an idle window: 0.9 byte/ns kept
  g.consume_bounded(g.bounded_tokens(3'000'000));
  EXPECT_NEAR(static_cast<double>(g.bounded_tokens(3'100'000)), 1.25 * 0.9 * 100'000, 2.0);
}

}  // namespace
}  // namespace optireduce
