// Tests of collectives/shard_plan.h: shards tile the bucket for every count and N (count < N
// included), lengths differ by at most one, and every ordered pair meets once per phase.
#include "collectives/shard_plan.h"

#include <gtest/gtest.h>

#include <set>
#include <vector>

namespace optireduce::coll {
namespace {

TEST(ShardPlan, TilesTheBucketForAllSmallCountsAndRanks) {
  for (int n = 1; n <= 17; ++n) {
    for (uint64_t count = 0; count <= 70; ++count) {
      const ShardPlan p{count, n};
      uint64_t next = 0;
      for (int k = 0; k < n; ++k) {
        EXPECT_EQ(p.offset(k), next) << count << " " << n << " " << k;
        const uint64_t len = p.length(k);
        EXPECT_TRUE(len == count / n || len == count / n + 1);
        // The longer shards come first.
        EXPECT_EQ(len, count / n + (uint64_t(k) < count % n ? 1 : 0));
        EXPECT_LE(len, p.max_length());
        next += len;
      }
      EXPECT_EQ(next, count);
    }
  }
}

TEST(ShardPlan, CountBelowRanksGivesEmptyTrailingShards) {
  const ShardPlan p{3, 8};
  EXPECT_EQ(p.length(0), 1u);
  EXPECT_EQ(p.length(2), 1u);
  EXPECT_EQ(p.length(3), 0u);
  EXPECT_EQ(p.length(7), 0u);
  EXPECT_EQ(p.offset(7), 3u);
  EXPECT_EQ(p.max_length(), 1u);
}

TEST(ShardPlan, LargeCounts) {
  const uint64_t count = (uint64_t(1) << 40) + 5;
  const ShardPlan p{count, 7};
  EXPECT_EQ(p.offset(6) + p.length(6), count);
}

TEST(RoundPlan, RoundCountIsCeilOfPeersOverIncast) {
  for (int n = 2; n <= 12; ++n)
    for (int i = 1; i <= n - 1; ++i) {
      const RoundPlan rp{n, i};
      EXPECT_EQ(rp.rounds(), (n - 1 + i - 1) / i) << n << " " << i;
    }
  EXPECT_EQ((RoundPlan{1, 1}).rounds(), 0);
}

TEST(RoundPlan, EveryOrderedPairMeetsOnceAndSendsMatchReceives) {
  for (int n = 2; n <= 9; ++n) {
    for (int inc = 1; inc <= n - 1; ++inc) {
      const RoundPlan rp{n, inc};
      std::set<std::pair<int, int>> sent, received;
      for (int q = 0; q < rp.rounds(); ++q) {
        for (int r = 0; r < n; ++r) {
          for (int d = rp.first_distance(q); d <= rp.last_distance(q); ++d) {
            const int to = rp.send_peer(r, d), from = rp.recv_peer(r, d);
            EXPECT_NE(to, r);
            EXPECT_TRUE(sent.insert({r, to}).second);
            EXPECT_TRUE(received.insert({from, r}).second);
            // The receiver of (r -> to) admits r in the same round.
            EXPECT_EQ(rp.recv_peer(to, d), r);
          }
          EXPECT_LE(rp.last_distance(q) - rp.first_distance(q) + 1, inc);
        }
      }
      EXPECT_EQ(sent.size(), size_t(n * (n - 1)));
      EXPECT_EQ(sent, received);
    }
  }
}

TEST(RoundPlan, ClampIncast) {
  EXPECT_EQ(clamp_incast(0, 8), 7);
  EXPECT_EQ(clamp_incast(-1, 8), 7);
  EXPECT_EQ(clamp_incast(3, 8), 3);
  EXPECT_EQ(clamp_incast(99, 8), 7);
  EXPECT_EQ(clamp_incast(5, 2), 1);
  EXPECT_EQ(clamp_incast(0, 1), 1);
}

}  // namespace
}  // namespace optireduce::coll
