// The CUDA kernels (cuda/kernels.cu) against their host twins (collectives/kernels_host.h):
// Hadamard encode/decode for every type and block size (shared-memory and multi-pass), the
// erasure-aware reduction (fused and multi-launch), the phase-2 fill, and the counters. Skips
// cleanly where no CUDA device is present.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "collectives/kernels_host.h"
#include "tests/collectives/random_elems.h"
#include "cuda/launch.h"

namespace optireduce::coll {
namespace {

class Gpu : public ::testing::Test {
 public:  // the templated checks below drive the fixture's helpers
  void SetUp() override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
    ASSERT_EQ(cudaMalloc(&counters_, sizeof(unsigned long long) * kNumCounters), cudaSuccess);
    ASSERT_EQ(cudaMemset(counters_, 0, sizeof(unsigned long long) * kNumCounters), cudaSuccess);
  }
  void TearDown() override {
    for (void* p : allocs_) cudaFree(p);
    if (counters_) cudaFree(counters_);
  }
  template <class T>
  T* upload(const std::vector<T>& v) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, v.size() * sizeof(T) + 8), cudaSuccess);
    cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
    allocs_.push_back(p);
    return static_cast<T*>(p);
  }
  void* device(size_t bytes) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, bytes + 8), cudaSuccess);
    allocs_.push_back(p);
    return p;
  }
  template <class T>
  std::vector<T> download(const T* p, size_t n) {
    std::vector<T> v(n);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
    return v;
  }
  std::vector<unsigned long long> counters() { return download(counters_, kNumCounters); }

  unsigned long long* counters_ = nullptr;
  std::vector<void*> allocs_;
};

template <DType T>
void encode_decode_matches_host(Gpu* t, uint64_t count, uint64_t block) {
  using S = typename Elem<T>::S;
  const HadamardGeometry g{count, block};
  const auto in = random_elems<T>(count, uint32_t(count + block));
  std::vector<uint32_t> masks(block);
  fill_sign_masks(masks.data(), block, 77);
  std::vector<S> enc_host(g.encoded());
  hadamard_encode(T, in.data(), enc_host.data(), g, masks.data());
  // Erase a burst in the encoded vector so the decode exercises d/k.
  for (size_t i = g.encoded() / 3; i < g.encoded() / 3 + g.encoded() / 20; ++i)
    enc_host[i] = Elem<T>::kMarker;
  std::vector<S> dec_host(count);
  const DecodeResult r =
      hadamard_decode(T, enc_host.data(), dec_host.data(), g, masks.data(), 1.0, in.data(), 2.0);

  S* d_in = t->upload(in);
  S* d_enc = static_cast<S*>(t->device(g.encoded() * sizeof(S)));
  S* d_dec = static_cast<S*>(t->device(count * sizeof(S)));
  void* work = t->device(cuda::hadamard_work_bytes(g, T));
  ASSERT_EQ(cuda::encode(T, d_in, d_enc, g, 77, work, nullptr), 0);
  const auto enc_dev = t->download(d_enc, g.encoded());
  for (size_t i = 0; i < g.encoded(); ++i) {
    if (enc_host[i] == Elem<T>::kMarker) continue;
    const double a = Elem<T>::load(enc_dev[i]), b = Elem<T>::load(enc_host[i]);
    // Different summation order inside the transform: compare with a rounding tolerance.
    ASSERT_NEAR(a, b, 1e-2 * (1 + std::fabs(b))) << count << " " << block << " " << i;
  }
  // Decode the host's (erased) encoding on the device: same holes, same d/k.
  S* d_enc2 = t->upload(enc_host);
  ASSERT_EQ(cuda::decode(T, d_enc2, d_dec, g, 77, 1.0, d_in, 2.0, Erasure::kRescale, work,
                         t->counters_, nullptr),
            0);
  const auto dec_dev = t->download(d_dec, count);
  for (size_t i = 0; i < count; ++i) {
    const double a = Elem<T>::load(dec_dev[i]), b = Elem<T>::load(dec_host[i]);
    ASSERT_NEAR(a, b, 2e-2 * (1 + std::fabs(b))) << count << " " << block << " " << i;
  }
  EXPECT_EQ(t->counters()[kLostPhase2], r.lost);
  cudaMemset(t->counters_, 0, sizeof(unsigned long long) * kNumCounters);
}

TEST_F(Gpu, HadamardMatchesHostInSharedMemory) {
  encode_decode_matches_host<DType::kF32>(this, 100000, 1024);
  encode_decode_matches_host<DType::kF16>(this, 5000, 256);
  encode_decode_matches_host<DType::kBF16>(this, 4099, 4096);
  encode_decode_matches_host<DType::kF64>(this, 777, 64);
}

TEST_F(Gpu, HadamardMatchesHostMultiPass) {
  encode_decode_matches_host<DType::kF32>(this, 300000, 1 << 16);  // beyond shared memory
  encode_decode_matches_host<DType::kF64>(this, 70000, 1 << 15);
}

template <DType T>
void reduce_matches_host(Gpu* t, int n, size_t len) {
  using S = typename Elem<T>::S;
  std::vector<std::vector<S>> src;
  std::vector<const void*> host_ptrs, dev_ptrs;
  std::vector<uint8_t> lossy(size_t(n), 0);
  for (int s = 0; s < n; ++s) {
    src.push_back(random_elems<T>(len, uint32_t(s + 1)));
    if (s % 3 == 1) {
      lossy[size_t(s)] = 1;
      for (size_t i = len / 4; i < len / 2; ++i) src.back()[i] = Elem<T>::kMarker;
    }
  }
  for (int s = 0; s < n; ++s) {
    host_ptrs.push_back(src[size_t(s)].data());
    dev_ptrs.push_back(t->upload(src[size_t(s)]));
  }
  std::vector<S> out_host(len);
  const uint64_t lost = reduce_shard(T, host_ptrs.data(), lossy.data(), n, out_host.data(), len,
                                     RedOp::kSum, Erasure::kRescale);
  S* d_out = static_cast<S*>(t->device(len * sizeof(S)));
  void* work = t->device(cuda::reduce_work_bytes(len, n) + 256);
  ASSERT_EQ(cuda::reduce(T, dev_ptrs.data(), lossy.data(), n, d_out, len, RedOp::kSum,
                         Erasure::kRescale, work, t->counters_, nullptr),
            0);
  const auto out_dev = t->download(d_out, len);
  for (size_t i = 0; i < len; ++i) ASSERT_EQ(out_dev[i], out_host[i]) << n << " " << i;
  EXPECT_EQ(t->counters()[kLostPhase1], lost);
  cudaMemset(t->counters_, 0, sizeof(unsigned long long) * kNumCounters);
}

TEST_F(Gpu, ReduceIsBitwiseEqualToHost) {
  reduce_matches_host<DType::kF32>(this, 4, 100003);
  reduce_matches_host<DType::kF16>(this, 8, 4097);
  reduce_matches_host<DType::kBF16>(this, 3, 1000);
  reduce_matches_host<DType::kF64>(this, 5, 999);
  reduce_matches_host<DType::kF32>(this, 40, 5000);  // several launches through the workspace
}

TEST_F(Gpu, FillMatchesHost) {
  using S = uint16_t;
  auto rcv = random_elems<DType::kBF16>(10000, 5);
  const auto own = random_elems<DType::kBF16>(10000, 6);
  for (size_t i = 100; i < 900; ++i) rcv[i] = kMarker16;
  std::vector<S> host(10000);
  const uint64_t lost =
      fill_lost(DType::kBF16, host.data(), rcv.data(), own.data(), 10000, 4.0, Erasure::kRescale);
  S* d_rcv = upload(rcv);
  S* d_own = upload(own);
  ASSERT_EQ(cuda::fill_lost(DType::kBF16, d_rcv, d_rcv, d_own, 10000, 4.0, Erasure::kRescale,
                            counters_, nullptr),
            0);
  EXPECT_EQ(download(d_rcv, 10000), host);
  EXPECT_EQ(counters()[kLostPhase2], lost);
}

// The fp16 conversions, which the GPU runs through its own cvt instructions (collectives/math.h)
// and the host through the portable sequence: every one of the 65536 halves, converted to fp32,
// scaled (factors that make ties, subnormals, values that overflow to inf, and negatives) and
// converted back by the fill of a wholly lost shard, equals the host's bit for bit. Where the
// host gives a NaN the device must too; the payload may differ there, since the GPU's multiply
// returns its canonical NaN where the host's keeps the operand's.
TEST_F(Gpu, Fp16ConversionsMatchHostBitForBit) {
  constexpr size_t n = 65536;
  std::vector<uint16_t> own(n), rcv(n, kMarker16), host(n);
  for (size_t i = 0; i < n; ++i) own[i] = uint16_t(i);
  uint16_t* d_own = upload(own);
  uint16_t* d_dst = static_cast<uint16_t*>(device(n * sizeof(uint16_t)));
  uint16_t* d_rcv = upload(rcv);
  for (double scale : {1.0, 1.0 / 3, 0.7, 1.0 + 1.0 / 2048, 0x1p-12, 0x1p-20, 3.0, 4096.0, -1.5}) {
    fill_lost(DType::kF16, host.data(), rcv.data(), own.data(), n, scale, Erasure::kRescale);
    ASSERT_EQ(cuda::fill_lost(DType::kF16, d_dst, d_rcv, d_own, n, scale, Erasure::kRescale,
                              counters_, nullptr),
              0);
    const auto dev = download(d_dst, n);
    size_t wrong = 0;
    for (size_t i = 0; i < n; ++i) {
      const bool host_nan = (host[i] & 0x7C00u) == 0x7C00u && (host[i] & 0x3FFu) != 0;
      const bool dev_nan = (dev[i] & 0x7C00u) == 0x7C00u && (dev[i] & 0x3FFu) != 0;
      if (host_nan ? !dev_nan : dev[i] != host[i]) {
        if (++wrong <= 5)
          ADD_FAILURE() << "scale " << scale << ": half 0x" << std::hex << i << " gives 0x"
                        << dev[i] << " on the device, 0x" << host[i] << " on the host";
      }
    }
    EXPECT_EQ(wrong, 0u) << "scale " << scale;
  }
}

}  // namespace
}  // namespace optireduce::coll
