// The progress thread's idle sleep over real sockets (transport/idle_sleep.h): what ends it (a
// datagram for an endpoint nobody polls, the waker, a blocked caller that goes away), what it
// leaves alone (an endpoint a caller received on within a millisecond, or blocks on), and,
// through the engine, that an idle process's progress thread sleeps instead of waking every
// OPTIREDUCE_PROGRESS_US.
#include <dirent.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tests/udp/loopback.h"
#include "transport/endpoint_mux.h"
#include "transport/idle_sleep.h"
#include "transport/registry.h"
#include "transport/transport.h"
#include "udp/device.h"

namespace optireduce {
namespace {

using Steady = std::chrono::steady_clock;
constexpr uint64_t kLongNs = 20'000'000'000;  // a sleep nothing ended would last this

double seconds_since(Steady::time_point t0) {
  return std::chrono::duration<double>(Steady::now() - t0).count();
}

// One device on 127.0.0.1, a shared endpoint on it (a mux, as the engine makes one per
// thread), and a sender bound to it, all on the test's own waker and registry.
struct Host {
  FakeClock clock;
  std::unique_ptr<Device> dev = make_udp_device(testing::loopback_at("127.0.0.1"));
  std::shared_ptr<ProgressWaker> waker = std::make_shared<ProgressWaker>();
  Registry registry;
  std::shared_ptr<EndpointMux> mux;
  std::unique_ptr<Endpoint> sender;
  std::atomic<bool> stop{false};

  Host() {
    EndpointOptions o;
    o.unbound = true;
    std::unique_ptr<Endpoint> ep;
    EXPECT_TRUE(dev->open_endpoint(o, &ep).is_ok());
    mux = std::make_shared<EndpointMux>(std::move(ep), clock, waker);
    EXPECT_TRUE(dev->open_endpoint(EndpointOptions{}, &sender).is_ok());
    EXPECT_TRUE(sender->set_peer(mux->local_address()).is_ok());
    clock.advance_us(10'000);
  }

  // A datagram no port of the mux has a token for: it drops it, counted (rx_no_port).
  void send_stray() {
    uint8_t junk[64];
    std::memset(junk, 0x5A, sizeof junk);
    TxPacket p{junk, sizeof junk, 0, nullptr};
    EXPECT_EQ(sender->tx_burst(&p, 1), 1);
  }

  // One idle sleep of up to max_ns on a thread of its own (the progress thread's part: the
  // Sleep scope around the look and the sleep), `during` run once that scope is open.
  // Returns how long it slept, in seconds; *result what it said.
  double sleep_while(uint64_t max_ns, const std::function<void()>& during,
                     IdleSleep* result = nullptr) {
    std::atomic<bool> entered{false};
    double slept = 0;
    IdleSleep r = IdleSleep::kNotIdle;
    std::thread t([&] {
      const std::vector<std::shared_ptr<EndpointMux>> muxes{mux};
      ProgressWaker::Sleep sleep(*waker);
      entered = true;
      const auto t0 = Steady::now();
      r = idle_sleep(muxes, registry, *waker, clock.now_ns(), max_ns, stop);
      slept = seconds_since(t0);
    });
    while (!entered) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    during();
    t.join();
    if (result) *result = r;
    return slept;
  }
};

TEST(IdleSleep, ADatagramForAnEndpointNobodyPollsEndsIt) {
  Host h;
  ASSERT_TRUE(h.waker->usable());
  IdleSleep r;
  const double slept = h.sleep_while(
      kLongNs, [&] { h.send_stray(); }, &r);
  EXPECT_EQ(r, IdleSleep::kWoke);
  EXPECT_LT(slept, 10.0);  // woken by the datagram, not after its 20 s
  h.mux->serve();          // and the drain after it takes the datagram
  EXPECT_EQ(h.mux->counters().rx_no_port, 1u);
}

TEST(IdleSleep, TheWakerEndsIt) {
  Host h;
  const double slept = h.sleep_while(kLongNs, [&] { h.waker->wake(); });
  EXPECT_LT(slept, 10.0);
}

// Within a millisecond of a caller's receive the caller likely polls still: the endpoint is
// its, and the thread keeps its timed sleep (a sleep on the descriptor would wake for every
// datagram the caller takes). So does a stopping engine.
TEST(IdleSleep, NoneWhileACallerReceivedWithinAMillisecond) {
  Host h;
  h.mux->serve();  // from this thread, which is not the progress thread: a caller's drain
  const std::vector<std::shared_ptr<EndpointMux>> muxes{h.mux};
  const uint64_t drained = h.clock.now_ns();
  EXPECT_EQ(idle_sleep(muxes, h.registry, *h.waker, drained + 900'000, kLongNs, h.stop),
            IdleSleep::kNotIdle);
  // A millisecond later it sleeps (up to its 50 ms here).
  EXPECT_EQ(idle_sleep(muxes, h.registry, *h.waker, drained + 1'100'000, 50'000'000, h.stop),
            IdleSleep::kWoke);
  h.stop = true;
  EXPECT_EQ(idle_sleep(muxes, h.registry, *h.waker, drained + 1'100'000, kLongNs, h.stop),
            IdleSleep::kNotIdle);
}

// A caller blocked on the endpoint (wait_for_work) takes what comes: the sleep leaves the
// endpoint to it, so a datagram does not wake the thread too, until the caller goes away.
TEST(IdleSleep, AnEndpointACallerBlocksOnIsLeftToItUntilTheCallerGoes) {
  Host h;
  std::unique_ptr<Endpoint> port;
  ASSERT_TRUE(h.mux->open_port(0x77, &port).is_ok());
  port->set_blocked_waiter(true);
  IdleSleep r;
  double slept = h.sleep_while(
      300'000'000, [&] { h.send_stray(); }, &r);
  EXPECT_EQ(r, IdleSleep::kWoke);
  EXPECT_GE(slept, 0.25);  // the datagram did not end it: its 300 ms did
  slept = h.sleep_while(kLongNs, [&] { port->set_blocked_waiter(false); });
  EXPECT_LT(slept, 10.0);
  // Nobody blocks now: the datagram still waiting ends the next sleep at once.
  slept = h.sleep_while(kLongNs, [] {});
  EXPECT_LT(slept, 10.0);
}

// ---- Through the engine: a process whose connections have nothing in flight.

// Context switches of this process's progress thread (named by the engine), -1 if not found.
long progress_thread_switches() {
  DIR* d = ::opendir("/proc/self/task");
  if (d == nullptr) return -1;
  long total = -1;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    const std::string dir = std::string("/proc/self/task/") + e->d_name;
    std::ifstream comm(dir + "/comm");
    std::string name;
    std::getline(comm, name);
    if (name != "optireduce-prog") continue;
    std::ifstream status(dir + "/status");
    total = 0;
    for (std::string line; std::getline(status, line);) {
      long v = 0;
      if (std::sscanf(line.c_str(), "voluntary_ctxt_switches: %ld", &v) == 1 ||
          std::sscanf(line.c_str(), "nonvoluntary_ctxt_switches: %ld", &v) == 1)
        total += v;
    }
  }
  ::closedir(d);
  return total;
}

TEST(IdleProgress, AnIdleProcessesProgressThreadSleeps) {
  std::shared_ptr<Engine> e;
  ASSERT_TRUE(Engine::acquire(&e, nullptr, &testing::open_loopback));
  // A connection, its receiving end on a thread of its own (a shared endpoint each), and one
  // message over it, both ends tested to the end.
  std::vector<uint8_t> out(300'000), in(out.size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<uint8_t>(i * 7 + 3);
  ConnectionHandle handle;
  std::atomic<bool> listening{false}, finished{false}, leave{false};
  std::unique_ptr<RecvComm> recv;
  const auto until = Steady::now() + std::chrono::seconds(20);
  std::thread receiver([&] {
    std::unique_ptr<ListenComm> listen;
    ASSERT_TRUE(e->listen(0, &handle, &listen));
    listening = true;
    while (recv == nullptr && Steady::now() < until) ASSERT_TRUE(listen->accept(&recv));
    ASSERT_NE(recv, nullptr);
    Request* r = nullptr;
    ASSERT_TRUE(recv->irecv(in.data(), in.size(), &r));
    for (bool done = false; !done && Steady::now() < until;)
      ASSERT_TRUE(recv->test(r, &done, nullptr));
    finished = true;
    while (!leave) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  });
  while (!listening && Steady::now() < until) std::this_thread::yield();
  std::unique_ptr<SendComm> send;
  void* state = nullptr;
  while (send == nullptr && Steady::now() < until)
    ASSERT_TRUE(e->connect(0, handle, ConnOptions{}, &state, &send));
  ASSERT_NE(send, nullptr);
  Request* s = nullptr;
  ASSERT_TRUE(send->isend(out.data(), out.size(), &s));
  for (bool done = false; !done && Steady::now() < until;)
    ASSERT_TRUE(send->test(s, &done, nullptr));
  while (!finished && Steady::now() < until) std::this_thread::yield();
  ASSERT_TRUE(finished);
  EXPECT_EQ(in, out);

  // Idle now: once the last timers (the probe after the final ACK, say) have run out, the
  // thread blocks on the endpoints. Waking every period, it would switch about 500 times in
  // the half second measured.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const long before = progress_thread_switches();
  ASSERT_GE(before, 0) << "no thread named optireduce-prog";
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const long woke = progress_thread_switches() - before;
  std::printf("progress thread: %ld context switches in 500 ms of idleness\n", woke);
  EXPECT_LE(woke, 20);

  // And a second message after the idleness goes through as the first did.
  std::vector<uint8_t> in2(out.size());
  Request* r2 = nullptr;
  ASSERT_TRUE(recv != nullptr);
  leave = true;
  receiver.join();
  ASSERT_TRUE(recv->irecv(in2.data(), in2.size(), &r2));
  ASSERT_TRUE(send->isend(out.data(), out.size(), &s));
  bool sdone = false, rdone = false;
  while ((!sdone || !rdone) && Steady::now() < until) {
    if (!sdone) {
      ASSERT_TRUE(send->test(s, &sdone, nullptr));
    }
    if (!rdone) {
      ASSERT_TRUE(recv->test(r2, &rdone, nullptr));
    }
  }
  EXPECT_TRUE(sdone && rdone);
  EXPECT_EQ(in2, out);
}

}  // namespace
}  // namespace optireduce
