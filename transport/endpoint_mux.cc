// EndpointMux and its ports.
//
// Design notes:
//  - A datagram's port is found from its header's token without decoding the rest: the
//    connection validates everything (decode(), its sequence window) as it does on an endpoint of
//    its own, so a malformed datagram with a known token is dropped and counted by its connection.
//  - A burst is handed out port by port (one on_rx / try_deliver per port and burst), so that a
//    connection's per-burst work (its ACKs) is done once per burst as before.
//  - ICMP reports name a destination, not a connection: every port whose peer is that address
//    counts one, and PeerLiveness does the rest.
#include "transport/endpoint_mux.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include <utility>

#include "transport/log.h"
#include "transport/progress_thread.h"
#include "transport/rx_backlog.h"
#include "transport/wire.h"

namespace optireduce {
namespace {

// Bursts one drain takes at most: bounds a caller's work when many connections are busy.
constexpr int kMaxBursts = 8;
constexpr int kBurst = 32;
// Drains without guesses after a burst whose guesses mostly missed (EndpointMux::check_guesses).
constexpr int kGuessPause = 16;
constexpr int kMaxGuessPause = 1024;
// Polling an idle endpoint. A drain that finds nothing costs a system call and three locks, and
// a caller that polls in a tight loop (NCCL's proxy testing its oldest request, a collective
// waiting for a peer) makes millions of them a second on the cores that the application and the
// kernel's own packet processing need: in the proxy pattern on 2 cores, 26 empty receive calls
// per datagram. After kFreeEmptyDrains empty drains in a row, the next 1, 2, 4 .. 16 calls
// (doubling with the streak) that come within kQuietNs of the last look return at once without
// looking. Both bounds matter: the calls make it deterministic under a clock that stands still
// (a datagram is found at most 16 calls late), the time spares a caller that polls slowly (a
// host exchange napping 20 us between tests would otherwise wait 16 naps for a datagram: TAR's
// idle P50 in bench/lab grew by 4%). A drain that finds anything ends the streak.
constexpr int kFreeEmptyDrains = 4;
constexpr int kMaxQuietShift = 4;  // 1 << 4 = 16 calls at most
constexpr uint64_t kQuietNs = 5'000;
// The progress thread leaves an endpoint alone while a connection's caller that receives into
// place has drained it within this long (EndpointMux::serve). A millisecond: NCCL's proxy
// returns to test() within tens of microseconds, and a receiver that checks a slot for a few
// hundred microseconds keeps its datagrams in the socket and receives them into place
// afterwards. The progress thread's own period is a millisecond too (OPTIREDUCE_PROGRESS_US),
// so an endpoint whose callers went away is served within two.
constexpr uint64_t kOwnerServesNs = 1'000'000;
// A caller that does not receive into place is left the endpoint only while it polls: NCCL's
// proxy comes back within a few microseconds, a host exchange between its naps too; one that
// sleeps longer leaves its peers' ACKs and data to the progress thread.
constexpr uint64_t kOwnerPollsNs = 20'000;
}  // namespace

class MuxPort final : public Endpoint {
 public:
  MuxPort(std::shared_ptr<EndpointMux> mux, uint64_t rx_token)
      : mux_(std::move(mux)), rx_token_(rx_token) {}
  ~MuxPort() override {
    if (mux_) mux_->close_port(this);
  }

  const PeerAddress& local_address() const override { return mux_->local_address(); }
  Status set_peer(const PeerAddress& peer) override {
    std::lock_guard<std::mutex> lock(mux_->ports_mu_);  // the drain compares against it
    peer_ = peer;
    return Status::ok();
  }
  std::string peer_text() const override { return mux_->ep_->address_text(peer_); }
  std::string peer_host() const override { return mux_->ep_->address_host(peer_); }
  std::string address_text(const PeerAddress& a) const override {
    return mux_->ep_->address_text(a);
  }
  std::string address_host(const PeerAddress& a) const override {
    return mux_->ep_->address_host(a);
  }
  uint32_t max_datagram_bytes() const override { return mux_->ep_->max_datagram_bytes(); }
  uint32_t max_datagram_bytes_to(const PeerAddress& peer) const override {
    return mux_->ep_->max_datagram_bytes_to(peer);
  }
  uint64_t receive_buffer_bytes() const override { return mux_->ep_->receive_buffer_bytes(); }

  const DatapathCounters& counters() const override {
    snapshot_ = own_;
    snapshot_.peer_unreachable = unreachable_.load(std::memory_order_relaxed);
    snapshot_.rx_errors += snapshot_.peer_unreachable;
    return snapshot_;
  }

  int tx_burst(const TxPacket* pkts, int n) override {
    if (peer_.empty()) return -EDESTADDRREQ;
    const int r = mux_->send(peer_, pkts, n);
    if (r > 0) own_.tx_datagrams += static_cast<uint64_t>(r);
    if (r >= 0 && r < n) ++own_.tx_would_block;
    return r;
  }

  int rx_into(RxHandler& own, int max) override {
    (void)max;  // a drain is bounded by itself (kMaxBursts)
    forget_handed();
    const int r = mux_->drain(this, &own, /*copies_first=*/true);
    if (r < 0) return r;
    own_.rx_datagrams += static_cast<uint64_t>(r);
    return r;
  }

  // The copying receive, for callers that want datagrams back rather than handed over (the
  // handshake): what arrives is kept in the backlog and handed out from there, valid until the
  // next call on this port.
  int rx_burst(RxPacket* pkts, int max) override {
    struct Keep final : RxHandler {
      RxBacklog* b = nullptr;
      uint64_t now = 0;
      void on_rx(const RxPacket* p, int n) override { (void)b->push(p, n, now); }
    } keep;
    keep.b = &backlog_;
    keep.now = mux_->clock_.now_ns();
    forget_handed();
    const int r = mux_->drain(this, &keep, /*copies_first=*/false);  // keep: they queue behind
    if (r < 0) return r;
    handed_ = backlog_.peek(pkts, max, keep.now);
    own_.rx_datagrams += static_cast<uint64_t>(handed_);
    return handed_;
  }

  int rx_take_kept(RxHandler& own) override { return backlog_.take(own, mux_->clock_.now_ns()); }

  void set_rx_sink(RxSink* sink) override {
    // A connection takes the port over from the handshake, which is done with what rx_burst
    // handed it: forgotten now, or an idle connection would keep the copies (and their ring)
    // for life, since nobody calls it again.
    if (sink != nullptr) forget_handed();
    mux_->set_sink(this, sink);
  }
  bool shared() const override { return true; }
  bool rx_pending() const override { return backlog_.pending(); }
  int readable_fd() const override { return mux_->ep_->readable_fd(); }
  bool prepare_wait() override {
    std::lock_guard<std::mutex> lock(mux_->ep_mu_);  // as every receive on the endpoint
    return mux_->ep_->prepare_wait();
  }
  void note_readable() override { mux_->note_readable(); }
  void set_blocked_waiter(bool on) override {
    mux_->blocked_waiters_.fetch_add(on ? 1 : -1);
    // An idle sleep may have left the endpoint to this caller (kCovered), who may now go away.
    if (!on && mux_->waker_) mux_->waker_->wake();
  }
  void set_last_words(const uint8_t* dgram, uint32_t len) override {
    // A CLOSE is a bare header. close_port reads the words under the same lock.
    if (len != kHeaderBytes) return;
    std::lock_guard<std::mutex> lock(mux_->ports_mu_);
    std::memcpy(last_words_.data(), dgram, len);
    has_last_words_ = true;
  }
  uint64_t last_caller_drain_ns() const override {
    return mux_->last_caller_drain_ns_.load(std::memory_order_relaxed);
  }
  // Under the endpoint's lock, as its every call: a drain holds it only while it receives, so
  // a receive may end (and close its aim) from inside a drain's hand-over. What the drain took
  // in place before the close reaches the connection marked aimed, into a receive now ended,
  // which drops it unread (RxBacklog keeps such datagrams without their payload).
  uint32_t aim_open(const AimTarget& t) override {
    std::lock_guard<std::mutex> lock(mux_->ep_mu_);
    return mux_->ep_->aim_open(t);
  }
  bool aim_close(uint32_t steer, bool wait) override {
    if (steer == 0) return true;
    std::lock_guard<std::mutex> lock(mux_->ep_mu_);
    return mux_->ep_->aim_close(steer, wait);
  }
  uint64_t aim_moves() const override { return mux_->ep_->aim_moves(); }  // lock-free
  bool aim_reachable(uint32_t steer) override {
    if (steer == 0) return true;
    std::lock_guard<std::mutex> lock(mux_->ep_mu_);
    return mux_->ep_->aim_reachable(steer);
  }
  std::string aim_text(uint32_t steer) const override {
    std::lock_guard<std::mutex> lock(mux_->ep_mu_);
    return mux_->ep_->aim_text(steer);
  }

 private:
  friend class EndpointMux;

  // What rx_burst handed out last is done with once the owner calls again.
  void forget_handed() {
    backlog_.consume(handed_);
    handed_ = 0;
  }

  std::shared_ptr<EndpointMux> mux_;
  const uint64_t rx_token_;
  PeerAddress peer_;        // written under the mux's ports_mu_; empty: any source (listen)
  RxSink* sink_ = nullptr;  // under the mux's ports_mu_
  RxBacklog backlog_;       // the drain's copies while the sink was busy; rx_burst's
  int handed_ = 0;          // backlog records rx_burst handed out, consumed on the next call
  DatapathCounters own_;    // the owner's counts (under the owning connection's lock)
  std::array<uint8_t, kHeaderBytes> last_words_{};  // under the mux's ports_mu_
  bool has_last_words_ = false;
  std::atomic<uint64_t> unreachable_{0};
  mutable DatapathCounters snapshot_;
};

// ---------------------------------------------------------------------------------------------

EndpointMux::EndpointMux(std::unique_ptr<Endpoint> ep, const Clock& clock,
                         std::shared_ptr<ProgressWaker> waker)
    : ep_(std::move(ep)),
      clock_(clock),
      waker_(std::move(waker)),
      portless_since_ns_(clock.now_ns()) {}

EndpointMux::~EndpointMux() = default;  // every port holds the mux: none is left

Status EndpointMux::open_port(uint64_t rx_token, std::unique_ptr<Endpoint>* out) {
  auto port = std::make_unique<MuxPort>(shared_from_this(), rx_token);
  {
    std::lock_guard<std::mutex> lock(ports_mu_);
    if (!ports_.emplace(rx_token, port.get()).second) {
      OR_WARN("shared endpoint %s: token %016llx is in use already",
              ep_->address_text(ep_->local_address()).c_str(),
              static_cast<unsigned long long>(rx_token));
      port->mux_ = nullptr;  // never registered: its destructor must not unregister the other
      return Status(Errc::kInvalidUsage);
    }
  }
  *out = std::move(port);
  return Status::ok();
}

void EndpointMux::close_port(MuxPort* p) {
  std::lock_guard<std::mutex> lock(ports_mu_);
  auto it = ports_.find(p->rx_token_);
  if (it == ports_.end() || it->second != p) return;
  ports_.erase(it);
  if (ports_.empty()) portless_since_ns_ = clock_.now_ns();
  if (!p->has_last_words_ || p->peer_.empty()) return;
  Tombstone& t = tombstones_[next_tombstone_++ % kTombstones];
  t.token = p->rx_token_;
  t.peer = p->peer_;
  t.words = p->last_words_;
  t.answered_ns = 0;
}

bool EndpointMux::answer_closed_locked(uint64_t token, const PeerAddress& from, uint64_t now) {
  for (Tombstone& t : tombstones_) {
    if (t.token != token || t.token == 0 || !(t.peer == from)) continue;
    if (t.answered_ns != 0 && now - t.answered_ns < kAnswerGapNs) return true;
    t.answered_ns = now;
    TxPacket pkt;
    pkt.hdr = t.words.data();
    pkt.hdr_len = kHeaderBytes;
    if (send(t.peer, &pkt, 1) == 1) ++counters_.closes_repeated;
    return true;
  }
  return false;
}

void EndpointMux::set_sink(MuxPort* p, RxSink* sink) {
  // Under ports_mu_, which a drain holds while it hands datagrams out: once a connection has
  // cleared its sink, no drain is inside it or will enter it.
  std::lock_guard<std::mutex> lock(ports_mu_);
  p->sink_ = sink;
}

size_t EndpointMux::ports() {
  std::lock_guard<std::mutex> lock(ports_mu_);
  return ports_.size();
}

uint64_t EndpointMux::portless_since_ns() {
  std::lock_guard<std::mutex> lock(ports_mu_);
  return ports_.empty() ? std::max<uint64_t>(portless_since_ns_, 1) : 0;
}

MuxCounters EndpointMux::counters() {
  std::lock_guard<std::mutex> lock(ports_mu_);
  return counters_;
}

int EndpointMux::send(const PeerAddress& to, const TxPacket* pkts, int n) {
  std::lock_guard<std::mutex> lock(ep_mu_);
  return ep_->tx_burst_to(to, pkts, n);
}

void EndpointMux::serve() {
  // A connection's own caller drained within the last kOwnerServesNs, and its datagrams went
  // into place: it serves the endpoint (and every port on it) by its polling, and does it
  // better (no copy, under its own lock). A drain here would copy its datagrams, into a backlog
  // when it holds its lock, and take them from under it. A caller whose datagrams are copied
  // anyway (several peers' interleaved on the endpoint, where guesses miss: a collective's
  // exchange) gains nothing by being waited for longer than it polls: while it sleeps between
  // tests, its peers' ACKs and data would wait with it, and their windows with them (4 ranks
  // on loopback, TAR exact at 8 MiB: P50 45-47 ms waited for, 39-40 ms not).
  // A caller blocked on the endpoint's descriptor (wait_for_work) wakes when a datagram comes
  // and drains it then; one taken here first would not wake it, and it would sleep on.
  if (blocked_waiters_.load(std::memory_order_relaxed) > 0) return;
  const uint64_t now = clock_.now_ns();
  const uint64_t owned = last_owned_drain_ns_.load(std::memory_order_relaxed);
  const uint64_t placed = last_placed_ns_.load(std::memory_order_relaxed);
  const bool places = placed != 0 && now - placed < kOwnerServesNs;
  if (owned != 0 && now - owned < (places ? kOwnerServesNs : kOwnerPollsNs)) return;
  (void)drain(nullptr, nullptr, false);
}

EndpointMux::IdleWait EndpointMux::prepare_idle_wait(uint64_t now, int* fd) {
  *fd = -1;
  if (blocked_waiters_.load() > 0) return IdleWait::kCovered;
  // The same window as a timed sleep's: a caller that received within it likely polls still,
  // and the descriptor would wake the thread for every datagram that caller takes anyway.
  const uint64_t caller = last_caller_drain_ns_.load(std::memory_order_relaxed);
  if (caller != 0 && now - std::min(now, caller) < kOwnerServesNs) return IdleWait::kBusy;
  std::lock_guard<std::mutex> lock(ep_mu_);  // as every receive on the endpoint
  const int d = ep_->idle_fd();
  if (d < 0) return IdleWait::kBusy;
  if (!ep_->prepare_wait()) {
    note_readable();
    return IdleWait::kWork;
  }
  *fd = d;
  return IdleWait::kBlock;
}

int EndpointMux::drain(MuxPort* self, RxHandler* own, bool copies_first) {
  // Copies first, oldest first. They are kept only under rx_mu_: held, none is kept for us
  // until the drain ends, and ours then go to `own` in arrival order; held by another caller,
  // whatever it keeps for us meanwhile is newer than these and waits for our next call.
  const auto take_copies = [&](uint64_t now) {
    return copies_first && own != nullptr ? self->backlog_.take(*own, now) : 0;
  };
  std::unique_lock<std::mutex> rx(rx_mu_, std::try_to_lock);
  if (!rx.owns_lock()) return take_copies(clock_.now_ns());  // the other caller hands ours over
  if (fatal_ != 0) return -fatal_;
  const uint64_t now = clock_.now_ns();
  int mine = take_copies(now);
  if (own != nullptr) last_owned_drain_ns_.store(now, std::memory_order_relaxed);
  if (!on_progress_thread()) last_caller_drain_ns_.store(now, std::memory_order_relaxed);
  // A caller woke because the endpoint polled readable (note_readable): look, whatever the
  // streak of empty drains before it says.
  if (quiet_calls_ > 0 && readable_.exchange(false, std::memory_order_relaxed)) quiet_calls_ = 0;
  if (quiet_calls_ > 0) {
    --quiet_calls_;
    if (now - last_look_ns_ < kQuietNs) {
      ++quiet_skips_;
      return mine;
    }
  }
  last_look_ns_ = now;
  RxPacket pkts[kBurst];
  RxGuesses guesses;
  for (int b = 0; b < kMaxBursts; ++b) {
    // The caller's own handler guesses where its next payloads go (its lock is held for the
    // whole drain, so the regions stay its to overwrite); it is asked again for every burst,
    // after it has taken the last one.
    guesses.n = guesses.whole = 0;
    guesses.first_pending = false;  // nothing to guess next: no reason to take fewer
    if (own != nullptr && self != nullptr) {
      if (guess_pause_ > 0)
        --guess_pause_;
      else
        guesses.n = own->rx_guesses(&guesses);
    }
    for (RxPacket& p : pkts) {  // an endpoint that never guesses or aims leaves them
      p.rest = nullptr;
      p.aimed = false;
    }
    // Datagrams come in order: the guessed ones, the one-datagram receives, then the first of a
    // receive not started yet. Taking no more than that one beyond them lets the next burst
    // guess the rest of its message instead of copying it (one more system call per message).
    // The one-datagram receives do not stop the burst: stopped at each of them, a stream of
    // 4 KiB messages made one recvmmsg per message.
    const int want =
        guesses.first_pending ? std::min(kBurst, guesses.n + guesses.whole + 1) : kBurst;
    int n;
    {
      std::lock_guard<std::mutex> lock(ep_mu_);
      n = guesses.n > 0 ? ep_->rx_burst_guessed(pkts, want, guesses) : ep_->rx_burst(pkts, want);
    }
    if (n > 0 && guesses.n > 0) check_guesses(pkts, n, self->rx_token_, guesses);
    if (b == 0) {
      empty_streak_ = n == 0 ? empty_streak_ + 1 : 0;
      if (empty_streak_ >= kFreeEmptyDrains)
        quiet_calls_ = 1 << std::min(empty_streak_ - kFreeEmptyDrains, kMaxQuietShift);
    }
    if (n < 0) {
      fatal_ = -n;
      OR_WARN("shared endpoint %s: receive failed (errno %d): every connection on it fails",
              ep_->address_text(ep_->local_address()).c_str(), fatal_);
      return n;
    }
    {
      std::lock_guard<std::mutex> lock(ports_mu_);
      ++counters_.drains;
      counters_.quiet_skips += std::exchange(quiet_skips_, 0);
      attribute_unreachable_locked();
      if (n > 0) dispatch_locked(pkts, n, self, own, &mine);
    }
    if (n < want) break;
  }
  return mine;
}

// Every datagram received into a guess is checked before any is handed out: one the guess got
// wrong (another packet, another connection's, a stray) is made whole again first, while no
// other datagram of the burst has been written anywhere, since its bytes sit in a region that
// another datagram of the burst may be about to fill.
void EndpointMux::check_guesses(RxPacket* pkts, int n, uint64_t own_token, const RxGuesses& g) {
  int hits = 0, misses = 0;
  for (int i = 0; i < n; ++i) {
    RxPacket& p = pkts[i];
    if (p.rest == nullptr || p.aimed) continue;  // aimed: checked by the datapath itself
    PacketHeader h;
    const RxGuesses::Guess* want = p.guess >= 0 && p.guess < g.n ? &g.g[p.guess] : nullptr;
    const bool right = want != nullptr && g.split == kHeaderBytes &&
                       decode(p.data, p.len, &h) == DecodeError::kNone && h.token == own_token &&
                       h.type == PacketType::kData && h.msg_seq == want->msg_seq &&
                       h.offset == want->offset && h.payload_len == p.placed && p.rest == want->dst;
    if (right) {
      ++hits;
    } else {
      p.restore();
      ++misses;
    }
  }
  if (hits > misses) last_placed_ns_.store(clock_.now_ns(), std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(ports_mu_);
  counters_.rx_placed += static_cast<uint64_t>(hits);
  counters_.rx_misplaced += static_cast<uint64_t>(misses);
  // Guesses that mostly miss cost a copy back and then the usual copy: stop guessing a while,
  // longer each time in a row (several connections' datagrams interleaved on the endpoint).
  // One bad burst alone is no pattern: a retransmitted packet (a tail probe) in the middle of a
  // message shifts every guess after it by one, and the next burst is guessed right again.
  if (misses > hits) {
    if (++bad_bursts_ < 2) return;
    guess_backoff_ =
        std::min(guess_backoff_ == 0 ? kGuessPause : 2 * guess_backoff_, kMaxGuessPause);
    guess_pause_ = guess_backoff_;
  } else {
    bad_bursts_ = 0;
    guess_backoff_ = 0;
  }
}

void EndpointMux::dispatch_locked(const RxPacket* pkts, int n, MuxPort* self, RxHandler* own,
                                  int* mine) {
  counters_.rx_datagrams += static_cast<uint64_t>(n);
  MuxPort* owner[kBurst];
  for (int i = 0; i < n; ++i) {
    owner[i] = nullptr;
    uint64_t token = 0;
    if (!peek_token(pkts[i].data, pkts[i].len, &token)) {
      ++counters_.rx_no_port;
      continue;
    }
    auto it = ports_.find(token);
    if (it == ports_.end()) {
      if (answer_closed_locked(token, pkts[i].from, clock_.now_ns()))
        ++counters_.rx_closed_port;
      else
        ++counters_.rx_no_port;
      continue;
    }
    MuxPort* p = it->second;
    // A port with a peer hears only from it, as a connected socket would; the listen side's
    // port hears from anyone (the token is the handle's secret).
    if (!p->peer_.empty() && !(pkts[i].from == p->peer_)) {
      ++counters_.rx_no_port;
      continue;
    }
    owner[i] = p;
  }
  // Port by port, in order of first appearance, each port's datagrams in arrival order.
  RxPacket group[kBurst];
  for (int i = 0; i < n; ++i) {
    MuxPort* p = owner[i];
    if (p == nullptr) continue;
    int k = 0;
    for (int j = i; j < n; ++j) {
      if (owner[j] != p) continue;
      group[k++] = pkts[j];
      owner[j] = nullptr;
    }
    if (p == self) {
      if (own != nullptr) own->on_rx(group, k);
      *mine += k;
    } else if (p->sink_ == nullptr || !p->sink_->try_deliver(group, k)) {
      // The sink takes its earlier copies first (rx_take_kept); no copy is kept meanwhile,
      // since only a drain keeps them and this one holds rx_mu_.
      counters_.rx_backlog_full +=
          static_cast<uint64_t>(p->backlog_.push(group, k, clock_.now_ns()));
      if (p->sink_ != nullptr) p->sink_->on_kept();  // after the push: see registry.h
    }
  }
}

void EndpointMux::attribute_unreachable_locked() {
  std::lock_guard<std::mutex> lock(ep_mu_);
  // The endpoint counts the error a system call met (either path); the reports themselves wait
  // on its error queue, read only then, so that a quiet drain costs no extra system call. They
  // must not wait long: they take the socket's receive buffer.
  const uint64_t seen = ep_->counters().peer_unreachable;
  if (seen == unreachable_seen_) return;
  unreachable_seen_ = seen;
  PeerAddress dead[16];
  for (int round = 0; round < 4; ++round) {
    const int k = ep_->take_unreachable(dead, 16);
    for (int i = 0; i < k; ++i) {
      for (auto& [token, p] : ports_) {
        if (p->peer_ == dead[i]) p->unreachable_.fetch_add(1, std::memory_order_relaxed);
      }
    }
    if (k < 16) break;
  }
}

}  // namespace optireduce
