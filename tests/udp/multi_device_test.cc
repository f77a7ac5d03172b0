// The engine with two UDP devices, as on a host with two NICs: device k's listen handle carries
// interface k's address, and a connection made on device k sends from interface k's address.
// Each device has one socket per thread, shared by every connection that thread opens on it.
// Loopback stands in for the two NICs: 127.0.0.1 and 127.0.0.2 are both on lo, no root needed.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "transport/transport.h"
#include "udp/device.h"
#include "udp/endpoint.h"

namespace optireduce {
namespace {

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

UdpInterface loopback_at(const char* ipv4) {
  UdpInterface itf;
  itf.name = "lo";
  auto* a = reinterpret_cast<sockaddr_in*>(&itf.addr);
  a->sin_family = AF_INET;
  inet_pton(AF_INET, ipv4, &a->sin_addr);
  return itf;
}

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

// Connects device `from` to a listener on device `to` and carries one message across.
void connect_and_send(Engine& e, int from, int to) {
  ConnectionHandle h;
  std::unique_ptr<ListenComm> listen;
  ASSERT_TRUE(e.listen(to, &h, &listen));
  EXPECT_EQ(ip_of(h.addr), kAddrs[to]);

  std::unique_ptr<SendComm> send;
  std::unique_ptr<RecvComm> recv;
  void* state = nullptr;
  const auto until = Clock::now() + kPatience;
  while ((send == nullptr || recv == nullptr) && Clock::now() < until) {
    if (send == nullptr) {
      ASSERT_TRUE(e.connect(from, h, ConnOptions{}, &state, &send));
    }
    if (recv == nullptr) {
      ASSERT_TRUE(listen->accept(&recv));
    }
  }
  ASSERT_NE(send, nullptr);
  ASSERT_NE(recv, nullptr);

  std::vector<uint8_t> out(100000), in(out.size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<uint8_t>(i * 7 + from + to);
  Request* sreq = nullptr;
  Request* rreq = nullptr;
  ASSERT_TRUE(recv->irecv(in.data(), in.size(), &rreq));
  ASSERT_TRUE(send->isend(out.data(), out.size(), &sreq));
  ASSERT_NE(sreq, nullptr);
  ASSERT_NE(rreq, nullptr);
  bool sdone = false, rdone = false;
  size_t got = 0;
  while (!(sdone && rdone) && Clock::now() < until) {
    if (!sdone) {
      ASSERT_TRUE(send->test(sreq, &sdone, nullptr));
    }
    if (!rdone) {
      ASSERT_TRUE(recv->test(rreq, &rdone, &got));
    }
  }
  ASSERT_TRUE(sdone && rdone);
  EXPECT_EQ(got, out.size());
  EXPECT_EQ(in, out);
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
    void* state = nullptr;
    const auto until = Clock::now() + kPatience;
    while ((p.send == nullptr || p.recv == nullptr) && Clock::now() < until) {
      if (p.send == nullptr) {
        ASSERT_TRUE(e->connect(0, h, ConnOptions{}, &state, &p.send));
      }
      if (p.recv == nullptr) {
        ASSERT_TRUE(p.listen->accept(&p.recv));
      }
    }
    ASSERT_NE(p.send, nullptr);
    ASSERT_NE(p.recv, nullptr);
  }
  EXPECT_EQ(open_fds(), before);  // a socket per connection would be 100 more
  connect_and_send(*e, 0, 0);     // and data still crosses beside them
}

}  // namespace
}  // namespace optireduce
