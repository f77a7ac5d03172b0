// Allreduce latency and bandwidth on loopback, side by side: TAR bounded (Hadamard on), TAR
// exact, and Gloo's ring (when built with Gloo). Ranks are processes; each iteration starts
// after a barrier and its figure is the slowest rank's time. Per size prints P50, P99, P99.9,
// mean, algbw and busbw (nccl-tests conventions, GB/s = 1e9), the delivered fraction and the
// relative L2 error against the exact sum (bounded mode), and the fraction of steps that hit a
// deadline.
//   allreduce_bench [--ranks 2,4] [--min BYTES] [--max BYTES] [--iters N] [--modes LIST]
// LIST from: bounded, exact, gloo. The environment's OPTIREDUCE_* variables apply (fault
// injection: OPTIREDUCE_FAULT_DROP ...). OPTIREDUCE_IFNAME defaults to lo here.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bench/calibration.h"
#include "bench/flags.h"
#include "collectives/optireduce.h"

#ifdef OPTIREDUCE_BENCH_GLOO
#include <gloo/allreduce.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>
#endif

namespace {

namespace bench = optireduce::bench;

struct Args {
  std::vector<int> ranks = {2, 4};
  size_t min_bytes = 64 << 10;
  size_t max_bytes = 64 << 20;
  int iters = 0;  // 0: by size
  std::vector<std::string> modes = {"bounded", "exact", "gloo"};
};

// Exits with 2 and the reason on an unknown flag or a bad value, so that a typo never runs the
// defaults.
Args parse(int argc, char** argv) {
  Args a;
  const auto rank_count = [](const std::string& x, int* n) {
    char* end = nullptr;
    const long v = std::strtol(x.c_str(), &end, 10);
    if (x.empty() || *end != '\0' || v < 1 || v > 64) return false;
    *n = int(v);
    return true;
  };
  const auto mode = [](const std::string& x, std::string* m) {
    if (x != "bounded" && x != "exact" && x != "gloo") return false;
    *m = x;
    return true;
  };
  const int rc = bench::parse_flags(
      argc, argv,
      {bench::list_flag<int>("--ranks", &a.ranks, rank_count),
       bench::size_flag("--min", &a.min_bytes), bench::size_flag("--max", &a.max_bytes),
       bench::number_flag("--iters", &a.iters),
       bench::list_flag<std::string>("--modes", &a.modes, mode)},
      [&a]() -> const char* {
        if (a.min_bytes < 4 || a.min_bytes % 4 != 0)
          return "--min: a multiple of 4 bytes, at least 4";
        if (a.max_bytes < a.min_bytes) return "--max: at least --min";
        if (a.iters < 0) return "--iters: 0 (by size) or more";
        return nullptr;
      });
  if (rc != 0) std::exit(rc);
  return a;
}

// Enough samples for a P99 at small sizes, without spending minutes at 64 MiB on 2 cores.
int iters_for(size_t bytes, int forced) {
  if (forced > 0) return forced;
  if (bytes <= (256 << 10)) return 1000;
  if (bytes <= (1 << 20)) return 300;
  if (bytes <= (4 << 20)) return 100;
  return 20;
}

double input(int rank, size_t i) {
  return std::sin(double(i) * 0.001) + 0.01 * (rank + 1);
}

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  const size_t k = std::min(v.size() - 1, size_t(p * double(v.size())));
  return v[k];
}

// One process's collective operations, abstracted over TAR and Gloo.
class Runner {
 public:
  virtual ~Runner() = default;
  virtual bool allreduce(float* buf, size_t count) = 0;
  // Sum of a few doubles across ranks, exact (used for barriers and gathering times).
  virtual bool sum_small(double* v, size_t n) = 0;
  virtual void stats(double* lost, double* expected, double* deadline_hits) {
    *lost = *expected = *deadline_hits = 0;
  }
};

class TarRunner final : public Runner {
 public:
  TarRunner(optiComm_t c) : comm_(c) {}
  ~TarRunner() override { optiCommDestroy(comm_); }
  bool allreduce(float* buf, size_t count) override {
    return optiAllReduce(buf, buf, count, optiFloat32, optiSum, comm_, nullptr) == optiSuccess;
  }
  bool sum_small(double* v, size_t n) override {  // below OPTIREDUCE_EXACT_BELOW: exact
    return optiAllReduce(v, v, n, optiFloat64, optiSum, comm_, nullptr) == optiSuccess;
  }
  void stats(double* lost, double* expected, double* hits) override {
    optiStats_t t;
    optiGetStats(comm_, nullptr, &t);
    *lost = double(t.elementsLost[0] + t.elementsLost[1]);
    *expected = double(t.elementsExpected[0] + t.elementsExpected[1]);
    *hits = double(t.deadlineHits);
  }

 private:
  optiComm_t comm_;
};

#ifdef OPTIREDUCE_BENCH_GLOO
class GlooRunner final : public Runner {
 public:
  GlooRunner(int rank, int n, const std::string& dir) {
    gloo::transport::tcp::attr attr;
    attr.hostname = "127.0.0.1";
    dev_ = gloo::transport::tcp::CreateDevice(attr);
    gloo::rendezvous::FileStore store(dir);
    ctx_ = std::make_shared<gloo::rendezvous::Context>(rank, n);
    ctx_->connectFullMesh(store, dev_);
  }
  bool allreduce(float* buf, size_t count) override {
    gloo::AllreduceOptions o(ctx_);
    o.setOutput(buf, count);
    o.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
    o.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
    gloo::allreduce(o);
    return true;
  }
  bool sum_small(double* v, size_t n) override {
    gloo::AllreduceOptions o(ctx_);
    o.setOutput(v, n);
    o.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
    o.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<double>));
    gloo::allreduce(o);
    return true;
  }

 private:
  std::shared_ptr<gloo::transport::Device> dev_;
  std::shared_ptr<gloo::rendezvous::Context> ctx_;
};
#endif

int run_rank(int rank, int n, const std::string& mode, const std::string& dir, const Args& a) {
  std::unique_ptr<Runner> r;
  if (mode == "gloo") {
#ifdef OPTIREDUCE_BENCH_GLOO
    r = std::make_unique<GlooRunner>(rank, n, dir);
#else
    return 0;
#endif
  } else {
    optiOptions_t o;
    if (optiOptionsDefault(&o) != optiSuccess) return 2;
    o.mode = mode == "bounded" ? optiBounded : optiExact;
    optiComm_t c = nullptr;
    if (optiHostCommInitFile(&c, dir.c_str(), rank, n, &o) != optiSuccess) {
      std::fprintf(stderr, "init: %s\n", optiGetLastError());
      return 3;
    }
    r = std::make_unique<TarRunner>(c);
  }
  std::vector<float> buf(a.max_bytes / 4), ref(a.max_bytes / 4);
  std::vector<double> times(static_cast<size_t>(n));
  for (size_t bytes = a.min_bytes; bytes <= a.max_bytes; bytes *= 4) {
    const size_t count = bytes / 4;
    for (size_t i = 0; i < count; ++i) {
      double s = 0;
      for (int q = 0; q < n; ++q) s += float(input(q, i));
      ref[i] = float(s);
    }
    const int iters = iters_for(bytes, a.iters);
    std::vector<double> samples;
    double err2 = 0, ref2 = 0;
    double l0, e0, h0, l1, e1, h1;
    // Warm-up: the first calls of a communicator go exact while the transport calibrates tB
    // (before the first size only: later sizes find it done).
    const int warm =
        3 + (mode == "bounded" && bytes == a.min_bytes
                 ? optireduce::bench::calibration_calls(2 * (n - 1))
                 : 0);
    for (int w = 0; w < warm; ++w) {
      for (size_t i = 0; i < count; ++i) buf[i] = float(input(rank, i));
      if (!r->allreduce(buf.data(), count)) return 4;
    }
    r->stats(&l0, &e0, &h0);
    for (int it = 0; it < iters; ++it) {
      for (size_t i = 0; i < count; ++i) buf[i] = float(input(rank, i));
      std::fill(times.begin(), times.end(), 0.0);
      if (!r->sum_small(times.data(), times.size())) return 5;  // barrier
      const auto t0 = std::chrono::steady_clock::now();
      if (!r->allreduce(buf.data(), count)) {
        std::fprintf(stderr, "allreduce: %s\n", optiGetLastError());
        return 6;
      }
      times[size_t(rank)] =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (!r->sum_small(times.data(), times.size())) return 7;
      samples.push_back(*std::max_element(times.begin(), times.end()));
      if (it % 10 == 0) {
        for (size_t i = 0; i < count; ++i) {
          const double e = double(buf[i]) - double(ref[i]);
          err2 += e * e;
          ref2 += double(ref[i]) * double(ref[i]);
        }
      }
    }
    r->stats(&l1, &e1, &h1);
    double agg[3] = {l1 - l0, e1 - e0, h1 - h0};
    if (!r->sum_small(agg, 3)) return 8;
    if (rank == 0) {
      const double p50 = percentile(samples, 0.5), p99 = percentile(samples, 0.99);
      const double p999 = percentile(samples, 0.999);
      double mean = 0;
      for (double s : samples) mean += s / double(samples.size());
      const double algbw = double(bytes) / p50 / 1e9;
      const double busbw = algbw * 2.0 * (n - 1) / n;
      const double delivered = agg[1] > 0 ? 1.0 - agg[0] / agg[1] : 1.0;
      // Deadline hits per step per rank: a step counts as "hit" when any receive hit.
      std::printf("%-8s %d %9zu %5d %9.3f %9.3f %9.3f %9.3f %7.3f %7.3f %9.5f %9.2e %8.1f\n",
                  mode.c_str(), n, bytes, iters, p50 * 1e3, p99 * 1e3, p999 * 1e3, mean * 1e3,
                  algbw, busbw, delivered, std::sqrt(err2 / ref2), agg[2] / n / iters);
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  ::setenv("OPTIREDUCE_IFNAME", "lo", 0);
  std::printf("%-8s %s %9s %5s %9s %9s %9s %9s %7s %7s %9s %9s %8s\n", "mode", "N", "bytes",
              "iters", "p50_ms", "p99_ms", "p999_ms", "mean_ms", "algbw", "busbw", "delivered",
              "rel_err", "dl_hits");
  std::fflush(stdout);
  int failed = 0;
  for (int n : a.ranks) {
    for (const std::string& mode : a.modes) {
      char tmpl[] = "/tmp/optireduce-bench-XXXXXX";
      const std::string dir = ::mkdtemp(tmpl);
      std::vector<pid_t> pids;
      for (int r = 0; r < n; ++r) {
        const pid_t p = ::fork();
        if (p == 0) ::_exit(run_rank(r, n, mode, dir, a));
        pids.push_back(p);
      }
      for (pid_t p : pids) {
        int st = 0;
        ::waitpid(p, &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
          std::fprintf(stderr, "%s N=%d: a rank failed (status %d)\n", mode.c_str(), n, st);
          failed = 1;
        }
      }
    }
  }
  return failed;
}
