// The workload of the end-to-end bounded tests (loopback_test over UDP, rxe_coll_test in the
// Soft-RoCE VM): per call a smooth signal plus a per-rank term of amplitude eps, fp32, and the
// exact sum to measure the result against. Everything is made before the first call so that
// ranks do little between calls: a rank that posts its receives late loses whole messages (its
// peers' bounded sends expire), which is correct bounded behaviour but not what these measure.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "tests/collectives/typed_buffer.h"

namespace optireduce::testing {

struct BoundedWorkload {
  std::vector<std::vector<uint8_t>> bufs;  // this rank's input per call; the result, in place
  std::vector<std::vector<double>> refs;   // the exact sums

  BoundedWorkload(int rank, int nranks, size_t count, int calls, double eps)
      : bufs(size_t(calls), std::vector<uint8_t>(count * 4)),
        refs(size_t(calls), std::vector<double>(count, 0.0)) {
    for (int call = 0; call < calls; ++call) {
      for (size_t i = 0; i < count; ++i) {
        const double base = std::sin(double(i) * 0.01 + call);
        for (int s = 0; s < nranks; ++s)
          refs[size_t(call)][i] += float(base + eps * std::cos(double(i) + s));
        set(optiFloat32, bufs[size_t(call)], i, base + eps * std::cos(double(i) + rank));
      }
    }
  }

  struct Error {
    double rel_l2 = 0;
    double max_abs = 0;
    bool finite = true;
    size_t first_nonfinite = 0;  // element index, when !finite
  };
  // The results of calls [first_call, end) against the exact sums.
  Error error(int first_call) const {
    Error e;
    double err2 = 0, ref2 = 0;
    for (size_t call = size_t(first_call); call < bufs.size(); ++call) {
      for (size_t i = 0; i < refs[call].size(); ++i) {
        const double v = get(optiFloat32, bufs[call], i);
        if (!std::isfinite(v)) {
          if (e.finite) e.first_nonfinite = i;
          e.finite = false;
          continue;
        }
        const double d = v - refs[call][i];
        err2 += d * d;
        ref2 += refs[call][i] * refs[call][i];
        e.max_abs = std::fmax(e.max_abs, std::fabs(d));
      }
    }
    e.rel_l2 = ref2 > 0 ? std::sqrt(err2 / ref2) : 0;
    return e;
  }
};

}  // namespace optireduce::testing
