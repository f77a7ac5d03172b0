// A peer that dies, stops or idles, seen through the plugin as NCCL drives it (two processes,
// ABI v11, OPTIREDUCE_PEER_TIMEOUT_MS = 1 s):
//  - SIGKILLed while the other side waits in a receive or in a send, exact and bounded: the
//    waiting request fails with ncclRemoteError within the bound (over UDP the host's ICMP
//    says so at once; over verbs, where nothing says so, the keepalive finds it). Bounded
//    requests before that end by their deadlines, as always.
//  - SIGSTOPped past the bound (what a lost node looks like: its socket still exists, nothing
//    answers): the same error, not before the bound.
//  - idle for three bounds, then SIGSTOPped for half of one, under 5% loss: no error, and the
//    message then sent arrives byte-exact.
//  - closing a receive connection as soon as its receive is done, under 5% loss: no error on
//    the sending side, whose final ACK may have been lost.
// The datapath follows OPTIREDUCE_DATAPATH: UDP on the host, verbs in the rxe VM
// (tests/verbs/rxe-plugin-suite.sh).
#include <gtest/gtest.h>

#include <signal.h>

#include <cinttypes>
#include <cstdlib>
#include <string>

#include "tests/plugin/plugin_path.h"
#include "tests/plugin/procs.h"
#include "tests/plugin/requests.h"

namespace optireduce::testing {
namespace {

constexpr int kBoundedClass = 0x4F52;  // OPTIREDUCE_BOUNDED_TRAFFIC_CLASS's default
constexpr double kDeadlineMs = 50;     // OPTIREDUCE_TIMEOUT_MS: bounded steps' fixed deadline
constexpr size_t kSize = 256 * 1024;
constexpr int kNcclRemoteError = 6;
constexpr int kSurvivor = 0;
constexpr int kPeer = 1;

// OPTIREDUCE_PEER_TIMEOUT_MS in these tests, and the scheduling slack on top of it: 1 s and
// 0.5 s on a loaded 2-core host; the rxe VM (software emulation, 10-50x slower) raises both
// through PEER_DEATH_TEST_TIMEOUT_MS and PEER_DEATH_TEST_SLACK_MS. And how much earlier than
// the bound an error may come as the test measures it (PEER_DEATH_TEST_EARLY_MS, 50 ms): the
// transport last heard the peer when its datagram arrived, the test once the call that carried
// it returned, which in the VM came 51 ms later once.
double env_ms(const char* name, double dflt) {
  const char* s = std::getenv(name);
  return s != nullptr ? std::atof(s) : dflt;
}
const double kBoundMs = env_ms("PEER_DEATH_TEST_TIMEOUT_MS", 1000);
double slack_ms() { return env_ms("PEER_DEATH_TEST_SLACK_MS", 500); }
double early_ms() {
  return env_ms("PEER_DEATH_TEST_EARLY_MS", 50);
}

enum class Mode { kExact, kBounded };
enum class Wait { kRecv, kSendUnposted, kSendPosted };

Env env_for(double drop) {
  Env env = {{"OPTIREDUCE_PEER_TIMEOUT_MS", std::to_string(static_cast<int>(kBoundMs))},
             {"OPTIREDUCE_TIMEOUT_MS", std::to_string(static_cast<int>(kDeadlineMs))}};
  if (drop > 0) {
    env.push_back({"OPTIREDUCE_FAULT_DROP", std::to_string(drop)});
    env.push_back({"OPTIREDUCE_FAULT_SEED", "4242"});
  }
  return env;
}

Node open_pair(Mesh& m, Mode mode) {
  return open_node(m, plugin_path(), 11, 0xDEAD0 + static_cast<int>(mode),
                   mode == Mode::kBounded ? kBoundedClass : -1);
}

// One message each way, checked, so that both connections are live and (bounded) the sender
// knows its receiver's budget before anything dies.
// Returns when (mono_s) its last request completed: the peer was last heard about then.
double warm_up(Mesh& m, Node& node, Mode mode) {
  const int other = 1 - m.rank;
  std::vector<uint8_t> tx(kSize), rx(kSize);
  fill_pattern(tx.data(), kSize, 0x77 + m.rank, 0);
  void* rr = post_recv(*node.net, node.peer[other].recv, rx.data(), kSize);
  void* sr = post_send(*node.net, node.peer[other].send, tx.data(), kSize);
  for (int sd = 0, rd = 0; !(sd && rd);) {
    int size = 0;
    if (!sd) HCHECK_OK(node.net->test(sr, &sd, &size));
    if (!rd) HCHECK_OK(node.net->test(rr, &rd, &size));
  }
  const double done = mono_s();
  // Bounded delivery may lose a packet even here (fault injection): only exact must be whole.
  if (mode == Mode::kExact) {
    HCHECK(find_mismatch(rx.data(), kSize, 0x77 + other, 0) < 0, "warm-up message corrupted");
  }
  m.barrier();
  return done;
}

// Posts requests on the survivor's connection to the peer (a receive or a send) and tests
// them, one at a time, until one fails. Bounded requests that end meanwhile (by deadline or
// expiry) are counted in *completed; an exact one completing is a failure. Returns the ms from
// `t0` to the error. `first` is the request already posted (null: post one).
double until_remote_error(Node& node, bool recv, void* first, double t0, double limit_ms,
                          bool bounded, int* completed) {
  std::vector<uint8_t> buf(kSize);
  void* comm = recv ? node.peer[kPeer].recv : node.peer[kPeer].send;
  void* req = first;
  for (;;) {
    const double elapsed = (mono_s() - t0) * 1e3;
    HCHECK(elapsed <= limit_ms, "no ncclRemoteError %.0f ms after the peer went away (bound %.0f)",
           elapsed, limit_ms);
    if (req == nullptr) {
      const int r = recv ? node.net->irecv(comm, buf.data(), kSize, 0, nullptr, &req)
                         : node.net->isend(comm, buf.data(), kSize, 0, nullptr, &req);
      if (r == kNcclRemoteError) return (mono_s() - t0) * 1e3;
      HCHECK(r == 0, "posting returned %d", r);
      continue;
    }
    int done = 0, size = 0;
    const int r = node.net->test(req, &done, &size);
    if (r == kNcclRemoteError) return (mono_s() - t0) * 1e3;
    HCHECK(r == 0, "test returned %d", r);
    if (done) {
      HCHECK(bounded, "an exact %s completed although its peer is gone", recv ? "receive" : "send");
      ++*completed;
      req = nullptr;
    }
    breathe();
  }
}

struct DeathCase {
  Mode mode;
  Wait wait;
};

class PeerKilled : public ::testing::TestWithParam<DeathCase> {};

TEST_P(PeerKilled, TheWaitingSideGetsRemoteErrorWithinTheBound) {
  const DeathCase c = GetParam();
  auto rank = [c](Mesh& m) {
    Node node = open_pair(m, c.mode);
    warm_up(m, node, c.mode);
    const bool recv = c.wait == Wait::kRecv;
    if (m.rank == kPeer) {
      std::vector<uint8_t> buf(32 << 20);
      void* rr = nullptr;
      if (c.wait == Wait::kSendPosted) {
        // A large receive, so that the survivor is mid-transfer when this process dies.
        rr = post_recv(*node.net, node.peer[kSurvivor].recv, buf.data(), buf.size());
      }
      m.channel[kSurvivor]->recv<uint32_t>();  // the survivor's request is posted
      m.channel[kSurvivor]->send<uint32_t>(1);
      if (c.wait == Wait::kSendPosted) {
        // Let the transfer start, but not finish: 32 MiB takes 7-10 ms on loopback here, so
        // 2 ms of tests leave most of it in flight (with 10 ms an exact send completed before
        // the kill once receives got faster). Bounded: the receive may still end by deadline.
        int done = 0;
        for (int i = 0; i < 4 && !done; ++i) {
          int size = 0;
          HCHECK_OK(node.net->test(rr, &done, &size));
          usleep(500);
        }
      }
      raise(SIGKILL);
    }
    std::vector<uint8_t> big(32 << 20);
    fill_pattern(big.data(), big.size(), 5, 5);
    void* const req = recv ? post_recv(*node.net, node.peer[kPeer].recv, big.data(), kSize)
                           : post_send(*node.net, node.peer[kPeer].send, big.data(),
                                       c.wait == Wait::kSendPosted ? big.size() : kSize);
    m.channel[kPeer]->send<uint32_t>(1);
    m.channel[kPeer]->recv<uint32_t>();
    const double t0 = mono_s();  // the peer dies right after this answer
    int completed = 0;
    const double ms = until_remote_error(node, recv, req, t0, kBoundMs + slack_ms(),
                                         c.mode == Mode::kBounded, &completed);
    std::fprintf(stderr,
                 "survivor: ncclRemoteError %.0f ms after the peer's death (%d bounded "
                 "requests ended by deadline or expiry first)\n",
                 ms, completed);
    // Once dead, always dead: the next request fails at once.
    void* again = nullptr;
    const int r =
        recv ? node.net->irecv(node.peer[kPeer].recv, big.data(), kSize, 0, nullptr, &again)
             : node.net->isend(node.peer[kPeer].send, big.data(), kSize, 0, nullptr, &again);
    HCHECK(r == kNcclRemoteError && again == nullptr, "a request after the error returned %d", r);
    close_node(node);  // closing a failed connection is no error
  };
  EXPECT_EQ(run_ranks(2, rank, env_for(0), 60, kPeer), "");
}

INSTANTIATE_TEST_SUITE_P(Modes, PeerKilled,
                         ::testing::Values(DeathCase{Mode::kExact, Wait::kRecv},
                                           DeathCase{Mode::kExact, Wait::kSendUnposted},
                                           DeathCase{Mode::kExact, Wait::kSendPosted},
                                           DeathCase{Mode::kBounded, Wait::kRecv},
                                           DeathCase{Mode::kBounded, Wait::kSendUnposted},
                                           DeathCase{Mode::kBounded, Wait::kSendPosted}),
                         [](const ::testing::TestParamInfo<DeathCase>& p) {
                           std::string name = p.param.mode == Mode::kExact ? "Exact" : "Bounded";
                           name += p.param.wait == Wait::kRecv ? "WaitingInReceive"
                                   : p.param.wait == Wait::kSendUnposted
                                       ? "WaitingInSendForCts"
                                       : "WaitingInSendMidTransfer";
                           return name;
                         });

class PeerStopped : public ::testing::TestWithParam<Mode> {};

// A stopped process keeps its socket (no ICMP): only the keepalive can tell. The error must
// come at the bound, neither before (the peer might have come back) nor long after.
TEST_P(PeerStopped, PastTheBoundIsAnError) {
  const Mode mode = GetParam();
  auto rank = [mode](Mesh& m) {
    Node node = open_pair(m, mode);
    const double heard = warm_up(m, node, mode);
    if (m.rank == kPeer) {
      m.channel[kSurvivor]->send<int32_t>(getpid());
      for (;;) pause();  // stopped, then killed, by the survivor
    }
    const pid_t peer = m.channel[kPeer]->recv<int32_t>();
    std::vector<uint8_t> buf(kSize);
    // The transport counts the silence from when the peer was last heard, the end of the
    // warm-up: a wait that begins within a ping interval of the last one continues its busy
    // period (transport/liveness.h), so the silence may have begun before this receive was
    // posted. The lower bound is checked from there. From the stop, a loaded machine (the VM
    // under TCG) once took 79 ms to come back from irecv and send the signal, and the error
    // came 2921 ms after it, rightly; once the receive was posted 66 ms after the warm-up
    // ended, and the error came 2934 ms after the post, rightly too.
    const double posted = mono_s();
    void* const req = post_recv(*node.net, node.peer[kPeer].recv, buf.data(), kSize);
    HCHECK(kill(peer, SIGSTOP) == 0, "SIGSTOP failed");
    const double t0 = mono_s();
    int completed = 0;
    const double ms = until_remote_error(node, true, req, t0, kBoundMs + slack_ms(),
                                         mode == Mode::kBounded, &completed);
    const double since_posted = ms + (t0 - posted) * 1e3;
    const double since_heard = ms + (t0 - heard) * 1e3;
    std::fprintf(stderr,
                 "survivor: ncclRemoteError %.0f ms after the peer stopped, %.0f ms after the "
                 "receive was posted, %.0f ms after the peer was last heard\n",
                 ms, since_posted, since_heard);
    HCHECK(since_heard >= kBoundMs - early_ms(),
           "declared dead %.0f ms after the peer was last heard, before the %.0f ms bound",
           since_heard, kBoundMs);
    kill(peer, SIGKILL);
    close_node(node);  // closing a failed connection is no error
  };
  EXPECT_EQ(run_ranks(2, rank, env_for(0), 60, kPeer), "");
}

class PeerAlive : public ::testing::TestWithParam<Mode> {};

// Under 5% loss each way the peer's application posts nothing for three bounds (its transport
// answers the keepalives), then its process is stopped for half a bound and resumed; then it
// sends. The survivor's receives see no error, and the message arrives (exact: byte-exact).
TEST_P(PeerAlive, IdleOrBrieflyStoppedUnderLossIsNeverDead) {
  const Mode mode = GetParam();
  auto rank = [mode](Mesh& m) {
    Node node = open_pair(m, mode);
    warm_up(m, node, mode);
    if (m.rank == kPeer) {
      m.channel[kSurvivor]->send<int32_t>(getpid());
      m.channel[kSurvivor]->recv<uint32_t>();  // idle (and stopped) until the survivor says
      std::vector<uint8_t> tx(kSize);
      fill_pattern(tx.data(), kSize, 0xA11, 1);
      wait_done(*node.net, post_send(*node.net, node.peer[kSurvivor].send, tx.data(), kSize));
      m.channel[kSurvivor]->recv<uint32_t>();
      close_node(node);
      return;
    }
    const pid_t peer = m.channel[kPeer]->recv<int32_t>();
    std::vector<uint8_t> rx(kSize);
    auto post = [&] { return post_recv(*node.net, node.peer[kPeer].recv, rx.data(), kSize); };
    // Bounded receives end by their deadline meanwhile; each is posted again, as steps are.
    void* rr = post();
    int ended = 0;
    auto poll_for = [&](double ms) {
      const double end = mono_s() + ms / 1e3;
      while (mono_s() < end) {
        int done = 0, size = 0;
        const int r = node.net->test(rr, &done, &size);
        HCHECK(r == 0, "test returned %d while the peer was alive", r);
        if (done) {
          HCHECK(mode == Mode::kBounded, "an exact receive completed with nothing sent");
          ++ended;
          rr = post();
        }
        breathe();
      }
    };
    poll_for(3 * kBoundMs);
    HCHECK(kill(peer, SIGSTOP) == 0, "SIGSTOP failed");
    poll_for(kBoundMs / 2);
    HCHECK(kill(peer, SIGCONT) == 0, "SIGCONT failed");
    m.channel[kPeer]->send<uint32_t>(1);
    if (mode == Mode::kBounded) {
      // The next bounded receive after the peer's isend may still end by deadline under loss;
      // what matters here is that none fails.
      poll_for(500);
    } else {
      wait_done(*node.net, rr);
      HCHECK(find_mismatch(rx.data(), kSize, 0xA11, 1) < 0,
             "the message after the stall is corrupt");
    }
    std::fprintf(stderr,
                 "survivor: no error over %.1f s idle and stopped (%d bounded receives "
                 "ended by deadline)\n",
                 3.5 * kBoundMs / 1e3, ended);
    m.channel[kPeer]->send<uint32_t>(1);
    close_node(node);
  };
  EXPECT_EQ(run_ranks(2, rank, env_for(0.05), 60), "");
}

// NCCL closes a receive connection as soon as its last receive is done, while the sender's
// last send may still wait for its final ACK, which 5% loss drops now and then. That is no
// error: the receiver's CLOSE says what it completed (msg_floor, transport/wire.h). Round after
// round, a fresh communicator, one exact message, and the receiver closes at once. On the host
// the sender mostly repairs the ACK before the CLOSE arrives; in the rxe VM, where timers and
// closes are slower, the code before the fix failed in round 5, 11 and 6 of three runs.
TEST(PeerCloses, RightAfterItsLastReceiveUnderLossIsNoError) {
  constexpr int kRounds = 30;
  constexpr size_t kBytes = 64 * 1024;
  auto rank = [](Mesh& m) {
    for (int round = 0; round < kRounds; ++round) {
      Node node = open_node(m, plugin_path(), 11, 0xC105E00 + static_cast<uint64_t>(round), -1);
      std::vector<uint8_t> buf(kBytes);
      if (m.rank == kSurvivor) fill_pattern(buf.data(), kBytes, 0xC105E, uint64_t(round));
      void* const req = m.rank == kSurvivor
                            ? post_send(*node.net, node.peer[kPeer].send, buf.data(), kBytes)
                            : post_recv(*node.net, node.peer[kSurvivor].recv, buf.data(), kBytes);
      for (int done = 0; !done;) {
        int size = 0;
        const int r = node.net->test(req, &done, &size);
        HCHECK(r == 0, "rank %d, round %d: test returned %d", m.rank, round, r);
      }
      if (m.rank == kPeer) {
        HCHECK(find_mismatch(buf.data(), kBytes, 0xC105E, static_cast<uint64_t>(round)) < 0,
               "round %d: the message is corrupt", round);
      }
      close_node(node);  // the receiver at once, the sender once its send is done
    }
  };
  EXPECT_EQ(run_ranks(2, rank, env_for(0.05), 120), "");
}

auto mode_name = [](const ::testing::TestParamInfo<Mode>& p) {
  return std::string(p.param == Mode::kExact ? "Exact" : "Bounded");
};
INSTANTIATE_TEST_SUITE_P(Modes, PeerStopped, ::testing::Values(Mode::kExact, Mode::kBounded),
                         mode_name);
INSTANTIATE_TEST_SUITE_P(Modes, PeerAlive, ::testing::Values(Mode::kExact, Mode::kBounded),
                         mode_name);

}  // namespace
}  // namespace optireduce::testing
