// CUDA kernels of Transpose AllReduce: Hadamard encode/decode, the erasure-aware reduction, the
// phase-2 fill, the non-finite scan and verdict. Per-element math comes from collectives/elem.h
// and math.h, the same functions the host kernels use; the host kernels are the oracles in the
// tests, bit for bit. The same source also runs on the CPU under tests/kernels_emu
// (device_compat.h).
//
// The kernels are bound by instructions as much as by DRAM: a 16-bit element is 2 bytes to move
// and a few dozen instructions to convert, transform and convert back. So every hot path moves
// 16 bytes per access (Run), and the transform keeps its elements in registers:
//  - Blocks of 512..kSharedElems elements: encode_fast / decode_fast, one CUDA block per
//    Hadamard block, 16 elements per thread, every butterfly in registers or warp shuffles and
//    one transpose through shared memory between them (see "Fast fused transform" below).
//  - Blocks (or a bucket's tail) below 512: encode_fused / decode_fused, one element per thread
//    per trip, shared-memory stages. Small and rare (tails, small hadamardBlock settings).
//  - Blocks above kSharedElems: load_* / fwht_shared / fwht_stage / store_*, one global pass
//    per stage beyond the chunk.
//  - reduce and fill: runs of 16 bytes per thread where every pointer allows it (16-byte
//    aligned), else one element per thread; the element math is the same either way.
#include <type_traits>

#include "cuda/device_compat.h"
#include "cuda/launch.h"

namespace optireduce::coll::cuda {
namespace {

constexpr int kThreads = 256;
// Elements of one shared-memory FWHT chunk: 16 KiB of fp32 (32 KiB of fp64), within the 48 KiB
// every architecture since sm_70 gives without opting in.
constexpr uint64_t kSharedElems = 4096;

int blocks_for(uint64_t n) {
  const uint64_t b = (n + kThreads - 1) / kThreads;
  return int(b < 65535 * 16 ? (b == 0 ? 1 : b) : 65535 * 16);  // grid-stride beyond this
}

// Adds each thread's v into *c with one atomic per warp. Every lane of the warp must call it.
__device__ void add_count(unsigned long long* c, unsigned v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31) == 0 && v != 0) atomicAdd(c, static_cast<unsigned long long>(v));
}

// log2 of a power of two. Blocks, chunks and butterfly distances are all powers of two, so
// indexing shifts and masks: a 64-bit division is a long software sequence on the GPU.
__host__ __device__ unsigned log2_pow2(uint64_t x) {
#if defined(__CUDA_ARCH__)
  return unsigned(__ffsll(static_cast<long long>(x)) - 1);
#else
  return unsigned(__builtin_ctzll(x));
#endif
}

// N consecutive elements as one access: 16 bytes (ld/st.v4), or fewer for short runs; longer
// runs take one 16-byte access per 16 bytes. The address must be a multiple of the alignment,
// which every caller checks on its base pointers (is_aligned16) and keeps by indexing runs at
// multiples of N.
template <class S, unsigned N>
struct alignas(N * sizeof(S) < 16 ? N * sizeof(S) : 16) Run {
  S e[N];
};

bool is_aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

template <unsigned N, class S>
__device__ __forceinline__ Run<S, N> load_run(const S* p) {
  OR_CHECK_ALIGNED(p, alignof(Run<S, N>));
  return *reinterpret_cast<const Run<S, N>*>(p);
}

template <unsigned N, class S>
__device__ __forceinline__ void store_run(S* p, const Run<S, N>& r) {
  OR_CHECK_ALIGNED(p, alignof(Run<S, N>));
  *reinterpret_cast<Run<S, N>*>(p) = r;
}

// v[0, N) = p[0, N): one run where `vec` (p aligned) and all N exist, else element by element,
// S(0) from `avail` on (a tail block's padding).
template <unsigned N, class S>
__device__ __forceinline__ void load_elems(const S* p, S (&v)[N], bool vec, unsigned avail) {
  if (vec && avail >= N) {
    const Run<S, N> r = load_run<N>(p);
    for (unsigned j = 0; j < N; ++j) v[j] = r.e[j];
  } else {
    for (unsigned j = 0; j < N; ++j) v[j] = j < avail ? p[j] : S(0);
  }
}

// p[0, min(N, avail)) = v: one run where `vec` and all N fit, else element by element.
template <unsigned N, class S>
__device__ __forceinline__ void store_elems(S* p, const S (&v)[N], bool vec, unsigned avail) {
  if (vec && avail >= N) {
    Run<S, N> r;
    for (unsigned j = 0; j < N; ++j) r.e[j] = v[j];
    store_run<N>(p, r);
  } else {
    for (unsigned j = 0; j < N && j < avail; ++j) p[j] = v[j];
  }
}

__device__ uint64_t dim_of(uint64_t b, uint64_t count, uint64_t block) {
  const uint64_t start = b * block;
  const uint64_t n = count - start < block ? count - start : block;
  return n == block ? block : next_pow2(n);
}

// work[j] = D x (or 0 in the padding), j < encoded length.
template <DType T>
__global__ void load_signed(const typename Elem<T>::S* in, typename Elem<T>::A* work,
                            uint64_t count, uint64_t len, uint64_t block, uint64_t seed) {
  using E = Elem<T>;
  for (uint64_t j = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; j < len;
       j += uint64_t(gridDim.x) * blockDim.x) {
    work[j] =
        j < count ? apply_sign(E::load(in[j]), sign_mask(seed, j & (block - 1))) : typename E::A(0);
  }
}

// work[j] = received coordinate or 0 if erased; lost[b] counts the erased ones of block b.
template <DType T>
__global__ void load_count(const typename Elem<T>::S* in, typename Elem<T>::A* work, uint64_t len,
                           uint64_t block, unsigned* lost, unsigned long long* counters) {
  using E = Elem<T>;
  const unsigned lb = log2_pow2(block);
  unsigned mine = 0;
  for (uint64_t j = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; j < len;
       j += uint64_t(gridDim.x) * blockDim.x) {
    const typename E::S v = in[j];
    const bool erased = v == E::kMarker;
    work[j] = erased ? typename E::A(0) : E::load(v);
    if (erased) {
      atomicAdd(&lost[j >> lb], 1u);  // rare: only where something was lost
      ++mine;
    }
  }
  add_count(&counters[kLostPhase2], mine);
}

// In-place unnormalised FWHT of every chunk of `chunk` elements in work[base, base + len).
template <class A>
__global__ void fwht_shared(A* work, uint64_t base, uint64_t chunk) {
  OR_DYNAMIC_SHARED(unsigned char, smem_raw);
  A* s = reinterpret_cast<A*>(smem_raw);
  A* g = work + base + blockIdx.x * chunk;
  for (uint64_t k = threadIdx.x; k < chunk; k += blockDim.x) s[k] = g[k];
  __syncthreads();
  for (uint64_t h = 1, lh = 0; h < chunk; h <<= 1, ++lh) {
    for (uint64_t p = threadIdx.x; p < chunk / 2; p += blockDim.x) {
      const uint64_t i = ((p >> lh) << (lh + 1)) | (p & (h - 1));
      const A a = s[i], b = s[i + h];
      s[i] = a + b;
      s[i + h] = a - b;
    }
    __syncthreads();
  }
  for (uint64_t k = threadIdx.x; k < chunk; k += blockDim.x) g[k] = s[k];
}

// One butterfly stage of distance h over blocks of dimension d in work[base, base + len).
template <class A>
__global__ void fwht_stage(A* work, uint64_t base, uint64_t len, uint64_t d, uint64_t h) {
  const uint64_t half = d / 2;
  const unsigned lhalf = log2_pow2(half), lh = log2_pow2(h);
  for (uint64_t p = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; p < len / 2;
       p += uint64_t(gridDim.x) * blockDim.x) {
    const uint64_t blk = p >> lhalf, q = p & (half - 1);
    const uint64_t i = base + blk * d + (((q >> lh) << (lh + 1)) | (q & (h - 1)));
    const A a = work[i], b = work[i + h];
    work[i] = a + b;
    work[i + h] = a - b;
  }
}

template <DType T>
__global__ void store_encoded(const typename Elem<T>::A* work, typename Elem<T>::S* out,
                              uint64_t count, uint64_t len, uint64_t block) {
  using E = Elem<T>;
  using A = typename E::A;
  const unsigned lb = log2_pow2(block);
  for (uint64_t j = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; j < len;
       j += uint64_t(gridDim.x) * blockDim.x) {
    const uint64_t d = dim_of(j >> lb, count, block);
    out[j] = E::store(work[j] * (A(1) / sqrt(A(d))));
  }
}

template <DType T>
__global__ void store_decoded(const typename Elem<T>::A* work, typename Elem<T>::S* out,
                              const typename Elem<T>::S* fb, uint64_t count, uint64_t block,
                              uint64_t seed, double scale, double fb_scale, bool rescale,
                              const unsigned* lost, unsigned long long* counters) {
  using E = Elem<T>;
  using A = typename E::A;
  const unsigned lb = log2_pow2(block);
  unsigned empty = 0;
  for (uint64_t j = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; j < count;
       j += uint64_t(gridDim.x) * blockDim.x) {
    const uint64_t b = j >> lb, d = dim_of(b, count, block);
    const uint64_t kept = d - lost[b];
    if (kept == 0 && rescale) {
      out[j] = E::store(E::load(fb[j]) * A(fb_scale));
      empty += (j & (block - 1)) == 0 ? 1 : 0;
      continue;
    }
    const double dk = rescale ? double(d) / double(kept) : 1.0;
    const A s = A(scale * dk / sqrt(double(d)));
    out[j] = E::store(apply_sign(work[j] * s, sign_mask(seed, j & (block - 1))));
  }
  add_count(&counters[kBlocksEmpty], empty);
}

// ---- Fused transform of blocks that fit in shared memory: one kernel reads every element once
// and writes it once (the three-kernel path, load_* / fwht_all / store_*, moves each element
// through global memory three times). One CUDA block per Hadamard block of dimension d = 2^log2d <=
// kSharedElems, with min(d, kThreads) threads; thread t holds elements t, t + T, t + 2T, ... (T =
// blockDim.x). The general form, for blocks below 512 (2 to 256 elements: tails, small
// hadamardBlock settings); encode_fast / decode_fast below take 512 and more.

// The butterflies of distance 1..16 in registers: with T a multiple of 32, element i sits in
// lane i % 32 of its warp, so its partner at distance h < 32 is lane ^ h. The lower lane keeps
// a + b, the upper a - b: the same two operations, on the same values, as the host's transform.
template <class A>
__device__ A warp_butterflies(A x) {
  const unsigned lane = threadIdx.x & 31;
  for (int h = 1; h < 32; h <<= 1) {
    const A y = __shfl_xor_sync(0xffffffffu, x, h);
    x = (lane & unsigned(h)) ? y - x : x + y;
  }
  return x;
}

// The remaining butterflies, distance 2^first_log .. d/2, in shared memory. 32-bit shifts, no
// division: pair p of a stage is element ((p >> lh) << (lh + 1)) | (p & (h - 1)) and its partner
// h above; consecutive threads touch consecutive words from h = 32 on (no bank conflicts).
template <class A>
__device__ void shared_butterflies(A* s, unsigned log2d, unsigned first_log) {
  const unsigned half = (1u << log2d) >> 1;
  for (unsigned lh = first_log; lh < log2d; ++lh) {
    const unsigned h = 1u << lh;
    for (unsigned p = threadIdx.x; p < half; p += blockDim.x) {
      const unsigned i = ((p >> lh) << (lh + 1)) | (p & (h - 1));
      const A a = s[i], b = s[i + h];
      s[i] = a + b;
      s[i + h] = a - b;
    }
    __syncthreads();
  }
}

// add_count for blocks of any size: fewer than 32 threads cannot shuffle a full warp.
__device__ void add_count_any(unsigned long long* c, unsigned v) {
  if (blockDim.x >= 32) {
    add_count(c, v);
  } else if (v != 0) {
    atomicAdd(c, static_cast<unsigned long long>(v));
  }
}

// out[block b] = H D in[block b] / sqrt(d), b = first + blockIdx.x (the tail zero-padded).
template <DType T>
__global__ void encode_fused(const typename Elem<T>::S* in, typename Elem<T>::S* out,
                             uint64_t count, uint64_t block, uint64_t first, unsigned log2d,
                             uint64_t seed) {
  using E = Elem<T>;
  using A = typename E::A;
  OR_DYNAMIC_SHARED(unsigned char, smem_raw);
  A* s = reinterpret_cast<A*>(smem_raw);
  const unsigned d = 1u << log2d;
  const uint64_t base = (first + blockIdx.x) * block;
  const unsigned n = count - base < d ? unsigned(count - base) : d;  // data, the rest is padding
  const bool warp = blockDim.x >= 32;
  for (unsigned i = threadIdx.x; i < d; i += blockDim.x) {
    A x = i < n ? apply_sign(E::load(in[base + i]), sign_mask(seed, i)) : A(0);
    if (warp) x = warp_butterflies(x);
    s[i] = x;
  }
  __syncthreads();
  shared_butterflies(s, log2d, warp ? 5 : 0);
  const A scale = A(1) / sqrt(A(d));
  for (unsigned i = threadIdx.x; i < d; i += blockDim.x) out[base + i] = E::store(s[i] * scale);
}

// out[block b] = scale (d/k) D H in[block b] / sqrt(d) over its data elements, k the coordinates
// not erased; the fallback where k = 0 (kRescale). The scale is one per block: no per-element
// division.
template <DType T>
__global__ void decode_fused(const typename Elem<T>::S* in, typename Elem<T>::S* out,
                             const typename Elem<T>::S* fb, uint64_t count, uint64_t block,
                             uint64_t first, unsigned log2d, uint64_t seed, double scale,
                             double fb_scale, bool rescale, unsigned long long* counters) {
  using E = Elem<T>;
  using A = typename E::A;
  OR_DYNAMIC_SHARED(unsigned char, smem_raw);
  A* s = reinterpret_cast<A*>(smem_raw);
  __shared__ unsigned erased_in_block;
  const unsigned d = 1u << log2d;
  const uint64_t base = (first + blockIdx.x) * block;
  const unsigned n = count - base < d ? unsigned(count - base) : d;
  const bool warp = blockDim.x >= 32;
  if (threadIdx.x == 0) erased_in_block = 0;
  __syncthreads();
  unsigned mine = 0;
  for (unsigned i = threadIdx.x; i < d; i += blockDim.x) {
    const typename E::S v = in[base + i];
    const bool erased = v == E::kMarker;
    A x = erased ? A(0) : E::load(v);
    mine += erased ? 1 : 0;
    if (warp) x = warp_butterflies(x);
    s[i] = x;
  }
  if (mine != 0) atomicAdd(&erased_in_block, mine);
  add_count_any(&counters[kLostPhase2], mine);
  __syncthreads();
  shared_butterflies(s, log2d, warp ? 5 : 0);
  const unsigned kept = d - erased_in_block;
  if (kept == 0 && rescale) {
    for (unsigned i = threadIdx.x; i < n; i += blockDim.x)
      out[base + i] = E::store(E::load(fb[base + i]) * A(fb_scale));
    if (threadIdx.x == 0) atomicAdd(&counters[kBlocksEmpty], 1ull);
    return;
  }
  const double dk = rescale ? double(d) / double(kept) : 1.0;
  const A sc = A(scale * dk / sqrt(double(d)));
  for (unsigned i = threadIdx.x; i < n; i += blockDim.x)
    out[base + i] = E::store(apply_sign(s[i] * sc, sign_mask(seed, i)));
}

// ---- Fast fused transform: blocks of d = 512 W elements, W = 1, 2, 4 or 8 warps (512 to
// kSharedElems), the full blocks of every bucket with the default block (4096) and tails of 512
// and more. One CUDA block of 32 W threads per Hadamard block, each thread holding kPerThread =
// 16 elements in registers, so that most butterflies are register adds rather than shared-memory
// round trips, and every global access moves 16 bytes.
//
// Phase 1 (as loaded). Warp w holds elements [512 w, 512 w + 512); its lane l holds K = 16 / V
// runs of V = 16 / sizeof(S) consecutive elements (one 16-byte load each), run k at
// 512 w + 32 V k + V l, in registers k V .. k V + V - 1. Each load of a warp reads 512 contiguous
// bytes. The bits of an element's index in the block are therefore
//   [0, v): register (r)   [v, v + 5): lane   [v + 5, 9): register (k)   [9, log2 d): warp
// (v = log2 V), and the stages on bits 0..8 run in that order: register butterflies, five
// shuffle stages, register butterflies. The stages on the warp bits go through one transpose:
//
// Phase 2 (as stored). Thread t holds, for each g < W, the P = 16 / W consecutive elements
// 512 g + P t + [0, P), in registers g P .. g P + P - 1: the remaining stages are register
// butterflies at distances P, 2P, .., 8, and a warp's store covers 32 P contiguous elements.
//
// Every stage runs in ascending distance, each pair (a, b) becoming (a + b, a - b) with the same
// operands as the host's transform (collectives/kernels_host_impl.h), and the scaling after the
// last: the results are the host's bit for bit. The sign words of D (one per 64 elements) are
// hashed once per block into shared memory rather than once per element.
//
// Shared memory: the transpose's buffer, 16 bytes of padding after every 32 elements. Phase 1
// writes V consecutive elements per lane; for fp16/bf16 (8 floats, 32 bytes) lanes 4 apart would
// otherwise hit the same banks, and the padding shifts them by 16 bytes. With it both passes are
// free of bank conflicts for fp32 accumulators (every W) and for fp64 with W = 8; fp64 reads with
// W < 8 (blocks of 512..2048) are 2-way.
constexpr unsigned kPerThread = 16;
constexpr unsigned kWarpSpan = 32 * kPerThread;  // 512
static_assert(kSharedElems == 8 * kWarpSpan, "the fast transform's W = 8 is the chunk");

__host__ __device__ constexpr unsigned padded(unsigned i, unsigned pad) {
  return i + (i >> 5) * pad;
}
template <class A>
constexpr unsigned kPad = 16 / sizeof(A);

template <class A>
constexpr size_t fast_shared_bytes(unsigned d) {
  return padded(d, kPad<A>) * sizeof(A);
}

// Elements of n at or past i.
__device__ __forceinline__ unsigned left(unsigned n, unsigned i) {
  return n > i ? n - i : 0;
}

// Butterflies between registers j and j + h for h = lo, 2 lo, .. < hi (every j with j & h = 0).
// Pairs are enumerated as (b + o, b + o + h), b a multiple of 2h and o < h, so that every
// index is visibly in bounds (a compiler proves it; one that skipped j & h != 0 could not).
template <unsigned lo, unsigned hi, class A>
__device__ __forceinline__ void reg_stages(A (&x)[kPerThread]) {
  for (unsigned h = lo; h < hi; h <<= 1) {
    for (unsigned b = 0; b < kPerThread; b += 2 * h) {
      for (unsigned o = 0; o < h; ++o) {
        const A a = x[b + o], c = x[b + o + h];
        x[b + o] = a + c;
        x[b + o + h] = a - c;
      }
    }
  }
}

// The stages across the lanes of a warp, every register at once. The partner's value is y: the
// lower lane keeps x + y, the upper y - x (the lower's minus its own). sign * x is exact, so
// y + sign * x, one fused multiply-add, rounds as that one addition does.
template <class A>
__device__ __forceinline__ void lane_stages(A (&x)[kPerThread]) {
  const unsigned lane = threadIdx.x & 31;
  for (unsigned h = 1; h < 32; h <<= 1) {
    const A sign = (lane & h) != 0 ? A(-1) : A(1);
    for (unsigned j = 0; j < kPerThread; ++j) {
      const A y = __shfl_xor_sync(0xffffffffu, x[j], int(h));
      x[j] = y + sign * x[j];
    }
  }
}

// The whole transform of one block, from phase 1's registers to phase 2's (above). s: the
// block's dynamic shared memory, fast_shared_bytes<A>(512 W).
template <unsigned W, unsigned V, class A>
__device__ __forceinline__ void fast_fwht(A (&x)[kPerThread], A* s) {
  constexpr unsigned P = kPerThread / W, pad = kPad<A>;
  reg_stages<1, V>(x);
  lane_stages(x);
  reg_stages<V, kPerThread>(x);
  const unsigned t = threadIdx.x, lane = t & 31, warp = t >> 5;
  // 16 bytes per store (V floats of a 16-bit type are two).
  constexpr unsigned C = V < pad ? V : pad;
  for (unsigned k = 0; k < kPerThread / V; ++k) {
    for (unsigned c = 0; c < V; c += C) {
      Run<A, C> r;
      for (unsigned j = 0; j < C; ++j) r.e[j] = x[k * V + c + j];
      store_run<C>(s + padded(warp * kWarpSpan + 32 * V * k + V * lane + c, pad), r);
    }
  }
  __syncthreads();
  for (unsigned g = 0; g < W; ++g) {
    const Run<A, P> r = load_run<P>(s + padded(g * kWarpSpan + P * t, pad));
    for (unsigned j = 0; j < P; ++j) x[g * P + j] = r.e[j];
  }
  reg_stages<P, kPerThread>(x);
}

// Sign words of D for elements [0, d) of a block into words[0, d / 64), by the first d / 64
// threads (d / 64 <= 32 W: one each). Readers wait for a __syncthreads.
__device__ __forceinline__ void fill_sign_words(uint64_t* words, unsigned d, uint64_t seed) {
  if (threadIdx.x < d / 64) words[threadIdx.x] = sign_word(seed, threadIdx.x);
}

// Bit r of the result is element i + r's sign bit (i a multiple of the run length, r < 32):
// sign_mask(seed, i + r) = ((bits >> r) & 1) << 31.
__device__ __forceinline__ uint32_t sign_bits(const uint64_t* words, unsigned i) {
  return uint32_t(words[i >> 6] >> (i & 63));
}

// out[block b] = H D in[block b] / sqrt(d), b = first + blockIdx.x, d = 512 W (the tail
// zero-padded). vec: in and out 16-byte aligned.
template <DType T, unsigned W>
__global__ void encode_fast(const typename Elem<T>::S* in, typename Elem<T>::S* out, uint64_t count,
                            uint64_t block, uint64_t first, uint64_t seed, bool vec) {
  using E = Elem<T>;
  using S = typename E::S;
  using A = typename E::A;
  constexpr unsigned d = kWarpSpan * W, V = 16 / sizeof(S), P = kPerThread / W;
  OR_DYNAMIC_SHARED(unsigned char, smem_raw);
  __shared__ uint64_t words[d / 64];
  const unsigned t = threadIdx.x, lane = t & 31, warp = t >> 5;
  const uint64_t base = (first + blockIdx.x) * block;
  const unsigned n = count - base < d ? unsigned(count - base) : d;  // data, the rest is padding
  // The loads first: their latency overlaps the hashing and the barrier.
  S raw[kPerThread / V][V];
  for (unsigned k = 0; k < kPerThread / V; ++k) {
    const unsigned i = warp * kWarpSpan + 32 * V * k + V * lane;
    load_elems<V>(in + base + i, raw[k], vec, left(n, i));
  }
  fill_sign_words(words, d, seed);
  __syncthreads();
  A x[kPerThread];
  for (unsigned k = 0; k < kPerThread / V; ++k) {
    const unsigned i = warp * kWarpSpan + 32 * V * k + V * lane, avail = left(n, i);
    // Padding is +0: S(0) loads as +0, and its sign bits are cleared.
    const uint32_t keep = avail >= V ? ~0u : (1u << avail) - 1;
    const uint32_t bits = sign_bits(words, i) & keep;
    for (unsigned r = 0; r < V; ++r)
      x[k * V + r] = apply_sign(E::load(raw[k][r]), ((bits >> r) & 1u) << 31);
  }
  fast_fwht<W, V>(x, reinterpret_cast<A*>(smem_raw));
  const A scale = A(1) / sqrt(A(d));
  for (unsigned g = 0; g < W; ++g) {
    const unsigned i = g * kWarpSpan + P * t;
    S o[P];
    for (unsigned p = 0; p < P; ++p) o[p] = E::store(x[g * P + p] * scale);
    store_elems<P>(out + base + i, o, vec, P);  // all d, the padding's coordinates too
  }
}

// out[block b] = scale (d/k) D H in[block b] / sqrt(d) over its data elements (decode_fused's
// contract), d = 512 W. vec: in, out and fb 16-byte aligned.
template <DType T, unsigned W>
__global__ void decode_fast(const typename Elem<T>::S* in, typename Elem<T>::S* out,
                            const typename Elem<T>::S* fb, uint64_t count, uint64_t block,
                            uint64_t first, uint64_t seed, double scale, double fb_scale,
                            bool rescale, bool vec, unsigned long long* counters) {
  using E = Elem<T>;
  using S = typename E::S;
  using A = typename E::A;
  constexpr unsigned d = kWarpSpan * W, V = 16 / sizeof(S), P = kPerThread / W;
  OR_DYNAMIC_SHARED(unsigned char, smem_raw);
  __shared__ uint64_t words[d / 64];
  __shared__ unsigned erased_by_warp[W];
  const unsigned t = threadIdx.x, lane = t & 31, warp = t >> 5;
  const uint64_t base = (first + blockIdx.x) * block;
  const unsigned n = count - base < d ? unsigned(count - base) : d;
  S raw[kPerThread / V][V];  // every load issued before any is used, as in encode_fast
  for (unsigned k = 0; k < kPerThread / V; ++k)
    load_elems<V>(in + base + warp * kWarpSpan + 32 * V * k + V * lane, raw[k], vec, V);
  A x[kPerThread];
  unsigned erased = 0;
  for (unsigned k = 0; k < kPerThread / V; ++k) {
    for (unsigned r = 0; r < V; ++r) {
      const bool lost = raw[k][r] == E::kMarker;
      x[k * V + r] = lost ? A(0) : E::load(raw[k][r]);
      erased += lost ? 1 : 0;
    }
  }
  fill_sign_words(words, d, seed);  // read after fast_fwht's barrier
  for (int o = 16; o > 0; o >>= 1) erased += __shfl_down_sync(0xffffffffu, erased, o);
  if (lane == 0) {
    erased_by_warp[warp] = erased;  // read after fast_fwht's barrier
    if (erased != 0) atomicAdd(&counters[kLostPhase2], static_cast<unsigned long long>(erased));
  }
  fast_fwht<W, V>(x, reinterpret_cast<A*>(smem_raw));
  unsigned kept = d;
  for (unsigned w = 0; w < W; ++w) kept -= erased_by_warp[w];
  if (kept == 0 && rescale) {
    for (unsigned g = 0; g < W; ++g) {
      const unsigned i = g * kWarpSpan + P * t;
      S o[P];
      load_elems<P>(fb + base + i, o, vec, left(n, i));
      for (unsigned p = 0; p < P; ++p) o[p] = E::store(E::load(o[p]) * A(fb_scale));
      store_elems<P>(out + base + i, o, vec, left(n, i));
    }
    if (t == 0) atomicAdd(&counters[kBlocksEmpty], 1ull);
    return;
  }
  const double dk = rescale ? double(d) / double(kept) : 1.0;
  const A sc = A(scale * dk / sqrt(double(d)));
  for (unsigned g = 0; g < W; ++g) {
    const unsigned i = g * kWarpSpan + P * t;
    const uint32_t bits = sign_bits(words, i);
    S o[P];
    for (unsigned p = 0; p < P; ++p)
      o[p] = E::store(apply_sign(x[g * P + p] * sc, ((bits >> p) & 1u) << 31));
    store_elems<P>(out + base + i, o, vec, left(n, i));
  }
}

// The regions of a bucket for the fused kernels: its full blocks, then its tail (one block of
// next_pow2(tail)). Calls launch(first block, number of blocks, log2 d) for each non-empty one.
template <class F>
void for_each_region(const HadamardGeometry& g, F launch) {
  const uint64_t nfull = g.count / g.block;
  if (nfull > 0) launch(uint64_t(0), nfull, log2_pow2(g.block));
  if (g.count > nfull * g.block)
    launch(nfull, uint64_t(1), log2_pow2(next_pow2(g.count - nfull * g.block)));
}

// Calls f(std::integral_constant<unsigned, W>()) with the fast transform's warps for a block of
// 2^log2d elements, 512 <= 2^log2d <= kSharedElems.
template <class F>
void with_warps(unsigned log2d, F f) {
  switch (log2d) {
    case 9:
      return f(std::integral_constant<unsigned, 1>());
    case 10:
      return f(std::integral_constant<unsigned, 2>());
    case 11:
      return f(std::integral_constant<unsigned, 4>());
    default:
      return f(std::integral_constant<unsigned, 8>());
  }
}

template <class A>
int fwht_all(A* work, const HadamardGeometry& g, Stream s) {
  const uint64_t full = (g.count / g.block) * g.block;
  const uint64_t tail_d = g.count > full ? next_pow2(g.count - full) : 0;
  struct Region {
    uint64_t base, len, d;
  } regions[2] = {{0, full, g.block}, {full, tail_d, tail_d}};
  for (const Region& r : regions) {
    if (r.len == 0) continue;
    const uint64_t chunk = r.d < kSharedElems ? r.d : kSharedElems;
    const int threads = int(chunk / 2 < kThreads ? (chunk / 2 > 0 ? chunk / 2 : 1) : kThreads);
    if (chunk > 1) {
      const uint64_t nchunks = r.len / chunk;
      OR_LAUNCH(fwht_shared<A>, unsigned(nchunks), threads, chunk * sizeof(A), s)
      (work, r.base, chunk);
    }
    for (uint64_t h = chunk; h < r.d; h <<= 1)
      OR_LAUNCH(fwht_stage<A>, blocks_for(r.len / 2), kThreads, 0, s)(work, r.base, r.len, r.d, h);
  }
  return int(cudaGetLastError());
}

template <DType T>
int encode_t(const void* in, void* out, const HadamardGeometry& g, uint64_t seed, void* work,
             Stream s) {
  using E = Elem<T>;
  using A = typename E::A;
  using S = typename E::S;
  if (g.block <= kSharedElems) {
    const bool vec = is_aligned16(in) && is_aligned16(out);
    for_each_region(g, [&](uint64_t first, uint64_t nblocks, unsigned log2d) {
      const unsigned d = 1u << log2d;
      if (d >= kWarpSpan) {
        with_warps(log2d, [&](auto w) {
          constexpr unsigned W = decltype(w)::value;
          const auto kernel = encode_fast<T, W>;  // one macro argument
          OR_LAUNCH(kernel, nblocks, 32 * W, fast_shared_bytes<A>(d), s)
          (static_cast<const S*>(in), static_cast<S*>(out), g.count, g.block, first, seed, vec);
        });
        return;
      }
      OR_LAUNCH(encode_fused<T>, nblocks, d < kThreads ? d : kThreads, d * sizeof(A), s)
      (static_cast<const S*>(in), static_cast<S*>(out), g.count, g.block, first, log2d, seed);
    });
    return int(cudaGetLastError());
  }
  const uint64_t len = g.encoded();
  A* w = static_cast<A*>(work);
  OR_LAUNCH(load_signed<T>, blocks_for(len), kThreads, 0, s)
  (static_cast<const typename E::S*>(in), w, g.count, len, g.block, seed);
  if (int e = fwht_all(w, g, s)) return e;
  OR_LAUNCH(store_encoded<T>, blocks_for(len), kThreads, 0, s)
  (w, static_cast<typename E::S*>(out), g.count, len, g.block);
  return int(cudaGetLastError());
}

template <DType T>
int decode_t(const void* in, void* out, const HadamardGeometry& g, uint64_t seed, double scale,
             const void* fb, double fb_scale, Erasure policy, void* work,
             unsigned long long* counters, Stream s) {
  using E = Elem<T>;
  using A = typename E::A;
  using S = typename E::S;
  if (g.block <= kSharedElems) {
    const bool vec = is_aligned16(in) && is_aligned16(out) && is_aligned16(fb);
    const bool rescale = policy == Erasure::kRescale;
    for_each_region(g, [&](uint64_t first, uint64_t nblocks, unsigned log2d) {
      const unsigned d = 1u << log2d;
      if (d >= kWarpSpan) {
        with_warps(log2d, [&](auto w) {
          constexpr unsigned W = decltype(w)::value;
          const auto kernel = decode_fast<T, W>;  // one macro argument
          OR_LAUNCH(kernel, nblocks, 32 * W, fast_shared_bytes<A>(d), s)
          (static_cast<const S*>(in), static_cast<S*>(out), static_cast<const S*>(fb), g.count,
           g.block, first, seed, scale, fb_scale, rescale, vec, counters);
        });
        return;
      }
      OR_LAUNCH(decode_fused<T>, nblocks, d < kThreads ? d : kThreads, d * sizeof(A), s)
      (static_cast<const S*>(in), static_cast<S*>(out), static_cast<const S*>(fb), g.count, g.block,
       first, log2d, seed, scale, fb_scale, rescale, counters);
    });
    return int(cudaGetLastError());
  }
  const uint64_t len = g.encoded();
  A* w = static_cast<A*>(work);
  unsigned* lost = reinterpret_cast<unsigned*>(w + len);
  cudaMemsetAsync(lost, 0, g.blocks() * sizeof(unsigned), s);
  OR_LAUNCH(load_count<T>, blocks_for(len), kThreads, 0, s)
  (static_cast<const typename E::S*>(in), w, len, g.block, lost, counters);
  if (int e = fwht_all(w, g, s)) return e;
  OR_LAUNCH(store_decoded<T>, blocks_for(g.count), kThreads, 0, s)
  (w, static_cast<typename E::S*>(out), static_cast<const typename E::S*>(fb), g.count, g.block,
   seed, scale, fb_scale, policy == Erasure::kRescale, lost, counters);
  return int(cudaGetLastError());
}

struct ReduceArgs {
  const void* srcs[kMaxSourcesPerLaunch];
  uint8_t lossy[kMaxSourcesPerLaunch];
  int nsrc;
  bool first;  // start from zero (else from the workspace)
  bool last;   // write the output (else the workspace)
};

// Elements [i, i + N) of the reduction, each source's N elements in one run (N = 1: one
// element). Returns the erased elements found.
template <DType T, unsigned N>
__device__ __forceinline__ unsigned reduce_run(const ReduceArgs& a, typename Elem<T>::A* sum,
                                               typename Elem<T>::A* got, typename Elem<T>::S* out,
                                               uint64_t i, int nranks, RedOp op, Erasure policy) {
  using E = Elem<T>;
  using S = typename E::S;
  using A = typename E::A;
  Run<A, N> acc, cnt;
  if (a.first) {
    for (unsigned j = 0; j < N; ++j) acc.e[j] = cnt.e[j] = A(0);
  } else {
    acc = load_run<N>(sum + i);
    cnt = load_run<N>(got + i);
  }
  unsigned lost = 0;
  // kInFlight sources' runs are loaded before any is added: a thread keeps that many loads in
  // flight, which the DRAM's latency needs (a loop that loads one source at a time has one).
  constexpr int kInFlight = 4;
  for (int k0 = 0; k0 < a.nsrc; k0 += kInFlight) {
    Run<S, N> v[kInFlight] = {};  // those past nsrc stay unread (zeroed for the compiler)
    for (int q = 0; q < kInFlight; ++q)
      if (k0 + q < a.nsrc) v[q] = load_run<N>(static_cast<const S*>(a.srcs[k0 + q]) + i);
    for (int q = 0; q < kInFlight && k0 + q < a.nsrc; ++q) {  // rank order, as the host kernel
      if (a.lossy[k0 + q] != 0) {
        for (unsigned j = 0; j < N; ++j) {
          const bool erased = v[q].e[j] == E::kMarker;
          acc.e[j] += erased ? A(0) : E::load(v[q].e[j]);
          cnt.e[j] += erased ? A(0) : A(1);
          lost += erased ? 1 : 0;
        }
      } else {  // a source without loss skips the marker test (the same for every thread)
        for (unsigned j = 0; j < N; ++j) {
          acc.e[j] += E::load(v[q].e[j]);
          cnt.e[j] += A(1);
        }
      }
    }
  }
  if (a.last) {
    // A sum to which every rank contributed is finish_reduce's sum times nranks / nranks = 1:
    // the sum itself, as the host's lossless path writes it, without a division per element.
    bool whole = op == RedOp::kSum;
    for (unsigned j = 0; j < N; ++j) whole = whole && cnt.e[j] == A(nranks);
    Run<S, N> o;
    if (whole) {
      for (unsigned j = 0; j < N; ++j) o.e[j] = E::store(acc.e[j]);
    } else {
      for (unsigned j = 0; j < N; ++j)
        o.e[j] = E::store(finish_reduce(acc.e[j], cnt.e[j], A(nranks), op, policy));
    }
    store_run<N>(out + i, o);
  } else {
    store_run<N>(sum + i, acc);
    store_run<N>(got + i, cnt);
  }
  return lost;
}

// N elements per thread and trip (16 bytes of each source where every pointer is 16-byte
// aligned, else N = 1); the last n % N elements one per thread.
template <DType T, unsigned N>
__global__ void reduce_kernel(ReduceArgs a, typename Elem<T>::A* sum, typename Elem<T>::A* got,
                              typename Elem<T>::S* out, uint64_t n, int nranks, RedOp op,
                              Erasure policy, unsigned long long* counters) {
  const uint64_t id = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x, runs = n / N;
  unsigned lost = 0;
  for (uint64_t r = id; r < runs; r += uint64_t(gridDim.x) * blockDim.x)
    lost += reduce_run<T, N>(a, sum, got, out, r * N, nranks, op, policy);
  if (N > 1 && id < n - runs * N)
    lost += reduce_run<T, 1>(a, sum, got, out, runs * N + id, nranks, op, policy);
  add_count(&counters[kLostPhase1], lost);
}

template <DType T>
int reduce_t(const void* const* srcs, const uint8_t* lossy, int nranks, void* out, size_t n,
             RedOp op, Erasure policy, void* work, unsigned long long* counters, Stream s) {
  using E = Elem<T>;
  using A = typename E::A;
  using S = typename E::S;
  constexpr unsigned V = 16 / sizeof(S);
  // The workspace only when one launch cannot take every source (reduce_work_bytes is 0
  // otherwise): no kernel gets a pointer past the end of an allocation, used or not.
  const bool staged = nranks > kMaxSourcesPerLaunch;
  A* sum = staged ? static_cast<A*>(work) : nullptr;
  A* got = staged ? sum + n : nullptr;
  bool vec = is_aligned16(out) && is_aligned16(sum) && is_aligned16(got);
  for (int k = 0; k < nranks; ++k) vec = vec && is_aligned16(srcs[k]);
  for (int first = 0; first < nranks; first += kMaxSourcesPerLaunch) {
    ReduceArgs a{};
    a.nsrc = nranks - first < kMaxSourcesPerLaunch ? nranks - first : kMaxSourcesPerLaunch;
    for (int k = 0; k < a.nsrc; ++k) {
      a.srcs[k] = srcs[first + k];
      a.lossy[k] = lossy != nullptr ? lossy[first + k] : 0;
    }
    a.first = first == 0;
    a.last = first + a.nsrc == nranks;
    if (vec) {
      const auto kernel = reduce_kernel<T, V>;  // one macro argument
      OR_LAUNCH(kernel, blocks_for(n / V), kThreads, 0, s)
      (a, sum, got, static_cast<S*>(out), n, nranks, op, policy, counters);
    } else {
      const auto kernel = reduce_kernel<T, 1>;
      OR_LAUNCH(kernel, blocks_for(n), kThreads, 0, s)
      (a, sum, got, static_cast<S*>(out), n, nranks, op, policy, counters);
    }
  }
  return int(cudaGetLastError());
}

// Elements [i, i + N) of the fill. own is read only where something was lost (rarely), and the
// store is skipped where nothing was lost in place (dst == rcv): the same bytes either way.
template <DType T, unsigned N>
__device__ __forceinline__ unsigned fill_run(typename Elem<T>::S* dst,
                                             const typename Elem<T>::S* rcv,
                                             const typename Elem<T>::S* own, uint64_t i,
                                             typename Elem<T>::A sc) {
  using E = Elem<T>;
  const Run<typename E::S, N> v = load_run<N>(rcv + i);
  unsigned lost = 0;
  for (unsigned j = 0; j < N; ++j) lost += v.e[j] == E::kMarker ? 1 : 0;
  if (lost == 0) {
    if (dst != rcv) store_run<N>(dst + i, v);
    return 0;
  }
  const Run<typename E::S, N> w = load_run<N>(own + i);
  Run<typename E::S, N> o;
  for (unsigned j = 0; j < N; ++j)
    o.e[j] = v.e[j] == E::kMarker ? E::store(E::load(w.e[j]) * sc) : v.e[j];
  store_run<N>(dst + i, o);
  return lost;
}

// As reduce_kernel: N elements per thread and trip, the last n % N one per thread.
template <DType T, unsigned N>
__global__ void fill_kernel(typename Elem<T>::S* dst, const typename Elem<T>::S* rcv,
                            const typename Elem<T>::S* own, uint64_t n, double own_scale,
                            Erasure policy, unsigned long long* counters) {
  using A = typename Elem<T>::A;
  const A sc = policy == Erasure::kZero ? A(0) : A(own_scale);
  const uint64_t id = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x, runs = n / N;
  unsigned lost = 0;
  for (uint64_t r = id; r < runs; r += uint64_t(gridDim.x) * blockDim.x)
    lost += fill_run<T, N>(dst, rcv, own, r * N, sc);
  if (N > 1 && id < n - runs * N) lost += fill_run<T, 1>(dst, rcv, own, runs * N + id, sc);
  add_count(&counters[kLostPhase2], lost);
}

template <DType T>
int fill_t(void* dst, const void* rcv, const void* own, size_t n, double own_scale, Erasure policy,
           unsigned long long* counters, Stream s) {
  using S = typename Elem<T>::S;
  constexpr unsigned V = 16 / sizeof(S);
  if (is_aligned16(dst) && is_aligned16(rcv) && is_aligned16(own)) {
    const auto kernel = fill_kernel<T, V>;  // one macro argument
    OR_LAUNCH(kernel, blocks_for(n / V), kThreads, 0, s)
    (static_cast<S*>(dst), static_cast<const S*>(rcv), static_cast<const S*>(own), n, own_scale,
     policy, counters);
  } else {
    const auto kernel = fill_kernel<T, 1>;
    OR_LAUNCH(kernel, blocks_for(n), kThreads, 0, s)
    (static_cast<S*>(dst), static_cast<const S*>(rcv), static_cast<const S*>(own), n, own_scale,
     policy, counters);
  }
  return int(cudaGetLastError());
}

// One thread: the verdict is a handful of loads, and a launch keeps it in stream order.
__global__ void safeguard_flag_k(unsigned long long* counters, const unsigned long long* base,
                                 double threshold, unsigned long long expected,
                                 unsigned char* flag) {
  const unsigned long long lost =
      (counters[kLostPhase1] - base[kLostPhase1]) + (counters[kLostPhase2] - base[kLostPhase2]);
  const bool f = expected > 0 && double(lost) / double(expected) > threshold;
  if (f) {
    *flag |= kFlagLost;  // beside the non-finite bit that nonfinite_flag_k wrote first
    counters[kSafeguardFlags] += 1;
  }
}

// Counts data's NaN/Inf elements into counters[kNonFiniteElements]: a read-only grid-stride
// pass, one atomic per warp that found any (none in the common, all-finite case).
template <DType T>
__global__ void count_nonfinite_kernel(const typename Elem<T>::S* data, uint64_t n,
                                       unsigned long long* counters) {
  unsigned found = 0;
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n;
       i += uint64_t(gridDim.x) * blockDim.x)
    found += is_nonfinite<T>(data[i]) ? 1 : 0;
  add_count(&counters[kNonFiniteElements], found);
}

template <DType T>
int count_nonfinite_t(const void* data, size_t n, unsigned long long* counters, Stream s) {
  using S = typename Elem<T>::S;
  OR_LAUNCH(count_nonfinite_kernel<T>, blocks_for(n), kThreads, 0, s)
  (static_cast<const S*>(data), n, counters);
  return int(cudaGetLastError());
}

// One thread, as safeguard_flag_k: the rank's flag byte from what the scan counted since the
// last snapshot (base).
__global__ void nonfinite_flag_k(const unsigned long long* counters, const unsigned long long* base,
                                 unsigned char* flag) {
  const bool f = counters[kNonFiniteElements] != base[kNonFiniteElements];
  *flag = f ? kFlagNonFinite : 0;
}

// Every thread reads the N flag bytes (a few, in cache) and agrees on the verdict; with it the
// output becomes the quiet NaN, element by element, and one thread counts the call.
template <DType T>
__global__ void nonfinite_verdict_kernel(typename Elem<T>::S* out, uint64_t n,
                                         const unsigned char* flags, int nranks,
                                         unsigned long long* counters) {
  bool any = false;
  for (int q = 0; q < nranks; ++q) any = any || (flags[q] & kFlagNonFinite) != 0;
  if (!any) return;
  const uint64_t first = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x;
  if (first == 0) counters[kNonFiniteCalls] += 1;
  for (uint64_t i = first; i < n; i += uint64_t(gridDim.x) * blockDim.x)
    out[i] = Elem<T>::kQuietNaN;
}

template <DType T>
int nonfinite_verdict_t(void* out, size_t n, const uint8_t* flags, int nranks,
                        unsigned long long* counters, Stream s) {
  using S = typename Elem<T>::S;
  OR_LAUNCH(nonfinite_verdict_kernel<T>, blocks_for(n), kThreads, 0, s)
  (static_cast<S*>(out), n, flags, nranks, counters);
  return int(cudaGetLastError());
}

}  // namespace

#define OR_CUDA_DISPATCH(t, fn, ...)        \
  switch (t) {                              \
    case DType::kF32:                       \
      return fn<DType::kF32>(__VA_ARGS__);  \
    case DType::kF16:                       \
      return fn<DType::kF16>(__VA_ARGS__);  \
    case DType::kBF16:                      \
      return fn<DType::kBF16>(__VA_ARGS__); \
    case DType::kF64:                       \
      return fn<DType::kF64>(__VA_ARGS__);  \
  }                                         \
  return int(cudaErrorInvalidValue)

size_t hadamard_work_bytes(const HadamardGeometry& g, DType t) {
  const size_t a = t == DType::kF64 ? 8 : 4;
  return g.encoded() * a + g.blocks() * sizeof(unsigned) + 256;
}

int encode(DType t, const void* in, void* out, const HadamardGeometry& g, uint64_t seed, void* work,
           Stream s) {
  OR_CUDA_DISPATCH(t, encode_t, in, out, g, seed, work, s);
}

int decode(DType t, const void* in, void* out, const HadamardGeometry& g, uint64_t seed,
           double scale, const void* fallback, double fallback_scale, Erasure policy, void* work,
           unsigned long long* counters, Stream s) {
  OR_CUDA_DISPATCH(t, decode_t, in, out, g, seed, scale, fallback, fallback_scale, policy, work,
                   counters, s);
}

size_t reduce_work_bytes(size_t n, int nranks) {
  return nranks > kMaxSourcesPerLaunch ? 2 * n * sizeof(double) : 0;
}

int reduce(DType t, const void* const* srcs, const uint8_t* lossy, int nranks, void* out, size_t n,
           RedOp op, Erasure policy, void* work, unsigned long long* counters, Stream s) {
  OR_CUDA_DISPATCH(t, reduce_t, srcs, lossy, nranks, out, n, op, policy, work, counters, s);
}

int fill_lost(DType t, void* dst, const void* received, const void* own, size_t n, double own_scale,
              Erasure policy, unsigned long long* counters, Stream s) {
  OR_CUDA_DISPATCH(t, fill_t, dst, received, own, n, own_scale, policy, counters, s);
}

int safeguard_flag(unsigned long long* counters, const unsigned long long* base, double threshold,
                   uint64_t expected, uint8_t* flag, Stream s) {
  OR_LAUNCH(safeguard_flag_k, 1, 1, 0, s)(counters, base, threshold, expected, flag);
  return int(cudaGetLastError());
}

int count_nonfinite(DType t, const void* data, size_t n, unsigned long long* counters, Stream s) {
  OR_CUDA_DISPATCH(t, count_nonfinite_t, data, n, counters, s);
}

int nonfinite_flag(const unsigned long long* counters, const unsigned long long* base,
                   uint8_t* flag, Stream s) {
  OR_LAUNCH(nonfinite_flag_k, 1, 1, 0, s)(counters, base, flag);
  return int(cudaGetLastError());
}

int nonfinite_verdict(DType t, void* out, size_t n, const uint8_t* flags, int nranks,
                      unsigned long long* counters, Stream s) {
  OR_CUDA_DISPATCH(t, nonfinite_verdict_t, out, n, flags, nranks, counters, s);
}

int last_error() {
  return int(cudaGetLastError());
}
const char* error_string(int err) {
  return cudaGetErrorString(cudaError_t(err));
}

}  // namespace optireduce::coll::cuda
