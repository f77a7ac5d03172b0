// The host kernels' templates, compiled once per instruction-set variant (kernels_host.cc:
// baseline x86-64; kernels_host_avx2.cc: AVX2 + FMA + F16C) inside namespace OR_KERNEL_NS, so
// the same source vectorises for each and kernels_host.cc picks one at run time. Include only
// from those two files.
#include <cmath>
#include <vector>

#include "collectives/kernels_host.h"

#ifndef OR_KERNEL_NS
#error "define OR_KERNEL_NS before including kernels_host_impl.h"
#endif

namespace optireduce::coll::OR_KERNEL_NS {
namespace {

// Element conversions: the shared branch-free ones, except fp16 where F16C has an instruction
// (vcvtph2ps / vcvtps2ph, round to nearest even like f32_to_f16) that the compiler emits for
// _Float16 conversions.
template <DType T>
inline typename Elem<T>::A ld(typename Elem<T>::S s) {
#ifdef OR_KERNEL_F16C
  if constexpr (T == DType::kF16) return static_cast<float>(__builtin_bit_cast(_Float16, s));
#endif
  return Elem<T>::load(s);
}
template <DType T>
inline typename Elem<T>::S st(typename Elem<T>::A a) {
#ifdef OR_KERNEL_F16C
  if constexpr (T == DType::kF16) return __builtin_bit_cast(uint16_t, static_cast<_Float16>(a));
#endif
  return Elem<T>::store(a);
}

// Elements per chunk of the reduction: the fp32 sum and count of a chunk (8 KiB) stay in L1
// while the N sources stream through.
constexpr size_t kChunk = 1024;

template <class A>
void fwht_impl(A* __restrict x, size_t d) {
  size_t h = 1;
  if (d >= 4) {
    // Stages h = 1 and h = 2 at once: a 4-point transform per group of four.
    for (size_t i = 0; i < d; i += 4) {
      const A a0 = x[i], a1 = x[i + 1], a2 = x[i + 2], a3 = x[i + 3];
      const A b0 = a0 + a1, b1 = a0 - a1, b2 = a2 + a3, b3 = a2 - a3;
      x[i] = b0 + b2;
      x[i + 1] = b1 + b3;
      x[i + 2] = b0 - b2;
      x[i + 3] = b1 - b3;
    }
    h = 4;
  }
  // Two stages per pass (radix 4): half the memory traffic of one stage per pass, and the inner
  // loop runs over h >= 4 contiguous elements, which vectorises.
  for (; 4 * h <= d; h *= 4) {
    for (size_t i = 0; i < d; i += 4 * h) {
      A* __restrict p0 = x + i;
      A* __restrict p1 = p0 + h;
      A* __restrict p2 = p1 + h;
      A* __restrict p3 = p2 + h;
      for (size_t j = 0; j < h; ++j) {
        const A a0 = p0[j], a1 = p1[j], a2 = p2[j], a3 = p3[j];
        const A b0 = a0 + a1, b1 = a0 - a1, b2 = a2 + a3, b3 = a2 - a3;
        p0[j] = b0 + b2;
        p1[j] = b1 + b3;
        p2[j] = b0 - b2;
        p3[j] = b1 - b3;
      }
    }
  }
  if (2 * h <= d) {  // one stage left when log2(d) is odd
    for (size_t i = 0; i < d; i += 2 * h) {
      A* __restrict p0 = x + i;
      A* __restrict p1 = p0 + h;
      for (size_t j = 0; j < h; ++j) {
        const A a = p0[j], b = p1[j];
        p0[j] = a + b;
        p1[j] = a - b;
      }
    }
  }
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
  for (uint64_t b = 0, nb = g.blocks(); b < nb; ++b) {
    const size_t n = g.data_len(b), d = g.dim(b);
    const S* __restrict src = in + b * g.block;
    S* __restrict dst = out + b * g.block;
    for (size_t j = 0; j < n; ++j) buf[j] = apply_sign(ld<T>(src[j]), masks[j]);
    for (size_t j = n; j < d; ++j) buf[j] = A(0);
    fwht_impl(buf, d);
    const A s = A(1) / std::sqrt(A(d));
    for (size_t j = 0; j < d; ++j) dst[j] = st<T>(buf[j] * s);
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
  DecodeResult r;
  for (uint64_t b = 0, nb = g.blocks(); b < nb; ++b) {
    const size_t n = g.data_len(b), d = g.dim(b);
    const S* __restrict src = in + b * g.block;
    S* dst = out + b * g.block;
    uint64_t kept = 0;
    for (size_t j = 0; j < d; ++j) {
      const S v = src[j];
      const bool erased = v == E::kMarker;
      buf[j] = erased ? A(0) : ld<T>(v);
      kept += erased ? 0 : 1;
    }
    r.lost += d - kept;
    if (kept == 0 && rescale) {
      // Nothing of this block arrived: an unbiased-in-expectation stand-in is all we can give.
      const S* own = fb + b * g.block;
      const A fs = A(fb_scale);
      for (size_t j = 0; j < n; ++j) dst[j] = st<T>(ld<T>(own[j]) * fs);
      ++r.blocks_empty;
      continue;
    }
    fwht_impl(buf, d);
    // E[decoded] = (k/d) x for a loss pattern independent of D, hence the d/k.
    const double dk = rescale ? double(d) / double(kept) : 1.0;
    const A s = A(scale * dk / std::sqrt(double(d)));
    for (size_t j = 0; j < n; ++j) dst[j] = st<T>(apply_sign(buf[j] * s, masks[j]));
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

#undef OR_DISPATCH

}  // namespace optireduce::coll::OR_KERNEL_NS
