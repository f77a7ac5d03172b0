// wait_for_work (transport/wait.cc): a caller's blocking wait between tests. Over the in-memory
// link with a FakeClock, the receiver's endpoint a double whose descriptor is a pipe the test
// makes readable, so that what ends a wait (a datagram, a timer, nothing to poll) is the
// test's choice and not the scheduler's.
#include <fcntl.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <vector>

#include "tests/unit/device_doubles.h"
#include "tests/unit/mem_link.h"
#include "transport/recv.h"
#include "transport/send.h"
#include "transport/transport.h"
#include "transport/wire.h"

namespace optireduce {
namespace {

using testing::ForwardingEndpoint;
using testing::make_mem_pair;
using testing::MemQueue;
using Steady = std::chrono::steady_clock;

// What the waiter told the endpoint.
struct WaitLog {
  bool pending = false;       // what rx_pending() says: datagrams kept for the connection
  int unseen = 0;             // prepare_wait() says false this many times: "came before the arm"
  int prepared = 0;           // prepare_wait()
  int noted = 0;              // note_readable()
  std::vector<bool> blocked;  // set_blocked_waiter(on), in order
};

// An in-memory endpoint with a descriptor: the read end of a pipe.
class PollableEndpoint final : public ForwardingEndpoint {
 public:
  PollableEndpoint(std::unique_ptr<testing::MemEndpoint> inner, int fd, WaitLog* log)
      : ForwardingEndpoint(std::move(inner)), fd_(fd), log_(log) {}
  int readable_fd() const override { return fd_; }
  bool rx_pending() const override { return log_->pending; }
  void note_readable() override { ++log_->noted; }
  bool prepare_wait() override {
    ++log_->prepared;
    if (log_->unseen == 0) return true;
    --log_->unseen;
    return false;
  }
  void set_blocked_waiter(bool on) override { log_->blocked.push_back(on); }

 private:
  int fd_;
  WaitLog* log_;
};

int cts_count(const MemQueue& q) {
  int n = 0;
  for (const auto& d : q.q) {
    PacketHeader h;
    if (decode(d.data(), d.size(), &h) == DecodeError::kNone && h.type == PacketType::kCts) ++n;
  }
  return n;
}

// A sender over a plain in-memory endpoint (no descriptor) and a receiver over a pollable one.
struct Rig {
  FakeClock clock;
  Config cfg;
  int pipe_fds[2] = {-1, -1};
  WaitLog log;
  std::shared_ptr<MemQueue> to_tx;  // the receiver's CTS and ACKs
  std::shared_ptr<MemQueue> to_rx;  // the sender's DATA
  std::unique_ptr<SendConn> s;
  std::unique_ptr<RecvConn> r;
  std::vector<uint8_t> dst = std::vector<uint8_t>(4000);
  Request* rr = nullptr;

  Rig() {
    EXPECT_EQ(::pipe2(pipe_fds, O_NONBLOCK | O_CLOEXEC), 0);
    auto p = make_mem_pair(1048, &clock);
    to_tx = p.ba;
    to_rx = p.ab;
    ConnParams cp;
    cp.token = 0x5EED;
    cp.pkt_payload = payload_for_datagram(1048);
    cp.peer_window = 256 * 1024;
    s = std::make_unique<SendConn>(cfg, clock, std::move(p.a), cp, nullptr);
    r = std::make_unique<RecvConn>(
        cfg, clock, std::make_unique<PollableEndpoint>(std::move(p.b), pipe_fds[0], &log), cp,
        nullptr);
  }
  ~Rig() {
    for (int fd : pipe_fds)
      if (fd >= 0) ::close(fd);
  }
  // Posts the receive: its CTS goes out and a timer to repeat it is armed.
  void post() {
    ASSERT_TRUE(r->irecv(dst.data(), dst.size(), &rr));
    ASSERT_NE(rr, nullptr);
    bool done = false;
    size_t got = 0;
    ASSERT_TRUE(r->test(rr, &done, &got));
    ASSERT_FALSE(done);
    ASSERT_EQ(cts_count(*to_tx), 1);
    ASSERT_GT(r->next_timer_ns(), clock.now_ns());
  }
  // After post(): the sender takes the CTS and sends all of `src` (the receive's size), which
  // waits in the receiver's queue, its descriptor left quiet.
  void send_all(const std::vector<uint8_t>& src) {
    ASSERT_EQ(src.size(), dst.size());
    Request* sr = nullptr;
    ASSERT_TRUE(s->isend(src.data(), src.size(), &sr));
    bool done = false;
    size_t size = 0;
    ASSERT_TRUE(s->test(sr, &done, &size));
    ASSERT_FALSE(to_rx->q.empty());
  }
};

double seconds_since(Steady::time_point t0) {
  return std::chrono::duration<double>(Steady::now() - t0).count();
}

TEST(WaitForWork, ADatagramAtTheDescriptorEndsIt) {
  Rig rig;
  ASSERT_NO_FATAL_FAILURE(rig.post());
  ASSERT_EQ(::write(rig.pipe_fds[1], "x", 1), 1);  // "a datagram came"
  Request* reqs[] = {rig.rr};
  const auto t0 = Steady::now();
  EXPECT_TRUE(wait_for_work(reqs, 10'000'000'000));
  EXPECT_LT(seconds_since(t0), 1.0);  // not the timer's milliseconds either: it came first
  EXPECT_EQ(rig.log.noted, 1);        // the next receive must look
  EXPECT_EQ(rig.log.blocked, (std::vector<bool>{true, false}));
}

TEST(WaitForWork, SleepsUntilTheEarliestTimerAndNoLonger) {
  Rig rig;
  ASSERT_NO_FATAL_FAILURE(rig.post());
  const double timer_s = double(rig.r->next_timer_ns() - rig.clock.now_ns()) * 1e-9;
  ASSERT_LT(timer_s, 1.0);  // the CTS is repeated within milliseconds
  Request* reqs[] = {rig.rr};
  const auto t0 = Steady::now();
  EXPECT_TRUE(wait_for_work(reqs, 10'000'000'000));
  const double slept = seconds_since(t0);
  EXPECT_GE(slept, timer_s * 0.99);  // it blocked (the fake clock stands still: the real
  EXPECT_LT(slept, timer_s + 2.0);   // sleep is the timer's distance), not for 10 s
  EXPECT_EQ(rig.log.noted, 0);
  EXPECT_EQ(rig.log.blocked, (std::vector<bool>{true, false}));
  // And max_ns bounds it when it is the nearer.
  const auto t1 = Steady::now();
  EXPECT_TRUE(wait_for_work(reqs, 1'000'000));
  EXPECT_LT(seconds_since(t1), timer_s + 1.0);
}

TEST(WaitForWork, ATimerDueIsServedAtOnce) {
  Rig rig;
  ASSERT_NO_FATAL_FAILURE(rig.post());
  rig.clock.advance_ns(rig.r->next_timer_ns() - rig.clock.now_ns() + 1);
  Request* reqs[] = {rig.rr};
  const auto t0 = Steady::now();
  EXPECT_TRUE(wait_for_work(reqs, 10'000'000'000));
  EXPECT_LT(seconds_since(t0), 1.0);
  EXPECT_EQ(cts_count(*rig.to_tx), 2);  // the wait's pass repeated the CTS
  EXPECT_GT(rig.r->next_timer_ns(), rig.clock.now_ns());
  EXPECT_TRUE(rig.log.blocked.empty());  // without blocking
}

// Datagrams another caller of a shared endpoint received for the connection wait in its port
// (rx_pending), where no descriptor shows them: the wait takes them in a pass of its own at
// once, since the caller may be testing another connection's request.
TEST(WaitForWork, DatagramsKeptForTheConnectionAreTakenAtOnce) {
  Rig rig;
  ASSERT_NO_FATAL_FAILURE(rig.post());
  std::vector<uint8_t> src(rig.dst.size());
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 5 + 3);
  ASSERT_NO_FATAL_FAILURE(rig.send_all(src));
  rig.log.pending = true;
  Request* reqs[] = {rig.rr};
  const auto t0 = Steady::now();
  EXPECT_TRUE(wait_for_work(reqs, 10'000'000'000));
  EXPECT_LT(seconds_since(t0), 1.0);
  EXPECT_TRUE(rig.to_rx->q.empty());     // the wait's pass took them
  EXPECT_TRUE(rig.log.blocked.empty());  // without blocking
  rig.log.pending = false;
  bool done = false;
  size_t size = 0;
  ASSERT_TRUE(rig.r->test(rig.rr, &done, &size));
  EXPECT_TRUE(done);
  EXPECT_EQ(rig.dst, src);
}

// A descriptor that shows only what comes after it is armed (a verbs completion channel) may
// have missed datagrams that came since the caller's last pass: the endpoint says so when the
// wait prepares, and the wait takes them in a pass rather than sleeping past them.
TEST(WaitForWork, WhatCameBeforeTheDescriptorWasArmedIsTakenNotSleptOn) {
  Rig rig;
  ASSERT_NO_FATAL_FAILURE(rig.post());
  std::vector<uint8_t> src(rig.dst.size());
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 11 + 5);
  ASSERT_NO_FATAL_FAILURE(rig.send_all(src));  // the pipe stays empty: "no event"
  rig.log.unseen = 1;
  Request* reqs[] = {rig.rr};
  EXPECT_TRUE(wait_for_work(reqs, 10'000'000'000));
  EXPECT_EQ(rig.log.prepared, 1);
  EXPECT_TRUE(rig.to_rx->q.empty());     // the wait's pass took them
  EXPECT_EQ(rig.log.noted, 1);           // and looked, whatever the endpoint's idle streak
  EXPECT_TRUE(rig.log.blocked.empty());  // without blocking
  bool done = false;
  size_t size = 0;
  ASSERT_TRUE(rig.r->test(rig.rr, &done, &size));
  EXPECT_TRUE(done);
  EXPECT_EQ(rig.dst, src);
  // Prepared with nothing unseen, the next wait blocks (to the CTS timer's end or max_ns).
  EXPECT_TRUE(wait_for_work(reqs, 1'000'000));
  EXPECT_EQ(rig.log.prepared, 2);
  EXPECT_EQ(rig.log.blocked, (std::vector<bool>{true, false}));
}

TEST(WaitForWork, NothingToPollSaysSoWithoutSleeping) {
  Rig rig;
  std::vector<uint8_t> src(4000, 7);
  Request* sr = nullptr;
  ASSERT_TRUE(rig.s->isend(src.data(), src.size(), &sr));
  ASSERT_NE(sr, nullptr);
  Request* mixed[] = {nullptr, sr};  // the sender's endpoint has no descriptor
  Request* none[] = {nullptr};
  const auto t0 = Steady::now();
  EXPECT_FALSE(wait_for_work(mixed, 10'000'000'000));
  EXPECT_FALSE(wait_for_work(none, 10'000'000'000));
  EXPECT_FALSE(wait_for_work({}, 10'000'000'000));
  EXPECT_LT(seconds_since(t0), 1.0);
}

}  // namespace
}  // namespace optireduce
