// Tests of the network simulator itself (sim_net.h): congestion-control tests will trust its
// timing, queueing and loss figures, so each model is checked against numbers computed by hand
// (serialization at the link rate, propagation, drop-tail overflow, lossless back-pressure,
// seeded loss, incast sharing, cross traffic), then a real SendConn/RecvConn pair is carried
// through it byte-exact.
#include "tests/unit/pattern.h"
#include "tests/unit/sim_net.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdio>

#include "transport/recv.h"
#include "transport/send.h"
#include "transport/wire.h"

namespace optireduce {
namespace {

using testing::Dir;
using testing::HostLink;
using testing::LinkConfig;
using testing::LinkMode;
using testing::SimEndpoint;
using testing::SimNet;
using testing::link_at;
using testing::pattern;

constexpr uint64_t kGbps = 1'000'000'000;
constexpr uint64_t kUs = 1000;
constexpr uint64_t kMs = 1'000'000;

// A DATA datagram of `size` bytes whose msg_seq tells it apart, so that the log decodes it and
// a test can check order and identity at the far end.
std::vector<uint8_t> data_dgram(uint32_t seq, uint32_t size) {
  std::vector<uint8_t> d(size);
  PacketHeader h;
  h.type = PacketType::kData;
  h.msg_seq = seq;
  h.payload_len = size - kHeaderBytes;
  h.msg_size = h.payload_len;
  encode(h, d.data());
  return d;
}

// Datagrams with msg_seq first, first+1, ...
std::vector<std::vector<uint8_t>> dgrams(uint32_t first, int n, uint32_t size) {
  std::vector<std::vector<uint8_t>> v;
  for (int i = 0; i < n; ++i) v.push_back(data_dgram(first + uint32_t(i), size));
  return v;
}

// Offers d[from, from + count) to tx_burst in one call; returns how many it took.
int send_from(SimEndpoint& ep, const std::vector<std::vector<uint8_t>>& d, size_t from,
              size_t count = SIZE_MAX) {
  std::vector<TxPacket> tx;
  for (size_t i = from; i < d.size() && i - from < count; ++i) {
    TxPacket p;
    p.hdr = d[i].data();
    p.hdr_len = uint32_t(d[i].size());
    tx.push_back(p);
  }
  return tx.empty() ? 0 : ep.tx_burst(tx.data(), int(tx.size()));
}

// Drains the endpoint; returns the msg_seq of each datagram received, in order.
std::vector<uint32_t> receive(SimEndpoint& ep) {
  std::vector<uint32_t> seqs;
  RxPacket rx[32];
  for (int n; (n = ep.rx_burst(rx, 32)) > 0;) {
    for (int i = 0; i < n; ++i) {
      PacketHeader h;
      EXPECT_EQ(decode(rx[i].data, rx[i].len, &h), DecodeError::kNone);
      seqs.push_back(h.msg_seq);
    }
  }
  return seqs;
}

size_t count_lines(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t pos = 0; (pos = text.find(needle, pos)) != std::string::npos; pos += needle.size())
    ++n;
  return n;
}

TEST(SimNet, EndpointIdentity) {
  FakeClock clock;
  SimNet net(clock);
  const int h0 = net.add_host({});
  const int h1 = net.add_host({});
  const int h2 = net.add_host({});
  auto [a, b] = net.connect(h1, h2, 1500);
  auto [c, d] = net.connect(h2, h0, 9000, 1u << 20);
  EXPECT_EQ(testing::sim_host_of(a->local_address()), 1u);
  EXPECT_EQ(testing::sim_host_of(b->local_address()), 2u);
  EXPECT_EQ(testing::sim_host_of(d->local_address()), 0u);
  EXPECT_EQ(testing::sim_endpoint_of(b->local_address()), uint32_t(b->id()));
  EXPECT_EQ(a->local_address().kind, testing::kSimAddressKind);
  EXPECT_EQ(testing::sim_host_of(PeerAddress()), testing::kSimNoHost);
  EXPECT_EQ(a->peer_text(), "host2/ep1");
  EXPECT_EQ(b->peer_text(), "host1/ep0");
  EXPECT_EQ(c->peer_host(), "host0");
  EXPECT_EQ(a->receive_buffer_bytes(), 4u << 20);
  EXPECT_EQ(c->receive_buffer_bytes(), 1u << 20);
  EXPECT_EQ(a->max_datagram_bytes(), 1500u);
  EXPECT_EQ(c->max_datagram_bytes(), 9000u);

  // A listener has no peer: it hears anyone, learns the sender from RxPacket::from, and can
  // then answer it.
  auto listener = net.open(h0, 1500);
  EXPECT_EQ(listener->peer_text(), "");
  auto dialer = net.open(h1, 1500);
  ASSERT_TRUE(dialer->set_peer(listener->local_address()).is_ok());
  auto hello = dgrams(7, 1, 100);
  ASSERT_EQ(send_from(*dialer, hello, 0), 1);
  net.advance(1);
  RxPacket rx[4];
  ASSERT_EQ(listener->rx_burst(rx, 4), 1);
  EXPECT_EQ(rx[0].from, dialer->local_address());
  ASSERT_TRUE(listener->set_peer(rx[0].from).is_ok());
  EXPECT_EQ(dialer->id(), 5);
  EXPECT_EQ(listener->peer_text(), "host1/ep5");
  PeerAddress bogus;
  bogus.kind = 9;
  EXPECT_FALSE(listener->set_peer(bogus).is_ok());

  // Oversized datagrams are the caller's bug, as EMSGSIZE is for a socket.
  auto big = dgrams(0, 1, 1501);
  EXPECT_EQ(send_from(*a, big, 0), -EMSGSIZE);
}

// The receive queue is unbounded but measured against receive_buffer_bytes(); datagrams for a
// destroyed endpoint are counted, and an endpoint that outlives its network fails cleanly.
TEST(SimNet, ReceiveQueueAndLifetimes) {
  FakeClock clock;
  auto net = std::make_unique<SimNet>(clock);
  const int h0 = net->add_host({});
  const int h1 = net->add_host({});
  auto [a, b] = net->connect(h0, h1, 1000, 10'000);
  ASSERT_EQ(send_from(*a, dgrams(0, 25, 1000), 0), 25);
  net->advance(1);
  const auto& st = net->endpoint_stats(b->id());
  EXPECT_EQ(st.delivered_pkts, 25u);
  EXPECT_EQ(st.max_rx_queue_bytes, 25'000u);
  EXPECT_EQ(st.rx_over_buffer, 15u);  // 10 fit in 10 KB
  EXPECT_EQ(receive(*b).size(), 25u);

  ASSERT_EQ(send_from(*a, dgrams(0, 3, 1000), 0), 3);
  b.reset();  // its connection went away with datagrams on the wire
  net->advance(1);
  EXPECT_EQ(net->undeliverable_pkts(), 3u);
  EXPECT_EQ(net->endpoint_stats(1).delivered_pkts, 25u);  // stats outlive the endpoint

  net.reset();
  EXPECT_EQ(send_from(*a, dgrams(0, 1, 1000), 0), -EPIPE);
  RxPacket rx[1];
  EXPECT_EQ(a->rx_burst(rx, 1), 0);
}

// 1 Gbit/s: a 1250-byte datagram takes exactly 10 us on each link. 1000 of them sent at once
// leave the uplink every 10 us and the downlink one packet time later (store and forward).
TEST(SimNet, SerializationMatchesRate) {
  FakeClock clock;
  SimNet net(clock);
  const LinkConfig g = link_at(kGbps);
  const int h0 = net.add_host({g, g});
  const int h1 = net.add_host({g, g});
  auto [a, b] = net.connect(h0, h1, 1250);
  const uint64_t t0 = clock.now_ns();
  auto d = dgrams(0, 1000, 1250);
  ASSERT_EQ(send_from(*a, d, 0), 1000);  // an unbounded drop-tail queue takes everything

  size_t got = 0;
  net.run_until(t0 + 20 * kUs - 1);
  got += receive(*b).size();
  EXPECT_EQ(got, 0u);
  net.run_until(t0 + 20 * kUs);
  got += receive(*b).size();
  EXPECT_EQ(got, 1u);
  net.run_until(t0 + 5 * kMs);
  got += receive(*b).size();
  EXPECT_EQ(got, 499u);  // packet k is out at (k + 1) * 10 us
  net.run_until(t0 + 10 * kMs);
  got += receive(*b).size();
  EXPECT_EQ(got, 999u);  // the 1000th needs one more packet time
  net.run_until(t0 + 10 * kMs + 10 * kUs);
  got += receive(*b).size();
  EXPECT_EQ(got, 1000u);

  const auto& up = net.link_stats(h0, Dir::kUp);
  const auto& down = net.link_stats(h1, Dir::kDown);
  EXPECT_EQ(up.max_queue_bytes, 1000u * 1250);
  EXPECT_EQ(up.delay_max_ns, 999 * 10 * kUs);  // the last waited for 999 others
  EXPECT_EQ(down.max_queue_bytes, 1250u);      // the downlink is as fast: never a backlog
  EXPECT_EQ(down.delay_max_ns, 0u);
  EXPECT_EQ(down.tx_bytes, 1000u * 1250);
  EXPECT_EQ(net.endpoint_stats(b->id()).delivered_bytes, 1000u * 1250);
  EXPECT_EQ(net.endpoint_stats(a->id()).tx_pkts, 1000u);
  EXPECT_EQ(a->counters().tx_datagrams, 1000u);
  EXPECT_EQ(b->counters().rx_datagrams, 1000u);
}

// A rate that does not divide evenly keeps its exact long-run rate: 3 Gbit/s, 1000 bytes =
// 2666.67 ns each, 3000 of them = 8 ms exactly.
TEST(SimNet, FractionalSerializationKeepsTheRate) {
  FakeClock clock;
  SimNet net(clock);
  const int h0 = net.add_host({link_at(3 * kGbps), {}});
  const int h1 = net.add_host({});
  auto [a, b] = net.connect(h0, h1, 1000);
  const uint64_t t0 = clock.now_ns();
  ASSERT_EQ(send_from(*a, dgrams(0, 3000, 1000), 0), 3000);
  net.run_until(t0 + 8 * kMs - 1);
  EXPECT_EQ(receive(*b).size(), 2999u);
  net.run_until(t0 + 8 * kMs);
  EXPECT_EQ(receive(*b).size(), 1u);
}

TEST(SimNet, PropagationDelayAddsUp) {
  FakeClock clock;
  SimNet net(clock);
  // Infinite rate: only propagation, 3 us up then 5 us down.
  const int h0 = net.add_host({link_at(0, 0, 3 * kUs), {}});
  const int h1 = net.add_host({{}, link_at(0, 0, 5 * kUs)});
  // 1 Gbit/s and the same delays: 10 + 3 + 10 + 5 us for 1250 bytes.
  const int h2 = net.add_host({link_at(kGbps, 0, 3 * kUs), {}});
  const int h3 = net.add_host({{}, link_at(kGbps, 0, 5 * kUs)});
  auto [a, b] = net.connect(h0, h1, 1250);
  auto [c, d] = net.connect(h2, h3, 1250);
  const uint64_t t0 = clock.now_ns();
  ASSERT_EQ(send_from(*a, dgrams(0, 1, 1250), 0), 1);
  ASSERT_EQ(send_from(*c, dgrams(0, 1, 1250), 0), 1);
  net.run_until(t0 + 8 * kUs - 1);
  EXPECT_EQ(receive(*b).size(), 0u);
  net.run_until(t0 + 8 * kUs);
  EXPECT_EQ(receive(*b).size(), 1u);
  net.run_until(t0 + 28 * kUs - 1);
  EXPECT_EQ(receive(*d).size(), 0u);
  net.run_until(t0 + 28 * kUs);
  EXPECT_EQ(receive(*d).size(), 1u);

  // The reverse direction uses the other two links: h1's uplink (no delay) and h0's downlink.
  ASSERT_EQ(send_from(*b, dgrams(0, 1, 1250), 0), 1);
  net.advance(0);
  EXPECT_EQ(receive(*a).size(), 1u);
}

// A 10 Gbit/s uplink feeds a 1 Gbit/s downlink with a 100 KB drop-tail queue: 1000 datagrams
// arrive in 1 ms, the downlink serves 100 in that time and holds 80, the rest are dropped.
TEST(SimNet, DropTailQueueOverflows) {
  FakeClock clock;
  SimNet net(clock);
  const int h0 = net.add_host({link_at(10 * kGbps), {}});
  const int h1 = net.add_host({{}, link_at(kGbps, 100'000)});
  auto [a, b] = net.connect(h0, h1, 1250);
  net.set_log(true);
  ASSERT_EQ(send_from(*a, dgrams(0, 1000, 1250), 0), 1000);
  net.advance(20 * kMs);
  const auto seqs = receive(*b);
  const auto& down = net.link_stats(h1, Dir::kDown);
  EXPECT_EQ(down.drop_pkts + seqs.size(), 1000u);
  EXPECT_EQ(down.drop_bytes, down.drop_pkts * 1250);
  // About 80 held + 100 served over the 1 ms of arrivals.
  EXPECT_GE(seqs.size(), 170u);
  EXPECT_LE(seqs.size(), 190u);
  EXPECT_EQ(down.max_queue_bytes, 100'000u);  // full, never over
  EXPECT_EQ(down.enq_pkts, seqs.size());
  // A full 80-packet queue at 10 us each: the last admitted waited 79 packet times.
  EXPECT_EQ(down.delay_max_ns, 790 * kUs);
  EXPECT_GT(down.mean_delay_ns(), 500.0 * kUs);
  for (size_t i = 1; i < seqs.size(); ++i) ASSERT_LT(seqs[i - 1], seqs[i]);  // FIFO
  EXPECT_EQ(net.link_stats(h0, Dir::kUp).drop_pkts, 0u);
  EXPECT_EQ(count_lines(net.log(), "(queue full) at h1.down"), down.drop_pkts);
  EXPECT_EQ(count_lines(net.log(), " ms h0->h1 DATA"), 1000u);
}

// Lossless on both hops: the uplink's queue (16 datagrams) fills because the downlink pauses
// it, tx_burst takes fewer than asked, and every datagram arrives, in order, with the 1 Gbit/s
// bottleneck busy all along.
TEST(SimNet, LosslessBackPressuresTheSender) {
  FakeClock clock;
  SimNet net(clock);
  const int h0 = net.add_host({link_at(10 * kGbps, 20'000, 0, LinkMode::kLossless), {}});
  const int h1 = net.add_host({{}, link_at(kGbps, 100'000, 2 * kUs, LinkMode::kLossless)});
  auto [a, b] = net.connect(h0, h1, 1250);
  const uint64_t t0 = clock.now_ns();
  const auto d = dgrams(0, 2000, 1250);
  size_t sent = 0;
  int short_bursts = 0;
  std::vector<uint32_t> seqs;
  while (seqs.size() < d.size() && clock.now_ns() < t0 + 100 * kMs) {
    const size_t want = std::min<size_t>(32, d.size() - sent);
    const int took = send_from(*a, d, sent, want);
    ASSERT_GE(took, 0);
    if (size_t(took) < want) ++short_bursts;
    sent += size_t(took);
    net.advance(1 * kUs);
    const auto r = receive(*b);
    seqs.insert(seqs.end(), r.begin(), r.end());
  }
  ASSERT_EQ(seqs.size(), d.size());
  for (size_t i = 0; i < seqs.size(); ++i) ASSERT_EQ(seqs[i], i);
  const auto& up = net.link_stats(h0, Dir::kUp);
  const auto& down = net.link_stats(h1, Dir::kDown);
  EXPECT_GT(short_bursts, 100);
  EXPECT_EQ(a->counters().tx_would_block, uint64_t(short_bursts));
  EXPECT_GT(up.refused_pkts, 0u);
  EXPECT_GT(up.pauses, 0u);
  EXPECT_GT(up.paused_ns, 10 * kMs);  // the uplink is 10x faster: paused most of the time
  EXPECT_EQ(up.drop_pkts + up.loss_pkts + down.drop_pkts + down.loss_pkts, 0u);
  EXPECT_LE(up.max_queue_bytes, 20'000u);
  EXPECT_LE(down.max_queue_bytes, 100'000u);
  EXPECT_GE(down.max_queue_bytes, 90'000u);  // the pause keeps the downlink queue near full
  // 2000 x 10 us at the bottleneck, plus the start and the last datagram's trip.
  const uint64_t took_ns = clock.now_ns() - t0;
  EXPECT_GE(took_ns, 20 * kMs);
  EXPECT_LE(took_ns, 20 * kMs + 20 * kUs);
}

// Three senders pausing one lossless downlink get it in turn: equal shares, nothing lost.
TEST(SimNet, LosslessIncastSharesThePause) {
  FakeClock clock;
  SimNet net(clock);
  const int rx_host = net.add_host({{}, link_at(kGbps, 50'000, 0, LinkMode::kLossless)});
  std::vector<std::unique_ptr<SimEndpoint>> tx, rx;
  for (int i = 0; i < 3; ++i) {
    const int h = net.add_host({link_at(10 * kGbps, 0), {}});
    auto [s, r] = net.connect(h, rx_host, 1250);
    tx.push_back(std::move(s));
    rx.push_back(std::move(r));
    ASSERT_EQ(send_from(*tx.back(), dgrams(0, 400, 1250), 0), 400);
  }
  net.advance(6 * kMs);  // 600 of the 1200 datagrams
  std::vector<size_t> got;
  for (auto& r : rx) {
    got.push_back(receive(*r).size());
    EXPECT_GE(got.back(), 195u);
    EXPECT_LE(got.back(), 205u);
  }
  net.advance(7 * kMs);
  for (size_t i = 0; i < rx.size(); ++i) EXPECT_EQ(got[i] + receive(*rx[i]).size(), 400u);
  EXPECT_EQ(net.link_stats(rx_host, Dir::kDown).drop_pkts, 0u);
  EXPECT_LE(net.link_stats(rx_host, Dir::kDown).max_queue_bytes, 50'000u);
}

TEST(SimNet, RandomLossFollowsItsProbabilityAndSeed) {
  auto run = [](uint64_t seed) {
    FakeClock clock;
    SimNet net(clock, seed);
    const int h0 = net.add_host({});
    const int h1 = net.add_host({{}, link_at(0, 0, 0, LinkMode::kDropTail, 0.1)});
    auto [a, b] = net.connect(h0, h1, 100);
    net.set_log(true);
    const auto d = dgrams(0, 20'000, 100);
    EXPECT_EQ(send_from(*a, d, 0), 20'000);
    net.advance(1);
    const auto seqs = receive(*b);
    const auto& down = net.link_stats(h1, Dir::kDown);
    EXPECT_EQ(down.loss_pkts + seqs.size(), 20'000u);
    EXPECT_EQ(count_lines(net.log(), "(random loss) at h1.down"), down.loss_pkts);
    EXPECT_EQ(down.drop_pkts, 0u);
    return seqs;
  };
  const auto s1 = run(42), s2 = run(42), s3 = run(43);
  // 10% of 20000: 2000 +- 42 (one standard deviation); five of them either way.
  EXPECT_GE(20'000 - s1.size(), 1790u);
  EXPECT_LE(20'000 - s1.size(), 2210u);
  EXPECT_EQ(s1, s2);  // the same seed loses the same datagrams
  EXPECT_NE(s1, s3);
}

// Three senders at line rate into one 1 Gbit/s downlink: 3x oversubscribed, FIFO interleaves
// them, so each gets a third and the queue holds what the senders got ahead.
TEST(SimNet, IncastSharesTheDownlink) {
  FakeClock clock;
  SimNet net(clock);
  const LinkConfig g = link_at(kGbps);
  const int rx_host = net.add_host({g, g});
  std::vector<std::unique_ptr<SimEndpoint>> tx, rx;
  for (int i = 0; i < 3; ++i) {
    const int h = net.add_host({g, g});
    auto [s, r] = net.connect(h, rx_host, 1250);
    tx.push_back(std::move(s));
    rx.push_back(std::move(r));
  }
  const uint64_t t0 = clock.now_ns();
  for (auto& s : tx) ASSERT_EQ(send_from(*s, dgrams(0, 300, 1250), 0), 300);
  net.run_until(t0 + 4500 * kUs);  // 449 served
  uint64_t total = 0;
  for (auto& r : rx) {
    const uint64_t b = net.endpoint_stats(r->id()).delivered_bytes;
    total += b;
    EXPECT_GE(b, 149u * 1250);
    EXPECT_LE(b, 151u * 1250);
  }
  EXPECT_EQ(total, 449u * 1250);
  net.run_until(t0 + 9 * kMs + 10 * kUs);  // 900 packet times plus the uplink's first one
  for (auto& r : rx) EXPECT_EQ(receive(*r).size(), 300u);
  const auto& down = net.link_stats(rx_host, Dir::kDown);
  // The senders finish at 3 ms, when the downlink has served 299 of 900.
  EXPECT_GE(down.max_queue_bytes, 599u * 1250);
  EXPECT_LE(down.max_queue_bytes, 602u * 1250);
  EXPECT_GE(down.delay_max_ns, 5980 * kUs);
  EXPECT_LE(down.delay_max_ns, 6010 * kUs);
  EXPECT_EQ(down.drop_pkts, 0u);
}

// Two connections between the same hosts share both links: each gets half.
TEST(SimNet, ConnectionsBetweenTheSameHostsShareLinks) {
  FakeClock clock;
  SimNet net(clock);
  const LinkConfig g = link_at(kGbps);
  const int h0 = net.add_host({g, g});
  const int h1 = net.add_host({g, g});
  auto [a1, b1] = net.connect(h0, h1, 1250);
  auto [a2, b2] = net.connect(h0, h1, 1250);
  const uint64_t t0 = clock.now_ns();
  const auto d = dgrams(0, 200, 1250);
  for (size_t i = 0; i < d.size(); ++i) {  // interleaved, as two connections polled in turn
    ASSERT_EQ(send_from(*a1, d, i, 1), 1);
    ASSERT_EQ(send_from(*a2, d, i, 1), 1);
  }
  net.run_until(t0 + 2 * kMs + 10 * kUs);  // 200 of the 400
  EXPECT_EQ(receive(*b1).size(), 100u);
  EXPECT_EQ(receive(*b2).size(), 100u);
  net.run_until(t0 + 4 * kMs + 10 * kUs);
  EXPECT_EQ(receive(*b1).size(), 100u);
  EXPECT_EQ(receive(*b2).size(), 100u);
}

TEST(SimNet, LogPrintsDecodedLines) {
  FakeClock clock;
  SimNet net(clock);
  const int h0 = net.add_host({});
  const int h1 = net.add_host({{}, link_at(kGbps, 1500)});
  auto [a, b] = net.connect(h1, h0, 2048);
  auto [c, d] = net.connect(h0, h1, 2048);
  net.set_log(true);
  net.advance(1'234'567);

  auto send_hdr = [](SimEndpoint& ep, const PacketHeader& h) {
    std::vector<uint8_t> buf(kHeaderBytes + h.payload_len);
    encode(h, buf.data());
    TxPacket p;
    p.hdr = buf.data();
    p.hdr_len = kHeaderBytes;
    p.payload = buf.data() + kHeaderBytes;
    p.payload_len = h.payload_len;
    return ep.tx_burst(&p, 1);
  };
  PacketHeader h;
  h.type = PacketType::kData;
  h.flags = kFlagTail | kFlagBounded;
  h.msg_seq = 3;
  h.offset = 8192;
  h.payload_len = 1000;
  h.msg_size = 1 << 20;
  ASSERT_EQ(send_hdr(*a, h), 1);
  EXPECT_EQ(net.log(), "  1.234567 ms h1->h0 DATA seq=3 off=8192 len=1000 flags=B,T\n");
  net.clear_log();
  EXPECT_EQ(net.log(), "");

  PacketHeader cts;
  cts.type = PacketType::kCts;
  cts.msg_seq = 4;
  cts.msg_size = 65536;
  cts.msg_floor = 2;
  cts.flags = kFlagExact;
  ASSERT_EQ(send_hdr(*b, cts), 1);
  PacketHeader ack;
  ack.type = PacketType::kAck;
  ack.flags = kFlagFinal;
  ack.msg_seq = 4;
  ack.offset = 64;
  ack.msg_size = 66;
  ack.payload_len = 16;
  ASSERT_EQ(send_hdr(*b, ack), 1);
  PacketHeader ping;
  ping.type = PacketType::kPing;
  ASSERT_EQ(send_hdr(*b, ping), 1);
  PacketHeader hello;
  hello.type = PacketType::kHello;
  hello.payload_len = kHelloBodyBytes;
  std::vector<uint8_t> hbuf(kHeaderBytes + kHelloBodyBytes);
  encode(hello, hbuf.data());
  HelloBody body;
  body.max_datagram_bytes = 2048;
  body.window_bytes = 1 << 20;
  body.features = kFeatureBounded;
  encode_hello(body, hbuf.data() + kHeaderBytes);
  TxPacket hp;
  hp.hdr = hbuf.data();
  hp.hdr_len = uint32_t(hbuf.size());
  ASSERT_EQ(b->tx_burst(&hp, 1), 1);
  EXPECT_NE(net.log().find(" ms h0->h1 CTS seq=4 cap=65536 floor=2 flags=X\n"), std::string::npos)
      << net.log();
  EXPECT_NE(net.log().find(" ms h0->h1 ACK seq=4 base=64 pkts=66 floor=0 sack=16 flags=F\n"),
            std::string::npos)
      << net.log();
  EXPECT_NE(net.log().find(" ms h0->h1 PING\n"), std::string::npos) << net.log();
  EXPECT_NE(net.log().find(" ms h0->h1 HELLO dgram=2048 window=1048576 features=0x1\n"),
            std::string::npos)
      << net.log();

  // A type and a flag this file does not know (the protocol grows): printed from raw fields.
  std::vector<uint8_t> raw(kHeaderBytes + 8);
  PacketHeader future;
  future.type = PacketType::kData;
  future.msg_seq = 9;
  future.payload_len = 8;
  future.msg_size = 8;
  encode(future, raw.data());
  raw[3] = 9;
  raw[4] = 0x40 | kFlagRetx;
  TxPacket p;
  p.hdr = raw.data();
  p.hdr_len = uint32_t(raw.size());
  net.clear_log();
  ASSERT_EQ(c->tx_burst(&p, 1), 1);
  EXPECT_NE(net.log().find("h0->h1 TYPE9 seq=9 off=0 len=8 size=8 floor=0 flags=R,0x40\n"),
            std::string::npos)
      << net.log();
  EXPECT_EQ(testing::sim_describe(raw.data(), 20), "opaque len=20");

  // The 1500-byte downlink queue holds one of two back-to-back datagrams; the other is a DROP.
  net.clear_log();
  PacketHeader data;
  data.type = PacketType::kData;
  data.payload_len = 1000;
  data.msg_size = 2000;
  ASSERT_EQ(send_hdr(*c, data), 1);
  data.offset = 1000;
  data.flags = kFlagRetx;
  ASSERT_EQ(send_hdr(*c, data), 1);
  net.advance(100 * kUs);
  EXPECT_NE(net.log().find(
                " ms DROP h0->h1 DATA seq=0 off=1000 len=1000 flags=R (queue full) at h1.down\n"),
            std::string::npos)
      << net.log();
  EXPECT_EQ(count_lines(net.log(), "\n"), 3u);
}

// An on-off source of 50 KB bursts at 10 Gbit/s every ms through a 1 Gbit/s downlink: each
// burst builds ~46 KB of queue that takes ~0.4 ms to drain; a datagram sent into a burst waits
// for it, one sent between bursts does not. Bursts larger than the queue lose the excess.
TEST(SimNet, CrossTrafficOccupiesTheQueue) {
  FakeClock clock;
  SimNet net(clock);
  const int h0 = net.add_host({{}, link_at(kGbps, 100'000)});
  const int h1 = net.add_host({link_at(10 * kGbps), {}});
  const int h2 = net.add_host({link_at(10 * kGbps), {}});
  auto [a, b] = net.connect(h1, h0, 1250);
  const uint64_t t0 = clock.now_ns();
  const int x = net.add_cross_traffic(h2, h0, 10 * kGbps, 50'000, 1 * kMs, 1250);

  // Between bursts (0.6 ms after one started): 1 us up, 10 us down.
  net.run_until(t0 + 600 * kUs);
  ASSERT_EQ(send_from(*a, dgrams(0, 1, 1250), 0), 1);
  net.run_until(t0 + 611 * kUs);
  EXPECT_EQ(receive(*b).size(), 1u);
  // Into a burst (0.05 ms after the second one started): behind ~45 KB of filler.
  net.run_until(t0 + 1050 * kUs);
  ASSERT_EQ(send_from(*a, dgrams(1, 1, 1250), 0), 1);
  net.run_until(t0 + 1300 * kUs);
  EXPECT_EQ(receive(*b).size(), 0u);
  net.run_until(t0 + 1500 * kUs);
  EXPECT_EQ(receive(*b).size(), 1u);

  net.run_until(t0 + 10 * kMs - 1);  // bursts at 0, 1, ..., 9 ms; the last drains by 9.41 ms
  const auto& cs = net.cross_stats(x);
  EXPECT_EQ(cs.offered_bytes, 10u * 50'000);
  EXPECT_EQ(cs.delivered_bytes, 10u * 50'000);
  EXPECT_EQ(cs.dropped_bytes, 0u);
  const auto& down = net.link_stats(h0, Dir::kDown);
  EXPECT_GE(down.max_queue_bytes, 45'000u);
  EXPECT_LE(down.max_queue_bytes, 50'000u);
  EXPECT_GE(down.delay_max_ns, 350 * kUs);
  EXPECT_LE(down.delay_max_ns, 400 * kUs);
  EXPECT_EQ(net.endpoint_stats(b->id()).delivered_pkts, 2u);  // filler reaches no endpoint

  // 200 KB bursts overflow the 100 KB queue: what does not fit is the cross traffic's loss.
  net.stop_cross_traffic(x);
  net.advance(1 * kMs);
  const int y = net.add_cross_traffic(h2, h0, 10 * kGbps, 200'000, 2 * kMs, 1250);
  net.advance(10 * kMs - 1);  // bursts at 0, 2, ..., 8 ms
  const auto& ys = net.cross_stats(y);
  EXPECT_EQ(ys.offered_bytes, 5u * 200'000);
  EXPECT_EQ(ys.delivered_bytes + ys.dropped_bytes, ys.offered_bytes);
  EXPECT_GT(ys.dropped_bytes, 5u * 80'000);  // of each 200 KB: ~110 KB fit, the rest is lost
  EXPECT_LT(ys.dropped_bytes, 5u * 100'000);
  EXPECT_EQ(down.max_queue_bytes, 100'000u);
}

// A link changed mid-run (a straggler's downlink drops to a tenth) changes the next packets'
// serialization, not the one on the wire.
TEST(SimNet, LinkChangesTakeEffectForTheNextPacket) {
  FakeClock clock;
  SimNet net(clock);
  const int h0 = net.add_host({});
  const int h1 = net.add_host({{}, link_at(10 * kGbps)});
  auto [a, b] = net.connect(h0, h1, 1250);
  const uint64_t t0 = clock.now_ns();
  ASSERT_EQ(send_from(*a, dgrams(0, 10, 1250), 0), 10);  // 1 us each
  net.run_until(t0 + 4500);
  EXPECT_EQ(receive(*b).size(), 4u);
  LinkConfig slow = net.link_config(h1, Dir::kDown);
  slow.rate_bps = kGbps;
  net.set_link(h1, Dir::kDown, slow);
  net.run_until(t0 + 5 * kUs);  // the fifth was on the wire at the old rate
  EXPECT_EQ(receive(*b).size(), 1u);
  net.run_until(t0 + 55 * kUs - 1);
  EXPECT_EQ(receive(*b).size(), 4u);
  net.run_until(t0 + 55 * kUs);  // the other five at 10 us each
  EXPECT_EQ(receive(*b).size(), 1u);
}

// A constant-rate source (period 0) takes its share of a bottleneck from a saturating flow.
TEST(SimNet, ConstantCrossTrafficTakesItsShare) {
  FakeClock clock;
  SimNet net(clock);
  const int h0 = net.add_host({{}, link_at(kGbps, 0)});
  const int h1 = net.add_host({link_at(kGbps), {}});
  const int h2 = net.add_host({link_at(kGbps), {}});
  auto [a, b] = net.connect(h1, h0, 1250);
  const int x = net.add_cross_traffic(h2, h0, kGbps / 4, 1250, 0, 1250);
  const auto d = dgrams(0, 1000, 1250);
  ASSERT_EQ(send_from(*a, d, 0), 1000);  // 10 ms at 1 Gbit/s alone
  net.advance(10 * kMs);
  // 1.25 Gbit/s offered to 1 Gbit/s: after 10 ms the flow has 4/5 of what was served.
  const double flow = double(net.endpoint_stats(b->id()).delivered_bytes);
  const double cross = double(net.cross_stats(x).delivered_bytes);
  EXPECT_NEAR(flow / (flow + cross), 0.8, 0.01);
  EXPECT_NEAR(flow + cross, 1.25e6, 2 * 1250);
}

// A real exact connection carried by the simulator: byte-exact, no faster than the bottleneck
// allows, and still exact when the bottleneck queue overflows and the wire loses packets.
struct ConnRig {
  FakeClock clock;
  SimNet net{clock};
  Config cfg;
  std::unique_ptr<SendConn> s;
  std::unique_ptr<RecvConn> r;
  int tx_host = 0, rx_host = 0;
  int tx_ep = 0, rx_ep = 0;

  ConnRig(const HostLink& sender, const HostLink& receiver, uint32_t dgram) {
    tx_host = net.add_host(sender);
    rx_host = net.add_host(receiver);
    auto [a, b] = net.connect(tx_host, rx_host, dgram);
    tx_ep = a->id();
    rx_ep = b->id();
    ConnParams cp;
    cp.token = 0x5151;
    cp.pkt_payload = payload_for_datagram(dgram);
    cp.peer_window = b->receive_buffer_bytes();
    s = std::make_unique<SendConn>(cfg, clock, std::move(a), cp, nullptr);
    r = std::make_unique<RecvConn>(cfg, clock, std::move(b), cp, nullptr);
  }

  // Moves `src` to a fresh buffer; returns the simulated time it took, or 0 on failure.
  uint64_t transfer(const std::vector<uint8_t>& src, std::vector<uint8_t>* dst,
                    uint64_t step_ns = 5 * kUs, uint64_t limit_ns = 2'000 * kMs) {
    dst->assign(src.size(), 0);
    Request *sr = nullptr, *rr = nullptr;
    EXPECT_TRUE(r->irecv(dst->data(), dst->size(), &rr).is_ok());
    EXPECT_TRUE(s->isend(src.data(), src.size(), &sr).is_ok());
    const uint64_t t0 = clock.now_ns();
    bool sd = false, rd = false;
    while (!(sd && rd) && clock.now_ns() - t0 < limit_ns) {
      size_t sz = 0;
      if (!sd) {
        EXPECT_TRUE(s->test(sr, &sd, &sz).is_ok());
      }
      if (!rd) {
        EXPECT_TRUE(r->test(rr, &rd, &sz).is_ok());
      }
      s->poll();
      r->poll();
      net.advance(step_ns);
    }
    return sd && rd ? clock.now_ns() - t0 : 0;
  }
};

TEST(SimNetConn, ExactTransferIsByteExactAtTheLinkRate) {
  const LinkConfig l = link_at(10 * kGbps, 1 << 20, 5 * kUs);
  ConnRig rig({l, l}, {l, l}, 9000);
  const auto src = pattern(4 << 20, 1);
  std::vector<uint8_t> dst;
  const uint64_t took = rig.transfer(src, &dst);
  ASSERT_GT(took, 0u);
  EXPECT_EQ(src, dst);
  // 4 MiB at 10 Gbit/s is 3.36 ms of serialization; the protocol may not beat it.
  EXPECT_GE(took, 3'355 * kUs);
  const auto& st = rig.net.endpoint_stats(rig.rx_ep);
  EXPECT_GE(st.delivered_bytes, uint64_t(4 << 20));
  EXPECT_EQ(rig.net.link_stats(rig.rx_host, Dir::kDown).drop_pkts, 0u);
  std::printf("4 MiB over 10 Gbit/s, 10 us RTT: %.3f ms simulated, %.2f Gbit/s goodput\n",
              double(took) / 1e6, double(src.size()) * 8 / double(took));
}

TEST(SimNetConn, ExactTransferSurvivesOverflowAndLoss) {
  // 10 Gbit/s sender into a 1 Gbit/s, 64 KB drop-tail downlink that also loses 1%.
  const LinkConfig fast = link_at(10 * kGbps, 1 << 20, 5 * kUs);
  const LinkConfig slow = link_at(kGbps, 64 << 10, 5 * kUs, LinkMode::kDropTail, 0.01);
  ConnRig rig({fast, fast}, {fast, slow}, 1500);
  const auto src = pattern(2 << 20, 2);
  std::vector<uint8_t> dst;
  const uint64_t took = rig.transfer(src, &dst);
  ASSERT_GT(took, 0u);
  EXPECT_EQ(src, dst);
  EXPECT_GE(took, 16'700 * kUs);  // 2 MiB at 1 Gbit/s
  const auto& down = rig.net.link_stats(rig.rx_host, Dir::kDown);
  EXPECT_GT(down.loss_pkts, 0u);
  EXPECT_GT(rig.s->stats().retx_pkts, 0u);
  std::printf(
      "2 MiB through 1 Gbit/s, 64 KB queue, 1%% loss: %.3f ms simulated, %llu queue drops, "
      "%llu random losses, %llu retransmissions\n",
      double(took) / 1e6, static_cast<unsigned long long>(down.drop_pkts),
      static_cast<unsigned long long>(down.loss_pkts),
      static_cast<unsigned long long>(rig.s->stats().retx_pkts));
}

// Same inputs, same run: every event is ordered by (time, sequence) and every draw is seeded.
TEST(SimNet, RunsAreDeterministic) {
  auto run = [] {
    FakeClock clock;
    SimNet net(clock, 7);
    const int h0 = net.add_host({{}, link_at(kGbps, 30'000, 1 * kUs, LinkMode::kDropTail, 0.02)});
    const int h1 = net.add_host({link_at(10 * kGbps, 0, 1 * kUs), {}});
    const int h2 = net.add_host({link_at(10 * kGbps, 0, 1 * kUs), {}});
    auto [a, b] = net.connect(h1, h0, 1250);
    auto [c, d] = net.connect(h2, h0, 1250);
    net.add_cross_traffic(h2, h0, 5 * kGbps, 20'000, 300 * kUs, 1000);
    net.set_log(true);
    for (int i = 0; i < 50; ++i) {
      send_from(*a, dgrams(uint32_t(i) * 10, 10, 1250), 0);
      send_from(*c, dgrams(uint32_t(i) * 10, 7, 1250), 0);
      net.advance(37 * kUs);
      receive(*b);
      receive(*d);
    }
    return net.log() + std::to_string(net.link_stats(h0, Dir::kDown).drop_pkts) + "/" +
           std::to_string(net.link_stats(h0, Dir::kDown).delay_sum_ns);
  };
  const std::string first = run();
  EXPECT_GT(count_lines(first, "DROP"), 10u);
  EXPECT_EQ(first, run());
}

// 100 MB in 1500-byte datagrams through 100 Gbit/s links: per-packet work only, so this stays
// far below a second of real time.
TEST(SimNet, HundredMegabytesIsQuick) {
  FakeClock clock;
  SimNet net(clock);
  const LinkConfig l = link_at(100 * kGbps, 1 << 20, 2 * kUs);
  const int h0 = net.add_host({l, l});
  const int h1 = net.add_host({l, l});
  auto [a, b] = net.connect(h0, h1, 1500);
  std::vector<uint8_t> payload(1500 - kHeaderBytes, 0x5A);
  const auto hdr = data_dgram(0, 1500);
  TxPacket burst[64];
  for (auto& p : burst) {
    p.hdr = hdr.data();
    p.hdr_len = kHeaderBytes;
    p.payload = payload.data();
    p.payload_len = uint32_t(payload.size());
  }
  const uint64_t total = 100'000'000, per_burst = 64 * 1500;
  const auto wall0 = std::chrono::steady_clock::now();
  uint64_t sent = 0;
  RxPacket rx[64];
  while (net.endpoint_stats(b->id()).delivered_bytes < total) {
    if (sent < total) sent += uint64_t(a->tx_burst(burst, 64)) * 1500;
    net.advance(per_burst * 8 / 100);  // one burst's time at 100 Gbit/s: 7.68 us
    while (b->rx_burst(rx, 64) > 0) {
    }
  }
  const double wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  EXPECT_EQ(net.endpoint_stats(b->id()).delivered_bytes, sent);
  EXPECT_EQ(net.link_stats(h1, Dir::kDown).drop_pkts, 0u);
  std::printf("100 MB through the simulator: %.3f s of real time, %.3f ms simulated\n", wall_s,
              double(net.elapsed_ns()) / 1e6);
  EXPECT_LT(wall_s, 5.0);  // generous: sanitizer builds run this too
}

}  // namespace
}  // namespace optireduce
