// The bounded-mode loss audit shared by the host path's loopback test and the GPU path's
// (tests/gpu_emu): inputs whose every estimate can be recognised and decoded, and the check of
// one call's result and statistics element by element. Also the seeded integer inputs the
// loopback tests draw from (mix, value) and the shard plan's layout (shard_of).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "collectives/optireduce.h"
#include "collectives/shard_plan.h"

namespace optireduce::testing {

// A different integer per (salt, element): a shifted, dropped, duplicated or misplaced
// contribution changes a sum almost surely (unlike a short periodic pattern).
inline uint64_t mix(uint64_t salt, uint64_t i) {
  uint64_t x = i * 0x9E3779B97F4A7C15ull + (salt + 1) * 0xD1B54A32D192ED03ull;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return x;
}
// An integer in [-2^bits, 2^bits).
inline int64_t value(int bits, uint64_t salt, uint64_t i) {
  return int64_t(mix(salt, i) >> (63 - bits)) - (int64_t(1) << bits);
}

// The shard holding element i (ShardPlan's layout).
inline int shard_of(size_t count, int n, size_t i) {
  const coll::ShardPlan p{count, n};
  int k = 0;
  while (k + 1 < n && p.offset(k + 1) <= i) ++k;
  return k;
}

// Bounded mode without Hadamard at N <= 8, audited element by element. Rank r contributes
// x_r(i) = b(i) + 8^r (integers, exact in fp64), so the exact sum is N b + sum_r 8^r, and every
// estimate the library makes can be recognised and decoded:
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
inline constexpr int64_t kDigitBase = 8;  // > N - 1 >= k: the digits of k x sum_S 8^s never carry
inline constexpr size_t kAuditCount = (size_t(1) << 17) + 3;  // 1 MiB of fp64, unequal shards

inline int64_t digit_weight(int r) {
  int64_t w = 1;
  for (int s = 0; s < r; ++s) w *= kDigitBase;
  return w;
}

// b(i) of a call: the part every rank shares.
inline int64_t audit_base(int call, size_t i) {
  return value(9, uint64_t(100 + call), i);
}

// Rank `rank`'s input of call `call`.
inline std::vector<double> audit_input(int rank, int call, size_t count) {
  std::vector<double> in(count);
  for (size_t i = 0; i < count; ++i) in[i] = double(audit_base(call, i) + digit_weight(rank));
  return in;
}

// The number k < N of contributions behind a phase-1 estimate `v` of shard `owner`, or 0 when
// v is no such estimate.
inline int decode_phase1(double v, int64_t b, int n, int owner) {
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

// Checks call `call`'s result `res` (count elements) on rank `rank` of n and its statistics
// `st` (call 0 is the communicator's exact first call). Returns "" or what is wrong; adds the
// elements lost and expected to *lost and *expected.
inline std::string audit_call(int rank, int n, size_t count, int call, const double* res,
                              const optiStats_t& st, uint64_t* lost, uint64_t* expected) {
  char msg[256];
  int64_t weights = 0;
  for (int s = 0; s < n; ++s) weights += digit_weight(s);
  const double bound = double(n) * double(digit_weight(n - 1) - 1);
  uint64_t lost0 = 0, lost1 = 0;  // as decoded from the values
  for (size_t i = 0; i < count; ++i) {
    const int64_t bi = audit_base(call, i);
    const double exact = double(int64_t(n) * bi + weights), v = res[i];
    if (v == exact) continue;
    if (!std::isfinite(v) || std::fabs(v - exact) > bound) {
      std::snprintf(msg, sizeof msg, "call %d element %zu: %.17g, exact %.17g, bound %g", call, i,
                    v, exact, bound);
      return msg;
    }
    const int owner = shard_of(count, n, i);
    if (owner != rank && v == double(n) * double(bi + digit_weight(rank))) {
      ++lost1;
      continue;
    }
    const int k = decode_phase1(v, bi, n, owner);
    if (k == 0) {
      std::snprintf(msg, sizeof msg,
                    "call %d element %zu (shard %d): %.17g is no estimate, exact %.17g", call, i,
                    owner, v, exact);
      return msg;
    }
    if (owner == rank) lost0 += uint64_t(n - k);
  }
  if (st.calls != 1 || st.exactCalls != (call == 0 ? 1u : 0u)) {
    std::snprintf(msg, sizeof msg, "call %d: %llu calls, %llu exact", call,
                  (unsigned long long)st.calls, (unsigned long long)st.exactCalls);
    return msg;
  }
  if (st.elementsLost[0] != lost0 || st.elementsLost[1] != lost1) {
    std::snprintf(msg, sizeof msg, "call %d: counters say %llu + %llu lost, the values %llu + %llu",
                  call, (unsigned long long)st.elementsLost[0],
                  (unsigned long long)st.elementsLost[1], (unsigned long long)lost0,
                  (unsigned long long)lost1);
    return msg;
  }
  const uint64_t own_len = coll::ShardPlan{count, n}.length(rank);
  if (st.elementsExpected[0] != uint64_t(n - 1) * own_len ||
      st.elementsExpected[1] != count - own_len) {
    std::snprintf(msg, sizeof msg, "call %d expected %llu %llu", call,
                  (unsigned long long)st.elementsExpected[0],
                  (unsigned long long)st.elementsExpected[1]);
    return msg;
  }
  const uint64_t e = st.elementsExpected[0] + st.elementsExpected[1];
  if (std::fabs(st.lostFraction - double(lost0 + lost1) / double(e)) >= 1e-12) {
    std::snprintf(msg, sizeof msg, "call %d lostFraction %g", call, st.lostFraction);
    return msg;
  }
  *lost += lost0 + lost1;
  *expected += e;
  return "";
}

}  // namespace optireduce::testing
