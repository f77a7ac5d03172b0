// What the tail-lab benchmarks (optireduce_bench.cc, mpi_bench.cc) share and tests/lab checks:
// the nccl-tests style command line, the seeded inputs and exact reference, the straggler
// schedule, and the reduction of per-iteration samples into one CSV row. Pure logic, no I/O
// beyond formatting.
#ifndef OPTIREDUCE_BENCH_LAB_COMMON_H_
#define OPTIREDUCE_BENCH_LAB_COMMON_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "bench/flags.h"

namespace optireduce::lab {

// Parses "64", "64K", "1M", "2G" (binary multiples, as nccl-tests does). 0 on a malformed value.
inline uint64_t parse_size(const std::string& s) {
  return bench::parse_bytes(s).value_or(0);
}

// Sizes from -b to -e, multiplied by -f each step (nccl-tests: -f 1 would never end, so treat a
// factor below 2 as "just -b and -e"). Each rounded down to whole fp32 elements.
inline std::vector<uint64_t> size_list(uint64_t min_bytes, uint64_t max_bytes, uint64_t factor) {
  std::vector<uint64_t> out;
  if (min_bytes < 4 || max_bytes < min_bytes) return out;
  if (factor < 2) {
    out.push_back(min_bytes / 4 * 4);
    if (max_bytes / 4 * 4 != out.back()) out.push_back(max_bytes / 4 * 4);
    return out;
  }
  for (uint64_t b = min_bytes; b <= max_bytes; b *= factor) {
    out.push_back(b / 4 * 4);
    if (b > max_bytes / factor) break;
  }
  return out;
}

// Splits "a,b,c"; empty items dropped.
inline std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out = bench::split_commas(s);
  std::erase(out, std::string());
  return out;
}

// SplitMix64: a tiny, well-mixed, seedable generator, so that every rank can regenerate every
// other rank's input (for the exact reference) without communication.
inline uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
// Uniform in [-1, 1): rank r's element i under `seed`.
inline float input_value(uint64_t seed, int rank, uint64_t i) {
  const uint64_t h = mix64(seed ^ mix64(uint64_t(rank) * 0x100000001B3ull + i));
  return float(double(h >> 40) / double(uint64_t(1) << 23) - 1.0);
}
inline void fill_input(uint64_t seed, int rank, float* out, uint64_t count) {
  for (uint64_t i = 0; i < count; ++i) out[i] = input_value(seed, rank, i);
}
// The exact sum over all ranks, in double.
inline std::vector<double> exact_sum(uint64_t seed, int nranks, uint64_t count) {
  std::vector<double> s(count, 0.0);
  for (int r = 0; r < nranks; ++r)
    for (uint64_t i = 0; i < count; ++i) s[i] += double(input_value(seed, r, i));
  return s;
}
// ||got - exact|| / ||exact||; a NaN or Inf in `got` gives +Inf (an erasure marker leaked).
inline double rel_l2_error(const float* got, const std::vector<double>& exact) {
  double num = 0, den = 0;
  for (size_t i = 0; i < exact.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    const double d = double(got[i]) - exact[i];
    num += d * d;
    den += exact[i] * exact[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// Which measured iterations the straggler sleeps before (seeded, identical on every rank so the
// schedule is reproducible; only the straggler acts on it).
inline std::vector<bool> straggler_schedule(uint64_t seed, int iters, double prob) {
  std::vector<bool> s(size_t(std::max(iters, 0)), false);
  for (int i = 0; i < iters; ++i) {
    const double u =
        double(mix64(seed * 0x2545F4914F6CDD1Dull + uint64_t(i)) >> 11) / double(uint64_t(1) << 53);
    s[size_t(i)] = u < prob;
  }
  return s;
}

// Nearest-rank percentile (q in [0, 1]) of a sorted sample; NaN when empty.
inline double percentile_sorted(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return NAN;
  size_t k = size_t(std::ceil(q * double(sorted.size())));
  k = std::clamp<size_t>(k, 1, sorted.size());
  return sorted[k - 1];
}

// The same of an unsorted sample.
inline double percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return percentile_sorted(v, q);
}

// Per-iteration figures, already reduced over ranks (time: max; lost/expected: sums; deadline:
// 1 if any rank closed a receive by its deadline; error: max over ranks, NaN when unchecked).
struct Iteration {
  double seconds = 0;
  double lost = 0;
  double expected = 0;
  double deadline = 0;
  double exact = 0;
  double error = NAN;
  bool straggle = false;  // the straggler slept before this iteration
};

struct Row {
  std::string env, algo;
  int ranks = 0;
  uint64_t bytes = 0;
  int iters = 0;
  double p50_ms = 0, p99_ms = 0, p999_ms = 0, mean_ms = 0, max_ms = 0, tail_ratio = 0;
  double algbw = 0, busbw = 0;  // GB/s (1e9) from the P50 time, nccl-tests' definitions
  double delivered = 1, error = NAN, error_max = NAN, deadline_frac = 0, exact_frac = 0;
  double tb_ms = 0;  // the transport's hard bound tB after the run (0: none, e.g. a baseline)
  // CPU time (user + system, every thread) that all ranks together spent inside the timed calls,
  // per iteration: what the algorithm takes from the application's cores (and, on a shared
  // host, from other tenants). NaN: not measured.
  double cpu_ms = NAN;
  // Context switches (voluntary and involuntary, every thread) that all ranks together made
  // inside the timed calls, per iteration: how often the algorithm gives up a core and takes
  // one back, each time a core that another process on the host (a background tenant, the
  // kernel's packet processing) waited for. NaN: not measured.
  double csw = NAN;
};

// Largest relative L2 error of an exact algorithm's checked result (-c 1): fp32 rounding of a
// sum over at most a few dozen ranks stays below 1e-6. More is a wrong result, which a timing
// table must not hide.
inline constexpr double kExactTolerance = 1e-5;

// Whether an exact algorithm's row (its error checked) shows a wrong result; says so on stderr.
inline bool wrong_exact_result(const Row& r) {
  if (!(r.error_max > kExactTolerance)) return false;  // NaN: not checked
  std::fprintf(stderr, "%s at %llu bytes: wrong result (relative L2 error %.3g)\n", r.algo.c_str(),
               static_cast<unsigned long long>(r.bytes), r.error_max);
  return true;
}

inline Row summarize(const std::string& env, const std::string& algo, int ranks, uint64_t bytes,
                     const std::vector<Iteration>& it) {
  Row r;
  r.env = env;
  r.algo = algo;
  r.ranks = ranks;
  r.bytes = bytes;
  r.iters = int(it.size());
  std::vector<double> ms;
  double sum = 0, lost = 0, expected = 0, deadline = 0, exact = 0, err = 0, err_max = 0;
  int err_n = 0;
  for (const Iteration& x : it) {
    ms.push_back(x.seconds * 1e3);
    sum += x.seconds * 1e3;
    lost += x.lost;
    expected += x.expected;
    deadline += x.deadline;
    exact += x.exact;
    if (!std::isnan(x.error)) {
      err += x.error;
      err_max = std::max(err_max, x.error);
      ++err_n;
    }
  }
  if (it.empty()) return r;
  std::sort(ms.begin(), ms.end());
  r.p50_ms = percentile_sorted(ms, 0.50);
  r.p99_ms = percentile_sorted(ms, 0.99);
  r.p999_ms = percentile_sorted(ms, 0.999);
  r.mean_ms = sum / double(it.size());
  r.max_ms = ms.back();
  r.tail_ratio = r.p50_ms > 0 ? r.p99_ms / r.p50_ms : 0;
  r.algbw = r.p50_ms > 0 ? double(bytes) / (r.p50_ms * 1e-3) / 1e9 : 0;
  r.busbw = ranks > 0 ? r.algbw * 2.0 * double(ranks - 1) / double(ranks) : 0;
  r.delivered = expected > 0 ? 1.0 - lost / expected : 1.0;
  r.error = err_n ? err / err_n : NAN;
  r.error_max = err_n ? err_max : NAN;
  r.deadline_frac = deadline / double(it.size());
  r.exact_frac = exact / double(it.size());
  return r;
}

inline const char* csv_header() {
  return "env,algo,ranks,bytes,iters,p50_ms,p99_ms,p999_ms,mean_ms,max_ms,p99_p50,algbw_gbs,"
         "busbw_gbs,delivered,rel_l2_err,rel_l2_err_max,deadline_frac,exact_frac,tb_ms,"
         "cpu_ms,csw";
}

inline std::string csv_line(const Row& r) {
  char buf[512];
  std::snprintf(
      buf, sizeof(buf),
      "%s,%s,%d,%llu,%d,%.4f,%.4f,%.4f,%.4f,%.4f,%.3f,%.4f,%.4f,%.6f,%.3e,%.3e,%.4f,%.4f,%.3f,%.3f,"
      "%.1f",
      r.env.c_str(), r.algo.c_str(), r.ranks, (unsigned long long)r.bytes, r.iters, r.p50_ms,
      r.p99_ms, r.p999_ms, r.mean_ms, r.max_ms, r.tail_ratio, r.algbw, r.busbw, r.delivered,
      r.error, r.error_max, r.deadline_frac, r.exact_frac, r.tb_ms, r.cpu_ms, r.csw);
  return buf;
}

// Appends a row to `path` (header first when the file is new or empty); "-" or "" prints only.
inline void append_csv(const std::string& path, const Row& r) {
  std::printf(
      "%-10s %-15s %9llu B  p50 %9.3f  p99 %9.3f  p99.9 %9.3f  mean %9.3f ms  p99/p50 "
      "%6.2f  busbw %6.3f GB/s  delivered %.5f  err %.2e  deadline %.3f  cpu %.2f ms  csw %.0f\n",
      r.env.c_str(), r.algo.c_str(), (unsigned long long)r.bytes, r.p50_ms, r.p99_ms, r.p999_ms,
      r.mean_ms, r.tail_ratio, r.busbw, r.delivered, r.error, r.deadline_frac, r.cpu_ms, r.csw);
  std::fflush(stdout);
  if (path.empty() || path == "-") return;
  FILE* f = std::fopen(path.c_str(), "a+");
  if (f == nullptr) {
    std::perror(path.c_str());
    return;
  }
  std::fseek(f, 0, SEEK_END);
  if (std::ftell(f) == 0) std::fprintf(f, "%s\n", csv_header());
  std::fprintf(f, "%s\n", csv_line(r).c_str());
  std::fclose(f);
}

// Per-iteration samples for the CDF plots: env,algo,bytes,iter,ms,straggle.
inline void append_samples(const std::string& path, const Row& r,
                           const std::vector<Iteration>& it) {
  if (path.empty() || path == "-") return;
  FILE* f = std::fopen(path.c_str(), "a+");
  if (f == nullptr) return;
  std::fseek(f, 0, SEEK_END);
  if (std::ftell(f) == 0) std::fprintf(f, "env,algo,bytes,iter,ms,straggle\n");
  for (size_t i = 0; i < it.size(); ++i)
    std::fprintf(f, "%s,%s,%llu,%zu,%.4f,%d\n", r.env.c_str(), r.algo.c_str(),
                 (unsigned long long)r.bytes, i, it[i].seconds * 1e3, it[i].straggle ? 1 : 0);
  std::fclose(f);
}

// The command line both benchmarks accept (nccl-tests letters where they exist).
struct Options {
  uint64_t min_bytes = uint64_t(1) << 20;  // -b
  uint64_t max_bytes = uint64_t(1) << 20;  // -e
  uint64_t factor = 2;                     // -f
  int iters = 100;                         // -n
  int warmup = 5;                          // -w
  int check = 1;                           // -c: compute the relative L2 error
  std::string algos;                       // -g / --algo
  int rank = -1, world = -1;               // --rank/--world, else RANK/WORLD_SIZE
  std::string store;                       // --store DIR: rendezvous folder
  std::string iface;                       // --iface: Gloo's device interface
  std::string env = "none";                // --env: label for the CSV
  std::string csv, samples;                // --csv, --samples
  uint64_t seed = 1;                       // --seed: inputs and straggler schedule
  int straggler_rank = -1;                 // --straggler-rank
  double straggler_ms = 0;                 // --straggler-ms
  double straggler_prob = 0;               // --straggler-prob
  int timeout_ms = 30000;                  // --timeout-ms: Gloo's per-operation timeout
  double background_s = 0;                 // --background SECONDS: load generator mode
  double duty = 1.0;                       // --duty: background busy fraction
  // --interleave: the algorithms take turns in every iteration instead of running one after
  // another, so that each meets the same background (a paired comparison of their tails).
  bool interleave = false;
  bool help = false;  // -h / --help: print options_usage() and run nothing
};

// The options both benchmarks take, for -h / --help and after a bad one.
inline const char* options_usage() {
  return "options (nccl-tests' letters where they exist; SIZE: 65536, 64K, 1.5M, 2G):\n"
         "  -b, --minbytes SIZE       smallest size (1M)\n"
         "  -e, --maxbytes SIZE       largest size (-b)\n"
         "  -f, --stepfactor N        size factor from -b to -e (2)\n"
         "  -n, --iters N             timed calls per size and algorithm (100)\n"
         "  -w, --warmup_iters N      untimed calls first (5; bounded TAR at least its "
         "calibration)\n"
         "  -c, --check 0|1           check each result against the sum in double (1)\n"
         "  -g, --algo A,B,..         algorithms to time (optireduce-bench: tar-bounded-ht,\n"
         "                            tar-bounded, tar-exact, gloo-ring, gloo-bcube, all by\n"
         "                            default; the MPI bench: mpi)\n"
         "  --rank R --world N        this rank and the rank count (else RANK, WORLD_SIZE)\n"
         "  --store DIR               rendezvous folder every rank reaches\n"
         "  --iface ADDR              Gloo's interface address\n"
         "  --env NAME                label of the CSV rows (none)\n"
         "  --csv FILE --samples FILE one row per size and algorithm; every iteration\n"
         "  --seed S                  inputs and straggler schedule (1)\n"
         "  --straggler-rank R --straggler-ms MS --straggler-prob P\n"
         "                            rank R sleeps MS before a call, with probability P\n"
         "  --timeout-ms MS           Gloo's per-operation timeout (30000)\n"
         "  --interleave              algorithms take turns in every iteration\n"
         "  --background SECONDS      be a load generator for that long instead\n"
         "  --duty D                  the load generator's busy fraction (1)\n";
}

// Parses argv into *o; returns "" or an error message. Unknown flags are errors. Values are
// read by bench/flags.h's setters: a whole-number option refuses "1.5" and anything past its
// type's range, a real one refuses "nan" and "inf", so that no typo runs with a value nobody
// asked for.
inline std::string parse_options(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    // The value after `a`, set through `f`, then held to `ok` (a bound beyond the type's).
    const auto take = [&](const bench::Flag& f,
                          const std::function<bool()>& ok = nullptr) -> std::string {
      if (i + 1 >= argc) return a + " needs a value";
      const char* v = argv[++i];
      if (!f.set(v) || (ok && !ok())) return "invalid value for " + a + ": " + v;
      return "";
    };
    std::string err;
    if (a == "-b" || a == "--minbytes") {
      err = take(bench::size_flag("", &o->min_bytes), [&] { return o->min_bytes > 0; });
    } else if (a == "-e" || a == "--maxbytes") {
      err = take(bench::size_flag("", &o->max_bytes), [&] { return o->max_bytes > 0; });
    } else if (a == "-f" || a == "--stepfactor") {
      err = take(bench::number_flag("", &o->factor), [&] { return o->factor >= 1; });
    } else if (a == "-n" || a == "--iters") {
      err = take(bench::number_flag("", &o->iters), [&] { return o->iters >= 1; });
    } else if (a == "-w" || a == "--warmup_iters") {
      err = take(bench::number_flag("", &o->warmup), [&] { return o->warmup >= 0; });
    } else if (a == "-c" || a == "--check") {
      err = take(bench::number_flag("", &o->check), [&] { return o->check == 0 || o->check == 1; });
    } else if (a == "-g" || a == "--algo") {
      err = take(bench::text_flag("", &o->algos));
    } else if (a == "--rank") {
      err = take(bench::number_flag("", &o->rank));
    } else if (a == "--world") {
      err = take(bench::number_flag("", &o->world));
    } else if (a == "--store") {
      err = take(bench::text_flag("", &o->store));
    } else if (a == "--iface") {
      err = take(bench::text_flag("", &o->iface));
    } else if (a == "--env") {
      err = take(bench::text_flag("", &o->env));
    } else if (a == "--csv") {
      err = take(bench::text_flag("", &o->csv));
    } else if (a == "--samples") {
      err = take(bench::text_flag("", &o->samples));
    } else if (a == "--seed") {
      err = take(bench::number_flag("", &o->seed));
    } else if (a == "--straggler-rank") {
      err = take(bench::number_flag("", &o->straggler_rank));
    } else if (a == "--straggler-ms") {
      err = take(bench::real_flag("", &o->straggler_ms), [&] { return o->straggler_ms >= 0; });
    } else if (a == "--straggler-prob") {
      err = take(bench::real_flag("", &o->straggler_prob),
                 [&] { return o->straggler_prob >= 0 && o->straggler_prob <= 1; });
    } else if (a == "--timeout-ms") {
      err = take(bench::number_flag("", &o->timeout_ms), [&] { return o->timeout_ms >= 1; });
    } else if (a == "--background") {
      err = take(bench::real_flag("", &o->background_s), [&] { return o->background_s > 0; });
    } else if (a == "--duty") {
      err = take(bench::real_flag("", &o->duty), [&] { return o->duty > 0 && o->duty <= 1; });
    } else if (a == "--interleave") {
      o->interleave = true;
    } else if (a == "-h" || a == "--help") {
      o->help = true;
      return "";
    } else {
      return "unknown option " + a;
    }
    if (!err.empty()) return err;
  }
  // RANK and WORLD_SIZE as a launcher sets them, read as strictly as the flags.
  const auto from_env = [](const char* name, int* out) -> std::string {
    const char* v = std::getenv(name);
    if (v == nullptr || *out >= 0) return "";
    if (!bench::number_flag("", out).set(v)) return std::string("invalid ") + name + ": " + v;
    return "";
  };
  if (std::string err = from_env("RANK", &o->rank); !err.empty()) return err;
  if (std::string err = from_env("WORLD_SIZE", &o->world); !err.empty()) return err;
  if (o->max_bytes < o->min_bytes) o->max_bytes = o->min_bytes;
  return "";
}

}  // namespace optireduce::lab

#endif  // OPTIREDUCE_BENCH_LAB_COMMON_H_
