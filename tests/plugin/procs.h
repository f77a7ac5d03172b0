// N-process scaffolding for bounded-mode tests and benchmarks of the built plugin: full-mesh
// out-of-band channels, alarm()-bounded children (one may be a SIGKILL victim), all-pairs
// set-up through the ABI, the timed all-to-all step and the packet-grid hole classifier.
#pragma once

#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tests/plugin/plugin_loader.h"
#include "tests/plugin/two_procs.h"

namespace optireduce::testing {

// One rank's view of the others: channel[j] reaches rank j (null for itself).
struct Mesh {
  int rank = 0;
  int n = 0;
  std::vector<std::unique_ptr<Channel>> channel;

  // Every rank in `who` (which must include this one) calls it; returns once all reached it.
  void barrier(const std::vector<int>& who) {
    for (int j : who) {
      if (j != rank) channel[j]->send<uint32_t>(0xBA77);
    }
    for (int j : who) {
      if (j != rank) HCHECK(channel[j]->recv<uint32_t>() == 0xBA77, "barrier out of step");
    }
  }
  void barrier() {
    std::vector<int> all;
    for (int j = 0; j < n; ++j) all.push_back(j);
    barrier(all);
  }
};

// Runs fn in n forked children (rank 0..n-1), each with OPTIREDUCE_IFNAME=lo plus `env` and an
// alarm after timeout_s. Returns "" when every child exited 0 and `victim` (if >= 0) died of
// SIGKILL, else what went wrong; on the first failure the other children are killed.
inline std::string run_ranks(int n, const std::function<void(Mesh&)>& fn, const Env& env,
                             unsigned timeout_s, int victim = -1) {
  timeout_s = scaled_timeout(timeout_s);
  std::vector<std::vector<int>> fd(n, std::vector<int>(n, -1));
  for (int i = 0; i < n; ++i) {
    for (int j = i + 1; j < n; ++j) {
      int sv[2];
      if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return "socketpair failed";
      fd[i][j] = sv[0];
      fd[j][i] = sv[1];
    }
  }
  CheckReports reports(n);
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<pid_t> pids(n, -1);
  for (int r = 0; r < n; ++r) {
    pids[r] = fork();
    if (pids[r] < 0) return "fork failed";
    if (pids[r] == 0) {
      reports.in_child(r);
      alarm(timeout_s);
      Mesh m;
      m.rank = r;
      m.n = n;
      m.channel.resize(n);
      for (int i = 0; i < n; ++i) {
        for (int j = 0; j < n; ++j) {
          if (fd[i][j] < 0) continue;
          if (i == r) {
            m.channel[j] = std::make_unique<Channel>(fd[i][j]);
          } else {
            close(fd[i][j]);  // so that a dead peer shows as EOF, not silence
          }
        }
      }
      setenv("OPTIREDUCE_IFNAME", "lo", 1);
      for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
      fn(m);
      std::fflush(stdout);
      std::fflush(stderr);
      _exit(0);
    }
  }
  for (auto& row : fd) {
    for (int f : row) {
      if (f >= 0) close(f);
    }
  }
  reports.in_parent();
  return reap_children(pids, timeout_s, victim, &reports);
}

// A rank's connections: peer[j].send carries this rank -> j, peer[j].recv j -> this rank.
struct Node {
  std::unique_ptr<NetApi> net;
  void* ctx = nullptr;
  uint64_t comm_id = 0;  // what optireduceNetGetStats needs (NetApi::stats_id)
  struct Peer {
    void* send = nullptr;
    void* recv = nullptr;
  };
  std::vector<Peer> peer;

  optireduceNetStats stats() const {
    optireduceNetStats st{};
    HCHECK(net->get_stats(comm_id, &st) == 0, "optireduceNetGetStats(%llu) found no communicator",
           static_cast<unsigned long long>(comm_id));
    return st;
  }
};

// Loads the plugin, inits one communicator and connects every pair of ranks both ways, as
// NCCL's proxy would: every connect and accept polled, none blocking.
inline constexpr uint32_t kNcclOpAllReduce = 1u << 4;  // ncclFuncAllReduce's bit

inline Node open_node(Mesh& m, const std::string& path, int version, uint64_t comm_id,
                      int traffic_class) {
  Node node;
  std::string err;
  node.net = NetApi::load(path, version, &err);
  HCHECK(node.net != nullptr, "loading %s v%d: %s", path.c_str(), version, err.c_str());
  HCHECK_OK(node.net->init(&node.ctx, comm_id, traffic_class));
  // Every exchange of these tests stands for a Simple-protocol allreduce, which NCCL 2.28 (v11)
  // announces so before its transfers (plugin/transfer_kind.h).
  HCHECK_OK(node.net->set_net_attr(node.ctx, kNcclOpAllReduce, nccl::NCCL_NET_PROTO_SIMPLE));
  node.comm_id = node.net->stats_id(comm_id);
  node.peer.resize(m.n);
  using Handle = std::array<uint8_t, nccl::NCCL_NET_HANDLE_MAXSIZE>;
  std::vector<Handle> mine(m.n), theirs(m.n);
  std::vector<void*> listens(m.n, nullptr);
  for (int j = 0; j < m.n; ++j) {
    if (j == m.rank) continue;
    HCHECK_OK(node.net->listen(node.ctx, 0, mine[j].data(), &listens[j]));
    m.channel[j]->send_bytes(mine[j].data(), mine[j].size());
  }
  for (int j = 0; j < m.n; ++j) {
    if (j != m.rank) m.channel[j]->recv_bytes(theirs[j].data(), theirs[j].size());
  }
  int pending = 2 * (m.n - 1);
  const double deadline = mono_s() + 30;
  while (pending > 0) {
    for (int j = 0; j < m.n; ++j) {
      if (j == m.rank) continue;
      Node::Peer& p = node.peer[j];
      if (p.send == nullptr) {
        HCHECK_OK(node.net->connect(node.ctx, 0, theirs[j].data(), &p.send));
        if (p.send != nullptr) --pending;
      }
      if (p.recv == nullptr) {
        HCHECK_OK(node.net->accept(listens[j], &p.recv));
        if (p.recv != nullptr) {
          --pending;
          HCHECK_OK(node.net->close_listen(listens[j]));
        }
      }
    }
    HCHECK(mono_s() < deadline, "rank %d: connection set-up not done in 30 s", m.rank);
  }
  // NCCL starts a communicator's traffic once every rank is connected; so do we, so that the
  // first step does not also measure the slowest rank's set-up.
  m.barrier();
  return node;
}

inline void close_node(Node& node) {
  for (Node::Peer& p : node.peer) {
    if (p.send != nullptr) HCHECK_OK(node.net->close_send(p.send));
    if (p.recv != nullptr) HCHECK_OK(node.net->close_recv(p.recv));
  }
  node.peer.clear();
  HCHECK_OK(node.net->finalize(node.ctx));
}

// The payload bytes of one DATA packet for a datagram limit: the transport's wire header is
// 48 bytes and payloads are cut on an 8-byte grid (transport/wire.h, payload_for_datagram).
inline constexpr size_t packet_payload(size_t max_datagram) {
  return (max_datagram - 48) & ~size_t{7};
}

enum class HoleFill { kZero, kMarker };

// What a bounded receive's buffer holds, packet by packet: each packet either exactly what was
// sent or wholly filled; `bad` is the offset of the first byte that is neither (-1: none).
struct GridCount {
  size_t delivered = 0;
  size_t missing = 0;
  long long bad = -1;
};

inline bool is_fill(const uint8_t* p, size_t off, size_t len, HoleFill fill) {
  for (size_t i = 0; i < len; ++i) {
    // The marker is 0x7FF1 in host (little-endian) order on even offsets.
    const uint8_t want = fill == HoleFill::kZero ? 0 : ((off + i) % 2 == 0 ? 0xF1 : 0x7F);
    if (p[off + i] != want) return false;
  }
  return true;
}

inline GridCount classify(const uint8_t* got, const uint8_t* want, size_t size, size_t pkt,
                          HoleFill fill) {
  GridCount g;
  for (size_t off = 0; off < size; off += pkt) {
    const size_t len = std::min(pkt, size - off);
    if (std::memcmp(got + off, want + off, len) == 0) {
      g.delivered += len;
    } else if (is_fill(got, off, len, fill)) {
      g.missing += len;
    } else {
      for (size_t i = 0; i < len; ++i) {
        if (got[off + i] != want[off + i]) {
          g.bad = static_cast<long long>(off + i);
          break;
        }
      }
      return g;
    }
  }
  return g;
}

// Milliseconds this thread has spent runnable but waiting for a CPU (the scheduler's run-queue
// delay, /proc/thread-self/schedstat); 0 where the kernel does not say. A completion seen late
// by that much was late because the host had no core for us, not because of the transport.
inline double run_queue_wait_ms() {
  FILE* f = std::fopen("/proc/thread-self/schedstat", "r");
  if (f == nullptr) return 0;
  unsigned long long run = 0, wait = 0;
  const int got = std::fscanf(f, "%llu %llu", &run, &wait);
  std::fclose(f);
  return got == 2 ? static_cast<double>(wait) / 1e6 : 0;
}

// Sleeps a few microseconds: polling ranks share 2 cores in CI, and a rank that never yields
// delays the very peers it waits for.
inline void breathe() {
  struct timespec ts = {0, 50'000};
  nanosleep(&ts, nullptr);
}

// ---- One all-to-all step: every rank sends one `size`-byte message to every peer and receives
// one from each, through the ABI, polling like NCCL's proxy. Buffers rotate through `ring`
// slots; after a receive is checked its slot is scribbled over and must still be scribbled
// when the slot comes round again, so a datagram written after completion is caught.
struct ExchangeOptions {
  size_t size = 0;
  size_t pkt = 0;  // packet payload (the hole grid)
  HoleFill fill = HoleFill::kZero;
  bool verify = true;  // patterns, grid check, scribbles (off: timing only, for the benchmark)
  bool expect_exact = false;
  int ring = 4;
  double hang_s = 20;  // a step longer than this is a hang: the rank fails
  // A peer that is meant to die: its requests may fail with ncclRemoteError, after which that
  // direction (send to it, receive from it) leaves the exchange. Any other error still fails.
  int mortal = -1;
};

inline constexpr int kNcclRemoteError = 6;

struct StepRecord {
  double step_ms = 0;
  double max_recv_ms = 0;  // longest receive, from its irecv to the test() that saw it done
  double max_send_ms = 0;
  double cpu_wait_ms = 0;            // run-queue delay of the polling thread during the step
  size_t delivered = 0;              // verify only: bytes that arrived exactly
  size_t missing = 0;                // ... bytes filled
  int holed = 0;                     // receives with at least one filled byte
  std::vector<size_t> missing_from;  // per peer
};

// When each direction to the mortal peer failed (mono_s(); 0 = not yet).
struct MortalFate {
  double recv_failed_s = 0;
  double send_failed_s = 0;
  int receives_done = 0;  // receives from it that completed before (by data or deadline)
};

class Exchange {
 public:
  static constexpr uint8_t kScribble = 0xEE;

  Exchange(Node& node, int rank, std::vector<int> peers, ExchangeOptions o)
      : node_(node), rank_(rank), peers_(std::move(peers)), o_(o) {
    const int n = static_cast<int>(node.peer.size());
    tx_.resize(n);
    rx_.resize(n);
    scribbled_.assign(n, std::vector<bool>(o_.ring, false));
    for (int j : peers_) {
      tx_[j].assign(o_.ring, std::vector<uint8_t>(std::max<size_t>(o_.size, 1)));
      rx_[j].assign(o_.ring, std::vector<uint8_t>(std::max<size_t>(o_.size, 1)));
    }
    want_.resize(std::max<size_t>(o_.size, 1));
  }

  // Pattern seed of the messages from `from` to `to`.
  static uint64_t seed(int from, int to) {
    return 0x5EED00 + static_cast<uint64_t>(from) * 64 + to;
  }

  // Step k. With die_after_ms >= 0 the rank SIGKILLs itself that long into the step (0: as
  // soon as its receives and sends are posted).
  StepRecord step(int k, double die_after_ms = -1) {
    NetApi& net = *node_.net;
    const int slot = k % o_.ring;
    const int n = static_cast<int>(node_.peer.size());
    StepRecord rec;
    rec.missing_from.assign(n, 0);
    std::vector<void*> rreq(n, nullptr), sreq(n, nullptr);
    std::vector<double> rpost(n, 0), spost(n, 0);
    std::vector<bool> rdone(n, true), sdone(n, true);
    if (o_.verify) {
      for (int j : peers_) {
        if (!scribbled_[j][slot]) continue;
        const std::vector<uint8_t>& b = rx_[j][slot];
        for (size_t i = 0; i < o_.size; ++i) {
          HCHECK(b[i] == kScribble,
                 "rank %d: buffer of a completed receive from %d (step %d) changed at byte %zu "
                 "before step %d reused it: a late datagram was written",
                 rank_, j, k - o_.ring, i, k);
        }
      }
    }
    const double wait0 = run_queue_wait_ms();
    const double t0 = mono_s();
    for (int j : peers_) {
      std::vector<uint8_t>& b = rx_[j][slot];
      if (j == o_.mortal && fate_.recv_failed_s != 0) continue;
      while (rreq[j] == nullptr) {
        rpost[j] = mono_s();
        const int r = net.irecv(node_.peer[j].recv, b.data(), o_.size, 0, nullptr, &rreq[j]);
        if (remote_failure(j, r, &fate_.recv_failed_s)) break;
        HCHECK(r == 0, "rank %d: irecv from %d returned %d", rank_, j, r);
        HCHECK(mono_s() - t0 < o_.hang_s, "rank %d: irecv refused for %.0f s", rank_, o_.hang_s);
      }
      if (rreq[j] == nullptr) continue;
      rdone[j] = false;
      scribbled_[j][slot] = false;  // the transport owns the buffer again
    }
    for (int j : peers_) {
      std::vector<uint8_t>& b = tx_[j][slot];
      if (o_.verify) fill_pattern(b.data(), o_.size, seed(rank_, j), static_cast<uint64_t>(k));
      if (j == o_.mortal && fate_.send_failed_s != 0) continue;
      while (sreq[j] == nullptr) {
        spost[j] = mono_s();
        const int r = net.isend(node_.peer[j].send, b.data(), o_.size, 0, nullptr, &sreq[j]);
        if (remote_failure(j, r, &fate_.send_failed_s)) break;
        HCHECK(r == 0, "rank %d: isend to %d returned %d", rank_, j, r);
        HCHECK(mono_s() - t0 < o_.hang_s, "rank %d: isend refused for %.0f s", rank_, o_.hang_s);
      }
      if (sreq[j] == nullptr) continue;
      sdone[j] = false;
    }
    if (die_after_ms == 0) raise(SIGKILL);  // everything posted, nothing completed
    for (;;) {
      bool all = true;
      for (int j : peers_) {
        if (rdone[j]) continue;
        int done = 0;
        int size = -1;
        const int r = net.test(rreq[j], &done, &size);
        if (remote_failure(j, r, &fate_.recv_failed_s)) {
          rdone[j] = true;
          continue;
        }
        HCHECK(r == 0, "rank %d: test of the receive from %d (step %d) returned %d", rank_, j, k,
               r);
        if (!done) {
          all = false;
          continue;
        }
        rdone[j] = true;
        if (j == o_.mortal) ++fate_.receives_done;
        rec.max_recv_ms = std::max(rec.max_recv_ms, (mono_s() - rpost[j]) * 1e3);
        HCHECK(size == static_cast<int>(o_.size),
               "rank %d: receive from %d (step %d) reported %d bytes, %zu were sent", rank_, j, k,
               size, o_.size);
        if (o_.verify) check_received(j, k, slot, &rec);
      }
      for (int j : peers_) {
        if (sdone[j]) continue;
        int done = 0;
        int size = -1;
        const int r = net.test(sreq[j], &done, &size);
        if (remote_failure(j, r, &fate_.send_failed_s)) {
          sdone[j] = true;
          continue;
        }
        HCHECK(r == 0, "rank %d: test of the send to %d (step %d) returned %d", rank_, j, k, r);
        if (!done) {
          all = false;
          continue;
        }
        sdone[j] = true;
        rec.max_send_ms = std::max(rec.max_send_ms, (mono_s() - spost[j]) * 1e3);
        HCHECK(size == static_cast<int>(o_.size), "rank %d: send to %d reported %d bytes", rank_, j,
               size);
      }
      if (all) break;
      const double elapsed = mono_s() - t0;
      if (die_after_ms >= 0 && elapsed * 1e3 >= die_after_ms) raise(SIGKILL);
      if (elapsed >= o_.hang_s) {
        std::string what;
        for (int j : peers_) {
          if (!rdone[j]) what += " recv-from-" + std::to_string(j);
          if (!sdone[j]) what += " send-to-" + std::to_string(j);
        }
        HCHECK(false, "rank %d: step %d not done after %.0f s (hang); outstanding:%s", rank_, k,
               o_.hang_s, what.c_str());
      }
      breathe();
    }
    rec.step_ms = (mono_s() - t0) * 1e3;
    rec.cpu_wait_ms = run_queue_wait_ms() - wait0;
    return rec;
  }

  const MortalFate& mortal_fate() const { return fate_; }

  // Every slot that holds a completed receive must still hold the scribble.
  void check_all_scribbles() const {
    for (int j : peers_) {
      for (int s = 0; s < o_.ring; ++s) {
        if (!scribbled_[j][s]) continue;
        for (size_t i = 0; i < o_.size; ++i) {
          HCHECK(rx_[j][s][i] == kScribble,
                 "rank %d: completed receive buffer (peer %d slot %d) changed at byte %zu: a "
                 "late datagram was written",
                 rank_, j, s, i);
        }
      }
    }
  }

 private:
  // True when `r` is the mortal peer's ncclRemoteError on j: records its first time.
  bool remote_failure(int j, int r, double* failed_s) {
    if (j != o_.mortal || r != kNcclRemoteError) return false;
    if (*failed_s == 0) *failed_s = mono_s();
    return true;
  }

  void check_received(int j, int k, int slot, StepRecord* rec) {
    std::vector<uint8_t>& b = rx_[j][slot];
    fill_pattern(want_.data(), o_.size, seed(j, rank_), static_cast<uint64_t>(k));
    const GridCount g = classify(b.data(), want_.data(), o_.size, o_.pkt, o_.fill);
    HCHECK(g.bad < 0,
           "rank %d: receive from %d (step %d): byte %lld is neither what was sent nor the "
           "%s fill of a whole packet",
           rank_, j, k, g.bad, o_.fill == HoleFill::kZero ? "zero" : "marker");
    HCHECK(!o_.expect_exact || g.missing == 0,
           "rank %d: receive from %d (step %d) is missing %zu bytes where delivery is exact", rank_,
           j, k, g.missing);
    rec->delivered += g.delivered;
    rec->missing += g.missing;
    rec->missing_from[j] += g.missing;
    if (g.missing > 0) ++rec->holed;
    std::memset(b.data(), kScribble, o_.size);
    scribbled_[j][slot] = true;
  }

  Node& node_;
  int rank_;
  std::vector<int> peers_;
  ExchangeOptions o_;
  MortalFate fate_;
  std::vector<std::vector<std::vector<uint8_t>>> tx_, rx_;  // [peer][slot]
  std::vector<std::vector<bool>> scribbled_;
  std::vector<uint8_t> want_;
};

}  // namespace optireduce::testing
