// How the host path's caller waits between two polls of the transport (host_exchange.cc).
//
// Why not a fixed short nap: a poll is a system call and a few locks, and 4 ranks on 2 cores
// each waking every 20 us for a whole 25 ms phase left little CPU to anything else on the host.
// In the tail lab the background's TCP bursts (niced, as another tenant's would be) got 0.62-0.75
// of the rate they get beside Gloo ring, whose threads sleep in epoll; naps of 60 us gave them
// 0.91-1.02 at the same P50, and an even load of the same CPU cost them only 8% (docs/lab.md,
// run 27): it is the number of wake-ups that hurts. Why not a long nap from the start: a short
// wait (a small message's phase, a millisecond) would overshoot its end by a larger share.
// So the caller yields a few times, then naps 1/32 of what it has waited so far, between 20 and
// 60 us: a wait overshoots its end by at most about 3% (or 20 us), and a long one wakes up to a
// third as often as before.
// Where the transport can block until the network answers (wait_for_work: a poll on the UDP
// socket, woken by the datagram that ends the wait, not after it), the caller blocks instead
// of napping, and for longer: a quarter of what it has waited, up to a millisecond. The bound
// is for what the socket does not show (transport/wait.cc); a phase of 25 ms then wakes for
// its datagrams and rarely otherwise.
#pragma once

#include <algorithm>
#include <chrono>
#include <span>
#include <thread>

#include "transport/transport.h"

namespace optireduce::coll {

class PollBackoff {
 public:
  static constexpr int kYields = 64;
  static constexpr std::chrono::nanoseconds kMinNap = std::chrono::microseconds(20);
  static constexpr std::chrono::nanoseconds kMaxNap = std::chrono::microseconds(60);
  static constexpr int kNapShare = 32;  // nap = waited / kNapShare, within the bounds above
  static constexpr std::chrono::nanoseconds kMaxBlock = std::chrono::milliseconds(1);
  static constexpr int kBlockShare = 4;  // block = waited / kBlockShare, kMinNap to kMaxBlock

  // After `polls` fruitless polls over `waited`: 0 to yield, else how long to nap.
  static constexpr std::chrono::nanoseconds pause_after(int polls, std::chrono::nanoseconds waited) {
    if (polls < kYields) return std::chrono::nanoseconds(0);
    return std::clamp(waited / kNapShare, kMinNap, kMaxNap);
  }

  // Starts a wait now.
  void restart() {
    polls_ = 0;
    since_ = std::chrono::steady_clock::now();
  }
  // How long a blocking wait may last after `waited`.
  static constexpr std::chrono::nanoseconds block_after(std::chrono::nanoseconds waited) {
    return std::clamp(waited / kBlockShare, kMinNap, kMaxBlock);
  }

  // One fruitless poll: yield, or wait for one of `reqs`' connections to have work (a nap
  // where the transport cannot tell).
  void pause(std::span<Request* const> reqs = {}) {
    const auto waited = std::chrono::steady_clock::now() - since_;
    const auto d = pause_after(polls_++, waited);
    if (d.count() == 0) {
      std::this_thread::yield();
      return;
    }
    const auto block = static_cast<uint64_t>(block_after(waited).count());
    if (!reqs.empty() && wait_for_work(reqs, block)) return;
    std::this_thread::sleep_for(d);
  }

 private:
  int polls_ = 0;
  std::chrono::steady_clock::time_point since_ = std::chrono::steady_clock::now();
};

}  // namespace optireduce::coll
