// The shard plan of Transpose AllReduce and the incast round schedule: pure arithmetic, shared
// by the host and GPU paths and usable from device code.
//
// Vocabulary (docs and code use it verbatim): a *bucket* is the `count` elements of one
// allreduce call; it is cut into N contiguous *shards*, shard k owned (reduced) by rank k; each
// phase is split into *rounds*, each round admitting `incast` senders per receiver.
#pragma once

#include <cstddef>
#include <cstdint>

#include "collectives/math.h"

namespace optireduce::coll {

// Shard k covers [offset(k), offset(k) + length(k)). Shards start on multiples of kUnit
// elements, so that a shard is as aligned as the bucket itself (a GPU allocation: 256 bytes):
// the kernels that reduce and fill shards take their 16-byte vector path only for aligned
// pointers, and with shards cut anywhere most calls fell back to one element at a time. The
// bucket is cut into units of kUnit elements (the last one short when count is not a multiple),
// dealt out as evenly as they go: the first (units % N) shards get one unit more, and only the
// last non-empty shard may be short. Any count works, including count < kUnit * N (then the
// trailing shards are empty). Shards differ by at most kUnit elements.
struct ShardPlan {
  static constexpr uint64_t kUnit = 16;  // 32 bytes of fp16/bf16, 64 of fp32, 128 of fp64

  uint64_t count = 0;
  int nranks = 1;

  OR_HD uint64_t units() const { return (count + kUnit - 1) / kUnit; }
  OR_HD uint64_t offset(int k) const {
    const uint64_t kk = uint64_t(k), n = uint64_t(nranks);
    const uint64_t base = units() / n, extra = units() % n;
    const uint64_t at = (kk * base + (kk < extra ? kk : extra)) * kUnit;
    return at < count ? at : count;
  }
  OR_HD uint64_t length(int k) const { return offset(k + 1) - offset(k); }
  // The first shard is never shorter than another.
  OR_HD uint64_t max_length() const { return length(0); }
};

// Rounds of one phase with incast I (1 <= I <= N-1): ceil((N-1)/I) rounds. In round q, rank i
// sends to ranks i + q*I + 1 .. i + q*I + I (mod N) and receives from i - q*I - 1 .. i - q*I - I
// (mod N); the last round may be shorter. Every ordered pair meets exactly once per phase.
struct RoundPlan {
  int nranks = 1;
  int incast = 1;

  OR_HD int rounds() const { return nranks <= 1 ? 0 : (nranks - 2) / incast + 1; }
  // Peers of round q: distances d = q*I + 1 .. min(q*I + I, N-1).
  OR_HD int first_distance(int q) const { return q * incast + 1; }
  OR_HD int last_distance(int q) const {
    const int d = q * incast + incast;
    return d < nranks - 1 ? d : nranks - 1;
  }
  OR_HD int send_peer(int rank, int distance) const { return (rank + distance) % nranks; }
  OR_HD int recv_peer(int rank, int distance) const {
    return ((rank - distance) % nranks + nranks) % nranks;
  }
};

// Clamps a requested incast into [1, N-1]; 0 or negative means "all at once" (N-1).
OR_HD int clamp_incast(int requested, int nranks) {
  const int max = nranks > 1 ? nranks - 1 : 1;
  if (requested <= 0 || requested > max) return max;
  return requested;
}

}  // namespace optireduce::coll
