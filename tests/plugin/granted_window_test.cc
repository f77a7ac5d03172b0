// Issue 10, part 4: a receiver advertises only the receive buffer the kernel granted. Two
// processes without CAP_NET_ADMIN ask for a socket buffer far above net.core.rmem_max (so the
// kernel grants a fraction of it) and lift the window ceiling, so that the receiver's advertised
// window alone bounds what is in flight; the receiver reads only every 20 ms, so that whatever
// the sender has in flight must wait in the socket buffer. 64 MiB must then cross byte-exact
// with no datagram dropped at the receiving socket (/proc/net/udp's drops column) and next to no
// retransmission, and each process must say once, not once per connection, how to get the
// buffer it asked for. Advertising the size asked for instead drops 89-261 datagrams here.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "tests/plugin/plugin_loader.h"
#include "tests/plugin/plugin_path.h"
#include "tests/plugin/two_procs.h"
#include "tests/udp/net_admin.h"
#include "transport/transport.h"

namespace optireduce::testing {
namespace {

constexpr size_t kMiB = size_t{1} << 20;
// The transfer: 64 MiB as 8 messages of 8 MiB, all posted at once (NCCL's proxy keeps up to 8
// in flight), so that the sender always has more cleared to send than any window allows.
constexpr size_t kMessageBytes = 8 * kMiB;
constexpr int kMessages = 8;
constexpr uint64_t kSeed = 10;
constexpr uint64_t kCommId = 0x6704;
// OPTIREDUCE_SOCKET_BUFFER and OPTIREDUCE_WINDOW_BYTES accept at most 1 GiB.
constexpr uint64_t kParamMaxBytes = uint64_t{1} << 30;
// The request is this many times net.core.rmem_max, so that the grant is a small part of it.
constexpr uint64_t kAskOverCap = 64;
// Below this ratio the grant is no longer small: an overstated window might then still fit.
constexpr uint64_t kMinAskOverCap = 16;
// The receiver reads its socket once per this many microseconds, as a proxy busy with other
// work might: long enough for a sender to put far more than the granted buffer on loopback
// (about 1 GB/s on a small VM, so 10 ms already fill 8 MiB), short of the loss-probe timer
// (twice the smoothed RTT, which these pauses make about 20 ms: the probe waits for 40 ms).
constexpr unsigned kReadPauseUs = 20'000;
// Retransmission timeout bounds for the test: far above any pause of a loaded machine, so that
// no spurious timeout collapses the congestion window, which would then stay below the granted
// buffer and hide an overstated window. (OPTIREDUCE_PEER_TIMEOUT_MS's 5 s default is at least
// 4x the maximum, as it must be.)
constexpr const char* kRtoMinUs = "500000";
constexpr const char* kRtoMaxUs = "1000000";
// Retransmissions for loss (a SACK's hole, a timeout) allowed per 1000 DATA packets: none are
// due when the window fits. A loss probe resends one packet when no ACK came for two RTTs,
// which a descheduled process makes happen on a loaded machine (ASan in CI: 13 probes, 13
// resends in 1045 packets, no datagram dropped); a probe that finds a real hole shows it by
// the SACK-driven resends that follow, and a dropped datagram by the receiving socket's count.
constexpr uint64_t kRetxPerMille = 10;
constexpr unsigned kTimeoutS = 120;

// One socket's line in /proc/net/udp or udp6.
struct UdpSocketLine {
  bool found = false;
  unsigned remote_port = 0;
  unsigned long long drops = 0;
};

// The socket bound to local port `port`, from /proc/net/udp then /proc/net/udp6 (this process's
// network namespace). The drops column is the last one in both files.
UdpSocketLine udp_socket(unsigned port) {
  UdpSocketLine out;
  for (const char* path : {"/proc/net/udp", "/proc/net/udp6"}) {
    FILE* f = std::fopen(path, "r");
    if (f == nullptr) continue;
    char line[512];
    (void)std::fgets(line, sizeof(line), f);  // the column titles
    while (std::fgets(line, sizeof(line), f) != nullptr) {
      unsigned lport = 0, rport = 0;
      if (std::sscanf(line, " %*u: %*[0-9A-Fa-f]:%x %*[0-9A-Fa-f]:%x", &lport, &rport) != 2 ||
          lport != port)
        continue;
      // The lines end in padding: the last word, not what follows the last blank.
      const char* last = nullptr;
      for (char *save = nullptr, *w = strtok_r(line, " \t\n", &save); w != nullptr;
           w = strtok_r(nullptr, " \t\n", &save))
        last = w;
      out.found = last != nullptr && std::sscanf(last, "%llu", &out.drops) == 1;
      out.remote_port = rport;
      break;
    }
    std::fclose(f);
    if (out.found) break;
  }
  return out;
}

// The UDP port of the listening endpoint a plugin handle names (ConnectionHandle leads it).
unsigned handle_port(const uint8_t* handle) {
  ConnectionHandle h;
  std::memcpy(&h, handle, sizeof(h));
  sockaddr_storage sa{};
  std::memcpy(&sa, h.addr.data, std::min<size_t>(h.addr.len, sizeof(sa)));
  if (sa.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&sa)->sin_port);
  if (sa.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&sa)->sin6_port);
  return 0;
}

int warnings_naming(const char* needle) {
  LogCapture& c = log_capture();
  std::lock_guard<std::mutex> lock(c.mu);
  int n = 0;
  for (const auto& l : c.lines) {
    if (l.rfind("WARN ", 0) == 0 && l.find(needle) != std::string::npos) ++n;
  }
  return n;
}

struct Rank {
  std::unique_ptr<NetApi> net;
  void* ctx = nullptr;
  void* send = nullptr;  // to the peer
  void* recv = nullptr;  // from the peer
  unsigned recv_port = 0;
};

// Drops CAP_NET_ADMIN, loads the plugin and connects both ways (two endpoints in this process,
// for the once-per-process warning), driving connect and accept together as NCCL's proxy does.
Rank set_up(Channel& ch) {
  HCHECK(drop_net_admin() && !has_net_admin(), "cannot drop CAP_NET_ADMIN");
  Rank r;
  std::string err;
  r.net = NetApi::load(plugin_path(), 11, &err);
  HCHECK(r.net != nullptr, "loading %s: %s", plugin_path(), err.c_str());
  HCHECK_OK(r.net->init(&r.ctx, kCommId, -1));
  uint8_t mine[nccl::NCCL_NET_HANDLE_MAXSIZE] = {};
  uint8_t theirs[nccl::NCCL_NET_HANDLE_MAXSIZE] = {};
  void* listen = nullptr;
  HCHECK_OK(r.net->listen(r.ctx, 0, mine, &listen));
  r.recv_port = handle_port(mine);
  HCHECK(r.recv_port != 0, "the handle holds no UDP address");
  ch.send_bytes(mine, sizeof(mine));
  ch.recv_bytes(theirs, sizeof(theirs));
  const double deadline = mono_s() + 30;
  while (r.send == nullptr || r.recv == nullptr) {
    if (r.send == nullptr) HCHECK_OK(r.net->connect(r.ctx, 0, theirs, &r.send));
    if (r.recv == nullptr) HCHECK_OK(r.net->accept(listen, &r.recv));
    HCHECK(mono_s() < deadline, "connection set-up did not finish in 30 s");
  }
  HCHECK_OK(r.net->close_listen(listen));
  return r;
}

void tear_down(Rank& r) {
  HCHECK_OK(r.net->close_send(r.send));
  HCHECK_OK(r.net->close_recv(r.recv));
  HCHECK_OK(r.net->finalize(r.ctx));
}

// Posts every message at once and tests the oldest until all completed; `post` returns the
// request (nullptr: back-pressure, try again), `done` is told of each completion in order.
// Sleeps `pause_us` after each test that finds the oldest still under way.
template <typename Post, typename Done>
void drive(NetApi& net, Post post, Done done, unsigned pause_us = 0) {
  std::deque<std::pair<int, void*>> inflight;
  int next = 0;
  const double deadline = mono_s() + kTimeoutS;
  while (next < kMessages || !inflight.empty()) {
    while (next < kMessages) {
      void* req = post(next);
      if (req == nullptr) break;
      inflight.emplace_back(next++, req);
    }
    if (inflight.empty()) continue;  // refused with nothing outstanding: post again
    int finished = 0;
    int size = -1;
    HCHECK_OK(net.test(inflight.front().second, &finished, &size));
    if (finished) {
      done(inflight.front().first, size);
      inflight.pop_front();
    } else if (pause_us > 0) {
      usleep(pause_us);
    }
    HCHECK(mono_s() < deadline, "stuck at message %d", next);
  }
}

void sender(Channel& ch) {
  Rank r = set_up(ch);
  std::vector<std::vector<uint8_t>> bufs(kMessages, std::vector<uint8_t>(kMessageBytes));
  std::vector<void*> mhs(kMessages);
  for (int i = 0; i < kMessages; ++i)
    HCHECK_OK(r.net->reg_mr(r.send, bufs[i].data(), kMessageBytes, nccl::NCCL_PTR_HOST, &mhs[i]));
  // Every message is ready before the first is posted: the sender then sends as fast as its
  // window lets it, with no pause of its own.
  for (int k = 0; k < kMessages; ++k) fill_pattern(bufs[k].data(), kMessageBytes, kSeed, k);
  drive(
      *r.net,
      [&](int k) {
        void* req = nullptr;
        HCHECK_OK(r.net->isend(r.send, bufs[k].data(), kMessageBytes, 0, mhs[k], &req));
        return req;
      },
      [&](int k, int size) {
        HCHECK(size == static_cast<int>(kMessageBytes), "send %d: size %d", k, size);
      });
  ch.barrier();  // the receiver has every byte and has read its socket's drop count

  optireduceNetStats st{};
  HCHECK(r.net->get_stats(kCommId, &st) == 0, "no statistics for the communicator");
  std::fprintf(stderr,
               "[sender] DATA packets %llu, retransmitted %llu, RTO expiries %llu, probes %llu\n",
               static_cast<unsigned long long>(st.send.dataPkts),
               static_cast<unsigned long long>(st.send.retxPkts),
               static_cast<unsigned long long>(st.send.rtoEvents),
               static_cast<unsigned long long>(st.send.probes));
  // Each probe is one of the resends (transport/send_recovery.cc).
  HCHECK(st.send.probes <= st.send.retxPkts, "%llu probes but %llu resends",
         static_cast<unsigned long long>(st.send.probes),
         static_cast<unsigned long long>(st.send.retxPkts));
  const uint64_t for_loss = st.send.retxPkts - st.send.probes;
  HCHECK(for_loss * 1000 <= st.send.dataPkts * kRetxPerMille,
         "%llu of %llu DATA packets retransmitted for loss: the receiver lost datagrams",
         static_cast<unsigned long long>(for_loss),
         static_cast<unsigned long long>(st.send.dataPkts));
  const int warned = warnings_naming("net.core.rmem_max");
  HCHECK(warned == 1, "the short receive buffer was reported %d times, not once", warned);
  for (int i = 0; i < kMessages; ++i) HCHECK_OK(r.net->dereg_mr(r.send, mhs[i]));
  ch.barrier();
  tear_down(r);
}

void receiver(Channel& ch) {
  Rank r = set_up(ch);
  std::vector<std::vector<uint8_t>> bufs(kMessages, std::vector<uint8_t>(kMessageBytes));
  std::vector<void*> mhs(kMessages);
  for (int i = 0; i < kMessages; ++i)
    HCHECK_OK(r.net->reg_mr(r.recv, bufs[i].data(), kMessageBytes, nccl::NCCL_PTR_HOST, &mhs[i]));
  const UdpSocketLine before = udp_socket(r.recv_port);
  HCHECK(before.found, "no /proc/net/udp line for local port %u", r.recv_port);
  const double start = mono_s();
  drive(
      *r.net,
      [&](int k) {
        void* req = nullptr;
        HCHECK_OK(r.net->irecv(r.recv, bufs[k].data(), kMessageBytes, 0, mhs[k], &req));
        return req;
      },
      [&](int k, int size) {
        HCHECK(size == static_cast<int>(kMessageBytes), "recv %d: size %d", k, size);
      },
      kReadPauseUs);
  const double seconds = mono_s() - start;
  // Checked once everything arrived, so that the receiver reads its socket without pauses.
  for (int k = 0; k < kMessages; ++k) {
    const long long bad = find_mismatch(bufs[k].data(), kMessageBytes, kSeed, k);
    HCHECK(bad < 0, "message %d: wrong byte at offset %lld", k, bad);
  }
  const UdpSocketLine after = udp_socket(r.recv_port);
  const UdpSocketLine peer = udp_socket(after.remote_port);  // the sender's socket (its ACKs)
  // Duplicates are resends of datagrams that had arrived: a sender that saw holes where there
  // were none (the receiver took its datagrams out of order, say), not a loss.
  optireduceNetStats st{};
  HCHECK(r.net->get_stats(kCommId, &st) == 0, "no statistics for the communicator");
  std::fprintf(stderr,
               "[receiver] %d MiB in %.3f s (%.0f MiB/s); drops at the receiving socket %llu, at "
               "the sending socket %llu; duplicates received %llu\n",
               static_cast<int>(kMessages * kMessageBytes / kMiB), seconds,
               kMessages * kMessageBytes / kMiB / seconds, after.drops - before.drops,
               peer.found ? peer.drops : 0ull,
               static_cast<unsigned long long>(st.recv.dropDuplicate));
  HCHECK(after.found && after.drops == before.drops,
         "the receiving socket dropped %llu datagrams: the advertised window overstates its "
         "buffer",
         after.drops - before.drops);
  const int warned = warnings_naming("net.core.rmem_max");
  HCHECK(warned == 1, "the short receive buffer was reported %d times, not once", warned);
  ch.barrier();
  for (int i = 0; i < kMessages; ++i) HCHECK_OK(r.net->dereg_mr(r.recv, mhs[i]));
  ch.barrier();
  tear_down(r);
}

TEST(GrantedWindow, SmallGrantMovesSixtyFourMiBWithoutDrops) {
  const uint64_t rmem_max = rmem_max_bytes();
  ASSERT_GT(rmem_max, 0u) << "cannot read /proc/sys/net/core/rmem_max";
  const uint64_t asked = std::min(kAskOverCap * rmem_max, kParamMaxBytes);
  if (asked < kMinAskOverCap * rmem_max)
    GTEST_SKIP() << "net.core.rmem_max is " << rmem_max << " bytes: no request within "
                 << kParamMaxBytes << " makes its grant small";
  const Env env = {
      {"OPTIREDUCE_DATAPATH", "udp"},
      {"OPTIREDUCE_SOCKET_BUFFER", std::to_string(asked)},
      {"OPTIREDUCE_WINDOW_BYTES", std::to_string(kParamMaxBytes)},
      // The progress thread would otherwise read the socket every millisecond for the paused
      // receiver: its longest period (100 ms) leaves the reading to the receiver's own calls.
      {"OPTIREDUCE_PROGRESS_US", "100000"},
      {"OPTIREDUCE_RTO_MIN_US", kRtoMinUs},
      {"OPTIREDUCE_RTO_MAX_US", kRtoMaxUs},
  };
  EXPECT_EQ(run_pair(sender, receiver, env, kTimeoutS), "");
}

}  // namespace
}  // namespace optireduce::testing
