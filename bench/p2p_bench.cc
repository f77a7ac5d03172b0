// Point-to-point throughput and latency through the plugin's NCCL ABI on loopback (two
// processes, loaded as NCCL loads it), side by side with a plain blocking TCP stream of the same
// sizes (how NCCL's Socket transport moves data). Prints figures; it is not a test.
//
// Throughput: `--bytes` per size, up to 8 messages in flight (NCCL's proxy keeps at most 8 per
// connection), timed at the receiver from a common start to the last completion. Both sides
// cycle through the same number of buffers (8, fewer above 32 MiB), each used once untimed
// before the clock starts (a fresh buffer's first transfer is slow on these VMs).
// Latency: round trip of one `size`-byte message and a 1-byte reply, no other traffic; p50.
//
// Proxy pattern (issue 16): what NCCL's proxy does with a connection, which the stream above
// leaves out. 8 slots of `size` bytes per side; each loop iteration posts at most one isend
// (irecv) and tests the oldest request once; the receiver, once a slot completes, checks every
// byte of it and then overwrites it (the GPU consumed it) before reposting it. That work
// competes with the plugin's progress thread and its copies for the host's cores, so the
// figures differ from the stream's. The TCP side is a plain blocking-socket plugin with no
// thread driven the same way (its test of the oldest request moves the whole message). Each
// process measures its own CPU time (user + sys, all its threads) over the transfer; the table
// prints both processes' sum per GB moved. A shared host's load drifts within seconds, so each
// size runs `--proxy-rounds` rounds, the two sides in turns (plugin, TCP, then TCP, plugin, and
// so on): the table prints the median of each figure, and of the per-round ratios with their
// range.
//
//   p2p_bench [--plugin PATH] [--version 8..12] [--min BYTES] [--max BYTES] [--bytes BYTES]
//             [--mode all|stream|proxy] [--proxy-min BYTES] [--proxy-max BYTES]
//             [--proxy-rounds N]
// OPTIREDUCE_* variables (faults, rates, datagram size) apply to the plugin as usual.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <string>
#include <vector>

#include "bench/flags.h"
#include "bench/proxy_pattern.h"
#include "tests/plugin/plugin_loader.h"
#include "tests/plugin/two_procs.h"

namespace optireduce::testing {
namespace {

struct Options {
  std::string plugin = PLUGIN_PATH;
  int version = 11;
  size_t min_bytes = size_t{4} << 10;
  size_t max_bytes = size_t{64} << 20;
  size_t bytes_per_size = size_t{512} << 20;
  bool stream = true;
  bool proxy = true;
  size_t proxy_min = size_t{1} << 20;
  size_t proxy_max = size_t{16} << 20;
  int proxy_rounds = 3;
};

constexpr int kWindow = 8;
// Memory per side for in-flight buffers; above it the in-flight messages share buffers (the
// contents are then not meaningful, only the timing is).
constexpr size_t kBufferBudget = size_t{256} << 20;

int iterations(const Options& o, size_t size) {
  return static_cast<int>(std::clamp<size_t>(o.bytes_per_size / size, 8, 100000));
}
int latency_iterations(size_t size) {
  return static_cast<int>(std::clamp<size_t>((size_t{64} << 20) / size, 10, 300));
}

// The fault injector's probabilities that are set above 0 ("DROP=0.05 DUP=0.01"; the plugin
// injects faults exactly when one is), "" for none: they act on the plugin's datagrams, not on
// the TCP baseline beside it, and the table must say so.
std::string injected_faults() {
  std::string out;
  for (const char* name : {"DROP", "DUP", "REORDER", "DELAY_PROB"}) {
    const char* v = std::getenv((std::string("OPTIREDUCE_FAULT_") + name).c_str());
    if (v == nullptr || !(std::strtod(v, nullptr) > 0)) continue;
    if (!out.empty()) out += ' ';
    out += std::string(name) + "=" + v;
  }
  return out;
}

double p50(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct Row {
  size_t size;
  double plugin_gbps, tcp_gbps, plugin_p50_us, tcp_p50_us;
};

// ---- Plugin side.

struct PluginLink {
  std::unique_ptr<NetApi> net;
  void* ctx = nullptr;
  void* send = nullptr;
  void* recv = nullptr;
};

PluginLink plugin_connect(const Options& o, Channel& ch) {
  PluginLink l;
  std::string err;
  l.net = NetApi::load(o.plugin, o.version, &err);
  HCHECK(l.net != nullptr, "%s", err.c_str());
  HCHECK_OK(l.net->init(&l.ctx, 0xBE4C, -1));
  uint8_t mine[nccl::NCCL_NET_HANDLE_MAXSIZE];
  uint8_t theirs[nccl::NCCL_NET_HANDLE_MAXSIZE];
  void* lc = nullptr;
  HCHECK_OK(l.net->listen(l.ctx, 0, mine, &lc));
  ch.send_bytes(mine, sizeof(mine));
  ch.recv_bytes(theirs, sizeof(theirs));
  const double deadline = mono_s() + 30;
  while (l.send == nullptr || l.recv == nullptr) {
    if (l.send == nullptr) HCHECK_OK(l.net->connect(l.ctx, 0, theirs, &l.send));
    if (l.recv == nullptr) HCHECK_OK(l.net->accept(lc, &l.recv));
    HCHECK(mono_s() < deadline, "connection set-up timed out");
  }
  HCHECK_OK(l.net->close_listen(lc));
  return l;
}

void wait_done(NetApi& net, void* req) {
  int done = 0;
  while (!done) HCHECK_OK(net.test(req, &done, nullptr));
}

// Posts `n` messages with up to kWindow in flight, testing the oldest. Returns the time the
// last one completed.
double plugin_stream(NetApi& net, void* comm, bool sending, std::vector<std::vector<uint8_t>>& bufs,
                     size_t size, int n) {
  std::deque<void*> inflight;
  int posted = 0;
  int done_count = 0;
  while (done_count < n) {
    while (posted < n && inflight.size() < kWindow) {
      void* buf = bufs[posted % bufs.size()].data();
      void* req = nullptr;
      HCHECK_OK(sending ? net.isend(comm, buf, size, 0, nullptr, &req)
                        : net.irecv(comm, buf, size, 0, nullptr, &req));
      if (req == nullptr) break;
      inflight.push_back(req);
      ++posted;
    }
    int done = 0;
    HCHECK_OK(net.test(inflight.front(), &done, nullptr));
    if (done) {
      inflight.pop_front();
      ++done_count;
    }
  }
  return mono_s();
}

// The sender's buffers hold the same pattern (any may be checked); the receiver's start zeroed.
std::vector<std::vector<uint8_t>> make_buffers(int rank, size_t size) {
  const size_t n = std::clamp<size_t>(kBufferBudget / size, 1, kWindow);
  std::vector<std::vector<uint8_t>> bufs(n, std::vector<uint8_t>(size));
  if (rank == 0) {
    for (auto& b : bufs) fill_pattern(b.data(), size, 1, 0);
  }
  return bufs;
}

// rank 0 sends, rank 1 receives and reports GB/s; then rank 0 measures round trips.
void plugin_size(int rank, const Options& o, PluginLink& l, Channel& ch, size_t size, Row* row) {
  NetApi& net = *l.net;
  auto bufs = make_buffers(rank, size);
  const int n = iterations(o, size);
  // Untimed, once through every buffer first (proxy::run_plugin says why); TCP's side alike.
  (void)plugin_stream(net, rank == 0 ? l.send : l.recv, rank == 0, bufs, size,
                      static_cast<int>(bufs.size()));
  ch.barrier();
  const double t0 = mono_s();
  const double t1 = plugin_stream(net, rank == 0 ? l.send : l.recv, rank == 0, bufs, size, n);
  if (rank == 1) {
    HCHECK(find_mismatch(bufs[0].data(), size, 1, 0) < 0, "plugin delivered wrong bytes");
    ch.send<double>(static_cast<double>(size) * n / (t1 - t0) / 1e9);
  } else {
    row->plugin_gbps = ch.recv<double>();
  }

  // Latency: ping (size bytes) and a 1-byte pong.
  std::vector<uint8_t> pong(1);
  std::vector<double> rtts;
  ch.barrier();
  for (int i = 0; i < latency_iterations(size); ++i) {
    void* req = nullptr;
    if (rank == 0) {
      void* rreq = nullptr;
      while (rreq == nullptr) HCHECK_OK(net.irecv(l.recv, pong.data(), 1, 0, nullptr, &rreq));
      const double s = mono_s();
      while (req == nullptr) HCHECK_OK(net.isend(l.send, bufs[0].data(), size, 0, nullptr, &req));
      wait_done(net, rreq);
      rtts.push_back((mono_s() - s) * 1e6);
      wait_done(net, req);
    } else {
      while (req == nullptr) HCHECK_OK(net.irecv(l.recv, bufs[0].data(), size, 0, nullptr, &req));
      wait_done(net, req);
      void* sreq = nullptr;
      while (sreq == nullptr) HCHECK_OK(net.isend(l.send, pong.data(), 1, 0, nullptr, &sreq));
      wait_done(net, sreq);
    }
  }
  if (rank == 0) row->plugin_p50_us = p50(rtts);
}

// The proxy pattern through the plugin (see the file comment and proxy_pattern.h).
proxy::Figure plugin_proxy(int rank, const Options& o, PluginLink& l, Channel& ch, size_t size) {
  return proxy::run_plugin(*l.net, rank == 0 ? l.send : l.recv, rank, ch, size,
                           iterations(o, size));
}

// ---- TCP side: one blocking stream per direction pair, TCP_NODELAY as NCCL sets it.

int tcp_connect(int rank, Channel& ch) {
  int fd = -1;
  if (rank == 1) {
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    HCHECK(lfd >= 0, "socket");
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    HCHECK(bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0, "bind");
    HCHECK(::listen(lfd, 1) == 0, "listen");
    socklen_t len = sizeof(a);
    getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len);
    ch.send<uint16_t>(a.sin_port);
    fd = accept(lfd, nullptr, nullptr);
    close(lfd);
  } else {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = ch.recv<uint16_t>();
    fd = socket(AF_INET, SOCK_STREAM, 0);
    HCHECK(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0, "tcp connect");
  }
  HCHECK(fd >= 0, "tcp accept");
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

void tcp_all(int fd, void* p, size_t n, bool sending) {
  auto* b = static_cast<uint8_t*>(p);
  while (n > 0) {
    const ssize_t k = sending ? send(fd, b, n, MSG_NOSIGNAL) : recv(fd, b, n, 0);
    HCHECK(k > 0 || (k < 0 && errno == EINTR), "tcp %s failed", sending ? "send" : "recv");
    if (k > 0) {
      b += k;
      n -= static_cast<size_t>(k);
    }
  }
}

void tcp_size(int rank, const Options& o, int fd, Channel& ch, size_t size, Row* row) {
  // As many buffers as the plugin's side, each used once untimed: a single reused buffer was
  // warm after its first message while the plugin's eight each paid their first use.
  auto bufs = make_buffers(rank, size);
  for (auto& b : bufs) tcp_all(fd, b.data(), size, rank == 0);
  const int n = iterations(o, size);
  ch.barrier();
  const double t0 = mono_s();
  for (int i = 0; i < n; ++i) tcp_all(fd, bufs[i % bufs.size()].data(), size, rank == 0);
  const double t1 = mono_s();
  std::vector<uint8_t>& buf = bufs[0];
  if (rank == 1) {
    HCHECK(find_mismatch(buf.data(), size, 1, 0) < 0, "tcp delivered wrong bytes");
    ch.send<double>(static_cast<double>(size) * n / (t1 - t0) / 1e9);
  } else {
    row->tcp_gbps = ch.recv<double>();
  }
  uint8_t pong = 0;
  std::vector<double> rtts;
  ch.barrier();
  for (int i = 0; i < latency_iterations(size); ++i) {
    if (rank == 0) {
      const double s = mono_s();
      tcp_all(fd, buf.data(), size, true);
      tcp_all(fd, &pong, 1, false);
      rtts.push_back((mono_s() - s) * 1e6);
    } else {
      tcp_all(fd, buf.data(), size, false);
      tcp_all(fd, &pong, 1, true);
    }
  }
  if (rank == 0) row->tcp_p50_us = p50(rtts);
}

// The same pattern over the blocking TCP stream: a plugin with no thread whose isend/irecv only
// record the request and whose test of the oldest one moves it whole, so each iteration of the
// proxy loop is one blocking transfer (and, at the receiver, the check and the overwrite).
proxy::Figure tcp_proxy(int rank, const Options& o, int fd, Channel& ch, size_t size) {
  auto slots = proxy::make_slots(rank, size);
  const int n = iterations(o, size);
  auto loop = [&](int count) {
    for (int k = 0; k < count; ++k) {
      const int slot = k % proxy::kSlots;
      tcp_all(fd, slots[slot].data(), size, rank == 0);
      if (rank == 1) proxy::consume_slot(slots[slot].data(), size, k, "tcp");
    }
  };
  loop(proxy::kSlots);  // untimed, as the plugin's side (proxy::run_plugin)
  ch.barrier();
  const double c0 = proxy::cpu_s();
  const double t0 = mono_s();
  loop(n);
  const double t1 = mono_s();
  return proxy::exchange_figure(rank, ch, size * static_cast<size_t>(n), t1 - t0,
                                proxy::cpu_s() - c0);
}

void print_counters(const char* who, const optireduceNetCounters& c) {
  std::printf("  %-14s msgs %" PRIu64 "  bytes %" PRIu64 "  data pkts %" PRIu64 "  retx %" PRIu64
              "  rto %" PRIu64 " (spurious %" PRIu64 ")  probes %" PRIu64 " (spurious %" PRIu64
              ")  reordered msgs %" PRIu64 "  drops dup/stale/bounds %" PRIu64 "/%" PRIu64
              "/%" PRIu64 "\n",
              who, c.msgs, c.bytes, c.dataPkts, c.retxPkts, c.rtoEvents, c.spuriousRtos, c.probes,
              c.spuriousProbes, c.reorderedLosses, c.dropDuplicate, c.dropStale, c.dropBounds);
}

void rank_main(int rank, const Options& o, Channel& ch) {
  PluginLink l = plugin_connect(o, ch);
  const int fd = tcp_connect(rank, ch);
  if (o.proxy) {
    if (rank == 0) {
      std::printf(
          "proxy pattern: %d slots per side, one post and one test of the oldest per "
          "iteration, receiver checks and overwrites each completed slot\n",
          kWindow);
      std::printf("median of %d rounds, plugin and TCP in turns\n", o.proxy_rounds);
      std::printf("%10s  %9s  %9s  %6s  %11s  %11s  %11s\n", "bytes", "plugin", "tcp", "ratio",
                  "range", "plugin cpu", "tcp cpu");
      std::printf("%10s  %9s  %9s  %6s  %11s  %11s  %11s\n", "", "GB/s", "GB/s", "", "", "s/GB",
                  "s/GB");
      std::fflush(stdout);
    }
    for (size_t size = o.proxy_min; size <= o.proxy_max; size *= 2) {
      std::vector<double> pg, tg, pc, tc, ratio;
      for (int r = 0; r < o.proxy_rounds; ++r) {
        proxy::Figure p, t;
        if (r % 2 == 0) {
          p = plugin_proxy(rank, o, l, ch, size);
          t = tcp_proxy(rank, o, fd, ch, size);
        } else {
          t = tcp_proxy(rank, o, fd, ch, size);
          p = plugin_proxy(rank, o, l, ch, size);
        }
        pg.push_back(p.gbps);
        tg.push_back(t.gbps);
        pc.push_back(p.cpu_s_per_gb);
        tc.push_back(t.cpu_s_per_gb);
        ratio.push_back(p.gbps / t.gbps);
      }
      if (rank == 0) {
        const auto [lo, hi] = std::minmax_element(ratio.begin(), ratio.end());
        std::printf("%10zu  %9.2f  %9.2f  %6.2f  %5.2f-%-5.2f  %11.3f  %11.3f\n", size, p50(pg),
                    p50(tg), p50(ratio), *lo, *hi, p50(pc), p50(tc));
        std::fflush(stdout);
      }
    }
  }
  if (o.stream && rank == 0) {
    std::printf("%sstream: %d in flight, no work on completed messages\n", o.proxy ? "\n" : "",
                kWindow);
    std::printf("%10s  %9s  %9s  %6s  %10s  %10s\n", "bytes", "plugin", "tcp", "ratio",
                "plugin p50", "tcp p50");
    std::printf("%10s  %9s  %9s  %6s  %10s  %10s\n", "", "GB/s", "GB/s", "", "RTT us", "RTT us");
    std::fflush(stdout);
  }
  std::vector<Row> rows;
  for (size_t size = o.min_bytes; o.stream && size <= o.max_bytes; size *= 2) {
    Row row{size, 0, 0, 0, 0};
    plugin_size(rank, o, l, ch, size, &row);
    tcp_size(rank, o, fd, ch, size, &row);
    rows.push_back(row);
    if (rank == 0) {
      std::printf("%10zu  %9.2f  %9.2f  %6.2f  %10.1f  %10.1f\n", row.size, row.plugin_gbps,
                  row.tcp_gbps, row.plugin_gbps / row.tcp_gbps, row.plugin_p50_us, row.tcp_p50_us);
      std::fflush(stdout);
    }
  }
  optireduceNetStats st{};
  l.net->get_stats(l.net->stats_id(0xBE4C), &st);
  if (rank == 1) {
    ch.send(st);
  } else {
    const auto peer = ch.recv<optireduceNetStats>();
    std::printf("\nconnection counters (rank 0 -> rank 1):\n");
    print_counters("sender", st.send);
    print_counters("receiver", peer.recv);
  }
  close(fd);
  ch.barrier();
  HCHECK_OK(l.net->close_send(l.send));
  HCHECK_OK(l.net->close_recv(l.recv));
  HCHECK_OK(l.net->finalize(l.ctx));
}

int run(int argc, char** argv) {
  Options o;
  const auto mode = [&o](const char* v) {
    const std::string m = v;
    if (m != "all" && m != "stream" && m != "proxy") return false;  // all, stream or proxy
    o.stream = m != "proxy";
    o.proxy = m != "stream";
    return true;
  };
  if (int rc = bench::parse_flags(argc, argv,
                                  {bench::text_flag("--plugin", &o.plugin, "PATH"),
                                   bench::number_flag("--version", &o.version),
                                   bench::size_flag("--min", &o.min_bytes),
                                   bench::size_flag("--max", &o.max_bytes),
                                   bench::size_flag("--bytes", &o.bytes_per_size),
                                   {"--mode", mode, "all|stream|proxy"},
                                   bench::size_flag("--proxy-min", &o.proxy_min),
                                   bench::size_flag("--proxy-max", &o.proxy_max),
                                   bench::number_flag("--proxy-rounds", &o.proxy_rounds)},
                                  [&o]() -> const char* {
                                    if (o.min_bytes == 0 || o.min_bytes > o.max_bytes)
                                      return "need 0 < --min <= --max";
                                    if (o.proxy_min == 0 || o.proxy_min > o.proxy_max)
                                      return "need 0 < --proxy-min <= --proxy-max";
                                    if (o.proxy_rounds < 1) return "need --proxy-rounds >= 1";
                                    return nullptr;
                                  });
      rc != 0)
    return rc;
  std::printf("p2p through %s (ABI v%d) vs TCP, loopback\n", o.plugin.c_str(), o.version);
  if (const std::string f = injected_faults(); !f.empty())
    std::printf("faults injected into the plugin's datagrams only (%s): TCP runs without them\n",
                f.c_str());
  std::fflush(stdout);
  return proxy::run_bench_pair([&](int rank, Channel& ch) { rank_main(rank, o, ch); });
}

}  // namespace
}  // namespace optireduce::testing

int main(int argc, char** argv) {
  return optireduce::testing::run(argc, argv);
}
