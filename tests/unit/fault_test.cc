// Tests of transport/fault.cc over a recording in-memory endpoint and a FakeClock: fault rates
// and burst lengths, duplicates, reordering, delay order and timing, determinism, pool
// exhaustion, and "taken" counts when the inner endpoint takes less.
#include "transport/fault.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <vector>

#include <gtest/gtest.h>

namespace optireduce {
namespace {

// Records every datagram handed to it (its 4-byte sequence number and its time); takes at most
// `budget` datagrams per call when budget >= 0.
class RecordingEndpoint final : public Endpoint {
 public:
  struct Sent {
    uint32_t seq;
    uint32_t len;
    uint64_t at_ns;
  };
  explicit RecordingEndpoint(const Clock& clock) : clock_(clock) { addr_.kind = 1; }

  const PeerAddress& local_address() const override { return addr_; }
  Status set_peer(const PeerAddress&) override { return Status::ok(); }
  int tx_burst(const TxPacket* pkts, int n) override {
    const int take = budget < 0 ? n : std::min(n, budget);
    for (int i = 0; i < take; ++i) {
      uint8_t bytes[8] = {};
      // The sequence number is the first 4 bytes of the datagram, wherever they lie.
      const uint32_t hl = std::min<uint32_t>(pkts[i].hdr_len, 4);
      if (hl) std::memcpy(bytes, pkts[i].hdr, hl);
      if (hl < 4) std::memcpy(bytes + hl, pkts[i].payload, 4 - hl);
      uint32_t seq;
      std::memcpy(&seq, bytes, 4);
      sent.push_back(Sent{seq, pkts[i].hdr_len + pkts[i].payload_len, clock_.now_ns()});
    }
    ++calls;
    return take;
  }
  int rx_burst(RxPacket*, int) override { return 0; }
  uint32_t max_datagram_bytes() const override { return 1472; }
  // As a UDP endpoint's: more to a peer on this host (its own address, kind 1) and to the
  // `jumbo` peer (kind 2) than the device's figure, to any other the device's.
  uint32_t max_datagram_bytes_to(const PeerAddress& peer) const override {
    return peer.kind == 1   ? kLocalDatagramBytes
           : peer.kind == 2 ? kJumboDatagramBytes
                            : max_datagram_bytes();
  }
  const DatapathCounters& counters() const override { return counters_; }
  uint64_t receive_buffer_bytes() const override { return kReceiveBufferBytes; }
  // As a shared endpoint's port: a descriptor to block on, served by others' drains.
  bool shared() const override { return true; }
  int readable_fd() const override { return kFd; }
  bool prepare_wait() override { return false; }
  void set_blocked_waiter(bool on) override { blocked = on; }

  // Any value: the fault injector must pass it through unchanged.
  static constexpr uint64_t kReceiveBufferBytes = 123456;
  static constexpr uint32_t kLocalDatagramBytes = 60000;
  static constexpr uint32_t kJumboDatagramBytes = 65507;
  static constexpr int kFd = 42;
  bool blocked = false;
  std::vector<Sent> sent;
  int budget = -1;
  int calls = 0;

 private:
  const Clock& clock_;
  PeerAddress addr_;
  DatapathCounters counters_;
};

// A test bench: a faulty endpoint over a recording one, datagrams numbered from 0.
struct Bench {
  explicit Bench(const FaultPlan& plan) {
    auto rec = std::make_unique<RecordingEndpoint>(clock);
    inner = rec.get();
    ep = make_faulty_endpoint(std::move(rec), plan, clock);
  }
  // Offers datagrams [first, first+n) in one call; each is a 4-byte header and 60-byte payload.
  int offer(uint32_t first, int n) {
    hdrs.resize(static_cast<size_t>(n));
    std::vector<TxPacket> pkts(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
      hdrs[i] = first + static_cast<uint32_t>(i);
      pkts[i] = TxPacket{&hdrs[i], 4, sizeof(payload), payload};
    }
    return ep->tx_burst(pkts.data(), n);
  }
  // Offers datagrams [0, total) in bursts of `burst`, until each was taken.
  void offer_all(uint32_t total, int burst = 32) {
    for (uint32_t next = 0; next < total;) {
      const int n = static_cast<int>(std::min<uint32_t>(burst, total - next));
      const int r = offer(next, n);
      ASSERT_GE(r, 0);
      next += static_cast<uint32_t>(r);
    }
  }
  const FaultCounters& fc() const { return *fault_counters(*ep); }
  std::vector<uint32_t> seqs() const {
    std::vector<uint32_t> s;
    for (const auto& x : inner->sent) s.push_back(x.seq);
    return s;
  }

  FakeClock clock;
  RecordingEndpoint* inner = nullptr;
  std::unique_ptr<Endpoint> ep;
  std::vector<uint32_t> hdrs;
  uint8_t payload[60] = {};
};

TEST(FaultPlan, FromConfigAndEnabled) {
  Config cfg;
  EXPECT_FALSE(FaultPlan::from_config(cfg).enabled());
  cfg.fault_seed = 99;
  cfg.fault_drop = 0.1;
  cfg.fault_burst = 3;
  cfg.fault_dup = 0.2;
  cfg.fault_reorder = 0.3;
  cfg.fault_delay_prob = 0.4;
  cfg.fault_delay_us = 50;
  cfg.fault_delay_alpha = 2.5;
  const FaultPlan p = FaultPlan::from_config(cfg);
  EXPECT_EQ(p.seed, 99u);
  EXPECT_EQ(p.drop, 0.1);
  EXPECT_EQ(p.burst, 3);
  EXPECT_EQ(p.dup, 0.2);
  EXPECT_EQ(p.reorder, 0.3);
  EXPECT_EQ(p.delay_prob, 0.4);
  EXPECT_EQ(p.delay_us, 50);
  EXPECT_EQ(p.delay_alpha, 2.5);
  EXPECT_TRUE(p.enabled());
  FaultPlan only_dup;
  only_dup.dup = 0.01;
  EXPECT_TRUE(only_dup.enabled());
}

TEST(FaultCounters, NullForOtherEndpoints) {
  FakeClock clock;
  RecordingEndpoint rec(clock);
  EXPECT_EQ(fault_counters(rec), nullptr);
}

// Faults touch transmit only, so the buffering a peer may count on is the inner endpoint's.
TEST(FaultyEndpoint, ReportsTheInnerReceiveBuffer) {
  FaultPlan plan;
  plan.drop = 0.5;
  Bench b(plan);
  EXPECT_EQ(b.ep->receive_buffer_bytes(), RecordingEndpoint::kReceiveBufferBytes);
}

// The faults change what happens to datagrams, not their size: a peer on this host keeps the
// inner endpoint's larger datagrams (with the interface's MTU instead, ranks on one host sent
// 47 times the datagrams). Where datagrams may be held, never more than a pool slot holds: the
// slots are sized for the peer on this host, the largest the inner endpoint agrees to.
TEST(FaultyEndpoint, PassesTheDatagramSizePerPeer) {
  PeerAddress local, jumbo, other;
  local.kind = 1;
  jumbo.kind = 2;
  other.kind = 3;
  FaultPlan drops;
  drops.drop = 0.5;
  Bench d(drops);
  EXPECT_EQ(d.ep->max_datagram_bytes(), 1472u);
  EXPECT_EQ(d.ep->max_datagram_bytes_to(local), RecordingEndpoint::kLocalDatagramBytes);
  EXPECT_EQ(d.ep->max_datagram_bytes_to(jumbo), RecordingEndpoint::kJumboDatagramBytes);
  EXPECT_EQ(d.ep->max_datagram_bytes_to(other), 1472u);

  FaultPlan delays;
  delays.delay_prob = 1;
  delays.delay_us = 1000;
  delays.pool_slots = 2;
  Bench h(delays);
  EXPECT_EQ(h.ep->max_datagram_bytes_to(local), RecordingEndpoint::kLocalDatagramBytes);
  EXPECT_EQ(h.ep->max_datagram_bytes_to(jumbo), RecordingEndpoint::kLocalDatagramBytes);
  EXPECT_EQ(h.ep->max_datagram_bytes_to(other), 1472u);
  // A datagram of the largest size is held (delayed), not sent unharmed for want of room.
  std::vector<uint8_t> big(RecordingEndpoint::kLocalDatagramBytes - 4, 0);
  const uint32_t seq = 7;
  const TxPacket pkt{&seq, 4, uint32_t(big.size()), big.data()};
  ASSERT_EQ(h.ep->tx_burst(&pkt, 1), 1);
  EXPECT_EQ(h.fc().delayed, 1u);
  EXPECT_EQ(h.fc().pool_exhausted, 0u);
  EXPECT_TRUE(h.inner->sent.empty());
  h.clock.advance_ms(200);
  RxPacket rx[1];
  ASSERT_EQ(h.ep->rx_burst(rx, 1), 0);
  ASSERT_EQ(h.inner->sent.size(), 1u);
  EXPECT_EQ(h.inner->sent[0].seq, seq);
  EXPECT_EQ(h.inner->sent[0].len, RecordingEndpoint::kLocalDatagramBytes);
}

// Drops and duplicates hold nothing back, so a caller may block on the inner endpoint's
// descriptor and a shared endpoint's other callers may serve the connection, as without faults.
// Delays and reordering keep datagrams that leave only during the endpoint's own calls: no
// descriptor to sleep on, and the progress thread must visit it (not shared).
TEST(FaultyEndpoint, IsWaitedOnAsTheInnerOneUnlessItHoldsDatagrams) {
  FaultPlan drops;
  drops.drop = 0.5;
  drops.dup = 0.1;
  Bench d(drops);
  EXPECT_TRUE(d.ep->shared());
  EXPECT_EQ(d.ep->readable_fd(), RecordingEndpoint::kFd);
  EXPECT_EQ(d.ep->idle_fd(), RecordingEndpoint::kFd);
  EXPECT_FALSE(d.ep->prepare_wait());
  d.ep->set_blocked_waiter(true);
  EXPECT_TRUE(d.inner->blocked);
  for (const bool reorder : {false, true}) {
    FaultPlan holds;
    holds.drop = 0.5;
    (reorder ? holds.reorder : holds.delay_prob) = 0.1;
    Bench h(holds);
    EXPECT_FALSE(h.ep->shared()) << reorder;
    EXPECT_EQ(h.ep->readable_fd(), -1) << reorder;
    EXPECT_EQ(h.ep->idle_fd(), -1) << reorder;
  }
}

TEST(FaultyEndpoint, NoFaultsPassesEverythingInOrder) {
  Bench b(FaultPlan{});
  b.offer_all(1000);
  const auto s = b.seqs();
  ASSERT_EQ(s.size(), 1000u);
  for (uint32_t i = 0; i < 1000; ++i) ASSERT_EQ(s[i], i);
  EXPECT_EQ(b.inner->sent[0].len, 64u);
  EXPECT_EQ(b.fc().dropped + b.fc().duplicated + b.fc().reordered + b.fc().delayed, 0u);
}

TEST(FaultyEndpoint, DropRateWithinTolerance) {
  FaultPlan plan;
  plan.drop = 0.01;
  Bench b(plan);
  constexpr uint32_t kN = 100'000;
  b.offer_all(kN);
  const double rate = static_cast<double>(b.fc().dropped) / kN;
  // Binomial standard deviation is sqrt(0.01 * 0.99 / 1e5) = 0.0003: five of them.
  EXPECT_NEAR(rate, 0.01, 0.0016);
  EXPECT_EQ(b.inner->sent.size() + b.fc().dropped, kN);
  // Survivors keep their order.
  const auto s = b.seqs();
  EXPECT_TRUE(std::is_sorted(s.begin(), s.end()));
}

TEST(FaultyEndpoint, BurstLengthsHaveTheConfiguredMean) {
  FaultPlan plan;
  plan.drop = 0.01;
  plan.burst = 4;
  Bench b(plan);
  constexpr uint32_t kN = 100'000;
  b.offer_all(kN);
  // Runs of consecutive missing sequence numbers are the bursts (two bursts merge only when
  // a new one starts right after the last, 1% of the time).
  std::vector<bool> present(kN, false);
  for (uint32_t s : b.seqs()) present[s] = true;
  uint64_t runs = 0, lost = 0;
  for (uint32_t i = 0; i < kN; ++i) {
    if (present[i]) continue;
    ++lost;
    if (i == 0 || present[i - 1]) ++runs;
  }
  ASSERT_GT(runs, 500u);
  const double mean = static_cast<double>(lost) / static_cast<double>(runs);
  EXPECT_NEAR(mean, 4.0, 0.4);
  // Long-run loss: bursts of mean B started with probability p by each datagram outside one:
  // p*B / (p*B + 1 - p) = 0.04 / 1.03.
  EXPECT_NEAR(static_cast<double>(lost) / kN, 0.04 / 1.03, 0.005);
  EXPECT_EQ(lost, b.fc().dropped);
}

// A loss burst is a spell on the path: it goes on over a busy flow's datagrams, but one that
// began as the endpoint fell quiet does not take its sparse datagrams (PONGs, one per PING
// interval) for seconds. Counted in datagrams only, every datagram here after the first drop
// would be lost (a burst of mean 1e6).
TEST(FaultyEndpoint, ALossBurstEndsWhenTheEndpointFallsQuiet) {
  FaultPlan plan;
  plan.drop = 0.05;
  plan.burst = 1e6;
  Bench b(plan);
  uint32_t seq = 0;
  auto dropped = [&] {
    const size_t before = b.inner->sent.size();
    EXPECT_EQ(b.offer(seq++, 1), 1);
    return b.inner->sent.size() == before;
  };
  bool in_burst = false;
  for (int i = 0; i < 2000 && !in_burst; ++i) in_burst = dropped();
  ASSERT_TRUE(in_burst) << "no drop in 2000 datagrams at 5%";
  for (int i = 0; i < 50; ++i) ASSERT_TRUE(dropped()) << "a dense burst ended after " << i;
  b.clock.advance_ms(9);
  ASSERT_TRUE(dropped()) << "9 ms of quiet ended the burst";
  // From here each datagram follows 10 ms of quiet: only a new burst (5%) drops it.
  int passed = 0;
  for (int i = 0; i < 200; ++i) {
    b.clock.advance_ms(10);
    if (!dropped()) ++passed;
  }
  EXPECT_GE(passed, 170);
}

TEST(FaultyEndpoint, DuplicatesFollowTheirOriginal) {
  FaultPlan plan;
  plan.dup = 0.1;
  Bench b(plan);
  constexpr uint32_t kN = 20'000;
  b.offer_all(kN);
  const auto s = b.seqs();
  EXPECT_EQ(s.size(), kN + b.fc().duplicated);
  EXPECT_NEAR(static_cast<double>(b.fc().duplicated) / kN, 0.1, 0.01);
  uint64_t dups = 0;
  for (size_t i = 1; i < s.size(); ++i) {
    ASSERT_GE(s[i], s[i - 1]);
    if (s[i] == s[i - 1]) ++dups;
  }
  EXPECT_EQ(dups, b.fc().duplicated);
}

TEST(FaultyEndpoint, ReorderedDatagramsAreOvertakenByOneToThree) {
  FaultPlan plan;
  plan.reorder = 0.05;
  Bench b(plan);
  constexpr uint32_t kN = 20'000;
  b.offer_all(kN);
  b.clock.advance_ms(1);  // the last held datagram's time runs out
  EXPECT_EQ(b.offer(kN, 0), 0);
  const auto s = b.seqs();
  ASSERT_EQ(s.size(), kN);
  EXPECT_NEAR(static_cast<double>(b.fc().reordered) / kN, 0.05, 0.01);
  // Each reordered datagram appears 1-3 places later than its sequence number says, and
  // nothing else moves.
  uint64_t displaced = 0;
  std::vector<int> gaps(4, 0);
  for (size_t pos = 0; pos < s.size(); ++pos) {
    const int64_t shift = static_cast<int64_t>(pos) - static_cast<int64_t>(s[pos]);
    if (shift > 0) {
      ASSERT_LE(shift, 3) << "seq " << s[pos];
      ++displaced;
      ++gaps[static_cast<size_t>(shift)];
    }
  }
  EXPECT_EQ(displaced, b.fc().reordered);
  for (int g = 1; g <= 3; ++g) EXPECT_GT(gaps[static_cast<size_t>(g)], 0) << "gap " << g;
}

TEST(FaultyEndpoint, ReorderHeldDatagramLeavesWhenItsTimeIsUp) {
  FaultPlan plan;
  plan.reorder = 1;
  Bench b(plan);
  EXPECT_EQ(b.offer(0, 1), 1);
  EXPECT_TRUE(b.inner->sent.empty());
  b.clock.advance_us(99);
  RxPacket rx[1];
  EXPECT_EQ(b.ep->rx_burst(rx, 1), 0);
  EXPECT_TRUE(b.inner->sent.empty());
  b.clock.advance_us(1);
  EXPECT_EQ(b.ep->rx_burst(rx, 1), 0);  // receive calls release too
  ASSERT_EQ(b.inner->sent.size(), 1u);
  EXPECT_EQ(b.inner->sent[0].seq, 0u);
  EXPECT_EQ(b.inner->sent[0].len, 64u);
}

TEST(FaultyEndpoint, DelayedDatagramsLeaveInTimeOrderNotBefore) {
  FaultPlan plan;
  plan.delay_prob = 0.5;
  plan.delay_us = 100;
  plan.delay_alpha = 1.5;
  Bench b(plan);
  constexpr uint32_t kN = 2000;
  std::vector<uint64_t> offered_at(kN);
  for (uint32_t i = 0; i < kN; ++i) {
    offered_at[i] = b.clock.now_ns();
    ASSERT_EQ(b.offer(i, 1), 1);
    b.clock.advance_us(10);
  }
  // The cap is 100 x 100 us = 10 ms: after that everything is out.
  for (int i = 0; i < 200; ++i) {
    b.clock.advance_us(100);
    RxPacket rx[1];
    ASSERT_EQ(b.ep->rx_burst(rx, 1), 0);
  }
  const auto& sent = b.inner->sent;
  ASSERT_EQ(sent.size(), kN);
  EXPECT_NEAR(static_cast<double>(b.fc().delayed) / kN, 0.5, 0.05);
  uint64_t late = 0;
  double total_delay_us = 0;
  for (const auto& x : sent) {
    const uint64_t d = x.at_ns - offered_at[x.seq];
    if (d == 0) continue;
    ++late;
    EXPECT_GE(d, 100'000u) << "seq " << x.seq;                // at least the Pareto scale
    EXPECT_LE(d, 10'000'000u + 100'000u) << "seq " << x.seq;  // cap + one release period
    total_delay_us += static_cast<double>(d) / 1000.0;
  }
  EXPECT_EQ(late, b.fc().delayed);
  // Pareto(100 us, 1.5) capped at 100x has a mean near 3 x 100 us = 300 us (280 after the cap);
  // release granularity adds up to ~10-100 us.
  const double mean = total_delay_us / static_cast<double>(late);
  EXPECT_GT(mean, 200);
  EXPECT_LT(mean, 450);
}

TEST(FaultyEndpoint, DelayedReleaseOrderFollowsReleaseTime) {
  FaultPlan plan;
  plan.delay_prob = 1;
  plan.delay_us = 100;
  plan.delay_alpha = 1.0;
  Bench b(plan);
  for (uint32_t i = 0; i < 50; ++i) ASSERT_EQ(b.offer(i, 1), 1);  // all at the same instant
  EXPECT_TRUE(b.inner->sent.empty());
  b.clock.advance_us(99);
  RxPacket rx[1];
  ASSERT_EQ(b.ep->rx_burst(rx, 1), 0);
  EXPECT_TRUE(b.inner->sent.empty());  // nothing before the scale
  // Step the clock finely; each datagram leaves at the first step at or after its time, so
  // send times never decrease, and one jump releases all the rest.
  for (int i = 0; i < 100; ++i) {
    b.clock.advance_us(1);
    ASSERT_EQ(b.ep->rx_burst(rx, 1), 0);
  }
  const size_t early = b.inner->sent.size();
  EXPECT_GT(early, 0u);
  EXPECT_LT(early, 50u);
  b.clock.advance_ms(10);
  ASSERT_EQ(b.ep->rx_burst(rx, 1), 0);
  ASSERT_EQ(b.inner->sent.size(), 50u);
  for (size_t i = 1; i < b.inner->sent.size(); ++i)
    EXPECT_GE(b.inner->sent[i].at_ns, b.inner->sent[i - 1].at_ns);
}

TEST(FaultyEndpoint, SameSeedSameFaultsOtherSeedOtherFaults) {
  FaultPlan plan;
  plan.drop = 0.02;
  plan.burst = 2;
  plan.dup = 0.02;
  plan.reorder = 0.02;
  plan.delay_prob = 0.02;
  plan.delay_us = 20;
  auto run = [](const FaultPlan& p) {
    Bench b(p);
    for (uint32_t next = 0; next < 5000;) {
      const int r = b.offer(next, 16);
      EXPECT_GE(r, 0);
      next += static_cast<uint32_t>(r);
      b.clock.advance_us(3);
    }
    b.clock.advance_ms(10);
    RxPacket rx[1];
    EXPECT_EQ(b.ep->rx_burst(rx, 1), 0);
    return b.seqs();
  };
  const auto a = run(plan);
  EXPECT_EQ(a, run(plan));
  FaultPlan other = plan;
  other.seed = 2;
  EXPECT_NE(a, run(other));
}

TEST(FaultyEndpoint, DropPatternIndependentOfOtherFaults) {
  FaultPlan plan;
  plan.drop = 0.05;
  Bench plain(plan);
  plain.offer_all(5000);
  plan.dup = 0.3;
  Bench with_dup(plan);
  with_dup.offer_all(5000);
  auto unique = [](std::vector<uint32_t> s) {
    s.erase(std::unique(s.begin(), s.end()), s.end());
    return s;
  };
  EXPECT_EQ(unique(plain.seqs()), unique(with_dup.seqs()));
}

TEST(FaultyEndpoint, FullPoolSendsUnharmedAndCounts) {
  FaultPlan plan;
  plan.delay_prob = 1;
  plan.delay_us = 1000;
  plan.pool_slots = 4;
  Bench b(plan);
  for (uint32_t i = 0; i < 10; ++i) ASSERT_EQ(b.offer(i, 1), 1);
  EXPECT_EQ(b.fc().delayed, 4u);
  EXPECT_EQ(b.fc().pool_exhausted, 6u);
  const auto now = b.seqs();
  EXPECT_EQ(now, (std::vector<uint32_t>{4, 5, 6, 7, 8, 9}));
  b.clock.advance_ms(200);
  RxPacket rx[1];
  ASSERT_EQ(b.ep->rx_burst(rx, 1), 0);
  EXPECT_EQ(b.inner->sent.size(), 10u);
  // The slots are free again.
  ASSERT_EQ(b.offer(10, 1), 1);
  EXPECT_EQ(b.fc().delayed, 5u);
}

TEST(FaultyEndpoint, ShortInnerCountsKeepTakenTrue) {
  // The inner endpoint takes 3 datagrams per call. Whatever the faults, every datagram must end
  // up exactly once as sent, dropped or held, and survivors of a plain run keep their order.
  FaultPlan plan;
  plan.drop = 0.1;
  plan.dup = 0.1;
  plan.reorder = 0.1;
  Bench b(plan);
  b.inner->budget = 3;
  constexpr uint32_t kN = 5000;
  uint32_t next = 0;
  int calls = 0;
  while (next < kN) {
    const int n = static_cast<int>(std::min<uint32_t>(16, kN - next));
    const int r = b.offer(next, n);
    ASSERT_GE(r, 0);
    ASSERT_LE(r, n);
    next += static_cast<uint32_t>(r);
    ASSERT_LT(++calls, 100'000);
  }
  b.inner->budget = -1;
  b.clock.advance_ms(1);
  EXPECT_EQ(b.offer(kN, 0), 0);
  std::map<uint32_t, int> copies;
  for (uint32_t s : b.seqs()) ++copies[s];
  uint64_t dups = 0;
  for (const auto& [seq, c] : copies) {
    ASSERT_LE(c, 2) << "seq " << seq;
    dups += static_cast<uint64_t>(c - 1);
  }
  EXPECT_EQ(dups, b.fc().duplicated);
  EXPECT_EQ(copies.size() + b.fc().dropped, kN);
}

TEST(FaultyEndpoint, FullInnerQueueHoldsReleasesBack) {
  FaultPlan plan;
  plan.delay_prob = 1;
  plan.delay_us = 1000;
  plan.delay_alpha = 100;  // nearly constant: 1000 us and a little
  Bench b(plan);
  for (uint32_t i = 0; i < 5; ++i) {
    ASSERT_EQ(b.offer(i, 1), 1);
    b.clock.advance_us(200);  // more than the spread of delays: release order = offer order
  }
  ASSERT_TRUE(b.inner->sent.empty());
  b.inner->budget = 2;
  b.clock.advance_ms(2);
  RxPacket rx[1];
  ASSERT_EQ(b.ep->rx_burst(rx, 1), 0);
  EXPECT_EQ(b.seqs(), (std::vector<uint32_t>{0, 1}));
  // A send while released datagrams still wait takes nothing new.
  EXPECT_EQ(b.offer(5, 1), 0);
  EXPECT_EQ(b.seqs(), (std::vector<uint32_t>{0, 1, 2, 3}));
  b.inner->budget = -1;
  ASSERT_EQ(b.ep->rx_burst(rx, 1), 0);
  EXPECT_EQ(b.seqs(), (std::vector<uint32_t>{0, 1, 2, 3, 4}));
}

}  // namespace
}  // namespace optireduce
