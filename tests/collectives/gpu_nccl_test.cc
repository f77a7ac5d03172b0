// The GPU path against the real NCCL and the real plugin: two processes on one host, each its own
// "node" to NCCL (a different NCCL_HOSTID), so that NCCL connects them through the network, that
// is, through libnccl-net-optireduce.so, even when both use the same GPU. What the emulated
// runtime of tests/gpu_emu cannot show: NCCL's own allreduce carried by the plugin stays
// bit-exact, liboptireduce's TAR kernels and grouped sends give the exact sum on a device, a
// bounded communicator stays within its error bound and counts what it lost, and the
// application's communicator stays exact beside a lossy sibling.
//
// Skips (exit 77) without a CUDA device. The parent never touches CUDA: a process that
// initialised the driver cannot hand it to a forked child, so a probe child looks for the device.
// NCCL_NET_PLUGIN names the plugin (meson sets it to the build's); the test reads it too.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "collectives/optireduce.h"
#include "plugin/optireduce_net.h"
#include "tests/collectives/forked_ranks.h"
#include "tests/collectives/typed_buffer.h"

namespace {

using optireduce::testing::get;
using optireduce::testing::run_ranks;
using optireduce::testing::set;
using optireduce::testing::temp_dir;

// A case's exit status (0: passed), printing what run_ranks said went wrong.
int failures(const std::string& what) {
  if (what.empty()) return 0;
  std::fprintf(stderr, "%s\n", what.c_str());
  return 1;
}

constexpr int kRanks = 2;
constexpr int kSkip = 77;
constexpr int kRankTimeoutS = 100;  // each case takes seconds; a hang ends here
// A diagnosis option (`STALL_MS=N` among main's arguments): rank 1 sleeps N ms before every
// fifth bounded call past the calibration, a straggler; rank 0 must not wait for it.
// `STALL_ONCE=1` stalls call 10 only, to see how many calls the ranks take to fall back into
// step.
int g_stall_ms = 0;
bool g_stall_once = false;
bool stalled_call(int c) {
  return g_stall_ms > 0 && c >= 10 && (g_stall_once ? c == 10 : c % 5 == 0);
}

const char* plugin_path() {
  const char* p = std::getenv("NCCL_NET_PLUGIN");
  return p && *p ? p : "libnccl-net-optireduce.so";
}

bool have_device() {
  const pid_t pid = ::fork();
  if (pid == 0) {
    int n = 0;
    ::_exit(cudaGetDeviceCount(&n) == cudaSuccess && n > 0 ? 0 : 1);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

// The environment that makes two local processes two NCCL nodes joined by the plugin.
std::vector<std::pair<std::string, std::string>> nccl_env(
    std::vector<std::pair<std::string, std::string>> extra) {
  std::vector<std::pair<std::string, std::string>> env = {
      {"NCCL_NET_PLUGIN", plugin_path()},
      {"NCCL_SOCKET_IFNAME", "lo"},
      {"NCCL_DEBUG", "WARN"},
  };
  env.insert(env.end(), extra.begin(), extra.end());
  return env;
}

// One NCCL communicator of the two ranks; rank 0's unique id travels through a file.
bool nccl_init(int rank, const std::string& dir, ncclComm_t* comm) {
  const std::string host = "optireduce-test-node-" + std::to_string(rank);
  ::setenv("NCCL_HOSTID", host.c_str(), 1);
  if (cudaSetDevice(0) != cudaSuccess) return false;
  ncclUniqueId id;
  const std::string path = dir + "/nccl-id";
  if (rank == 0) {
    if (ncclGetUniqueId(&id) != ncclSuccess) return false;
    const std::string tmp = path + ".tmp";
    FILE* f = std::fopen(tmp.c_str(), "wb");
    if (!f || std::fwrite(&id, sizeof id, 1, f) != 1) return false;
    std::fclose(f);
    if (std::rename(tmp.c_str(), path.c_str()) != 0) return false;
  } else {
    if (!optireduce::testing::wait_mark(dir, "nccl-id", 60'000)) return false;
    FILE* f = std::fopen(path.c_str(), "rb");
    const bool read = f && std::fread(&id, sizeof id, 1, f) == 1;
    if (f) std::fclose(f);
    if (!read) return false;
  }
  const ncclResult_t rc = ncclCommInitRank(comm, kRanks, id, rank);
  if (rc != ncclSuccess) {
    std::fprintf(stderr, "rank %d: ncclCommInitRank: %s\n", rank, ncclGetErrorString(rc));
    return false;
  }
  return true;
}

// The plugin's counters for this process, read the way an application in the process would.
bool plugin_counters(optireduceNetStats* out) {
  void* h = ::dlopen(plugin_path(), RTLD_NOW | RTLD_NOLOAD);
  if (!h) return false;
  auto get_stats =
      reinterpret_cast<int (*)(uint64_t, optireduceNetStats*)>(::dlsym(h, "optireduceNetGetStats"));
  const bool ok = get_stats && get_stats(0, out) >= 0;
  ::dlclose(h);
  return ok;
}

// Rank r's input, element i: small integers (times r + 1) that every type holds exactly, and
// whose sum over the ranks it holds exactly too, so the exact result has one right answer.
double input(int rank, size_t i) {
  return double((i * 7) % 61) * (rank + 1);
}
double exact_sum(size_t i) {
  double s = 0;
  for (int r = 0; r < kRanks; ++r) s += input(r, i);
  return s;
}

ncclDataType_t nccl_type(optiDataType_t t) {
  switch (t) {
    case optiFloat32:
      return ncclFloat32;
    case optiFloat16:
      return ncclFloat16;
    case optiBfloat16:
      return ncclBfloat16;
    case optiFloat64:
      return ncclFloat64;
  }
  return ncclFloat32;
}

// A device buffer holding this rank's input of `count` elements of type t.
struct DeviceInput {
  std::vector<uint8_t> host;
  void* send = nullptr;
  void* recv = nullptr;
  DeviceInput(int rank, optiDataType_t t, size_t count)
      : host(count * optireduce::testing::esize(t)) {
    for (size_t i = 0; i < count; ++i) set(t, host, i, input(rank, i));
    if (cudaMalloc(&send, host.size()) != cudaSuccess ||
        cudaMalloc(&recv, host.size()) != cudaSuccess)
      return;
    cudaMemcpy(send, host.data(), host.size(), cudaMemcpyHostToDevice);
    cudaMemset(recv, 0xff, host.size());  // NaN in every type: an unwritten element shows
  }
  ~DeviceInput() {
    cudaFree(send);
    cudaFree(recv);
  }
  bool ok() const { return send && recv; }
  std::vector<uint8_t> result() {
    std::vector<uint8_t> out(host.size());
    cudaDeviceSynchronize();
    cudaMemcpy(out.data(), recv, out.size(), cudaMemcpyDeviceToHost);
    return out;
  }
};

// Elements of `got` that differ from the exact sum; the first one is printed.
size_t wrong_elements(int rank, optiDataType_t t, const std::vector<uint8_t>& got, size_t count) {
  size_t wrong = 0;
  for (size_t i = 0; i < count; ++i) {
    const double g = get(t, got, i);
    if (g != exact_sum(i)) {
      if (wrong == 0)
        std::fprintf(stderr, "rank %d: type %d element %zu: %g, want %g\n", rank, int(t), i, g,
                     exact_sum(i));
      ++wrong;
    }
  }
  return wrong;
}

// ||got - exact|| / ||exact||, or infinity if any element is not finite.
double relative_error(optiDataType_t t, const std::vector<uint8_t>& got, size_t count) {
  double num = 0, den = 0;
  for (size_t i = 0; i < count; ++i) {
    const double g = get(t, got, i);
    if (!std::isfinite(g)) return INFINITY;
    num += (g - exact_sum(i)) * (g - exact_sum(i));
    den += exact_sum(i) * exact_sum(i);
  }
  return std::sqrt(num / den);
}

}  // namespace

// NCCL's own ring allreduce over the plugin (NCCL_NET=OptiReduce: no other network may carry
// it): every type bit-exact, and the plugin's counters show it carried the bytes.
int nccl_allreduce_is_exact_over_the_plugin() {
  const std::string dir = temp_dir();
  return failures(run_ranks(
      kRanks, nccl_env({{"NCCL_NET", OPTIREDUCE_NET_NAME}}),
      [&](int rank) {
        ncclComm_t comm;
        FORKED_CHECK(nccl_init(rank, dir, &comm), "", "NCCL init over the plugin failed");
        const size_t count = (8u << 20) + 1234;  // 32 MiB of fp32 and a partial chunk
        for (optiDataType_t t : {optiFloat32, optiFloat16, optiBfloat16, optiFloat64}) {
          DeviceInput buf(rank, t, count);
          FORKED_CHECK(buf.ok(), "", "cudaMalloc");
          const ncclResult_t rc =
              ncclAllReduce(buf.send, buf.recv, count, nccl_type(t), ncclSum, comm, nullptr);
          FORKED_CHECK(rc == ncclSuccess, ncclGetErrorString(rc), "ncclAllReduce type %d", int(t));
          const size_t wrong = wrong_elements(rank, t, buf.result(), count);
          FORKED_CHECK(wrong == 0, "", "type %d: %zu of %zu elements wrong", int(t), wrong, count);
        }
        optireduceNetStats s{};
        FORKED_CHECK(plugin_counters(&s), "", "the plugin is not loaded in this process");
        FORKED_CHECK(s.processSend.bytes >= count * 4 / 2, "", "the plugin sent only %llu bytes",
                     (unsigned long long)s.processSend.bytes);
        FORKED_CHECK(s.processRecv.bytesLost == 0, "", "an exact communicator lost bytes");
        std::printf("rank %d: plugin sent %llu B in %llu msgs, %llu retransmitted datagrams\n",
                    rank, (unsigned long long)s.processSend.bytes,
                    (unsigned long long)s.processSend.msgs,
                    (unsigned long long)s.processSend.retxPkts);
        ncclCommDestroy(comm);
        return 0;
      },
      kRankTimeoutS));
}

// liboptireduce exact on the device: TAR's kernels and grouped sends give the exact sum in every
// type, in place and out of place, including a count that leaves partial shards.
int tar_exact_on_the_device() {
  const std::string dir = temp_dir();
  return failures(run_ranks(
      kRanks, nccl_env({}),
      [&](int rank) {
        ncclComm_t nccl;
        FORKED_CHECK(nccl_init(rank, dir, &nccl), "", "NCCL init failed");
        optiOptions_t o;
        optiOptionsDefault(&o);
        o.mode = optiExact;
        optiComm_t comm = nullptr;
        FORKED_CHECK(optiCommInit(&comm, nccl, &o) == optiSuccess, optiGetLastError(),
                     "optiCommInit");
        for (size_t count : {size_t(1000), size_t(4u << 20) + 77}) {
          for (optiDataType_t t : {optiFloat32, optiFloat16, optiBfloat16, optiFloat64}) {
            DeviceInput buf(rank, t, count);
            FORKED_CHECK(buf.ok(), "", "cudaMalloc");
            FORKED_CHECK(
                optiAllReduce(buf.send, buf.recv, count, t, optiSum, comm, nullptr) == optiSuccess,
                optiGetLastError(), "optiAllReduce");
            size_t wrong = wrong_elements(rank, t, buf.result(), count);
            FORKED_CHECK(wrong == 0, "", "count %zu type %d: %zu wrong", count, int(t), wrong);
            // In place.
            FORKED_CHECK(
                optiAllReduce(buf.send, buf.send, count, t, optiSum, comm, nullptr) == optiSuccess,
                optiGetLastError(), "optiAllReduce in place");
            cudaMemcpy(buf.recv, buf.send, buf.host.size(), cudaMemcpyDeviceToDevice);
            wrong = wrong_elements(rank, t, buf.result(), count);
            FORKED_CHECK(wrong == 0, "", "in place, count %zu type %d: %zu wrong", count, int(t),
                         wrong);
          }
        }
        optiStats_t total{};
        FORKED_CHECK(optiGetStats(comm, nullptr, &total) == optiSuccess, optiGetLastError(),
                     "stats");
        FORKED_CHECK(total.calls == 16 && total.exactCalls == 16 && total.lostFraction == 0, "",
                     "stats: %llu calls, %llu exact, lost %g", (unsigned long long)total.calls,
                     (unsigned long long)total.exactCalls, total.lostFraction);
        optiCommDestroy(comm);
        ncclCommDestroy(nccl);
        return 0;
      },
      kRankTimeoutS));
}

// Where a result differs from the exact sum: how many elements, in how many Hadamard blocks,
// and a few of them beside both ranks' inputs. Printed for a failing call, to tell a lost
// packet (a run of elements), a wrong decode (whole blocks) and stale data (old values) apart.
void describe_wrong(int rank, int call, const std::vector<uint8_t>& got, size_t count,
                    size_t block) {
  size_t wrong = 0, first = count, last = 0, blocks = 0, prev_block = SIZE_MAX, zeros = 0;
  char block_list[160] = "";
  for (size_t i = 0; i < count; ++i) {
    const double g = get(optiFloat32, got, i), w = exact_sum(i);
    if (std::fabs(g - w) <= 1e-3 * (std::fabs(w) + 1)) continue;
    ++wrong;
    zeros += g == 0;
    first = std::min(first, i);
    last = i;
    if (i / block != prev_block) {
      prev_block = i / block;
      if (++blocks <= 12) {
        const size_t used = std::strlen(block_list);
        std::snprintf(block_list + used, sizeof block_list - used, " %zu", prev_block);
      }
    }
  }
  std::printf(
      "rank %d call %d: %zu wrong (%zu zero) in %zu blocks of %zu, index %zu..%zu; "
      "blocks:%s\n",
      rank, call, wrong, zeros, blocks, block, first, last, block_list);
  int shown = 0;
  for (size_t i = first; i < count && shown < 6; ++i) {
    const double g = get(optiFloat32, got, i), w = exact_sum(i);
    if (std::fabs(g - w) <= 1e-3 * (std::fabs(w) + 1)) continue;
    std::printf("  [%zu] got %.6g want %.6g (inputs %g, %g)\n", i, g, w, input(0, i), input(1, i));
    ++shown;
  }
}

// liboptireduce bounded on the device: its sibling communicator runs bounded over the plugin.
// Every call's result stays within what the lost fractions explain: a rank's error comes from
// every rank's phase-1 losses (a shard reduced from an estimate travels to all) and its own
// phase-2 ones, so each rank's per-call fractions are shared through the test's directory and
// the bound uses both ranks'. Without injected loss little may be lost: deadlines must wait
// for the ranks' skew, which NCCL's chunking hides among dozens of messages per step (see the
// check). With 5% of datagrams dropped the losses are counted. The application's communicator
// beside the sibling stays bit-exact. `env` adds variables (OPTIREDUCE_HADAMARD=0, ...) for the
// variants main() runs.
int tar_bounded_on_the_device(double drop,
                              std::vector<std::pair<std::string, std::string>> env = {}) {
  const std::string dir = temp_dir();
  env.push_back({"OPTIREDUCE_FAULT_DROP", std::to_string(drop)});
  return failures(run_ranks(
      kRanks, nccl_env(env),
      [&](int rank) {
        ncclComm_t nccl;
        FORKED_CHECK(nccl_init(rank, dir, &nccl), "", "NCCL init failed");
        optiOptions_t o;
        FORKED_CHECK(optiOptionsDefault(&o) == optiSuccess, optiGetLastError(), "options");
        o.mode = optiBounded;
        o.safeguard = 1.0;  // never redo: this test looks at what bounded calls deliver
        optiComm_t comm = nullptr;
        FORKED_CHECK(optiCommInit(&comm, nccl, &o) == optiSuccess, optiGetLastError(),
                     "optiCommInit");
        const size_t count = 4u << 20;  // 16 MiB of fp32
        DeviceInput buf(rank, optiFloat32, count);
        FORKED_CHECK(buf.ok(), "", "cudaMalloc");
        constexpr int kCalls = 30;  // past the deadline calibration
        const bool hadamard = o.hadamard != 0;
        std::vector<double> err(kCalls), lost(kCalls);
        std::vector<std::vector<uint8_t>> kept(kCalls);  // results over a rough bound, to describe
        std::vector<double> call_ms(kCalls);
        for (int c = 0; c < kCalls; ++c) {
          if (rank == 1 && stalled_call(c)) ::usleep(useconds_t(g_stall_ms) * 1000);
          const auto t0 = std::chrono::steady_clock::now();
          FORKED_CHECK(optiAllReduce(buf.send, buf.recv, count, optiFloat32, optiSum, comm,
                                     nullptr) == optiSuccess,
                       optiGetLastError(), "optiAllReduce call %d", c);
          std::vector<uint8_t> got = buf.result();
          call_ms[size_t(c)] =
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                  .count();
          err[size_t(c)] = relative_error(optiFloat32, got, count);
          optiStats_t last{};
          FORKED_CHECK(optiGetStats(comm, &last, nullptr) == optiSuccess, optiGetLastError(),
                       "stats");
          lost[size_t(c)] = last.lostFraction;
          if (err[size_t(c)] > 1e-5) kept[size_t(c)] = std::move(got);
        }
        // The application's own communicator, beside the bounded sibling: still exact. Every
        // collective comes before the first check, so that a failing rank never leaves the
        // other waiting in one.
        DeviceInput plain(rank, optiFloat32, count);
        FORKED_CHECK(plain.ok(), "", "cudaMalloc");
        FORKED_CHECK(ncclAllReduce(plain.send, plain.recv, count, ncclFloat32, ncclSum, nccl,
                                   nullptr) == ncclSuccess,
                     "", "ncclAllReduce on the application's communicator");
        const size_t wrong = wrong_elements(rank, optiFloat32, plain.result(), count);
        optireduceNetStats s{};
        const bool have_counters = plugin_counters(&s);
        optiCommDestroy(comm);
        ncclCommDestroy(nccl);
        // Share the per-call lost fractions with the other rank.
        {
          const std::string mine = dir + "/lost-" + std::to_string(rank);
          FILE* f = std::fopen((mine + ".tmp").c_str(), "wb");
          FORKED_CHECK(f && std::fwrite(lost.data(), sizeof(double), kCalls, f) == kCalls, "",
                       "writing the lost fractions");
          std::fclose(f);
          FORKED_CHECK(std::rename((mine + ".tmp").c_str(), mine.c_str()) == 0, "", "rename");
        }
        const std::string theirs = "lost-" + std::to_string(1 - rank);
        FORKED_CHECK(optireduce::testing::wait_mark(dir, theirs, 60'000), "",
                     "the other rank's lost fractions never came");
        std::vector<double> peer(kCalls);
        FILE* f = std::fopen((dir + "/" + theirs).c_str(), "rb");
        const bool read = f && std::fread(peer.data(), sizeof(double), kCalls, f) == kCalls;
        if (f) std::fclose(f);
        FORKED_CHECK(read, "", "reading the other rank's lost fractions");
        int bad_calls = 0;
        double worst = 0, lost_sum = 0;
        for (int c = 0; c < kCalls; ++c) {
          // A call that lost nothing anywhere is the exact sum up to the transform's rounding.
          // Without Hadamard, a lost fraction f costs about sqrt(f) of the norm (each lost
          // element estimated from what arrived, or skipped); 4x that bounds it. With Hadamard
          // a block that kept k of its d coordinates is scaled by d/k, an error of up to
          // sqrt(d/k) times the block's norm: no bound but finiteness there.
          const double both = lost[size_t(c)] + peer[size_t(c)];
          const double bound = both == 0 ? 1e-5 : hadamard ? INFINITY : 4 * std::sqrt(both) + 1e-5;
          const bool bad = !(err[size_t(c)] <= bound) || !std::isfinite(err[size_t(c)]);
          if (bad || c < 3)
            std::printf(
                "rank %d call %d: relerr %.3g (bound %.3g), lost %.3g%% here, %.3g%% "
                "there\n",
                rank, c, err[size_t(c)], bound, 100 * lost[size_t(c)], 100 * peer[size_t(c)]);
          if (bad && ++bad_calls <= 3)
            describe_wrong(rank, c, kept[size_t(c)], count, size_t(o.hadamardBlock));
          if (std::isfinite(err[size_t(c)])) worst = std::max(worst, err[size_t(c)]);
          lost_sum += lost[size_t(c)];
        }
        const double mean_lost = lost_sum / kCalls;
        std::printf(
            "rank %d: drop %.2f: %d bounded calls, %d over the bound, mean lost %.4f%%, "
            "worst relerr %.2e\n",
            rank, drop, kCalls, bad_calls, 100 * mean_lost, worst);
        FORKED_CHECK(have_counters, "", "the plugin is not loaded in this process");
        const optireduceNetCounters& rx = s.processRecv;
        const optireduceNetCounters& tx = s.processSend;
        std::printf(
            "rank %d: plugin rx: msgs %llu bounded expected %llu lost %llu B, deadline "
            "hits %llu, early %llu, late %llu, stale %llu, dup %llu; tx: retx %llu "
            "repaired %llu cut %llu expired %llu\n",
            rank, (unsigned long long)rx.msgs, (unsigned long long)rx.bytesExpected,
            (unsigned long long)rx.bytesLost, (unsigned long long)rx.deadlineHits,
            (unsigned long long)rx.earlyTimeouts, (unsigned long long)rx.latePkts,
            (unsigned long long)rx.dropStale, (unsigned long long)rx.dropDuplicate,
            (unsigned long long)tx.retxPkts, (unsigned long long)tx.repairedPkts,
            (unsigned long long)tx.cutSends, (unsigned long long)tx.expiredSends);
        if (g_stall_ms > 0) {
          // What the straggler's stalls cost this rank: its calls that waited on them.
          double worst_stalled = 0, worst_other = 0;
          std::vector<double> other;
          for (int c = 10; c < kCalls; ++c) {
            if (stalled_call(c))
              worst_stalled = std::max(worst_stalled, call_ms[size_t(c)]);
            else
              other.push_back(call_ms[size_t(c)]);
          }
          std::sort(other.begin(), other.end());
          worst_other = other.empty() ? 0 : other.back();
          std::printf(
              "rank %d: rank 1 stalled %d ms before %s: those took at most %.1f ms here; the "
              "others median %.1f ms, at most %.1f ms\n",
              rank, g_stall_ms, g_stall_once ? "call 10" : "calls 10, 15, ..", worst_stalled,
              other.empty() ? 0 : other[other.size() / 2], worst_other);
          std::string line;  // from the first stall on: each call's time and lost fraction
          for (int c = 10; c < kCalls; ++c) {
            char cell[48];
            std::snprintf(cell, sizeof cell, " %d:%.0fms/%.0f%%", c, call_ms[size_t(c)],
                          100 * lost[size_t(c)]);
            line += cell;
          }
          std::printf("rank %d calls:%s\n", rank, line.c_str());
          if (rank == 0)
            FORKED_CHECK(worst_stalled < 0.5 * g_stall_ms, "",
                         "a %d ms straggler cost rank 0 %.1f ms in one call", g_stall_ms,
                         worst_stalled);
        }
        FORKED_CHECK(bad_calls == 0, "", "%d calls over the error bound", bad_calls);
        FORKED_CHECK(rx.bytesExpected > 0, "", "no bounded receive went through the plugin");
        if (drop == 0 && g_stall_ms == 0) {
          // Before the start allowance learned from the first receive of a burst, 3-27% per
          // rank (H100, H200); since, 0.3-7%. The rest varies from run to run: two processes
          // share one GPU here, time-sliced, so a rank's kernels wait ms for the other's, which
          // separate GPUs never do. tests/gpu_emu's skew test checks the mechanism sharply.
          FORKED_CHECK(mean_lost < 0.15, "", "no drops, yet %.2f%% of every call lost on average",
                       100 * mean_lost);
        } else {
          FORKED_CHECK(rx.bytesLost > 0 || rx.retxPkts > 0 || tx.retxPkts > 0, "",
                       "%.0f%% drops, yet nothing lost or repaired", 100 * drop);
        }
        FORKED_CHECK(wrong == 0, "", "the application's communicator lost %zu elements", wrong);
        return 0;
      },
      kRankTimeoutS));
}

// Without arguments, the cases below. `NAME=VALUE ...`: only the bounded case, with those
// variables (a diagnosis on a GPU machine: which option changes the result); STALL_MS=N makes
// rank 1 a straggler (g_stall_ms), STALL_ONCE=1 once only.
int main(int argc, char** argv) {
  if (!have_device()) {
    std::printf("skipped: no CUDA device\n");
    return kSkip;
  }
  if (argc > 1) {
    std::vector<std::pair<std::string, std::string>> env;
    double drop = 0;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      const size_t eq = a.find('=');
      if (eq == std::string::npos) {
        std::fprintf(stderr, "usage: %s [NAME=VALUE ...] (variables for the bounded case)\n",
                     argv[0]);
        return 2;
      }
      if (a.substr(0, eq) == "OPTIREDUCE_FAULT_DROP") {
        drop = std::atof(a.c_str() + eq + 1);
      } else if (a.substr(0, eq) == "STALL_MS") {
        g_stall_ms = std::atoi(a.c_str() + eq + 1);
      } else if (a.substr(0, eq) == "STALL_ONCE") {
        g_stall_once = std::atoi(a.c_str() + eq + 1) != 0;
      } else {
        env.push_back({a.substr(0, eq), a.substr(eq + 1)});
      }
    }
    return tar_bounded_on_the_device(drop, env) ? 1 : 0;
  }
  struct Case {
    const char* name;
    int (*run)();
  };
  const Case cases[] = {
      {"nccl_allreduce_is_exact_over_the_plugin", nccl_allreduce_is_exact_over_the_plugin},
      {"tar_exact_on_the_device", tar_exact_on_the_device},
      {"tar_bounded_on_the_device(no drops)", [] { return tar_bounded_on_the_device(0); }},
      {"tar_bounded_on_the_device(5% drops)", [] { return tar_bounded_on_the_device(0.05); }},
  };
  int failed = 0;
  for (const Case& c : cases) {
    std::printf("[ RUN  ] %s\n", c.name);
    std::fflush(stdout);
    const int bad = c.run();
    std::printf("[ %s ] %s\n", bad ? "FAIL" : " OK ", c.name);
    failed += bad != 0;
  }
  std::printf("%d of %zu failed\n", failed, sizeof cases / sizeof cases[0]);
  return failed ? 1 : 0;
}
