// Tests of collectives/shard_plan.h: shards tile the bucket for every count and N (counts below
// a unit per rank included), start on whole units, differ by at most a unit, and every ordered
// pair meets once per phase. And of block_progress.h: the pipelined encode and decode hand out
// every Hadamard block once, and a block only when the shards it needs are there.
#include "collectives/shard_plan.h"

#include "collectives/block_progress.h"
#include "tests/sanitized.h"

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

// The blocks that encoded elements [lo, hi) touch.
std::vector<uint64_t> blocks_touching(const HadamardGeometry& g, uint64_t lo, uint64_t hi) {
  std::vector<uint64_t> out;
  for (uint64_t b = 0, at = 0; b < g.blocks(); at += g.dim(b), ++b)
    if (at < hi && at + g.dim(b) > lo) out.push_back(b);
  return out;
}

// Runs fn(n, g, plan) over every combination of ranks, bucket sizes and block sizes: the
// geometries, shards and blocks cut independently, that the BlockProgress tests walk.
template <class F>
void for_each_geometry(std::initializer_list<int> ns, std::initializer_list<uint64_t> counts,
                       std::initializer_list<uint64_t> blocks, F&& fn) {
  for (int n : ns)
    for (uint64_t count : counts)
      for (uint64_t block : blocks) {
        const HadamardGeometry g{count, block};
        fn(n, g, ShardPlan{g.encoded(), n});
      }
}

TEST(BlockProgress, EncodingHandsOutEachBlockOnceAndAShardsBlocksBeforeItIsSent) {
  for_each_geometry(
      {2, 3, 4, 7, 8}, {1ull, 100ull, 4096ull, 4097ull, 30000ull, 65536ull * 3 + 5},
      {16ull, 1024ull, 4096ull}, [](int n, const HadamardGeometry& g, const ShardPlan& plan) {
        const uint64_t count = g.count;
        BlockProgress bp;
        bp.reset(plan, g);
        std::vector<int> handed(g.blocks(), 0);
        const int r = n / 2;  // the send order of rank r, then its own shard
        for (int d = 1; d <= n; ++d) {
          const int k = (r + d) % n;
          bp.take_shard(k, [&](uint64_t b0, uint64_t b1) {
            ASSERT_LT(b0, b1);
            for (uint64_t b = b0; b < b1; ++b) ++handed[b];
          });
          for (uint64_t b : blocks_touching(g, plan.offset(k), plan.offset(k) + plan.length(k)))
            ASSERT_EQ(handed[b], 1) << "n " << n << " count " << count << " shard " << k;
        }
        for (uint64_t b = 0; b < g.blocks(); ++b) ASSERT_EQ(handed[b], 1);
        bp.take_rest([&](uint64_t, uint64_t) { FAIL() << "nothing is left"; });
      });
}

// The own shard, encoded as the reduction gets to it (tar.cc, reduce_as_arrived): each call
// hands out what the prefix asked for and no more than the block that ends it, says how much of
// the shard is encoded (never less than asked), and every block still goes out exactly once.
TEST(BlockProgress, APrefixOfAShardHandsOutItsBlocksOnceAndSaysHowFarTheyReach) {
  for_each_geometry(
      {2, 3, 4, 7}, {100ull, 4097ull, 30000ull, 65536ull * 3 + 5}, {16ull, 1024ull, 4096ull},
      [](int n, const HadamardGeometry& g, const ShardPlan& plan) {
        const uint64_t count = g.count, block = g.block;
        BlockProgress bp;
        bp.reset(plan, g);
        std::vector<int> handed(g.blocks(), 0);
        const auto count_run = [&](uint64_t b0, uint64_t b1) {
          for (uint64_t b = b0; b < b1; ++b) ++handed[b];
        };
        const int r = n / 2;
        for (int d = 1; d < n; ++d) bp.take_shard((r + d) % n, count_run);
        const uint64_t off = plan.offset(r), len = plan.length(r);
        uint64_t last = 0;
        for (uint64_t want = 0;; want += 1 + want % 997) {
          const uint64_t got = bp.take_shard_prefix(r, want, count_run);
          const uint64_t asked = std::min(want, len);
          ASSERT_GE(got, asked);
          ASSERT_GE(got, last) << "the encoded prefix went back";
          ASSERT_LE(got, len);
          if (asked > 0) {  // no further than the block that holds the last element asked for
            const uint64_t end_block = ((off + asked - 1) / block + 1) * block;
            ASSERT_LE(off + got, std::max(end_block, off + last));
          }
          for (uint64_t b : blocks_touching(g, off, off + got))
            ASSERT_EQ(handed[b], 1) << "n " << n << " count " << count << " block " << b;
          last = got;
          if (want >= len) break;
        }
        EXPECT_EQ(last, len);
        for (uint64_t b = 0; b < g.blocks(); ++b) ASSERT_EQ(handed[b], 1) << b;
      });
}

TEST(BlockProgress, DecodingWaitsForEveryShardABlockOverlaps) {
  for_each_geometry(
      {2, 3, 4, 8}, {100ull, 4097ull, 30000ull, 65536ull * 3 + 5}, {16ull, 4096ull},
      [](int n, const HadamardGeometry& g, const ShardPlan& plan) {
        const uint64_t block = g.block;
        for (int skip : {-1, 0, n - 1}) {  // one shard never arrives (or none)
          BlockProgress bp;
          bp.reset(plan, g);
          std::vector<int> handed(g.blocks(), 0);
          std::vector<bool> here(size_t(n), false);
          auto check_run = [&](uint64_t b0, uint64_t b1) {
            for (uint64_t b = b0; b < b1; ++b) {
              ++handed[b];
              const uint64_t at = b * block;
              for (int k = 0; k < n; ++k) {
                if (plan.offset(k) < at + g.dim(b) && plan.offset(k) + plan.length(k) > at) {
                  ASSERT_TRUE(here[size_t(k)]) << "block " << b << " before shard " << k;
                }
              }
            }
          };
          for (int i = 0; i < n; ++i) {
            const int k = (i * 5 + 1) % n;  // every shard once, out of order (5 is prime to n)
            if (k == skip) continue;
            here[size_t(k)] = true;
            bp.shard_arrived(k, check_run);
          }
          std::set<uint64_t> waiting;  // the blocks of the shard that never came
          if (skip >= 0)
            for (uint64_t b :
                 blocks_touching(g, plan.offset(skip), plan.offset(skip) + plan.length(skip)))
              waiting.insert(b);
          for (uint64_t b = 0; b < g.blocks(); ++b)
            ASSERT_EQ(handed[b], waiting.count(b) ? 0 : 1) << "n " << n << " block " << b;
          bp.take_rest([&](uint64_t b0, uint64_t b1) {
            for (uint64_t b = b0; b < b1; ++b) ++handed[b];
          });
          for (uint64_t b = 0; b < g.blocks(); ++b) ASSERT_EQ(handed[b], 1);
        }
      });
}

// Shards arriving a prefix at a time, interleaved (phase 2's receives as the exchange reports
// them): a block is handed out only once every element of it is here, in each shard it
// overlaps, and as soon as that is so; each exactly once.
TEST(BlockProgress, ABlockDecodesOnceAllOfItHasArrivedAndNoSooner) {
  for_each_geometry(
      {2, 3, 4, 8}, {100ull, 4097ull, 30000ull, 65536ull * 3 + 5}, {16ull, 1024ull},
      [](int n, const HadamardGeometry& g, const ShardPlan& plan) {
        const uint64_t count = g.count, block = g.block;
        // Under a sanitizer the geometries of more than 4096 blocks stay out: the oracle below
        // checks every element of every block in each of 64 rounds, and the smaller ones take
        // the same paths (tests/sanitized.h).
        if (optireduce::testing::kSanitized && g.blocks() > 4096) return;
        BlockProgress bp;
        bp.reset(plan, g);
        std::vector<int> handed(g.blocks(), 0);
        std::vector<uint64_t> here(size_t(n), 0);
        // Whether all of block b is here, by the elements themselves.
        auto all_here = [&](uint64_t b) {
          for (uint64_t e = b * block; e < b * block + g.dim(b); ++e) {
            int k = n - 1;
            while (plan.offset(k) > e || plan.length(k) == 0) --k;
            if (e - plan.offset(k) >= here[size_t(k)]) return false;
          }
          return true;
        };
        auto check_run = [&](uint64_t b0, uint64_t b1) {
          ASSERT_LT(b0, b1);
          for (uint64_t b = b0; b < b1; ++b) {
            ++handed[b];
            ASSERT_TRUE(all_here(b)) << "n " << n << " count " << count << " block " << b;
          }
        };
        // Uneven pieces, the shards in turn, until every shard is whole.
        for (uint64_t round = 1; round < 64; ++round) {
          for (int k = 0; k < n; ++k) {
            here[size_t(k)] = std::min(plan.length(k), here[size_t(k)] + 37 * round + 11 * k);
            bp.shard_progress(k, here[size_t(k)], check_run);
          }
          for (uint64_t b = 0; b < g.blocks(); ++b)
            ASSERT_EQ(handed[b], all_here(b) ? 1 : 0) << "n " << n << " block " << b;
        }
        for (int k = 0; k < n; ++k) {
          here[size_t(k)] = plan.length(k);
          bp.shard_arrived(k, check_run);
        }
        for (uint64_t b = 0; b < g.blocks(); ++b) ASSERT_EQ(handed[b], 1);
      });
}

}  // namespace
}  // namespace optireduce::coll
