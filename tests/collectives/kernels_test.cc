// Tests of collectives/kernels_host.h: the FWHT against the O(d^2) definition, orthogonality,
// inverse, linearity; Hadamard encode/decode for every type (tail padding included), d/k
// unbiasedness and the burst-loss MSE claim; the erasure-aware reduction and the phase-2 fill.
#include "collectives/kernels_host.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "collectives/elem.h"
#include "tests/collectives/random_elems.h"

namespace optireduce::coll {
namespace {

std::vector<double> hadamard_reference(const std::vector<double>& x) {
  const size_t d = x.size();
  std::vector<double> y(d, 0.0);
  for (size_t i = 0; i < d; ++i)
    for (size_t j = 0; j < d; ++j) y[i] += (std::popcount(i & j) & 1 ? -1.0 : 1.0) * x[j];
  return y;
}

TEST(Fwht, MatchesDefinitionForEverySizeUpTo512) {
  std::mt19937 rng(1);
  std::normal_distribution<double> g;
  for (size_t d = 1; d <= 512; d *= 2) {
    std::vector<double> x(d);
    for (auto& v : x) v = g(rng);
    const auto ref = hadamard_reference(x);
    std::vector<double> y = x;
    fwht(y.data(), d);
    std::vector<float> yf(x.begin(), x.end());
    fwht(yf.data(), d);
    for (size_t i = 0; i < d; ++i) {
      EXPECT_NEAR(y[i], ref[i], 1e-9 * std::sqrt(double(d))) << d << " " << i;
      EXPECT_NEAR(yf[i], ref[i], 1e-4 * std::sqrt(double(d))) << d << " " << i;
    }
  }
}

TEST(Fwht, TwiceIsDTimesIdentityAndLinear) {
  std::mt19937 rng(2);
  std::normal_distribution<double> g;
  const size_t d = 1 << 14;
  std::vector<double> x(d), y(d), z(d);
  for (size_t i = 0; i < d; ++i) {
    x[i] = g(rng);
    y[i] = g(rng);
    z[i] = 2.5 * x[i] - 0.5 * y[i];
  }
  std::vector<double> hx = x, hy = y, hz = z;
  fwht(hx.data(), d);
  fwht(hy.data(), d);
  fwht(hz.data(), d);
  double norm_x = 0, norm_hx = 0;
  for (size_t i = 0; i < d; ++i) {
    EXPECT_NEAR(hz[i], 2.5 * hx[i] - 0.5 * hy[i], 1e-9);
    norm_x += x[i] * x[i];
    norm_hx += hx[i] * hx[i];
  }
  EXPECT_NEAR(norm_hx, double(d) * norm_x, 1e-6 * norm_hx);  // orthogonal up to sqrt(d)
  fwht(hx.data(), d);
  for (size_t i = 0; i < d; ++i) EXPECT_NEAR(hx[i] / double(d), x[i], 1e-9);
}

template <DType T>
std::vector<typename Elem<T>::S> make(const std::vector<double>& v) {
  std::vector<typename Elem<T>::S> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = Elem<T>::store(typename Elem<T>::A(v[i]));
  return out;
}
template <DType T>
double at(const std::vector<typename Elem<T>::S>& v, size_t i) {
  return double(Elem<T>::load(v[i]));
}

template <DType T>
void roundtrip(double tol) {
  std::mt19937 rng(5);
  std::normal_distribution<double> g;
  for (uint64_t count : {1u, 2u, 3u, 7u, 64u, 100u, 1000u, 4096u, 5000u}) {
    for (uint64_t block : {2u, 16u, 256u, 4096u}) {
      HadamardGeometry geo{count, block};
      std::vector<double> x(count);
      for (auto& v : x) v = g(rng);
      auto in = make<T>(x);
      std::vector<typename Elem<T>::S> enc(geo.encoded()), out(count);
      std::vector<uint32_t> masks(block);
      fill_sign_masks(masks.data(), block, 99 + count);
      hadamard_encode(T, in.data(), enc.data(), geo, masks.data());
      // Orthonormal: the energy of each block is kept.
      double e_in = 0, e_enc = 0;
      for (size_t i = 0; i < count; ++i) e_in += at<T>(in, i) * at<T>(in, i);
      for (size_t i = 0; i < enc.size(); ++i) e_enc += at<T>(enc, i) * at<T>(enc, i);
      EXPECT_NEAR(e_enc, e_in, 8 * tol * e_in + 1e-12);
      const DecodeResult r =
          hadamard_decode(T, enc.data(), out.data(), geo, masks.data(), 1.0, in.data(), 1.0);
      EXPECT_EQ(r.lost, 0u);
      for (size_t i = 0; i < count; ++i)
        EXPECT_NEAR(at<T>(out, i), at<T>(in, i), tol * 8 * (1 + std::fabs(at<T>(in, i))))
            << count << " " << block << " " << i;
    }
  }
}

TEST(Hadamard, EncodeDecodeIsIdentityF32) {
  roundtrip<DType::kF32>(1e-6);
}
TEST(Hadamard, EncodeDecodeIsIdentityF64) {
  roundtrip<DType::kF64>(1e-13);
}
TEST(Hadamard, EncodeDecodeIsIdentityF16) {
  roundtrip<DType::kF16>(2e-3);
}
TEST(Hadamard, EncodeDecodeIsIdentityBf16) {
  roundtrip<DType::kBF16>(1.6e-2);
}

// Erases coordinates [b, b + len) of the encoded vector (a contiguous burst, independent of D).
void erase(std::vector<uint32_t>& enc, size_t b, size_t len) {
  for (size_t i = b; i < b + len && i < enc.size(); ++i) enc[i] = kMarker32;
}

TEST(Hadamard, DecodeWithErasuresIsUnbiased) {
  const size_t d = 256;
  HadamardGeometry geo{d, d};
  std::mt19937 rng(8);
  std::normal_distribution<double> g;
  std::vector<double> x(d);
  for (auto& v : x) v = g(rng);
  auto in = make<DType::kF32>(x);
  std::vector<double> mean(d, 0.0);
  const int trials = 4000;
  std::vector<uint32_t> enc(d), out(d), masks(d);
  for (int t = 0; t < trials; ++t) {
    fill_sign_masks(masks.data(), d, uint64_t(t) * 7919 + 1);
    hadamard_encode(DType::kF32, in.data(), enc.data(), geo, masks.data());
    erase(enc, 40, 32);  // 1/8 of the block, the same place every time: only D is random
    const DecodeResult r = hadamard_decode(DType::kF32, enc.data(), out.data(), geo, masks.data(),
                                           1.0, in.data(), 1.0);
    ASSERT_EQ(r.lost, 32u);
    for (size_t i = 0; i < d; ++i) mean[i] += at<DType::kF32>(out, i) / trials;
  }
  // Per-coordinate standard deviation of the estimate is about |x| sqrt(m/k/d) ~ 0.38, so the
  // mean of 4000 trials is within ~0.006 of x; 0.03 is 5 sigma.
  double bias2 = 0;
  for (size_t i = 0; i < d; ++i) {
    EXPECT_NEAR(mean[i], x[i], 0.03) << i;
    bias2 += (mean[i] - x[i]) * (mean[i] - x[i]);
  }
  EXPECT_LT(bias2 / d, 1e-4);
}

// The published toy in spirit: a gradient whose energy sits in one layer, a contiguous burst
// lost over that layer. Without Hadamard the burst's elements are gone; with it the loss becomes
// small noise spread over the whole block. Also checks the converse honestly: averaged over
// burst positions the total squared error is about the same (the transform is orthogonal).
struct BurstMse {
  double plain = 0;     // burst erased in the plain vector, lost elements zeroed
  double hadamard = 0;  // burst erased in the encoded vector, decoded with d/k
};
BurstMse burst_mse(size_t burst_at, int trials) {
  const size_t d = 4096, layer = 256, burst = 64;
  HadamardGeometry geo{d, d};
  std::mt19937 rng(12);
  std::normal_distribution<double> g;
  BurstMse r;
  std::vector<uint32_t> enc(d), out(d), masks(d);
  for (int t = 0; t < trials; ++t) {
    std::vector<double> x(d);
    for (size_t i = 0; i < d; ++i) x[i] = g(rng) * (i >= 1024 && i < 1024 + layer ? 10.0 : 0.5);
    auto in = make<DType::kF32>(x);
    for (size_t i = burst_at; i < burst_at + burst; ++i) r.plain += x[i] * x[i] / d / trials;
    fill_sign_masks(masks.data(), d, uint64_t(t) + 1000);
    hadamard_encode(DType::kF32, in.data(), enc.data(), geo, masks.data());
    erase(enc, burst_at, burst);
    hadamard_decode(DType::kF32, enc.data(), out.data(), geo, masks.data(), 1.0, in.data(), 1.0);
    for (size_t i = 0; i < d; ++i) {
      const double e = at<DType::kF32>(out, i) - x[i];
      r.hadamard += e * e / d / trials;
    }
  }
  return r;
}

TEST(Hadamard, BurstOverAHeavyLayerHasTenfoldLowerMse) {
  const BurstMse m = burst_mse(1024 + 64, 20);
  EXPECT_GT(m.plain, 10 * m.hadamard) << "plain " << m.plain << " hadamard " << m.hadamard;
  RecordProperty("mse_plain", std::to_string(m.plain));
  RecordProperty("mse_hadamard", std::to_string(m.hadamard));
  std::printf("burst on heavy layer: MSE plain %.5f, Hadamard %.5f, ratio %.1f\n", m.plain,
              m.hadamard, m.plain / m.hadamard);
}

TEST(Hadamard, AveragedOverBurstPositionsTheMseIsComparable) {
  double plain = 0, had = 0;
  for (size_t at = 0; at < 4096; at += 256) {
    const BurstMse m = burst_mse(at, 2);
    plain += m.plain;
    had += m.hadamard;
  }
  EXPECT_LT(had, 2 * plain);
  EXPECT_GT(had, plain / 2);
  std::printf("burst at uniform positions: MSE plain %.5f, Hadamard %.5f\n", plain / 16, had / 16);
}

// What TAR's pipelining relies on (tar.cc, BlockProgress): runs of blocks, each transformed as a
// bucket of its own (the run that ends the bucket keeps its short tail), give the bytes of one
// whole-bucket encode and decode, erasures, empty blocks and their fallback included.
TEST(Hadamard, RunsOfBlocksTransformAsInsideTheWholeBucket) {
  std::mt19937 rng(12);
  std::normal_distribution<double> g;
  for (uint64_t count : {4096u * 5 + 1000u, 4096u * 3, 700u}) {
    const uint64_t block = 4096;
    HadamardGeometry geo{count, block};
    std::vector<double> x(count);
    for (auto& v : x) v = g(rng);
    const auto in = make<DType::kF32>(x);
    std::vector<uint32_t> masks(block);
    fill_sign_masks(masks.data(), block, 77);
    std::vector<uint32_t> whole(geo.encoded()), runs(geo.encoded(), 0);
    hadamard_encode(DType::kF32, in.data(), whole.data(), geo, masks.data());
    // Runs of 1, 2, 1, ... blocks.
    auto each_run = [&](auto&& f) {
      for (uint64_t b0 = 0, len = 1; b0 < geo.blocks(); b0 += len, len = 3 - len) {
        const uint64_t b1 = std::min(geo.blocks(), b0 + len);
        f(b0 * block, geo.blocks_from(b0, b1));
      }
    };
    each_run([&](uint64_t at, const HadamardGeometry& sub) {
      hadamard_encode(DType::kF32, in.data() + at, runs.data() + at, sub, masks.data());
    });
    ASSERT_EQ(runs, whole) << count;
    erase(whole, 100, 300);                             // part of block 0
    if (count > 2 * block) erase(whole, block, block);  // all of block 1: the fallback
    std::vector<uint32_t> out_whole(count), out_runs(count);
    const DecodeResult rw = hadamard_decode(DType::kF32, whole.data(), out_whole.data(), geo,
                                            masks.data(), 0.5, in.data(), 2.0);
    DecodeResult rr;
    each_run([&](uint64_t at, const HadamardGeometry& sub) {
      const DecodeResult r = hadamard_decode(DType::kF32, whole.data() + at, out_runs.data() + at,
                                             sub, masks.data(), 0.5, in.data() + at, 2.0);
      rr.lost += r.lost;
      rr.blocks_empty += r.blocks_empty;
    });
    EXPECT_EQ(out_runs, out_whole) << count;
    EXPECT_EQ(rr.lost, rw.lost);
    EXPECT_EQ(rr.blocks_empty, rw.blocks_empty);
  }
}

TEST(Hadamard, EmptyBlockFallsBackToOwnTimesScale) {
  HadamardGeometry geo{20, 8};  // blocks of 8, 8 and a tail of 4
  std::vector<double> x(20);
  for (size_t i = 0; i < 20; ++i) x[i] = double(i) - 7;
  auto in = make<DType::kF32>(x);
  std::vector<uint32_t> enc(geo.encoded()), out(20), masks(8);
  ASSERT_EQ(enc.size(), 20u);
  fill_sign_masks(masks.data(), 8, 5);
  hadamard_encode(DType::kF32, in.data(), enc.data(), geo, masks.data());
  erase(enc, 8, 8);  // all of block 1
  const DecodeResult r =
      hadamard_decode(DType::kF32, enc.data(), out.data(), geo, masks.data(), 1.0, in.data(), 3.0);
  EXPECT_EQ(r.lost, 8u);
  EXPECT_EQ(r.blocks_empty, 1u);
  for (size_t i = 0; i < 20; ++i) {
    const double want = i >= 8 && i < 16 ? 3 * x[i] : x[i];
    EXPECT_NEAR(at<DType::kF32>(out, i), want, 1e-5) << i;
  }
}

template <DType T>
void reduce_matches_reference() {
  using S = typename Elem<T>::S;
  std::mt19937 rng(21);
  std::uniform_int_distribution<int> small(-8, 8);
  for (int n : {2, 3, 5, 8}) {
    for (size_t len : {1u, 7u, 1023u, 1024u, 1025u, 5000u}) {
      std::vector<std::vector<S>> src(size_t(n), std::vector<S>(len, S(0)));
      std::vector<const void*> ptrs;
      for (auto& s : src) {
        for (auto& v : s) v = Elem<T>::store(typename Elem<T>::A(small(rng)));
        ptrs.push_back(s.data());
      }
      std::vector<uint8_t> lossy(size_t(n), 0);
      // Erase a range in the last source and mark it lossy.
      const size_t hole = len / 3, hole_len = len / 4 + 1;
      for (size_t i = hole; i < hole + hole_len && i < len; ++i)
        src[size_t(n - 1)][i] = Elem<T>::kMarker;
      lossy[size_t(n - 1)] = 1;
      for (RedOp op : {RedOp::kSum, RedOp::kAvg}) {
        for (Erasure pol : {Erasure::kRescale, Erasure::kZero}) {
          std::vector<S> out(len);
          const uint64_t lost =
              reduce_shard(T, ptrs.data(), lossy.data(), n, out.data(), len, op, pol);
          EXPECT_EQ(lost, std::min(hole_len, len - hole));
          for (size_t i = 0; i < len; ++i) {
            double sum = 0;
            int got = 0;
            for (int s = 0; s < n; ++s) {
              if (src[size_t(s)][i] == Elem<T>::kMarker) continue;
              sum += double(Elem<T>::load(src[size_t(s)][i]));
              ++got;
            }
            double want;
            if (pol == Erasure::kZero)
              want = op == RedOp::kSum ? sum : sum / n;
            else
              want = op == RedOp::kSum ? sum * n / got : sum / got;
            const double tol =
                T == DType::kF64 || T == DType::kF32 ? 1e-5 : 0.02 * (1 + std::fabs(want));
            EXPECT_NEAR(double(Elem<T>::load(out[i])), want, tol) << n << " " << len << " " << i;
          }
        }
      }
      // No loss, integer data: exact, and in place.
      lossy.assign(size_t(n), 0);
      for (size_t i = 0; i < len; ++i) src[size_t(n - 1)][i] = Elem<T>::store(1);
      std::vector<S> own = src[0];
      reduce_shard(T, ptrs.data(), nullptr, n, src[0].data(), len, RedOp::kSum, Erasure::kRescale);
      for (size_t i = 0; i < len; ++i) {
        double sum = double(Elem<T>::load(own[i]));
        for (int s = 1; s < n; ++s) sum += double(Elem<T>::load(src[size_t(s)][i]));
        EXPECT_EQ(double(Elem<T>::load(src[0][i])), sum);
      }
    }
  }
}

// Every instruction-set variant of the kernels must give the same bits as the baseline one: the
// ranks of one job may run on CPUs of different generations, and a replica whose transform
// rounded differently would drift from the others. Without this test only the variant of the
// CI machine's CPU would ever run. Encode, decode with
// erasures (and a block erased whole), the reduction with lost elements, and the transform, for
// every type, over blocks with a tail.
template <DType T>
void variants_agree() {
  using S = typename Elem<T>::S;
  const HostSimd best = best_host_simd();
  const HostSimd before = host_simd();
  for (const uint64_t block : {uint64_t{64}, uint64_t{4096}}) {
    const HadamardGeometry g{3 * block + 77, block};
    const std::vector<S> in = random_elems<T>(g.count, 7);
    std::vector<uint32_t> masks(block);
    fill_sign_masks(masks.data(), block, 99);
    std::vector<S> want_enc, want_dec;
    std::vector<S> want_red;
    uint64_t want_lost = 0, want_empty = 0, want_red_lost = 0;
    for (int v = 0; v <= int(best); ++v) {
      const HostSimd simd = HostSimd(v);
      ASSERT_EQ(select_host_simd(simd), simd);
      SCOPED_TRACE(std::string(host_simd_name(simd)) + ", block " + std::to_string(block));
      std::vector<S> enc(g.encoded());
      hadamard_encode(T, in.data(), enc.data(), g, masks.data());
      // Erasures: every 5th coordinate of block 0, all of block 1.
      std::vector<S> erased = enc;
      for (uint64_t i = 0; i < block; i += 5) erased[i] = Elem<T>::kMarker;
      for (uint64_t i = block; i < 2 * block; ++i) erased[i] = Elem<T>::kMarker;
      std::vector<S> dec(g.count);
      const DecodeResult r = hadamard_decode(T, erased.data(), dec.data(), g, masks.data(), 0.25,
                                             in.data(), 4.0, Erasure::kRescale);
      std::vector<S> a = random_elems<T>(g.count, 11), b = random_elems<T>(g.count, 13);
      for (uint64_t i = 0; i < g.count; i += 7) b[i] = Elem<T>::kMarker;
      const void* srcs[3] = {in.data(), a.data(), b.data()};
      const uint8_t lossy[3] = {0, 0, 1};
      std::vector<S> red(g.count);
      const uint64_t red_lost =
          reduce_shard(T, srcs, lossy, 3, red.data(), g.count, RedOp::kAvg, Erasure::kRescale);
      if (v == 0) {
        want_enc = enc;
        want_dec = dec;
        want_red = red;
        want_lost = r.lost;
        want_empty = r.blocks_empty;
        want_red_lost = red_lost;
        continue;
      }
      EXPECT_EQ(std::memcmp(enc.data(), want_enc.data(), enc.size() * sizeof(S)), 0);
      EXPECT_EQ(std::memcmp(dec.data(), want_dec.data(), dec.size() * sizeof(S)), 0);
      EXPECT_EQ(std::memcmp(red.data(), want_red.data(), red.size() * sizeof(S)), 0);
      EXPECT_EQ(r.lost, want_lost);
      EXPECT_EQ(r.blocks_empty, want_empty);
      EXPECT_EQ(red_lost, want_red_lost);
    }
  }
  select_host_simd(before);
}

TEST(HostSimd, EveryVariantGivesTheSameBitsF32) {
  variants_agree<DType::kF32>();
}
TEST(HostSimd, EveryVariantGivesTheSameBitsF16) {
  variants_agree<DType::kF16>();
}
TEST(HostSimd, EveryVariantGivesTheSameBitsBf16) {
  variants_agree<DType::kBF16>();
}
TEST(HostSimd, EveryVariantGivesTheSameBitsF64) {
  variants_agree<DType::kF64>();
}

TEST(HostSimd, TheTransformAgreesAtEverySize) {
  const HostSimd before = host_simd();
  for (size_t d = 1; d <= 65536; d *= 2) {
    const std::vector<float> x0 = [&] {
      std::vector<float> x(d);
      std::mt19937 rng{uint32_t(d)};
      std::normal_distribution<float> n;
      for (float& v : x) v = n(rng);
      return x;
    }();
    std::vector<double> y0(x0.begin(), x0.end());
    select_host_simd(HostSimd::kNone);
    std::vector<float> want_f = x0;
    std::vector<double> want_d = y0;
    fwht(want_f.data(), d);
    fwht(want_d.data(), d);
    for (int v = 1; v <= int(best_host_simd()); ++v) {
      ASSERT_EQ(select_host_simd(HostSimd(v)), HostSimd(v));
      std::vector<float> f = x0;
      std::vector<double> dd = y0;
      fwht(f.data(), d);
      fwht(dd.data(), d);
      EXPECT_EQ(std::memcmp(f.data(), want_f.data(), d * sizeof(float)), 0)
          << host_simd_name(HostSimd(v)) << " d=" << d;
      EXPECT_EQ(std::memcmp(dd.data(), want_d.data(), d * sizeof(double)), 0)
          << host_simd_name(HostSimd(v)) << " d=" << d;
    }
  }
  select_host_simd(before);
}

TEST(Reduce, MatchesReferenceF32) {
  reduce_matches_reference<DType::kF32>();
}
TEST(Reduce, MatchesReferenceF16) {
  reduce_matches_reference<DType::kF16>();
}
TEST(Reduce, MatchesReferenceBf16) {
  reduce_matches_reference<DType::kBF16>();
}
TEST(Reduce, MatchesReferenceF64) {
  reduce_matches_reference<DType::kF64>();
}

TEST(FillLost, EstimatesFromOwnOrZero) {
  std::vector<uint16_t> rcv = {Elem<DType::kF16>::store(1), kMarker16, Elem<DType::kF16>::store(3),
                               kMarker16};
  std::vector<uint16_t> own = {Elem<DType::kF16>::store(10), Elem<DType::kF16>::store(20),
                               Elem<DType::kF16>::store(30), Elem<DType::kF16>::store(40)};
  std::vector<uint16_t> dst(4);
  EXPECT_EQ(fill_lost(DType::kF16, dst.data(), rcv.data(), own.data(), 4, 4.0, Erasure::kRescale),
            2u);
  EXPECT_EQ(f16_to_f32(dst[0]), 1.f);
  EXPECT_EQ(f16_to_f32(dst[1]), 80.f);
  EXPECT_EQ(f16_to_f32(dst[2]), 3.f);
  EXPECT_EQ(f16_to_f32(dst[3]), 160.f);
  // In place over the received data, zero policy.
  EXPECT_EQ(fill_lost(DType::kF16, rcv.data(), rcv.data(), own.data(), 4, 4.0, Erasure::kZero), 2u);
  EXPECT_EQ(f16_to_f32(rcv[1]), 0.f);
  EXPECT_EQ(f16_to_f32(rcv[2]), 3.f);
}

}  // namespace
}  // namespace optireduce::coll
