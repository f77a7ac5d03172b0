// Tests of collectives/math.h and elem.h: fp16/bf16 conversions against independent references,
// the erasure marker for every type at every 2-byte alignment, the random signs.
#include "collectives/math.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "collectives/elem.h"
#include "collectives/kernels_host.h"

namespace optireduce::coll {
namespace {

// fp16 value of bits h computed from the definition, not by bit manipulation.
double f16_reference(uint16_t h) {
  const int sign = h >> 15, e = (h >> 10) & 0x1F, m = h & 0x3FF;
  double v;
  if (e == 0) {
    v = std::ldexp(double(m), -24);
  } else if (e == 31) {
    v = m ? NAN : INFINITY;
  } else {
    v = std::ldexp(double(1024 + m), e - 25);
  }
  return sign ? -v : v;
}

TEST(Fp16, ToF32MatchesDefinitionForAllValues) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const double ref = f16_reference(uint16_t(h));
    const float got = f16_to_f32(uint16_t(h));
    if (std::isnan(ref)) {
      EXPECT_TRUE(std::isnan(got)) << h;
    } else {
      EXPECT_EQ(double(got), ref) << h;
      EXPECT_EQ(std::signbit(got), bool(h & 0x8000)) << h;
    }
  }
}

TEST(Fp16, RoundTripIsIdentityForAllNonNaN) {
  for (uint32_t h = 0; h < 65536; ++h) {
    if (std::isnan(f16_reference(uint16_t(h)))) continue;
    EXPECT_EQ(f32_to_f16(f16_to_f32(uint16_t(h))), h) << h;
  }
}

// Round to nearest even by exhaustive comparison with the two neighbouring fp16 values.
uint16_t f16_round_reference(float f) {
  if (std::isnan(f)) return 0x7E00;
  const double x = f;
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double a = std::fabs(x);
  if (a >= 65520.0) return sign | 0x7C00;
  // Largest fp16 magnitude <= a, by binary search over the ordered positive encodings.
  uint16_t lo = 0, hi = 0x7BFF;
  while (lo < hi) {
    const uint16_t mid = uint16_t((lo + hi + 1) / 2);
    if (f16_reference(mid) <= a)
      lo = mid;
    else
      hi = uint16_t(mid - 1);
  }
  const double below = f16_reference(lo), above = f16_reference(uint16_t(lo + 1));
  uint16_t pick;
  if (a - below < above - a)
    pick = lo;
  else if (a - below > above - a)
    pick = uint16_t(lo + 1);
  else
    pick = (lo & 1) ? uint16_t(lo + 1) : lo;
  return sign | pick;
}

TEST(Fp16, FromF32RoundsToNearestEven) {
  std::mt19937 rng(7);
  std::vector<float> xs = {0.f,       -0.f,     1.f,      65504.f, 65519.f,        65520.f,
                           1e-8f,     2.98e-8f, 5.96e-8f, 6.1e-5f, 6.1035156e-05f, 1e30f,
                           -3.14159f, INFINITY, -INFINITY};
  std::uniform_int_distribution<uint32_t> bits(0, 0xFFFFFFFFu);
  for (int i = 0; i < 200000; ++i) {
    float f;
    const uint32_t b = bits(rng);
    std::memcpy(&f, &b, 4);
    // Concentrate on the fp16 range, where rounding matters.
    if (std::fabs(f) > 1e6f || std::fabs(f) < 1e-9f)
      f = std::ldexp(float(b & 0xFFFFFF) / 16777216.0f, int(b >> 27) - 20);
    xs.push_back(f);
  }
  // Exact halfway cases between neighbours (ties to even).
  for (uint16_t h = 1; h < 0x7BFF; h = uint16_t(h + 97)) {
    xs.push_back(float((f16_reference(h) + f16_reference(uint16_t(h + 1))) / 2));
  }
  for (float f : xs) {
    if (std::isnan(f)) continue;
    EXPECT_EQ(f32_to_f16(f), f16_round_reference(f)) << f;
  }
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(NAN))));
}

TEST(Bf16, RoundTripAndRounding) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = bf16_to_f32(uint16_t(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(f))));
      continue;
    }
    EXPECT_EQ(f32_to_bf16(f), h);
  }
  std::mt19937 rng(3);
  std::uniform_int_distribution<uint32_t> bits(0, 0x7F7EFFFFu);  // below the largest bf16
  for (int i = 0; i < 100000; ++i) {
    const uint32_t b = bits(rng);
    const float f = bits_to_f32(b);
    const uint16_t lo = uint16_t(b >> 16), hi = uint16_t(lo + 1);
    const double dl = double(f) - double(bf16_to_f32(lo));
    const double dh = double(bf16_to_f32(hi)) - double(f);
    const uint16_t want = dl < dh ? lo : dl > dh ? hi : ((lo & 1) ? hi : lo);
    EXPECT_EQ(f32_to_bf16(f), want) << b;
  }
}

#ifdef __FLT16_MAX__
TEST(Fp16, AgreesWithCompilerFloat16) {
  std::mt19937 rng(11);
  std::normal_distribution<float> g(0, 100);
  for (int i = 0; i < 100000; ++i) {
    const float f = g(rng) * (i % 7 == 0 ? 1e-5f : 1.f);
    const _Float16 h = static_cast<_Float16>(f);
    uint16_t hb;
    std::memcpy(&hb, &h, 2);
    EXPECT_EQ(f32_to_f16(f), hb) << f;
  }
}
#endif

// The marker region read at any 2-byte aligned offset, with any element width, is the marker of
// that width and a NaN of every type.
TEST(Marker, EveryTypeAtEveryTwoByteAlignment) {
  std::vector<uint8_t> buf(96, 0x11);
  const size_t hole_begin = 16, hole_end = 72;  // payload boundaries are 8-byte aligned
  for (size_t i = hole_begin; i < hole_end; i += 2) {
    buf[i] = kMarker16 & 0xFF;
    buf[i + 1] = kMarker16 >> 8;
  }
  for (size_t off = hole_begin; off + 8 <= hole_end; off += 2) {
    uint16_t h;
    uint32_t w;
    uint64_t d;
    std::memcpy(&h, &buf[off], 2);
    std::memcpy(&w, &buf[off], 4);
    std::memcpy(&d, &buf[off], 8);
    EXPECT_EQ(h, kMarker16);
    EXPECT_EQ(w, kMarker32);
    EXPECT_EQ(d, kMarker64);
    EXPECT_TRUE(std::isnan(f16_to_f32(h)));
    EXPECT_TRUE(std::isnan(bf16_to_f32(h)));
    EXPECT_TRUE(std::isnan(bits_to_f32(w)));
    EXPECT_TRUE(std::isnan(bits_to_f64(d)));
  }
  // Element-aligned counts: the hole covers (72-16)/size elements of each type.
  EXPECT_EQ(count_markers(DType::kF16, buf.data(), 48), 28u);
  EXPECT_EQ(count_markers(DType::kBF16, buf.data(), 48), 28u);
  EXPECT_EQ(count_markers(DType::kF32, buf.data(), 24), 14u);
  EXPECT_EQ(count_markers(DType::kF64, buf.data(), 12), 7u);
}

// Arithmetic never manufactures the marker: default NaNs and conversions of NaN differ from it.
TEST(Marker, NotProducedByArithmetic) {
  volatile float z = 0;
  const float nan32 = z / z;
  const double nan64 = double(z) / double(z);
  EXPECT_NE(f32_to_bits(nan32), kMarker32);
  EXPECT_NE(f64_to_bits(nan64), kMarker64);
  EXPECT_NE(f32_to_f16(nan32), kMarker16);
  EXPECT_NE(f32_to_bf16(nan32), kMarker16);
  EXPECT_NE(f32_to_f16(INFINITY), kMarker16);
}

TEST(Signs, DeterministicBalancedAndSeedDependent) {
  std::vector<uint32_t> a(4096), b(4096), c(4096);
  fill_sign_masks(a.data(), a.size(), 42);
  fill_sign_masks(b.data(), b.size(), 42);
  fill_sign_masks(c.data(), c.size(), 43);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  int neg = 0;
  for (size_t j = 0; j < a.size(); ++j) {
    EXPECT_TRUE(a[j] == 0 || a[j] == 0x80000000u);
    EXPECT_EQ(a[j], sign_mask(42, j));
    neg += a[j] != 0;
  }
  EXPECT_NEAR(neg, 2048, 200);
  EXPECT_NE(call_seed(1, 0), call_seed(1, 1));
  EXPECT_NE(call_seed(1, 0), call_seed(2, 0));
}

TEST(Geometry, EncodedLengthPadsOnlyTheTail) {
  EXPECT_EQ(encoded_length(0, 16), 0u);
  EXPECT_EQ(encoded_length(1, 16), 1u);
  EXPECT_EQ(encoded_length(3, 16), 4u);
  EXPECT_EQ(encoded_length(16, 16), 16u);
  EXPECT_EQ(encoded_length(17, 16), 17u);
  EXPECT_EQ(encoded_length(21, 16), 24u);
  EXPECT_EQ(encoded_length(1000, 256), 768u + 256u);
  HadamardGeometry g{21, 16};
  EXPECT_EQ(g.blocks(), 2u);
  EXPECT_EQ(g.data_len(1), 5u);
  EXPECT_EQ(g.dim(1), 8u);
}

}  // namespace
}  // namespace optireduce::coll
