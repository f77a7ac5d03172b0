// Element types of the collectives and their traits (storage bits, accumulator, conversions,
// erasure test), shared by the host kernels and the CUDA kernels.
#pragma once

#include <cstddef>
#include <cstdint>

#include "collectives/math.h"

namespace optireduce::coll {

enum class DType : uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2, kF64 = 3 };
enum class RedOp : uint8_t { kSum = 0, kAvg = 1 };
// What an erased (lost) element becomes.
//  kRescale: phase 1 excludes it and rescales the sum per element (sum x N / received), phase 2
//            estimates it (own contribution x N, or d/k in the Hadamard domain). Unbiased.
//  kZero:    counted as zero in both phases, no rescaling (the published release's phase 1).
enum class Erasure : uint8_t { kRescale = 0, kZero = 1 };

// Counters the kernels add to (host and device); read back once per call.
// kSafeguardFlags counts calls flag_lost found above the threshold: on the GPU the flag is
// known only on the device, in stream order, so it is read back with the other counters.
// kNonFiniteElements counts NaN/Inf elements flag_nonfinite found in this rank's input (the
// device derives the rank's flag from it); kNonFiniteCalls counts calls whose agreed verdict
// was "some rank's input held a NaN or Inf" (optiStats_t.nonfiniteCalls).
enum Counter : int {
  kLostPhase1 = 0,
  kLostPhase2 = 1,
  kBlocksEmpty = 2,
  kSafeguardFlags = 3,
  kNonFiniteElements = 4,
  kNonFiniteCalls = 5,
  kNumCounters = 6
};

// Bits of a rank's flag byte, the one byte per rank that a bounded call's agreement exchanges
// (tar.cc): both verdicts travel in one exact exchange.
enum Flag : uint8_t {
  kFlagLost = 1,       // the safeguard: this rank lost more than the threshold
  kFlagNonFinite = 2,  // this rank's input holds a NaN or an Inf
};

constexpr size_t dtype_size(DType t) {
  return t == DType::kF64 ? 8 : t == DType::kF32 ? 4 : 2;
}

// Traits: `S` is the storage word (the bits, so that the marker test is an integer compare),
// `A` the accumulator (fp32 for the 16-bit types: one rounding per result, not per add).
template <DType T>
struct Elem;
template <>
struct Elem<DType::kF32> {
  using S = uint32_t;
  using A = float;
  static constexpr S kMarker = kMarker32;
  static constexpr S kExponent = 0x7F800000u;  // all ones: Inf or NaN
  static constexpr S kQuietNaN = 0x7FC00000u;  // the canonical quiet NaN (not the marker)
  static OR_HD A load(S s) { return bits_to_f32(s); }
  static OR_HD S store(A a) { return f32_to_bits(a); }
};
template <>
struct Elem<DType::kF16> {
  using S = uint16_t;
  using A = float;
  static constexpr S kMarker = kMarker16;
  static constexpr S kExponent = 0x7C00;
  static constexpr S kQuietNaN = 0x7E00;
  static OR_HD A load(S s) { return f16_to_f32(s); }
  static OR_HD S store(A a) { return f32_to_f16(a); }
};
template <>
struct Elem<DType::kBF16> {
  using S = uint16_t;
  using A = float;
  static constexpr S kMarker = kMarker16;
  static constexpr S kExponent = 0x7F80;
  static constexpr S kQuietNaN = 0x7FC0;
  static OR_HD A load(S s) { return bf16_to_f32(s); }
  static OR_HD S store(A a) { return f32_to_bf16(a); }
};
template <>
struct Elem<DType::kF64> {
  using S = uint64_t;
  using A = double;
  static constexpr S kMarker = kMarker64;
  static constexpr S kExponent = 0x7FF0000000000000ull;
  static constexpr S kQuietNaN = 0x7FF8000000000000ull;
  static OR_HD A load(S s) { return bits_to_f64(s); }
  static OR_HD S store(A a) { return f64_to_bits(a); }
};

// Whether a stored element is a NaN or an Inf (exponent all ones), from its bits: the same test
// on the host and the device, for every NaN encoding (quiet, signalling, negative, the marker).
template <DType T>
OR_HD bool is_nonfinite(typename Elem<T>::S s) {
  return (s & Elem<T>::kExponent) == Elem<T>::kExponent;
}

// Applies an fp32 sign mask (0 or 0x80000000) to an accumulator value.
OR_HD float apply_sign(float v, uint32_t mask) {
  return bits_to_f32(f32_to_bits(v) ^ mask);
}
OR_HD double apply_sign(double v, uint32_t mask) {
  return bits_to_f64(f64_to_bits(v) ^ (uint64_t(mask) << 32));
}

// The phase-1 result of one element from its accumulated sum and received-contribution count
// (own contribution always counts): see Erasure.
template <class A>
OR_HD A finish_reduce(A sum, A received, A nranks, RedOp op, Erasure policy) {
  if (policy == Erasure::kZero) return op == RedOp::kSum ? sum : sum / nranks;
  return op == RedOp::kSum ? sum * (nranks / received) : sum / received;
}

}  // namespace optireduce::coll
