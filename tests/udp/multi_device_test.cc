// The engine with two UDP devices, as on a host with two NICs: device k's listen handle carries
// interface k's address, and a connection made on device k sends from interface k's address.
// Each device has one socket per thread, shared by every connection that thread opens on it.
// Loopback stands in for the two NICs: 127.0.0.1 and 127.0.0.2 are both on lo, no root needed.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tests/udp/loopback.h"
#include "transport/clock.h"
#include "transport/transport.h"
#include "transport/wire.h"
#include "udp/device.h"
#include "udp/endpoint.h"

namespace optireduce {
namespace {

using testing::loopback_at;

const char* const kAddrs[] = {"127.0.0.1", "127.0.0.2"};

std::string ip_of(const PeerAddress& a) {
  sockaddr_storage ss;
  socklen_t len;
  if (!udp_sockaddr(a, &ss, &len) || ss.ss_family != AF_INET) return "?";
  char buf[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(ss).sin_addr, buf, sizeof(buf));
  return buf;
}

// The local address of every endpoint each device opened, in order.
std::mutex g_mu;
std::vector<std::string> g_opened[2];

// A device that records where the endpoints it opens are bound.
class RecordingDevice final : public Device {
 public:
  RecordingDevice(int index, std::unique_ptr<Device> inner)
      : index_(index), inner_(std::move(inner)) {}
  const DeviceInfo& info() const override { return inner_->info(); }
  Status open_endpoint(const EndpointOptions& opts, std::unique_ptr<Endpoint>* out) override {
    const Status s = inner_->open_endpoint(opts, out);
    if (s) {
      std::lock_guard<std::mutex> lock(g_mu);
      g_opened[index_].push_back(ip_of((*out)->local_address()));
    }
    return s;
  }
  bool can_share() const override { return inner_->can_share(); }

 private:
  int index_;
  std::unique_ptr<Device> inner_;
};

Status open_two_devices(const Config&, std::vector<std::unique_ptr<Device>>* out) {
  for (int k = 0; k < 2; ++k)
    out->push_back(std::make_unique<RecordingDevice>(k, make_udp_device(loopback_at(kAddrs[k]))));
  return Status::ok();
}

bool can_bind(const char* ipv4) {
  const int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  inet_pton(AF_INET, ipv4, &a.sin_addr);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  ::close(fd);
  return ok;
}

using Clock = std::chrono::steady_clock;
constexpr auto kPatience = std::chrono::seconds(20);

// Connects device `from` to `listen`, whose handle is `h`: both ends, or a failed assertion.
void connect_to(Engine& e, int from, const ConnectionHandle& h, ListenComm& listen,
                std::unique_ptr<SendComm>* send, std::unique_ptr<RecvComm>* recv) {
  void* state = nullptr;
  const auto until = Clock::now() + kPatience;
  while ((*send == nullptr || *recv == nullptr) && Clock::now() < until) {
    if (*send == nullptr) {
      ASSERT_TRUE(e.connect(from, h, ConnOptions{}, &state, send));
    }
    if (*recv == nullptr) {
      ASSERT_TRUE(listen.accept(recv));
    }
  }
  ASSERT_NE(*send, nullptr);
  ASSERT_NE(*recv, nullptr);
}

// Carries one message of `bytes` across, byte-exact.
void carry(SendComm& send, RecvComm& recv, size_t bytes, uint8_t seed) {
  std::vector<uint8_t> out(bytes), in(out.size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<uint8_t>(i * 7 + seed);
  Request* sreq = nullptr;
  Request* rreq = nullptr;
  ASSERT_TRUE(recv.irecv(in.data(), in.size(), &rreq));
  ASSERT_TRUE(send.isend(out.data(), out.size(), &sreq));
  ASSERT_NE(sreq, nullptr);
  ASSERT_NE(rreq, nullptr);
  bool sdone = false, rdone = false;
  size_t got = 0;
  const auto until = Clock::now() + kPatience;
  while (!(sdone && rdone) && Clock::now() < until) {
    if (!sdone) {
      ASSERT_TRUE(send.test(sreq, &sdone, nullptr));
    }
    if (!rdone) {
      ASSERT_TRUE(recv.test(rreq, &rdone, &got));
    }
  }
  ASSERT_TRUE(sdone && rdone);
  EXPECT_EQ(got, out.size());
  EXPECT_EQ(in, out);
}

// Connects device `from` to a listener on device `to` and carries one message across.
void connect_and_send(Engine& e, int from, int to) {
  ConnectionHandle h;
  std::unique_ptr<ListenComm> listen;
  ASSERT_TRUE(e.listen(to, &h, &listen));
  EXPECT_EQ(ip_of(h.addr), kAddrs[to]);

  std::unique_ptr<SendComm> send;
  std::unique_ptr<RecvComm> recv;
  ASSERT_NO_FATAL_FAILURE(connect_to(e, from, h, *listen, &send, &recv));
  carry(*send, *recv, 100'000, static_cast<uint8_t>(from + to));
}

TEST(TwoUdpDevices, EachConnectionUsesItsDevicesInterface) {
  if (!can_bind(kAddrs[1])) GTEST_SKIP() << "cannot bind 127.0.0.2 here";
  std::shared_ptr<Engine> e;
  ASSERT_TRUE(Engine::acquire(&e, nullptr, &open_two_devices));
  ASSERT_EQ(e->device_count(), 2);

  // A listener on each device holds this thread's socket there open for the whole test (the
  // last connection of a socket closes it).
  std::unique_ptr<ListenComm> pins[2];
  for (int k = 0; k < 2; ++k) {
    ConnectionHandle h;
    ASSERT_TRUE(e->listen(k, &h, &pins[k]));
  }
  // Every pair of devices: a listener's handle names its own device's address, and the
  // connecting side's socket is bound on the device the connect named.
  for (int from = 0; from < 2; ++from) {
    for (int to = 0; to < 2; ++to) {
      SCOPED_TRACE("device " + std::to_string(from) + " to device " + std::to_string(to));
      size_t before[2];
      {
        std::lock_guard<std::mutex> lock(g_mu);
        before[0] = g_opened[0].size();
        before[1] = g_opened[1].size();
      }
      connect_and_send(*e, from, to);
      std::lock_guard<std::mutex> lock(g_mu);
      // Both devices' sockets are open already: every connection reuses them.
      for (int k = 0; k < 2; ++k) EXPECT_EQ(g_opened[k].size(), before[k]) << "device " << k;
    }
  }
  // Another thread's connections get sockets of their own, on the same interfaces.
  std::thread([&] { connect_and_send(*e, 1, 0); }).join();
  std::lock_guard<std::mutex> lock(g_mu);
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ(g_opened[k].size(), 2u) << "device " << k;
    for (const std::string& ip : g_opened[k]) EXPECT_EQ(ip, kAddrs[k]) << "device " << k;
  }
}

size_t open_fds() {
  size_t n = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    (void)entry;
    ++n;
  }
  return n;
}

// NCCL holds channels x peers connections open; they must not cost a socket each.
TEST(TwoUdpDevices, FiftyConnectionsOfAThreadShareOneSocket) {
  std::shared_ptr<Engine> e;
  ASSERT_TRUE(Engine::acquire(&e, nullptr, &open_two_devices));
  ConnectionHandle pin_handle;
  std::unique_ptr<ListenComm> pin;  // holds this thread's socket on device 0 open
  ASSERT_TRUE(e->listen(0, &pin_handle, &pin));
  const size_t before = open_fds();
  struct Pair {
    std::unique_ptr<ListenComm> listen;
    std::unique_ptr<SendComm> send;
    std::unique_ptr<RecvComm> recv;
  };
  std::vector<Pair> pairs(50);
  for (Pair& p : pairs) {
    ConnectionHandle h;
    ASSERT_TRUE(e->listen(0, &h, &p.listen));
    ASSERT_NO_FATAL_FAILURE(connect_to(*e, 0, h, *p.listen, &p.send, &p.recv));
  }
  EXPECT_EQ(open_fds(), before);  // a socket per connection would be 100 more
  connect_and_send(*e, 0, 0);     // and data still crosses beside them
}

// ---------------------------------------------------------------------------------------------
// A thread's socket outlives its last connection by a peer timeout (engine.h): long enough to
// answer a peer that missed the connection's CLOSE.

// What a muted endpoint loses: the ACKs and CLOSEs it sends, a receiver's word that a send is
// complete.
bool is_receivers_word(const TxPacket& p) {
  std::vector<uint8_t> d(p.hdr_len + p.payload_len);
  if (p.hdr_len != 0) std::memcpy(d.data(), p.hdr, p.hdr_len);
  if (p.payload_len != 0) std::memcpy(d.data() + p.hdr_len, p.payload, p.payload_len);
  PacketHeader h;
  if (decode(d.data(), d.size(), &h) != DecodeError::kNone) return false;
  return h.type == PacketType::kAck || h.type == PacketType::kClose;
}

// An endpoint that loses what is_receivers_word() picks while its switch is on.
class MutingEndpoint final : public Endpoint {
 public:
  MutingEndpoint(std::unique_ptr<Endpoint> inner, std::shared_ptr<std::atomic<bool>> muted)
      : inner_(std::move(inner)), muted_(std::move(muted)) {}
  const PeerAddress& local_address() const override { return inner_->local_address(); }
  Status set_peer(const PeerAddress& peer) override { return inner_->set_peer(peer); }
  int tx_burst(const TxPacket* pkts, int n) override { return send(nullptr, pkts, n); }
  int tx_burst_to(const PeerAddress& to, const TxPacket* pkts, int n) override {
    return send(&to, pkts, n);
  }
  int rx_burst(RxPacket* pkts, int max) override { return inner_->rx_burst(pkts, max); }
  int rx_burst_guessed(RxPacket* pkts, int max, const RxGuesses& g) override {
    return inner_->rx_burst_guessed(pkts, max, g);
  }
  uint32_t max_datagram_bytes() const override { return inner_->max_datagram_bytes(); }
  uint32_t max_datagram_bytes_to(const PeerAddress& peer) const override {
    return inner_->max_datagram_bytes_to(peer);
  }
  const DatapathCounters& counters() const override { return inner_->counters(); }
  uint64_t receive_buffer_bytes() const override { return inner_->receive_buffer_bytes(); }
  std::string peer_text() const override { return inner_->peer_text(); }
  std::string peer_host() const override { return inner_->peer_host(); }
  int take_unreachable(PeerAddress* out, int max) override {
    return inner_->take_unreachable(out, max);
  }
  std::string address_text(const PeerAddress& a) const override { return inner_->address_text(a); }
  std::string address_host(const PeerAddress& a) const override { return inner_->address_host(a); }

 private:
  // Hands the runs of packets that are not lost to the inner endpoint; the lost ones count as
  // taken, as a lossy network's would.
  int send(const PeerAddress* to, const TxPacket* pkts, int n) {
    auto lost = [&](int i) { return muted_->load() && is_receivers_word(pkts[i]); };
    for (int i = 0; i < n;) {
      if (lost(i)) {
        ++i;
        continue;
      }
      int j = i + 1;
      while (j < n && !lost(j)) ++j;
      const int m =
          to ? inner_->tx_burst_to(*to, pkts + i, j - i) : inner_->tx_burst(pkts + i, j - i);
      if (m < j - i) return m < 0 && i == 0 ? m : i + std::max(m, 0);
      i = j;
    }
    return n;
  }

  std::unique_ptr<Endpoint> inner_;
  std::shared_ptr<std::atomic<bool>> muted_;
};

// The switch of every endpoint opened, with the thread that opened it.
struct MuteSwitch {
  std::thread::id opener;
  std::shared_ptr<std::atomic<bool>> muted;
};
std::vector<MuteSwitch> g_switches;  // under g_mu

class MutingDevice final : public Device {
 public:
  explicit MutingDevice(std::unique_ptr<Device> inner) : inner_(std::move(inner)) {}
  const DeviceInfo& info() const override { return inner_->info(); }
  Status open_endpoint(const EndpointOptions& opts, std::unique_ptr<Endpoint>* out) override {
    std::unique_ptr<Endpoint> ep;
    const Status s = inner_->open_endpoint(opts, &ep);
    if (!s) return s;
    auto muted = std::make_shared<std::atomic<bool>>(false);
    *out = std::make_unique<MutingEndpoint>(std::move(ep), muted);
    std::lock_guard<std::mutex> lock(g_mu);
    g_switches.push_back(MuteSwitch{std::this_thread::get_id(), std::move(muted)});
    return s;
  }
  bool can_share() const override { return inner_->can_share(); }

 private:
  std::unique_ptr<Device> inner_;
};

Status open_muting_device(const Config&, std::vector<std::unique_ptr<Device>>* out) {
  out->push_back(std::make_unique<MutingDevice>(make_udp_device(loopback_at(kAddrs[0]))));
  return Status::ok();
}

std::shared_ptr<std::atomic<bool>> switch_of(std::thread::id opener) {
  std::lock_guard<std::mutex> lock(g_mu);
  for (auto it = g_switches.rbegin(); it != g_switches.rend(); ++it)
    if (it->opener == opener) return it->muted;
  return nullptr;
}

// A thread that listens once and leaves: its socket holds that listen's connection alone.
std::thread::id listen_on_a_thread_of_its_own(Engine& e, ConnectionHandle* h,
                                              std::unique_ptr<ListenComm>* listen) {
  std::thread::id id;
  std::thread([&] {
    id = std::this_thread::get_id();
    ASSERT_TRUE(e.listen(0, h, listen));
  }).join();
  return id;
}

// A receiver completes its message and closes at once; its final ACK and both CLOSEs are lost,
// and the connection was the last on its thread's socket. The sender retransmits to that
// socket, which answers with the CLOSE (carrying the receiver's msg_floor): the send ends done.
// Closed with the connection, the socket would have the sender told "port unreachable" (or
// nothing), and the sender would fail a send its receiver had completed.
TEST(SharedUdpEndpoint, OutlivesItsLastConnectionForAPeerThatMissedTheClose) {
  std::shared_ptr<Engine> e;
  ASSERT_TRUE(Engine::acquire(&e, nullptr, &open_muting_device));
  ConnectionHandle h;
  std::unique_ptr<ListenComm> listen;
  const std::thread::id receiver = listen_on_a_thread_of_its_own(*e, &h, &listen);
  ASSERT_NE(listen, nullptr);
  const auto muted = switch_of(receiver);
  ASSERT_NE(muted, nullptr);
  std::unique_ptr<SendComm> send;
  std::unique_ptr<RecvComm> recv;
  ASSERT_NO_FATAL_FAILURE(connect_to(*e, 0, h, *listen, &send, &recv));

  std::vector<uint8_t> out(20'000), in(out.size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<uint8_t>(i * 13 + 5);
  Request *sreq = nullptr, *rreq = nullptr;
  muted->store(true);
  ASSERT_TRUE(recv->irecv(in.data(), in.size(), &rreq));
  ASSERT_TRUE(send->isend(out.data(), out.size(), &sreq));
  ASSERT_NE(rreq, nullptr);
  ASSERT_NE(sreq, nullptr);
  bool sdone = false, rdone = false;
  size_t got = 0;
  auto until = Clock::now() + kPatience;
  while (!rdone && Clock::now() < until) {
    ASSERT_TRUE(recv->test(rreq, &rdone, &got));
    ASSERT_TRUE(send->test(sreq, &sdone, nullptr));
  }
  ASSERT_TRUE(rdone);
  EXPECT_EQ(in, out);
  ASSERT_FALSE(sdone) << "the test needs a send that waits for its receiver's word";
  recv.reset();
  listen.reset();
  muted->store(false);

  Status st;
  until = Clock::now() + kPatience;
  while (!sdone && st && Clock::now() < until) st = send->test(sreq, &sdone, nullptr);
  EXPECT_TRUE(st) << "the sender took its closed receiver for dead: " << errc_name(st.code());
  EXPECT_TRUE(sdone);
}

// The socket closes once it has had no connection for a peer timeout (by the engine's clock),
// and not before: otherwise every thread that ever connected would leave one open.
TEST(SharedUdpEndpoint, ClosesAPeerTimeoutAfterItsLastConnection) {
  FakeClock clock;
  std::shared_ptr<Engine> e;
  ASSERT_TRUE(Engine::acquire(&e, &clock, &open_muting_device));
  ASSERT_EQ(&e->clock(), &clock) << "an engine of an earlier test is still alive";
  const uint64_t linger_ms = static_cast<uint64_t>(e->config().peer_timeout_ms);
  const size_t before = open_fds();
  ConnectionHandle h;
  std::unique_ptr<ListenComm> listen;
  listen_on_a_thread_of_its_own(*e, &h, &listen);
  ASSERT_NE(listen, nullptr);
  const size_t with_socket = open_fds();
  ASSERT_GT(with_socket, before);
  listen.reset();
  // The progress thread looks every millisecond of real time; give it many looks each time.
  auto settle = [&](size_t want) {
    const auto until = Clock::now() + kPatience;
    while (open_fds() != want && Clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
  };
  clock.advance_ms(linger_ms - 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(open_fds(), with_socket) << "closed before a peer timeout";
  clock.advance_ms(1);
  settle(before);
  EXPECT_EQ(open_fds(), before) << "still open after a peer timeout";
}

// NCCL accepts once per listen comm: the endpoint goes to the connection accepted. A second
// accept is the caller's error, refused with kInternal and not a crash, and the connection
// accepted first still carries data.
TEST(Handshake, AListenCommAcceptsOnceAndRefusesAfter) {
  std::shared_ptr<Engine> e;
  ASSERT_TRUE(Engine::acquire(&e, nullptr, &open_muting_device));
  ConnectionHandle h;
  std::unique_ptr<ListenComm> listen;
  ASSERT_TRUE(e->listen(0, &h, &listen));
  std::unique_ptr<SendComm> send;
  std::unique_ptr<RecvComm> recv;
  ASSERT_NO_FATAL_FAILURE(connect_to(*e, 0, h, *listen, &send, &recv));
  std::unique_ptr<RecvComm> again;
  const Status st = listen->accept(&again);
  EXPECT_EQ(st.code(), Errc::kInternal);
  EXPECT_EQ(again, nullptr);
  carry(*send, *recv, 30'000, 0x5A);
}

}  // namespace
}  // namespace optireduce
