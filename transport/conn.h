// What both ends of a connection share: the lock, the endpoint, the negotiated parameters,
// the counters, the receive loop that validates and dispatches datagrams, the transmit batch,
// and the peer's liveness (PING/PONG, CLOSE, ICMP reports: see liveness.h). SendConn (send.h)
// and RecvConn (recv.h) add their side's state machine.
//
// Locking: every member below mu_ is guarded by mu_. The owning NCCL thread takes it in each
// call; the engine's progress thread takes it with try_lock only, so it never makes NCCL wait.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>

#include "transport/clock.h"
#include "transport/datapath.h"
#include "transport/group.h"
#include "transport/liveness.h"
#include "transport/params.h"
#include "transport/registry.h"
#include "transport/stats.h"
#include "transport/status.h"
#include "transport/transport.h"
#include "transport/wire.h"

namespace optireduce {

class Conn;

// A request slot. Lives inside its message slot; never allocated per call.
struct Request {
  Conn* conn = nullptr;
  uint32_t seq = 0;
  RecvOutcome outcome;          // a receive's, once complete (transport.h)
  void* caller_data = nullptr;  // the caller's; cleared when the request is posted
};

// Negotiated at the handshake; constant for the connection's life.
struct ConnParams {
  uint64_t token = 0;
  uint32_t pkt_payload = 0;   // payload bytes per DATA packet, a multiple of 8
  uint64_t peer_window = 0;   // bytes the receiving side can buffer
  Delivery delivery = Delivery::kExact;
  Fill fill = Fill::kZero;
  bool until_started = false;  // ConnOptions::until_started, carried to the receiver in HELLO
};

// Derives the payload per packet from the smaller of both sides' datagram limits. A multiple of
// 8 keeps every packet boundary (and so every erasure-marker run) 8-byte aligned.
uint32_t payload_for_datagram(uint32_t max_datagram_bytes);

// The receive window a HELLO or HELLO_ACK advertises for `ep`: the buffering the endpoint
// really has (Endpoint::receive_buffer_bytes, the kernel's grant rather than the size asked),
// as payload bytes of the connection's `pkt_payload`-byte packets.
uint32_t receive_window_bytes(const Endpoint& ep, uint32_t pkt_payload);

// Which end of the connection: it decides the token of each direction (wire.h, reply_token).
enum class ConnSide : uint8_t { kSender, kReceiver };

class Conn : private RxHandler, private RxSink {
 public:
  Conn(const Config& cfg, const Clock& clock, std::unique_ptr<Endpoint> ep, const ConnParams& p,
       std::shared_ptr<Registry> registry, ConnSide side);
  virtual ~Conn();
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;

  // Makes the connection visible to the progress thread. Called by its creator once the
  // object is fully constructed; deactivate() is the first thing a derived destructor does,
  // so the thread never runs a hook on a half-built or half-destroyed object.
  void activate();
  void deactivate();
  // Joins `group` (before activate()): calls on this connection then also serve the group's
  // other idle connections, and theirs this one. The group must outlive the connection.
  void set_conn_group(ConnGroup* group) { group_ = group; }

  // The progress thread's entry: serve the connection unless its owner holds it right now or
  // served it within the last `idle_ns`. A connection on a shared endpoint is served only for a
  // due timer or datagrams kept for it: the thread's drain of the endpoint hands it the rest.
  void background_progress(uint64_t now, uint64_t idle_ns);

  Status test_request(Request* req, bool* done, size_t* size);

  // The earliest armed timer as of the last pass, 0 if none: the progress thread sleeps until
  // then rather than a whole OPTIREDUCE_PROGRESS_US period. Read without the lock.
  uint64_t next_timer_ns() const { return next_timer_ns_.load(std::memory_order_relaxed); }
  // When the progress thread should visit for that timer, as of `now`: not before
  // kCallerActiveNs after the owner's last pass (a pass on any thread but the progress
  // thread), since an owner that polls (NCCL's test() loop, a host exchange between its
  // blocking waits) fires its own timers; the thread is the backstop for an owner that stopped
  // polling, and serves such a connection's timers when they fall due. A busy connection's
  // probe and timeout move ahead with every ACK, and with a grace of 50 us the thread woke
  // every 50-120 us beside an owner that served them anyway: on 2 cores, each wake-up took a
  // core from a polling caller and the endpoint's lock from its drain, and p2p_bench's 4 KiB
  // round trip took 80-118 us against TCP's 28-37 (24-36 with this grace), its stream of
  // 8 in flight 0.13 GB/s against TCP's 0.4-0.6 (0.25-0.34).
  // A packet the pacer held back while others are in flight (pace_retry_locked) wakes it only
  // if no caller has received on the endpoint for kCallerActiveNs: while callers do, the next
  // ACK reaches this connection within their polling and its pass sends what the pacer then
  // allows (ACK clocking), and the probe and RTO timers stand in for ACKs that never come. In
  // bench/lab (4 ranks, 1 Gbit/s, 4 MiB) the thread woke for nearly every paced packet, about
  // 390 times per call and rank, and those wake-ups were a sixth of the ranks' CPU.
  uint64_t wake_ns(uint64_t now) const;
  // Callers that passed within a millisecond are taken to be polling still: a host exchange
  // naps 20 us between tests, but on a loaded host its naps stretch to hundreds; the progress
  // thread's own period is a millisecond too (OPTIREDUCE_PROGRESS_US).
  static constexpr uint64_t kCallerActiveNs = 1'000'000;

  // Its endpoint is shared (endpoint_mux.h): the progress thread visits it only when armed.
  bool shared_endpoint() const { return shared_; }
  // A timer is armed or datagrams were kept for it: the progress thread should come by.
  bool wants_visit() const {
    return next_timer_ns_.load() != 0 || next_pace_ns_.load() != 0 || ep_->rx_pending();
  }

  // For a caller that blocks between passes (wait.cc), all read without the lock: the
  // endpoint's descriptor (-1: none), datagrams kept for it, and what it saw readable.
  int readable_fd() const { return ep_->readable_fd(); }
  bool rx_pending() const { return ep_->rx_pending(); }
  void note_readable() { ep_->note_readable(); }
  // Endpoint::prepare_wait, under the lock: an endpoint of its own is served under it.
  bool prepare_wait() {
    std::lock_guard<std::mutex> lock(mu_);
    return ep_->prepare_wait();
  }
  void set_blocked_waiter(bool on) { ep_->set_blocked_waiter(on); }
  const Clock& clock() const { return clock_; }

  // Serves the connection now (what the progress thread does for idle connections).
  void poll();

  // Feeds one datagram that arrived before the connection existed (the handshake read it in
  // the same burst as the HELLO_ACK).
  void receive_datagram(const uint8_t* data, uint32_t len);

  const ConnParams& params() const { return params_; }
  ConnStats stats_snapshot() const;

 protected:
  // Drain (unless `drain` is false: the caller hands datagrams itself), run timers, transmit.
  // Caller holds mu_.
  void progress_locked(uint64_t now, bool drain = true);

  // Side-specific hooks, all called with mu_ held.
  virtual void on_packet_locked(const PacketHeader& h, const uint8_t* payload, uint64_t now) = 0;
  // A posted request waits for something only the peer can send (a CTS, an ACK, DATA).
  virtual bool waiting_on_peer_locked() const = 0;
  // The peer said CLOSE: end what waits on it (bounded requests as expired, exact ones with
  // peer_gone_locked()); later requests fail through check_peer_locked(). `floor`: the CLOSE's
  // msg_floor (a receiver's: every message below it is complete there).
  virtual void on_peer_closed_locked(uint32_t floor, uint64_t now) = 0;
  virtual void after_rx_burst_locked(uint64_t now) = 0;
  virtual void on_timers_locked(uint64_t now) = 0;
  virtual void transmit_locked(uint64_t now) = 0;
  virtual Status test_locked(Request* req, bool* done, size_t* size, uint64_t now) = 0;

  // Queues one control datagram (CTS, ACK, FINAL, PING, PONG, CLOSE, an expiry notice) for the
  // connection's next transmit burst: it leaves with the pass's DATA, ahead of it, in one
  // tx_burst, or alone at the end of the pass (progress_locked). Control packets are never
  // paced: they are small and they are what unblocks the peer. `payload` (at most kSackBytes)
  // is copied, so the caller's buffer may go at once. A full queue is flushed on the spot, so
  // nothing waits beyond kCtrlBatch packets. Every public entry point that takes mu_ ends in
  // progress_locked() or flush_locked(), so nothing queued outlives the lock. Loss of one
  // (the datapath's queue full included) is repaired by the protocol's timers.
  void send_ctrl_locked(PacketHeader h, const void* payload = nullptr, uint32_t len = 0);
  // `h` as every datagram of this end carries it: its token, and the estimate it piggybacks.
  PacketHeader stamped_locked(PacketHeader h) const {
    h.token = tx_token_;
    h.timeout_us = timeout_hint_us_;
    return h;
  }

  // A sibling in the same group polled within this long is being served by its own caller.
  static constexpr uint64_t kSiblingIdleNs = 20'000;

  // Transmit batch: the side fills up to kBatch DATA entries, then flush_locked() hands them,
  // behind the control packets queued since the last flush, to the endpoint in one tx_burst
  // and returns how many DATA entries were taken (the rest must be treated as never sent).
  static constexpr int kBatch = 32;
  // Control packets queued at most: one ACK per posted message per received burst (32
  // messages) fits; beyond it the queue is flushed early rather than grown.
  static constexpr int kCtrlBatch = 32;
  // Copies of a CLOSE (say_close_locked): under 5% loss one in 400 pairs is lost, not one in 20.
  static constexpr int kCloseCopies = 2;
  TxPacket* batch_slot_locked(const PacketHeader& h, const void* payload, uint32_t len);
  int batch_size() const { return batch_n_; }
  int flush_locked();

  // The earliest instant at which the side's timers want a pass (0: none armed), for the
  // progress thread (next_timer_ns()). Called at the end of every pass.
  virtual uint64_t next_timer_locked() const = 0;
  // A pass the pacer wants for a packet it held back while packets of this connection are in
  // flight (0: none), which their ACKs may bring instead (wake_ns). Not in next_timer_locked().
  virtual uint64_t pace_retry_locked() const { return 0; }

  void fail_locked(Status s, const char* why);
  // The peer is gone (CLOSE, silence, ICMP): the connection fails with Errc::kRemote, which
  // NCCL sees as ncclRemoteError, and one warning names the peer and the reason.
  void peer_gone_locked(const char* why);
  // For isend/irecv: the error a new request gets once the peer closed, else ok.
  Status check_peer_locked();
  // Tells the peer this end is going away (each side's destructor, after deactivate()); a
  // receiver says how far it got (`floor`, as in its ACKs).
  void say_close_locked(uint32_t floor = 0);
  ConnGroup* conn_group() const { return group_; }

  mutable std::mutex mu_;
  const Config cfg_;  // a copy: a connection may outlive the engine that made it
  const Clock& clock_;
  std::unique_ptr<Endpoint> ep_;
  const ConnParams params_;
  const uint64_t tx_token_;  // on every packet this end sends
  const uint64_t rx_token_;  // on every packet this end accepts
  ConnStats stats_;
  Status fatal_;  // sticky: the first fatal error fails every later call
  bool peer_closed_ = false;  // the peer said CLOSE
  uint32_t timeout_hint_us_ = 0;  // tC piggybacked on outgoing packets (bounded mode)
  // When the datagram being handled reached the host (its kernel timestamp where the datapath
  // has one, else when it was handled): what the receiver's hold time and the sender's
  // network-only RTT are measured from.
  uint64_t rx_arrival_ns_ = 0;
  static constexpr uint64_t kMaxRxAgeNs = 1'000'000'000;

 private:
  void drain_rx_locked(uint64_t now);
  // RxHandler: this connection's own datagrams from its endpoint (mu_ held).
  void on_rx(const RxPacket* pkts, int n) override;
  // RxSink: datagrams another caller of the shared endpoint received for this connection.
  bool try_deliver(const RxPacket* pkts, int n) override;
  void on_kept() override;
  // `placed`: where the payload already lies (a datagram received into a guess, RxGuesses);
  // null: right after the header in `data`.
  // `age_ns`: how long ago it reached the host (RxPacket::age_ns).
  void handle_datagram_locked(const uint8_t* data, uint32_t len, uint64_t now,
                              const uint8_t* placed = nullptr, uint64_t age_ns = 0);
  void check_liveness_locked(uint64_t now);

  friend class Registry;
  std::shared_ptr<Registry> registry_;
  const bool shared_;               // ep_->shared(), fixed at construction
  std::atomic<bool> armed_{false};  // in the registry's armed list (registry.h)
  ConnGroup* group_ = nullptr;
  PeerLiveness liveness_;
  uint64_t unreachable_seen_ = 0;  // the endpoint's peer_unreachable already counted
  uint64_t rx_now_ = 0;            // the pass's time, for on_rx (mu_)
  std::atomic<uint64_t> last_progress_ns_{0};  // the last pass, on any thread
  std::atomic<uint64_t> owner_pass_ns_{0};     // the last pass not on the progress thread
  std::atomic<uint64_t> next_timer_ns_{0};
  std::atomic<uint64_t> next_pace_ns_{0};  // pace_retry_locked() as of the last pass
  // One burst: ctrl_n_ control packets first (they unblock the peer), then batch_n_ DATA.
  // Fixed arrays: nothing is allocated per packet.
  TxPacket batch_[kCtrlBatch + kBatch];
  uint8_t batch_hdr_[kCtrlBatch + kBatch][kHeaderBytes];
  uint8_t ctrl_payload_[kCtrlBatch][kSackBytes];
  int ctrl_n_ = 0;
  int batch_n_ = 0;
};

}  // namespace optireduce
