// EndpointMux: one endpoint of a device, shared by every connection a thread opens on it, so that
// a process holds one socket per device and thread rather than one per connection, and what an
// idle connection costs is a port object (no socket, no receive ring, no system call per pass).
// Incoming datagrams are demultiplexed by the token every header carries (wire.h: each direction
// of a connection has its own, so both ends of a connection in one process are told apart).
//
// Who receives: whichever connection's call finds the endpoint free drains it (try_lock: no one
// ever waits for another's drain). It handles its own datagrams in place, and hands each other
// connection's to that connection's RxSink while the burst's buffers are valid; a sink whose lock
// is held right now gets copies in its port's RxBacklog instead, which its next call takes
// first, as does a sink that takes later ones (RxSink), so that each connection sees its
// datagrams in arrival order. The progress thread drains too (serve()), so datagrams reach
// connections nobody polls.
//
// A port that closes leaves its connection's CLOSE behind (Endpoint::set_last_words), and the
// mux answers the peer with it whenever that peer is still heard on the closed token: the
// copies the connection sent may all have been lost, and a peer that hears nothing takes the
// silence for death (liveness.h), failing what the CLOSE would have ended quietly. The engine
// keeps a mux open for a peer timeout after its last port closed (engine.h), so that this holds
// for the last connection of a thread too: closing the socket would answer the peer with ICMP
// port-unreachable instead, which it takes for the end of the process.
//
// Locks, in the order they are taken: a connection's own lock; rx_mu_ (try_lock only); ports_mu_;
// another connection's lock (try_lock only, through its sink); then the leaves ep_mu_ and a
// backlog's lock. Nothing is waited for while a leaf is held, so no cycle exists.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "transport/clock.h"
#include "transport/datapath.h"
#include "transport/progress_thread.h"
#include "transport/wire.h"

namespace optireduce {

class MuxPort;

// What the mux itself drops, not attributable to a connection.
struct MuxCounters {
  uint64_t rx_datagrams = 0;     // received on the shared endpoint, every port's together
  uint64_t rx_no_port = 0;       // too short for a header, or a token no port has: stale, stray
  // For a port that closed with last words (Endpoint::set_last_words), from its peer: the
  // peer has not heard the CLOSE. Answered with it, at most once per kAnswerGapNs each.
  uint64_t rx_closed_port = 0;
  uint64_t closes_repeated = 0;
  uint64_t rx_backlog_full = 0;  // a busy port's backlog had no room: dropped
  uint64_t drains = 0;           // receive passes over the shared endpoint
  uint64_t quiet_skips = 0;      // drains not made: the endpoint had been idle (endpoint_mux.cc)
  // Datagrams received straight into their connection's buffer (RxGuesses), and those received
  // into a guess that was wrong, which cost a copy back.
  uint64_t rx_placed = 0;
  uint64_t rx_misplaced = 0;
};

class EndpointMux : public std::enable_shared_from_this<EndpointMux> {
 public:
  // `ep` must have been opened unbound (EndpointOptions::unbound). `clock` times the copies a
  // busy connection is kept (their age, RxPacket::age_ns, counts the wait); it must outlive
  // the mux. `waker`: the progress thread's (idle_sleep.h), told when a caller stops blocking
  // on the endpoint; null where no progress thread sleeps on it.
  explicit EndpointMux(std::unique_ptr<Endpoint> ep, const Clock& clock = SteadyClock::instance(),
                       std::shared_ptr<ProgressWaker> waker = nullptr);
  ~EndpointMux();
  EndpointMux(const EndpointMux&) = delete;
  EndpointMux& operator=(const EndpointMux&) = delete;

  // A port for the connection end whose incoming datagrams carry `rx_token`. The port is an
  // Endpoint: set_peer() names where it sends, and from then on datagrams from elsewhere are
  // dropped (as a connected socket's kernel would). kInvalidUsage if the token is taken.
  Status open_port(uint64_t rx_token, std::unique_ptr<Endpoint>* out);

  // One receive pass for nobody in particular (the progress thread): everything waiting goes to
  // its ports' sinks or backlogs.
  void serve();

  // For the progress thread's idle sleep (idle_sleep.h), under which condition it may block
  // until a datagram comes for this endpoint:
  enum class IdleWait {
    kBlock,    // on *fd: nobody receives here, and the descriptor shows what comes
    kCovered,  // not at all: a caller blocks on it (wait_for_work) and takes what comes
    kBusy,     // no sleep: a caller received here within a millisecond (it likely polls still,
               // and serve() would leave what comes to it), or the endpoint offers no
               // descriptor (Endpoint::idle_fd: verbs while a receive lane is lent)
    kWork,     // no sleep: something waits that the descriptor will not show (verbs:
               // completions before the arm; taken by the next drain)
  };
  IdleWait prepare_idle_wait(uint64_t now, int* fd);
  // The endpoint polled readable: the next drain looks whatever its streak of empty ones says.
  void note_readable() { readable_.store(true, std::memory_order_relaxed); }

  const PeerAddress& local_address() const { return ep_->local_address(); }
  MuxCounters counters();
  // Ports open right now.
  size_t ports();
  // When the last port closed (the mux's creation if none ever opened), or 0 while a port is
  // open: how long the mux has only answered for closed connections (engine.h).
  uint64_t portless_since_ns();

 private:
  friend class MuxPort;

  // Drains up to kMaxBursts bursts. Datagrams for `self` go to `own` (both may be null), the
  // rest to their ports. copies_first: `self`'s backlog goes to `own` first, even when another
  // caller holds the receive side (a connection's receive; not the handshake's, whose `own`
  // keeps into that backlog). Returns how many went to `own` (copies only, if another caller
  // holds the receive side), or a negative errno (sticky: every port fails with it).
  int drain(MuxPort* self, RxHandler* own, bool copies_first);
  void dispatch_locked(const RxPacket* pkts, int n, MuxPort* self, RxHandler* own, int* mine);
  void check_guesses(RxPacket* pkts, int n, uint64_t own_token, const RxGuesses& g);
  void attribute_unreachable_locked();
  // A datagram for no open port: from the peer of a port that closed with last words, it is
  // answered with them (true); otherwise false (a stray).
  bool answer_closed_locked(uint64_t token, const PeerAddress& from, uint64_t now);
  int send(const PeerAddress& to, const TxPacket* pkts, int n);
  void close_port(MuxPort* p);
  void set_sink(MuxPort* p, RxSink* sink);

  std::unique_ptr<Endpoint> ep_;
  const Clock& clock_;
  const std::shared_ptr<ProgressWaker> waker_;
  // Who drains: held from a receive until its datagrams are handed out (they live in the
  // endpoint's buffers until its next receive). Only ever try_locked.
  std::mutex rx_mu_;
  // Every call into ep_ (its receive and transmit paths share counters and error state), held
  // for the call only, never while datagrams are handed out.
  std::mutex ep_mu_;
  std::mutex ports_mu_;
  std::unordered_map<uint64_t, MuxPort*> ports_;  // by rx token
  uint64_t portless_since_ns_;                    // under ports_mu_; see portless_since_ns()
  MuxCounters counters_;                          // under ports_mu_
  // The last words of the ports that closed most recently (under ports_mu_): a ring, so the
  // oldest are forgotten. A peer that has not heard a CLOSE after kTombstones later closes on
  // this endpoint (each repeated on its peer's next datagram) waits for its keepalive.
  struct Tombstone {
    uint64_t token = 0;  // the closed port's rx token; 0 = free
    PeerAddress peer;
    std::array<uint8_t, kHeaderBytes> words{};  // the CLOSE
    uint64_t answered_ns = 0;
  };
  static constexpr int kTombstones = 64;
  // Answers per tombstone are this far apart at least: a peer's burst of retransmissions gets
  // one, and its next burst (or PING) another should that one be lost.
  static constexpr uint64_t kAnswerGapNs = 1'000'000;
  std::array<Tombstone, kTombstones> tombstones_{};
  uint32_t next_tombstone_ = 0;
  uint64_t unreachable_seen_ = 0;                 // ep_'s peer_unreachable already looked at
  int guess_pause_ = 0;    // bursts left without guesses (under rx_mu_, as is the next)
  int guess_backoff_ = 0;  // the last pause; doubles while guesses keep missing
  int bad_bursts_ = 0;     // bursts in a row whose guesses mostly missed
  int fatal_ = 0;          // first fatal receive errno (under rx_mu_)
  // Empty drains in a row, calls left to skip, when the endpoint was last read, and skips not
  // yet counted (under rx_mu_; see endpoint_mux.cc on polling an idle endpoint).
  int empty_streak_ = 0;
  std::atomic<bool> readable_{false};    // a caller saw the endpoint readable (note_readable)
  // Callers blocked on its descriptor (serve() yields). Sequentially consistent, as the
  // progress thread's idle sleep reads it inside ProgressWaker::Sleep.
  std::atomic<int> blocked_waiters_{0};
  int quiet_calls_ = 0;
  uint64_t last_look_ns_ = 0;
  uint64_t quiet_skips_ = 0;
  // When a connection's own caller last drained, and when its drain last received mostly into
  // place (serve() leaves the endpoint to it while both are recent).
  std::atomic<uint64_t> last_owned_drain_ns_{0};
  std::atomic<uint64_t> last_placed_ns_{0};
  // When a thread other than the progress thread last drained, for anyone (MuxPort's
  // last_caller_drain_ns).
  std::atomic<uint64_t> last_caller_drain_ns_{0};
};

}  // namespace optireduce
