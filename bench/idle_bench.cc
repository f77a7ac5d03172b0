// Idle connections' cost (issue 16): NCCL opens channels x peers connections per GPU and most
// of them are idle at any moment. Two processes on loopback, through the plugin's NCCL ABI (the
// .so loaded as NCCL loads it). One active connection (rank 0 sends, rank 1 receives) runs
// p2p_bench's proxy pattern (8 slots, one post and one test of the oldest per iteration, the
// receiver checks and overwrites each completed slot) first alone, then again after each
// process opened `--idle` more connections on the same communicator (half sending, half
// receiving; they carry nothing). Prints GB/s and both processes' CPU seconds per GB for both
// cases and their ratios, and what the idle connections cost each process in memory: resident
// memory (RSS) and heap bytes allocated (mallinfo2: touched or not) per connection.
//
//   idle_bench [--plugin PATH] [--idle N] [--size BYTES] [--bytes BYTES] [--repeat N]
// OPTIREDUCE_* variables apply to the plugin as usual.
#include <malloc.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench/flags.h"
#include "bench/proxy_pattern.h"
#include "tests/plugin/plugin_loader.h"
#include "tests/plugin/two_procs.h"

namespace optireduce::testing {
namespace {

using proxy::Figure;

struct Options {
  std::string plugin = PLUGIN_PATH;
  int idle = 1000;
  size_t size = size_t{1} << 20;
  size_t bytes = size_t{256} << 20;
  int repeat = 3;
};

constexpr uint64_t kCommId = 0x1D7E;

// Resident memory of this process, bytes (/proc/self/statm's second field, in pages).
double rss_bytes() {
  long pages = 0, resident = 0;
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f != nullptr) {
    if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  return static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE));
}

// Heap bytes handed out by malloc, mapped chunks included, whether touched or not.
double heap_bytes() {
  const struct mallinfo2 m = mallinfo2();
  return static_cast<double>(m.uordblks) + static_cast<double>(m.hblkhd);
}

struct Link {
  std::unique_ptr<NetApi> net;
  void* ctx = nullptr;
};

// Opens `n` connections each way between the two ranks on `l`'s communicator: rank r's sends
// go to the peer's listens. Returns the send comms then the recv comms.
void open_pairs(Link& l, Channel& ch, int n, std::vector<void*>* sends, std::vector<void*>* recvs) {
  constexpr size_t kH = nccl::NCCL_NET_HANDLE_MAXSIZE;
  std::vector<uint8_t> mine(kH * static_cast<size_t>(n)), theirs(mine.size());
  std::vector<void*> listens(static_cast<size_t>(n), nullptr);
  for (int i = 0; i < n; ++i) HCHECK_OK(l.net->listen(l.ctx, 0, &mine[kH * i], &listens[i]));
  ch.send_bytes(mine.data(), mine.size());
  ch.recv_bytes(theirs.data(), theirs.size());
  sends->assign(static_cast<size_t>(n), nullptr);
  recvs->assign(static_cast<size_t>(n), nullptr);
  const double deadline = mono_s() + 300;
  for (int open = 0; open < 2 * n;) {
    open = 0;
    for (int i = 0; i < n; ++i) {
      if ((*sends)[i] == nullptr)
        HCHECK_OK(l.net->connect(l.ctx, 0, &theirs[kH * i], &(*sends)[i]));
      if ((*recvs)[i] == nullptr) HCHECK_OK(l.net->accept(listens[i], &(*recvs)[i]));
      open += ((*sends)[i] != nullptr) + ((*recvs)[i] != nullptr);
    }
    HCHECK(mono_s() < deadline, "connection set-up timed out (%d of %d open)", open, 2 * n);
  }
  for (void* lc : listens) HCHECK_OK(l.net->close_listen(lc));
}

// p2p_bench's proxy pattern on one connection; the receiver reports.
Figure run(int rank, const Options& o, Link& l, void* comm, Channel& ch) {
  const int n = static_cast<int>(std::max<size_t>(o.bytes / o.size, proxy::kSlots));
  return proxy::run_plugin(*l.net, comm, rank, ch, o.size, n);
}

// The median of `repeat` runs, by throughput (the CPU figure comes from the same run).
Figure median_run(int rank, const Options& o, Link& l, void* comm, Channel& ch) {
  std::vector<Figure> runs;
  for (int i = 0; i < o.repeat; ++i) runs.push_back(run(rank, o, l, comm, ch));
  std::sort(runs.begin(), runs.end(),
            [](const Figure& a, const Figure& b) { return a.gbps < b.gbps; });
  return runs[runs.size() / 2];
}

void raise_fd_limit() {
  // Each connection holds a socket: a thousand of them exceed the usual soft limit of 1024.
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    (void)setrlimit(RLIMIT_NOFILE, &r);
  }
}

void rank_main(int rank, const Options& o, Channel& ch) {
  raise_fd_limit();
  Link l;
  std::string err;
  l.net = NetApi::load(o.plugin, 11, &err);
  HCHECK(l.net != nullptr, "%s", err.c_str());
  HCHECK_OK(l.net->init(&l.ctx, kCommId, -1));
  std::vector<void*> act_send, act_recv;
  open_pairs(l, ch, 1, &act_send, &act_recv);
  void* active = rank == 0 ? act_send[0] : act_recv[0];

  const Figure alone = median_run(rank, o, l, active, ch);

  const double rss0 = rss_bytes();
  const double heap0 = heap_bytes();
  std::vector<void*> idle_send, idle_recv;
  open_pairs(l, ch, o.idle / 2, &idle_send, &idle_recv);
  const int idle = 2 * (o.idle / 2);
  // Let the handshakes' last datagrams settle before counting.
  ch.barrier();
  const double rss_per = (rss_bytes() - rss0) / idle;
  const double heap_per = (heap_bytes() - heap0) / idle;

  const Figure crowd = median_run(rank, o, l, active, ch);

  if (rank == 1) {
    ch.send<double>(rss_per);
    ch.send<double>(heap_per);
  } else {
    const double peer_rss = ch.recv<double>();
    const double peer_heap = ch.recv<double>();
    std::printf("%10s  %9s  %9s\n", "", "GB/s", "cpu s/GB");
    std::printf("%10s  %9.2f  %9.3f\n", "alone", alone.gbps, alone.cpu_s_per_gb);
    std::printf("%10s  %9.2f  %9.3f\n", "+ idle", crowd.gbps, crowd.cpu_s_per_gb);
    std::printf("%10s  %9.2f  %9.2f\n", "ratio", crowd.gbps / alone.gbps,
                crowd.cpu_s_per_gb / alone.cpu_s_per_gb);
    std::printf("memory per idle connection (each process holds %d: %d sending, %d receiving):\n",
                idle, idle / 2, idle / 2);
    std::printf("  rank 0: RSS %.1f KiB, heap allocated %.1f KiB\n", rss_per / 1024,
                heap_per / 1024);
    std::printf("  rank 1: RSS %.1f KiB, heap allocated %.1f KiB\n", peer_rss / 1024,
                peer_heap / 1024);
    std::fflush(stdout);
  }
  ch.barrier();
  for (void* c : idle_send) HCHECK_OK(l.net->close_send(c));
  for (void* c : idle_recv) HCHECK_OK(l.net->close_recv(c));
  HCHECK_OK(l.net->close_send(act_send[0]));
  HCHECK_OK(l.net->close_recv(act_recv[0]));
  HCHECK_OK(l.net->finalize(l.ctx));
}

int run(int argc, char** argv) {
  Options o;
  if (int rc = bench::parse_flags(
          argc, argv,
          {bench::text_flag("--plugin", &o.plugin, "PATH"), bench::number_flag("--idle", &o.idle),
           bench::size_flag("--size", &o.size), bench::size_flag("--bytes", &o.bytes),
           bench::number_flag("--repeat", &o.repeat)},
          [&o]() -> const char* {
            if (o.idle < 2) return "need --idle >= 2";
            if (o.size == 0) return "need --size > 0";
            if (o.repeat < 1) return "need --repeat >= 1";
            return nullptr;
          });
      rc != 0)
    return rc;
  std::printf(
      "1 active connection (proxy pattern, %zu-byte slots, median of %d) alone and beside "
      "%d idle ones on the same communicator, loopback\n",
      o.size, o.repeat, o.idle);
  std::fflush(stdout);
  return proxy::run_bench_pair([&](int rank, Channel& ch) { rank_main(rank, o, ch); });
}

}  // namespace
}  // namespace optireduce::testing

int main(int argc, char** argv) {
  return optireduce::testing::run(argc, argv);
}
