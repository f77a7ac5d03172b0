// Conn: the receive loop (validate, count, dispatch), control sends, the transmit batch, and
// the registry the progress thread walks.
#include "transport/conn.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>

#include "transport/log.h"
#include "transport/progress_thread.h"

namespace optireduce {

static_assert(kHelloBodyBytes <= kSackBytes, "a control payload is copied into kSackBytes");

uint32_t payload_for_datagram(uint32_t max_datagram_bytes) {
  return (max_datagram_bytes - kHeaderBytes) & ~7u;
}

uint32_t receive_window_bytes(const Endpoint& ep, uint32_t pkt_payload) {
  // The endpoint counts whole datagrams of its largest size; each carries at most pkt_payload
  // bytes of window (fewer when the peer's datagrams are smaller, and a verbs slot holds one
  // datagram whatever its size). A connection to a peer on a larger route than the device's
  // (max_datagram_bytes_to) fills it in fewer. At least one packet: a sender always keeps one
  // in flight.
  const uint64_t datagram =
      std::max<uint64_t>({ep.max_datagram_bytes(), uint64_t{pkt_payload} + kHeaderBytes, 1});
  uint64_t packets = ep.receive_buffer_bytes() / datagram;
  if (packets == 0) packets = 1;
  const uint64_t window = packets * pkt_payload;
  return window < UINT32_MAX ? static_cast<uint32_t>(window) : UINT32_MAX;
}

Conn::Conn(const Config& cfg, const Clock& clock, std::unique_ptr<Endpoint> ep, const ConnParams& p,
           std::shared_ptr<Registry> registry, ConnSide side)
    : cfg_(cfg),
      clock_(clock),
      ep_(std::move(ep)),
      params_(p),
      tx_token_(side == ConnSide::kSender ? p.token : reply_token(p.token)),
      rx_token_(side == ConnSide::kSender ? reply_token(p.token) : p.token),
      registry_(std::move(registry)),
      shared_(ep_->shared()),
      liveness_(static_cast<uint64_t>(cfg.peer_timeout_ms) * 1'000'000) {}

Conn::~Conn() { deactivate(); }

void Conn::activate() {
  ep_->set_rx_sink(this);
  if (registry_) registry_->add(this);
  if (group_) group_->add(this);
  // Datagrams that came for it during the handshake wait in its port: fetched on the next pass.
  if (shared_ && registry_ && ep_->rx_pending()) registry_->arm(this);
}

void Conn::deactivate() {
  // First: once it returns, no drain of a shared endpoint is inside try_deliver or enters it.
  ep_->set_rx_sink(nullptr);
  if (group_) group_->remove(this);
  if (registry_) registry_->remove(this);
}

void Conn::background_progress(uint64_t now, uint64_t idle_ns) {
  // Served recently and no timer due (wake_ns): its owner is polling it. A due timer is
  // served sooner than idle_ns, since the progress thread woke for it and the owner may have
  // moved on to other requests.
  const uint64_t wake = wake_ns(now);
  const bool timer_due = wake != 0 && now >= wake;
  if (shared_) {
    if (!timer_due && !ep_->rx_pending()) return;
  } else if (now - last_progress_ns_.load(std::memory_order_relaxed) < idle_ns && !timer_due) {
    return;
  }
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  if (!lock.owns_lock()) return;
  // Read the clock again under the lock: `now` was taken before it, and an owner that held the
  // lock meanwhile may have stamped later times; every timer compares against those.
  progress_locked(clock_.now_ns());
}

void Conn::progress_locked(uint64_t now, bool drain) {
  last_progress_ns_.store(now, std::memory_order_relaxed);
  if (!on_progress_thread()) owner_pass_ns_.store(now, std::memory_order_relaxed);
  if (fatal_.is_ok()) {
    if (drain) drain_rx_locked(now);
    check_liveness_locked(now);
    if (fatal_.is_ok()) {
      on_timers_locked(now);
      transmit_locked(now);
    }
  }
  // The pass's control packets that no DATA took along (a receiver's ACKs, a CTS), in one
  // burst; also what was queued before a failure (a FINAL, say), as it would have left at once.
  flush_locked();
  const uint64_t next = fatal_.is_ok() ? next_timer_locked() : 0;
  const uint64_t pace = fatal_.is_ok() ? pace_retry_locked() : 0;
  next_pace_ns_.store(pace);
  next_timer_ns_.store(next);  // both before arm() looks at the flag (registry.h)
  if ((next != 0 || pace != 0) && shared_ && registry_) registry_->arm(this);
}

void Conn::on_kept() {
  // A connection with an endpoint of its own (behind the fault injector) is on the registry's
  // polled list already; arming it too would visit it twice per pass.
  if (shared_ && registry_) registry_->arm(this);
}

void Conn::check_liveness_locked(uint64_t now) {
  const uint64_t unreachable = ep_->counters().peer_unreachable;
  liveness_.on_unreachable(unreachable - unreachable_seen_);
  unreachable_seen_ = unreachable;
  switch (liveness_.poll(now, waiting_on_peer_locked())) {
    case PeerLiveness::Verdict::kAlive:
      return;
    case PeerLiveness::Verdict::kPing: {
      PacketHeader h;
      h.type = PacketType::kPing;
      send_ctrl_locked(h);
      liveness_.on_ping_sent(now);
      return;
    }
    case PeerLiveness::Verdict::kDead:
      break;
  }
  char why[160];
  if (liveness_.why() == PeerLiveness::Why::kUnreachable) {
    std::snprintf(why, sizeof(why), "its host reported its port closed %llu times (ICMP)",
                  static_cast<unsigned long long>(liveness_.unreachable_reports()));
  } else {
    std::snprintf(why, sizeof(why),
                  "no answer to %u keepalives for OPTIREDUCE_PEER_TIMEOUT_MS=%lld ms",
                  liveness_.unanswered_pings(), static_cast<long long>(cfg_.peer_timeout_ms));
  }
  peer_gone_locked(why);
}

void Conn::peer_gone_locked(const char* why) {
  if (!fatal_.is_ok()) return;
  fatal_ = Status(Errc::kRemote);
  const std::string peer = ep_->peer_text();
  OR_WARN("connection %016llx to %s: the peer is gone: %s; its pending and later requests fail "
          "(ncclRemoteError)",
          static_cast<unsigned long long>(params_.token), peer.empty() ? "?" : peer.c_str(), why);
}

Status Conn::check_peer_locked() {
  if (peer_closed_) peer_gone_locked("it closed the connection");
  return fatal_;
}

void Conn::say_close_locked(uint32_t floor) {
  if (!fatal_.is_ok() || peer_closed_) return;
  PacketHeader h;
  h.type = PacketType::kClose;
  h.msg_floor = floor;
  // Nothing of the connection will repeat it: it is going away, so no timer and no later pass.
  // A lost CLOSE leaves a peer that still waits to its keepalive (seconds, then an error for
  // what a CLOSE would have ended quietly), so it goes out kCloseCopies times (a duplicate is
  // ignored), and a shared endpoint keeps it to answer the peer's next datagram on this token
  // (a retransmission, a PING): the copies leave back to back, and one burst of loss took both
  // (GpuDefect.LossesAreSeenWithoutHadamardWhateverTheFill failed so, 1 run in 7).
  for (int i = 0; i < kCloseCopies; ++i) send_ctrl_locked(h);
  flush_locked();
  uint8_t words[kHeaderBytes];
  encode(stamped_locked(h), words);
  ep_->set_last_words(words, kHeaderBytes);
}

Status Conn::test_request(Request* req, bool* done, size_t* size) {
  uint64_t now;
  Status st;
  {
    std::lock_guard<std::mutex> lock(mu_);
    now = clock_.now_ns();
    progress_locked(now);
    st = test_locked(req, done, size, now);
  }
  // Siblings not polled for a few microseconds get served from here (a caller waiting on one
  // request keeps the rest of its exchange moving); ones their own thread polls are skipped.
  // On a shared endpoint the drain above has handed the siblings their datagrams already.
  if (group_ != nullptr && !*done && !shared_) group_->serve_siblings(this, now, kSiblingIdleNs);
  return st;
}

void Conn::drain_rx_locked(uint64_t now) {
  // Bounded per call so that one busy connection cannot starve the caller: a later call or the
  // progress thread picks up the rest.
  constexpr int kMaxBursts = 8;
  rx_now_ = now;
  for (int b = 0; b < kMaxBursts; ++b) {
    const int n = ep_->rx_into(*this, kBatch);
    if (n < 0) {
      fail_locked(Status(Errc::kSystem, -n), "receive failed");
      return;
    }
    if (n < kBatch) return;
  }
}

void Conn::on_rx(const RxPacket* pkts, int n) {
  for (int i = 0; i < n; ++i)
    handle_datagram_locked(pkts[i].data, pkts[i].len, rx_now_, pkts[i].rest, pkts[i].age_ns);
  if (n > 0) after_rx_burst_locked(rx_now_);
}

bool Conn::try_deliver(const RxPacket* pkts, int n) {
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  if (!lock.owns_lock()) return false;
  const uint64_t now = clock_.now_ns();
  rx_now_ = now;
  ep_->rx_take_kept(*this);  // first: they arrived before these (RxSink)
  on_rx(pkts, n);
  // The rest of a pass, for what the datagrams changed (a CTS lets a send go, an ACK frees
  // window); draining again here would re-enter the shared endpoint this drain holds.
  progress_locked(now, /*drain=*/false);
  return true;
}

void Conn::handle_datagram_locked(const uint8_t* data, uint32_t len, uint64_t now,
                                  const uint8_t* placed, uint64_t age_ns) {
  // An age beyond a second is a clock step, not a wait: taken as unknown.
  rx_arrival_ns_ = age_ns < now && age_ns < kMaxRxAgeNs ? now - age_ns : now;
  PacketHeader h;
  const DecodeError e = decode(data, len, &h);
  if (e != DecodeError::kNone) {
    ++stats_.drop_malformed;
    OR_TRACE("drop malformed datagram (%s, %u bytes)", decode_error_name(e), len);
    return;
  }
  if (h.token != rx_token_) {
    ++stats_.drop_token;
    return;
  }
  liveness_.on_heard(now);
  switch (h.type) {
    case PacketType::kPing: {
      PacketHeader pong;
      pong.type = PacketType::kPong;
      send_ctrl_locked(pong);
      return;
    }
    case PacketType::kPong:
      return;  // being heard was the point
    case PacketType::kClose:
      if (!peer_closed_) {
        peer_closed_ = true;
        on_peer_closed_locked(h.msg_floor, now);
      }
      return;
    default:
      on_packet_locked(h, placed != nullptr ? placed : data + kHeaderBytes, now);
  }
}

void Conn::poll() {
  std::lock_guard<std::mutex> lock(mu_);
  progress_locked(clock_.now_ns());
}

void Conn::receive_datagram(const uint8_t* data, uint32_t len) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t now = clock_.now_ns();
  handle_datagram_locked(data, len, now);
  after_rx_burst_locked(now);
  flush_locked();  // its answer (an ACK) must not wait for the connection's first pass
}

void Conn::send_ctrl_locked(PacketHeader h, const void* payload, uint32_t len) {
  h = stamped_locked(h);
  if (batch_n_ != 0) {
    // DATA is queued: a side made a control packet halfway through building a burst (none
    // does). Its rollback counts on what flush_locked() returns, so the burst stays as it is
    // and this packet leaves alone, at once.
    uint8_t hdr[kHeaderBytes];
    h.payload_len = len;
    encode(h, hdr);
    const TxPacket p{hdr, kHeaderBytes, len, payload};
    const int n = ep_->tx_burst(&p, 1);
    if (n < 0)
      fail_locked(Status(Errc::kSystem, -n), "send failed");
    else
      stats_.ctrl_pkts += static_cast<uint64_t>(n);
    return;
  }
  if (ctrl_n_ == kCtrlBatch) flush_locked();
  // Every control payload fits (a SACK, a HELLO body).
  len = payload != nullptr ? std::min(len, kSackBytes) : 0;
  h.payload_len = len;
  const int k = ctrl_n_++;
  encode(h, batch_hdr_[k]);
  if (payload != nullptr && len != 0) std::memcpy(ctrl_payload_[k], payload, len);
  TxPacket& p = batch_[k];
  p.hdr = batch_hdr_[k];
  p.hdr_len = kHeaderBytes;
  p.payload = len != 0 ? ctrl_payload_[k] : nullptr;
  p.payload_len = len;
  p.payload_mr = nullptr;  // the entry may have carried DATA before
  p.payload_fence = nullptr;
  p.steer = 0;
}

TxPacket* Conn::batch_slot_locked(const PacketHeader& h, const void* payload, uint32_t len) {
  if (batch_n_ == kBatch) return nullptr;
  const int k = ctrl_n_ + batch_n_++;
  PacketHeader hh = stamped_locked(h);
  hh.payload_len = len;
  encode(hh, batch_hdr_[k]);
  TxPacket& p = batch_[k];
  p.hdr = batch_hdr_[k];
  p.hdr_len = kHeaderBytes;
  p.payload = payload;
  p.payload_len = len;
  p.payload_mr = nullptr;  // the side names a registration and a steer itself (send_tx.cc)
  p.payload_fence = nullptr;
  p.steer = 0;
  return &p;
}

int Conn::flush_locked() {
  const int ctrl = ctrl_n_, total = ctrl_n_ + batch_n_;
  if (total == 0) return 0;
  const int n = ep_->tx_burst(batch_, total);
  ctrl_n_ = batch_n_ = 0;
  if (n < 0) {
    fail_locked(Status(Errc::kSystem, -n), "send failed");
    return 0;
  }
  // A full queue drops the control packets it did not take; the timers that made them will
  // make them again.
  stats_.ctrl_pkts += static_cast<uint64_t>(std::min(n, ctrl));
  return std::max(0, n - ctrl);
}

void Conn::fail_locked(Status s, const char* why) {
  if (!fatal_.is_ok()) return;
  fatal_ = s;
  OR_WARN("connection %016llx failed: %s (%s, errno %d)",
          static_cast<unsigned long long>(params_.token), why, errc_name(s.code()), s.sys_errno());
}

ConnStats Conn::stats_snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

uint64_t Conn::wake_ns(uint64_t now) const {
  uint64_t timer = next_timer_ns_.load(std::memory_order_relaxed);
  const uint64_t pace = next_pace_ns_.load(std::memory_order_relaxed);
  if (pace != 0) {
    const uint64_t drained = ep_->last_caller_drain_ns();
    const bool clocked = drained != 0 && now - std::min(now, drained) < kCallerActiveNs;
    if (!clocked) timer = timer == 0 ? pace : std::min(timer, pace);
  }
  if (timer == 0) return 0;
  return std::max(timer, owner_pass_ns_.load(std::memory_order_relaxed) + kCallerActiveNs);
}

const RecvOutcome& request_outcome(const Request* req) {
  return req->outcome;
}

void*& request_caller_data(Request* req) {
  return req->caller_data;
}

Status test_request(Request* req, bool* done, size_t* size) {
  if (req == nullptr || req->conn == nullptr) return Status(Errc::kInternal);
  return req->conn->test_request(req, done, size);
}

}  // namespace optireduce
