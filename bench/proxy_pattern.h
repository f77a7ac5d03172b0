// NCCL's proxy pattern (issue 16), shared by p2p_bench and idle_bench so that both measure the
// same loop: what NCCL's proxy does with one connection. 8 slots; per iteration one post (isend
// or irecv of the next slot) and one test of the oldest request; the receiver checks every
// byte of a completed slot and then overwrites it (the GPU consumed it) before it is reposted.
// Slot i of the sender holds pattern (1, i), so the receiver knows what every byte must be,
// and its overwrite makes a slot that was not written again fail the check.
#ifndef OPTIREDUCE_BENCH_PROXY_PATTERN_H_
#define OPTIREDUCE_BENCH_PROXY_PATTERN_H_

#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench/process_usage.h"
#include "tests/plugin/plugin_loader.h"
#include "tests/plugin/two_procs.h"

namespace optireduce::testing::proxy {

inline constexpr int kSlots = 8;  // NCCL's steps per connection

// A bench's two ranks, `rank_main(rank, channel)` each in a process of its own (run_pair, with
// a 580 s limit): the bench's exit code, 1 after saying why when either failed.
template <class RankMain>
int run_bench_pair(RankMain rank_main) {
  const std::string failure = run_pair([&](Channel& ch) { rank_main(0, ch); },
                                       [&](Channel& ch) { rank_main(1, ch); }, {}, 580);
  if (failure.empty()) return 0;
  std::fprintf(stderr, "benchmark failed: %s\n", failure.c_str());
  return 1;
}

// User + system CPU seconds of this process so far, every thread included (the plugin's
// progress thread counts against the plugin).
inline double cpu_s() {
  return bench::process_usage().cpu_s;
}

// One measurement as the receiver reports it: GB/s from a common start to its last completion,
// and both processes' CPU seconds per GB moved.
struct Figure {
  double gbps = 0;
  double cpu_s_per_gb = 0;
};

// Rank 1 computes the figure from both processes' CPU time and hands it to rank 0.
inline Figure exchange_figure(int rank, Channel& ch, size_t bytes_moved, double seconds,
                              double cpu) {
  Figure f;
  if (rank == 0) {
    ch.send<double>(cpu);
    f = ch.recv<Figure>();
  } else {
    const double gb = static_cast<double>(bytes_moved) / 1e9;
    f.gbps = gb / seconds;
    f.cpu_s_per_gb = (cpu + ch.recv<double>()) / gb;
    ch.send(f);
  }
  return f;
}

// Where each slot lies: in buffers of its own (make_slots) or in one registered pool.
using SlotPtrs = std::array<uint8_t*, kSlots>;

// Sender-side slots hold their patterns; receiver-side ones start zeroed.
inline void fill_slots(int rank, const SlotPtrs& slots, size_t size) {
  for (int i = 0; i < kSlots; ++i) {
    if (rank == 0)
      fill_pattern(slots[i], size, 1, static_cast<uint64_t>(i));
    else
      std::memset(slots[i], 0, size);
  }
}

inline SlotPtrs slot_ptrs(std::vector<std::vector<uint8_t>>& slots) {
  SlotPtrs at;
  for (int i = 0; i < kSlots; ++i) at[i] = slots[i].data();
  return at;
}

// kSlots buffers of `size` bytes, filled as fill_slots does.
inline std::vector<std::vector<uint8_t>> make_slots(int rank, size_t size) {
  std::vector<std::vector<uint8_t>> slots(kSlots, std::vector<uint8_t>(size));
  fill_slots(rank, slot_ptrs(slots), size);
  return slots;
}

// The receiver's work on a completed slot: check every byte, then overwrite it.
inline void consume_slot(uint8_t* slot, size_t size, int message, const char* who) {
  HCHECK(find_mismatch(slot, size, 1, static_cast<uint64_t>(message % kSlots)) < 0,
         "%s delivered wrong bytes (message %d)", who, message);
  std::memset(slot, 0, size);
}

// `n` messages of `size` bytes through the plugin's `comm` (rank 0 sends, rank 1 receives),
// message k in slot k % kSlots, every post with `mh` (null: unregistered).
inline void plugin_loop(NetApi& net, void* comm, void* mh, int rank, const SlotPtrs& slots,
                        size_t size, int n) {
  void* reqs[kSlots] = {};
  int posted = 0, completed = 0;
  while (completed < n) {
    // One post per iteration, as NCCL's proxy posts one step per progress call.
    if (posted < n && posted - completed < kSlots) {
      const int slot = posted % kSlots;
      void* req = nullptr;
      HCHECK_OK(rank == 0 ? net.isend(comm, slots[slot], size, 0, mh, &req)
                          : net.irecv(comm, slots[slot], size, 0, mh, &req));
      if (req != nullptr) {
        reqs[slot] = req;
        ++posted;
      }
    }
    if (posted == completed) continue;
    const int slot = completed % kSlots;
    int done = 0;
    HCHECK_OK(net.test(reqs[slot], &done, nullptr));
    if (!done) continue;
    if (rank == 1) consume_slot(slots[slot], size, completed, "plugin");
    ++completed;
  }
}

// The same, timed, after one untimed pass over the slots: NCCL reuses its slots for the life
// of a connection, and on these VMs the first transfer into or out of fresh memory costs
// several times a later one (a 32 MiB message 70-150 ms against 5-20 ms, over TCP alike), which
// would otherwise be most of the figure at large sizes. The bench's other sides warm up alike.
inline Figure run_slots(NetApi& net, void* comm, void* mh, int rank, Channel& ch,
                        const SlotPtrs& slots, size_t size, int n) {
  fill_slots(rank, slots, size);
  plugin_loop(net, comm, mh, rank, slots, size, kSlots);
  ch.barrier();
  const double c0 = cpu_s();
  const double t0 = mono_s();
  plugin_loop(net, comm, mh, rank, slots, size, n);
  const double t1 = mono_s();
  return exchange_figure(rank, ch, size * static_cast<size_t>(n), t1 - t0, cpu_s() - c0);
}

// run_slots with unregistered slots of their own (which it fills).
inline Figure run_plugin(NetApi& net, void* comm, int rank, Channel& ch, size_t size, int n) {
  std::vector<std::vector<uint8_t>> slots(kSlots, std::vector<uint8_t>(size));
  return run_slots(net, comm, nullptr, rank, ch, slot_ptrs(slots), size, n);
}

}  // namespace optireduce::testing::proxy

#endif  // OPTIREDUCE_BENCH_PROXY_PATTERN_H_
