// CUDA kernels of Transpose AllReduce: Hadamard encode/decode (shared-memory butterflies within
// a chunk of up to kSharedElems, one global pass per remaining stage), the erasure-aware
// reduction, the phase-2 fill. Per-element math comes from collectives/elem.h and math.h, the
// same functions the host kernels use; the host kernels are the oracles in the tests.
#include <cuda_runtime.h>

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
    work[j] = j < count ? apply_sign(E::load(in[j]), sign_mask(seed, j % block)) : typename E::A(0);
  }
}

// work[j] = received coordinate or 0 if erased; lost[b] counts the erased ones of block b.
template <DType T>
__global__ void load_count(const typename Elem<T>::S* in, typename Elem<T>::A* work, uint64_t len,
                           uint64_t block, unsigned* lost, unsigned long long* counters) {
  using E = Elem<T>;
  unsigned mine = 0;
  for (uint64_t j = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; j < len;
       j += uint64_t(gridDim.x) * blockDim.x) {
    const typename E::S v = in[j];
    const bool erased = v == E::kMarker;
    work[j] = erased ? typename E::A(0) : E::load(v);
    if (erased) {
      atomicAdd(&lost[j / block], 1u);  // rare: only where something was lost
      ++mine;
    }
  }
  add_count(&counters[kLostPhase2], mine);
}

// In-place unnormalised FWHT of every chunk of `chunk` elements in work[base, base + len).
template <class A>
__global__ void fwht_shared(A* work, uint64_t base, uint64_t chunk) {
  extern __shared__ unsigned char smem_raw[];
  A* s = reinterpret_cast<A*>(smem_raw);
  A* g = work + base + blockIdx.x * chunk;
  for (uint64_t k = threadIdx.x; k < chunk; k += blockDim.x) s[k] = g[k];
  __syncthreads();
  for (uint64_t h = 1; h < chunk; h <<= 1) {
    for (uint64_t p = threadIdx.x; p < chunk / 2; p += blockDim.x) {
      const uint64_t i = (p / h) * 2 * h + p % h;
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
  for (uint64_t p = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; p < len / 2;
       p += uint64_t(gridDim.x) * blockDim.x) {
    const uint64_t blk = p / half, q = p % half;
    const uint64_t i = base + blk * d + (q / h) * 2 * h + q % h;
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
  for (uint64_t j = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; j < len;
       j += uint64_t(gridDim.x) * blockDim.x) {
    const uint64_t d = dim_of(j / block, count, block);
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
  unsigned empty = 0;
  for (uint64_t j = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; j < count;
       j += uint64_t(gridDim.x) * blockDim.x) {
    const uint64_t b = j / block, d = dim_of(b, count, block);
    const uint64_t kept = d - lost[b];
    if (kept == 0 && rescale) {
      out[j] = E::store(E::load(fb[j]) * A(fb_scale));
      empty += j % block == 0 ? 1 : 0;
      continue;
    }
    const double dk = rescale ? double(d) / double(kept) : 1.0;
    const A s = A(scale * dk / sqrt(double(d)));
    out[j] = E::store(apply_sign(work[j] * s, sign_mask(seed, j % block)));
  }
  add_count(&counters[kBlocksEmpty], empty);
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
      fwht_shared<A><<<unsigned(nchunks), threads, chunk * sizeof(A), s>>>(work, r.base, chunk);
    }
    for (uint64_t h = chunk; h < r.d; h <<= 1)
      fwht_stage<A><<<blocks_for(r.len / 2), kThreads, 0, s>>>(work, r.base, r.len, r.d, h);
  }
  return int(cudaGetLastError());
}

template <DType T>
int encode_t(const void* in, void* out, const HadamardGeometry& g, uint64_t seed, void* work,
             Stream s) {
  using E = Elem<T>;
  using A = typename E::A;
  const uint64_t len = g.encoded();
  A* w = static_cast<A*>(work);
  load_signed<T><<<blocks_for(len), kThreads, 0, s>>>(static_cast<const typename E::S*>(in), w,
                                                      g.count, len, g.block, seed);
  if (int e = fwht_all(w, g, s)) return e;
  store_encoded<T><<<blocks_for(len), kThreads, 0, s>>>(w, static_cast<typename E::S*>(out),
                                                        g.count, len, g.block);
  return int(cudaGetLastError());
}

template <DType T>
int decode_t(const void* in, void* out, const HadamardGeometry& g, uint64_t seed, double scale,
             const void* fb, double fb_scale, Erasure policy, void* work,
             unsigned long long* counters, Stream s) {
  using E = Elem<T>;
  using A = typename E::A;
  const uint64_t len = g.encoded();
  A* w = static_cast<A*>(work);
  unsigned* lost = reinterpret_cast<unsigned*>(w + len);
  cudaMemsetAsync(lost, 0, g.blocks() * sizeof(unsigned), s);
  load_count<T><<<blocks_for(len), kThreads, 0, s>>>(static_cast<const typename E::S*>(in), w, len,
                                                     g.block, lost, counters);
  if (int e = fwht_all(w, g, s)) return e;
  store_decoded<T><<<blocks_for(g.count), kThreads, 0, s>>>(
      w, static_cast<typename E::S*>(out), static_cast<const typename E::S*>(fb), g.count, g.block,
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

template <DType T>
__global__ void reduce_kernel(ReduceArgs a, typename Elem<T>::A* sum, typename Elem<T>::A* got,
                              typename Elem<T>::S* out, uint64_t n, int nranks, RedOp op,
                              Erasure policy, unsigned long long* counters) {
  using E = Elem<T>;
  using A = typename E::A;
  unsigned lost = 0;
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n;
       i += uint64_t(gridDim.x) * blockDim.x) {
    A acc = a.first ? A(0) : sum[i];
    A cnt = a.first ? A(0) : got[i];
    for (int k = 0; k < a.nsrc; ++k) {  // rank order, as the host kernel: same rounding
      const typename E::S v = static_cast<const typename E::S*>(a.srcs[k])[i];
      const bool erased = a.lossy[k] && v == E::kMarker;
      acc += erased ? A(0) : E::load(v);
      cnt += erased ? A(0) : A(1);
      lost += erased ? 1 : 0;
    }
    if (a.last) {
      out[i] = E::store(finish_reduce(acc, cnt, A(nranks), op, policy));
    } else {
      sum[i] = acc;
      got[i] = cnt;
    }
  }
  add_count(&counters[kLostPhase1], lost);
}

template <DType T>
int reduce_t(const void* const* srcs, const uint8_t* lossy, int nranks, void* out, size_t n,
             RedOp op, Erasure policy, void* work, unsigned long long* counters, Stream s) {
  using E = Elem<T>;
  using A = typename E::A;
  A* sum = static_cast<A*>(work);
  A* got = sum + n;
  for (int first = 0; first < nranks; first += kMaxSourcesPerLaunch) {
    ReduceArgs a{};
    a.nsrc = nranks - first < kMaxSourcesPerLaunch ? nranks - first : kMaxSourcesPerLaunch;
    for (int k = 0; k < a.nsrc; ++k) {
      a.srcs[k] = srcs[first + k];
      a.lossy[k] = lossy != nullptr ? lossy[first + k] : 0;
    }
    a.first = first == 0;
    a.last = first + a.nsrc == nranks;
    reduce_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(
        a, sum, got, static_cast<typename E::S*>(out), n, nranks, op, policy, counters);
  }
  return int(cudaGetLastError());
}

template <DType T>
__global__ void fill_kernel(typename Elem<T>::S* dst, const typename Elem<T>::S* rcv,
                            const typename Elem<T>::S* own, uint64_t n, double own_scale,
                            Erasure policy, unsigned long long* counters) {
  using E = Elem<T>;
  using A = typename E::A;
  const A sc = policy == Erasure::kZero ? A(0) : A(own_scale);
  unsigned lost = 0;
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n;
       i += uint64_t(gridDim.x) * blockDim.x) {
    const typename E::S v = rcv[i];
    const bool erased = v == E::kMarker;
    dst[i] = erased ? E::store(E::load(own[i]) * sc) : v;
    lost += erased ? 1 : 0;
  }
  add_count(&counters[kLostPhase2], lost);
}

template <DType T>
int fill_t(void* dst, const void* rcv, const void* own, size_t n, double own_scale, Erasure policy,
           unsigned long long* counters, Stream s) {
  using S = typename Elem<T>::S;
  fill_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(
      static_cast<S*>(dst), static_cast<const S*>(rcv), static_cast<const S*>(own), n, own_scale,
      policy, counters);
  return int(cudaGetLastError());
}

// One thread: the verdict is a handful of loads, and a launch keeps it in stream order.
__global__ void safeguard_flag_k(unsigned long long* counters, const unsigned long long* base,
                                 double threshold, unsigned long long expected,
                                 unsigned char* flag) {
  const unsigned long long lost = (counters[kLostPhase1] - base[kLostPhase1]) +
                                  (counters[kLostPhase2] - base[kLostPhase2]);
  const bool f = expected > 0 && double(lost) / double(expected) > threshold;
  *flag = f ? 1 : 0;
  if (f) counters[kSafeguardFlags] += 1;
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
  safeguard_flag_k<<<1, 1, 0, s>>>(counters, base, threshold, expected, flag);
  return int(cudaGetLastError());
}

int last_error() {
  return int(cudaGetLastError());
}
const char* error_string(int err) {
  return cudaGetErrorString(cudaError_t(err));
}

}  // namespace optireduce::coll::cuda
