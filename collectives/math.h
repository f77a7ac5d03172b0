// Per-element math shared by the host kernels (g++) and the CUDA kernels (nvcc): fp16/bf16
// conversions, the erasure marker, the random signs of the Hadamard diagonal D. Header-only, no
// standard library beyond <cstdint>, every function usable on host and device.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define OR_HD __host__ __device__ __forceinline__
#else
#define OR_HD inline __attribute__((always_inline))
#endif

namespace optireduce::coll {

// --- bit casts that compile in both worlds (std::bit_cast is not usable in device code with
// every nvcc we target; a union-free memcpy-free cast through the builtin is).
OR_HD float bits_to_f32(uint32_t b) {
  return __builtin_bit_cast(float, b);
}
OR_HD uint32_t f32_to_bits(float f) {
  return __builtin_bit_cast(uint32_t, f);
}
OR_HD double bits_to_f64(uint64_t b) {
  return __builtin_bit_cast(double, b);
}
OR_HD uint64_t f64_to_bits(double f) {
  return __builtin_bit_cast(uint64_t, f);
}

// --- the erasure marker. The transport fills every missing byte range of a bounded receive
// with the 16-bit pattern 0x7FF1 repeated, starting at 8-byte aligned payload boundaries, so an
// element of 2, 4 or 8 bytes is either wholly received or wholly the pattern. Each width's
// pattern is a NaN that no arithmetic produces by itself (default NaNs are 0x7E00 / 0x7FC00000 /
// 0x7FF8...), so an element equal to it means "lost".
inline constexpr uint16_t kMarker16 = 0x7FF1;
inline constexpr uint32_t kMarker32 = 0x7FF17FF1u;
inline constexpr uint64_t kMarker64 = 0x7FF17FF17FF17FF1ull;

// --- fp16 (IEEE binary16) <-> fp32, branch-free so loops over them vectorise. On the GPU the
// numbers go through the hardware's conversions (cvt, one instruction where the portable
// sequence is about ten: the 16-bit kernels spent half their instructions here), which round the
// same way (to nearest even, subnormals kept, overflow to inf); NaNs still take the portable
// path, whose payload rule (kept, made quiet) the hardware's canonical NaN would break.
OR_HD float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t em = h & 0x7FFFu;
  // Inf and NaN keep their payload: all exponent bits set.
  const uint32_t special = (em << 13) | 0x7F800000u;
#if defined(__CUDA_ARCH__)
  float hw;
  asm("cvt.f32.f16 %0, %1;" : "=f"(hw) : "h"(h));
  return em >= 0x7C00u ? bits_to_f32(special | sign) : hw;
#else
  // Shifting exponent and mantissa into fp32 position and multiplying by 2^112 rebiases the
  // exponent (15 -> 127) and turns fp16 subnormals into the right normal fp32 values at once.
  const uint32_t scaled = f32_to_bits(bits_to_f32(em << 13) * 0x1p112f);
  return bits_to_f32((em >= 0x7C00u ? special : scaled) | sign);
#endif
}

OR_HD uint16_t f32_to_f16(float f) {
  const uint32_t x = f32_to_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7FFFFFFFu;
  const uint32_t nan = 0x7E00u | ((ax >> 13) & 0x3FFu);  // NaN stays NaN, payload kept
#if defined(__CUDA_ARCH__)
  unsigned short hw;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(hw) : "f"(f));
  return ax > 0x7F800000u ? uint16_t(nan | sign) : uint16_t(hw);
#else
  // Normal range: rebias the exponent and round to nearest even on the 13 dropped bits.
  const uint32_t v = ax - 0x38000000u;
  const uint32_t normal = (v + 0x0FFFu + ((v >> 13) & 1u)) >> 13;
  // Below 2^-14: adding 0.5 makes the FPU round at the fp16 subnormal step (2^-24), and the
  // low mantissa bits of the sum are the subnormal's bits.
  const uint32_t sub = f32_to_bits(bits_to_f32(ax) + 0.5f) - 0x3F000000u;
  uint32_t h = ax < 0x38800000u ? sub : normal;
  h = ax >= 0x477FF000u ? 0x7C00u : h;  // overflow -> inf
  h = ax > 0x7F800000u ? nan : h;
  return uint16_t(h | sign);
#endif
}

// --- bf16 <-> fp32: bf16 is the top half of an fp32.
OR_HD float bf16_to_f32(uint16_t b) {
  return bits_to_f32(uint32_t(b) << 16);
}
OR_HD uint16_t f32_to_bf16(float f) {
  const uint32_t x = f32_to_bits(f);
  const uint32_t rounded = (x + 0x7FFFu + ((x >> 16) & 1u)) >> 16;  // nearest even
  const uint32_t nan = (x >> 16) | 0x0040u;                         // keep NaN quiet and NaN
  return uint16_t((x & 0x7FFFFFFFu) > 0x7F800000u ? nan : rounded);
}

// --- random signs of D. Sign j of a Hadamard block is bit (j % 64) of a 64-bit hash of
// (seed, j / 64): every rank and every device derives the same D from the call's seed without
// communication, and one hash serves 64 elements.
OR_HD uint64_t mix64(uint64_t z) {  // a finaliser with full avalanche (splitmix64 constants)
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
OR_HD uint64_t sign_word(uint64_t seed, uint64_t word) {
  return mix64(seed + 0x9E3779B97F4A7C15ull * (word + 1));
}
// The fp32 sign-bit mask (0 or 0x80000000) of element j of a block.
OR_HD uint32_t sign_mask(uint64_t seed, uint64_t j) {
  return uint32_t((sign_word(seed, j >> 6) >> (j & 63)) & 1u) << 31;
}

// The seed of call `call` of a communicator whose ranks agreed on `comm_seed` at init.
OR_HD uint64_t call_seed(uint64_t comm_seed, uint64_t call) {
  return mix64(comm_seed ^ mix64(call + 0x632BE59BD9B4E019ull));
}

// --- Hadamard geometry: a bucket of `count` elements is cut into blocks of `block` elements
// (a power of two); the tail block is padded with zeros to the next power of two.
OR_HD uint64_t next_pow2(uint64_t x) {
  uint64_t p = 1;
  while (p < x) p <<= 1;
  return p;
}
OR_HD uint64_t encoded_length(uint64_t count, uint64_t block) {
  const uint64_t tail = count % block;
  return count - tail + (tail ? next_pow2(tail) : 0);
}

}  // namespace optireduce::coll
