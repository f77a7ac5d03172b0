// cuda/kernels.cu itself, run on the CPU through the emulation (cuda_emu.h), against the host
// reference kernels (collectives/kernels_host.h): every launcher, every dtype, sizes with partial
// blocks, the shared-memory and the multi-pass transform, erasures, the counters. Every launch
// runs in three schedules (threads and blocks forward, reversed, shuffled) that must agree byte
// for byte. Then bugs planted in copies of the kernels, each of which the emulation must report.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "collectives/kernels_host.h"
#include "cuda/device_compat.h"
#include "cuda/launch.h"
#include "tests/collectives/random_elems.h"
#include "tests/sanitized.h"

namespace optireduce::coll {
namespace {

// Device memory of the emulation (guarded, compared across schedules), freed at scope exit.
class Device {
 public:
  ~Device() {
    for (void* p : allocs_) emu::device_free(p);
  }
  // At `shift` elements past an allocation's (16-byte aligned) start: shift % (16 / sizeof(T))
  // != 0 makes the kernels take their element-by-element paths.
  template <class T>
  T* upload(const std::vector<T>& v, size_t shift = 0) {
    T* p = static_cast<T*>(alloc((v.size() + shift) * sizeof(T))) + shift;
    std::memcpy(p, v.data(), v.size() * sizeof(T));
    return p;
  }
  void* alloc(size_t bytes) {
    allocs_.push_back(emu::device_alloc(bytes));
    return allocs_.back();
  }
  unsigned long long* counters() {
    if (!counters_) {
      counters_ =
          static_cast<unsigned long long*>(alloc(sizeof(unsigned long long) * kNumCounters));
      std::memset(counters_, 0, sizeof(unsigned long long) * kNumCounters);
    }
    return counters_;
  }

 private:
  std::vector<void*> allocs_;
  unsigned long long* counters_ = nullptr;
};

class KernelsEmu : public ::testing::Test {
 protected:
  void SetUp() override {
    emu::set_schedules(3);
    emu::clear_error();
  }
  void TearDown() override {
    EXPECT_EQ(emu::last_error_text(), "");
    emu::set_schedules(1);
  }
};

template <class S>
size_t first_mismatch(const S* a, const S* b, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (a[i] != b[i]) return i;
  return n;
}

// Encode and decode (with a burst of erasures) on the emulated device and on the host.
template <DType T>
void hadamard_matches_host(uint64_t count, uint64_t block, size_t shift = 0) {
  SCOPED_TRACE(::testing::Message() << "dtype " << int(T) << " count " << count << " block "
                                    << block << " shift " << shift);
  using S = typename Elem<T>::S;
  constexpr uint64_t kSeed = 77;
  const HadamardGeometry g{count, block};
  const auto in = random_elems<T>(count, uint32_t(count * 31 + block));
  std::vector<uint32_t> masks(block);
  fill_sign_masks(masks.data(), block, kSeed);
  std::vector<S> enc_host(g.encoded());
  hadamard_encode(T, in.data(), enc_host.data(), g, masks.data());

  Device dev;
  S* d_in = dev.upload(in, shift);
  S* d_enc = static_cast<S*>(dev.alloc(g.encoded() * sizeof(S)));
  void* work = dev.alloc(cuda::hadamard_work_bytes(g, T));
  const uint64_t launches = emu::launches();
  ASSERT_EQ(cuda::encode(T, d_in, d_enc, g, kSeed, work, nullptr), 0) << emu::last_error_text();
  EXPECT_GT(emu::launches(), launches);  // the kernels ran, not a twin
  // Same butterflies in the same order per element: bit for bit.
  EXPECT_EQ(first_mismatch(d_enc, enc_host.data(), g.encoded()), g.encoded());

  // A burst of erasures (d/k), and in a multi-block bucket one block erased whole (fallback).
  for (size_t i = g.encoded() / 3; i < g.encoded() / 3 + g.encoded() / 20 + 1; ++i)
    enc_host[i] = Elem<T>::kMarker;
  if (g.blocks() > 2)
    for (size_t i = block; i < 2 * block; ++i) enc_host[i] = Elem<T>::kMarker;
  std::vector<S> dec_host(count);
  const DecodeResult r =
      hadamard_decode(T, enc_host.data(), dec_host.data(), g, masks.data(), 0.5, in.data(), 2.0);
  S* d_enc2 = dev.upload(enc_host, shift);
  S* d_dec = static_cast<S*>(dev.alloc(count * sizeof(S)));
  ASSERT_EQ(cuda::decode(T, d_enc2, d_dec, g, kSeed, 0.5, d_in, 2.0, Erasure::kRescale, work,
                         dev.counters(), nullptr),
            0)
      << emu::last_error_text();
  EXPECT_EQ(first_mismatch(d_dec, dec_host.data(), count), count);
  EXPECT_EQ(dev.counters()[kLostPhase2], r.lost);
  EXPECT_EQ(dev.counters()[kBlocksEmpty], r.blocks_empty);
}

TEST_F(KernelsEmu, HadamardInSharedMemoryMatchesTheHostBitForBit) {
  hadamard_matches_host<DType::kF32>(10000, 1024);  // a partial last block
  hadamard_matches_host<DType::kF16>(5000, 256);
  hadamard_matches_host<DType::kBF16>(4099, 4096);  // one full block and a 3-element tail
  hadamard_matches_host<DType::kF64>(777, 64);
  hadamard_matches_host<DType::kF32>(3, 2);  // blocks of one thread
  // encode_fast / decode_fast: blocks of 512 to 4096 (1 to 8 warps), tails of 512 and more.
  hadamard_matches_host<DType::kF16>(9000, 2048);  // a 808-element tail: d = 1024
  hadamard_matches_host<DType::kF64>(2600, 512);   // a 40-element tail: the general path
  hadamard_matches_host<DType::kBF16>(3 * 4096 + 600, 4096);
  // Pointers not 16-byte aligned: element by element, the same results.
  hadamard_matches_host<DType::kF16>(5000, 1024, 1);
  hadamard_matches_host<DType::kF32>(4100, 4096, 2);
}

TEST_F(KernelsEmu, HadamardMultiPassMatchesTheHostBitForBit) {
  // Blocks beyond one shared-memory chunk (4096): the global-memory stages run too.
  hadamard_matches_host<DType::kF32>(20000, 1 << 13);
  hadamard_matches_host<DType::kF64>(9000, 1 << 14);
  hadamard_matches_host<DType::kBF16>(8193, 1 << 13);
}

template <DType T>
void reduce_matches_host(int n, size_t len, Erasure policy, RedOp op, size_t shift = 0) {
  SCOPED_TRACE(::testing::Message()
               << "dtype " << int(T) << " ranks " << n << " len " << len << " shift " << shift);
  using S = typename Elem<T>::S;
  std::vector<std::vector<S>> src;
  std::vector<const void*> host_ptrs, dev_ptrs;
  std::vector<uint8_t> lossy(size_t(n), 0);
  Device dev;
  for (int s = 0; s < n; ++s) {
    src.push_back(random_elems<T>(len, uint32_t(s + 1)));
    if (s % 3 == 1) {
      lossy[size_t(s)] = 1;
      for (size_t i = len / 4; i < len / 2 + size_t(s); ++i) src.back()[i] = Elem<T>::kMarker;
    }
    host_ptrs.push_back(src.back().data());
    dev_ptrs.push_back(dev.upload(src.back(), s == n - 1 ? shift : 0));
  }
  std::vector<S> out_host(len);
  const uint64_t lost =
      reduce_shard(T, host_ptrs.data(), lossy.data(), n, out_host.data(), len, op, policy);
  S* d_out = static_cast<S*>(dev.alloc(len * sizeof(S)));
  void* work = dev.alloc(cuda::reduce_work_bytes(len, n) + 8);
  ASSERT_EQ(cuda::reduce(T, dev_ptrs.data(), lossy.data(), n, d_out, len, op, policy, work,
                         dev.counters(), nullptr),
            0)
      << emu::last_error_text();
  EXPECT_EQ(first_mismatch(d_out, out_host.data(), len), len);
  EXPECT_EQ(dev.counters()[kLostPhase1], lost);
}

TEST_F(KernelsEmu, ReduceMatchesTheHostBitForBit) {
  reduce_matches_host<DType::kF32>(4, 10003, Erasure::kRescale, RedOp::kSum);
  reduce_matches_host<DType::kF16>(8, 4097, Erasure::kRescale, RedOp::kAvg);
  reduce_matches_host<DType::kBF16>(3, 1000, Erasure::kZero, RedOp::kSum);
  reduce_matches_host<DType::kF64>(5, 999, Erasure::kRescale, RedOp::kSum);
  reduce_matches_host<DType::kF32>(20, 700, Erasure::kRescale, RedOp::kSum);  // two launches
  // A source that is not 16-byte aligned: one element per thread.
  reduce_matches_host<DType::kF16>(4, 1001, Erasure::kRescale, RedOp::kSum, 1);
  reduce_matches_host<DType::kF64>(3, 100, Erasure::kZero, RedOp::kAvg, 1);
}

template <DType T>
void fill_matches_host(size_t n, Erasure policy, size_t shift = 0) {
  SCOPED_TRACE(::testing::Message() << "dtype " << int(T) << " n " << n << " shift " << shift);
  using S = typename Elem<T>::S;
  auto rcv = random_elems<T>(n, 5);
  const auto own = random_elems<T>(n, 6);
  for (size_t i = n / 10; i < n / 3; ++i) rcv[i] = Elem<T>::kMarker;
  std::vector<S> host(n);
  const uint64_t lost = fill_lost(T, host.data(), rcv.data(), own.data(), n, 4.0, policy);
  Device dev;
  S* d_rcv = dev.upload(rcv);
  S* d_own = dev.upload(own, shift);
  ASSERT_EQ(cuda::fill_lost(T, d_rcv, d_rcv, d_own, n, 4.0, policy, dev.counters(), nullptr), 0)
      << emu::last_error_text();
  EXPECT_EQ(first_mismatch(d_rcv, host.data(), n), n);
  EXPECT_EQ(dev.counters()[kLostPhase2], lost);
}

TEST_F(KernelsEmu, FillMatchesTheHostBitForBit) {
  fill_matches_host<DType::kF32>(3001, Erasure::kRescale);
  fill_matches_host<DType::kF16>(257, Erasure::kZero);
  fill_matches_host<DType::kBF16>(10000, Erasure::kRescale);
  fill_matches_host<DType::kF64>(100, Erasure::kRescale);
  fill_matches_host<DType::kBF16>(1001, Erasure::kRescale, 3);  // not 16-byte aligned
}

// Every non-finite encoding of a type, and finite neighbours that must not count: +-Inf, quiet,
// signalling and negative NaNs, the erasure marker; the largest finite value and its negative.
template <DType T>
std::vector<typename Elem<T>::S> nonfinite_encodings() {
  using S = typename Elem<T>::S;
  const S sign = S(S(1) << (8 * sizeof(S) - 1)), inf = Elem<T>::kExponent;
  return {inf,
          S(inf | sign),
          Elem<T>::kQuietNaN,
          S(inf | 1),
          S(Elem<T>::kQuietNaN | sign),
          Elem<T>::kMarker};
}

// The scan (count_nonfinite, nonfinite_flag) and the verdict (nonfinite_verdict) against
// count_nonfinite and apply_nonfinite_verdict, with the encodings planted at the start, inside
// and at the very end of a bucket whose length leaves the last block of threads partial.
template <DType T>
void nonfinite_matches_host(size_t n) {
  SCOPED_TRACE(::testing::Message() << "dtype " << int(T) << " n " << n);
  using S = typename Elem<T>::S;
  auto data = random_elems<T>(n, uint32_t(n));
  data[n / 2] = S(Elem<T>::kExponent - 1);  // largest finite
  data[n / 3] = S((Elem<T>::kExponent - 1) | S(S(1) << (8 * sizeof(S) - 1)));
  Device dev;
  auto* base =
      static_cast<unsigned long long*>(dev.alloc(sizeof(unsigned long long) * kNumCounters));
  auto* flag = static_cast<uint8_t*>(dev.alloc(1));
  // All finite: no count, the flag cleared (it starts as garbage).
  const S* d_clean = dev.upload(data);
  std::memcpy(base, dev.counters(), sizeof(unsigned long long) * kNumCounters);
  *flag = 0xFF;
  EXPECT_EQ(count_nonfinite(T, data.data(), n), 0u);
  ASSERT_EQ(cuda::count_nonfinite(T, d_clean, n, dev.counters(), nullptr), 0)
      << emu::last_error_text();
  ASSERT_EQ(cuda::nonfinite_flag(dev.counters(), base, flag, nullptr), 0) << emu::last_error_text();
  EXPECT_EQ(dev.counters()[kNonFiniteElements], 0u);
  EXPECT_EQ(*flag, 0);

  const auto enc = nonfinite_encodings<T>();
  for (size_t k = 0; k < enc.size(); ++k) {
    // Each encoding alone at the end (the partial block's last thread), then all of them.
    auto one = data;
    one[n - 1] = enc[k];
    ASSERT_EQ(count_nonfinite(T, one.data(), n), 1u) << "encoding " << k;
    std::memcpy(base, dev.counters(), sizeof(unsigned long long) * kNumCounters);
    ASSERT_EQ(cuda::count_nonfinite(T, dev.upload(one), n, dev.counters(), nullptr), 0);
    ASSERT_EQ(cuda::nonfinite_flag(dev.counters(), base, flag, nullptr), 0);
    EXPECT_EQ(dev.counters()[kNonFiniteElements] - base[kNonFiniteElements], 1u)
        << "encoding " << k;
    EXPECT_EQ(*flag, kFlagNonFinite) << "encoding " << k;
  }
  auto all = data;
  for (size_t k = 0; k < enc.size() && k < n; ++k) all[(k * 7919) % n] = enc[k];
  all[0] = enc[0];
  const uint64_t want = count_nonfinite(T, all.data(), n);
  std::memcpy(base, dev.counters(), sizeof(unsigned long long) * kNumCounters);
  ASSERT_EQ(cuda::count_nonfinite(T, dev.upload(all), n, dev.counters(), nullptr), 0);
  EXPECT_EQ(dev.counters()[kNonFiniteElements] - base[kNonFiniteElements], want);

  // The verdict: the safeguard's bit alone changes nothing; a non-finite bit anywhere makes
  // the whole output the quiet NaN on the device as on the host, and counts the call once.
  for (const std::vector<uint8_t>& flags :
       {std::vector<uint8_t>{0, kFlagLost, 0}, std::vector<uint8_t>{0, kFlagLost, kFlagNonFinite},
        std::vector<uint8_t>{kFlagNonFinite | kFlagLost}}) {
    auto host = data;
    const bool applied =
        apply_nonfinite_verdict(T, host.data(), n, flags.data(), int(flags.size()));
    S* d_out = dev.upload(data);
    const uint8_t* d_flags = dev.upload(flags);
    const unsigned long long calls = dev.counters()[kNonFiniteCalls];
    ASSERT_EQ(
        cuda::nonfinite_verdict(T, d_out, n, d_flags, int(flags.size()), dev.counters(), nullptr),
        0)
        << emu::last_error_text();
    EXPECT_EQ(first_mismatch(d_out, host.data(), n), n);
    EXPECT_EQ(dev.counters()[kNonFiniteCalls] - calls, applied ? 1u : 0u);
    EXPECT_EQ(applied, (flags.back() & kFlagNonFinite) != 0);  // where the bit is, if anywhere
    if (applied) {
      EXPECT_EQ(host[n - 1], Elem<T>::kQuietNaN);
    }
  }
  // n = 0 only counts.
  const std::vector<uint8_t> flags = {kFlagNonFinite, 0};
  const unsigned long long calls = dev.counters()[kNonFiniteCalls];
  ASSERT_EQ(cuda::nonfinite_verdict(T, dev.upload(data), 0, dev.upload(flags), 2, dev.counters(),
                                    nullptr),
            0);
  EXPECT_EQ(dev.counters()[kNonFiniteCalls] - calls, 1u);
}

TEST_F(KernelsEmu, NonFiniteScanAndVerdictMatchTheHostBitForBit) {
  // Under a sanitizer the largest count is 2049: still several blocks and a partial one, at a
  // fifth of the emulated threads (tests/sanitized.h).
  const size_t large = optireduce::testing::kSanitized ? 2049 : 10001;
  for (size_t n : {size_t(1), size_t(7), size_t(257), large}) {
    nonfinite_matches_host<DType::kF32>(n);
    nonfinite_matches_host<DType::kF16>(n);
    nonfinite_matches_host<DType::kBF16>(n);
    nonfinite_matches_host<DType::kF64>(n);
  }
}

// ---- Planted bugs: copies of kernels.cu's kernels, each with one defect ----

enum class Bug { kNone, kMissingSync, kOffByOne, kSharedRace, kEarlyExit };

// fwht_shared (kernels.cu) with `bug` planted.
template <Bug kBug>
__global__ void fwht_shared_copy(float* work, uint64_t chunk) {
  OR_DYNAMIC_SHARED(unsigned char, smem_raw);
  float* s = reinterpret_cast<float*>(smem_raw);
  float* g = work + blockIdx.x * chunk;
  for (uint64_t k = threadIdx.x; k < chunk; k += blockDim.x) s[k] = g[k];
  if (kBug == Bug::kEarlyExit && threadIdx.x == 1) return;
  if (kBug != Bug::kMissingSync) __syncthreads();
  for (uint64_t h = 1; h < chunk; h <<= 1) {
    for (uint64_t p = threadIdx.x; p < chunk / 2; p += blockDim.x) {
      // The race: pairs that overlap, so one thread writes what another reads in the same stage.
      const uint64_t i = kBug == Bug::kSharedRace ? (p / h) * h + p % h : (p / h) * 2 * h + p % h;
      const float a = s[i], b = s[i + h];
      s[i] = a + b;
      s[i + h] = a - b;
    }
    __syncthreads();
  }
  const uint64_t end = kBug == Bug::kOffByOne ? chunk + 1 : chunk;
  for (uint64_t k = threadIdx.x; k < end; k += blockDim.x) g[k] = s[k];
}

// Runs the copy over `blocks` chunks of 256; returns the emulation's verdict ("" = clean).
template <Bug kBug>
std::string run_fwht_copy(unsigned blocks) {
  constexpr uint64_t kChunk = 256;
  emu::clear_error();
  Device dev;
  std::vector<float> v(blocks * kChunk);
  std::mt19937 rng(3);
  std::normal_distribution<float> g;
  for (float& x : v) x = g(rng);
  float* d = dev.upload(v);
  OR_LAUNCH(fwht_shared_copy<kBug>, blocks, 64, kChunk * sizeof(float), nullptr)(d, kChunk);
  std::string verdict = emu::last_error_text();
  if (verdict.empty()) {
    // The clean copy also has to be right: the host transform of every chunk.
    for (unsigned b = 0; b < blocks; ++b) fwht(v.data() + b * kChunk, kChunk);
    if (first_mismatch(d, v.data(), v.size()) != v.size()) verdict = "wrong result";
  }
  emu::clear_error();
  return verdict;
}

TEST_F(KernelsEmu, ThePlantedBugsAreEachReported) {
  EXPECT_EQ(run_fwht_copy<Bug::kNone>(4), "");
  const std::string sync = run_fwht_copy<Bug::kMissingSync>(4);
  EXPECT_NE(sync.find("depends on the order"), std::string::npos) << sync;
  const std::string race = run_fwht_copy<Bug::kSharedRace>(4);
  EXPECT_NE(race.find("depends on the order"), std::string::npos) << race;
  // One past a block's range: the last block writes past the allocation, the others into their
  // neighbour's chunk (found whichever comes first).
  const std::string obo = run_fwht_copy<Bug::kOffByOne>(4);
  EXPECT_TRUE(obo.find("outside an allocation") != std::string::npos ||
              obo.find("depends on the order") != std::string::npos)
      << obo;
  EXPECT_NE(run_fwht_copy<Bug::kOffByOne>(1).find("outside an allocation of 1024 bytes, at byte "
                                                  "offset 1024"),
            std::string::npos);
  const std::string early = run_fwht_copy<Bug::kEarlyExit>(2);
  EXPECT_NE(early.find("is not reached by every thread"), std::string::npos) << early;
}

// 16 bytes per thread, checked as kernels.cu's vector accesses are (the copy itself by memcpy,
// which the host does not fault on).
__global__ void copy_by_16_bytes(const uint32_t* in, uint32_t* out) {
  const uint32_t* p = in + 4 * threadIdx.x;
  OR_CHECK_ALIGNED(p, 16);
  std::memcpy(out + 4 * threadIdx.x, p, 16);
  __syncthreads();  // the others wait here for the thread that stopped
}

TEST_F(KernelsEmu, AMisalignedVectorAccessIsReportedAndTheNextLaunchRuns) {
  Device dev;
  std::vector<uint32_t> v(4 * 64 + 1);
  for (size_t i = 0; i < v.size(); ++i) v[i] = uint32_t(i);
  const uint32_t* in = dev.upload(v);
  auto* out = static_cast<uint32_t*>(dev.alloc(4 * 64 * sizeof(uint32_t)));
  OR_LAUNCH(copy_by_16_bytes, 1, 64, 0, nullptr)(in + 1, out);
  EXPECT_NE(emu::last_error_text().find("misaligned address"), std::string::npos)
      << emu::last_error_text();
  emu::clear_error();
  // The stopped threads start afresh: an aligned launch on the same scheduler runs clean.
  OR_LAUNCH(copy_by_16_bytes, 1, 64, 0, nullptr)(in, out);
  EXPECT_EQ(emu::last_error_text(), "");
  EXPECT_EQ(first_mismatch(out, v.data(), 4 * 64), size_t(4 * 64));
}

// A warp reduction whose mask names lanes that a 48-thread block does not have.
__global__ void partial_warp_sum(unsigned* out) {
  unsigned v = threadIdx.x;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31) == 0) atomicAdd(out, v);
}

TEST_F(KernelsEmu, ShufflesAreExactAndAMaskBeyondTheBlockIsReported) {
  Device dev;
  auto* out = static_cast<unsigned*>(dev.alloc(sizeof(unsigned)));
  *out = 0;
  OR_LAUNCH(partial_warp_sum, 3, 64, 0, nullptr)(out);
  ASSERT_EQ(emu::last_error_text(), "");
  EXPECT_EQ(*out, 3u * (63u * 64u / 2));  // every lane's value, once per block
  OR_LAUNCH(partial_warp_sum, 1, 48, 0, nullptr)(out);
  EXPECT_NE(emu::last_error_text().find("does not exist"), std::string::npos)
      << emu::last_error_text();
  EXPECT_NE(cudaGetLastError(), cudaSuccess);
  emu::clear_error();
}

// Recursion a kilobyte a level, touching each frame: it walks down its fiber's stack a page at
// a time, so it meets the guard page below the stack before anything else.
__device__ unsigned deep(unsigned depth) {
  volatile unsigned char frame[1024];
  frame[0] = static_cast<unsigned char>(depth);
  frame[sizeof(frame) - 1] = static_cast<unsigned char>(depth);
  return depth == 0 ? frame[0] : deep(depth - 1) + frame[sizeof(frame) - 1];
}
__global__ void overflow_stack(unsigned* out, unsigned depth) {
  *out = deep(depth);
}

// A thread that overflows its 64 KiB stack (96 levels: about 100 KiB) faults at the guard page
// below it, rather than writing into the next thread's stack and failing somewhere else, or not at
// all.
TEST_F(KernelsEmu, AStackOverflowFaultsAtTheGuardPage) {
  Device dev;
  auto* out = static_cast<unsigned*>(dev.alloc(sizeof(unsigned)));
  emu::set_schedules(1);
  OR_LAUNCH(overflow_stack, 1, 2, 0, nullptr)(out, 8);  // 8 KiB deep: fits
  ASSERT_EQ(emu::last_error_text(), "");
  EXPECT_EQ(*out, 8u * 9u / 2u);
  EXPECT_DEATH(OR_LAUNCH(overflow_stack, 1, 2, 0, nullptr)(out, 96), "");
}

TEST_F(KernelsEmu, ALaunchBeyondTheLimitsFails) {
  Device dev;
  float* d = static_cast<float*>(dev.alloc(4));
  OR_LAUNCH(fwht_shared_copy<Bug::kNone>, 1, 2048, 0, nullptr)(d, 1);
  EXPECT_NE(emu::last_error_text().find("invalid launch configuration"), std::string::npos);
  emu::clear_error();
  OR_LAUNCH(fwht_shared_copy<Bug::kNone>, 1, 32, 64 << 10, nullptr)(d, 1);
  EXPECT_NE(emu::last_error_text().find("dynamic shared memory"), std::string::npos);
  emu::clear_error();
}

}  // namespace
}  // namespace optireduce::coll
