// The non-finite verdict's test case, shared by the host path's loopback test and the GPU path's
// (tests/gpu_emu): fp32 inputs where rank 1 holds a NaN and rank 2 a -Inf (when poisoned), and
// the check that a rank's result and statistics say what optireduce.h promises for the verdict.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "collectives/elem.h"
#include "collectives/optireduce.h"
#include "tests/collectives/loss_audit.h"

namespace optireduce::testing {

// Where the poison sits: the NaN in the last shard's last elements (every other rank receives
// it in phase 2), the -Inf in the middle of the bucket.
inline size_t nan_at(size_t count) {
  return count - 3;
}
inline size_t inf_at(size_t count) {
  return count / 2 + 1;
}

// Integers in [-256, 256): sums of up to 8 are exact in fp32, so the exact result is known.
inline std::vector<float> nonfinite_input(int rank, int call, size_t count, bool poisoned) {
  std::vector<float> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = float(value(8, uint64_t(1000 * call + rank), i));
  if (poisoned && rank == 1) v[nan_at(count)] = std::nanf("");
  if (poisoned && rank == 2) v[inf_at(count)] = -INFINITY;
  return v;
}

// FNV-1a of a result, for comparing ranks' results bit for bit across processes.
inline uint64_t digest(const void* data, size_t bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

// Checks rank `rank`'s result of a bounded call with options.nonfiniteAgree on (its options'
// safeguardRedo: `redo`). Poisoned: every element the quiet NaN, or with the redo the exact
// result (NaN and -Inf at the poison, the exact sums elsewhere), and the call counted in
// nonfiniteCalls (and safeguardRedos). Not poisoned: all finite, nothing counted. Returns ""
// or what is wrong.
inline std::string check_nonfinite(int rank, int n, int call, size_t count, const float* res,
                                   const optiStats_t& st, bool poisoned, bool redo) {
  char msg[256];
  if (st.nonfiniteCalls != (poisoned ? 1u : 0u)) {
    std::snprintf(msg, sizeof msg, "rank %d call %d: nonfiniteCalls %llu, poisoned %d", rank, call,
                  (unsigned long long)st.nonfiniteCalls, int(poisoned));
    return msg;
  }
  if (poisoned && redo && st.safeguardRedos != 1) {
    std::snprintf(msg, sizeof msg, "rank %d call %d: poisoned, not redone", rank, call);
    return msg;
  }
  for (size_t i = 0; i < count; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &res[i], 4);
    bool ok;
    if (!poisoned) {
      ok = std::isfinite(res[i]);
    } else if (!redo) {
      ok = bits == coll::Elem<coll::DType::kF32>::kQuietNaN;
    } else if (i == nan_at(count)) {
      ok = std::isnan(res[i]);
    } else if (i == inf_at(count)) {
      ok = res[i] == -INFINITY;
    } else {
      float sum = 0;
      for (int q = 0; q < n; ++q) sum += float(value(8, uint64_t(1000 * call + q), i));
      ok = res[i] == sum;
    }
    if (!ok) {
      std::snprintf(msg, sizeof msg,
                    "rank %d call %d element %zu: %g (bits %08x), poisoned %d, redo %d", rank, call,
                    i, double(res[i]), bits, int(poisoned), int(redo));
      return msg;
    }
  }
  return "";
}

}  // namespace optireduce::testing
