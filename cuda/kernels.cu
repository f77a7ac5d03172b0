// CUDA kernels of Transpose AllReduce: Hadamard encode/decode (shared-memory butterflies within
// a chunk of up to kSharedElems, one global pass per remaining stage), the erasure-aware
// reduction, the phase-2 fill, the non-finite scan and verdict. Per-element math comes from
// collectives/elem.h and math.h, the same functions the host kernels use; the host kernels are the
// oracles in the tests. The same source also runs on the CPU under tests/kernels_emu
// (device_compat.h).
//
// reduce and fill move 16 bytes per access (Run) where every pointer allows it (16-byte aligned),
// else one element per thread; the element math is the same either way: a 16-bit element is 2
// bytes to move and a few dozen instructions to convert and convert back, so one 2-byte load per
// thread and source left them bound by instructions rather than by DRAM.
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
// blockDim.x).

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

// The regions of a bucket for the fused kernels: its full blocks, then its tail (one block of
// next_pow2(tail)). Calls launch(first block, number of blocks, log2 d) for each non-empty one.
template <class F>
void for_each_region(const HadamardGeometry& g, F launch) {
  const uint64_t nfull = g.count / g.block;
  if (nfull > 0) launch(uint64_t(0), nfull, log2_pow2(g.block));
  if (g.count > nfull * g.block)
    launch(nfull, uint64_t(1), log2_pow2(next_pow2(g.count - nfull * g.block)));
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
  if (g.block <= kSharedElems) {
    for_each_region(g, [&](uint64_t first, uint64_t nblocks, unsigned log2d) {
      const unsigned d = 1u << log2d;
      OR_LAUNCH(encode_fused<T>, nblocks, d < kThreads ? d : kThreads, d * sizeof(A), s)
      (static_cast<const typename E::S*>(in), static_cast<typename E::S*>(out), g.count, g.block,
       first, log2d, seed);
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
  if (g.block <= kSharedElems) {
    for_each_region(g, [&](uint64_t first, uint64_t nblocks, unsigned log2d) {
      const unsigned d = 1u << log2d;
      OR_LAUNCH(decode_fused<T>, nblocks, d < kThreads ? d : kThreads, d * sizeof(A), s)
      (static_cast<const typename E::S*>(in), static_cast<typename E::S*>(out),
       static_cast<const typename E::S*>(fb), g.count, g.block, first, log2d, seed, scale, fb_scale,
       policy == Erasure::kRescale, counters);
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
  for (int k = 0; k < a.nsrc; ++k) {  // rank order, as the host kernel: same rounding
    const Run<S, N> v = load_run<N>(static_cast<const S*>(a.srcs[k]) + i);
    const bool lossy = a.lossy[k] != 0;
    for (unsigned j = 0; j < N; ++j) {
      const bool erased = lossy && v.e[j] == E::kMarker;
      acc.e[j] += erased ? A(0) : E::load(v.e[j]);
      cnt.e[j] += erased ? A(0) : A(1);
      lost += erased ? 1 : 0;
    }
  }
  if (a.last) {
    Run<S, N> o;
    for (unsigned j = 0; j < N; ++j)
      o.e[j] = E::store(finish_reduce(acc.e[j], cnt.e[j], A(nranks), op, policy));
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
