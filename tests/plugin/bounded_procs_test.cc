// Bounded delivery (issue 3) across 2 and 4 processes on loopback, through the built plugin's
// NCCL ABI: deadlines kept under injected loss, holes defined on the packet grid and counted,
// no late writes, a stalled peer and a killed peer cost at most a deadline, exact mode exact.
#include <gtest/gtest.h>

#include <algorithm>
#include <cinttypes>
#include <numeric>
#include <ostream>
#include <string>
#include <vector>

#include "tests/plugin/plugin_path.h"
#include "tests/plugin/procs.h"
#include "tests/sanitized.h"
#include "transport/loss_governor.h"

namespace optireduce::testing {
namespace {

constexpr int kBoundedClass = 0x4F52;  // OPTIREDUCE_BOUNDED_TRAFFIC_CLASS's default
constexpr size_t kMaxDatagram = 1472;
constexpr size_t kPkt = packet_payload(kMaxDatagram);
// 106 packets, the last one short and of odd length: holes of every shape the grid allows.
constexpr size_t kSize = 105 * kPkt + 483;
// Deadline budget fixed by OPTIREDUCE_TIMEOUT_MS where the test needs a known bound.
constexpr double kTimeoutMs = 40;
// Slack on top of a deadline before a late completion counts as a failure: the poll loop,
// 4 ranks on 2 shared cores and the scheduler all add to what the transport promises. A
// missed deadline by a hang or a stall (seconds) is an order of magnitude above it.
constexpr double kSlackMs = 100;
// ... plus the time the polling thread demonstrably waited for a CPU during the step (CI hosts
// run other jobs beside these 4 ranks; a waiting thread cannot see a completion), up to a cap
// that keeps a wait of several deadlines, let alone a 2 s stall, a failure on any host.
constexpr double kMaxCpuWaitExcuseMs = 300;
double slack(const StepRecord& r) {
  return kSlackMs + std::min(r.cpu_wait_ms, kMaxCpuWaitExcuseMs);
}

std::vector<int> others(const Mesh& m, int skip = -1) {
  std::vector<int> v;
  for (int j = 0; j < m.n; ++j) {
    if (j != m.rank && j != skip) v.push_back(j);
  }
  return v;
}

Env lossy_env(double drop, const char* fill) {
  return {{"OPTIREDUCE_FAULT_DROP", std::to_string(drop)},
          {"OPTIREDUCE_FAULT_DUP", "0.005"},
          {"OPTIREDUCE_FAULT_REORDER", "0.02"},
          // A few datagrams held for 15 ms or more (Pareto): longer than most steps, so some
          // arrive after their receive completed and must be dropped, not written.
          {"OPTIREDUCE_FAULT_DELAY_PROB", "0.003"},
          {"OPTIREDUCE_FAULT_DELAY_US", "15000"},
          {"OPTIREDUCE_FAULT_DELAY_ALPHA", "1.2"},
          {"OPTIREDUCE_FAULT_SEED", "777"},
          {"OPTIREDUCE_MAX_DATAGRAM", std::to_string(kMaxDatagram)},
          {"OPTIREDUCE_FILL", fill}};
}

// What every rank reports to rank 0 at the end, for assertions over the whole job.
struct Summary {
  uint64_t receives = 0;
  uint64_t holed = 0;  // receives with filled bytes, as the test saw them
  uint64_t missing = 0;
  uint64_t bytes_lost = 0;  // ... and as the counters say
  uint64_t deadline_hits = 0;
  uint64_t early_timeouts = 0;
  uint64_t expired_sends = 0;
  uint64_t late_pkts = 0;
  uint64_t repaired = 0;  // bounded packets sent again (send side)
};

Summary gather(Mesh& m, const std::vector<int>& who, const Summary& mine) {
  if (m.rank != who.front()) {
    m.channel[who.front()]->send(mine);
    return mine;
  }
  Summary t = mine;
  for (int j : who) {
    if (j == m.rank) continue;
    const Summary s = m.channel[j]->recv<Summary>();
    t.receives += s.receives;
    t.holed += s.holed;
    t.missing += s.missing;
    t.bytes_lost += s.bytes_lost;
    t.deadline_hits += s.deadline_hits;
    t.early_timeouts += s.early_timeouts;
    t.expired_sends += s.expired_sends;
    t.late_pkts += s.late_pkts;
    t.repaired += s.repaired;
  }
  return t;
}

// Late datagrams (delayed by the injector, or sent by a peer that fell behind) may still be on
// their way when the last step ends; give them time to land, then look at every buffer.
void settle_and_check(Exchange& ex) {
  usleep(300'000);
  ex.check_all_scribbles();
}

// ---- Loss: every receive within its deadline, real size, exact or filled packet by packet,
// counters equal to what the buffers show.

struct LossCase {
  const char* name;
  int ranks;
  double drop;
  HoleFill fill;           // what the holes must hold
  bool by_traffic_class;  // else OPTIREDUCE_MODE=bounded
  int version;
  int steps;
  // OPTIREDUCE_FILL; null: the one `fill` names. The traffic class (liboptireduce's) must get
  // the marker whatever it says (issue 12 defect 1).
  const char* env_fill = nullptr;
};

// gtest prints a failing parameter with this instead of its raw bytes.
void PrintTo(const LossCase& c, std::ostream* os) {
  *os << c.name;
}

class BoundedLoss : public ::testing::TestWithParam<LossCase> {};

TEST_P(BoundedLoss, DeadlinesKeptHolesDefinedCountersAgree) {
  const LossCase c = GetParam();
  Env env = lossy_env(c.drop, c.env_fill != nullptr          ? c.env_fill
                              : c.fill == HoleFill::kZero ? "zero"
                                                          : "marker");
  env.push_back({"OPTIREDUCE_TIMEOUT_MS", std::to_string(kTimeoutMs)});
  if (!c.by_traffic_class) env.push_back({"OPTIREDUCE_MODE", "bounded"});
  // NCCL before 2.26 (ABI v8/v9) cannot tell the plugin which transfers are Simple: a user who
  // wants them bounded pins NCCL on Simple (plugin/transfer_kind.h).
  if (c.version < 10) env.push_back({"NCCL_PROTO", "Simple"});
  auto rank = [c](Mesh& m) {
    const uint64_t comm = 0xB0B0;
    Node node =
        open_node(m, plugin_path(), c.version, comm, c.by_traffic_class ? kBoundedClass : -1);
    HCHECK(node.stats().bounded == 1, "rank %d: communicator not bounded", m.rank);
    ExchangeOptions o;
    o.size = kSize;
    o.pkt = kPkt;
    o.fill = c.fill;
    Exchange ex(node, m.rank, others(m), o);
    Summary me;
    uint64_t delivered = 0;
    double worst_recv = 0, worst_send = 0;
    for (int k = 0; k < c.steps; ++k) {
      const StepRecord r = ex.step(k);
      worst_recv = std::max(worst_recv, r.max_recv_ms);
      worst_send = std::max(worst_send, r.max_send_ms);
      HCHECK(r.max_recv_ms <= kTimeoutMs + slack(r),
             "rank %d step %d: a receive took %.1f ms; deadline %.0f ms (+%.0f slack, %.0f ms "
             "waiting for a CPU)",
             m.rank, k, r.max_recv_ms, kTimeoutMs, slack(r), r.cpu_wait_ms);
      HCHECK(r.max_send_ms <= kTimeoutMs + slack(r),
             "rank %d step %d: a send took %.1f ms; deadline %.0f ms (+%.0f slack, %.0f ms "
             "waiting for a CPU)",
             m.rank, k, r.max_send_ms, kTimeoutMs, slack(r), r.cpu_wait_ms);
      me.holed += r.holed;
      me.missing += r.missing;
      delivered += r.delivered;
    }
    m.barrier();
    settle_and_check(ex);
    const optireduceNetStats st = node.stats();
    const uint64_t receives = static_cast<uint64_t>(c.steps) * (m.n - 1);
    me.receives = receives;
    me.bytes_lost = st.recv.bytesLost;
    me.deadline_hits = st.recv.deadlineHits;
    me.early_timeouts = st.recv.earlyTimeouts;
    me.expired_sends = st.send.expiredSends;
    me.late_pkts = st.recv.latePkts;
    me.repaired = st.send.repairedPkts;
    std::fprintf(stderr,
                 "rank %d: worst receive %.1f ms, send %.1f ms; lost %" PRIu64 "/%" PRIu64
                 " B in %" PRIu64 " receives; deadline %" PRIu64 " early %" PRIu64
                 " expired sends %" PRIu64 " late %" PRIu64 "\n",
                 m.rank, worst_recv, worst_send, st.recv.bytesLost, st.recv.bytesExpected, me.holed,
                 me.deadline_hits, me.early_timeouts, me.expired_sends, me.late_pkts);
    HCHECK(st.recv.msgs == receives, "rank %d: %" PRIu64 " receives counted, %" PRIu64 " done",
           m.rank, st.recv.msgs, receives);
    HCHECK(st.recv.bytesExpected == receives * kSize, "rank %d: bytesExpected %" PRIu64, m.rank,
           st.recv.bytesExpected);
    HCHECK(st.recv.bytesLost == me.missing,
           "rank %d: counters say %" PRIu64 " bytes lost, the buffers held %" PRIu64 " filled",
           m.rank, st.recv.bytesLost, me.missing);
    HCHECK(st.recv.bytes == delivered,
           "rank %d: counters say %" PRIu64 " bytes delivered, the buffers held %" PRIu64, m.rank,
           st.recv.bytes, delivered);
    // A receive with holes ended by its deadline, its early timeout or its sender's expiry;
    // one without holes ended because everything arrived.
    HCHECK(me.holed >= me.deadline_hits + me.early_timeouts,
           "rank %d: %" PRIu64 " deadline + %" PRIu64 " early endings but %" PRIu64
           " receives with holes",
           m.rank, me.deadline_hits, me.early_timeouts, me.holed);
    std::vector<int> everyone(m.n);
    std::iota(everyone.begin(), everyone.end(), 0);
    const Summary all = gather(m, everyone, me);
    if (m.rank == 0) {
      HCHECK(all.holed <= all.deadline_hits + all.early_timeouts + all.expired_sends,
             "%" PRIu64 " receives with holes, only %" PRIu64 " deadline/early/expired endings",
             all.holed, all.deadline_hits + all.early_timeouts + all.expired_sends);
      const double lost =
          static_cast<double>(all.missing) / static_cast<double>(all.receives * kSize);
      std::fprintf(stderr, "job: %.2f%% of bytes filled at %.0f%% loss, %" PRIu64 " late pkts\n",
                   100 * lost, 100 * c.drop, all.late_pkts);
      // The injector's drops show up as holes, as repairs (bounded mode repairs while the
      // deadline leaves time), or both.
      HCHECK(all.bytes_lost > 0 || all.repaired > 0,
             "%.0f%% loss but no byte lost and no packet repaired: is the injector on?",
             100 * c.drop);
      // Bounded must not throw (nearly) all the data away, e.g. by deadlines far too short.
      // Only a loose ceiling: the early timeout (0.1 x tC, a fraction of a millisecond here)
      // also cuts off packets still queued on a busy 2-core host; 1% injected loss has filled
      // 2-11% of bytes here, 10% loss 15-26%, and up to 62% with the host's load average at 14.
      // bench/bounded_bench measures the delivered fraction.
      HCHECK(lost < 0.8, "%.1f%% of bytes filled at %.0f%% loss", 100 * lost, 100 * c.drop);
      if (c.drop >= 0.1) {
        // Bounded mode repairs losses while the deadline leaves time, so 10% loss may end no
        // receive by its deadline; it must then have been repaired.
        HCHECK(all.deadline_hits > 0 || all.repaired > 0,
               "10%% loss: no receive ended by its deadline and no packet repaired");
        HCHECK(all.late_pkts > 0, "delayed datagrams but none counted late");
      }
    }
    m.barrier();
    close_node(node);
  };
  EXPECT_EQ(run_ranks(c.ranks, rank, env, 50), "");
}

INSTANTIATE_TEST_SUITE_P(
    Loss, BoundedLoss,
    ::testing::Values(
        // OPTIREDUCE_FILL=zero does not reach the library's traffic class: its holes hold
        // the marker. Zero fill is covered on ordinary communicators made bounded by
        // OPTIREDUCE_MODE (FourRanks10pctZeroModeV9).
        LossCase{"TwoRanks1pctClassKeepsMarkerUnderZeroFill", 2, 0.01, HoleFill::kMarker, true,
                 11, 80, "zero"},
        LossCase{"TwoRanks10pctMarkerMode", 2, 0.10, HoleFill::kMarker, false, 11, 80},
        // NCCL 2.30 hands the traffic class to init through the v12 table.
        LossCase{"FourRanks1pctMarkerClassV12", 4, 0.01, HoleFill::kMarker, true, 12, 40},
        LossCase{"FourRanks10pctZeroModeV9", 4, 0.10, HoleFill::kZero, false, 9, 40}),
    [](const ::testing::TestParamInfo<LossCase>& p) { return std::string(p.param.name); });

// ---- Calibration: the first OPTIREDUCE_CALIBRATION_STEPS receives run exact (even under
// loss), then tB is the calibrated P95 and every bounded receive ends within the deadline the
// transport reports (budgetUs, allowanceUs). The budget is min(tB, adaptive) stretched by the
// loss governor, up to 4x tB on a host slow enough to cut steps: CI's once took 194.8 ms at a
// tB of 39.6 ms, which a check against tB alone called a failure.
TEST(BoundedCalibration, ExactWhileCalibratingThenWithinCalibratedBound) {
  constexpr int kSteps = 40;
  constexpr int kCalibration = 20;
  // The traffic class is liboptireduce's, so its holes hold the erasure marker (issue 12
  // defect 1); the test classifies them as such.
  Env env = lossy_env(0.01, "marker");
  env.push_back({"OPTIREDUCE_CALIBRATION_STEPS", std::to_string(kCalibration)});
  auto rank = [](Mesh& m) {
    Node node = open_node(m, plugin_path(), 11, 0xCA1B, kBoundedClass);
    ExchangeOptions o;
    o.size = kSize;
    o.pkt = kPkt;
    o.fill = HoleFill::kMarker;
    Exchange ex(node, m.rank, others(m), o);
    const int per_step = m.n - 1;
    int first_bounded = -1;
    uint64_t tb_us = 0;
    double worst = 0;
    uint64_t widest_budget_us = 0;
    optireduceNetStats before = node.stats();
    for (int k = 0; k < kSteps; ++k) {
      // Step k's receives are posted after k * per_step completed ones: exact until then.
      const bool calibrating = k * per_step < kCalibration;
      const StepRecord r = ex.step(k);
      const optireduceNetStats after = node.stats();
      if (calibrating) {
        HCHECK(r.missing == 0, "rank %d step %d: %zu bytes filled while calibrating (exact)",
               m.rank, k, r.missing);
        before = after;
        continue;
      }
      if (first_bounded < 0) {
        first_bounded = k;
        tb_us = after.recv.tbUs;
        HCHECK(tb_us > 0 && tb_us < 1'000'000, "rank %d: tB %" PRIu64 " us after calibration",
               m.rank, tb_us);
      }
      // The deadline each receive got was quoted before the step or during it (earlier
      // completions move it): the wider of the readings on either side. A sender that starts
      // just before the allowance ends gets the budget from then.
      const uint64_t budget_us = std::max(before.recv.budgetUs, after.recv.budgetUs);
      const uint64_t allowance_us = std::max(before.recv.allowanceUs, after.recv.allowanceUs);
      // Once calibrated, the stretch is all that sets the budget above max(tB, the 1 ms least
      // budget) (before the first bounded step it was quoted against no tB yet, so only the
      // reading after is held to it; tB's microseconds are rounded down, the budget's from 4x
      // the nanoseconds).
      HCHECK(after.recv.budgetUs > 0 &&
                 static_cast<double>(after.recv.budgetUs) <=
                     LossGovernor::kMaxStretch *
                         static_cast<double>(std::max<uint64_t>(tb_us, 1000) + 1) &&
                 after.recv.allowanceUs >= after.recv.budgetUs,
             "rank %d step %d: budget %" PRIu64 " us, allowance %" PRIu64 " us, tB %" PRIu64 " us",
             m.rank, k, after.recv.budgetUs, after.recv.allowanceUs, tb_us);
      widest_budget_us = std::max(widest_budget_us, budget_us);
      const double limit = static_cast<double>(allowance_us + budget_us) / 1e3 + slack(r);
      worst = std::max(worst, r.max_recv_ms);
      HCHECK(r.max_recv_ms <= limit,
             "rank %d step %d: receive took %.1f ms: tB %.1f ms, budget %.1f ms, allowance "
             "%.1f ms (+%.0f slack, %.0f ms waiting for a CPU)",
             m.rank, k, r.max_recv_ms, static_cast<double>(tb_us) / 1e3,
             static_cast<double>(budget_us) / 1e3, static_cast<double>(allowance_us) / 1e3,
             slack(r), r.cpu_wait_ms);
      before = after;
    }
    m.barrier();
    settle_and_check(ex);
    const optireduceNetStats st = node.stats();
    const uint64_t bounded_receives = static_cast<uint64_t>(kSteps - first_bounded) * per_step;
    std::fprintf(stderr,
                 "rank %d: calibrated tB %.2f ms (tC %.2f ms), bounded from step %d, widest "
                 "budget %.2f ms, worst %.1f ms, lost %" PRIu64 "/%" PRIu64 " B\n",
                 m.rank, static_cast<double>(tb_us) / 1e3, static_cast<double>(st.recv.tcUs) / 1e3,
                 first_bounded, static_cast<double>(widest_budget_us) / 1e3, worst,
                 st.recv.bytesLost, st.recv.bytesExpected);
    HCHECK(st.recv.tbUs == tb_us,
           "rank %d: tB moved after calibration (%" PRIu64 " -> %" PRIu64 ")", m.rank, tb_us,
           st.recv.tbUs);
    HCHECK(st.recv.tcUs <= st.recv.tbUs, "rank %d: tC above tB", m.rank);
    HCHECK(st.recv.bytesExpected == bounded_receives * kSize,
           "rank %d: %" PRIu64 " bounded bytes expected, %" PRIu64 " posted after calibration",
           m.rank, st.recv.bytesExpected, bounded_receives * kSize);
    m.barrier();
    close_node(node);
  };
  EXPECT_EQ(run_ranks(4, rank, env, 50), "");
}

// ---- A peer that stops calling the plugin for 2 s costs the others at most their deadline
// per step, and itself at most a deadline per step once it is back.
TEST(BoundedStall, StalledPeerCostsOthersOneDeadlinePerStep) {
  // The others' steps from the stall on must all fit in the stall, with room for a slow build:
  // 20 deadlines are 1000 ms of the 2000 (at 35, the 1750 ms left 7 ms per step, which TSan on
  // a 2-core host overran in every run: 2015-2716 ms, at 58-78 ms per step).
  constexpr int kSteps = 25;
  constexpr int kStallStep = 5;
  constexpr int kStalled = 1;
  constexpr double kTimeout = 50;
  constexpr double kStallMs = 2000;
  const Env env = {{"OPTIREDUCE_MODE", "bounded"},
                   {"OPTIREDUCE_TIMEOUT_MS", std::to_string(kTimeout)},
                   {"OPTIREDUCE_MAX_DATAGRAM", std::to_string(kMaxDatagram)}};
  auto rank = [](Mesh& m) {
    Node node = open_node(m, plugin_path(), 11, 0x57A1, -1);
    ExchangeOptions o;
    o.size = kSize;
    o.pkt = kPkt;
    Exchange ex(node, m.rank, others(m), o);
    double worst = 0, stall_total = 0, first = 0;
    for (int k = 0; k < kSteps; ++k) {
      if (m.rank == kStalled && k == kStallStep) usleep(static_cast<useconds_t>(kStallMs * 1e3));
      const StepRecord r = ex.step(k);
      worst = std::max(worst, r.step_ms);
      if (k == 0) first = r.step_ms;
      if (k >= kStallStep) stall_total += r.step_ms;
      // Under ThreadSanitizer the first exchange is no measure of a deadline: it overruns it
      // everywhere (every rank's first receives end cut), and in 2 of 12 runs here one rank
      // got no byte by its deadline (its CTS repeated, its peers' sends to it expired) while
      // its own sends ran 150-290 ms. Release: step 0 took at most 51 ms in 10 runs. From
      // step 1 on it is checked there as well.
      if (k == 0 && kThreadSanitizer) continue;
      HCHECK(r.step_ms <= kTimeout + slack(r),
             "rank %d step %d took %.1f ms (receives %.1f, sends %.1f, %.0f waiting for a CPU): "
             "more than one deadline (%.0f ms + %.0f slack)%s",
             m.rank, k, r.step_ms, r.max_recv_ms, r.max_send_ms, r.cpu_wait_ms, kTimeout, slack(r),
             m.rank != kStalled && k >= kStallStep ? " while a peer stalled" : "");
    }
    m.barrier();
    settle_and_check(ex);  // the stalled rank's stale DATA arrived late: never written
    const optireduceNetStats st = node.stats();
    std::fprintf(stderr,
                 "rank %d: step 0 %.1f ms, worst step %.1f ms, steps %d..%d took %.0f ms; "
                 "deadline %" PRIu64 " expired sends %" PRIu64 " late %" PRIu64 "\n",
                 m.rank, first, worst, kStallStep, kSteps - 1, stall_total, st.recv.deadlineHits,
                 st.send.expiredSends, st.recv.latePkts);
    if (m.rank != kStalled) {
      // The stalled rank's share of the steps did not wait for it: its receives ended by the
      // deadline (or its sender's expiry) and the sends to it expired.
      HCHECK(st.send.expiredSends > 0, "rank %d: no send to the stalled peer expired", m.rank);
      HCHECK(st.recv.deadlineHits > 0, "rank %d: no receive from the stalled peer hit its deadline",
             m.rank);
      HCHECK(stall_total < kStallMs,
             "rank %d: steps after the stall took %.0f ms in all, more than the stall: they "
             "waited for the stalled peer",
             m.rank, stall_total);
    } else {
      // Back, it found the old steps' receives ended: a send whose receiver's floor had passed
      // it expired at once, sending nothing. Whatever old DATA it sent before a floor reached it
      // was dropped at the receiver (settle_and_check: never written), so how much was counted
      // late depends on when the floors came, and is not checked here (it failed 8 runs of 25
      // on an idle host; conn_test's late-datagram tests count it exactly).
      HCHECK(st.send.expiredSends > 0, "rank %d: none of the old steps' sends expired", m.rank);
    }
    m.barrier();
    close_node(node);
  };
  EXPECT_EQ(run_ranks(4, rank, env, 50), "");
}

// death_step < 0: the victim dies after connecting, before it ever posts a receive.
constexpr int kPeerTimeoutMs = 1000;
void kill_case(int death_step) {
  constexpr int kSteps = 30;
  constexpr int kVictim = 3;
  Env env = lossy_env(0.01, "marker");
  env.push_back({"OPTIREDUCE_TIMEOUT_MS", std::to_string(kTimeoutMs)});
  env.push_back({"OPTIREDUCE_PEER_TIMEOUT_MS", std::to_string(kPeerTimeoutMs)});
  auto rank = [death_step](Mesh& m) {
    Node node = open_node(m, plugin_path(), 11, 0xDEAD, kBoundedClass);
    ExchangeOptions o;
    o.size = kSize;
    o.pkt = kPkt;
    o.fill = HoleFill::kMarker;
    o.mortal = kVictim;
    Exchange ex(node, m.rank, others(m), o);
    if (m.rank == kVictim && death_step < 0) raise(SIGKILL);
    const double started = mono_s();
    double death_s = death_step < 0 ? started : 0;
    double worst = 0;
    for (int k = 0; k < kSteps; ++k) {
      if (k == death_step) death_s = mono_s();
      // The victim dies right after posting its step: its CTS and perhaps part of its DATA
      // are out, the rest never will be.
      const StepRecord r = ex.step(k, m.rank == kVictim && k == death_step ? 0.0 : -1.0);
      HCHECK(m.rank != kVictim || k < death_step, "the victim outlived its step");
      worst = std::max(worst, r.step_ms);
      // Until the dead peer is found out, its share of a step ends by the deadline (receives)
      // or by expiry (sends), as a stalled peer's does; after, it is no longer waited for.
      const double send_bound = death_step < 0 && k == 0 ? kPeerTimeoutMs : 2 * kTimeoutMs;
      HCHECK(r.max_recv_ms <= kTimeoutMs + slack(r) && r.max_send_ms <= send_bound + slack(r),
             "rank %d step %d: receive %.1f ms, send %.1f ms; deadline %.0f ms (+%.0f slack, "
             "%.0f ms waiting for a CPU)",
             m.rank, k, r.max_recv_ms, r.max_send_ms, kTimeoutMs, slack(r), r.cpu_wait_ms);
      if (k > death_step && ex.mortal_fate().recv_failed_s == 0) {
        HCHECK(r.missing_from[kVictim] == kSize,
               "rank %d step %d: %zu of %zu bytes from the dead peer filled", m.rank, k,
               r.missing_from[kVictim], kSize);
      }
    }
    std::vector<int> who = others(m, kVictim);
    who.push_back(m.rank);
    std::sort(who.begin(), who.end());
    m.barrier(who);
    settle_and_check(ex);
    // Both connections to the dead peer ended with ncclRemoteError within the bound of its
    // death (ICMP on loopback makes it much sooner), however the steps went meanwhile.
    const MortalFate& fate = ex.mortal_fate();
    HCHECK(fate.recv_failed_s != 0 && fate.send_failed_s != 0,
           "rank %d: a connection to the dead peer never failed (recv %d, send %d)", m.rank,
           fate.recv_failed_s != 0, fate.send_failed_s != 0);
    const double recv_ms = (fate.recv_failed_s - death_s) * 1e3;
    const double send_ms = (fate.send_failed_s - death_s) * 1e3;
    std::fprintf(stderr,
                 "rank %d: worst step %.1f ms; the dead peer found out after %.0f ms (receive) "
                 "and %.0f ms (send); %d receives from it ended first\n",
                 m.rank, worst, recv_ms, send_ms, fate.receives_done);
    HCHECK(recv_ms <= kPeerTimeoutMs + kSlackMs && send_ms <= kPeerTimeoutMs + kSlackMs,
           "rank %d: remote error %.0f / %.0f ms after the death; bound %d ms", m.rank, recv_ms,
           send_ms, kPeerTimeoutMs);
    // The live peers' share arrived every step: nothing of the death leaked onto them.
    const optireduceNetStats st = node.stats();
    HCHECK(st.recv.msgs >= static_cast<uint64_t>(kSteps) * (m.n - 2), "rank %d: receives",
           m.rank);
    m.barrier(who);
    close_node(node);
  };
  EXPECT_EQ(run_ranks(4, rank, env, 50, kVictim), "");
}

// ---- A peer SIGKILLed in the middle of a step: the others never hang; its share of the steps
// ends by deadline or expiry until the transport finds it dead (OPTIREDUCE_PEER_TIMEOUT_MS,
// much sooner where ICMP says so), then both connections to it fail with ncclRemoteError while
// the live peers' traffic goes on untouched.
TEST(BoundedKill, KilledPeerNeverHangsTheOthers) {
  kill_case(10);
}

// The same with a peer that dies before it ever posted a receive.
TEST(BoundedKill, PeerDeadBeforeItsFirstReceive) {
  kill_case(-1);
}

// ---- Exactness where promised: OPTIREDUCE_MODE unset, the same traffic under 10% loss, and
// every byte arrives.
class ExactUnderLoss : public ::testing::TestWithParam<int> {};

TEST_P(ExactUnderLoss, EveryByteExact) {
  const int ranks = GetParam();
  const Env env = lossy_env(0.10, "zero");
  auto rank = [](Mesh& m) {
    Node node = open_node(m, plugin_path(), 11, 0xE8AC, -1);
    HCHECK(node.stats().bounded == 0, "rank %d: exact communicator reports bounded", m.rank);
    ExchangeOptions o;
    o.size = kSize;
    o.pkt = kPkt;
    o.expect_exact = true;
    o.hang_s = 30;
    Exchange ex(node, m.rank, others(m), o);
    constexpr int kSteps = 20;
    for (int k = 0; k < kSteps; ++k) ex.step(k);
    m.barrier();
    settle_and_check(ex);
    const optireduceNetStats st = node.stats();
    HCHECK(st.recv.bytes == static_cast<uint64_t>(kSteps) * (m.n - 1) * kSize,
           "rank %d: %" PRIu64 " bytes delivered", m.rank, st.recv.bytes);
    HCHECK(st.recv.bytesLost == 0 && st.recv.deadlineHits == 0 && st.recv.bytesExpected == 0,
           "rank %d: bounded counters moved on an exact communicator", m.rank);
    HCHECK(st.send.retxPkts > 0, "rank %d: 10%% loss and no retransmission", m.rank);
    m.barrier();
    close_node(node);
  };
  EXPECT_EQ(run_ranks(ranks, rank, env, 50), "");
}

INSTANTIATE_TEST_SUITE_P(Ranks, ExactUnderLoss, ::testing::Values(2, 4),
                         [](const ::testing::TestParamInfo<int>& p) {
                           return std::to_string(p.param) + "Ranks";
                         });

}  // namespace
}  // namespace optireduce::testing
