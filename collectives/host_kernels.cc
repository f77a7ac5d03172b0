// HostKernels: host memory scratch and dispatch to the host kernels (see host_kernels.h).
#include "collectives/host_kernels.h"

#include <cstdlib>
#include <new>

namespace optireduce::coll {

void* HostKernels::scratch(int slot, size_t bytes) {
  Region& r = regions_[slot];
  if (r.bytes < bytes || !r.mem) {
    const size_t rounded = (bytes + 63) / 64 * 64 + 64;
    void* p = std::aligned_alloc(64, rounded);
    if (p == nullptr) throw std::bad_alloc();
    r.mem = {static_cast<uint8_t*>(p), std::free};
    r.bytes = rounded;
  }
  return r.mem.get();
}

const uint32_t* HostKernels::masks(uint64_t seed, size_t block) {
  if (masks_block_ != block || masks_seed_ != seed || masks_.size() < block) {
    masks_.resize(block);
    fill_sign_masks(masks_.data(), block, seed);
    masks_seed_ = seed;
    masks_block_ = block;
  }
  return masks_.data();
}

void HostKernels::encode(DType t, const void* in, void* out, const HadamardGeometry& g,
                         uint64_t seed) {
  hadamard_encode(t, in, out, g, masks(seed, g.block));
}

void HostKernels::decode(DType t, const void* in, void* out, const HadamardGeometry& g,
                         uint64_t seed, double scale, const void* fallback, double fallback_scale,
                         Erasure policy) {
  const DecodeResult r =
      hadamard_decode(t, in, out, g, masks(seed, g.block), scale, fallback, fallback_scale, policy);
  counters_[kLostPhase2] += r.lost;
  counters_[kBlocksEmpty] += r.blocks_empty;
}

void HostKernels::reduce(DType t, const void* const* srcs, const uint8_t* lossy, int nranks,
                         void* out, size_t n, RedOp op, Erasure policy) {
  counters_[kLostPhase1] += reduce_shard(t, srcs, lossy, nranks, out, n, op, policy);
}

void HostKernels::fill_lost(DType t, void* dst, const void* received, const void* own, size_t n,
                            double own_scale, Erasure policy) {
  counters_[kLostPhase2] += coll::fill_lost(t, dst, received, own, n, own_scale, policy);
}

void HostKernels::flag_nonfinite(DType t, const void* data, size_t n, void* flag) {
  const uint64_t c = count_nonfinite(t, data, n);
  counters_[kNonFiniteElements] += c;
  *static_cast<uint8_t*>(flag) = c > 0 ? kFlagNonFinite : 0;
}

void HostKernels::flag_lost(double threshold, uint64_t expected, void* flag) {
  const uint64_t lost = counters_[kLostPhase1] + counters_[kLostPhase2];
  const bool f = expected > 0 && double(lost) / double(expected) > threshold;
  *static_cast<uint8_t*>(flag) |= f ? kFlagLost : 0;
  counters_[kSafeguardFlags] += f ? 1 : 0;
}

void HostKernels::nonfinite_verdict(DType t, void* out, size_t n, const void* flags, int nranks) {
  if (apply_nonfinite_verdict(t, out, n, static_cast<const uint8_t*>(flags), nranks))
    counters_[kNonFiniteCalls] += 1;
}

void HostKernels::take_counters(uint64_t* out) {
  for (int i = 0; i < kNumCounters; ++i) {
    out[i] += counters_[i];
    counters_[i] = 0;
  }
}

}  // namespace optireduce::coll
