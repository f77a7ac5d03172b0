// The progress thread's idle sleep (idle_sleep.h).
#include "transport/idle_sleep.h"

#include <poll.h>

#include <ctime>

#include "transport/endpoint_mux.h"
#include "transport/registry.h"

namespace optireduce {
namespace {

// Endpoints one sleep waits on at most: one per device and thread that opened connections.
// More, and the thread keeps its timed sleep.
constexpr int kMaxFds = 64;

}  // namespace

IdleSleep idle_sleep(const std::vector<std::shared_ptr<EndpointMux>>& muxes, Registry& registry,
                     ProgressWaker& waker, uint64_t now, uint64_t max_ns,
                     const std::atomic<bool>& stop) {
  if (!waker.usable() || stop.load() || !registry.idle()) return IdleSleep::kNotIdle;
  pollfd fds[kMaxFds + 1];
  EndpointMux* owner[kMaxFds];
  int n = 0;
  for (const auto& m : muxes) {
    int fd = -1;
    switch (m->prepare_idle_wait(now, &fd)) {
      case EndpointMux::IdleWait::kBlock:
        break;
      case EndpointMux::IdleWait::kCovered:
        continue;
      case EndpointMux::IdleWait::kBusy:
        return IdleSleep::kNotIdle;
      case EndpointMux::IdleWait::kWork:
        return IdleSleep::kWoke;
    }
    if (n == kMaxFds) return IdleSleep::kNotIdle;
    fds[n] = pollfd{fd, POLLIN, 0};
    owner[n] = m.get();
    ++n;
  }
  fds[n] = pollfd{waker.fd(), POLLIN, 0};
  const timespec ts{static_cast<time_t>(max_ns / 1'000'000'000),
                    static_cast<long>(max_ns % 1'000'000'000)};
  // An error (EINTR) ends the sleep like a wake-up: the thread serves and comes back.
  if (::ppoll(fds, static_cast<nfds_t>(n + 1), &ts, nullptr) > 0) {
    for (int i = 0; i < n; ++i)
      if (fds[i].revents != 0) owner[i]->note_readable();
  }
  return IdleSleep::kWoke;
}

}  // namespace optireduce
