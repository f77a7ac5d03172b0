// The plugin across two real verbs devices (rxe0, rxe1 in the rxe VM), one process on each, so
// netem on the veth between them really drops datagrams: exact transfers byte-exact, bounded
// transfers ended by their deadline with holes filled on the packet grid and counted, and sends
// from regMr-registered buffers leaving without a copy (exact and bounded, retransmissions too).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/plugin/plugin_path.h"
#include "tests/plugin/procs.h"
#include "tests/verbs/rxe_env.h"

// Each process loads the built .so as NCCL would, with OPTIREDUCE_IB_HCA naming its device.
// RXE_TEST_LOSS=<%> says netem loss is on (then loss must be seen); rxe-loss-suite.sh runs it
// inside the VM. RXE_TEST_DATAPATH=udp dry-runs the same checks over UDP on any host.
namespace optireduce::testing {
namespace {

// The rxe MTU at a 1500-byte netdev is 1024; a fixed datagram size pins the hole grid.
constexpr size_t kMaxDatagram = 1024;
constexpr size_t kPkt = packet_payload(kMaxDatagram);
// TCG emulation runs the guest 10-50x slower than native; deadlines and slack are sized for
// that, not for a real NIC. Still far below the seconds a hang or a missed deadline costs.
constexpr double kTimeoutMs = 150;
constexpr double kSlackMs = 350;
constexpr double kMaxCpuWaitExcuseMs = 500;

// The whole guest stops now and then for a second or more when the host's cores are busy
// elsewhere (TCG runs every vCPU as a host thread): a receive then looks late without any
// fault of the transport and without any run-queue wait inside the guest. A thread that
// sleeps 2 ms at a time sees such stops as gaps; their excess is what a step is excused. A
// transport that misses its deadline by itself leaves no gap and still fails.
class StallMonitor {
 public:
  StallMonitor() : thread_([this] { run(); }) {}
  ~StallMonitor() {
    stop_.store(true);
    thread_.join();
  }
  double total_ms() const { return total_us_.load() / 1e3; }

 private:
  void run() {
    double prev = mono_s();
    while (!stop_.load()) {
      struct timespec ts = {0, 2'000'000};
      nanosleep(&ts, nullptr);
      const double now = mono_s();
      const double excess_ms = (now - prev) * 1e3 - 2;
      if (excess_ms > 10) total_us_.fetch_add(static_cast<uint64_t>(excess_ms * 1e3));
      prev = now;
    }
  }
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> total_us_{0};
  std::thread thread_;
};
// Packets a netdev sent, from sysfs; -1 where it does not exist.
long long tx_packets(const char* netdev) {
  std::ifstream f(std::string("/sys/class/net/") + netdev + "/statistics/tx_packets");
  long long v = -1;
  if (!(f >> v)) return -1;
  return v;
}

class RxePair : public ::testing::Test {
 protected:
  void SetUp() override {
    hcas_ = rxe_hcas();
    if (hcas_.size() != 2 || !rxe_have_device(hcas_[0]) || !rxe_have_device(hcas_[1])) {
      GTEST_SKIP() << "needs two verbs devices "
                   << (hcas_.size() == 2 ? hcas_[0] + "," + hcas_[1] : "")
                   << " (run inside the rxe VM with RXE_NETDEV=veth)";
    }
    veth0_ = tx_packets("rxeveth0");
    veth1_ = tx_packets("rxeveth1");
  }
  // Every rank's datagrams went over the veth, not through rxe's internal loopback: the two
  // ends' counters grew by at least what the transport says it sent.
  void expect_crossed_veth(long long min_pkts) const {
    if (veth0_ < 0 || veth1_ < 0) return;  // another netdev mode: nothing to check
    EXPECT_GE(tx_packets("rxeveth0") - veth0_, min_pkts);
    EXPECT_GE(tx_packets("rxeveth1") - veth1_, min_pkts);
  }
  // Applied in each child before the plugin is loaded, so its engine opens only this device.
  void pick_device(const Mesh& m) const {
    if (rxe_udp_dry_run()) {
      setenv("OPTIREDUCE_DATAPATH", "udp", 1);
      return;
    }
    setenv("OPTIREDUCE_DATAPATH", "verbs", 1);
    setenv("OPTIREDUCE_IB_HCA", hcas_[static_cast<size_t>(m.rank)].c_str(), 1);
  }
  void check_device(const Node& node, const Mesh& m) const {
    if (rxe_udp_dry_run()) return;
    int n = 0;
    HCHECK_OK(node.net->devices(&n));
    HCHECK(n == 1, "rank %d: %d devices with OPTIREDUCE_IB_HCA=%s", m.rank, n,
           hcas_[static_cast<size_t>(m.rank)].c_str());
    NetProps p;
    HCHECK_OK(node.net->properties(0, &p));
    HCHECK(p.name == hcas_[static_cast<size_t>(m.rank)], "rank %d: device %s, wanted %s", m.rank,
           p.name.c_str(), hcas_[static_cast<size_t>(m.rank)].c_str());
  }

  std::vector<std::string> hcas_;
  long long veth0_ = -1, veth1_ = -1;
};

// Each rank's counters as rank 0 needs them for job-wide assertions.
struct Totals {
  uint64_t data_pkts = 0;
  uint64_t retx = 0;
  uint64_t probes = 0;
  uint64_t rto = 0;
  uint64_t lost = 0;
  uint64_t expected = 0;
  uint64_t deadline_hits = 0;
  uint64_t early = 0;
  uint64_t holed = 0;
  uint64_t repaired = 0;
};

Totals exchange_totals(Mesh& m, const Totals& mine) {
  const int other = 1 - m.rank;
  m.channel[other]->send(mine);
  const Totals t = m.channel[other]->recv<Totals>();
  Totals s = mine;
  s.data_pkts += t.data_pkts;
  s.retx += t.retx;
  s.probes += t.probes;
  s.rto += t.rto;
  s.lost += t.lost;
  s.expected += t.expected;
  s.deadline_hits += t.deadline_hits;
  s.early += t.early;
  s.holed += t.holed;
  s.repaired += t.repaired;
  return s;
}

// What a rank's connections did, for a step that never ended: whether DATA still left
// (retransmissions, probes, timeouts), arrived and were dropped (and why), or stopped.
void print_stuck_counters(const Node& node, int rank) {
  const optireduceNetStats st = node.stats();
  auto line = [rank](const char* side, const optireduceNetCounters& c) {
    std::fprintf(
        stderr,
        "rank %d %s: msgs %" PRIu64 " data %" PRIu64 " retx %" PRIu64 " rto %" PRIu64
        " probes %" PRIu64 " cts resent %" PRIu64 " placed %" PRIu64 " dropped: stale %" PRIu64
        " duplicate %" PRIu64 " bounds %" PRIu64 " unexpected %" PRIu64 " token %" PRIu64 "\n",
        rank, side, c.msgs, c.dataPkts, c.retxPkts, c.rtoEvents, c.probes, c.ctsResent,
        c.placedPkts, c.dropStale, c.dropDuplicate, c.dropBounds, c.dropUnexpected, c.dropToken);
  };
  line("send", st.send);
  line("recv", st.recv);
}

// ---- Exact: both directions at once, sizes from one byte to a megabyte (1 to 1075 packets,
// short and odd tails), every byte checked against the pattern; under loss the retransmission
// machinery must have worked for it.
TEST_F(RxePair, ExactTransfersAreByteExact) {
  struct Size {
    size_t bytes;
    int steps;
  };
  const std::vector<Size> sizes = {{1, 10}, {3 * kPkt + 5, 20}, {65536 + 13, 20}, {1 << 20, 6}};
  long long sent_pkts = 0;
  for (const Size& s : sizes) sent_pkts += static_cast<long long>(s.steps * (s.bytes / kPkt));
  const int loss = rxe_loss_percent();
  auto rank = [&](Mesh& m) {
    pick_device(m);
    Node node = open_node(m, plugin_path(), 11, 0xE7AC, -1);
    check_device(node, m);
    HCHECK(node.stats().bounded == 0, "rank %d: communicator bounded in exact mode", m.rank);
    int base = 0;
    for (const Size& s : sizes) {
      ExchangeOptions o;
      o.size = s.bytes;
      o.pkt = kPkt;
      o.expect_exact = true;
      o.hang_s = 120;
      Exchange ex(node, m.rank, {1 - m.rank}, o);
      for (int k = 0; k < s.steps; ++k) ex.step(base + k);  // checks every byte
      base += s.steps;
    }
    m.barrier();
    const optireduceNetStats st = node.stats();
    Totals mine;
    mine.data_pkts = st.send.dataPkts;
    mine.retx = st.send.retxPkts;
    mine.probes = st.send.probes;
    mine.rto = st.send.rtoEvents;
    const Totals all = exchange_totals(m, mine);
    if (m.rank == 0) {
      std::fprintf(stderr,
                   "exact over %s<->%s, netem loss %d%%: %" PRIu64 " data pkts, %" PRIu64
                   " retransmitted, %" PRIu64 " probes, %" PRIu64 " RTOs\n",
                   hcas_[0].c_str(), hcas_[1].c_str(), loss, all.data_pkts, all.retx, all.probes,
                   all.rto);
      HCHECK(loss == 0 || all.retx > 0, "netem loss %d%% but nothing retransmitted", loss);
    }
    m.barrier();
    close_node(node);
  };
  EXPECT_EQ(run_ranks(2, rank, {{"OPTIREDUCE_MAX_DATAGRAM", std::to_string(kMaxDatagram)}},
                      kRxeRankTimeoutS),
            "");
  expect_crossed_veth(sent_pkts / 2);
}

// ---- Bounded: every receive completes by its deadline with its real size, every byte is the
// pattern or the marker fill of a whole packet, the counters equal what the buffers hold, and
// a buffer is never written after its receive completed.
TEST_F(RxePair, BoundedTransfersKeepDeadlinesAndCountHoles) {
  // 106 packets, the last one short and of odd length.
  constexpr size_t kSize = 105 * kPkt + 483;
  constexpr int kSteps = 30;
  const int loss = rxe_loss_percent();
  auto rank = [&](Mesh& m) {
    pick_device(m);
    Node node = open_node(m, plugin_path(), 11, 0xB0ED, -1);
    check_device(node, m);
    HCHECK(node.stats().bounded == 1, "rank %d: communicator not bounded", m.rank);
    ExchangeOptions o;
    o.size = kSize;
    o.pkt = kPkt;
    o.fill = HoleFill::kMarker;
    o.hang_s = 60;
    Exchange ex(node, m.rank, {1 - m.rank}, o);
    Totals mine;
    uint64_t missing = 0, delivered = 0;
    double worst = 0;
    StallMonitor stalls;
    double stalled_ms = 0;
    for (int k = 0; k < kSteps; ++k) {
      const double stall0 = stalls.total_ms();
      const StepRecord r = ex.step(k);
      const double stall = stalls.total_ms() - stall0;
      stalled_ms += stall;
      const double slack = kSlackMs + std::min(r.cpu_wait_ms, kMaxCpuWaitExcuseMs) + stall;
      worst = std::max(worst, std::max(r.max_recv_ms, r.max_send_ms));
      HCHECK(r.max_recv_ms <= kTimeoutMs + slack,
             "rank %d step %d: a receive took %.1f ms; deadline %.0f ms (+%.0f slack, %.0f ms "
             "guest stall)",
             m.rank, k, r.max_recv_ms, kTimeoutMs, slack, stall);
      HCHECK(r.max_send_ms <= kTimeoutMs + slack,
             "rank %d step %d: a send took %.1f ms; deadline %.0f ms (+%.0f slack, %.0f ms "
             "guest stall)",
             m.rank, k, r.max_send_ms, kTimeoutMs, slack, stall);
      missing += r.missing;
      delivered += r.delivered;
      mine.holed += static_cast<uint64_t>(r.holed);
    }
    m.barrier();
    usleep(500'000);  // late datagrams still in flight land (and must be dropped) now
    ex.check_all_scribbles();
    const optireduceNetStats st = node.stats();
    HCHECK(st.recv.msgs == kSteps, "rank %d: %" PRIu64 " receives counted, %d done", m.rank,
           st.recv.msgs, kSteps);
    HCHECK(st.recv.bytesExpected == kSteps * kSize, "rank %d: bytesExpected %" PRIu64, m.rank,
           st.recv.bytesExpected);
    HCHECK(st.recv.bytesLost == missing,
           "rank %d: counters say %" PRIu64 " bytes lost, the buffers held %" PRIu64 " filled",
           m.rank, st.recv.bytesLost, missing);
    HCHECK(st.recv.bytes == delivered,
           "rank %d: counters say %" PRIu64 " bytes delivered, the buffers held %" PRIu64, m.rank,
           st.recv.bytes, delivered);
    mine.lost = st.recv.bytesLost;
    mine.expected = st.recv.bytesExpected;
    mine.deadline_hits = st.recv.deadlineHits;
    mine.early = st.recv.earlyTimeouts;
    mine.repaired = st.send.repairedPkts;
    // A receive ended by its deadline or early timeout had holes; a complete one ended itself.
    HCHECK(mine.holed >= mine.deadline_hits + mine.early,
           "rank %d: %" PRIu64 " deadline + %" PRIu64 " early endings but %" PRIu64
           " receives with holes",
           m.rank, mine.deadline_hits, mine.early, mine.holed);
    std::fprintf(stderr,
                 "rank %d (%s): worst %.1f ms (guest stalls %.0f ms); lost %" PRIu64 "/%" PRIu64
                 " B in %" PRIu64 " receives; deadline %" PRIu64 " early %" PRIu64
                 " late pkts %" PRIu64 "\n",
                 m.rank, hcas_[static_cast<size_t>(m.rank)].c_str(), worst, stalled_ms,
                 st.recv.bytesLost, st.recv.bytesExpected, mine.holed, mine.deadline_hits,
                 mine.early, st.recv.latePkts);
    const Totals all = exchange_totals(m, mine);
    if (m.rank == 0) {
      const double lost = static_cast<double>(all.lost) / static_cast<double>(all.expected);
      std::fprintf(stderr,
                   "bounded over %s<->%s, netem loss %d%%: %.2f%% of bytes filled, %" PRIu64
                   " packets repaired\n",
                   hcas_[0].c_str(), hcas_[1].c_str(), loss, 100 * lost, all.repaired);
      // Bounded mode repairs a loss while the deadline leaves time, so netem's drops show up
      // as repairs, as holes, or both; neither means the loss never reached the transport.
      if (loss > 0)
        HCHECK(all.lost > 0 || all.repaired > 0,
               "netem loss %d%% but no byte lost and no packet repaired", loss);
      // Only a loose ceiling: deadlines must not throw (nearly) everything away.
      HCHECK(lost < 0.8, "%.1f%% of bytes filled at %d%% loss", 100 * lost, loss);
    }
    m.barrier();
    close_node(node);
  };
  EXPECT_EQ(run_ranks(2, rank,
                      {{"OPTIREDUCE_MODE", "bounded"},
                       {"OPTIREDUCE_TIMEOUT_MS", std::to_string(kTimeoutMs)},
                       {"OPTIREDUCE_FILL", "marker"},
                       {"OPTIREDUCE_MAX_DATAGRAM", std::to_string(kMaxDatagram)}},
                      kRxeRankTimeoutS),
            "");
  expect_crossed_veth(1);
}

// ---- Zero copy (issue 16): NCCL registers its buffers (regMr) and passes the handle to every
// isend and irecv; sends then post the payload straight from the buffer, and receives lend a
// lane whose requests point into it (verbs/aim_lane.h). Exact messages arrive byte-exact
// (under loss: their retransmissions post from the buffer again), a bounded step keeps its
// deadline and never reports a send done while the device reads its buffer (the sender rewrites
// a slot as soon as its send is done, and the receiver checks every packet that arrived), and
// the sender's endpoint reports that datagrams left without a copy.
TEST_F(RxePair, RegisteredBuffersAreSentWithoutACopy) {
  constexpr int kRing = 4;
  constexpr size_t kSize = 64 * kPkt + 40;  // a short tail: the last packet may go inline
  constexpr int kSteps = 24;
  const int loss = rxe_loss_percent();
  for (const bool bounded : {false, true}) {
    auto rank = [&](Mesh& m) {
      pick_device(m);
      Node node = open_node(m, plugin_path(), 11, 0x2C0F, -1);
      check_device(node, m);
      std::vector<uint8_t> pool(kRing * kSize);
      void* comm = m.rank == 0 ? node.peer[1].send : node.peer[0].recv;
      void* mh = nullptr;
      HCHECK_OK(node.net->reg_mr(comm, pool.data(), pool.size(), nccl::NCCL_PTR_HOST, &mh));
      void* reqs[kRing] = {};
      int posted = 0, done = 0;
      uint64_t holed = 0;
      const double t0 = mono_s();
      while (done < kSteps) {
        if (posted < kSteps && posted - done < kRing) {
          uint8_t* b = pool.data() + (posted % kRing) * kSize;
          void* req = nullptr;
          if (m.rank == 0) {
            fill_pattern(b, kSize, 11, static_cast<uint64_t>(posted));
            HCHECK_OK(node.net->isend(comm, b, kSize, 0, mh, &req));
          } else {
            std::memset(b, 0, kSize);
            HCHECK_OK(node.net->irecv(comm, b, kSize, 0, mh, &req));
          }
          if (req != nullptr) reqs[posted++ % kRing] = req;
        }
        if (posted == done) continue;
        int d = 0, size = 0;
        HCHECK_OK(node.net->test(reqs[done % kRing], &d, &size));
        if (mono_s() - t0 >= 120) {
          print_stuck_counters(node, m.rank);
          HCHECK(false, "rank %d: step %d stuck", m.rank, done);
        }
        if (!d) continue;
        uint8_t* b = pool.data() + (done % kRing) * kSize;
        if (m.rank == 0) {
          // Done means the device no longer reads it: rewrite it at once, as NCCL may.
          std::memset(b, 0xA5, kSize);
        } else {
          std::vector<uint8_t> want(kSize);
          fill_pattern(want.data(), kSize, 11, static_cast<uint64_t>(done));
          const GridCount g = classify(b, want.data(), kSize, kPkt, HoleFill::kZero);
          HCHECK(g.bad < 0, "rank 1: step %d: byte %lld is neither the data nor the fill", done,
                 g.bad);
          HCHECK(bounded || g.missing == 0, "rank 1: exact step %d misses %zu bytes", done,
                 g.missing);
          holed += g.missing;
        }
        ++done;
      }
      m.barrier();
      HCHECK_OK(node.net->dereg_mr(comm, mh));
      close_node(node);
      if (m.rank == 0 && rxe_udp_dry_run()) {
        // UDP has no registration: sendmmsg gathers from the buffer either way, and nothing
        // is said. What the dry run checks is the rest: data, deadlines, buffer reuse.
        std::fprintf(stderr, "%s over UDP (dry run): the zero-copy report is verbs-only\n",
                     bounded ? "bounded" : "exact");
      } else if (m.rank == 0) {
        // The sender's endpoint says so at its first send from a registered buffer (its
        // counters stay inside it: a shared endpoint lives as long as the process).
        const bool said = log_capture().contains("without a copy");
        std::fprintf(stderr, "%s over %s, netem loss %d%%: zero-copy sends %s\n",
                     bounded ? "bounded" : "exact", hcas_[0].c_str(), loss,
                     said ? "reported" : "NOT reported");
        HCHECK(said, "no send left from the registered buffer without a copy");
      } else {
        std::fprintf(stderr, "%s: %llu bytes missing at the deadlines\n",
                     bounded ? "bounded" : "exact", static_cast<unsigned long long>(holed));
        if (!rxe_udp_dry_run() && !bounded) {
          // The receiver's lanes say so at the first datagram they place (verbs/aim_lane.h);
          // bounded receives are not aimed.
          const bool said = log_capture().contains("land in registered buffers");
          std::fprintf(stderr, "%s over %s, netem loss %d%%: receives in place %s\n",
                       bounded ? "bounded" : "exact", hcas_[1].c_str(), loss,
                       said ? "reported" : "NOT reported");
          HCHECK(said, "no datagram arrived in the registered receive buffer");
        }
      }
    };
    // NCCL_DEBUG=INFO: the plugin formats INFO lines (the zero-copy one) only when NCCL prints
    // them.
    Env env = {{"OPTIREDUCE_MAX_DATAGRAM", std::to_string(kMaxDatagram)}, {"NCCL_DEBUG", "INFO"}};
    if (bounded) {
      env.push_back({"OPTIREDUCE_MODE", "bounded"});
      env.push_back({"OPTIREDUCE_TIMEOUT_MS", std::to_string(kTimeoutMs)});
    }
    EXPECT_EQ(run_ranks(2, rank, env, kRxeRankTimeoutS), "") << (bounded ? "bounded" : "exact");
  }
}

}  // namespace
}  // namespace optireduce::testing
