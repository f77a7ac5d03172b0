// Tests of collectives/shard_plan.h: shards tile the bucket for every count and N (counts below
// a unit per rank included), start on whole units, differ by at most a unit, and every ordered
// pair meets once per phase.
#include "collectives/shard_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <vector>

namespace optireduce::coll {
namespace {

constexpr uint64_t kUnit = ShardPlan::kUnit;

TEST(ShardPlan, TilesTheBucketInWholeUnitsForAllSmallCountsAndRanks) {
  for (int n = 1; n <= 17; ++n) {
    for (uint64_t count = 0; count <= 3 * kUnit * 17 + 5; ++count) {
      const ShardPlan p{count, n};
      const uint64_t units = (count + kUnit - 1) / kUnit;
      uint64_t next = 0;
      for (int k = 0; k < n; ++k) {
        ASSERT_EQ(p.offset(k), next) << count << " " << n << " " << k;
        EXPECT_EQ(p.offset(k) % kUnit == 0 || p.offset(k) == count, true) << count << " " << k;
        const uint64_t len = p.length(k);
        // The first units % N shards get one unit more; only the last non-empty one is short.
        const uint64_t want = (units / n + (uint64_t(k) < units % n ? 1 : 0)) * kUnit;
        if (next + want <= count)
          EXPECT_EQ(len, want) << count << " " << n << " " << k;
        else
          EXPECT_EQ(len, count - next) << count << " " << n << " " << k;
        EXPECT_LE(len, p.max_length());
        next += len;
      }
      EXPECT_EQ(next, count);
    }
  }
}

TEST(ShardPlan, CountBelowAUnitPerRankGivesEmptyTrailingShards) {
  const ShardPlan p{3, 8};
  EXPECT_EQ(p.length(0), 3u);
  EXPECT_EQ(p.length(1), 0u);
  EXPECT_EQ(p.length(7), 0u);
  EXPECT_EQ(p.offset(7), 3u);
  EXPECT_EQ(p.max_length(), 3u);
  const ShardPlan q{3 * kUnit + 1, 8};  // four units: the last holds one element
  EXPECT_EQ(q.length(2), kUnit);
  EXPECT_EQ(q.length(3), 1u);
  EXPECT_EQ(q.length(4), 0u);
}

// A GPU bucket (256-byte aligned) of any dtype: every shard starts 16-byte aligned, which is
// what the kernels' vector path needs, and the shards stay within a unit of each other.
TEST(ShardPlan, ShardsOfAnAlignedBucketStayAligned) {
  for (uint64_t count : {uint64_t(1) << 20, (uint64_t(1) << 20) + 5, uint64_t(1000003)}) {
    for (int n : {2, 3, 4, 7, 8, 16}) {
      const ShardPlan p{count, n};
      uint64_t lo = count, hi = 0;
      for (int k = 0; k < n; ++k) {
        for (uint64_t es : {2u, 4u, 8u}) EXPECT_EQ(p.offset(k) * es % 16, 0u) << count << " " << n;
        if (k < n - 1) {
          lo = std::min(lo, p.length(k));
          hi = std::max(hi, p.length(k));
        }
      }
      EXPECT_LE(hi - lo, kUnit);
      EXPECT_LE(p.length(n - 1), hi);
    }
  }
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
