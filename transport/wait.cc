// wait_for_work (transport.h): a caller's blocking wait between two passes.
//
// Why block rather than nap: the host path's caller has nothing to do while a phase's data are
// on the wire, and on a host whose cores the ranks share every wake-up of a waiting rank takes
// a core from a peer rank, the kernel's packet processing or another tenant (docs/lab.md, run
// 27: the background's share fell with the number of wake-ups, not with CPU time). A fixed nap
// wakes whether or not anything came and oversleeps what did come; a poll on the endpoint's
// socket wakes when a datagram arrives (an ACK, a CTS, DATA) and can sleep far longer otherwise.
//
// What the socket does not show, and how it is covered:
//  - timers (a retransmission, a CTS repeated, a bounded deadline, a paced packet with nothing
//    in flight): the sleep ends at the earliest one of the requests' connections, and one due
//    already is served at once;
//  - datagrams another thread received for the connection while its lock was held, kept in
//    its port (rx_pending): served at once, no sleep;
//  - what came before a descriptor that shows only later arrivals was armed (verbs: a CQ's
//    completion channel raises an event only for completions after ibv_req_notify_cq): the
//    endpoint arms and looks once more (Endpoint::prepare_wait), and what it finds is taken
//    in a pass instead of a sleep;
//  - datagrams the progress thread takes: none while the caller blocks (it leaves a blocked
//    caller's endpoint alone, EndpointMux::serve), but one it took between the caller's last
//    test and the poll is not seen, and the sleep lasts to its end, which the caller bounds (a
//    fraction of what it has waited so far: collectives/poll_backoff.h).
#include <poll.h>

#include <algorithm>
#include <ctime>

#include "transport/conn.h"
#include "transport/transport.h"

namespace optireduce {
namespace {

// Distinct descriptors polled at most: a shared endpoint gives all of a thread's connections
// on a device one (endpoint_mux.h); a socket per connection (OPTIREDUCE_SHARED_ENDPOINT=0) one
// each, and a phase with more peers than this naps as before.
constexpr int kMaxFds = 16;

}  // namespace

bool wait_for_work(std::span<Request* const> reqs, uint64_t max_ns) {
  pollfd fds[kMaxFds];
  Conn* owner[kMaxFds];  // a connection on each descriptor, told when it polled readable
  int n = 0;
  uint64_t sleep_ns = max_ns;
  for (Request* r : reqs) {
    if (r == nullptr || r->conn == nullptr) continue;
    Conn* c = r->conn;
    const int fd = c->readable_fd();
    if (fd < 0) return false;
    if (c->rx_pending()) {  // its pass takes them (the caller may be testing another request)
      c->poll();
      return true;
    }
    // Until the connection's earliest armed timer, on its own clock. A timer due now is served
    // here (the caller owns the connection, and may test only one of its requests per pass,
    // leaving the others' timers to the progress thread's next wake-up); a pass that fired
    // it moved it, and the caller tests what it may have ended. One that did not move is
    // left to the progress thread, or the caller would spin on it.
    if (const uint64_t t = c->next_timer_ns(); t != 0) {
      const uint64_t now = c->clock().now_ns();
      if (t > now) {
        sleep_ns = std::min(sleep_ns, t - now);
      } else {
        c->poll();
        if (c->next_timer_ns() != t) return true;
      }
    }
    const bool seen = std::any_of(fds, fds + n, [fd](const pollfd& p) { return p.fd == fd; });
    if (seen) continue;
    if (n == kMaxFds) return false;
    fds[n] = pollfd{fd, POLLIN, 0};
    owner[n] = c;
    ++n;
  }
  if (n == 0) return false;
  // A descriptor that shows only what comes after it is armed (a verbs completion channel) may
  // have missed what came since the caller's last pass: that is taken now, in place of a sleep.
  for (int i = 0; i < n; ++i) {
    if (!owner[i]->prepare_wait()) {
      owner[i]->note_readable();
      owner[i]->poll();
      return true;
    }
  }
  const timespec ts{static_cast<time_t>(sleep_ns / 1'000'000'000),
                    static_cast<long>(sleep_ns % 1'000'000'000)};
  for (int i = 0; i < n; ++i) owner[i]->set_blocked_waiter(true);
  const int r = ::ppoll(fds, static_cast<nfds_t>(n), &ts, nullptr);
  for (int i = 0; i < n; ++i) {
    owner[i]->set_blocked_waiter(false);
    if (r > 0 && fds[i].revents != 0) owner[i]->note_readable();
  }
  // An error (EINTR, ENOMEM) ends the wait like a wake-up: the caller tests and comes back.
  return true;
}

}  // namespace optireduce
