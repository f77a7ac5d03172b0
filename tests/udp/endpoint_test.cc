// Tests of udp/endpoint.cc on loopback (127.0.0.1, ::1): bursts both ways, GSO on and off, GRO
// splitting, back-pressure, truncation, peer filtering, unreachable peers, size limits, and the
// unbound endpoint's sends per destination and unreachable reports per destination.
#include "udp/endpoint.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "tests/udp/net_admin.h"
#include "tests/warn_capture.h"

namespace optireduce {
namespace {

constexpr uint32_t kLoMtu = 65536;

std::unique_ptr<UdpEndpoint> open_v4(EndpointOptions opts = {}, uint32_t mtu = kLoMtu) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::unique_ptr<UdpEndpoint> ep;
  const Status s = UdpEndpoint::open(reinterpret_cast<const sockaddr*>(&a), mtu, opts, &ep);
  EXPECT_TRUE(s) << errc_name(s.code()) << " errno " << s.sys_errno();
  return ep;
}

std::unique_ptr<UdpEndpoint> open_v6(EndpointOptions opts = {}, uint32_t mtu = kLoMtu) {
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  a.sin6_addr = in6addr_loopback;
  std::unique_ptr<UdpEndpoint> ep;
  if (!UdpEndpoint::open(reinterpret_cast<const sockaddr*>(&a), mtu, opts, &ep)) return nullptr;
  return ep;
}

void pair_up(UdpEndpoint& a, UdpEndpoint& b) {
  ASSERT_TRUE(a.set_peer(b.local_address()));
  ASSERT_TRUE(b.set_peer(a.local_address()));
}

// A datagram of the tests: a 16-byte header (sequence number, total length, salt) and a
// payload whose every byte is a function of (sequence, position), so that any misplaced or
// reassembled byte shows.
struct TestHeader {
  uint32_t seq;
  uint32_t total_len;
  uint64_t salt;
};

uint8_t pattern(uint32_t seq, uint32_t i) {
  return static_cast<uint8_t>(seq * 131u + i * 7u + 1u);
}

class Outbox {
 public:
  // Adds a datagram of `len` bytes in all (len >= sizeof(TestHeader)).
  void add(uint32_t len) {
    const uint32_t seq = static_cast<uint32_t>(hdrs_.size());
    hdrs_.push_back(TestHeader{seq, len, 0x5A5A5A5A5A5A5A5Aull});
    std::vector<uint8_t> payload(len - sizeof(TestHeader));
    for (uint32_t i = 0; i < payload.size(); ++i) payload[i] = pattern(seq, i);
    payloads_.push_back(std::move(payload));
  }
  std::vector<TxPacket> packets() const {
    std::vector<TxPacket> out;
    for (size_t i = 0; i < hdrs_.size(); ++i)
      out.push_back(TxPacket{&hdrs_[i], sizeof(TestHeader),
                             static_cast<uint32_t>(payloads_[i].size()), payloads_[i].data()});
    return out;
  }
  size_t size() const { return hdrs_.size(); }

 private:
  std::vector<TestHeader> hdrs_;
  std::vector<std::vector<uint8_t>> payloads_;
};

// Sends every packet, retrying short counts for at most a second.
void send_all(UdpEndpoint& ep, const std::vector<TxPacket>& pkts) {
  size_t done = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (done < pkts.size() && std::chrono::steady_clock::now() < deadline) {
    const int r = ep.tx_burst(pkts.data() + done, static_cast<int>(pkts.size() - done));
    ASSERT_GE(r, 0) << std::strerror(-r);
    done += static_cast<size_t>(r);
  }
  ASSERT_EQ(done, pkts.size());
}

// send_all through tx_burst_to.
void send_all_to(UdpEndpoint& ep, const PeerAddress& to, const std::vector<TxPacket>& pkts) {
  size_t done = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (done < pkts.size() && std::chrono::steady_clock::now() < deadline) {
    const int r = ep.tx_burst_to(to, pkts.data() + done, static_cast<int>(pkts.size() - done));
    ASSERT_GE(r, 0) << std::strerror(-r);
    done += static_cast<size_t>(r);
  }
  ASSERT_EQ(done, pkts.size());
}

// Receives until `want` datagrams arrived or a second passed; copies them out. With guesses
// (rx_burst_guessed), each datagram is reassembled from its header and where its payload went,
// and *placed counts those whose payload went to their guess.
std::vector<std::vector<uint8_t>> receive(UdpEndpoint& ep, size_t want, int max_per_call = 64,
                                          const RxGuesses* g = nullptr, int* placed = nullptr) {
  std::vector<std::vector<uint8_t>> got;
  std::vector<RxPacket> rx(static_cast<size_t>(max_per_call));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (got.size() < want && std::chrono::steady_clock::now() < deadline) {
    const int r = g != nullptr ? ep.rx_burst_guessed(rx.data(), max_per_call, *g)
                               : ep.rx_burst(rx.data(), max_per_call);
    EXPECT_GE(r, 0) << std::strerror(-r);
    if (r < 0) break;
    if (r == 0) {
      pollfd p{ep.fd(), POLLIN, 0};
      (void)::poll(&p, 1, 10);
      continue;
    }
    for (int i = 0; i < r; ++i) {
      const RxPacket& p = rx[i];
      std::vector<uint8_t> d(p.data, p.data + p.len);
      if (p.rest != nullptr) {
        EXPECT_NE(g, nullptr);
        if (g == nullptr) break;
        EXPECT_EQ(p.room, p.data + g->split);
        EXPECT_LE(p.placed, p.len - g->split);
        EXPECT_EQ(p.rest, g->g[p.guess].dst);
        std::memcpy(d.data() + g->split, p.rest, p.placed);
        ++*placed;
      }
      got.push_back(std::move(d));
    }
  }
  return got;
}

// Checks that `got` holds each of `n` datagrams exactly once, byte for byte, and returns them
// by sequence number. Loopback keeps order in practice, but the test does not depend on it.
void expect_intact(const std::vector<std::vector<uint8_t>>& got, size_t n) {
  ASSERT_EQ(got.size(), n);
  std::map<uint32_t, const std::vector<uint8_t>*> by_seq;
  for (const auto& d : got) {
    ASSERT_GE(d.size(), sizeof(TestHeader));
    TestHeader h;
    std::memcpy(&h, d.data(), sizeof(h));
    ASSERT_EQ(h.total_len, d.size()) << "datagram boundary moved (seq " << h.seq << ")";
    ASSERT_EQ(h.salt, 0x5A5A5A5A5A5A5A5Aull);
    ASSERT_TRUE(by_seq.emplace(h.seq, &d).second) << "seq " << h.seq << " twice";
    for (uint32_t i = 0; i < d.size() - sizeof(TestHeader); ++i)
      ASSERT_EQ(d[sizeof(TestHeader) + i], pattern(h.seq, i)) << "seq " << h.seq << " byte " << i;
  }
  ASSERT_EQ(by_seq.size(), n);
  EXPECT_EQ(by_seq.rbegin()->first, n - 1);
}

TEST(UdpEndpoint, ExchangesBurstsBothWays) {
  auto a = open_v4();
  auto b = open_v4();
  pair_up(*a, *b);
  Outbox ab, ba;
  for (uint32_t i = 0; i < 300; ++i) ab.add(16 + (i * 997) % 9000);
  for (uint32_t i = 0; i < 100; ++i) ba.add(16 + (i * 131) % 60000);
  send_all(*a, ab.packets());
  send_all(*b, ba.packets());
  expect_intact(receive(*b, ab.size()), ab.size());
  expect_intact(receive(*a, ba.size()), ba.size());
  EXPECT_EQ(a->counters().tx_datagrams, 300u);
  EXPECT_EQ(b->counters().rx_datagrams, 300u);
  EXPECT_EQ(a->counters().rx_datagrams, 100u);
}

TEST(UdpEndpoint, NothingWaitingReturnsZero) {
  auto a = open_v4();
  RxPacket rx[4];
  EXPECT_EQ(a->rx_burst(rx, 4), 0);
  EXPECT_EQ(a->rx_burst(rx, 0), 0);
}

TEST(UdpEndpoint, SendWithoutPeerIsRefused) {
  auto a = open_v4();
  const uint8_t byte = 1;
  const TxPacket p{&byte, 1, 0, nullptr};
  EXPECT_EQ(a->tx_burst(&p, 1), -EDESTADDRREQ);
}

class UdpGso : public ::testing::TestWithParam<bool> {};

TEST_P(UdpGso, PreservesBoundariesAndBytes) {
  EndpointOptions tx_opts;
  tx_opts.gso = GetParam();
  EndpointOptions rx_opts;
  rx_opts.gro = false;  // the kernel must hand over datagrams one by one
  auto a = open_v4(tx_opts);
  auto b = open_v4(rx_opts);
  pair_up(*a, *b);
  Outbox out;
  // Runs of equal sizes, a shorter datagram ending a run, single odd sizes, a run longer
  // than one GSO message, and a run whose total exceeds 64 KiB.
  for (int i = 0; i < 100; ++i) out.add(1400);
  out.add(700);
  for (int i = 0; i < 29; ++i) out.add(1400);
  out.add(33);
  out.add(5000);
  for (int i = 0; i < 20; ++i) out.add(9000);
  out.add(16);
  send_all(*a, out.packets());
  expect_intact(receive(*b, out.size()), out.size());
  if (GetParam() && a->gso_active()) {
    EXPECT_GT(a->udp_counters().gso_sends, 0u);
  } else {
    EXPECT_EQ(a->udp_counters().gso_sends, 0u);
  }
  EXPECT_EQ(a->counters().tx_datagrams, out.size());
  EXPECT_EQ(b->udp_counters().gro_receives, 0u);
}

INSTANTIATE_TEST_SUITE_P(OnOff, UdpGso, ::testing::Bool());

TEST(UdpEndpoint, GroReceivesAreSplitIntoDatagrams) {
  auto a = open_v4();  // GSO on
  auto b = open_v4();  // GRO on
  pair_up(*a, *b);
  if (!a->gso_active() || !b->gro_active()) GTEST_SKIP() << "kernel without UDP GSO/GRO";
  Outbox out;
  for (int i = 0; i < 64; ++i) out.add(1000);
  out.add(500);
  for (int i = 0; i < 10; ++i) out.add(3000);
  send_all(*a, out.packets());
  // A small array forces a coalesced receive to be handed out over several calls.
  expect_intact(receive(*b, out.size(), 5), out.size());
  EXPECT_GT(b->udp_counters().gro_receives, 0u);
  EXPECT_LT(b->counters().rx_syscalls, out.size());
}

// Guesses for `n` datagrams of `payload` bytes each, one after another in `dst`.
RxGuesses guesses_into(std::vector<uint8_t>& dst, int n, uint32_t payload) {
  RxGuesses g;
  g.split = sizeof(TestHeader);
  g.n = n;
  dst.assign(static_cast<size_t>(n) * payload, 0);
  for (int i = 0; i < n; ++i) g.g[i] = {dst.data() + static_cast<size_t>(i) * payload, payload};
  return g;
}

// A sender and a receiver without GRO, so that each datagram is a receive of its own.
std::pair<std::unique_ptr<UdpEndpoint>, std::unique_ptr<UdpEndpoint>> pair_without_gro() {
  EndpointOptions no_gro;
  no_gro.gro = false;
  auto a = open_v4();
  auto b = open_v4(no_gro);
  pair_up(*a, *b);
  return {std::move(a), std::move(b)};
}

TEST(UdpEndpoint, GuessedPayloadsAreReceivedInPlace) {
  auto [a, b] = pair_without_gro();
  Outbox out;
  for (int i = 0; i < 3; ++i) out.add(1016);  // 1000 payload bytes after the test header
  send_all(*a, out.packets());
  std::vector<uint8_t> dst;
  const RxGuesses g = guesses_into(dst, 3, 1000);
  int placed = 0;
  expect_intact(receive(*b, 3, 64, &g, &placed), 3);
  EXPECT_EQ(placed, 3);
  // The payloads are where they were guessed, and nowhere else was written.
  for (uint32_t k = 0; k < 3; ++k)
    for (uint32_t i = 0; i < 1000; ++i) ASSERT_EQ(dst[k * 1000 + i], pattern(k, i));
}

TEST(UdpEndpoint, AGuessOfTheWrongSizeIsMadeWholeByRestore) {
  auto [a, b] = pair_without_gro();
  Outbox out;
  out.add(1016);
  send_all(*a, out.packets());
  std::vector<uint8_t> dst;
  const RxGuesses g = guesses_into(dst, 1, 600);  // shorter than the payload that comes
  RxPacket rx[4];
  int r = 0;
  for (int tries = 0; r == 0 && tries < 100; ++tries) {
    r = b->rx_burst_guessed(rx, 4, g);
    if (r == 0) {
      pollfd p{b->fd(), POLLIN, 0};
      (void)::poll(&p, 1, 10);
    }
  }
  ASSERT_EQ(r, 1);
  ASSERT_NE(rx[0].rest, nullptr);
  EXPECT_EQ(rx[0].placed, 600u);  // the first 600 went to the guess, the rest after the room
  rx[0].restore();
  EXPECT_EQ(rx[0].rest, nullptr);
  expect_intact({std::vector<uint8_t>(rx[0].data, rx[0].data + rx[0].len)}, 1);
}

// 16 datagrams of 1016 bytes sent in one GSO burst, so that the receiver's GRO coalesces them;
// skipped on a kernel without UDP GSO/GRO.
class UdpCoalescedRun : public ::testing::Test {
 protected:
  void SetUp() override {
    a = open_v4();  // GSO on
    b = open_v4();  // GRO on
    pair_up(*a, *b);
    if (!a->gso_active() || !b->gro_active()) GTEST_SKIP() << "kernel without UDP GSO/GRO";
    for (int i = 0; i < 16; ++i) out.add(1016);
    send_all(*a, out.packets());
  }
  std::unique_ptr<UdpEndpoint> a, b;
  Outbox out;
};

TEST_F(UdpCoalescedRun, ACoalescedRunHandedOutOverSeveralCallsStaysIntact) {
  std::vector<uint8_t> dst;
  const RxGuesses g = guesses_into(dst, 16, 1000);
  // One datagram per call: a receive's first datagram may go to the guess of that call; the
  // rest of its run is handed out by later calls from where it landed, never guessed again.
  int placed = 0;
  expect_intact(receive(*b, 16, 1, &g, &placed), 16);
  EXPECT_GE(placed, 1);
  EXPECT_LE(static_cast<uint64_t>(placed), b->counters().rx_syscalls);
  EXPECT_GT(b->udp_counters().gro_receives, 0u);
}

TEST_F(UdpCoalescedRun, UnderGroOnlyTheFirstDatagramOfAReceiveIsGuessed) {
  std::vector<uint8_t> dst;
  const RxGuesses g = guesses_into(dst, 16, 1000);
  int placed = 0;
  expect_intact(receive(*b, 16, 64, &g, &placed), 16);
  EXPECT_GE(placed, 1);
  EXPECT_GT(b->udp_counters().gro_receives, 0u);
  EXPECT_LT(placed, 16);  // one per receive: the rest of a coalesced run is where it lands
}

TEST_F(UdpCoalescedRun, ACoalescedRunOfAnotherSizeThanGuessedIsMadeWholeAtOnce) {
  std::vector<uint8_t> dst;
  // 600-byte guesses: the run's datagrams straddle them, so no RxPacket could describe the
  // split; the endpoint copies the bytes back before handing anything out.
  const RxGuesses g = guesses_into(dst, 16, 600);
  int placed = 0;
  expect_intact(receive(*b, 16, 64, &g, &placed), 16);
  EXPECT_GT(b->udp_counters().rx_unguessed, 0u);
}

TEST(UdpEndpoint, ADatagramsAgeIsHowLongItWaitedInTheSocket) {
  auto a = open_v4();
  auto b = open_v4();
  pair_up(*a, *b);
  Outbox out;
  out.add(100);
  send_all(*a, out.packets());
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  RxPacket rx[4];
  ASSERT_EQ(b->rx_burst(rx, 4), 1);
  EXPECT_GE(rx[0].age_ns, 25'000'000u);  // it arrived at once and waited the 30 ms
  EXPECT_LT(rx[0].age_ns, 1'000'000'000u);
}

// Test doubles for the system calls: sendmmsg that accepts a budget of messages and then
// reports a full queue, or that refuses GSO. Plain functions, so state lives in globals.
int g_send_budget = 0;
int g_send_calls = 0;

int budget_sendmmsg(int fd, mmsghdr* msgs, unsigned int n, int flags) {
  ++g_send_calls;
  if (g_send_budget <= 0) {
    errno = EAGAIN;
    return -1;
  }
  const unsigned take = std::min<unsigned>(n, static_cast<unsigned>(g_send_budget));
  const int r = ::sendmmsg(fd, msgs, take, flags);
  if (r > 0) g_send_budget -= r;
  return r;
}

int no_gso_sendmmsg(int fd, mmsghdr* msgs, unsigned int n, int flags) {
  ++g_send_calls;
  if (msgs[0].msg_hdr.msg_controllen != 0) {
    errno = EIO;  // what a device without checksum offload answers
    return -1;
  }
  unsigned plain = 0;
  while (plain < n && msgs[plain].msg_hdr.msg_controllen == 0) ++plain;
  return ::sendmmsg(fd, msgs, plain, flags);
}

int refusing_sendmmsg(int, mmsghdr*, unsigned int, int) {
  ++g_send_calls;
  errno = ENETUNREACH;  // a route that answers every send with an error
  return -1;
}

int recvmmsg_passthrough(int fd, mmsghdr* msgs, unsigned int n, int flags, timespec* t) {
  return ::recvmmsg(fd, msgs, n, flags, t);
}

const UdpSyscalls kBudgetSyscalls{budget_sendmmsg, recvmmsg_passthrough};
const UdpSyscalls kNoGsoSyscalls{no_gso_sendmmsg, recvmmsg_passthrough};
const UdpSyscalls kRefusingSyscalls{refusing_sendmmsg, recvmmsg_passthrough};

TEST(UdpEndpoint, ShortCountWhenQueueIsFull) {
  EndpointOptions opts;
  opts.socket_buffer_bytes = 4096;  // tiny, as a full queue would have
  opts.gso = false;
  auto a = open_v4(opts);
  auto b = open_v4();  // room for all 50
  pair_up(*a, *b);
  a->set_syscalls_for_test(kBudgetSyscalls);
  Outbox out;
  for (int i = 0; i < 50; ++i) out.add(100);
  const auto pkts = out.packets();

  g_send_budget = 10;
  EXPECT_EQ(a->tx_burst(pkts.data(), 50), 10);
  EXPECT_EQ(a->counters().tx_would_block, 1u);
  EXPECT_EQ(a->tx_burst(pkts.data() + 10, 40), 0);
  EXPECT_EQ(a->counters().tx_would_block, 2u);
  g_send_budget = 1000;
  EXPECT_EQ(a->tx_burst(pkts.data() + 10, 40), 40);
  expect_intact(receive(*b, 50), 50);
}

TEST(UdpEndpoint, TinyBuffersNeverFailOnLoopback) {
  // The receiver never reads: its 4 KiB queue overflows and the kernel drops silently. The
  // sender must see only whole or short counts, never an error.
  EndpointOptions opts;
  opts.socket_buffer_bytes = 4096;
  auto a = open_v4(opts);
  auto b = open_v4(opts);
  pair_up(*a, *b);
  Outbox out;
  for (int i = 0; i < 256; ++i) out.add(8000);
  const auto pkts = out.packets();
  for (int round = 0; round < 20; ++round) {
    const int r = a->tx_burst(pkts.data(), static_cast<int>(pkts.size()));
    ASSERT_GE(r, 0);
  }
}

// The buffering an endpoint reports is a quarter of what the kernel says it holds: half the size
// asked when granted in full, half of net.core.rmem_max when an unprivileged process asks for
// more. Said once per process however many endpoints fall short.
TEST(UdpEndpoint, ReceiveBufferFollowsTheGrant) {
  const uint64_t rmem_max = testing::rmem_max_bytes();
  ASSERT_GT(rmem_max, 0u) << "cannot read /proc/sys/net/core/rmem_max";
  const bool privileged = testing::has_net_admin();
  EndpointOptions opts;
  opts.socket_buffer_bytes = 1u << 20;
  auto full = open_v4(opts);
  ASSERT_NE(full, nullptr);
  const uint64_t granted = privileged ? opts.socket_buffer_bytes
                                      : std::min<uint64_t>(opts.socket_buffer_bytes, rmem_max);
  EXPECT_EQ(full->receive_buffer_bytes(), 2 * granted / 4);

  // 64x the cap (within the parameter's 1 GiB) is a grant clearly short of the request.
  const uint64_t asked = std::min<uint64_t>(64 * rmem_max, uint64_t{1} << 30);
  if (asked < 4 * rmem_max) GTEST_SKIP() << "net.core.rmem_max " << rmem_max << " is too large";
  const testing::WarnCapture warns;
  uint64_t short_a = 0, short_b = 0;
  bool dropped = false;
  // Capabilities are per thread: only this one loses CAP_NET_ADMIN.
  std::thread([&] {
    dropped = testing::drop_net_admin() && !testing::has_net_admin();
    EndpointOptions big;
    big.socket_buffer_bytes = static_cast<uint32_t>(asked);
    auto a = open_v4(big);
    auto b = open_v4(big);
    if (a) short_a = a->receive_buffer_bytes();
    if (b) short_b = b->receive_buffer_bytes();
  }).join();
  int rmem_warnings = 0;
  for (const std::string& w : warns.warnings())
    rmem_warnings += w.find("net.core.rmem_max") != std::string::npos ? 1 : 0;
  ASSERT_TRUE(dropped) << "could not drop CAP_NET_ADMIN";
  EXPECT_EQ(short_a, 2 * rmem_max / 4);
  EXPECT_EQ(short_b, 2 * rmem_max / 4);
  // Another test of this process may have been the first to fall short (when not run as root).
  if (privileged) {
    EXPECT_EQ(rmem_warnings, 1) << warns.text();
  } else {
    EXPECT_LE(rmem_warnings, 1) << warns.text();
  }
}

// A receiver that does not read overflows its buffer; the kernel's drop count reaches
// rx_kernel_drops with the next datagram that does get in.
TEST(UdpEndpoint, CountsKernelDropsAtAFullBuffer) {
  EndpointOptions tx_opts;
  tx_opts.gso = false;
  EndpointOptions rx_opts;
  rx_opts.gro = false;
  rx_opts.socket_buffer_bytes = 65536;  // room for a few dozen of the 300 below
  auto a = open_v4(tx_opts);
  auto b = open_v4(rx_opts);
  pair_up(*a, *b);
  // Fewer than net.core.netdev_max_backlog (1000 by default), so that every loss is the
  // socket's, not the backlog queue's.
  constexpr uint32_t kFlood = 300;
  Outbox out;
  for (uint32_t i = 0; i < kFlood + 1; ++i) out.add(1000);
  const auto pkts = out.packets();
  send_all(*a, std::vector<TxPacket>(pkts.begin(), pkts.begin() + kFlood));
  // Everything that got in, taken until the socket stays quiet for 50 ms.
  size_t first = 0;
  RxPacket rx[64];
  for (;;) {
    const int r = b->rx_burst(rx, 64);
    ASSERT_GE(r, 0);
    first += static_cast<size_t>(r);
    pollfd p{b->fd(), POLLIN, 0};
    if (r == 0 && ::poll(&p, 1, 50) == 0) break;
  }
  ASSERT_LT(first, kFlood) << "nothing was dropped: the buffer was not small";
  send_all(*a, std::vector<TxPacket>(pkts.begin() + kFlood, pkts.end()));
  ASSERT_EQ(receive(*b, 1).size(), 1u);
  EXPECT_EQ(b->udp_counters().rx_kernel_drops, kFlood - first);
}

TEST(UdpEndpoint, FallsBackFromGsoWhenTheKernelRefuses) {
  auto a = open_v4();
  EndpointOptions rx_opts;
  rx_opts.gro = false;
  auto b = open_v4(rx_opts);
  pair_up(*a, *b);
  if (!a->gso_active()) GTEST_SKIP() << "kernel without UDP GSO";
  a->set_syscalls_for_test(kNoGsoSyscalls);
  Outbox out;
  out.add(200);
  for (int i = 0; i < 40; ++i) out.add(1000);
  send_all(*a, out.packets());
  EXPECT_FALSE(a->gso_active());
  EXPECT_EQ(a->udp_counters().gso_fallbacks, 1u);
  EXPECT_EQ(a->udp_counters().gso_sends, 0u);
  expect_intact(receive(*b, out.size()), out.size());
}

TEST(UdpEndpoint, TruncatedDatagramsAreCountedAndDropped) {
  EndpointOptions big;
  big.max_datagram_bytes = 4000;
  EndpointOptions small;
  small.max_datagram_bytes = 512;
  small.gro = false;
  auto a = open_v4(big);
  auto b = open_v4(small);
  pair_up(*a, *b);
  EXPECT_EQ(b->max_datagram_bytes(), 512u);
  Outbox out;
  out.add(1000);
  out.add(100);
  out.add(513);
  out.add(512);
  send_all(*a, out.packets());
  const auto got = receive(*b, 2);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].size(), 100u);
  EXPECT_EQ(got[1].size(), 512u);
  EXPECT_EQ(b->counters().rx_truncated, 2u);
}

TEST(UdpEndpoint, OversizeDatagramsAreDroppedUnderGro) {
  // With GRO the slots are 64 KiB, so the size check is ours rather than the kernel's.
  EndpointOptions small;
  small.max_datagram_bytes = 512;
  auto a = open_v4();
  auto b = open_v4(small);
  pair_up(*a, *b);
  Outbox out;
  out.add(1000);
  out.add(100);  // may share one GSO message with the first: only the first is dropped
  out.add(1000);
  out.add(1000);
  out.add(512);
  send_all(*a, out.packets());
  const auto got = receive(*b, 2);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].size(), 100u);
  EXPECT_EQ(got[1].size(), 512u);
  EXPECT_EQ(b->counters().rx_truncated, 3u);
}

std::vector<uint8_t> one_byte_datagram(UdpEndpoint& from, UdpEndpoint& to, uint8_t value) {
  const TxPacket p{&value, 1, 0, nullptr};
  EXPECT_EQ(from.tx_burst(&p, 1), 1);
  (void)to;
  return {value};
}

TEST(UdpEndpoint, SetPeerFiltersOtherSources) {
  auto a = open_v4();
  auto b = open_v4();
  auto c = open_v4();
  ASSERT_TRUE(c->set_peer(a->local_address()));
  ASSERT_TRUE(b->set_peer(a->local_address()));
  one_byte_datagram(*c, *a, 1);  // queued before A has a peer: only our own check sees it
  ASSERT_TRUE(a->set_peer(b->local_address()));
  one_byte_datagram(*c, *a, 2);  // the kernel drops this one
  one_byte_datagram(*b, *a, 3);
  const auto got = receive(*a, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0][0], 3);
  RxPacket rx[2];
  EXPECT_EQ(a->rx_burst(rx, 2), 0);  // loopback delivers within the send: nothing is on its way
  EXPECT_EQ(a->udp_counters().rx_foreign, 1u);
}

TEST(UdpEndpoint, FromIsFilledOnlyWithoutPeer) {
  auto a = open_v4();
  auto b = open_v4();
  ASSERT_TRUE(b->set_peer(a->local_address()));
  one_byte_datagram(*b, *a, 7);
  RxPacket rx[2];
  int r = 0;
  for (int i = 0; i < 100 && r == 0; ++i) r = a->rx_burst(rx, 2);
  ASSERT_EQ(r, 1);
  EXPECT_EQ(rx[0].from, b->local_address());

  ASSERT_TRUE(a->set_peer(b->local_address()));
  one_byte_datagram(*b, *a, 8);
  r = 0;
  for (int i = 0; i < 100 && r == 0; ++i) r = a->rx_burst(rx, 2);
  ASSERT_EQ(r, 1);
  EXPECT_TRUE(rx[0].from.empty());
}

TEST(UdpEndpoint, UnreachablePeerIsNotFatal) {
  auto a = open_v4();
  PeerAddress gone;
  {
    auto b = open_v4();
    gone = b->local_address();
  }  // closed: its port now answers with ICMP port unreachable
  ASSERT_TRUE(a->set_peer(gone));
  Outbox out;
  for (int i = 0; i < 8; ++i) out.add(64);
  const auto pkts = out.packets();
  RxPacket rx[8];
  for (int round = 0; round < 20; ++round) {
    EXPECT_EQ(a->tx_burst(pkts.data(), 8), 8);
    EXPECT_EQ(a->rx_burst(rx, 8), 0);
  }
  EXPECT_GT(a->udp_counters().peer_unreachable, 0u);
  EXPECT_EQ(a->udp_counters().unreachable_drops, 0u);
}

TEST(UdpEndpoint, PersistentRouteErrorDropsInsteadOfSpinning) {
  auto a = open_v4();
  auto b = open_v4();
  pair_up(*a, *b);
  a->set_syscalls_for_test(kRefusingSyscalls);
  Outbox out;
  for (int i = 0; i < 4; ++i) out.add(64);
  g_send_calls = 0;
  EXPECT_EQ(a->tx_burst(out.packets().data(), 4), 4);
  EXPECT_EQ(a->udp_counters().unreachable_drops, 4u);
  EXPECT_EQ(g_send_calls, 8);  // two tries per datagram
}

TEST(UdpEndpoint, OversizeSendIsFatal) {
  auto a = open_v4();
  auto b = open_v4();
  pair_up(*a, *b);
  std::vector<uint8_t> big(kMaxUdpPayloadBytes + 1);
  const TxPacket p{big.data(), static_cast<uint32_t>(big.size()), 0, nullptr};
  EXPECT_EQ(a->tx_burst(&p, 1), -EMSGSIZE);
  const uint8_t byte = 0;
  const TxPacket small{&byte, 1, 0, nullptr};
  EXPECT_EQ(a->tx_burst(&small, 1), -EMSGSIZE);  // sticky
  RxPacket rx[1];
  EXPECT_EQ(a->rx_burst(rx, 1), -EMSGSIZE);
}

TEST(UdpEndpoint, MaxDatagramFollowsMtuAndOptions) {
  EXPECT_EQ(open_v4({}, kLoMtu)->max_datagram_bytes(), kMaxUdpPayloadBytes);
  EXPECT_EQ(open_v4({}, 1500)->max_datagram_bytes(), 1472u);  // 1500 - 20 (IPv4) - 8 (UDP)
  EXPECT_EQ(open_v4({}, 9000)->max_datagram_bytes(), 8972u);
  EndpointOptions opts;
  opts.max_datagram_bytes = 1000;
  EXPECT_EQ(open_v4(opts, 1500)->max_datagram_bytes(), 1000u);
  opts.max_datagram_bytes = 9000;  // more than the MTU allows: capped
  EXPECT_EQ(open_v4(opts, 1500)->max_datagram_bytes(), 1472u);
  auto v6 = open_v6({}, 1500);
  if (v6) {
    EXPECT_EQ(v6->max_datagram_bytes(), 1452u);  // 1500 - 40 (IPv6) - 8
  }
}

// A peer on this host is reached through loopback whatever the device's MTU, so the datagram
// agreed with it is as large as that route and a receive slot allow (one 64 KiB datagram where
// 1472-byte ones would cost 45 times the per-datagram work), never smaller than the device's;
// a size the user fixed stays fixed. Such datagrams arrive whole beside the device-sized ones.
TEST(UdpEndpoint, APeerOnThisHostGetsTheLoopbackRoutesDatagram) {
  auto a = open_v4({}, 1500);
  auto b = open_v4({}, 1500);
  ASSERT_EQ(a->max_datagram_bytes(), 1472u);
  if (!a->gro_active() || !b->gro_active())
    GTEST_SKIP() << "no UDP GRO here: a receive slot holds one device-sized datagram";
  EXPECT_EQ(a->max_datagram_bytes_to(b->local_address()), kMaxUdpPayloadBytes);
  EXPECT_EQ(b->max_datagram_bytes_to(a->local_address()), kMaxUdpPayloadBytes);
  EndpointOptions fixed;
  fixed.max_datagram_bytes = 1000;
  EXPECT_EQ(open_v4(fixed, 1500)->max_datagram_bytes_to(b->local_address()), 1000u);
  pair_up(*a, *b);
  Outbox out;
  for (uint32_t i = 0; i < 20; ++i) out.add(i % 2 ? 1472 : kMaxUdpPayloadBytes - 7 * i);
  send_all(*a, out.packets());
  expect_intact(receive(*b, out.size()), out.size());
  EXPECT_EQ(b->counters().rx_truncated, 0u);
}

TEST(UdpEndpoint, Ipv6LoopbackExchange) {
  auto a = open_v6();
  auto b = open_v6();
  if (!a || !b) GTEST_SKIP() << "no ::1 on this host";
  pair_up(*a, *b);
  Outbox out;
  for (uint32_t i = 0; i < 50; ++i) out.add(16 + i * 301);
  send_all(*a, out.packets());
  expect_intact(receive(*b, out.size()), out.size());
}

TEST(UdpAddress, RoundTripsAndRejectsGarbage) {
  sockaddr_in in{};
  in.sin_family = AF_INET;
  in.sin_port = htons(4242);
  in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const PeerAddress a = udp_peer_address(reinterpret_cast<const sockaddr*>(&in));
  EXPECT_EQ(a.kind, kUdpAddressKind);
  EXPECT_EQ(a.len, sizeof(sockaddr_in));
  sockaddr_storage ss;
  socklen_t len;
  ASSERT_TRUE(udp_sockaddr(a, &ss, &len));
  EXPECT_EQ(len, sizeof(sockaddr_in));
  EXPECT_EQ(std::memcmp(&ss, &in, sizeof(in)), 0);

  PeerAddress bad = a;
  bad.kind = 2;
  EXPECT_FALSE(udp_sockaddr(bad, &ss, &len));
  bad = a;
  bad.len = 3;
  EXPECT_FALSE(udp_sockaddr(bad, &ss, &len));
  EXPECT_FALSE(udp_sockaddr(PeerAddress{}, &ss, &len));

  auto ep = open_v4();
  EXPECT_EQ(ep->set_peer(bad).code(), Errc::kInternal);
  auto v6 = open_v6();
  if (v6) {
    EXPECT_EQ(ep->set_peer(v6->local_address()).code(), Errc::kInternal);
  }
}

// Whether the kernel queues ICMP errors on the socket's error queue (IP_RECVERR, IPV6_RECVERR).
int recverr_option(const UdpEndpoint& ep, bool v6) {
  int v = -1;
  socklen_t len = sizeof(v);
  const int rc = v6 ? getsockopt(ep.fd(), IPPROTO_IPV6, IPV6_RECVERR, &v, &len)
                    : getsockopt(ep.fd(), IPPROTO_IP, IP_RECVERR, &v, &len);
  EXPECT_EQ(rc, 0) << std::strerror(errno);
  return v;
}

int local_port(const UdpEndpoint& ep) {
  sockaddr_storage ss;
  socklen_t len;
  EXPECT_TRUE(udp_sockaddr(ep.local_address(), &ss, &len));
  return ss.ss_family == AF_INET ? ntohs(reinterpret_cast<const sockaddr_in&>(ss).sin_port)
                                 : ntohs(reinterpret_cast<const sockaddr_in6&>(ss).sin6_port);
}

// Receives one datagram (or none within a second) and returns its source.
PeerAddress receive_one_from(UdpEndpoint& ep, std::vector<uint8_t>* data) {
  RxPacket rx[1];
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (std::chrono::steady_clock::now() < deadline) {
    const int r = ep.rx_burst(rx, 1);
    EXPECT_GE(r, 0) << std::strerror(-r);
    if (r < 0) break;
    if (r == 1) {
      data->assign(rx[0].data, rx[0].data + rx[0].len);
      return rx[0].from;
    }
    pollfd p{ep.fd(), POLLIN, 0};
    (void)::poll(&p, 1, 10);
  }
  return {};
}

TEST(UdpUnbound, RecvErrOnlyWhenUnbound) {
  EndpointOptions unbound;
  unbound.unbound = true;
  EXPECT_EQ(recverr_option(*open_v4(), false), 0);
  EXPECT_EQ(recverr_option(*open_v4(unbound), false), 1);
  auto v6 = open_v6();
  auto v6u = open_v6(unbound);
  if (v6 && v6u) {
    EXPECT_EQ(recverr_option(*v6, true), 0);
    EXPECT_EQ(recverr_option(*v6u, true), 1);
  }
}

class UdpUnboundGso : public ::testing::TestWithParam<bool> {};

// One socket, two destinations: each peer gets its own datagrams and only those, and what the
// unbound endpoint receives names its sender.
TEST_P(UdpUnboundGso, SendsToEachDestination) {
  EndpointOptions opts;
  opts.unbound = true;
  opts.gso = GetParam();
  EndpointOptions rx_opts;
  rx_opts.gro = false;
  auto u = open_v4(opts);
  auto p1 = open_v4(rx_opts);
  auto p2 = open_v4(rx_opts);
  ASSERT_TRUE(p1->set_peer(u->local_address()));
  ASSERT_TRUE(p2->set_peer(u->local_address()));
  Outbox o1, o2;
  for (int i = 0; i < 100; ++i) o1.add(1400);  // longer than one GSO message
  for (int i = 0; i < 30; ++i) o2.add(900);
  o2.add(200);
  const auto k1 = o1.packets();
  const auto k2 = o2.packets();
  // Interleaved, so that the cached destination changes between calls.
  send_all_to(*u, p1->local_address(), std::vector<TxPacket>(k1.begin(), k1.begin() + 50));
  send_all_to(*u, p2->local_address(), k2);
  send_all_to(*u, p1->local_address(), std::vector<TxPacket>(k1.begin() + 50, k1.end()));
  // Each peer was connected to u, and distinct datagram numbering shows a misdirected one.
  expect_intact(receive(*p1, o1.size()), o1.size());
  expect_intact(receive(*p2, o2.size()), o2.size());
  RxPacket rx[1];
  EXPECT_EQ(p1->rx_burst(rx, 1), 0);
  EXPECT_EQ(p2->rx_burst(rx, 1), 0);
  EXPECT_EQ(u->counters().tx_datagrams, o1.size() + o2.size());
  if (GetParam() && u->gso_active()) {
    EXPECT_GT(u->udp_counters().gso_sends, 0u);
  } else {
    EXPECT_EQ(u->udp_counters().gso_sends, 0u);
  }

  auto c = open_v4();
  ASSERT_TRUE(c->set_peer(u->local_address()));
  const uint8_t byte = 0x42;
  const TxPacket p{&byte, 1, 0, nullptr};
  ASSERT_EQ(c->tx_burst(&p, 1), 1);
  std::vector<uint8_t> got;
  EXPECT_EQ(receive_one_from(*u, &got), c->local_address());
  EXPECT_EQ(got, std::vector<uint8_t>{0x42});
  ASSERT_EQ(p2->tx_burst(&p, 1), 1);
  EXPECT_EQ(receive_one_from(*u, &got), p2->local_address());
}

INSTANTIATE_TEST_SUITE_P(OnOff, UdpUnboundGso, ::testing::Bool());

// A connected endpoint may name a destination too; its next tx_burst goes to its peer again.
TEST(UdpUnbound, ConnectedSendAfterSendToGoesToThePeer) {
  auto a = open_v4();
  auto b = open_v4();
  auto c = open_v4();
  pair_up(*a, *b);
  const uint8_t one = 1, two = 2;
  const TxPacket p1{&one, 1, 0, nullptr};
  const TxPacket p2{&two, 1, 0, nullptr};
  ASSERT_EQ(a->tx_burst_to(c->local_address(), &p1, 1), 1);
  ASSERT_EQ(a->tx_burst(&p2, 1), 1);
  std::vector<uint8_t> got;
  EXPECT_EQ(receive_one_from(*c, &got), a->local_address());
  EXPECT_EQ(got, std::vector<uint8_t>{1});
  ASSERT_EQ(receive(*b, 1).size(), 1u);
  RxPacket rx[1];
  EXPECT_EQ(c->rx_burst(rx, 1), 0);
}

TEST(UdpUnbound, BadDestinationIsRefusedButNotSticky) {
  EndpointOptions opts;
  opts.unbound = true;
  auto u = open_v4(opts);
  auto b = open_v4();
  const uint8_t byte = 9;
  const TxPacket p{&byte, 1, 0, nullptr};
  PeerAddress not_udp = b->local_address();
  not_udp.kind = 2;
  EXPECT_EQ(u->tx_burst_to(not_udp, &p, 1), -EINVAL);
  EXPECT_EQ(u->tx_burst_to(PeerAddress{}, &p, 1), -EINVAL);
  ASSERT_EQ(u->tx_burst_to(b->local_address(), &p, 1), 1);
  // After a good destination was cached, a bad one is still refused.
  EXPECT_EQ(u->tx_burst_to(not_udp, &p, 1), -EINVAL);
  auto v6 = open_v6();
  if (v6) {
    EXPECT_EQ(u->tx_burst_to(v6->local_address(), &p, 1), -EINVAL);  // the other family
  }
  ASSERT_EQ(u->tx_burst_to(b->local_address(), &p, 1), 1);
  EXPECT_EQ(receive(*b, 2).size(), 2u);
  EXPECT_EQ(u->counters().tx_datagrams, 2u);
}

class UdpUnboundFamily : public ::testing::TestWithParam<bool> {};

// The closed port's reports come back under its address, never under the live peer's, and a
// connected endpoint reports none.
TEST_P(UdpUnboundFamily, UnreachableIsAttributedToItsDestination) {
  const bool v6 = GetParam();
  EndpointOptions opts;
  opts.unbound = true;
  opts.gso = false;
  auto u = v6 ? open_v6(opts) : open_v4(opts);
  auto live = v6 ? open_v6() : open_v4();
  PeerAddress gone;
  {
    auto g = v6 ? open_v6() : open_v4();
    if (g) gone = g->local_address();
  }
  if (!u || !live || gone.empty()) GTEST_SKIP() << "no ::1 on this host";
  ASSERT_FALSE(gone == live->local_address());
  const uint8_t byte = 5;
  const TxPacket p{&byte, 1, 0, nullptr};
  PeerAddress out[8];
  std::vector<PeerAddress> reports;
  int sent_gone = 0, sent_live = 0;
  // The kernel's global ICMP rate limit (icmp_msgs_burst) may swallow a report after another
  // test's flood, so the closed port is sent to again until one comes back.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (reports.empty() && std::chrono::steady_clock::now() < deadline) {
    ASSERT_EQ(u->tx_burst_to(gone, &p, 1), 1);
    ++sent_gone;
    ASSERT_EQ(u->tx_burst_to(live->local_address(), &p, 1), 1);
    ++sent_live;
    pollfd pf{u->fd(), 0, 0};  // POLLERR is reported whatever the events asked
    (void)::poll(&pf, 1, 2);
    const int r = u->take_unreachable(out, 8);
    ASSERT_GE(r, 0) << std::strerror(-r);
    reports.insert(reports.end(), out, out + r);
  }
  // Reports of the last datagrams, if the softirq that makes them ran late.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const int late = u->take_unreachable(out, 8);
  ASSERT_GE(late, 0);
  reports.insert(reports.end(), out, out + late);

  ASSERT_FALSE(reports.empty());
  EXPECT_LE(reports.size(), static_cast<size_t>(sent_gone));
  for (const PeerAddress& a : reports) {
    EXPECT_EQ(a, gone) << u->address_text(a);
    EXPECT_FALSE(a == live->local_address());
  }
  EXPECT_EQ(u->take_unreachable(out, 8), 0);
  EXPECT_EQ(u->udp_counters().peer_unreachable, reports.size());
  EXPECT_EQ(receive(*live, static_cast<size_t>(sent_live)).size(), static_cast<size_t>(sent_live));

  // A connected endpoint counts the socket's error and has no per-destination reports.
  auto a = v6 ? open_v6() : open_v4();
  ASSERT_TRUE(a->set_peer(gone));
  for (int i = 0; i < 10; ++i) {
    ASSERT_EQ(a->tx_burst(&p, 1), 1);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_GT(a->udp_counters().peer_unreachable, 0u);
  EXPECT_EQ(a->take_unreachable(out, 8), 0);
}

INSTANTIATE_TEST_SUITE_P(V4V6, UdpUnboundFamily, ::testing::Bool());

// `max` bounds one call; what is left waits for the next, oldest first.
TEST(UdpUnbound, TakeUnreachableHonoursMax) {
  EndpointOptions opts;
  opts.unbound = true;
  opts.gso = false;
  auto u = open_v4(opts);
  PeerAddress gone[2];
  for (PeerAddress& g : gone) {
    auto e = open_v4();
    g = e->local_address();
  }
  const uint8_t byte = 5;
  const TxPacket p{&byte, 1, 0, nullptr};
  PeerAddress out[4];
  std::vector<PeerAddress> first, rest;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  // Each round sends to both, the first one first, until a round gets both reports back (the
  // global ICMP rate limit may swallow some after another test's flood).
  while (std::chrono::steady_clock::now() < deadline) {
    ASSERT_EQ(u->tx_burst_to(gone[0], &p, 1), 1);
    ASSERT_EQ(u->tx_burst_to(gone[1], &p, 1), 1);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    first.clear();
    rest.clear();
    const int r = u->take_unreachable(out, 1);
    ASSERT_GE(r, 0);
    ASSERT_LE(r, 1);
    if (r == 0) continue;
    first.assign(out, out + 1);
    int more;
    while ((more = u->take_unreachable(out, 4)) > 0) rest.insert(rest.end(), out, out + more);
    ASSERT_EQ(more, 0);
    if (rest.size() == 1) break;
  }
  ASSERT_EQ(first.size(), 1u);
  ASSERT_EQ(rest.size(), 1u);
  EXPECT_EQ(first[0], gone[0]);  // oldest first
  EXPECT_EQ(rest[0], gone[1]);
}

TEST(UdpUnbound, AddressAsText) {
  auto a = open_v4();
  auto b = open_v4();
  const std::string port = std::to_string(local_port(*a));
  EXPECT_EQ(b->address_text(a->local_address()), "127.0.0.1:" + port);
  EXPECT_EQ(b->address_host(a->local_address()), "127.0.0.1");
  PeerAddress not_udp = a->local_address();
  not_udp.kind = 2;
  EXPECT_EQ(b->address_text(not_udp), "");
  EXPECT_EQ(b->address_host(PeerAddress{}), "");
  EXPECT_EQ(b->peer_text(), "");
  EXPECT_EQ(b->peer_host(), "");
  ASSERT_TRUE(b->set_peer(a->local_address()));
  EXPECT_EQ(b->peer_text(), "127.0.0.1:" + port);
  EXPECT_EQ(b->peer_host(), "127.0.0.1");
  auto v6 = open_v6();
  if (v6) {
    EXPECT_EQ(b->address_text(v6->local_address()), "::1:" + std::to_string(local_port(*v6)));
    EXPECT_EQ(b->address_host(v6->local_address()), "::1");
  }
}

}  // namespace
}  // namespace optireduce
