// Zero-copy sends through the plugin (issue 16), as NCCL drives them: two processes, the .so
// loaded as NCCL loads it, NCCL's proxy pattern (bench/proxy_pattern.h: 8 slots, one post and
// one test of the oldest per iteration, the receiver checks and overwrites each completed slot),
// with the slots registered by regMr and the handle passed to every isend/irecv, as NCCL does
// (p2p_bench passes none). Each size runs twice in one pair of processes: with the handle
// ("reg") and without ("copy", every payload copied as before regMr registered anything).
// Prints GB/s and both processes' CPU seconds per GB, then what the endpoints said (with
// NCCL_DEBUG=INFO): whether sends left without a copy, and the bytes the datapath registered
// for its own rings. Meant for the Soft-RoCE VM (tests/verbs/rxe-bench-zc.sh), where
// OPTIREDUCE_DATAPATH picks verbs or UDP; any plugin .so works (--plugin: an older build's, for a
// before/after).
//
//   verbs_bench_proxy [--plugin PATH] [--min BYTES] [--max BYTES] [--bytes BYTES]
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "bench/flags.h"
#include "bench/proxy_pattern.h"
#include "tests/plugin/plugin_loader.h"
#include "tests/plugin/two_procs.h"

namespace optireduce::testing {
namespace {

using proxy::Figure;
using proxy::kSlots;

struct Options {
  std::string plugin = PLUGIN_PATH;
  size_t min_bytes = size_t{1} << 20;
  size_t max_bytes = size_t{4} << 20;
  size_t bytes = size_t{64} << 20;  // per size and mode: the VM runs under TCG
};

struct Link {
  std::unique_ptr<NetApi> net;
  void* ctx = nullptr;
  void* comm = nullptr;  // rank 0: its send comm; rank 1: its recv comm
};

Link open_link(const Options& o, int rank, Channel& ch) {
  Link l;
  std::string err;
  l.net = NetApi::load(o.plugin, 11, &err);
  HCHECK(l.net != nullptr, "%s", err.c_str());
  HCHECK_OK(l.net->init(&l.ctx, 0x2C0B, -1));
  uint8_t handle[nccl::NCCL_NET_HANDLE_MAXSIZE] = {};
  void* lc = nullptr;
  if (rank == 1) {
    HCHECK_OK(l.net->listen(l.ctx, 0, handle, &lc));
    ch.send_bytes(handle, sizeof(handle));
  } else {
    ch.recv_bytes(handle, sizeof(handle));
  }
  const double deadline = mono_s() + 60;
  while (l.comm == nullptr) {
    if (rank == 0) {
      HCHECK_OK(l.net->connect(l.ctx, 0, handle, &l.comm));
    } else {
      HCHECK_OK(l.net->accept(lc, &l.comm));
    }
    HCHECK(mono_s() < deadline, "connection set-up timed out");
  }
  if (lc != nullptr) HCHECK_OK(l.net->close_listen(lc));
  return l;
}

// proxy::run_slots with every slot inside one registered pool and `mh` (null: none) on every
// post. Slot i is pool[i * stride, i * stride + size).
Figure run(NetApi& net, void* comm, void* mh, std::vector<uint8_t>& pool, size_t stride, int rank,
           Channel& ch, size_t size, int n) {
  proxy::SlotPtrs at;
  for (int i = 0; i < kSlots; ++i) at[i] = pool.data() + static_cast<size_t>(i) * stride;
  return proxy::run_slots(net, comm, mh, rank, ch, at, size, n);
}

// Sums a counter over the plugin's INFO lines that hold `key` ("<number> <key>"): the verbs
// endpoints' open and close lines. -1 when no line has it (UDP, or an older plugin).
long long sum_logged(const char* key) {
  LogCapture& c = log_capture();
  std::lock_guard<std::mutex> lock(c.mu);
  long long sum = -1;
  for (const auto& l : c.lines) {
    const size_t at = l.find(key);
    if (at == std::string::npos) continue;
    size_t b = at;
    while (b > 0 && l[b - 1] == ' ') --b;
    size_t a = b;
    while (a > 0 && l[a - 1] >= '0' && l[a - 1] <= '9') --a;
    if (a == b) continue;
    sum = (sum < 0 ? 0 : sum) + std::atoll(l.substr(a, b - a).c_str());
  }
  return sum;
}

void rank_main(int rank, const Options& o, Channel& ch) {
  Link l = open_link(o, rank, ch);
  // One pool for the slots, registered once, as NCCL registers its buffer per connection.
  const size_t slot_bytes = o.max_bytes;
  std::vector<uint8_t> pool(slot_bytes * kSlots);
  void* mh = nullptr;
  HCHECK_OK(l.net->reg_mr(l.comm, pool.data(), pool.size(), nccl::NCCL_PTR_HOST, &mh));
  if (rank == 0) {
    std::printf("%10s  %5s  %8s  %10s\n", "bytes", "mode", "GB/s", "cpu s/GB");
    std::fflush(stdout);
  }
  for (size_t size = o.min_bytes; size <= o.max_bytes; size *= 2) {
    const int n = static_cast<int>(std::max<size_t>(o.bytes / size, 2 * kSlots));
    for (const bool reg : {false, true}) {
      const Figure f = run(*l.net, l.comm, reg ? mh : nullptr, pool, slot_bytes, rank, ch, size, n);
      if (rank == 0) {
        std::printf("%10zu  %5s  %8.3f  %10.2f\n", size, reg ? "reg" : "copy", f.gbps,
                    f.cpu_s_per_gb);
        std::fflush(stdout);
      }
    }
  }
  ch.barrier();
  HCHECK_OK(l.net->dereg_mr(l.comm, mh));
  if (rank == 0) {
    HCHECK_OK(l.net->close_send(l.comm));
  } else {
    HCHECK_OK(l.net->close_recv(l.comm));
  }
  HCHECK_OK(l.net->finalize(l.ctx));
  // What the endpoints said (NCCL_DEBUG=INFO): the sender's first send without a copy, and the
  // ring bytes each process's datapath registered.
  struct Said {
    bool zero_copy;
    long long ring;
  } mine{log_capture().contains("without a copy"), sum_logged("bytes registered")};
  if (rank == 1) {
    ch.send(mine);
  } else {
    const Said peer = ch.recv<Said>();
    std::printf(
        "sender's sends from registered buffers without a copy: %s\n",
        mine.zero_copy ? "yes" : "not reported (UDP, an older plugin, or no NCCL_DEBUG=INFO)");
    std::printf(
        "ring memory registered by the datapath: sender %lld B, receiver %lld B "
        "(-1: not reported)\n",
        mine.ring, peer.ring);
  }
}

}  // namespace
}  // namespace optireduce::testing

int main(int argc, char** argv) {
  using optireduce::testing::Options;
  Options o;
  namespace bench = optireduce::bench;
  if (const int rc = bench::parse_flags(
          argc, argv,
          {bench::text_flag("--plugin", &o.plugin, "PATH"), bench::size_flag("--min", &o.min_bytes),
           bench::size_flag("--max", &o.max_bytes), bench::size_flag("--bytes", &o.bytes)},
          [&o]() -> const char* {
            if (o.min_bytes == 0 || o.min_bytes > o.max_bytes) return "need 0 < --min <= --max";
            if (o.bytes == 0) return "need --bytes > 0";
            return nullptr;
          });
      rc != 0)
    return rc;
  std::printf("proxy pattern through %s, regMr'ed slots (reg) against none (copy)\n",
              o.plugin.c_str());
  std::fflush(stdout);
  return optireduce::testing::proxy::run_bench_pair(
      [&](int rank, optireduce::testing::Channel& ch) {
        optireduce::testing::rank_main(rank, o, ch);
      });
}
