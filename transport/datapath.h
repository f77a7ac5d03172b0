// The one interface between the protocol (transport/) and the mechanisms that move datagrams
// (udp/, verbs/). It is batch-shaped: the protocol hands over and takes back bursts of
// datagrams, and a datapath is chosen once at connection set-up, never per packet.
#pragma once

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "transport/status.h"

namespace optireduce {

// Where a datagram goes: sockaddr_in/in6 for UDP, (GID, QPN, Q_Key) for UD verbs. Opaque to
// the protocol, which only copies it into connection handles and compares it. Fixed size and
// pointer-free so that it can travel inside NCCL's 128-byte handle.
struct PeerAddress {
  static constexpr int kMaxBytes = 38;
  uint8_t kind = 0;  // datapath-specific tag; 0 = empty
  uint8_t len = 0;   // meaningful bytes in data
  uint8_t data[kMaxBytes] = {};

  bool empty() const { return kind == 0; }
  bool operator==(const PeerAddress& o) const {
    return kind == o.kind && len == o.len && std::memcmp(data, o.data, len) == 0;
  }
};
static_assert(sizeof(PeerAddress) == 40);

// A caller's buffer registered with a device (Device::register_memory), so that the datapath
// may send from it without copying it first (verbs: the device reads it by DMA). Covers
// [base, base + bytes). The protocol never looks inside: it carries the pointer from a send
// request to each of its TxPackets. Owned by whoever registered it (the plugin's memory
// handle), which keeps it until no send from the buffer is outstanding.
class MemoryRegion {
 public:
  virtual ~MemoryRegion() = default;
  MemoryRegion(const MemoryRegion&) = delete;
  MemoryRegion& operator=(const MemoryRegion&) = delete;

  const uint8_t* base() const { return base_; }
  size_t bytes() const { return bytes_; }
  // Where the registration is valid (verbs: its protection domain), as an identity only: an
  // endpoint sends from a region whose domain is its own and copies from any other (a region of
  // another device or datapath), so no region is ever taken for something it is not.
  const void* domain() const { return domain_; }
  // [p, p + len) lies inside the region (written to be free of overflow for any p).
  bool contains(const void* p, size_t len) const {
    const auto* b = static_cast<const uint8_t*>(p);
    return b >= base_ && static_cast<size_t>(b - base_) <= bytes_ &&
           len <= bytes_ - static_cast<size_t>(b - base_);
  }

 protected:
  MemoryRegion(const void* base, size_t bytes, const void* domain)
      : base_(static_cast<const uint8_t*>(base)), bytes_(bytes), domain_(domain) {}

 private:
  const uint8_t* base_;
  size_t bytes_;
  const void* domain_;
};

// How a datapath that still reads a payload after tx_burst returned (a zero-copy post) tells
// the payload's owner when it has stopped. The owner puts the same fence in every TxPacket of a
// buffer it must not hand back before then; the datapath holds it once per datagram it posts
// from the payload itself and releases it when the device is done reading (the send completed,
// or was discarded). A datapath that copies the payload, or sends it before tx_burst returns
// (UDP's sendmmsg), never touches it. Atomic: the owner reads it under its connection's lock,
// the datapath writes it under the endpoint's, which a shared endpoint's other connections take.
class TxFence {
 public:
  void hold() { pending_.fetch_add(1, std::memory_order_relaxed); }
  // Release order: whoever sees the fence idle sees the device's reads as finished.
  void release() { pending_.fetch_sub(1, std::memory_order_release); }
  bool idle() const { return pending_.load(std::memory_order_acquire) == 0; }
  uint32_t pending() const { return pending_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint32_t> pending_{0};
};

// One datagram to send, as a gather list of two parts so that payload is never copied to
// prepend a header.
struct TxPacket {
  const void* hdr = nullptr;
  uint32_t hdr_len = 0;
  uint32_t payload_len = 0;
  const void* payload = nullptr;
  // The registration the payload lies in (null: none; the datapath copies where it must) and
  // the fence the datapath holds while the device reads it (null only with no region). A
  // datapath that cannot send from the region, or finds the payload outside it, copies.
  const MemoryRegion* payload_mr = nullptr;
  TxFence* payload_fence = nullptr;
  // Where at the peer the datagram goes, when its receiver named a place of its own for this
  // message (Endpoint::aim_open, carried by the CTS): verbs, the QPN of the receive lane whose
  // work requests point into the receiver's buffer. 0: the peer's address as it is. A
  // datapath that cannot steer ignores it (UDP).
  uint32_t steer = 0;
};

// One received datagram. `data` points into memory owned by the endpoint and stays valid
// until the next rx_burst on the same endpoint.
struct RxPacket {
  const uint8_t* data = nullptr;
  uint32_t len = 0;
  // Filled only while the endpoint has no peer (the listen side of a handshake).
  PeerAddress from;
  // How long before the datapath handed it out the datagram reached this host (the kernel's
  // receive timestamp): the time it waited for a busy or descheduled process. 0 where unknown.
  // The congestion controller must not take that wait for queueing in the network.
  uint64_t age_ns = 0;
  // Set only by rx_burst_guessed, for a datagram received straight into guess `guess`: its
  // bytes from RxGuesses::split on begin at `rest` (the first `placed` of them; any beyond
  // lie in `data` where they belong), and `room`, the place in `data` they would have taken,
  // is kept free, so that restore() makes the datagram whole again wherever the guess was wrong.
  uint8_t* rest = nullptr;
  uint8_t* room = nullptr;
  uint32_t placed = 0;
  int32_t guess = -1;
  // Set by a datapath that received the datagram through a work request aimed at its
  // receive's buffer (Endpoint::aim_open) and checked it against that aim: its payload, all of
  // it (`placed` bytes), is at `rest`, the header alone in `data`, and there is nothing to
  // restore (`room` stays null). `len` still counts header and payload.
  bool aimed = false;

  void restore() {
    if (rest == nullptr || aimed) return;
    std::memcpy(room, rest, placed);
    rest = room = nullptr;
    placed = 0;
    guess = -1;
  }
};

// Where the receiving connection expects its next datagrams' payloads to go (the next packets
// of the receives it has posted), so that a datapath that can scatter may receive them there
// and skip the copy out of its own buffers. Pure guesses: the caller checks every datagram that
// used one and restores it where it was wrong. A guessed region must be one the connection may
// overwrite freely (no packet of it has arrived), and stays so for the whole call.
struct RxGuesses {
  static constexpr int kMax = 32;
  uint32_t split = 0;  // bytes of every datagram kept in the datapath's buffer: the header
  int n = 0;
  // After the guessed datagrams the caller expects `whole` datagrams that no guess can take and
  // nothing after them depends on: each the first and only one of a receive not started yet
  // whose buffer holds one packet (its size is unknown until it comes, and it is copied).
  int whole = 0;
  // After those, the first datagram of a receive not started yet that may take several:
  // receiving no more than that one beyond the guesses and the `whole` lets the next call guess
  // the rest of its message, whose size that datagram tells.
  bool first_pending = false;
  struct Guess {
    uint8_t* dst = nullptr;
    uint32_t len = 0;      // payload bytes expected (the most the region holds)
    uint32_t msg_seq = 0;  // what the datagram must say to be the one guessed (the caller's
    uint64_t offset = 0;   // business; a datapath ignores these)
  } g[kMax];
};

// Who takes received datagrams from an endpoint's rx_into: the calling connection's handler,
// which runs while the datagrams are valid (no copy).
class RxHandler {
 public:
  virtual void on_rx(const RxPacket* pkts, int n) = 0;
  // Fills `out` with guesses for the next datagrams (RxGuesses), called just before a receive
  // whose datagrams this handler will see first. Returns how many; 0: no guess.
  virtual int rx_guesses(RxGuesses* out) {
    (void)out;
    return 0;
  }

 protected:
  ~RxHandler() = default;
};

// What a receive tells a datapath that can post its receives into the caller's buffer ahead
// of the data (Endpoint::aim_open): which DATA belong there, and where. Packet k of the message
// carries bytes [k * pkt_payload, ...) at that offset, so its place is base + offset.
struct AimTarget {
  uint64_t token = 0;                // the token the message's DATA carries
  uint32_t msg_seq = 0;              // and its sequence
  uint8_t* base = nullptr;           // the receive's buffer
  uint64_t capacity = 0;             // its size: no datagram is placed beyond it
  uint32_t pkt_payload = 0;          // payload bytes of every packet but a message's last
  const MemoryRegion* mr = nullptr;  // the registration [base, base + capacity) lies in
};

// A connection's door for datagrams that another caller received on a shared endpoint
// (transport/endpoint_mux.h), valid during the call only. Returns false, taking none, when the
// connection is busy right now: the endpoint then keeps copies for its next rx_into. A sink
// that takes them takes the copies kept before them first (Endpoint::rx_take_kept), so that a
// connection sees its datagrams in arrival order: a receiver that acknowledged a later burst
// before a kept one would have its sender resend the kept one as lost.
class RxSink {
 public:
  virtual bool try_deliver(const RxPacket* pkts, int n) = 0;
  // After a refused try_deliver: the copies are kept now, and the connection should be served
  // even if nobody polls it.
  virtual void on_kept() = 0;

 protected:
  ~RxSink() = default;
};

// Knobs a datapath needs at endpoint creation; filled from the parameter table.
struct EndpointOptions {
  uint32_t socket_buffer_bytes = 8u << 20;  // kernel buffer per direction (UDP)
  uint32_t max_datagram_bytes = 0;          // 0: the largest the device's MTU allows
  bool gso = true;                          // UDP segmentation offload when the kernel has it
  bool gro = true;                          // UDP receive coalescing when the kernel has it
  // The endpoint is shared by every connection of a device (transport/endpoint_mux.h): it never
  // gets set_peer, each send names its destination (tx_burst_to), and the network's reports of
  // unreachable peers are read per destination (take_unreachable).
  bool unbound = false;
};

// Counters a datapath keeps about itself (the protocol keeps its own per connection).
struct DatapathCounters {
  uint64_t tx_datagrams = 0;
  uint64_t tx_syscalls = 0;
  uint64_t tx_would_block = 0;  // bursts cut short because the queue was full
  uint64_t rx_datagrams = 0;
  uint64_t rx_syscalls = 0;
  uint64_t rx_truncated = 0;  // datagrams larger than the receive slot: dropped
  uint64_t rx_errors = 0;     // error completions / error queue entries
  // The network said the peer's address has no listener (ICMP port or host unreachable): the
  // peer process is gone. The protocol counts these towards declaring it dead (liveness.h).
  uint64_t peer_unreachable = 0;
  // DATA whose payload carried a registration (TxPacket::payload_mr): posted straight from the
  // caller's buffer, or copied all the same (the payload outside the region, a datapath that
  // cannot). Datagrams without one are in neither.
  uint64_t tx_zero_copy = 0;
  uint64_t tx_copied = 0;
};

// A local end of a datagram exchange with one peer. Not thread-safe: the owning connection
// serialises every call under its own lock.
class Endpoint {
 public:
  virtual ~Endpoint() = default;

  // The address a peer sends to; goes into the connection handle.
  virtual const PeerAddress& local_address() const = 0;

  // From now on send to `peer` only, and (where the mechanism can) receive from it only.
  virtual Status set_peer(const PeerAddress& peer) = 0;

  // Takes up to `n` datagrams for sending. Returns how many were taken: fewer than `n` when
  // the datapath's queue is full (retry later); a negative errno on a fatal error.
  virtual int tx_burst(const TxPacket* pkts, int n) = 0;

  // Receives up to `max` datagrams into `pkts`. Returns how many (0 when none is waiting);
  // a negative errno on a fatal error. Never blocks.
  virtual int rx_burst(RxPacket* pkts, int max) = 0;

  // rx_burst, but where the datapath can, datagram i of the burst (its first segment, for a
  // coalesced receive) is received with its bytes from g.split on into g.g[i].dst, and so
  // marked (RxPacket::rest). Datagrams handed out of an earlier receive are never guessed.
  virtual int rx_burst_guessed(RxPacket* pkts, int max, const RxGuesses& g) {
    (void)g;
    return rx_burst(pkts, max);
  }

  // Largest datagram, header included, that reaches the peer unfragmented.
  virtual uint32_t max_datagram_bytes() const = 0;
  // The same for datagrams to `peer` in particular, which this endpoint can also receive from
  // it: larger where the route to that peer allows more than the device (a peer on this host,
  // which the kernel reaches through loopback). What a connection agrees with its peer
  // (handshake); never less than the endpoint's receive_buffer_bytes() accounting assumes,
  // since a larger datagram only fills the buffer in fewer packets.
  virtual uint32_t max_datagram_bytes_to(const PeerAddress& peer) const {
    (void)peer;
    return max_datagram_bytes();
  }

  virtual const DatapathCounters& counters() const = 0;

  // The receive buffering this endpoint really has, in datagram bytes (headers included): how
  // many bytes of max_datagram_bytes()-long datagrams may arrive between two rx_burst calls
  // without one being dropped for want of room. It is net of the datapath's own cost of holding
  // a datagram (the kernel's per-datagram charge on a socket) and of the datagrams the caller
  // may still be reading from the last rx_burst (at most 32, the transport's burst), and it
  // reflects what the system granted, not what EndpointOptions asked for. The protocol derives
  // the receive window it advertises from it, so it must never overstate. Fixed once open.
  virtual uint64_t receive_buffer_bytes() const = 0;

  // The peer as a person reads it ("10.0.0.7:41234", "gid ...:qpn 0x1a2"), for the log line
  // that reports it dead; empty before set_peer or where the datapath cannot say.
  virtual std::string peer_text() const { return {}; }

  // The peer's host as a stable key (an IP address, a GID: no port, no queue pair), so that
  // every connection to the same host shares one congestion state (congestion.h). Empty where
  // the datapath cannot say: such a connection gets a path of its own.
  virtual std::string peer_host() const { return {}; }

  // What an unbound endpoint (EndpointOptions::unbound) adds: it carries many connections.
  // Sends pkts[0, n) to `to`, with tx_burst's contract. -EOPNOTSUPP where the datapath cannot.
  virtual int tx_burst_to(const PeerAddress& to, const TxPacket* pkts, int n) {
    (void)to, (void)pkts, (void)n;
    return -EOPNOTSUPP;
  }
  // Up to `max` destinations the network reported unreachable (ICMP port or host unreachable
  // for a datagram sent by tx_burst_to) since the last call, one entry per report, oldest
  // first; 0 when none is waiting. Never blocks.
  virtual int take_unreachable(PeerAddress* out, int max) {
    (void)out, (void)max;
    return 0;
  }
  // Receives for the owning connection: up to `max` datagrams are handed to `own` (in bursts
  // of at most 32), and on a shared endpoint other connections' datagrams to their sinks.
  // Returns how many went to `own`, or a negative errno on a fatal error. Never blocks.
  virtual int rx_into(RxHandler& own, int max) {
    RxPacket pkts[32];
    const int n = rx_burst(pkts, max < 32 ? max : 32);
    if (n > 0) own.on_rx(pkts, n);
    return n;
  }
  // Where another caller of a shared endpoint hands this one's datagrams (nullptr: nowhere).
  virtual void set_rx_sink(RxSink* sink) { (void)sink; }
  // Hands `own` the copies a shared endpoint kept for this one while its sink was busy, oldest
  // first, and returns how many: for the sink, inside try_deliver, before what it is handed
  // there (RxSink). Never blocks.
  virtual int rx_take_kept(RxHandler& own) {
    (void)own;
    return 0;
  }
  // The datagram the owning connection leaves behind as it closes (its CLOSE). A shared
  // endpoint outlives the connection and keeps it, to send again whenever the peer is heard
  // on the closed connection's token (EndpointMux). An endpoint of its own closes with the
  // connection, and the peer's host reports the port unreachable instead: nothing to keep.
  virtual void set_last_words(const uint8_t* dgram, uint32_t len) { (void)dgram, (void)len; }
  // Another connection's call or the progress thread may receive this endpoint's datagrams, so
  // nobody needs to poll it for them: only its timers need a visit.
  virtual bool shared() const { return false; }
  // Datagrams kept for this endpoint (its sink was busy) that rx_into has not handed out yet.
  virtual bool rx_pending() const { return false; }
  // A descriptor that polls readable (POLLIN) while datagrams wait for this endpoint, for a
  // caller that blocks between two passes (wait_for_work); -1 where there is none, or where
  // datagrams may wait elsewhere unseen by it (the fault injector delays them in memory).
  // Read without the owner's lock, on every wait: it may go to -1 for good (verbs, once a
  // receive lane opens or a CQ cannot be armed), never to another descriptor.
  virtual int readable_fd() const { return -1; }
  // The descriptor the progress thread's idle sleep may block on (transport/idle_sleep.h),
  // asked under the endpoint's serialisation; -1: none. It may offer one where readable_fd()
  // cannot: what the descriptor does not show may be left waiting as long as no receive needs
  // it (verbs: an idle receive lane holds only the stragglers of receives that ended).
  virtual int idle_fd() const { return readable_fd(); }
  // A caller is about to block on readable_fd(), under the endpoint's serialisation: true when
  // the descriptor will show what arrives from now on and nothing arrived before that it does
  // not show; false when something may wait unseen (take it, then wait). A socket is level
  // triggered and needs nothing. A completion channel (verbs) reports only completions after
  // it is armed, so it arms here and looks once more.
  virtual bool prepare_wait() { return true; }
  // A caller saw readable_fd() readable: its next receive must look even if the endpoint
  // was idle a moment ago (endpoint_mux.cc skips some receives on an idle endpoint).
  virtual void note_readable() {}
  // A caller blocks on readable_fd() (true) or is back (false). Whoever else receives on the
  // endpoint meanwhile (the progress thread, EndpointMux::serve) leaves its datagrams to that
  // caller: taking them would not wake it.
  virtual void set_blocked_waiter(bool on) { (void)on; }
  // When a caller last received on the endpoint for any of its connections, the progress
  // thread's own receives not counted; 0: never, or the datapath cannot say. While callers
  // keep receiving, an ACK reaches its connection within their polling (Conn::wake_ns).
  virtual uint64_t last_caller_drain_ns() const { return 0; }

  // Receiving into place where the datapath posts its receives ahead of the data (verbs: a
  // UD receive lane whose work requests point into the receive's buffer, packet by packet).
  // Returns the steer the receiver's CTS names (TxPacket::steer at the sender), or 0 where the
  // datapath declines: no region of its own, none free, a receive too small to pay. Datagrams
  // that arrive in place come out of rx_burst marked RxPacket::aimed; every other one as usual.
  virtual uint32_t aim_open(const AimTarget& t) {
    (void)t;
    return 0;
  }
  // The receive ended (complete, cut, cancelled), or asks again: true once the device writes
  // into its buffer no more, whatever it still had posted there; false while the datapath is
  // still taking its requests back, and the receive asks again, with the same steer, before
  // it hands the buffer back (verbs: a lane's flushed requests come back asynchronously).
  // Once it said true, the steer is the receive's no longer. `wait`: return only once it holds
  // (a connection that closes with the receive posted). `steer` is aim_open's; 0 does nothing.
  virtual bool aim_close(uint32_t steer, bool wait) {
    (void)steer, (void)wait;
    return true;
  }
  // How often a steer this datapath gave stopped reaching its receive in mid-receive (verbs: a
  // lane whose QP could be neither flushed nor reset in place, recreated under a new QPN): its
  // sender's DATA go where no request will ever take them. Read without a lock on every
  // progress pass; a receive that sees it change asks aim_reachable about its own steer, and
  // one that is told no closes it and sends its CTS again with steer 0
  // (RecvConn::check_aim_locked).
  virtual uint64_t aim_moves() const { return 0; }
  // Whether DATA sent to `steer` (aim_open's, not yet closed) still reach its receive.
  virtual bool aim_reachable(uint32_t steer) {
    (void)steer;
    return true;
  }

  // The state of the place `steer` names, in words, for a receive that warns about it
  // (RecvConn::check_aim_locked); empty where the datapath has nothing to say.
  virtual std::string aim_text(uint32_t steer) const {
    (void)steer;
    return {};
  }

  // Any address of this datapath as peer_text() and peer_host() would write it.
  virtual std::string address_text(const PeerAddress&) const { return {}; }
  virtual std::string address_host(const PeerAddress&) const { return {}; }
};

// The speed a device reports where its link speed is unknown (virtual and virtio NICs,
// loopback, an RDMA port whose speed code we do not know): NCCL only compares the speeds of
// devices, and its own socket transport assumes the same 10 Gbit/s.
inline constexpr int kUnknownSpeedMbps = 10000;

// What the plugin reports to NCCL about one device.
struct DeviceInfo {
  std::string name;      // interface or HCA name, e.g. "eth0", "mlx5_0"
  std::string pci_path;  // /sys/devices/... path of a PCI function, or empty
  uint64_t guid = 0;
  int speed_mbps = kUnknownSpeedMbps;  // link speed in Mbit/s
  int port = 1;
  float latency_us = 0;
  uint32_t mtu = 1500;
};

// A device a datapath can open endpoints on.
class Device {
 public:
  virtual ~Device() = default;
  virtual const DeviceInfo& info() const = 0;
  virtual Status open_endpoint(const EndpointOptions& opts, std::unique_ptr<Endpoint>* out) = 0;
  // Whether its endpoints can be opened unbound (EndpointOptions::unbound) and shared by many
  // connections (transport/endpoint_mux.h).
  virtual bool can_share() const { return false; }
  // Registers host memory [data, data + bytes) so that its endpoints may send from it without a
  // copy. *out stays null, with ok, where the datapath needs no registration (UDP gathers from
  // any buffer); an error means the registration failed, and sends from the buffer are copied.
  virtual Status register_memory(void* data, size_t bytes, std::unique_ptr<MemoryRegion>* out) {
    (void)data, (void)bytes;
    out->reset();
    return Status::ok();
  }
  // The same for memory a dmabuf file descriptor describes (`offset` into it), where the
  // datapath can register one; otherwise the host path above.
  virtual Status register_dmabuf(void* data, size_t bytes, uint64_t offset, int fd,
                                 std::unique_ptr<MemoryRegion>* out) {
    (void)offset, (void)fd;
    return register_memory(data, bytes, out);
  }
};

}  // namespace optireduce
