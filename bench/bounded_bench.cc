// Per-step tail latency of bounded vs exact delivery through the plugin's NCCL ABI: N processes
// on loopback exchange one message all-to-all per step under injected heavy-tailed delay and
// loss; prints P50/P99/P99.9 of each mode, their ratio, and what bounded mode gave up for it.
//
// Both modes run in the same processes at once: one exact and one bounded communicator (the
// v11 traffic class), their steps interleaved, so that both see the same machine and the same
// fault injector. A step is timed on every rank from its first post to its last completion,
// after a barrier; the step's figure is the maximum over ranks (the slowest rank gates a
// collective). The first --warmup steps (bounded calibration among them) are not counted.
//
//   bounded_bench [--ranks 2..4] [--size BYTES] [--steps N] [--warmup N] [--drop P]
//                 [--delay-prob P] [--delay-us US] [--delay-alpha A] [--timeout-ms MS]
//                 [--max-datagram BYTES] [--seed N] [--plugin PATH]
// OPTIREDUCE_* variables set by hand apply as usual, except those the flags set.
#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "bench/calibration.h"
#include "bench/flags.h"
#include "tests/plugin/procs.h"

namespace optireduce::testing {
namespace {

constexpr int kBoundedClass = 0x4F52;  // OPTIREDUCE_BOUNDED_TRAFFIC_CLASS's default

struct Options {
  std::string plugin = PLUGIN_PATH;
  int ranks = 4;
  size_t size = size_t{256} << 10;
  int steps = 1000;
  int warmup = -1;  // -1: the calibration's steps (OPTIREDUCE_CALIBRATION_STEPS) + 10, >= 50
  double drop = 0.01;
  // A datagram in a hundred waits at least 0.5 ms, and the Pareto tail (alpha 1.2, infinite
  // variance) makes one in a few hundred of those wait tens of ms: a straggler in most steps.
  double delay_prob = 0.01;
  double delay_us = 500;
  double delay_alpha = 1.2;
  double timeout_ms = 0;  // 0: calibrate tB (the default behaviour)
  int max_datagram = 0;   // 0: the interface's MTU
  uint64_t seed = 42;
};

// Exits with 2 and the reason on an unknown flag, a bad value or a bad combination.
Options parse(int argc, char** argv) {
  Options o;
  const int rc = bench::parse_flags(
      argc, argv,
      {bench::number_flag("--ranks", &o.ranks), bench::size_flag("--size", &o.size),
       bench::number_flag("--steps", &o.steps), bench::number_flag("--warmup", &o.warmup),
       bench::real_flag("--drop", &o.drop), bench::real_flag("--delay-prob", &o.delay_prob),
       bench::real_flag("--delay-us", &o.delay_us),
       bench::real_flag("--delay-alpha", &o.delay_alpha),
       bench::real_flag("--timeout-ms", &o.timeout_ms),
       bench::number_flag("--max-datagram", &o.max_datagram), bench::number_flag("--seed", &o.seed),
       bench::text_flag("--plugin", &o.plugin, "PATH")},
      [&o]() -> const char* {
        if (o.ranks < 2 || o.ranks > 4) return "--ranks: 2 to 4";
        if (o.size == 0 || o.size > (size_t{1} << 30)) return "--size: 1 byte to 1 GiB";
        if (o.steps < 1) return "--steps: at least 1";
        if (o.warmup < -1) return "--warmup: at least 0 (-1: by the calibration)";
        if (o.drop < 0 || o.drop > 1 || o.delay_prob < 0 || o.delay_prob > 1)
          return "--drop, --delay-prob: probabilities, 0 to 1";
        if (o.delay_us < 0 || o.delay_alpha <= 0 || o.timeout_ms < 0)
          return "--delay-us, --timeout-ms: at least 0; --delay-alpha: above 0";
        if (o.max_datagram < 0) return "--max-datagram: at least 0";
        return nullptr;
      });
  if (rc != 0) std::exit(rc);
  // A step is one receive from each of the N-1 peers.
  if (o.warmup < 0) o.warmup = std::max(50, bench::calibration_calls(o.ranks - 1) + 10);
  return o;
}

// Nearest-rank percentile.
double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto idx = static_cast<size_t>(std::ceil(p * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, idx == 0 ? 0 : idx - 1)];
}

// What each rank sends rank 0 about its bounded communicator, measured steps only.
struct Counts {
  uint64_t receives = 0;
  uint64_t expected = 0;
  uint64_t lost = 0;
  uint64_t deadline = 0;
  uint64_t early = 0;
  uint64_t expired_sends = 0;
  uint64_t late = 0;
  uint64_t tb_us = 0;
  uint64_t tc_us = 0;
  uint64_t exact_retx = 0;
};

Counts diff(const optireduceNetStats& b1, const optireduceNetStats& b0,
            const optireduceNetStats& e1, const optireduceNetStats& e0) {
  Counts c;
  c.receives = b1.recv.msgs - b0.recv.msgs;
  c.expected = b1.recv.bytesExpected - b0.recv.bytesExpected;
  c.lost = b1.recv.bytesLost - b0.recv.bytesLost;
  c.deadline = b1.recv.deadlineHits - b0.recv.deadlineHits;
  c.early = b1.recv.earlyTimeouts - b0.recv.earlyTimeouts;
  c.expired_sends = b1.send.expiredSends - b0.send.expiredSends;
  c.late = b1.recv.latePkts - b0.recv.latePkts;
  c.tb_us = b1.recv.tbUs;
  c.tc_us = b1.recv.tcUs;
  c.exact_retx = e1.send.retxPkts - e0.send.retxPkts;
  return c;
}

void rank_main(const Options& o, Mesh& m) {
  std::vector<int> peers, everyone(m.n);
  std::iota(everyone.begin(), everyone.end(), 0);
  for (int j = 0; j < m.n; ++j) {
    if (j != m.rank) peers.push_back(j);
  }
  Node exact = open_node(m, o.plugin, 11, 0xE8AC7, -1);
  Node bounded = open_node(m, o.plugin, 11, 0xB0DED, kBoundedClass);
  HCHECK(exact.stats().bounded == 0 && bounded.stats().bounded == 1,
         "communicator modes not as asked (is OPTIREDUCE_MODE set?)");
  ExchangeOptions xo;
  xo.size = o.size;
  xo.verify = false;  // timing only; tests/plugin/bounded_procs_test.cc checks the bytes
  xo.hang_s = 60;
  Exchange ex_exact(exact, m.rank, peers, xo);
  Exchange ex_bounded(bounded, m.rank, peers, xo);

  std::vector<double> t_exact, t_bounded;
  optireduceNetStats b0{}, e0{};
  const int total = o.warmup + o.steps;
  for (int k = 0; k < total; ++k) {
    if (k == o.warmup) {
      b0 = bounded.stats();
      e0 = exact.stats();
    }
    // Alternate which mode goes first, so that neither always follows the other's stragglers.
    for (int pass = 0; pass < 2; ++pass) {
      const bool do_bounded = (pass == 0) == (k % 2 == 0);
      m.barrier(everyone);
      const StepRecord r = (do_bounded ? ex_bounded : ex_exact).step(k);
      if (k >= o.warmup) (do_bounded ? t_bounded : t_exact).push_back(r.step_ms);
    }
  }
  m.barrier(everyone);
  const Counts mine = diff(bounded.stats(), b0, exact.stats(), e0);

  if (m.rank != 0) {
    m.channel[0]->send_bytes(t_exact.data(), t_exact.size() * sizeof(double));
    m.channel[0]->send_bytes(t_bounded.data(), t_bounded.size() * sizeof(double));
    m.channel[0]->send(mine);
  } else {
    Counts all = mine;
    std::vector<double> other(t_exact.size());
    for (int j : peers) {
      // The step's figure is the slowest rank's.
      m.channel[j]->recv_bytes(other.data(), other.size() * sizeof(double));
      for (size_t i = 0; i < other.size(); ++i) t_exact[i] = std::max(t_exact[i], other[i]);
      m.channel[j]->recv_bytes(other.data(), other.size() * sizeof(double));
      for (size_t i = 0; i < other.size(); ++i) t_bounded[i] = std::max(t_bounded[i], other[i]);
      const Counts c = m.channel[j]->recv<Counts>();
      all.receives += c.receives;
      all.expected += c.expected;
      all.lost += c.lost;
      all.deadline += c.deadline;
      all.early += c.early;
      all.expired_sends += c.expired_sends;
      all.late += c.late;
      all.tb_us = std::max(all.tb_us, c.tb_us);
      all.tc_us = std::max(all.tc_us, c.tc_us);
      all.exact_retx += c.exact_retx;
    }
    const double ps[3] = {0.50, 0.99, 0.999};
    double ex[3], bo[3];
    for (int i = 0; i < 3; ++i) {
      ex[i] = percentile(t_exact, ps[i]);
      bo[i] = percentile(t_bounded, ps[i]);
    }
    const double mean_e = std::accumulate(t_exact.begin(), t_exact.end(), 0.0) / t_exact.size();
    const double mean_b =
        std::accumulate(t_bounded.begin(), t_bounded.end(), 0.0) / t_bounded.size();
    std::printf(
        "bounded_bench: %d ranks all-to-all, %zu B per message, %d steps per mode (+%d "
        "warm-up)\n  faults: drop %.3g, delay p=%.3g Pareto(%.0f us, alpha %.2f), seed %" PRIu64
        "; tB %s\n\n",
        o.ranks, o.size, o.steps, o.warmup, o.drop, o.delay_prob, o.delay_us, o.delay_alpha, o.seed,
        o.timeout_ms > 0 ? "fixed by --timeout-ms" : "calibrated");
    std::printf("%-14s %10s %10s %10s %10s   (per-step ms, max over ranks)\n", "", "P50", "P99",
                "P99.9", "mean");
    std::printf("%-14s %10.3f %10.3f %10.3f %10.3f\n", "exact", ex[0], ex[1], ex[2], mean_e);
    std::printf("%-14s %10.3f %10.3f %10.3f %10.3f\n", "bounded", bo[0], bo[1], bo[2], mean_b);
    std::printf("%-14s %10.3f %10.3f %10.3f %10.3f\n\n", "bounded/exact", bo[0] / ex[0],
                bo[1] / ex[1], bo[2] / ex[2], mean_b / mean_e);
    const double rx = all.receives > 0 ? static_cast<double>(all.receives) : 1.0;
    std::printf("bounded: delivered %.4f of bytes (%" PRIu64 " of %" PRIu64
                " lost); receives ended by "
                "deadline %.4f, by early timeout %.4f; expired sends %" PRIu64
                ", late datagrams %" PRIu64 "; tB %.2f ms, tC %.2f ms\n",
                all.expected > 0
                    ? 1.0 - static_cast<double>(all.lost) / static_cast<double>(all.expected)
                    : 1.0,
                all.lost, all.expected, static_cast<double>(all.deadline) / rx,
                static_cast<double>(all.early) / rx, all.expired_sends, all.late,
                static_cast<double>(all.tb_us) / 1e3, static_cast<double>(all.tc_us) / 1e3);
    std::printf("exact: delivered 1.0000 of bytes, %" PRIu64 " datagrams retransmitted\n",
                all.exact_retx);
    std::fflush(stdout);
  }
  m.barrier(everyone);
  close_node(bounded);
  close_node(exact);
}

}  // namespace
}  // namespace optireduce::testing

int main(int argc, char** argv) {
  using namespace optireduce::testing;
  const Options o = parse(argc, argv);
  Env env = {{"OPTIREDUCE_FAULT_DROP", std::to_string(o.drop)},
             {"OPTIREDUCE_FAULT_DELAY_PROB", std::to_string(o.delay_prob)},
             {"OPTIREDUCE_FAULT_DELAY_US", std::to_string(o.delay_us)},
             {"OPTIREDUCE_FAULT_DELAY_ALPHA", std::to_string(o.delay_alpha)},
             {"OPTIREDUCE_FAULT_SEED", std::to_string(o.seed)}};
  if (o.timeout_ms > 0) env.push_back({"OPTIREDUCE_TIMEOUT_MS", std::to_string(o.timeout_ms)});
  if (o.max_datagram > 0)
    env.push_back({"OPTIREDUCE_MAX_DATAGRAM", std::to_string(o.max_datagram)});
  // Bounded is chosen per communicator by traffic class; a global mode would make both bounded.
  unsetenv("OPTIREDUCE_MODE");
  const unsigned limit_s = 1800;
  const std::string failure = run_ranks(
      o.ranks, [&o](Mesh& m) { rank_main(o, m); }, env, limit_s);
  if (!failure.empty()) {
    std::fprintf(stderr, "bounded_bench failed: %s\n", failure.c_str());
    return 1;
  }
  return 0;
}
