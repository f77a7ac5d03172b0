// Which Hadamard blocks of the encoded vector a pipelined TAR phase has dealt with (tar.cc).
//
// Why pipelined: encoding the whole bucket before the first send and decoding it after the last
// receive put both transforms on the critical path, a few milliseconds per call on a busy host
// (bench/lab: + Hadamard took 5 ms more than TAR without it at 4 MiB). Encoding shard by shard
// lets the first send leave after one shard's encode, and decoding what has arrived works
// while the rest is on the wire.
//
// The encoded vector is cut two ways that do not align: into shards (ShardPlan, one per rank)
// and into blocks (HadamardGeometry, the transform's unit). A block that straddles a shard
// boundary is encoded with the first shard that needs it, and decoded once every shard it
// overlaps is here. Each block is handed out exactly once per pass, so the results are the bits
// of one whole-vector encode and decode.
#pragma once

#include <cstdint>
#include <vector>

#include "collectives/kernels_host.h"
#include "collectives/shard_plan.h"

namespace optireduce::coll {

class BlockProgress {
 public:
  // Starts a pass: no block handed out, no shard here. Allocates only when the bucket grew.
  void reset(const ShardPlan& plan, const HadamardGeometry& g) {
    plan_ = plan;
    g_ = g;
    done_.assign(g.blocks(), 0);
    here_.assign(size_t(plan.nranks), 0);
  }

  // run(b0, b1) for each maximal run of blocks [b0, b1) that shard k overlaps and that no
  // earlier call handed out (encoding: the shard can be sent once these ran).
  template <class F>
  void take_shard(int k, F&& run) {
    const auto [b0, b1] = blocks_of(k);
    take(b0, b1, any_block, run);
  }

  // Shard k is here: run(b0, b1) for each maximal run of blocks not handed out yet that lie
  // wholly in shards that are here (decoding).
  template <class F>
  void shard_arrived(int k, F&& run) {
    here_[size_t(k)] = 1;
    const auto [b0, b1] = blocks_of(k);
    const auto ready = [this](uint64_t b) { return covered(b); };
    take(b0, b1, ready, run);
  }

  // run(b0, b1) for every block not handed out yet.
  template <class F>
  void take_rest(F&& run) {
    take(0, g_.blocks(), any_block, run);
  }

 private:
  static bool any_block(uint64_t) { return true; }
  struct Range {
    uint64_t first, last;  // blocks [first, last)
  };
  Range blocks_of(int k) const {
    const uint64_t off = plan_.offset(k), len = plan_.length(k);
    if (len == 0) return {0, 0};
    return {off / g_.block, (off + len - 1) / g_.block + 1};
  }
  // The shard that holds encoded element e (< plan.count): the last one starting at or before it.
  int shard_of(uint64_t e) const {
    int lo = 0, hi = plan_.nranks - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (plan_.offset(mid) <= e)
        lo = mid;
      else
        hi = mid - 1;
    }
    return lo;
  }
  bool covered(uint64_t b) const {
    const uint64_t first = b * g_.block;
    const int lo = shard_of(first), hi = shard_of(first + g_.dim(b) - 1);
    for (int k = lo; k <= hi; ++k)
      if (!here_[size_t(k)]) return false;
    return true;
  }
  template <class Ready, class F>
  void take(uint64_t b0, uint64_t b1, Ready&& ready, F&& run) {
    uint64_t b = b0;
    while (b < b1) {
      if (done_[b] || !ready(b)) {
        ++b;
        continue;
      }
      const uint64_t start = b;
      while (b < b1 && !done_[b] && ready(b)) done_[b++] = 1;
      run(start, b);
    }
  }

  ShardPlan plan_;
  HadamardGeometry g_;
  std::vector<uint8_t> done_;  // per block: handed out this pass
  std::vector<uint8_t> here_;  // per shard: arrived (shard_arrived)
};

}  // namespace optireduce::coll
