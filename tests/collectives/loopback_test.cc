// liboptireduce across processes on loopback, through the C API and the real transport: exact
// results bit for bit (every type, N = 2..8, counts 1 to 2^24, in and out of place), bounded
// mode under the fault injector (OPTIREDUCE_FAULT_*), the TCP store rendezvous, argument errors.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "collectives/elem.h"
#include "collectives/optireduce.h"
#include "tests/collectives/typed_buffer.h"

namespace {

using optireduce::coll::DType;
using optireduce::coll::Elem;
using optireduce::testing::esize;
using optireduce::testing::get;
using optireduce::testing::set;

std::string temp_dir() {
  char tmpl[] = "/tmp/optireduce-coll-XXXXXX";
  const char* d = ::mkdtemp(tmpl);
  return d ? d : "/tmp";
}

// Runs body(rank) in `n` forked processes (each process its own transport engine, as in real
// use) and reports how many failed. `env` is applied in the children only.
int run_ranks(int n, const std::vector<std::pair<std::string, std::string>>& env,
              const std::function<int(int)>& body, int timeout_s = 240) {
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::alarm(unsigned(timeout_s));  // a hung rank must not hang the suite
      ::setenv("OPTIREDUCE_IFNAME", "lo", 1);
      for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
      const int rc = body(r);
      std::fflush(stdout);
      std::fflush(stderr);
      ::_exit(rc);
    }
    pids.push_back(pid);
  }
  int failed = 0;
  for (pid_t p : pids) {
    int status = 0;
    ::waitpid(p, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
  }
  return failed;
}

#define CHILD_CHECK(cond, ...)                                            \
  do {                                                                    \
    if (!(cond)) {                                                        \
      std::fprintf(stderr, "rank %d: %s:%d: ", rank, __FILE__, __LINE__); \
      std::fprintf(stderr, __VA_ARGS__);                                  \
      std::fprintf(stderr, " [%s]\n", optiGetLastError());                \
      return 1;                                                           \
    }                                                                     \
  } while (0)

// --- Exact mode: bit-exact against an exact reference ---------------------------------------
//
// Inputs are integers drawn from [-2^b, 2^b) with b per type such that every partial sum of up
// to 8 of them, in any order, is an integer of magnitude <= 8 x 2^b = 2^(significand bits):
// exactly representable in the type and in its accumulator (fp32 for the 16-bit types). The
// sum is then independent of the order in which ranks reduce, so the reference is the integer
// sum, converted once (exactly). The average is that sum divided by N in the accumulator type
// and rounded once to the type: the library's documented semantics (one rounding per result),
// so it is bit-exact too; for fp16 it also checks the kernels' F16C conversion against the
// scalar one (Elem::store) that the reference uses.
int value_bits(optiDataType_t t) {
  switch (t) {
    case optiFloat32:
      return 20;  // 8 x 2^20 < 2^24
    case optiFloat16:
      return 8;  // 8 x 2^8 = 2^11
    case optiBfloat16:
      return 5;  // 8 x 2^5 = 2^8
    case optiFloat64:
      return 40;  // far below 2^53
  }
  return 0;
}

// A different integer per (rank, element): a shifted, dropped, duplicated or misplaced
// contribution changes the sum almost surely (unlike a short periodic pattern).
uint64_t mix(uint64_t salt, uint64_t i) {
  uint64_t x = i * 0x9E3779B97F4A7C15ull + (salt + 1) * 0xD1B54A32D192ED03ull;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return x;
}
int64_t value(int bits, uint64_t salt, uint64_t i) {
  return int64_t(mix(salt, i) >> (63 - bits)) - (int64_t(1) << bits);
}

struct ExactCase {
  optiDataType_t t;
  size_t count;
  bool in_place;
  optiRedOp_t op;
  int incast;
};

// Guard elements after each buffer: a write past a shard boundary at the end shows up there.
constexpr size_t kGuard = 16;
constexpr uint8_t kGuardByte = 0xA5;
constexpr uint8_t kStaleByte = 0x5A;  // fills an out-of-place output before the call

struct Mismatch {
  size_t index;  // count when none
  bool input;    // an out-of-place input changed (not the result)
  double want;
};

// Checks one call's result (and that an out-of-place input is unchanged) bit for bit.
template <DType T>
Mismatch first_mismatch(const optiDataType_t t, const ExactCase& c, int rank, int n,
                        const uint8_t* in, const uint8_t* out) {
  using E = Elem<T>;
  using S = typename E::S;
  using A = typename E::A;
  const int bits = value_bits(t);
  const S* res = reinterpret_cast<const S*>(out);
  const S* src = reinterpret_cast<const S*>(in);
  for (size_t i = 0; i < c.count; ++i) {
    int64_t sum = 0;
    for (int s = 0; s < n; ++s) sum += value(bits, uint64_t(s), i);
    const S want = c.op == optiSum ? E::store(A(sum)) : E::store(A(sum) / A(n));
    if (std::memcmp(&res[i], &want, sizeof(S)) != 0) return {i, false, double(E::load(want))};
    if (!c.in_place) {
      const S mine = E::store(A(value(bits, uint64_t(rank), i)));
      if (std::memcmp(&src[i], &mine, sizeof(S)) != 0) return {i, true, double(E::load(mine))};
    }
  }
  return {c.count, false, 0};
}

// The shard holding element i (ShardPlan's layout: the first count % N shards one longer).
int shard_of(size_t count, int n, size_t i) {
  const size_t base = count / size_t(n), extra = count % size_t(n);
  return i < extra * (base + 1) ? int(i / (base + 1))
                                : int(extra + (i - extra * (base + 1)) / base);
}

template <DType T>
void fill_input(optiDataType_t t, int rank, size_t count, uint8_t* in) {
  using E = Elem<T>;
  const int bits = value_bits(t);
  auto* p = reinterpret_cast<typename E::S*>(in);
  for (size_t i = 0; i < count; ++i) p[i] = E::store(typename E::A(value(bits, uint64_t(rank), i)));
}

// Runs `cases` on an exact-mode communicator with options `o` and checks each bit for bit.
int exact_cases(optiComm_t comm, optiOptions_t o, int rank, int n,
                const std::vector<ExactCase>& cases) {
  for (const ExactCase& c : cases) {
    o.incast = c.incast;
    CHILD_CHECK(optiCommSetOptions(comm, &o) == optiSuccess, "incast %d", c.incast);
    const size_t bytes = c.count * esize(c.t), guarded = bytes + kGuard * esize(c.t);
    std::vector<uint8_t> in(guarded, kGuardByte), out;
    switch (c.t) {
      case optiFloat32:
        fill_input<DType::kF32>(c.t, rank, c.count, in.data());
        break;
      case optiFloat16:
        fill_input<DType::kF16>(c.t, rank, c.count, in.data());
        break;
      case optiBfloat16:
        fill_input<DType::kBF16>(c.t, rank, c.count, in.data());
        break;
      case optiFloat64:
        fill_input<DType::kF64>(c.t, rank, c.count, in.data());
        break;
    }
    if (!c.in_place) {
      out.assign(guarded, kGuardByte);
      std::memset(out.data(), kStaleByte, bytes);
    }
    uint8_t* dst = c.in_place ? in.data() : out.data();
    CHILD_CHECK(optiAllReduce(in.data(), dst, c.count, c.t, c.op, comm, nullptr) == optiSuccess,
                "allreduce type %d count %zu", int(c.t), c.count);
    Mismatch bad{c.count, false, 0};
    switch (c.t) {
      case optiFloat32:
        bad = first_mismatch<DType::kF32>(c.t, c, rank, n, in.data(), dst);
        break;
      case optiFloat16:
        bad = first_mismatch<DType::kF16>(c.t, c, rank, n, in.data(), dst);
        break;
      case optiBfloat16:
        bad = first_mismatch<DType::kBF16>(c.t, c, rank, n, in.data(), dst);
        break;
      case optiFloat64:
        bad = first_mismatch<DType::kF64>(c.t, c, rank, n, in.data(), dst);
        break;
    }
    CHILD_CHECK(bad.index == c.count,
                "N %d type %d count %zu %s op %d incast %d: %s element %zu (shard %d) is %.17g, "
                "expected %.17g",
                n, int(c.t), c.count, c.in_place ? "in place" : "out of place", int(c.op), c.incast,
                bad.input ? "input" : "result", bad.index, shard_of(c.count, n, bad.index),
                get(c.t, c.in_place || bad.input ? in : out, bad.index), bad.want);
    for (size_t b = bytes; b < guarded; ++b) {
      CHILD_CHECK(in[b] == kGuardByte && (c.in_place || out[b] == kGuardByte),
                  "N %d type %d count %zu: guard byte %zu past the end overwritten", n, int(c.t),
                  c.count, b - bytes);
    }
  }
  return 0;
}

int exact_rank(int rank, int n, const std::string& dir, const std::vector<ExactCase>& cases) {
  optiOptions_t o;
  CHILD_CHECK(optiOptionsDefault(&o) == optiSuccess, "options");
  o.mode = optiExact;
  optiComm_t comm = nullptr;
  CHILD_CHECK(optiHostCommInitFile(&comm, dir.c_str(), rank, n, &o) == optiSuccess, "init");
  if (exact_cases(comm, o, rank, n, cases) != 0) return 1;
  optiStats_t total;
  CHILD_CHECK(optiGetStats(comm, nullptr, &total) == optiSuccess, "stats");
  CHILD_CHECK(total.calls == cases.size() && total.exactCalls == cases.size(),
              "calls %llu exact %llu", (unsigned long long)total.calls,
              (unsigned long long)total.exactCalls);
  CHILD_CHECK(total.elementsLost[0] == 0 && total.elementsLost[1] == 0, "exact calls lost data");
  CHILD_CHECK(optiCommDestroy(comm) == optiSuccess, "destroy");
  return 0;
}

// The small-count grid of N ranks: counts around N (count < N leaves shards empty), small odd
// primes and 2^k +- 1 up to 2^16 + 1, every type, in and out of place, sum and average, with
// the incast cycling through all-at-once, 1 and 2 (so phases run in rounds).
std::vector<ExactCase> small_grid(int n) {
  const size_t un = size_t(n);
  std::vector<size_t> counts = {1,    2,    un - 1, un,    un + 1, 2 * un - 1, 2 * un + 1,
                                7,    13,   31,     127,   255,    257,        1021,
                                1024, 4095, 4097,   65535, 65537};
  std::sort(counts.begin(), counts.end());
  counts.erase(std::unique(counts.begin(), counts.end()), counts.end());
  std::vector<ExactCase> cases;
  int k = 0;
  for (size_t count : counts) {
    for (optiDataType_t t : {optiFloat32, optiFloat16, optiBfloat16, optiFloat64}) {
      for (bool in_place : {false, true}) {
        for (optiRedOp_t op : {optiSum, optiAvg}) {
          const int incast[3] = {OPTI_INCAST_MAX, 1, 2};
          cases.push_back({t, count, in_place, op, incast[k++ % 3]});
        }
      }
    }
  }
  return cases;
}

TEST(Loopback, ExactSmallCountsEveryTypeTwoToEightProcesses) {
  for (int n = 2; n <= 8; ++n) {
    const std::string dir = temp_dir();
    const std::vector<ExactCase> cases = small_grid(n);
    EXPECT_EQ(run_ranks(n, {}, [&](int r) { return exact_rank(r, n, dir, cases); }), 0) << n;
  }
}

// Large counts, fewer of them: 2^20 + 1 and 2^22 - 1 for every type, in and out of place, at
// N = 3, 5 (remainders 2 and 3: shards of unequal length) and 8.
TEST(Loopback, ExactLargeCountsEveryType) {
  for (int n : {3, 5, 8}) {
    std::vector<ExactCase> cases;
    for (optiDataType_t t : {optiFloat32, optiFloat16, optiBfloat16, optiFloat64}) {
      cases.push_back({t, (size_t(1) << 20) + 1, n != 8, optiSum, OPTI_INCAST_MAX});
      cases.push_back({t, (size_t(1) << 22) - 1, n == 8, optiAvg, 2});
    }
    const std::string dir = temp_dir();
    EXPECT_EQ(run_ranks(n, {}, [&](int r) { return exact_rank(r, n, dir, cases); }), 0) << n;
  }
}

// The top of the range, 2^24 elements: every type at N = 2 (in and out of place), fp32 and
// fp16 at N = 8 (64 MiB and 32 MiB per rank; fp64 there would hold 3 GiB across the ranks).
TEST(Loopback, ExactTwoToTheTwentyFour) {
  const size_t count = size_t(1) << 24;
  const std::vector<ExactCase> two = {{optiFloat32, count, true, optiSum, OPTI_INCAST_MAX},
                                      {optiFloat16, count, false, optiAvg, OPTI_INCAST_MAX},
                                      {optiBfloat16, count, true, optiAvg, OPTI_INCAST_MAX},
                                      {optiFloat64, count, false, optiSum, OPTI_INCAST_MAX}};
  const std::vector<ExactCase> eight = {{optiFloat32, count, false, optiAvg, OPTI_INCAST_MAX},
                                        {optiFloat16, count, true, optiSum, 3}};
  for (int n : {2, 8}) {
    const std::string dir = temp_dir();
    const auto& cases = n == 2 ? two : eight;
    EXPECT_EQ(run_ranks(n, {}, [&](int r) { return exact_rank(r, n, dir, cases); }), 0) << n;
  }
}

// Bounded mode with the transport's fault injector dropping datagrams: every call completes,
// the results are finite, the error is bounded, and the statistics saw the loss.
int bounded_rank(int rank, int n, const std::string& dir, bool hadamard) {
  optiOptions_t o;
  CHILD_CHECK(optiOptionsDefault(&o) == optiSuccess, "options");
  o.mode = optiBounded;
  o.hadamard = hadamard;
  o.hadamardBlock = 1024;
  optiComm_t comm = nullptr;
  CHILD_CHECK(optiHostCommInitFile(&comm, dir.c_str(), rank, n, &o) == optiSuccess, "init");
  const size_t count = 1 << 18;
  const double eps = 0.05;
  const int calls = 6;
  // Inputs and references first, so that ranks do little between calls: a rank that posts its
  // receives late loses whole messages (the peers' bounded sends expire), which is correct
  // bounded behaviour but not what this test measures.
  std::vector<std::vector<uint8_t>> bufs(calls, std::vector<uint8_t>(count * 4));
  std::vector<std::vector<double>> refs(calls, std::vector<double>(count, 0.0));
  for (int call = 0; call < calls; ++call) {
    for (size_t i = 0; i < count; ++i) {
      const double base = std::sin(double(i) * 0.01 + call);
      for (int s = 0; s < n; ++s)
        refs[size_t(call)][i] += float(base + eps * std::cos(double(i) + s));
      set(optiFloat32, bufs[size_t(call)], i, base + eps * std::cos(double(i) + rank));
    }
  }
  for (int call = 0; call < calls; ++call) {
    CHILD_CHECK(optiAllReduce(bufs[size_t(call)].data(), bufs[size_t(call)].data(), count,
                              optiFloat32, optiSum, comm, nullptr) == optiSuccess,
                "allreduce call %d", call);
  }
  double err2 = 0, ref2 = 0, max_abs = 0;
  for (int call = 1; call < calls; ++call) {  // call 0 is exact
    for (size_t i = 0; i < count; ++i) {
      const double v = get(optiFloat32, bufs[size_t(call)], i);
      CHILD_CHECK(std::isfinite(v), "non-finite result at %zu", i);
      const double e = v - refs[size_t(call)][i];
      err2 += e * e;
      ref2 += refs[size_t(call)][i] * refs[size_t(call)][i];
      max_abs = std::fmax(max_abs, std::fabs(e));
    }
  }
  optiStats_t total;
  CHILD_CHECK(optiGetStats(comm, nullptr, &total) == optiSuccess, "stats");
  const double rel = std::sqrt(err2 / ref2);
  std::printf(
      "rank %d hadamard %d: lost %.4f%% (p1 %llu, p2 %llu), deadline hits %llu, "
      "rel L2 error %.5f, max abs %.4f, tB %u us tC %u us\n",
      rank, int(hadamard), 100 * total.lostFraction, (unsigned long long)total.elementsLost[0],
      (unsigned long long)total.elementsLost[1], (unsigned long long)total.deadlineHits, rel,
      max_abs, total.tbUs, total.tcUs);
  // The parent checks that the injector dropped something somewhere.
  FILE* f = std::fopen((dir + "/lost." + std::to_string(rank)).c_str(), "w");
  CHILD_CHECK(f != nullptr, "lost file");
  std::fprintf(f, "%llu\n", (unsigned long long)(total.elementsLost[0] + total.elementsLost[1]));
  std::fclose(f);
  // Loss here is mostly whole messages past the deadline (tens of %), so the bound is loose;
  // the sharp per-element bound holds without Hadamard.
  CHILD_CHECK(rel < 0.5, "relative error %g", rel);
  if (!hadamard) CHILD_CHECK(max_abs <= 2 * n * eps + 1e-3, "max abs error %g", max_abs);
  CHILD_CHECK(optiCommDestroy(comm) == optiSuccess, "destroy");
  return 0;
}

const std::vector<std::pair<std::string, std::string>> kFaultEnv = {
    {"OPTIREDUCE_FAULT_DROP", "0.02"},     {"OPTIREDUCE_FAULT_BURST", "4"},
    {"OPTIREDUCE_FAULT_SEED", "7"},        {"OPTIREDUCE_TIMEOUT_MS", "20"},
    {"OPTIREDUCE_CALIBRATION_STEPS", "0"},
};

uint64_t total_lost(const std::string& dir, int n) {
  uint64_t sum = 0;
  for (int r = 0; r < n; ++r) {
    unsigned long long v = 0;
    if (FILE* f = std::fopen((dir + "/lost." + std::to_string(r)).c_str(), "r")) {
      if (std::fscanf(f, "%llu", &v) != 1) v = 0;
      std::fclose(f);
    }
    sum += v;
  }
  return sum;
}

// Bounded mode at N = 8 under the fault injector, audited element by element. Rank r
// contributes x_r(i) = b(i) + 8^r (integers, exact in fp64), so the exact sum is
// N b + sum_r 8^r, and every estimate the library makes can be recognised and decoded:
//  - phase 1 (rank j reduces shard j): sum_S x_s x N / k over the k < N contributions S that
//    arrived, j always among them. sum_S 8^s has base-8 digits 1 exactly at S (N <= 8,
//    no carries), so S and k follow from the value: two different (S, k) give means that
//    differ by at least N / 49, far above fp64 rounding here, and none equals the exact mean;
//  - phase 2 (rank r lost element i of shard j != r): fl(N x_r(i)), which no phase-1 estimate
//    of shard j equals (that would need S = {r}, but j is in S).
// The audit then checks the counters exactly: in the own shard, elementsLost[0] is the sum of
// N - k over its elements; elsewhere elementsLost[1] is the number of phase-2 estimates, and
// every other value is exact or a valid phase-1 estimate of its owner. Every error is within
// N x (max - min contribution); elementsExpected and lostFraction match the shard plan.
// Then the communicator switches to exact mode: under the same loss, results are exact.
constexpr int64_t kDigitBase = 8;  // > N - 1 >= k: the digits of k x sum_S 8^s never carry

int64_t digit_weight(int r) {
  int64_t w = 1;
  for (int s = 0; s < r; ++s) w *= kDigitBase;
  return w;
}

// The number k < N of contributions behind a phase-1 estimate `v` of shard `owner`, or 0 when
// v is no such estimate.
int decode_phase1(double v, int64_t b, int n, int owner) {
  for (int k = 1; k < n; ++k) {
    // v = sum x N / k up to rounding (|v| < 2^25: a few 1e-9), and candidates lie >= N/49 apart.
    const double sum = std::nearbyint(v * double(k) / double(n));
    if (std::fabs(sum * double(n) / double(k) - v) > 1e-3) continue;
    int64_t mask = int64_t(sum) - int64_t(k) * b;
    int ones = 0;
    bool owner_in = false;
    for (int s = 0; s < n && mask >= 0; ++s, mask /= kDigitBase) {
      const int64_t d = mask % kDigitBase;
      if (d > 1) break;
      ones += int(d);
      owner_in |= s == owner && d == 1;
    }
    if (mask == 0 && ones == k && owner_in) return k;
  }
  return 0;
}

int bounded_audit_rank(int rank, int n, const std::string& dir) {
  optiOptions_t o;
  CHILD_CHECK(optiOptionsDefault(&o) == optiSuccess, "options");
  o.mode = optiBounded;
  o.hadamard = 0;
  o.safeguardRedo = 0;  // a redo would make the results exact and hide the estimates
  o.exactBelowBytes = 0;
  optiComm_t comm = nullptr;
  CHILD_CHECK(optiHostCommInitFile(&comm, dir.c_str(), rank, n, &o) == optiSuccess, "init");
  const size_t count = (size_t(1) << 17) + 3;  // 1 MiB of fp64, shards of unequal length
  const int calls = 6;
  auto owner_of = [&](size_t i) { return shard_of(count, n, i); };
  auto b = [](int call, size_t i) { return value(9, uint64_t(100 + call), i); };
  int64_t weights = 0;
  for (int s = 0; s < n; ++s) weights += digit_weight(s);
  // Inputs first, so that ranks do little between calls (see bounded_rank).
  std::vector<std::vector<double>> in(calls), out(calls);
  for (int call = 0; call < calls; ++call) {
    in[size_t(call)].resize(count);
    for (size_t i = 0; i < count; ++i)
      in[size_t(call)][i] = double(b(call, i) + digit_weight(rank));
    if (call % 2) out[size_t(call)].assign(count, 0.0);  // odd calls out of place
  }
  std::vector<optiStats_t> last(calls);
  for (int call = 0; call < calls; ++call) {
    double* src = in[size_t(call)].data();
    double* dst = call % 2 ? out[size_t(call)].data() : src;
    CHILD_CHECK(optiAllReduce(src, dst, count, optiFloat64, optiSum, comm, nullptr) == optiSuccess,
                "allreduce call %d", call);
    CHILD_CHECK(optiGetStats(comm, &last[size_t(call)], nullptr) == optiSuccess, "stats");
  }
  const double bound = double(n) * double(digit_weight(n - 1) - 1);
  uint64_t lost = 0, expected = 0;
  for (int call = 0; call < calls; ++call) {
    const optiStats_t& st = last[size_t(call)];
    const double* res = call % 2 ? out[size_t(call)].data() : in[size_t(call)].data();
    uint64_t lost0 = 0, lost1 = 0;  // as decoded from the values
    for (size_t i = 0; i < count; ++i) {
      const int64_t bi = b(call, i);
      const double exact = double(int64_t(n) * bi + weights), v = res[i];
      if (v == exact) continue;
      CHILD_CHECK(std::isfinite(v) && std::fabs(v - exact) <= bound,
                  "call %d element %zu: %.17g, exact %.17g, bound %g", call, i, v, exact, bound);
      const int owner = owner_of(i);
      if (owner != rank && v == double(n) * double(bi + digit_weight(rank))) {
        ++lost1;
        continue;
      }
      const int k = decode_phase1(v, bi, n, owner);
      CHILD_CHECK(k > 0, "call %d element %zu (shard %d): %.17g is no estimate, exact %.17g", call,
                  i, owner, v, exact);
      if (owner == rank) lost0 += uint64_t(n - k);
    }
    CHILD_CHECK(st.calls == 1 && st.exactCalls == (call == 0 ? 1u : 0u), "call %d exact %llu", call,
                (unsigned long long)st.exactCalls);
    CHILD_CHECK(st.elementsLost[0] == lost0 && st.elementsLost[1] == lost1,
                "call %d: counters say %llu + %llu lost, the values %llu + %llu", call,
                (unsigned long long)st.elementsLost[0], (unsigned long long)st.elementsLost[1],
                (unsigned long long)lost0, (unsigned long long)lost1);
    const uint64_t own_len = count / size_t(n) + (size_t(rank) < count % size_t(n) ? 1 : 0);
    CHILD_CHECK(st.elementsExpected[0] == uint64_t(n - 1) * own_len &&
                    st.elementsExpected[1] == count - own_len,
                "call %d expected %llu %llu", call, (unsigned long long)st.elementsExpected[0],
                (unsigned long long)st.elementsExpected[1]);
    const uint64_t e = st.elementsExpected[0] + st.elementsExpected[1];
    CHILD_CHECK(std::fabs(st.lostFraction - double(lost0 + lost1) / double(e)) < 1e-12,
                "call %d lostFraction %g", call, st.lostFraction);
    lost += lost0 + lost1;
    expected += e;
  }
  std::printf("rank %d: delivered %.4f%% of %llu elements over %d bounded calls\n", rank,
              100.0 * (1.0 - double(lost) / double(expected)), (unsigned long long)expected,
              calls - 1);
  FILE* f = std::fopen((dir + "/lost." + std::to_string(rank)).c_str(), "w");
  CHILD_CHECK(f != nullptr, "lost file");
  std::fprintf(f, "%llu\n", (unsigned long long)lost);
  std::fclose(f);
  // Exact mode under the same injected loss: the transport's retransmissions make it exact.
  const std::vector<ExactCase> exact_under_loss = {
      {optiFloat32, 65537, true, optiSum, OPTI_INCAST_MAX},
      {optiBfloat16, 1021, false, optiAvg, 2},
      {optiFloat64, 7, true, optiAvg, 1}};
  o.mode = optiExact;
  if (exact_cases(comm, o, rank, n, exact_under_loss) != 0) return 1;
  CHILD_CHECK(optiCommDestroy(comm) == optiSuccess, "destroy");
  return 0;
}

TEST(Loopback, BoundedLossAccountingEightProcesses) {
  const int n = 8;
  const std::string dir = temp_dir();
  EXPECT_EQ(run_ranks(n, kFaultEnv, [&](int r) { return bounded_audit_rank(r, n, dir); }), 0);
  EXPECT_GT(total_lost(dir, n), 0u) << "the fault injector dropped nothing";
}

TEST(Loopback, BoundedUnderFaultInjectionWithoutHadamard) {
  const std::string dir = temp_dir();
  EXPECT_EQ(run_ranks(3, kFaultEnv, [&](int r) { return bounded_rank(r, 3, dir, false); }), 0);
  EXPECT_GT(total_lost(dir, 3), 0u) << "the fault injector dropped nothing";
}

TEST(Loopback, BoundedUnderFaultInjectionWithHadamard) {
  const std::string dir = temp_dir();
  EXPECT_EQ(run_ranks(3, kFaultEnv, [&](int r) { return bounded_rank(r, 3, dir, true); }), 0);
  EXPECT_GT(total_lost(dir, 3), 0u) << "the fault injector dropped nothing";
}

// Issue 12, defect 6: replicas drift. Each rank writes its result of every call; the test then
// measures, per call, the largest relative L2 difference between a rank's result and rank 0's
// (what data-parallel replicas would apply). Inputs: random, different per rank and call.
constexpr int kDriftCalls = 6;
constexpr size_t kDriftCount = size_t(1) << 18;

int drift_rank(int rank, int n, const std::string& dir, bool hadamard) {
  optiOptions_t o;
  CHILD_CHECK(optiOptionsDefault(&o) == optiSuccess, "options");
  o.mode = optiBounded;
  o.hadamard = hadamard ? 1 : 0;
  o.safeguardRedo = 0;
  o.exactBelowBytes = 0;
  optiComm_t comm = nullptr;
  CHILD_CHECK(optiHostCommInitFile(&comm, dir.c_str(), rank, n, &o) == optiSuccess, "init");
  std::vector<std::vector<float>> buf(kDriftCalls, std::vector<float>(kDriftCount));
  for (int c = 0; c < kDriftCalls; ++c)
    for (size_t i = 0; i < kDriftCount; ++i)
      buf[size_t(c)][i] = float(value(3, uint64_t(1000 * c + rank), i)) / 64.0f;
  for (int c = 0; c < kDriftCalls; ++c)
    CHILD_CHECK(optiAllReduce(buf[size_t(c)].data(), buf[size_t(c)].data(), kDriftCount,
                              optiFloat32, optiSum, comm, nullptr) == optiSuccess,
                "allreduce %d", c);
  optiStats_t total{};
  CHILD_CHECK(optiGetStats(comm, nullptr, &total) == optiSuccess, "stats");
  std::printf("rank %d: lost fraction %.4f over %d calls\n", rank, total.lostFraction,
              kDriftCalls);
  FILE* f = std::fopen((dir + "/drift." + std::to_string(rank)).c_str(), "wb");
  CHILD_CHECK(f != nullptr, "drift file");
  for (const auto& b : buf) CHILD_CHECK(std::fwrite(b.data(), 4, b.size(), f) == b.size(), "write");
  std::fclose(f);
  CHILD_CHECK(optiCommDestroy(comm) == optiSuccess, "destroy");
  return 0;
}

void measure_drift(bool hadamard) {
  const int n = 4;
  const std::string dir = temp_dir();
  ASSERT_EQ(run_ranks(n, kFaultEnv, [&](int r) { return drift_rank(r, n, dir, hadamard); }), 0);
  std::vector<std::vector<float>> out(size_t(n), std::vector<float>(kDriftCalls * kDriftCount));
  for (int r = 0; r < n; ++r) {
    FILE* f = std::fopen((dir + "/drift." + std::to_string(r)).c_str(), "rb");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(std::fread(out[size_t(r)].data(), 4, out[size_t(r)].size(), f), out[size_t(r)].size());
    std::fclose(f);
  }
  double worst = 0;
  for (int c = 0; c < kDriftCalls; ++c) {
    double drift = 0;
    for (int r = 1; r < n; ++r) {
      double num = 0, den = 0;
      for (size_t i = 0; i < kDriftCount; ++i) {
        const double a = out[0][size_t(c) * kDriftCount + i];
        const double b = out[size_t(r)][size_t(c) * kDriftCount + i];
        num += (b - a) * (b - a);
        den += a * a;
      }
      drift = std::max(drift, std::sqrt(num / den));
    }
    std::printf("%s call %d: largest relative L2 difference to rank 0: %.3e\n",
                hadamard ? "Hadamard" : "plain", c, drift);
    // The first call of a communicator is exact: every rank holds the same bits.
    if (c == 0) {
      EXPECT_EQ(drift, 0.0);
    }
    EXPECT_TRUE(std::isfinite(drift));
    worst = std::max(worst, drift);
  }
  EXPECT_GT(worst, 0.0) << "no drift under loss: the measurement measured nothing";
}

TEST(Loopback, ReplicaDriftUnderLossWithoutHadamard) {
  measure_drift(false);
}

TEST(Loopback, ReplicaDriftUnderLossWithHadamard) {
  measure_drift(true);
}

int free_port() {
  // A port nobody listens on right now: bind to 0, read it back, release it.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

TEST(Loopback, TorchrunStyleTcpRendezvous) {
  const int n = 3;
  const std::string port = std::to_string(free_port());
  const int failed = run_ranks(
      n, {{"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", port}, {"WORLD_SIZE", std::to_string(n)}},
      [&](int rank) {
        ::setenv("RANK", std::to_string(rank).c_str(), 1);
        optiComm_t comm = nullptr;
        CHILD_CHECK(optiHostCommInit(&comm, nullptr) == optiSuccess, "init");
        int r = -1, size = -1;
        CHILD_CHECK(optiCommRank(comm, &r) == optiSuccess && r == rank, "rank");
        CHILD_CHECK(optiCommSize(comm, &size) == optiSuccess && size == n, "size");
        std::vector<float> v(5000, float(rank + 1));
        CHILD_CHECK(optiAllReduce(v.data(), v.data(), v.size(), optiFloat32, optiSum, comm,
                                  nullptr) == optiSuccess,
                    "allreduce");
        for (float x : v) CHILD_CHECK(x == 6.0f, "got %g", double(x));
        CHILD_CHECK(optiCommDestroy(comm) == optiSuccess, "destroy");
        return 0;
      });
  EXPECT_EQ(failed, 0);
}

// The caller's store through optiStore_t (what the Python package hands PyTorch's store to):
// one file per key, as a user's store might keep them, with a count of the callbacks made.
struct DirStore {
  std::string dir;
  int sets = 0, gets = 0;
  static int set(void* user, const char* key, const void* value, size_t len) {
    auto* s = static_cast<DirStore*>(user);
    ++s->sets;
    std::string name(key);
    std::replace(name.begin(), name.end(), '/', '_');
    const std::string tmp = s->dir + "/." + name, path = s->dir + "/" + name;
    FILE* f = std::fopen(tmp.c_str(), "wb");
    if (f == nullptr) return 2;
    const bool ok = std::fwrite(value, 1, len, f) == len;
    return std::fclose(f) == 0 && ok && std::rename(tmp.c_str(), path.c_str()) == 0 ? 0 : 2;
  }
  static int get(void* user, const char* key, void* value, size_t cap, size_t* len,
                 int timeout_ms) {
    auto* s = static_cast<DirStore*>(user);
    ++s->gets;
    std::string name(key);
    std::replace(name.begin(), name.end(), '/', '_');
    const std::string path = s->dir + "/" + name;
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
      if (FILE* f = std::fopen(path.c_str(), "rb")) {
        std::string v;
        char buf[4096];
        size_t k;
        while ((k = std::fread(buf, 1, sizeof(buf), f)) > 0) v.append(buf, k);
        std::fclose(f);
        *len = v.size();
        std::memcpy(value, v.data(), std::min(cap, v.size()));
        return 0;
      }
      if (std::chrono::steady_clock::now() > end) return 1;
      ::usleep(2000);
    }
  }
};

TEST(Loopback, CallersStoreRendezvous) {
  const int n = 3;
  const std::string dir = temp_dir();
  const int failed = run_ranks(n, {}, [&](int rank) {
    DirStore ds{dir};
    const optiStore_t store{&ds, &DirStore::set, &DirStore::get};
    optiComm_t comm = nullptr;
    CHILD_CHECK(optiHostCommInitStore(&comm, &store, rank, n, nullptr) == optiSuccess, "init");
    CHILD_CHECK(ds.sets > 0 && ds.gets > 0, "the store was not used: %d sets, %d gets", ds.sets,
                ds.gets);
    std::vector<double> v(7000, double(rank + 1));
    CHILD_CHECK(optiAllReduce(v.data(), v.data(), v.size(), optiFloat64, optiAvg, comm, nullptr) ==
                    optiSuccess,
                "allreduce");
    for (double x : v) CHILD_CHECK(x == 2.0, "got %g", x);
    CHILD_CHECK(optiCommDestroy(comm) == optiSuccess, "destroy");
    return 0;
  });
  EXPECT_EQ(failed, 0);
}

TEST(Loopback, CallersStoreFailuresAreReported) {
  const int failed = run_ranks(1, {}, [&](int rank) {
    // Two ranks expected, one joins: rank 1 waits for rank 0's seed, which never comes.
    const std::string dir = temp_dir();
    DirStore ds{dir};
    optiStore_t store{&ds, &DirStore::set, &DirStore::get};
    optiComm_t comm = nullptr;
    store.get = [](void*, const char*, void*, size_t, size_t*, int) { return 1; };
    CHILD_CHECK(optiHostCommInitStore(&comm, &store, 1, 2, nullptr) == optiRemoteError,
                "a store that times out");
    CHILD_CHECK(std::strstr(optiGetLastError(), "timed out") != nullptr, "message: %s",
                optiGetLastError());
    store.get = [](void*, const char*, void*, size_t, size_t*, int) { return 7; };
    CHILD_CHECK(optiHostCommInitStore(&comm, &store, 1, 2, nullptr) == optiSystemError,
                "a store that fails");
    CHILD_CHECK(std::strstr(optiGetLastError(), "get returned 7") != nullptr, "message: %s",
                optiGetLastError());
    store.get = nullptr;
    CHILD_CHECK(optiHostCommInitStore(&comm, &store, 0, 2, nullptr) == optiInvalidArgument,
                "no get callback");
    return rank;
  });
  EXPECT_EQ(failed, 0);
}

// A rank that gives up aborts: its peers, blocked in a call that needs it, fail with
// optiRemoteError at once instead of waiting for it (the hook's error path in Python).
TEST(Loopback, AbortedRankFailsItsPeersCallsPromptly) {
  const int n = 3;
  const std::string dir = temp_dir();
  const int failed = run_ranks(n, {}, [&](int rank) {
    optiComm_t comm = nullptr;
    CHILD_CHECK(optiHostCommInitFile(&comm, dir.c_str(), rank, n, nullptr) == optiSuccess, "init");
    if (rank == 2) {
      CHILD_CHECK(optiCommAbort(comm) == optiSuccess, "abort");
      // Stays alive until both peers have failed: only the abort can have told them.
      for (int i = 0; i < 300; ++i) {
        if (::access((dir + "/failed0").c_str(), F_OK) == 0 &&
            ::access((dir + "/failed1").c_str(), F_OK) == 0)
          return 0;
        ::usleep(100'000);
      }
      return 1;
    }
    std::vector<float> v(1 << 20, 1.0f);
    const auto t0 = std::chrono::steady_clock::now();
    const optiResult_t r =
        optiAllReduce(v.data(), v.data(), v.size(), optiFloat32, optiSum, comm, nullptr);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CHILD_CHECK(r == optiRemoteError, "allreduce with an aborted peer returned %d", int(r));
    CHILD_CHECK(s < 10, "the failure took %.1f s", s);
    CHILD_CHECK(optiCommAbort(comm) == optiSuccess, "abort after the failure");
    const std::string mark = dir + "/failed" + std::to_string(rank);
    std::fclose(std::fopen(mark.c_str(), "w"));
    return 0;
  });
  EXPECT_EQ(failed, 0);
}

TEST(Api, BadArgumentsGiveClearErrors) {
  // Checked in a child: the parent never starts a transport engine (it forks).
  const std::string dir = temp_dir();
  const int failed = run_ranks(1, {}, [&](int rank) {
    optiComm_t comm = nullptr;
    CHILD_CHECK(optiHostCommInitFile(&comm, dir.c_str(), 0, 1, nullptr) == optiSuccess, "init");
    float x[4] = {1, 2, 3, 4};
    CHILD_CHECK(
        optiAllReduce(x, x, 4, optiDataType_t(9), optiSum, comm, nullptr) == optiInvalidArgument,
        "bad type accepted");
    CHILD_CHECK(std::strstr(optiGetLastError(), "datatype") != nullptr, "message '%s'",
                optiGetLastError());
    CHILD_CHECK(
        optiAllReduce(x, x, 4, optiFloat32, optiRedOp_t(5), comm, nullptr) == optiInvalidArgument,
        "bad op accepted");
    CHILD_CHECK(
        optiAllReduce(x, x + 1, 3, optiFloat32, optiSum, comm, nullptr) == optiInvalidArgument,
        "overlap accepted");
    CHILD_CHECK(
        optiAllReduce(nullptr, x, 4, optiFloat32, optiSum, comm, nullptr) == optiInvalidArgument,
        "null accepted");
    CHILD_CHECK(
        optiAllReduce(x, x, 4, optiFloat32, optiSum, nullptr, nullptr) == optiInvalidArgument,
        "null comm accepted");
    optiOptions_t o;
    CHILD_CHECK(optiOptionsDefault(&o) == optiSuccess, "defaults");
    o.hadamardBlock = 1000;
    CHILD_CHECK(optiCommSetOptions(comm, &o) == optiInvalidArgument, "block 1000 accepted");
    CHILD_CHECK(std::strstr(optiGetLastError(), "power of two") != nullptr, "message");
    // One rank: the sum is the input, in and out of place.
    float y[4];
    CHILD_CHECK(
        optiAllReduce(x, y, 4, optiFloat32, optiSum, comm, nullptr) == optiSuccess && y[3] == 4.f,
        "one rank");
    optiComm_t bad = nullptr;
    CHILD_CHECK(optiHostCommInitFile(&bad, dir.c_str(), 3, 2, nullptr) == optiInvalidArgument,
                "rank 3 of 2 accepted");
    CHILD_CHECK(optiCommInit(&bad, nullptr, nullptr) == optiInvalidArgument, "null nccl comm");
    CHILD_CHECK(optiCommDestroy(comm) == optiSuccess, "destroy");
    return 0;
  });
  EXPECT_EQ(failed, 0);
  EXPECT_STREQ(optiGetErrorString(optiSuccess), "success");
  EXPECT_NE(std::string(optiGetErrorString(optiResult_t(77))), "");
}

TEST(Api, BadEnvironmentIsReported) {
  const int failed = run_ranks(1, {{"OPTIREDUCE_INCAST", "lots"}}, [&](int rank) {
    optiOptions_t o;
    CHILD_CHECK(optiOptionsDefault(&o) == optiInvalidUsage, "OPTIREDUCE_INCAST=lots accepted");
    CHILD_CHECK(std::strstr(optiGetLastError(), "OPTIREDUCE_INCAST") != nullptr, "message '%s'",
                optiGetLastError());
    ::unsetenv("MASTER_ADDR");
    optiComm_t c = nullptr;
    CHILD_CHECK(optiHostCommInit(&c, &o) != optiSuccess, "no MASTER_ADDR accepted");
    return 0;
  });
  EXPECT_EQ(failed, 0);
}

}  // namespace
