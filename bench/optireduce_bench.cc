// optireduce-bench: one process per rank (launched by bench/lab/lab.sh, one per namespace) that
// times each selected allreduce -- optireduce TAR bounded with/without Hadamard, TAR exact, Gloo
// ring and BCube -- per size, and writes one CSV row each (the iteration figure: max over ranks).
//
//   optireduce-bench -b 1M -e 8M -f 2 -n 200 -w 5 -c 1 -g tar-bounded-ht,gloo-ring
//                    --store DIR [--rank R --world N] [--env NAME --csv F --samples F]
//                    [--straggler-rank R --straggler-ms MS --straggler-prob P --seed S]
//                    [--interleave]
//   optireduce-bench --background SECS -b SIZE --store DIR [--duty D]   (load generator)
// Gloo carries the bench's own control traffic (barrier, reduction of the samples), over TCP.
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench/calibration.h"
#include "bench/lab_common.h"
#include "bench/process_usage.h"
#include "collectives/optireduce.h"

namespace optireduce::lab {
namespace {

using Clock = std::chrono::steady_clock;
using ReduceFn = void (*)(void*, const void*, const void*, size_t);

const char* const kAllAlgos = "tar-bounded-ht,tar-bounded,tar-exact,gloo-ring,gloo-bcube";

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Gloo {
  std::shared_ptr<gloo::rendezvous::Context> ctx;
  uint32_t tag = 1;

  void barrier() {
    gloo::BarrierOptions b(ctx);
    b.setTag(tag++);
    gloo::barrier(b);
  }
  // In-place elementwise reduction of `v` over ranks.
  void reduce(std::vector<double>* v, ReduceFn fn) {
    if (v->empty()) return;
    gloo::AllreduceOptions o(ctx);
    o.setOutput(v->data(), v->size());
    o.setReduceFunction(fn);
    o.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
    o.setTag(tag++);
    gloo::allreduce(o);
  }
};

// Gloo's TCP device binds --iface (a host name or address) if given, else the rank's address
// from lab.sh: LAB_IP for the traffic under test (Gloo ring, BCube, the background load),
// LAB_CTL_IP for the harness's own barrier and reductions (`control`), which the loss
// environment leaves alone (lab.sh). Without LAB_CTL_IP the control traffic uses LAB_IP too.
std::shared_ptr<gloo::rendezvous::Context> gloo_connect(const Options& o, const std::string& dir,
                                                        const std::string& prefix,
                                                        bool control = false) {
  gloo::transport::tcp::attr attr;
  const char* ctl = std::getenv("LAB_CTL_IP");
  const char* ip = control && ctl != nullptr && *ctl != '\0' ? ctl : std::getenv("LAB_IP");
  if (!o.iface.empty()) {
    attr.hostname = o.iface;
  } else if (ip != nullptr && *ip != '\0') {
    attr.hostname = ip;
  } else {
    attr.hostname = "127.0.0.1";
  }
  auto dev = gloo::transport::tcp::CreateDevice(attr);
  gloo::rendezvous::FileStore fs(dir);
  gloo::rendezvous::PrefixStore ps(prefix, fs);
  auto ctx = std::make_shared<gloo::rendezvous::Context>(o.rank, o.world);
  ctx->setTimeout(std::chrono::milliseconds(o.timeout_ms));
  ctx->connectFullMesh(ps, dev);
  return ctx;
}

// One algorithm under test: init once per size, then `run` once per iteration.
class Algo {
 public:
  virtual ~Algo() = default;
  virtual void run(const float* in, float* out, size_t count) = 0;
  // Per-call delivery figures of the last run on this rank.
  virtual void last(double* lost, double* expected, double* deadline, double* exact) {
    *lost = *expected = *deadline = *exact = 0;
  }
  virtual int min_warmup() const { return 0; }
  virtual double tb_ms() { return 0; }
};

class GlooAlgo : public Algo {
 public:
  GlooAlgo(std::shared_ptr<Gloo> g, gloo::AllreduceOptions::Algorithm a)
      : g_(std::move(g)), a_(a) {}
  void run(const float* in, float* out, size_t count) override {
    gloo::AllreduceOptions o(g_->ctx);
    o.setInput(const_cast<float*>(in), count);
    o.setOutput(out, count);
    o.setAlgorithm(a_);
    o.setReduceFunction(ReduceFn(&gloo::sum<float>));
    o.setTag(g_->tag++);
    gloo::allreduce(o);
  }

 private:
  std::shared_ptr<Gloo> g_;
  gloo::AllreduceOptions::Algorithm a_;
};

class TarAlgo : public Algo {
 public:
  TarAlgo(const Options& o, const std::string& dir, optiMode_t mode, int hadamard) {
    optiOptions_t opts;
    check(optiOptionsDefault(&opts), "optiOptionsDefault");
    opts.mode = mode;
    opts.hadamard = hadamard;
    ::mkdir(dir.c_str(), 0700);
    check(optiHostCommInitFile(&comm_, dir.c_str(), o.rank, o.world, &opts),
          "optiHostCommInitFile");
    // Bounded communicators run their first calls exact to calibrate tB: keep those out of the
    // measured window, plus margin.
    warmup_ = mode == optiBounded ? optireduce::bench::calibration_calls(2 * (o.world - 1)) + 5 : 0;
  }
  ~TarAlgo() override {
    if (comm_ != nullptr) optiCommDestroy(comm_);
  }
  void run(const float* in, float* out, size_t count) override {
    check(optiAllReduce(in, out, count, optiFloat32, optiSum, comm_, nullptr), "optiAllReduce");
  }
  void last(double* lost, double* expected, double* deadline, double* exact) override {
    optiStats_t s;
    check(optiGetStats(comm_, &s, nullptr), "optiGetStats");
    *lost = double(s.elementsLost[0] + s.elementsLost[1]);
    *expected = double(s.elementsExpected[0] + s.elementsExpected[1]);
    *deadline = s.deadlineHits > 0 ? 1 : 0;
    *exact = double(s.exactCalls);
  }
  int min_warmup() const override { return warmup_; }
  double tb_ms() override {
    optiStats_t s;
    check(optiGetStats(comm_, &s, nullptr), "optiGetStats");
    return s.tbUs / 1e3;
  }

 private:
  static void check(optiResult_t r, const char* what) {
    if (r != optiSuccess)
      throw std::runtime_error(std::string(what) + ": " + optiGetErrorString(r) + ": " +
                               optiGetLastError());
  }
  optiComm_t comm_ = nullptr;
  int warmup_ = 0;
};

// A Gloo context on the network under test, for an algorithm that Gloo runs; the same as the
// control context where there is no separate control address.
std::shared_ptr<Gloo> data_context(const Options& o, Gloo* control, const std::string& dir) {
  const char* ctl = std::getenv("LAB_CTL_IP");
  if (!o.iface.empty() || ctl == nullptr || *ctl == '\0')
    return std::shared_ptr<Gloo>(control, [](Gloo*) {});  // not owned: the control itself
  auto g = std::make_shared<Gloo>();
  ::mkdir(dir.c_str(), 0700);
  g->ctx = gloo_connect(o, dir, "data");
  return g;
}

std::unique_ptr<Algo> make_algo(const std::string& name, const Options& o, Gloo* g,
                                const std::string& dir) {
  using A = gloo::AllreduceOptions::Algorithm;
  if (name == "gloo-ring") return std::make_unique<GlooAlgo>(data_context(o, g, dir), A::RING);
  if (name == "gloo-bcube") return std::make_unique<GlooAlgo>(data_context(o, g, dir), A::BCUBE);
  if (name == "tar-bounded-ht") return std::make_unique<TarAlgo>(o, dir, optiBounded, 1);
  if (name == "tar-bounded") return std::make_unique<TarAlgo>(o, dir, optiBounded, 0);
  if (name == "tar-exact") return std::make_unique<TarAlgo>(o, dir, optiExact, 0);
  throw std::runtime_error("unknown algorithm " + name + " (known: " + kAllAlgos + ")");
}

void sleep_ms(double ms) {
  std::this_thread::sleep_for(std::chrono::microseconds(int64_t(ms * 1e3)));
}

// One algorithm's timing at one size: its buffers, the per-iteration figures of this rank, and
// the reduction over ranks at the end. Iterations may be run one algorithm after another or
// interleaved with other algorithms' (--interleave).
class Measurement {
 public:
  Measurement(const Options& o, Algo* algo, uint64_t bytes)
      : o_(o),
        algo_(algo),
        count_(size_t(bytes / 4)),
        in_(count_),
        out_(count_),
        sleeps_(straggler_schedule(o.seed, o.iters, o.straggler_prob)),
        warmup_(std::max(o.warmup, algo->min_warmup())),
        t_(size_t(o.iters)),
        lost_(size_t(o.iters)),
        expected_(size_t(o.iters)),
        deadline_(size_t(o.iters)),
        exact_calls_(size_t(o.iters)),
        err_(size_t(o.iters), 0.0) {
    fill_input(o.seed, o.rank, in_.data(), count_);
    if (o.check) exact_ = exact_sum(o.seed, o.world, count_);
  }

  int warmup() const { return warmup_; }

  // Iteration i (negative: warm-up, untimed in the figures), entered with the ranks in step.
  void step(Gloo* g, int i) {
    g->barrier();
    check_pending(g);
    // The straggler's sleep stands for slow compute: outside its own timed region, so the
    // figures show what it costs the others.
    if (i >= 0 && o_.rank == o_.straggler_rank && sleeps_[size_t(i)]) sleep_ms(o_.straggler_ms);
    const bench::ProcessUsage u0 = bench::process_usage();
    const auto t0 = Clock::now();
    algo_->run(in_.data(), out_.data(), count_);
    const double dt = seconds_since(t0);
    if (i < 0) return;
    const bench::ProcessUsage u1 = bench::process_usage();
    cpu_ += u1.cpu_s - u0.cpu_s;
    csw_ += u1.csw - u0.csw;
    const size_t k = size_t(i);
    t_[k] = dt;
    algo_->last(&lost_[k], &expected_[k], &deadline_[k], &exact_calls_[k]);
    pending_ = i;
  }

  // The per-iteration figures reduced over ranks; *cpu_ms and *csw: CPU time and context
  // switches of all ranks inside the timed calls, per iteration. Every rank calls it, in the
  // same order.
  std::vector<Iteration> finish(Gloo* g, double* tb_ms, double* cpu_ms, double* csw) {
    g->barrier();
    check_pending(g);
    g->reduce(&t_, ReduceFn(&gloo::max<double>));
    g->reduce(&lost_, ReduceFn(&gloo::sum<double>));
    g->reduce(&expected_, ReduceFn(&gloo::sum<double>));
    g->reduce(&deadline_, ReduceFn(&gloo::max<double>));
    g->reduce(&exact_calls_, ReduceFn(&gloo::max<double>));
    if (o_.check) g->reduce(&err_, ReduceFn(&gloo::max<double>));
    std::vector<double> tb{algo_->tb_ms()};
    g->reduce(&tb, ReduceFn(&gloo::max<double>));
    *tb_ms = tb[0];
    std::vector<double> c{cpu_, csw_};
    g->reduce(&c, ReduceFn(&gloo::sum<double>));
    const size_t n = t_.size();
    *cpu_ms = n ? c[0] * 1e3 / double(n) : NAN;
    *csw = n ? c[1] / double(n) : NAN;
    std::vector<Iteration> it(n);
    for (size_t k = 0; k < n; ++k) {
      it[k].seconds = t_[k];
      it[k].lost = lost_[k];
      it[k].expected = expected_[k];
      it[k].deadline = deadline_[k];
      it[k].exact = exact_calls_[k];
      it[k].error = o_.check ? err_[k] : NAN;
      it[k].straggle = o_.straggler_rank >= 0 && sleeps_[k];
    }
    return it;
  }

 private:
  const Options& o_;
  Algo* algo_;
  const size_t count_;
  std::vector<float> in_, out_;
  std::vector<double> exact_;
  const std::vector<bool> sleeps_;
  const int warmup_;
  std::vector<double> t_, lost_, expected_, deadline_, exact_calls_, err_;
  double cpu_ = 0;
  double csw_ = 0;
  int pending_ = -1;  // the iteration whose result is still to be checked

  // The last iteration's error, once every rank is past its call (the caller's barrier): a
  // rank that finished first would otherwise check its result (1M elements read twice at
  // 4 MiB) beside peers still inside theirs, and on a host whose cores the ranks share, the
  // check's CPU would slow the call it measures. The barrier after it starts the next call
  // with the ranks in step again.
  void check_pending(Gloo* g) {
    if (pending_ < 0) return;
    if (o_.check) err_[size_t(pending_)] = rel_l2_error(out_.data(), exact_);
    pending_ = -1;
    g->barrier();
  }
};

// Load generator: a Gloo ring allreduce of -b bytes in a loop (busy for a `duty` fraction of the
// time), the paper's way of making tails, until `background_s` has passed.
int background(const Options& o, Gloo* g) {
  const size_t count = size_t(o.min_bytes / 4);
  std::vector<float> in(count, 1.0f), out(count);
  GlooAlgo ring(std::shared_ptr<Gloo>(g, [](Gloo*) {}), gloo::AllreduceOptions::Algorithm::RING);
  const auto t0 = Clock::now();
  while (seconds_since(t0) < o.background_s) {
    const auto t1 = Clock::now();
    ring.run(in.data(), out.data(), count);
    if (o.duty < 1) sleep_ms(seconds_since(t1) * 1e3 * (1 - o.duty) / o.duty);
  }
  return 0;
}

int bench_main(int argc, char** argv) {
  Options o;
  if (std::string err = parse_options(argc, argv, &o); !err.empty()) {
    std::fprintf(stderr, "optireduce-bench: %s\n%s", err.c_str(), options_usage());
    return 2;
  }
  if (o.help) {
    std::printf("usage: optireduce-bench [options]\n%s", options_usage());
    return 0;
  }
  if (o.rank < 0 || o.world < 1 || o.rank >= o.world || o.store.empty()) {
    std::fprintf(stderr,
                 "optireduce-bench: needs --store DIR and --rank/--world (or RANK and "
                 "WORLD_SIZE)\n");
    return 2;
  }
  ::mkdir(o.store.c_str(), 0700);
  Gloo g;
  // The load generator's traffic is load on the network under test, not control.
  g.ctx = gloo_connect(o, o.store, "ctl", o.background_s <= 0);
  if (o.background_s > 0) return background(o, &g);
  const auto algos = split_list(o.algos.empty() ? kAllAlgos : o.algos);
  const auto sizes = size_list(o.min_bytes, o.max_bytes, o.factor);
  int failures = 0;
  auto make = [&](const std::string& name, uint64_t bytes) -> std::unique_ptr<Algo> {
    try {
      return make_algo(name, o, &g, o.store + "/" + name + "-" + std::to_string(bytes));
    } catch (const std::exception& e) {
      // Every rank fails the same way (same build, same options): skip together.
      std::fprintf(stderr, "rank %d: %s: skipped: %s\n", o.rank, name.c_str(), e.what());
      ++failures;
      g.barrier();
      return nullptr;
    }
  };
  auto report = [&](const std::string& name, uint64_t bytes, Measurement& m) {
    double tb_ms = 0, cpu_ms = NAN, csw = NAN;
    const auto it = m.finish(&g, &tb_ms, &cpu_ms, &csw);
    if (o.rank != 0) return;
    Row r = summarize(o.env, name, o.world, bytes, it);
    if (!name.starts_with("tar-bounded") && wrong_exact_result(r)) ++failures;
    r.tb_ms = tb_ms;
    r.cpu_ms = cpu_ms;
    r.csw = csw;
    append_csv(o.csv, r);
    append_samples(o.samples, r, it);
  };
  if (!o.interleave) {
    for (const std::string& name : algos) {
      for (uint64_t bytes : sizes) {
        std::unique_ptr<Algo> algo = make(name, bytes);
        if (!algo) continue;
        Measurement m(o, algo.get(), bytes);
        for (int i = -m.warmup(); i < o.iters; ++i) m.step(&g, i);
        report(name, bytes, m);
      }
    }
  } else {
    // Per size, every algorithm takes its turn in each iteration (the first one rotating), so
    // that all of them meet the same background bursts and their tails compare within one run.
    struct Turn {
      std::string name;
      std::unique_ptr<Algo> algo;
      Measurement m;
    };
    for (uint64_t bytes : sizes) {
      std::vector<Turn> turns;
      turns.reserve(algos.size());
      int warmup = 0;
      for (const std::string& name : algos) {
        std::unique_ptr<Algo> algo = make(name, bytes);
        if (!algo) continue;
        Algo* a = algo.get();
        turns.push_back(Turn{name, std::move(algo), Measurement(o, a, bytes)});
        warmup = std::max(warmup, turns.back().m.warmup());
      }
      for (int i = -warmup; i < o.iters; ++i) {
        for (size_t k = 0; k < turns.size(); ++k) {
          Measurement& m = turns[(size_t(i + warmup) + k) % turns.size()].m;
          if (i >= -m.warmup()) m.step(&g, i);
        }
      }
      for (Turn& t : turns) report(t.name, bytes, t.m);
    }
  }
  g.barrier();
  return failures ? 1 : 0;
}

}  // namespace
}  // namespace optireduce::lab

int main(int argc, char** argv) {
  try {
    return optireduce::lab::bench_main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "optireduce-bench: %s\n", e.what());
    return 1;
  }
}
