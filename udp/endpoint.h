// The UDP endpoint: one non-blocking datagram socket bound to a device's address, moving bursts
// with sendmmsg/recvmmsg and, where the kernel has them, UDP segmentation offload (GSO) on
// transmit and receive coalescing (GRO) on receive. The socket is either connect()ed to one peer
// (set_peer) or left unbound (EndpointOptions::unbound) to carry every connection of a device:
// then each send names its destination and the kernel's ICMP reports, kept on the socket's error
// queue (IP_RECVERR) with the destination they refer to, are read by take_unreachable.
#pragma once

#include <sys/socket.h>
#include <time.h>

#include <cstdint>
#include <memory>
#include <string>

#include "transport/datapath.h"
#include "transport/status.h"

namespace optireduce {

// PeerAddress::kind of a UDP address; data holds a sockaddr_in or sockaddr_in6.
inline constexpr uint8_t kUdpAddressKind = 1;

// Largest UDP payload an IPv4 datagram can carry: 65535 (IP total length) - 20 (IP header)
// - 8 (UDP header). Used for both families so that either fits (IPv6 would allow 65527).
inline constexpr uint32_t kMaxUdpPayloadBytes = 65507;

// Encodes a sockaddr_in/in6 as a PeerAddress (port and address only; flow label cleared so that
// two encodings of the same socket compare equal). Returns an empty address for other families.
PeerAddress udp_peer_address(const sockaddr* sa);
// Decodes a UDP PeerAddress. False when `addr` is not a valid UDP address.
bool udp_sockaddr(const PeerAddress& addr, sockaddr_storage* out, socklen_t* len);

// Counters only the UDP datapath has; they explain DatapathCounters' totals.
struct UdpCounters {
  // ICMP errors (port/host unreachable) reported by the socket. On an unbound endpoint only those
  // take_unreachable attributed to a destination: the socket's pending error, which the same
  // report also raises and the next send or receive meets, is in DatapathCounters alone.
  uint64_t peer_unreachable = 0;
  uint64_t unreachable_drops = 0;  // datagrams dropped: the route refused them twice in a row
  uint64_t gso_sends = 0;          // messages sent as one GSO super-datagram
  uint64_t gso_fallbacks = 0;      // 1 once GSO was refused by the kernel and turned off
  uint64_t gro_receives = 0;       // receives that held more than one coalesced datagram
  uint64_t rx_foreign = 0;         // datagrams from a source other than the peer: dropped
  // Datagrams the kernel dropped on their way into this socket (a full receive buffer, a bad
  // checksum), from SO_RXQ_OVFL: known only when a later datagram arrives, which carries the
  // socket's running count.
  uint64_t rx_kernel_drops = 0;
  // Guessed receives (rx_burst_guessed) whose bytes had to be copied back at once: a coalesced
  // receive whose datagrams were not the guessed length.
  uint64_t rx_unguessed = 0;
};

// The system calls an endpoint makes to move datagrams. Production uses ::sendmmsg and
// ::recvmmsg; tests substitute wrappers to provoke what loopback never does (a full queue,
// a kernel refusing GSO). Loopback frees a datagram's send-buffer charge as it transmits it,
// so a real socket on lo never reports EAGAIN however small its buffer.
struct UdpSyscalls {
  int (*sendmmsg)(int fd, mmsghdr* msgs, unsigned int n, int flags);
  int (*recvmmsg)(int fd, mmsghdr* msgs, unsigned int n, int flags, struct timespec* timeout);
  static const UdpSyscalls& system();
};

class UdpEndpoint final : public Endpoint {
 public:
  // Opens a socket bound to `local` (its port is ignored: the kernel picks one). `mtu` is the
  // device's MTU, from which the largest datagram is derived.
  static Status open(const sockaddr* local, uint32_t mtu, const EndpointOptions& opts,
                     std::unique_ptr<UdpEndpoint>* out);
  ~UdpEndpoint() override;
  UdpEndpoint(const UdpEndpoint&) = delete;
  UdpEndpoint& operator=(const UdpEndpoint&) = delete;

  const PeerAddress& local_address() const override { return local_; }
  Status set_peer(const PeerAddress& peer) override;
  std::string peer_text() const override;
  std::string peer_host() const override;
  int tx_burst(const TxPacket* pkts, int n) override;
  int tx_burst_to(const PeerAddress& to, const TxPacket* pkts, int n) override;
  int take_unreachable(PeerAddress* out, int max) override;
  std::string address_text(const PeerAddress& addr) const override;
  std::string address_host(const PeerAddress& addr) const override;
  int rx_burst(RxPacket* pkts, int max) override;
  int rx_burst_guessed(RxPacket* pkts, int max, const RxGuesses& g) override;
  uint32_t max_datagram_bytes() const override { return max_datagram_; }
  uint32_t max_datagram_bytes_to(const PeerAddress& peer) const override;
  const DatapathCounters& counters() const override { return counters_; }
  uint64_t receive_buffer_bytes() const override { return receive_buffer_; }

  const UdpCounters& udp_counters() const { return udp_counters_; }
  bool gso_active() const { return gso_; }
  bool gro_active() const { return gro_; }
  // The socket, for a progress thread that wants to poll it. Owned by the endpoint. An unbound
  // one polls POLLERR while take_unreachable has reports waiting, and those reports are charged
  // to its receive buffer until taken: whoever polls it must take them.
  int fd() const { return fd_; }
  int readable_fd() const override { return fd_; }
  // Tests only: replaces the system calls (see UdpSyscalls).
  void set_syscalls_for_test(const UdpSyscalls& sc) { sys_ = &sc; }

 private:
  struct Buffers;  // the preallocated message, iovec, control and receive-slot arrays

  UdpEndpoint(int fd, int family);
  Status configure(const sockaddr* local, uint32_t mtu, const EndpointOptions& opts);
  int build_tx_batch(const sockaddr_storage* dst, socklen_t dst_len, const TxPacket* pkts, int n,
                     int* built_pkts);
  int send_to(const sockaddr_storage* dst, socklen_t dst_len, const TxPacket* pkts, int n);
  void count_socket_unreachable();
  int recv_batch(int max);
  void read_control(int received);
  void aim_slot(int i, const RxGuesses::Guess& g, uint32_t split);
  void unguess_slot(int i);
  void settle_guesses(int received, int guessed, uint32_t split);
  int drain_rx(RxPacket* pkts, int max);
  bool from_peer(const sockaddr_storage& src) const;

  int fd_ = -1;
  int family_ = 0;
  const UdpSyscalls* sys_;
  std::unique_ptr<Buffers> buf_;
  PeerAddress local_;
  sockaddr_storage local_sa_{};
  sockaddr_storage peer_{};
  PeerAddress peer_addr_;  // peer_ as set_peer got it; empty before
  bool has_peer_ = false;
  bool unbound_ = false;
  // tx_burst_to's last destination, decoded, so that a run of sends to one peer decodes it once.
  PeerAddress tx_to_addr_;
  sockaddr_storage tx_to_{};
  socklen_t tx_to_len_ = 0;  // 0: nothing cached
  bool gso_ = false;
  bool gro_ = false;
  uint32_t max_datagram_ = 0;
  // The largest datagram it receives: what max_datagram_bytes_to may agree to with a peer on
  // a route larger than the device's (a GRO slot's worth), else max_datagram_.
  uint32_t rx_max_datagram_ = 0;
  bool fixed_datagram_ = false;  // EndpointOptions::max_datagram_bytes set: never larger
  uint32_t rx_slot_bytes_ = 0;
  // receive_buffer_bytes(), from the kernel's grant.
  uint64_t receive_buffer_ = 0;
  // The socket's running drop count as the last SO_RXQ_OVFL message gave it.
  uint32_t kernel_drops_seen_ = 0;
  int fatal_ = 0;  // first fatal errno; every later call reports it again
  // Receive state left by the last recvmmsg: messages [rx_next_, rx_count_) are not yet
  // handed out; rx_offset_ is how far into message rx_next_ (a GRO batch) we got.
  int rx_count_ = 0;
  int rx_next_ = 0;
  uint32_t rx_offset_ = 0;
  DatapathCounters counters_;
  UdpCounters udp_counters_;
};

}  // namespace optireduce
