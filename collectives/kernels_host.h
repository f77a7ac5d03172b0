// Host kernels of Transpose AllReduce: the fast Walsh-Hadamard transform, Hadamard encode and
// decode, the erasure-aware reduction, the phase-2 fill and the non-finite scan and verdict.
// Written so that GCC vectorises the inner loops (branch-free bodies, __restrict, fixed-size
// chunks); they are also the oracles the CUDA kernels are tested against.
#pragma once

#include <cstddef>
#include <cstdint>

#include "collectives/elem.h"

namespace optireduce::coll {

// The instruction sets the kernels below are built for, narrowest first: baseline x86-64 (or
// any other CPU), and AVX2 with FMA and F16C where the CPU has them. Both give the same bits
// (the transform's additions run in one order whatever the vector width, FMA by +-1 is exact),
// so the ranks of one job may run on CPUs of different generations.
enum class HostSimd : uint8_t { kNone, kAvx2 };
const char* host_simd_name(HostSimd s);
// The widest variant this build and CPU have: the one the kernels run.
HostSimd best_host_simd();
// Tests and benchmarks: makes the kernels run `want`, or the widest below it that the build
// and CPU have, and returns the one chosen. Process-wide.
HostSimd select_host_simd(HostSimd want);
HostSimd host_simd();

// In-place unnormalised Walsh-Hadamard transform of d = 2^k values (H is symmetric and H*H = d*I).
void fwht(float* x, size_t d);
void fwht(double* x, size_t d);

// Sign masks of D for one block size: mask[j] = sign_mask(seed, j), j < d.
void fill_sign_masks(uint32_t* mask, size_t d, uint64_t seed);

struct HadamardGeometry {
  uint64_t count = 0;  // elements of the bucket
  uint64_t block = 0;  // elements per full block, a power of two
  uint64_t encoded() const { return encoded_length(count, block); }
  uint64_t blocks() const { return (count + block - 1) / block; }
  // Elements of block b in the bucket and in the encoded vector.
  uint64_t data_len(uint64_t b) const {
    const uint64_t s = b * block;
    return count - s < block ? count - s : block;
  }
  uint64_t dim(uint64_t b) const {
    const uint64_t n = data_len(b);
    return n == block ? block : next_pow2(n);
  }
  // Blocks [b0, b1) as a bucket of their own, starting at element b0 * block of this one (in
  // the data and in the encoded vector alike). Every block uses the same signs, so the run
  // transforms alone exactly as inside this bucket; the run that ends it keeps its short tail.
  HadamardGeometry blocks_from(uint64_t b0, uint64_t b1) const {
    const uint64_t end = b1 * block < count ? b1 * block : count;
    return HadamardGeometry{end - b0 * block, block};
  }
};

// out[0, encoded) = H*D*in / sqrt(d) per block (the tail zero-padded). `in` and `out` must not
// overlap. `masks` holds at least `block` sign masks (fill_sign_masks).
void hadamard_encode(DType t, const void* in, void* out, const HadamardGeometry& g,
                     const uint32_t* masks);

struct DecodeResult {
  uint64_t lost = 0;          // encoded coordinates that were erased
  uint64_t blocks_empty = 0;  // blocks where every coordinate was erased (fallback used)
};
// out[0, count) = scale * (d/k) * D*H*in / sqrt(d) per block, where k of the block's d coordinates
// are not the erasure marker (erased ones count as zero). A block with k = 0 takes
// fallback[i] * fallback_scale instead (the caller's own contribution); `fallback` may alias
// `out`. `in` (the encoded vector) must not overlap `out`. Erasure::kZero leaves out the d/k
// (and the fallback: an empty block decodes to zeros).
DecodeResult hadamard_decode(DType t, const void* in, void* out, const HadamardGeometry& g,
                             const uint32_t* masks, double scale, const void* fallback,
                             double fallback_scale, Erasure policy = Erasure::kRescale);

// Phase-1 reduction of one shard: out[i] = finish(sum of srcs[s][i]) over the N sources in rank
// order (so that results are bitwise reproducible), in fp32 (fp64 for fp64). Sources flagged in
// `lossy` are checked for the marker; an erased element is excluded (Erasure). `out` may alias
// any source. Returns the number of erased elements found.
uint64_t reduce_shard(DType t, const void* const* srcs, const uint8_t* lossy, int nranks, void* out,
                      size_t n, RedOp op, Erasure policy);

// Phase-2 repair without Hadamard: dst[i] = received[i] unless it is the marker, else
// own[i] * own_scale (kRescale) or 0 (kZero). Any two pointers may be equal (element i is read
// before it is written). Returns the number of erased elements.
uint64_t fill_lost(DType t, void* dst, const void* received, const void* own, size_t n,
                   double own_scale, Erasure policy);

// Counts marker elements (test and statistics helper).
uint64_t count_markers(DType t, const void* data, size_t n);

// Counts the NaN and Inf elements (is_nonfinite: any encoding, the marker included) of
// data[0, n): a bounded call's scan of this rank's input for the non-finite verdict.
uint64_t count_nonfinite(DType t, const void* data, size_t n);

// The agreed non-finite verdict of a bounded call: when the flag byte (elem.h's Flag) of some
// rank among flags[0, nranks) has kFlagNonFinite, sets out[0, n) to the type's canonical quiet
// NaN (Elem::kQuietNaN, the same bits on every rank) and returns true; else leaves out alone.
bool apply_nonfinite_verdict(DType t, void* out, size_t n, const uint8_t* flags, int nranks);

}  // namespace optireduce::coll
