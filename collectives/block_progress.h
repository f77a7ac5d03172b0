// Which Hadamard blocks of the encoded vector a pipelined TAR phase has dealt with (tar.cc).
//
// Why pipelined: encoding the whole bucket before the first send and decoding it after the last
// receive put both transforms on the critical path, a few milliseconds per call on a busy host
// (bench/lab: + Hadamard took 5 ms more than TAR without it at 4 MiB). Releasing each shard's
// send as its blocks are encoded lets every flow start after one piece's encode, and decoding
// what has arrived works while the rest is on the wire.
//
// The encoded vector is cut two ways that do not align: into shards (ShardPlan, one per rank)
// and into blocks (HadamardGeometry, the transform's unit). A block that straddles a shard
// boundary is encoded with the first shard that needs it, and decoded once every shard it
// overlaps is here. Each block is handed out exactly once per pass, so the results are the bits
// of one whole-vector encode and decode.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "collectives/kernels_host.h"
#include "collectives/shard_plan.h"

namespace optireduce::coll {

class BlockProgress {
 public:
  // Starts a pass: no block handed out, nothing of any shard here. Allocates only when the
  // bucket grew.
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

  // run(b0, b1) for each maximal run of blocks not handed out yet that hold any of the first
  // `elems` elements of shard k; returns how many elements of shard k, from its start, lie in
  // blocks handed out by now, at least `elems` (encoding this rank's own shard as far as the
  // reduction has got).
  template <class F>
  uint64_t take_shard_prefix(int k, uint64_t elems, F&& run) {
    const uint64_t off = plan_.offset(k), len = plan_.length(k);
    elems = std::min(elems, len);
    if (elems == 0) return 0;
    const uint64_t b0 = off / g_.block, b1 = (off + elems - 1) / g_.block + 1;
    take(b0, b1, any_block, run);
    // Every block in [b0, b1) was handed out, now or earlier (one shared with the shard before
    // by that shard's take), so the shard is encoded up to the end of block b1 - 1.
    return std::min(b1 * g_.block, off + len) - off;
  }

  // The first `elems` elements of shard k are here (a receive's arrived prefix; it only ever
  // grows): run(b0, b1) for each maximal run of blocks not handed out yet whose every element
  // is here, in each shard the block overlaps (decoding while the rest is on the wire).
  template <class F>
  void shard_progress(int k, uint64_t elems, F&& run) {
    uint64_t& h = here_[size_t(k)];
    h = std::max(h, std::min(elems, plan_.length(k)));
    const auto [b0, b1] = blocks_of(k);
    // Past the block that holds the prefix's end nothing of shard k is here.
    const uint64_t upto = std::min(b1, (plan_.offset(k) + h) / g_.block + 1);
    const auto ready = [this](uint64_t b) { return covered(b); };
    take(b0, upto, ready, run);
  }

  // Shard k is here, all of it.
  template <class F>
  void shard_arrived(int k, F&& run) {
    shard_progress(k, plan_.length(k), run);
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
    const uint64_t first = b * g_.block, end = first + g_.dim(b);
    const int lo = shard_of(first), hi = shard_of(end - 1);
    for (int k = lo; k <= hi; ++k) {
      const uint64_t off = plan_.offset(k);
      if (off + here_[size_t(k)] < std::min(end, off + plan_.length(k))) return false;
    }
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
  std::vector<uint64_t> here_;  // per shard: elements here, from its start (shard_progress)
};

}  // namespace optireduce::coll
