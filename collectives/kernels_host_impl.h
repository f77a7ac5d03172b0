// The host kernels' templates, compiled once per instruction-set variant (kernels_host.cc:
// baseline x86-64; kernels_host_avx2.cc: AVX2 + FMA + F16C) inside namespace OR_KERNEL_NS, so
// the same source vectorises for each and kernels_host.cc picks one at run time. Include only
// from those two files.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "collectives/kernels_host.h"

#if defined(__AVX2__) || defined(OR_KERNEL_F16C)
#include <immintrin.h>
#endif

#ifndef OR_KERNEL_NS
#error "define OR_KERNEL_NS before including kernels_host_impl.h"
#endif

namespace optireduce::coll::OR_KERNEL_NS {
namespace {

// Element conversions: the shared branch-free ones, except fp16 where F16C has an instruction
// (vcvtph2ps / vcvtps2ph, round to nearest even like f32_to_f16). Through its intrinsics, not
// _Float16 casts: clang before 15 has no _Float16 on x86.
template <DType T>
inline typename Elem<T>::A ld(typename Elem<T>::S s) {
#ifdef OR_KERNEL_F16C
  if constexpr (T == DType::kF16) return _cvtsh_ss(s);
#endif
  return Elem<T>::load(s);
}
template <DType T>
inline typename Elem<T>::S st(typename Elem<T>::A a) {
#ifdef OR_KERNEL_F16C
  if constexpr (T == DType::kF16) return _cvtss_sh(a, _MM_FROUND_TO_NEAREST_INT);
#endif
  return Elem<T>::store(a);
}

// Runs of conversions with a per-element step f(value, l) on the fp32/fp64 side:
// load_run: out[l] = f(ld(in[l]), l); store_run: out[l] = st(f(in[l], l)), l < m. GCC 12 does
// not vectorise the scalar conversions above (one vcvtph2ps per element), so with F16C the
// fp16 runs convert 8 elements per instruction (the same instructions, hence the same bits) in
// a loop of their own, and f runs in a second loop over the run, still in L1.
template <DType T, class F>
inline void load_run(typename Elem<T>::A* __restrict out, const typename Elem<T>::S* __restrict in,
                     size_t m, F&& f) {
#ifdef OR_KERNEL_F16C
  if constexpr (T == DType::kF16) {
    size_t l = 0;
    for (; l + 8 <= m; l += 8)
      _mm256_storeu_ps(out + l,
                       _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + l))));
    for (; l < m; ++l) out[l] = ld<T>(in[l]);
    for (l = 0; l < m; ++l) out[l] = f(out[l], l);
    return;
  }
#endif
  for (size_t l = 0; l < m; ++l) out[l] = f(ld<T>(in[l]), l);
}
template <DType T, class F>
inline void store_run(typename Elem<T>::S* __restrict out, const typename Elem<T>::A* __restrict in,
                      size_t m, F&& f) {
#ifdef OR_KERNEL_F16C
  if constexpr (T == DType::kF16) {
    float tmp[64];  // f's results, 64 at a time
    size_t l = 0;
    for (; l + 64 <= m; l += 64) {
      for (size_t t = 0; t < 64; ++t) tmp[t] = f(in[l + t], l + t);
      for (size_t t = 0; t < 64; t += 8)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + l + t),
                         _mm256_cvtps_ph(_mm256_loadu_ps(tmp + t), _MM_FROUND_CUR_DIRECTION));
    }
    for (; l < m; ++l) out[l] = st<T>(f(in[l], l));
    return;
  }
#endif
  for (size_t l = 0; l < m; ++l) out[l] = st<T>(f(in[l], l));
}

// Elements per chunk of the reduction: the fp32 sum and count of a chunk (8 KiB) stay in L1
// while the N sources stream through.
constexpr size_t kChunk = 1024;

// --- The fast Walsh-Hadamard transform.
//
// Stage h (h = 1, 2, 4, ..., d/2) maps each pair (a, b) = (x[i], x[i + h]) with i & h == 0 to
// (a + b, a - b). The stages run in that order and each keeps exactly those operations, however
// they are grouped into passes below, so every grouping gives the same bits as one stage per
// pass (and as the CUDA kernels). What the grouping changes is the number of passes over the
// block: the transform is bound by loads and stores, not by the additions.
//
// The passes work on vectors of W elements (GCC vector extensions: AVX registers in the AVX2
// variant, 16-byte SSE2 or NEON registers elsewhere). The first pass converts a group of
// kFirstRadix vectors of input into the block, runs the stages h < W inside each register
// (shuffles) and log2(kFirstRadix) stages across the registers, while the group is in L1. Each
// later pass runs up to log2(kRadix) stages across kRadix vectors h apart (radix 16 measured
// slower: AVX2's 16 registers spill). The output conversion stays a separate sequential pass:
// fusing it into the last pass writes kRadix output streams h apart, which measured slower once
// the bucket comes from and goes to DRAM.
#if defined(__AVX__)
constexpr size_t kVecBytes = 32;
#else
constexpr size_t kVecBytes = 16;
#endif
constexpr size_t kFirstRadix = 8;
constexpr size_t kRadix = 8;

template <class A>
struct Vec {
  static constexpr size_t W = kVecBytes / sizeof(A);
  typedef A V __attribute__((vector_size(kVecBytes)));

  static V load(const A* p) {
    V v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  static void store(A* p, V v) { std::memcpy(p, &v, sizeof v); }

  // Stage h < W inside one register: t holds each lane's partner (lane ^ h); a lane without bit
  // h is the a of its pair and takes v + t = a + b, a lane with it takes t - v = a - b.
  template <size_t h, size_t... l>
  static V lane_stage(V v, std::index_sequence<l...>) {
    const V t = __builtin_shufflevector(v, v, (l ^ h)...);
#if defined(__AVX2__) && defined(__FMA__)
    // One instruction instead of add, sub and blend: v * (+-1) is exact, so fma(v, +-1, t)
    // rounds t + v or t - v once, exactly as the add or the sub would (signed zeros, infinities
    // and a single NaN operand included).
    constexpr V sign = {(l & h ? A(-1) : A(1))...};
    if constexpr (sizeof(A) == 4) {
      return _mm256_fmadd_ps(v, sign, t);
    } else {
      return _mm256_fmadd_pd(v, sign, t);
    }
#else
    return __builtin_shufflevector(v + t, t - v, (l & h ? l + W : l)...);
#endif
  }
  template <size_t h = 1>
  static V lane_stages(V v) {
    if constexpr (h < W) {
      return lane_stages<2 * h>(lane_stage<h>(v, std::make_index_sequence<W>()));
    } else {
      return v;
    }
  }
};

// Stages across R registers, register k holding the elements k * h' on (h' the pass's stride):
// stage s pairs register k with k + s.
template <size_t R, class V>
inline void butterflies(V* v) {
  for (size_t s = 1; s < R; s *= 2) {
    for (size_t k = 0; k < R; ++k) {
      if (k & s) continue;
      const V a = v[k], b = v[k + s];
      v[k] = a + b;
      v[k + s] = a - b;
    }
  }
}

// Blocks smaller than one first-pass group (tails): two stages per pass, one left over when
// log2(d) is odd.
template <class A>
void fwht_small(A* __restrict x, size_t d) {
  size_t h = 1;
  for (; 4 * h <= d; h *= 4) {
    for (size_t i = 0; i < d; i += 4 * h) {
      for (size_t j = i; j < i + h; ++j) {
        const A a0 = x[j], a1 = x[j + h], a2 = x[j + 2 * h], a3 = x[j + 3 * h];
        const A b0 = a0 + a1, b1 = a0 - a1, b2 = a2 + a3, b3 = a2 - a3;
        x[j] = b0 + b2;
        x[j + h] = b1 + b3;
        x[j + 2 * h] = b0 - b2;
        x[j + 3 * h] = b1 - b3;
      }
    }
  }
  if (2 * h <= d) {
    for (size_t j = 0; j < h; ++j) {
      const A a = x[j], b = x[j + h];
      x[j] = a + b;
      x[j + h] = a - b;
    }
  }
}

// Fills x[0, d) through in(i, m) (which writes x[i, i + m)) and runs the first stages on each
// group as soon as it is in; returns the first stage not yet run.
template <class A, class In>
size_t fwht_first(A* __restrict x, size_t d, In&& in) {
  using VA = Vec<A>;
  using V = typename VA::V;
  constexpr size_t kGroup = kFirstRadix * VA::W;
  if (d < kGroup) {
    in(size_t(0), d);
    fwht_small(x, d);
    return d;
  }
  for (size_t i = 0; i < d; i += kGroup) {
    in(i, kGroup);  // still in L1 when loaded back
    V v[kFirstRadix];
    for (size_t k = 0; k < kFirstRadix; ++k) v[k] = VA::lane_stages(VA::load(x + i + k * VA::W));
    butterflies<kFirstRadix>(v);
    for (size_t k = 0; k < kFirstRadix; ++k) VA::store(x + i + k * VA::W, v[k]);
  }
  return kGroup;
}

// Stages h, 2h, ... (log2 R of them) over registers h apart, h >= W.
template <size_t R, class A>
void radix_pass(A* __restrict x, size_t d, size_t h) {
  using VA = Vec<A>;
  using V = typename VA::V;
  for (size_t i = 0; i < d; i += R * h) {
    for (size_t j = i; j < i + h; j += VA::W) {
      V v[R];
      for (size_t k = 0; k < R; ++k) v[k] = VA::load(x + j + k * h);
      butterflies<R>(v);
      for (size_t k = 0; k < R; ++k) VA::store(x + j + k * h, v[k]);
    }
  }
}

// Runs the stages from h on (h from fwht_first).
template <class A>
void fwht_rest(A* __restrict x, size_t d, size_t h) {
  for (; h * kRadix <= d; h *= kRadix) radix_pass<kRadix>(x, d, h);
  if (h * 4 == d) radix_pass<4>(x, d, h);
  if (h * 2 == d) radix_pass<2>(x, d, h);
}

template <class A>
void fwht_impl(A* __restrict x, size_t d) {
  fwht_rest(x, d, fwht_first(x, d, [](size_t, size_t) {}));
}

// While a group of a block is read in, the same group of the next block is asked for from
// memory. A block is read in one burst and then transformed in L1 for as long again, so the
// hardware prefetcher, which follows the bursts, left every block's first lines to miss.
// Measured with a 64 MiB bucket of fp32 in blocks of 4096 (the default): encode 0.69 -> 0.46 ns
// per element, decode 0.65 -> 0.51 (best of 7 runs each, AVX2). Blocks under 4 KiB are read
// often enough for the hardware prefetcher alone (fp32 at 256: no gain, a few percent lost to
// the extra instructions).
template <class S>
inline bool reads_ahead(size_t block) {
  return block * sizeof(S) >= 4096;
}
// Elements [i, i + m) of the next block, which holds `next` elements (0: none), as far as it
// goes.
template <class S>
inline void read_ahead(const S* next_block, size_t next, size_t i, size_t m) {
  if (i >= next) return;
  const char* c = reinterpret_cast<const char*>(next_block + i);
  const size_t bytes = std::min(m, next - i) * sizeof(S);
  for (size_t o = 0; o < bytes; o += 64) __builtin_prefetch(c + o, 0, 3);
}

// One block of working precision per thread, grown to the largest block seen: encode and decode
// need the block in fp32 (fp64) while the transform runs, never a copy of the whole bucket.
template <class A>
A* block_buffer(size_t d) {
  thread_local std::vector<A> buf;
  if (buf.size() < d) buf.resize(d);
  return buf.data();
}

template <DType T>
void encode_t(const void* in_v, void* out_v, const HadamardGeometry& g,
              const uint32_t* __restrict masks) {
  using E = Elem<T>;
  using S = typename E::S;
  using A = typename E::A;
  const S* in = static_cast<const S*>(in_v);
  S* out = static_cast<S*>(out_v);
  A* __restrict buf = block_buffer<A>(g.block);
  const bool ahead = reads_ahead<S>(g.block);
  for (uint64_t b = 0, nb = g.blocks(); b < nb; ++b) {
    const size_t n = g.data_len(b), d = g.dim(b);
    const S* __restrict src = in + b * g.block;
    S* __restrict dst = out + b * g.block;
    const size_t next = b + 1 < nb ? g.data_len(b + 1) : 0;
    const S* next_src = next != 0 ? src + g.block : nullptr;
    // D x, zero-padded from n to d.
    const size_t h = fwht_first(buf, d, [=](size_t i, size_t m) {
      const auto sign = [mk = masks + i](A a, size_t l) { return apply_sign(a, mk[l]); };
      if (ahead) read_ahead(next_src, next, i, m);
      if (i + m <= n) {
        load_run<T>(buf + i, src + i, m, sign);
      } else {
        const size_t end = std::max(i, n);
        load_run<T>(buf + i, src + i, end - i, sign);
        for (size_t j = end; j < i + m; ++j) buf[j] = A(0);
      }
    });
    fwht_rest(buf, d, h);
    const A s = A(1) / std::sqrt(A(d));
    store_run<T>(dst, buf, d, [s](A a, size_t) { return a * s; });
  }
}

template <DType T>
DecodeResult decode_t(const void* in_v, void* out_v, const HadamardGeometry& g,
                      const uint32_t* __restrict masks, double scale, const void* fb_v,
                      double fb_scale, Erasure policy) {
  const bool rescale = policy == Erasure::kRescale;
  using E = Elem<T>;
  using S = typename E::S;
  using A = typename E::A;
  const S* in = static_cast<const S*>(in_v);
  S* out = static_cast<S*>(out_v);
  const S* fb = static_cast<const S*>(fb_v);
  A* __restrict buf = block_buffer<A>(g.block);
  const bool ahead = reads_ahead<S>(g.block);
  DecodeResult r;
  for (uint64_t b = 0, nb = g.blocks(); b < nb; ++b) {
    const size_t n = g.data_len(b), d = g.dim(b);
    const S* __restrict src = in + b * g.block;
    S* dst = out + b * g.block;
    const size_t next = b + 1 < nb ? g.data_len(b + 1) : 0;
    const S* next_src = next != 0 ? src + g.block : nullptr;
    uint64_t kept = 0;
    // First stages fused with the load; a block that turns out empty wastes them, but that is
    // the rare case.
    const size_t h = fwht_first(buf, d, [=, &kept](size_t i, size_t m) {
      uint32_t k = 0;  // m is one group: 32-bit lanes vectorise better than 64
      if (ahead) read_ahead(next_src, next, i, m);
      load_run<T>(buf + i, src + i, m, [&k, sv = src + i](A a, size_t l) {
        const bool erased = sv[l] == E::kMarker;
        k += erased ? 0 : 1;
        return erased ? A(0) : a;
      });
      kept += k;
    });
    r.lost += d - kept;
    if (kept == 0 && rescale) {
      // Nothing of this block arrived: an unbiased-in-expectation stand-in is all we can give.
      const S* own = fb + b * g.block;
      const A fs = A(fb_scale);
      for (size_t j = 0; j < n; ++j) dst[j] = st<T>(ld<T>(own[j]) * fs);
      ++r.blocks_empty;
      continue;
    }
    // E[decoded] = (k/d) x for a loss pattern independent of D, hence the d/k.
    const double dk = rescale ? double(d) / double(kept) : 1.0;
    const A s = A(scale * dk / std::sqrt(double(d)));
    fwht_rest(buf, d, h);
    // Only the first n results are data (the rest is the tail's padding).
    store_run<T>(dst, buf, n, [s, masks](A a, size_t j) { return apply_sign(a * s, masks[j]); });
  }
  return r;
}

template <DType T>
uint64_t reduce_t(const void* const* srcs_v, const uint8_t* lossy, int nranks, void* out_v,
                  size_t n, RedOp op, Erasure policy) {
  using E = Elem<T>;
  using S = typename E::S;
  using A = typename E::A;
  S* out = static_cast<S*>(out_v);
  bool any_lossy = false;
  for (int s = 0; s < nranks; ++s) any_lossy |= lossy != nullptr && lossy[s] != 0;
  const A n_ranks = A(nranks);
  uint64_t lost = 0;
  A sum[kChunk];
  A got[kChunk];  // contributions received per element (only when some source is lossy)
  for (size_t c0 = 0; c0 < n; c0 += kChunk) {
    const size_t m = n - c0 < kChunk ? n - c0 : kChunk;
    for (size_t i = 0; i < m; ++i) sum[i] = A(0);
    if (any_lossy)
      for (size_t i = 0; i < m; ++i) got[i] = A(0);
    A clean = 0;  // sources without loss contribute to every element
    for (int s = 0; s < nranks; ++s) {
      const S* __restrict src = static_cast<const S*>(srcs_v[s]) + c0;
      if (lossy != nullptr && lossy[s]) {
        uint64_t erased_here = 0;
        for (size_t i = 0; i < m; ++i) {
          const S v = src[i];
          const bool erased = v == E::kMarker;
          sum[i] += erased ? A(0) : ld<T>(v);
          got[i] += erased ? A(0) : A(1);
          erased_here += erased ? 1 : 0;
        }
        lost += erased_here;
      } else {
        for (size_t i = 0; i < m; ++i) sum[i] += ld<T>(src[i]);
        clean += 1;
      }
    }
    S* __restrict dst = out + c0;
    if (!any_lossy) {
      if (op == RedOp::kSum) {
        for (size_t i = 0; i < m; ++i) dst[i] = st<T>(sum[i]);
      } else {
        for (size_t i = 0; i < m; ++i) dst[i] = st<T>(sum[i] / n_ranks);
      }
    } else {
      for (size_t i = 0; i < m; ++i)
        dst[i] = st<T>(finish_reduce(sum[i], got[i] + clean, n_ranks, op, policy));
    }
  }
  return lost;
}

template <DType T>
uint64_t fill_t(void* dst_v, const void* rcv_v, const void* own_v, size_t n, double own_scale,
                Erasure policy) {
  using E = Elem<T>;
  using S = typename E::S;
  using A = typename E::A;
  S* dst = static_cast<S*>(dst_v);
  const S* rcv = static_cast<const S*>(rcv_v);
  const S* own = static_cast<const S*>(own_v);
  const A s = policy == Erasure::kZero ? A(0) : A(own_scale);
  uint64_t lost = 0;
  for (size_t i = 0; i < n; ++i) {
    const S v = rcv[i];
    const bool erased = v == E::kMarker;
    const S estimate = st<T>(ld<T>(own[i]) * s);
    dst[i] = erased ? estimate : v;
    lost += erased ? 1 : 0;
  }
  return lost;
}

template <DType T>
uint64_t count_t(const void* data_v, size_t n) {
  using S = typename Elem<T>::S;
  const S* data = static_cast<const S*>(data_v);
  uint64_t c = 0;
  for (size_t i = 0; i < n; ++i) c += data[i] == Elem<T>::kMarker ? 1 : 0;
  return c;
}

// Branch-free, so that it vectorises: a bucket is scanned whole on every bounded call.
template <DType T>
uint64_t nonfinite_t(const void* data_v, size_t n) {
  using S = typename Elem<T>::S;
  const S* __restrict data = static_cast<const S*>(data_v);
  uint64_t c = 0;
  for (size_t i = 0; i < n; ++i) c += is_nonfinite<T>(data[i]) ? 1 : 0;
  return c;
}

}  // namespace

#define OR_DISPATCH(t, fn, ...)             \
  switch (t) {                              \
    case DType::kF32:                       \
      return fn<DType::kF32>(__VA_ARGS__);  \
    case DType::kF16:                       \
      return fn<DType::kF16>(__VA_ARGS__);  \
    case DType::kBF16:                      \
      return fn<DType::kBF16>(__VA_ARGS__); \
    case DType::kF64:                       \
      return fn<DType::kF64>(__VA_ARGS__);  \
  }

void fwht_f32(float* x, size_t d) {
  fwht_impl(x, d);
}
void fwht_f64(double* x, size_t d) {
  fwht_impl(x, d);
}

void encode(DType t, const void* in, void* out, const HadamardGeometry& g, const uint32_t* masks) {
  OR_DISPATCH(t, encode_t, in, out, g, masks);
}

DecodeResult decode(DType t, const void* in, void* out, const HadamardGeometry& g,
                    const uint32_t* masks, double scale, const void* fallback,
                    double fallback_scale, Erasure policy) {
  OR_DISPATCH(t, decode_t, in, out, g, masks, scale, fallback, fallback_scale, policy);
  return {};
}

uint64_t reduce(DType t, const void* const* srcs, const uint8_t* lossy, int nranks, void* out,
                size_t n, RedOp op, Erasure policy) {
  OR_DISPATCH(t, reduce_t, srcs, lossy, nranks, out, n, op, policy);
  return 0;
}

uint64_t fill(DType t, void* dst, const void* received, const void* own, size_t n, double own_scale,
              Erasure policy) {
  OR_DISPATCH(t, fill_t, dst, received, own, n, own_scale, policy);
  return 0;
}

uint64_t count(DType t, const void* data, size_t n) {
  OR_DISPATCH(t, count_t, data, n);
  return 0;
}

uint64_t nonfinite(DType t, const void* data, size_t n) {
  OR_DISPATCH(t, nonfinite_t, data, n);
  return 0;
}

#undef OR_DISPATCH

}  // namespace optireduce::coll::OR_KERNEL_NS
