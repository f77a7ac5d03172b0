// Tests of collectives/tar.cc over the in-process exchange (ranks as threads): exact results for
// every type, N = 2..8, in and out of place, any count; bounded mode per-element error bounds,
// unbiasedness, stragglers, the safeguard, the non-finite verdict, incast rounds, tiny buffers
// and the first call.
#include "collectives/tar.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <random>
#include <vector>

#include "collectives/host_kernels.h"
#include "tests/collectives/sim_exchange.h"
#include "tests/sanitized.h"

namespace optireduce::coll {
namespace {

using namespace std::chrono_literals;
using test::LossModel;
using test::SimNetwork;

struct Cluster {
  SimNetwork net;
  std::vector<std::unique_ptr<Exchange>> ex;
  std::vector<std::unique_ptr<HostKernels>> k;
  std::vector<std::unique_ptr<Tar>> tar;
  std::vector<optiStats_t> stats;
  std::vector<double> seconds;

  Cluster(int n, LossModel loss = {}, std::chrono::microseconds deadline = 200ms)
      : net(n, loss, deadline), stats(size_t(n)), seconds(size_t(n)) {
    for (int r = 0; r < n; ++r) {
      ex.push_back(net.endpoint(r));
      k.push_back(std::make_unique<HostKernels>());
      tar.push_back(std::make_unique<Tar>(ex.back().get(), k.back().get(), 0xC0FFEE));
    }
  }
  int n() const { return net.size(); }

  // One allreduce on every rank; in[r] and out[r] are byte buffers (out[r] may be in[r]).
  // `delay` makes a rank start late (a straggler).
  void allreduce(std::vector<std::vector<uint8_t>>& in, std::vector<std::vector<uint8_t>>* out,
                 size_t count, DType t, RedOp op, const TarOptions& o,
                 std::vector<std::chrono::milliseconds> delay = {}) {
    net.run([&](int r) {
      if (!delay.empty()) std::this_thread::sleep_for(delay[size_t(r)]);
      const auto t0 = std::chrono::steady_clock::now();
      void* dst = out ? (*out)[size_t(r)].data() : in[size_t(r)].data();
      std::string err;
      Status s = tar[size_t(r)]->allreduce(in[size_t(r)].data(), dst, count, t, op, o,
                                           &stats[size_t(r)], &err);
      seconds[size_t(r)] =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      EXPECT_TRUE(s.is_ok()) << err;
    });
  }
};

double load(DType t, const std::vector<uint8_t>& b, size_t i) {
  switch (t) {
    case DType::kF32:
      return Elem<DType::kF32>::load(reinterpret_cast<const uint32_t*>(b.data())[i]);
    case DType::kF16:
      return Elem<DType::kF16>::load(reinterpret_cast<const uint16_t*>(b.data())[i]);
    case DType::kBF16:
      return Elem<DType::kBF16>::load(reinterpret_cast<const uint16_t*>(b.data())[i]);
    case DType::kF64:
      return Elem<DType::kF64>::load(reinterpret_cast<const uint64_t*>(b.data())[i]);
  }
  return 0;
}
void put(DType t, std::vector<uint8_t>& b, size_t i, double v) {
  switch (t) {
    case DType::kF32:
      reinterpret_cast<uint32_t*>(b.data())[i] = Elem<DType::kF32>::store(float(v));
      break;
    case DType::kF16:
      reinterpret_cast<uint16_t*>(b.data())[i] = Elem<DType::kF16>::store(float(v));
      break;
    case DType::kBF16:
      reinterpret_cast<uint16_t*>(b.data())[i] = Elem<DType::kBF16>::store(float(v));
      break;
    case DType::kF64:
      reinterpret_cast<uint64_t*>(b.data())[i] = Elem<DType::kF64>::store(v);
      break;
  }
}
// The exact result as the kernels define it: an fp32 (fp64) sum, one rounding to the type.
double expected(DType t, double sum, int n, RedOp op) {
  std::vector<uint8_t> b(8);
  if (t == DType::kF64) {
    put(t, b, 0, op == RedOp::kSum ? sum : sum / n);
  } else {
    put(t, b, 0, op == RedOp::kSum ? float(sum) : float(sum) / float(n));
  }
  return load(t, b, 0);
}

// Small integers: every partial sum is exact in every type, so the reference is exact.
double int_value(int r, size_t i) {
  return double(int((i * 7 + size_t(r) * 13) % 17) - 8);
}

void check_exact(Cluster& c, size_t count, DType t, RedOp op, bool in_place, TarOptions o) {
  const int n = c.n();
  const size_t es = dtype_size(t);
  std::vector<std::vector<uint8_t>> in(size_t(n), std::vector<uint8_t>(count * es));
  std::vector<std::vector<uint8_t>> out(size_t(n), std::vector<uint8_t>(count * es, 0xAB));
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < count; ++i) put(t, in[size_t(r)], i, int_value(r, i));
  c.allreduce(in, in_place ? nullptr : &out, count, t, op, o);
  for (int r = 0; r < n; ++r) {
    const auto& res = in_place ? in[size_t(r)] : out[size_t(r)];
    for (size_t i = 0; i < count; ++i) {
      double sum = 0;
      for (int s = 0; s < n; ++s) sum += int_value(s, i);
      ASSERT_EQ(load(t, res, i), expected(t, sum, n, op))
          << "rank " << r << " i " << i << " count " << count << " n " << n << " type " << int(t)
          << " in_place " << in_place;
    }
    if (c.stats[size_t(r)].safeguardRedos == 0) {
      EXPECT_EQ(c.stats[size_t(r)].elementsLost[0] + c.stats[size_t(r)].elementsLost[1], 0u);
    }
  }
}

TEST(TarExact, EveryTypeRanksCountsInAndOutOfPlace) {
  TarOptions o;
  o.mode = Mode::kExact;
  for (int n = 2; n <= 8; ++n) {
    // Under a sanitizer 6 and 7 ranks stay out: rank counts between two kept ones (5 and 8).
    if (optireduce::testing::kSanitized && (n == 6 || n == 7)) continue;
    Cluster c(n);
    for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kF64})
      for (size_t count : {size_t(1), size_t(2), size_t(n - 1), size_t(n), size_t(n + 1),
                           size_t(1000), size_t(65537)})
        for (bool in_place : {false, true})
          for (RedOp op : {RedOp::kSum, RedOp::kAvg}) {
            // Under a sanitizer the two operations take turns: they differ in arithmetic, not
            // in what memory they touch. Under ThreadSanitizer the types take turns too, one
            // per rank count: a race does not depend on the element type (tests/sanitized.h).
            if (optireduce::testing::kSanitized && (op == RedOp::kAvg) != ((count + n) % 2 == 1))
              continue;
            if (optireduce::testing::kThreadSanitizer && int(t) % 4 != n % 4) continue;
            check_exact(c, count, t, op, in_place, o);
            if (HasFatalFailure()) return;
          }
  }
}

TEST(TarExact, LargeBuckets) {
  TarOptions o;
  o.mode = Mode::kExact;
  for (int n : {2, 4, 8}) {
    // Under a sanitizer one cluster only: the others move the same buffers through the same
    // code (tests/sanitized.h). ThreadSanitizer keeps the most threads, ASan a cheaper one.
    if (optireduce::testing::kSanitized && n != (optireduce::testing::kThreadSanitizer ? 8 : 4))
      continue;
    Cluster c(n);
    check_exact(c, (size_t(1) << 20) + 3, DType::kF32, RedOp::kSum, n == 4, o);
    check_exact(c, size_t(1) << 20, DType::kBF16, RedOp::kAvg, n != 4, o);
  }
}

TEST(TarExact, FixedIncastGivesTheSameResults) {
  for (int n : {3, 5, 8}) {
    Cluster c(n);
    for (int inc = 1; inc < n; ++inc) {
      TarOptions o;
      o.mode = Mode::kExact;
      o.incast = inc;
      check_exact(c, 777, DType::kF32, RedOp::kSum, inc % 2 == 0, o);
      EXPECT_EQ(c.stats[0].incast, inc);
    }
  }
}

// Bounded mode without loss: no Hadamard gives bit-exact results, Hadamard nearly exact.
TEST(TarBounded, NoLossIsExactWithoutHadamard) {
  Cluster c(4);
  TarOptions o;
  o.mode = Mode::kBounded;
  o.hadamard = false;
  for (int call = 0; call < 3; ++call)
    check_exact(c, 10000, DType::kF16, RedOp::kSum, call == 1, o);
  EXPECT_EQ(c.stats[0].exactCalls, 0u);  // calls after the first went bounded
}

// Gradient-like data: a common signal plus per-rank noise of amplitude eps.
struct Grad {
  std::vector<double> base;
  double eps;
  double value(int r, size_t i) const {
    return base[i] + eps * std::sin(double(i) * 0.37 + double(r) * 1.91);
  }
};
Grad make_grad(size_t count, double eps, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> g;
  Grad gr{std::vector<double>(count), eps};
  for (auto& v : gr.base) v = g(rng);
  return gr;
}

struct ErrorSummary {
  double max_abs = 0, mean = 0, mse = 0, rel_l2 = 0;
  uint64_t lost = 0, expected = 0, deadline_hits = 0;
};

// Runs `calls` bounded allreduces (after one exact warm-up) and measures the error against the
// exact sum over all ranks and calls.
ErrorSummary run_bounded(int n, size_t count, DType t, RedOp op, TarOptions o, LossModel loss,
                         const Grad& g, int calls, bool in_place) {
  Cluster c(n, loss);
  const size_t es = dtype_size(t);
  ErrorSummary e;
  double sum_err = 0, sum_sq = 0, sum_ref = 0;
  uint64_t samples = 0;
  for (int call = 0; call <= calls; ++call) {
    std::vector<std::vector<uint8_t>> in(size_t(n), std::vector<uint8_t>(count * es));
    std::vector<std::vector<uint8_t>> out(size_t(n), std::vector<uint8_t>(count * es));
    for (int r = 0; r < n; ++r)
      for (size_t i = 0; i < count; ++i) put(t, in[size_t(r)], i, g.value(r, i));
    std::vector<double> ref(count, 0.0);
    for (int r = 0; r < n; ++r)
      for (size_t i = 0; i < count; ++i) ref[i] += load(t, in[size_t(r)], i);
    if (op == RedOp::kAvg)
      for (auto& v : ref) v /= n;
    c.allreduce(in, in_place ? nullptr : &out, count, t, op, o);
    if (call == 0) continue;  // the first call of a communicator is exact
    for (int r = 0; r < n; ++r) {
      const auto& res = in_place ? in[size_t(r)] : out[size_t(r)];
      for (size_t i = 0; i < count; ++i) {
        const double v = load(t, res, i);
        EXPECT_TRUE(std::isfinite(v)) << "rank " << r << " i " << i;
        const double err = v - ref[i];
        e.max_abs = std::max(e.max_abs, std::fabs(err));
        sum_err += err;
        sum_sq += err * err;
        sum_ref += ref[i] * ref[i];
        ++samples;
      }
      e.lost += c.stats[size_t(r)].elementsLost[0] + c.stats[size_t(r)].elementsLost[1];
      e.expected += c.stats[size_t(r)].elementsExpected[0] + c.stats[size_t(r)].elementsExpected[1];
      e.deadline_hits += c.stats[size_t(r)].deadlineHits;
    }
  }
  e.mean = sum_err / double(samples);
  e.mse = sum_sq / double(samples);
  e.rel_l2 = std::sqrt(sum_sq / sum_ref);
  return e;
}

TEST(TarBounded, PerElementErrorIsBoundedWithoutHadamard) {
  // Every contribution lies in [base - eps, base + eps], and every estimate (received mean x N,
  // own x N) lies in N*[base - eps, base + eps], so |error| <= 2 N eps per element.
  const double eps = 0.05;
  const Grad g = make_grad(20000, eps, 4);
  LossModel loss;
  loss.drop = 0.03;
  loss.burst = 3;
  loss.packet_bytes = 512;
  for (int n : {2, 3, 5}) {
    for (bool in_place : {false, true}) {
      TarOptions o;
      o.mode = Mode::kBounded;
      o.hadamard = false;
      o.gather_fill_own = true;  // the stand-in this bound is about
      const ErrorSummary e =
          run_bounded(n, 20000, DType::kF32, RedOp::kSum, o, loss, g, 3, in_place);
      EXPECT_GT(e.lost, 0u) << "the loss model must have erased something";
      EXPECT_LE(e.max_abs, 2 * n * eps + 1e-4) << n;
      EXPECT_NEAR(double(e.lost) / double(e.expected), 0.03, 0.02);
    }
  }
}

TEST(TarBounded, RescaleIsUnbiasedAndZeroIsNot) {
  // Positive data so that counting lost elements as zero visibly biases the sum downwards.
  Grad g = make_grad(8192, 0.5, 9);
  for (auto& v : g.base) v = 1.0 + 0.1 * v;
  LossModel loss;
  loss.drop = 0.05;
  loss.burst = 2;
  loss.packet_bytes = 256;
  for (bool hadamard : {false, true}) {
    TarOptions o;
    o.mode = Mode::kBounded;
    o.hadamard = hadamard;
    o.hadamard_block = 1024;
    o.gather_fill_own = true;  // own x N: the unbiased stand-in
    const ErrorSummary e = run_bounded(4, 8192, DType::kF32, RedOp::kSum, o, loss, g, 12, false);
    ASSERT_GT(e.lost, 0u);
    // Standard error of the mean over ~400k correlated samples: bound it generously by the
    // RMS error / sqrt(number of independent loss events).
    const double events = double(e.lost) / 64.0 + 1;
    EXPECT_LT(std::fabs(e.mean), 4 * std::sqrt(e.mse / events) + 1e-6)
        << "hadamard " << hadamard << " mean " << e.mean << " rmse " << std::sqrt(e.mse);
    o.erasure = Erasure::kZero;
    const ErrorSummary z = run_bounded(4, 8192, DType::kF32, RedOp::kSum, o, loss, g, 12, false);
    EXPECT_LT(z.mean, -0.05) << "counting losses as zero must bias the sum (mean " << z.mean << ")";
  }
}

// Phase 2 with Hadamard, where half the coordinates are lost in short bursts (most blocks keep
// some). `own` rescales a block that kept k of d coordinates by d/k: unbiased, with an error of
// sqrt((d - k) / k) of the block's norm, past the block itself once k < d/2. `zero`, the
// default, decodes what was kept as it is: an error of sqrt(1 - k/d) of the block, never more.
// (Two ranks on an H200 saw relative errors of 0.4-1.1 from one partly lost NCCL chunk.)
TEST(TarBounded, ZeroFillNeverCostsAHadamardBlockMoreThanItself) {
  const Grad g = make_grad(16384, 0.2, 11);
  LossModel loss;
  loss.drop = 0.5;
  loss.burst = 2;
  loss.packet_bytes = 256;
  loss.only_phase = 2;
  TarOptions o;
  o.mode = Mode::kBounded;
  o.allgather = Mode::kBounded;  // phase 2 cut mid-shard, which the default never does
  o.hadamard = true;
  o.hadamard_block = 1024;
  const ErrorSummary zero = run_bounded(4, 16384, DType::kF32, RedOp::kSum, o, loss, g, 4, false);
  o.gather_fill_own = true;
  const ErrorSummary own = run_bounded(4, 16384, DType::kF32, RedOp::kSum, o, loss, g, 4, false);
  ASSERT_GT(zero.lost, zero.expected / 8);  // phase 2 is half of what a rank expects
  EXPECT_LT(zero.rel_l2, std::sqrt(0.5) + 0.1) << "lost " << zero.lost << " of " << zero.expected;
  EXPECT_LT(zero.rel_l2, own.rel_l2 / 1.3);  // the unbiased d/k, for contrast (0.61 vs 0.93)
  std::printf("phase-2 loss %.0f%%: relative error %.3f with zero, %.3f with own\n",
              100.0 * double(zero.lost) / double(zero.expected) * 2, zero.rel_l2, own.rel_l2);
}

TEST(TarBounded, HadamardKeepsTheErrorSmallForEveryType) {
  const Grad g = make_grad(30000, 0.2, 5);
  LossModel loss;
  loss.drop = 0.01;
  loss.burst = 4;
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kF64}) {
    TarOptions o;
    o.mode = Mode::kBounded;
    o.hadamard = true;
    o.hadamard_block = 4096;
    const ErrorSummary e = run_bounded(3, 30000, t, RedOp::kAvg, o, loss, g, 2, true);
    // About 1% of coordinates lost: relative L2 error about sqrt(0.01 * 2) plus rounding.
    EXPECT_LT(e.rel_l2, 0.25) << int(t);
    EXPECT_GT(e.lost, 0u);
  }
}

// The pipelined Hadamard path (BlockProgress: encoding shard by shard, decoding each shard as
// its receive completes) gives the bits of whole-bucket transforms before and after the phases
// (what an exchange that cannot wait for single receives gets, as the GPU's grouped NCCL
// calls), under loss in both phases, in and out of place, with blocks straddling the shards
// (30000 elements, blocks of 1024, 3 ranks).
// Where the exchange tells arrivals, phase 1 reduces each shard as far as every peer's part has
// arrived and phase 2 decodes the Hadamard blocks whose bytes are all here, both while the
// rest is on the wire: the result must be the bits of the whole-shard reduction and the
// whole-bucket transforms, under loss, in and out of place. Steps of 1 KiB, against shards of
// 16-40 KiB, so that every receive is worked on in several pieces; with Hadamard, phase 1's
// sends are released 2 KiB at a time and at most 6 KiB past what has left, and the simulated
// exchange takes each byte as it is released, so a piece released before it is encoded shows.
TEST(TarBounded, ShardsWorkedOnAsTheyArriveGiveTheSameBits) {
  const Grad g = make_grad(30000, 0.2, 9);
  LossModel loss;
  loss.drop = 0.05;
  loss.burst = 3;
  loss.packet_bytes = 512;
  TarOptions o;
  o.mode = Mode::kBounded;
  o.allgather = Mode::kBounded;
  o.hadamard_block = 1024;
  o.arrival_step_bytes = 1024;
  o.release_bytes = 2048;
  o.release_lead_bytes = 6144;
  for (bool hadamard : {true, false}) {
    o.hadamard = hadamard;
    for (bool in_place : {false, true}) {
      std::vector<std::vector<uint8_t>> result[2];
      uint64_t lost[2] = {0, 0};
      for (int waits = 0; waits < 2; ++waits) {
        Cluster c(3, loss);
        c.net.set_pipelined(waits == 1);
        for (int call = 0; call < 3; ++call) {
          std::vector<std::vector<uint8_t>> in(3, std::vector<uint8_t>(30000 * 4));
          std::vector<std::vector<uint8_t>> out(3, std::vector<uint8_t>(30000 * 4));
          for (int r = 0; r < 3; ++r)
            for (size_t i = 0; i < 30000; ++i) put(DType::kF32, in[size_t(r)], i, g.value(r, i));
          c.allreduce(in, in_place ? nullptr : &out, 30000, DType::kF32, RedOp::kSum, o);
          for (int r = 0; r < 3; ++r) {
            result[waits].push_back(in_place ? in[size_t(r)] : out[size_t(r)]);
            lost[waits] += c.stats[size_t(r)].elementsLost[0] + c.stats[size_t(r)].elementsLost[1];
          }
        }
      }
      EXPECT_GT(lost[0], 0u);
      EXPECT_EQ(lost[1], lost[0]) << "hadamard " << hadamard << " in place " << in_place;
      ASSERT_EQ(result[1].size(), result[0].size());
      for (size_t i = 0; i < result[0].size(); ++i)
        EXPECT_TRUE(result[1][i] == result[0][i])
            << "call and rank " << i << " hadamard " << hadamard << " in place " << in_place;
    }
  }
}

TEST(TarBounded, StragglerCostsOthersAtMostTheDeadlinePerPhase) {
  const int n = 4;
  const auto deadline = 60ms;
  // Both stand-ins for what phase 2 lost (OPTIREDUCE_GATHER_FILL): own x N, and 0.
  for (bool own : {true, false}) {
    Cluster c(n, {}, deadline);
    TarOptions o;
    o.mode = Mode::kBounded;
    o.hadamard = false;
    o.gather_fill_own = own;
    const size_t count = 40000;
    std::vector<std::vector<uint8_t>> in(size_t(n), std::vector<uint8_t>(count * 4));
    for (int r = 0; r < n; ++r)
      for (size_t i = 0; i < count; ++i) put(DType::kF32, in[size_t(r)], i, 1.0 + r);
    c.allreduce(in, nullptr, count, DType::kF32, RedOp::kSum, o);  // exact first call
    for (int r = 0; r < n; ++r)
      for (size_t i = 0; i < count; ++i) put(DType::kF32, in[size_t(r)], i, 1.0 + r);
    c.allreduce(in, nullptr, count, DType::kF32, RedOp::kSum, o, {0ms, 0ms, 0ms, 600ms});
    for (int r = 0; r < n - 1; ++r) {
      // Two phases, each bounded by the deadline, plus scheduling slack on a loaded machine.
      EXPECT_LT(c.seconds[size_t(r)], 2 * 0.060 + 0.15) << r;
      EXPECT_GT(c.stats[size_t(r)].deadlineHits, 0u);
      const double stand_in = own ? 4.0 * (1.0 + r) : 0.0;
      for (size_t i = 0; i < count; ++i) {
        const double v = load(DType::kF32, in[size_t(r)], i);
        ASSERT_TRUE(std::isfinite(v));
        // Shards of the others: the straggler's contribution is estimated from the three
        // others (mean 2 x 4 = 8, true 10). Shard 3 (the straggler's): own x 4, or 0.
        EXPECT_TRUE(v == 8.0 || v == stand_in) << own << " " << r << " " << i << " " << v;
      }
    }
    // The straggler finishes too (what it receives, others sent long ago), with finite values.
    for (size_t i = 0; i < count; ++i) ASSERT_TRUE(std::isfinite(load(DType::kF32, in[3], i)));
  }
}

TEST(TarBounded, TinyBuffersAndFirstCallGoExactEvenUnderTotalLoss) {
  LossModel loss;
  loss.drop = 1.0;
  Cluster c(3, loss, 20ms);
  TarOptions o;
  o.mode = Mode::kBounded;
  // First call: large, still exact.
  check_exact(c, 5000, DType::kF32, RedOp::kSum, false, o);
  EXPECT_EQ(c.stats[0].exactCalls, 1u);
  // Later: below exact_below_bytes (4096 bytes = 1024 floats).
  check_exact(c, 1000, DType::kF32, RedOp::kSum, true, o);
  EXPECT_EQ(c.stats[1].exactCalls, 1u);
}

TEST(TarBounded, SafeguardFlagsAndRedoesExactly) {
  LossModel loss;
  loss.drop = 0.2;
  loss.packet_bytes = 256;
  Cluster c(3, loss, 50ms);
  TarOptions o;
  o.mode = Mode::kBounded;
  o.hadamard = true;
  o.hadamard_block = 512;
  o.safeguard = 0.05;
  check_exact(c, 20000, DType::kF32, RedOp::kSum, false, o);  // first call exact
  o.safeguard_redo = true;
  check_exact(c, 20000, DType::kF32, RedOp::kSum, true, o);  // flagged, redone: exact again
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(c.stats[size_t(r)].safeguardRedos, 1u);
    EXPECT_GT(c.stats[size_t(r)].lostFraction, 0.05);
  }
  o.safeguard_redo = false;
  const size_t count = 20000;
  std::vector<std::vector<uint8_t>> in(3, std::vector<uint8_t>(count * 4));
  c.allreduce(in, nullptr, count, DType::kF32, RedOp::kSum, o);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(c.stats[size_t(r)].safeguardFlags, 1u);
    EXPECT_EQ(c.stats[size_t(r)].safeguardRedos, 0u);
  }
}

// Issue 12, defect 6: the non-finite verdict. Rank 1's input holds a NaN at kNanAt, rank 2's a
// -Inf at kInfAt; phase 2 loses half its packets (seeded, only_phase 2, no deadline cut), so a
// rank that loses the packet holding one of them estimates it from its own finite input.
constexpr size_t kNonFiniteCount = 6000;
constexpr size_t kNanAt = 5000, kInfAt = 5100;  // shard 3 of 4: ranks 0-2 receive it in phase 2

// Whether any element of a rank's fp32 result is NaN or Inf.
bool any_nonfinite(const std::vector<uint8_t>& b, size_t count) {
  for (size_t i = 0; i < count; ++i)
    if (!std::isfinite(load(DType::kF32, b, i))) return true;
  return false;
}

std::vector<std::vector<uint8_t>> nonfinite_inputs(int n, bool poisoned) {
  std::vector<std::vector<uint8_t>> in(size_t(n), std::vector<uint8_t>(kNonFiniteCount * 4));
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < kNonFiniteCount; ++i)
      put(DType::kF32, in[size_t(r)], i, int_value(r, i));
  if (poisoned) {
    put(DType::kF32, in[1], kNanAt, std::nan(""));
    put(DType::kF32, in[2], kInfAt, -INFINITY);
  }
  return in;
}

TarOptions nonfinite_options(bool agree) {
  TarOptions o;
  o.mode = Mode::kBounded;
  o.allgather = Mode::kBounded;  // a packet lost in phase 2 splits the ranks' verdicts
  o.hadamard = false;  // the NaN stays in its element: one lost packet can hide it
  o.exact_below_bytes = 0;
  o.nonfinite_agree = agree;
  return o;
}

LossModel phase2_loss() {
  LossModel loss;
  loss.drop = 0.5;
  loss.packet_bytes = 256;
  loss.only_phase = 2;
  return loss;
}

// The defect, reproduced: without the agreement, some call leaves the poison non-finite on some
// ranks and finite on others (this is what the agreement removes).
TEST(TarBounded, NonFiniteInputsComeOutFiniteOnSomeRanksWithoutTheAgreement) {
  const int n = 4;
  Cluster c(n, phase2_loss(), 200ms);
  const TarOptions o = nonfinite_options(false);
  auto first = nonfinite_inputs(n, false);
  c.allreduce(first, nullptr, kNonFiniteCount, DType::kF32, RedOp::kSum, o);  // exact first call
  int split = 0;
  for (int call = 0; call < 10; ++call) {
    auto in = nonfinite_inputs(n, true);
    c.allreduce(in, nullptr, kNonFiniteCount, DType::kF32, RedOp::kSum, o);
    int nonfinite_ranks = 0;
    for (int r = 0; r < n; ++r) nonfinite_ranks += any_nonfinite(in[size_t(r)], kNonFiniteCount);
    split += nonfinite_ranks != 0 && nonfinite_ranks != n ? 1 : 0;
    for (int r = 0; r < n; ++r) EXPECT_EQ(c.stats[size_t(r)].nonfiniteCalls, 0u);
  }
  EXPECT_GT(split, 0) << "the loss never split the ranks: this test reproduces nothing";
}

// With the agreement every rank's whole output is the canonical quiet NaN, bit for bit, and
// every rank counts the call; a call without poison is left alone and not counted.
TEST(TarBounded, NonFiniteVerdictIsTheSameOnEveryRank) {
  const int n = 4;
  Cluster c(n, phase2_loss(), 200ms);
  const TarOptions o = nonfinite_options(true);
  auto first = nonfinite_inputs(n, false);
  c.allreduce(first, nullptr, kNonFiniteCount, DType::kF32, RedOp::kSum, o);  // exact first call
  for (int call = 0; call < 10; ++call) {
    const bool poisoned = call % 3 != 2;
    auto in = nonfinite_inputs(n, poisoned);
    std::vector<std::vector<uint8_t>> out(size_t(n), std::vector<uint8_t>(kNonFiniteCount * 4));
    c.allreduce(in, call % 2 ? &out : nullptr, kNonFiniteCount, DType::kF32, RedOp::kSum, o);
    for (int r = 0; r < n; ++r) {
      const auto& res = call % 2 ? out[size_t(r)] : in[size_t(r)];
      EXPECT_EQ(c.stats[size_t(r)].nonfiniteCalls, poisoned ? 1u : 0u) << call << " " << r;
      if (!poisoned) {
        EXPECT_FALSE(any_nonfinite(res, kNonFiniteCount)) << call << " " << r;
        continue;
      }
      const auto* bits = reinterpret_cast<const uint32_t*>(res.data());
      for (size_t i = 0; i < kNonFiniteCount; ++i)
        ASSERT_EQ(bits[i], Elem<DType::kF32>::kQuietNaN) << call << " rank " << r << " i " << i;
    }
  }
}

// With the safeguard's redo the verdict redoes the call exactly instead: every rank gets the
// exact result (NaN and -Inf where the exact sum has them, the exact sums elsewhere), and the
// call is counted both as non-finite and as redone.
TEST(TarBounded, NonFiniteVerdictWithRedoGivesTheExactResult) {
  const int n = 4;
  Cluster c(n, phase2_loss(), 200ms);
  TarOptions o = nonfinite_options(true);
  o.safeguard_redo = true;
  o.safeguard = 1.0;  // only the non-finite verdict redoes
  auto first = nonfinite_inputs(n, false);
  c.allreduce(first, nullptr, kNonFiniteCount, DType::kF32, RedOp::kSum, o);  // exact first call
  for (int call = 0; call < 3; ++call) {
    auto in = nonfinite_inputs(n, true);
    c.allreduce(in, nullptr, kNonFiniteCount, DType::kF32, RedOp::kSum, o);
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(c.stats[size_t(r)].nonfiniteCalls, 1u);
      EXPECT_EQ(c.stats[size_t(r)].safeguardRedos, 1u);
      for (size_t i = 0; i < kNonFiniteCount; ++i) {
        const double v = load(DType::kF32, in[size_t(r)], i);
        if (i == kNanAt) {
          ASSERT_TRUE(std::isnan(v)) << r;
        } else if (i == kInfAt) {
          ASSERT_EQ(v, -INFINITY) << r;
        } else {
          double sum = 0;
          for (int q = 0; q < n; ++q) sum += int_value(q, i);
          ASSERT_EQ(v, sum) << "rank " << r << " i " << i;
        }
      }
    }
  }
}

TEST(TarBounded, AutoIncastBacksOffUnderIncastLossAndRecovers) {
  LossModel loss;
  loss.incast_capacity = 2;  // admitting more than 2 senders at once drops 4% per extra sender
  loss.incast_drop = 0.04;
  loss.packet_bytes = 512;
  const int n = 8;
  Cluster c(n, loss, 100ms);
  TarOptions o;
  o.mode = Mode::kBounded;
  o.hadamard = false;
  o.incast = -1;
  const size_t count = 16384;
  std::vector<std::vector<uint8_t>> in(size_t(n), std::vector<uint8_t>(count * 4));
  std::vector<int> seen;
  double late_loss = 0;
  for (int call = 0; call < 14; ++call) {
    c.allreduce(in, nullptr, count, DType::kF32, RedOp::kSum, o);
    seen.push_back(c.stats[0].incast);
    if (call >= 6) late_loss += c.stats[0].lostFraction / 8;
  }
  EXPECT_EQ(seen[1], n - 1);  // starts at N-1, where every round loses 20%
  // Settles around the capacity (AIMD oscillates between 1 and capacity + 1).
  for (size_t i = 6; i < seen.size(); ++i) EXPECT_LE(seen[i], 3) << i;
  EXPECT_LT(late_loss, 0.03);
}

// Auto against fixed incast under the same incast-congestion model: the loss of admitting every
// sender at once, the rounds (a latency proxy: each round waits for its slowest sender) of
// admitting one at a time, and auto in between. Printed for the report; asserted loosely.
TEST(TarBounded, AutoIncastComparedWithFixed) {
  LossModel loss;
  loss.incast_capacity = 2;
  loss.incast_drop = 0.04;
  loss.packet_bytes = 512;
  const int n = 8;
  const size_t count = 16384;
  struct Row {
    int incast;
    double loss = 0, rounds = 0;
  };
  std::vector<Row> rows = {{0}, {1}, {2}, {-1}};
  for (Row& row : rows) {
    Cluster c(n, loss, 100ms);
    TarOptions o;
    o.mode = Mode::kBounded;
    o.hadamard = false;
    o.incast = row.incast;
    std::vector<std::vector<uint8_t>> in(size_t(n), std::vector<uint8_t>(count * 4));
    const int calls = 20;
    for (int call = 0; call <= calls; ++call) {
      c.allreduce(in, nullptr, count, DType::kF32, RedOp::kSum, o);
      if (call == 0) continue;  // exact
      for (int r = 0; r < n; ++r) {
        row.loss += c.stats[size_t(r)].lostFraction / (calls * n);
        row.rounds += double((n - 2) / c.stats[size_t(r)].incast + 1) / (calls * n);
      }
    }
    std::printf("incast %-4s: mean lost fraction %.4f, mean rounds per phase %.2f\n",
                row.incast == 0  ? "max"
                : row.incast < 0 ? "auto"
                                 : std::to_string(row.incast).c_str(),
                row.loss, row.rounds);
  }
  EXPECT_LT(rows[3].loss, rows[0].loss / 3);  // auto loses far less than all-at-once
  EXPECT_LT(rows[3].rounds, rows[1].rounds);  // and needs fewer rounds than one-at-a-time
}

}  // namespace
}  // namespace optireduce::coll
