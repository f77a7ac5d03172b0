// Host kernels (see kernels_host.h): the baseline variant of kernels_host_impl.h, the AVX2
// variant where the CPU has it (kernels_host_avx2.cc), and the choice between them.
// Every hot loop is branch-free over contiguous arrays so that the compiler vectorises it; the
// element type is a template parameter resolved once per call, never per element.
#define OR_KERNEL_NS base
#include "collectives/kernels_host_impl.h"
#undef OR_KERNEL_NS

#include <algorithm>
#include <atomic>

#ifdef OR_HAVE_AVX2_KERNELS
#include <cpuid.h>
#endif

namespace optireduce::coll {

#ifdef OR_HAVE_AVX2_KERNELS
// Declarations of the AVX2 variant (kernels_host_avx2.cc).
namespace avx2 {
void fwht_f32(float* x, size_t d);
void fwht_f64(double* x, size_t d);
void encode(DType t, const void* in, void* out, const HadamardGeometry& g, const uint32_t* masks);
DecodeResult decode(DType t, const void* in, void* out, const HadamardGeometry& g,
                    const uint32_t* masks, double scale, const void* fallback,
                    double fallback_scale, Erasure policy);
uint64_t reduce(DType t, const void* const* srcs, const uint8_t* lossy, int nranks, void* out,
                size_t n, RedOp op, Erasure policy);
uint64_t fill(DType t, void* dst, const void* received, const void* own, size_t n, double own_scale,
              Erasure policy);
uint64_t count(DType t, const void* data, size_t n);
uint64_t nonfinite(DType t, const void* data, size_t n);
}  // namespace avx2
#endif

const char* host_simd_name(HostSimd s) {
  return s == HostSimd::kAvx2 ? "avx2" : "none";
}

HostSimd best_host_simd() {
  // Read once: the CPU does not change under a running process.
#ifdef OR_HAVE_AVX2_KERNELS
  // F16C through CPUID (leaf 1, ECX): clang before 15 does not know it as a
  // __builtin_cpu_supports name. AVX2's check covers the OS's saving of the AVX registers.
  static const HostSimd best = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c
               ? HostSimd::kAvx2
               : HostSimd::kNone;
  }();
  return best;
#else
  return HostSimd::kNone;
#endif
}

namespace {
// Relaxed: a selection applies to the kernels called after it in the same thread, and a
// thread that still runs the previous variant gets the same bits.
std::atomic<uint8_t> g_simd{uint8_t(best_host_simd())};
}  // namespace

HostSimd select_host_simd(HostSimd want) {
  const HostSimd s = std::min(want, best_host_simd());
  g_simd.store(uint8_t(s), std::memory_order_relaxed);
  return s;
}

HostSimd host_simd() {
  return HostSimd(g_simd.load(std::memory_order_relaxed));
}

#ifdef OR_HAVE_AVX2_KERNELS
#define OR_PICK(fn) (host_simd() == HostSimd::kAvx2 ? avx2::fn : base::fn)
#else
#define OR_PICK(fn) base::fn
#endif

void fwht(float* x, size_t d) {
  OR_PICK(fwht_f32)(x, d);
}
void fwht(double* x, size_t d) {
  OR_PICK(fwht_f64)(x, d);
}

void fill_sign_masks(uint32_t* mask, size_t d, uint64_t seed) {
  for (size_t w = 0; w * 64 < d; ++w) {
    const uint64_t bits = sign_word(seed, w);
    const size_t end = d - w * 64 < 64 ? d - w * 64 : 64;
    for (size_t j = 0; j < end; ++j) mask[w * 64 + j] = uint32_t((bits >> j) & 1u) << 31;
  }
}

void hadamard_encode(DType t, const void* in, void* out, const HadamardGeometry& g,
                     const uint32_t* masks) {
  OR_PICK(encode)(t, in, out, g, masks);
}

DecodeResult hadamard_decode(DType t, const void* in, void* out, const HadamardGeometry& g,
                             const uint32_t* masks, double scale, const void* fallback,
                             double fallback_scale, Erasure policy) {
  return OR_PICK(decode)(t, in, out, g, masks, scale, fallback, fallback_scale, policy);
}

uint64_t reduce_shard(DType t, const void* const* srcs, const uint8_t* lossy, int nranks, void* out,
                      size_t n, RedOp op, Erasure policy) {
  return OR_PICK(reduce)(t, srcs, lossy, nranks, out, n, op, policy);
}

uint64_t fill_lost(DType t, void* dst, const void* received, const void* own, size_t n,
                   double own_scale, Erasure policy) {
  return OR_PICK(fill)(t, dst, received, own, n, own_scale, policy);
}

uint64_t count_markers(DType t, const void* data, size_t n) {
  return OR_PICK(count)(t, data, n);
}

uint64_t count_nonfinite(DType t, const void* data, size_t n) {
  return OR_PICK(nonfinite)(t, data, n);
}

namespace {
template <DType T>
void fill_quiet_nan(void* out, size_t n) {
  auto* o = static_cast<typename Elem<T>::S*>(out);
  for (size_t i = 0; i < n; ++i) o[i] = Elem<T>::kQuietNaN;
}
}  // namespace

bool apply_nonfinite_verdict(DType t, void* out, size_t n, const uint8_t* flags, int nranks) {
  bool any = false;
  for (int q = 0; q < nranks; ++q) any = any || (flags[q] & kFlagNonFinite) != 0;
  if (!any) return false;
  switch (t) {
    case DType::kF32:
      fill_quiet_nan<DType::kF32>(out, n);
      break;
    case DType::kF16:
      fill_quiet_nan<DType::kF16>(out, n);
      break;
    case DType::kBF16:
      fill_quiet_nan<DType::kBF16>(out, n);
      break;
    case DType::kF64:
      fill_quiet_nan<DType::kF64>(out, n);
      break;
  }
  return true;
}

}  // namespace optireduce::coll
