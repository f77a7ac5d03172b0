// The UDP endpoint's socket set-up and its two burst paths. Everything a burst touches (message
// headers, iovecs, control buffers, receive slots) is allocated once in open().
//
// Design notes:
//  - Transmit builds one mmsghdr per datagram, or, with GSO, one per run of equal-size datagrams
//    (the last of a run may be shorter, as the kernel allows), whose iovecs alternate
//    header/payload; the kernel cuts it into datagrams of the run's size. The caller's payload is
//    never copied.
//  - ICMP errors (a peer that went away) surface once, on whichever call comes next, and refer
//    to an earlier datagram: they are counted and the call goes on. On a connected socket that
//    says which peer. An unbound socket (one per device, many destinations) gets the same
//    pending error, which then only says "look at take_unreachable": with IP_RECVERR the kernel
//    also queues each report, with the destination of the datagram it refers to, on the
//    socket's error queue, and take_unreachable reads them from there. Connected sockets leave
//    IP_RECVERR off: nothing would read their error queue, which is charged to the receive
//    buffer.
//  - tx_burst and tx_burst_to share one send loop; messages carry the destination (msg_name)
//    only for tx_burst_to, so a connected send leaves the kernel's own peer in use.
//  - Receive leaves a GRO batch that did not fit in the caller's array in place and hands out
//    the rest on the next call without a system call, so no datagram is lost to a small `max`.
#include "udp/endpoint.h"

#include <arpa/inet.h>
#include <linux/errqueue.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <new>
#include <string>

#include "transport/log.h"

namespace optireduce {
namespace {

// Messages per sendmmsg call: enough to amortise the system call over a window's worth of
// datagrams, small enough that the arrays stay in L1.
constexpr int kTxMsgs = 64;
// Datagrams one GSO message may carry: UDP_MAX_SEGMENTS is 64 in every kernel with UDP_SEGMENT
// (4.18 on); newer kernels allow 128, but 64 works everywhere.
constexpr int kMaxGsoSegments = 64;
// iovecs per sendmmsg call, two per datagram: 512 datagrams per call, past which another
// system call costs nothing measurable. Equal to UIO_MAXIOV, so one message never exceeds it.
constexpr int kTxIovecs = 1024;
// Receive slots (datagrams, or GRO batches, per recvmmsg).
constexpr int kRxSlots = 32;
// A GRO batch never exceeds the 16-bit IP length, so 64 KiB holds any of them.
constexpr uint32_t kGroSlotBytes = 65536;
// Receive slots start on cache lines so that payload copies out of them run aligned.
constexpr uint32_t kSlotAlign = 64;
// recvmmsg calls one rx_burst makes when everything received was dropped (truncated or from a
// stranger), before reporting "nothing": bounds the work of one call under a flood.
constexpr int kRxAttempts = 4;
// IP header bytes without options, and the UDP header.
constexpr uint32_t kIpv4HeaderBytes = 20;
constexpr uint32_t kIpv6HeaderBytes = 40;
constexpr uint32_t kUdpHeaderBytes = 8;
// The protocol's header alone is 48 bytes; a datagram below this carries too little to be worth
// the per-packet cost (same floor as OPTIREDUCE_MAX_DATAGRAM).
constexpr uint32_t kMinDatagramBytes = 256;

// What a datagram's IP (no options) and UDP headers take of a route's MTU.
uint32_t ip_udp_header_bytes(int family) {
  return (family == AF_INET6 ? kIpv6HeaderBytes : kIpv4HeaderBytes) + kUdpHeaderBytes;
}

// `addr`, a socket address of `family`, with its port 0 (a bind for which the kernel picks
// one); returns the address's length.
socklen_t with_any_port(const void* addr, int family, sockaddr_storage* out) {
  const socklen_t len = family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
  *out = sockaddr_storage{};
  std::memcpy(out, addr, len);
  if (family == AF_INET6)
    reinterpret_cast<sockaddr_in6*>(out)->sin6_port = 0;
  else
    reinterpret_cast<sockaddr_in*>(out)->sin_port = 0;
  return len;
}

constexpr size_t kTxCtrlBytes = CMSG_SPACE(sizeof(uint16_t));
// Room for the control messages a receive may carry: the GRO segment size, the socket's drop
// count (SO_RXQ_OVFL) and the receive timestamp (SO_TIMESTAMPNS).
constexpr size_t kRxCtrlBytes =
    CMSG_SPACE(sizeof(int)) + CMSG_SPACE(sizeof(uint32_t)) + CMSG_SPACE(sizeof(timespec));
// One error-queue entry's control message: the extended error and the ICMP sender's address
// (SO_EE_OFFENDER) after it; twice that in case another option adds a message.
constexpr size_t kErrCtrlBytes = 2 * CMSG_SPACE(sizeof(sock_extended_err) + sizeof(sockaddr_in6));
// The start of the datagram an error refers to; only the destination matters, so the kernel may
// truncate the rest.
constexpr size_t kErrDataBytes = 64;
// The most SO_RCVBUF can grant: the kernel caps a request at INT_MAX / 2 before doubling it.
constexpr uint32_t kMaxGrantBytes = INT32_MAX / 2;

// A short receive buffer is a property of the host, the same for every endpoint: said once per
// process, not once per connection.
std::atomic<bool> g_short_rcvbuf_warned{false};

int sys_sendmmsg(int fd, mmsghdr* msgs, unsigned int n, int flags) {
  return ::sendmmsg(fd, msgs, n, flags);
}
int sys_recvmmsg(int fd, mmsghdr* msgs, unsigned int n, int flags, struct timespec* timeout) {
  return ::recvmmsg(fd, msgs, n, flags, timeout);
}

// Errors by which the kernel reports an ICMP message about the peer (or no route to it): the
// peer went away or is not there yet. Lost datagrams are the protocol's business, not fatal.
bool is_unreachable(int err) {
  return err == ECONNREFUSED || err == EHOSTUNREACH || err == ENETUNREACH || err == EHOSTDOWN;
}

bool is_would_block(int err) {
  return err == EAGAIN || err == EWOULDBLOCK || err == ENOBUFS;
}

// The host part of an IPv4/IPv6 address ("?" for another family), and its port in *port.
std::string sockaddr_host(const sockaddr* sa, int* port) {
  char host[INET6_ADDRSTRLEN] = "?";
  *port = 0;
  if (sa->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    *port = ntohs(in->sin_port);
  } else if (sa->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
    *port = ntohs(in6->sin6_port);
  }
  return host;
}

std::string sockaddr_text(const sockaddr* sa) {
  int port;
  std::string host = sockaddr_host(sa, &port);
  return host + ":" + std::to_string(port);
}

// What set_socket_buffer asks the kernel for when the options say `bytes`.
uint32_t socket_buffer_request(uint32_t bytes) {
  return std::min<uint32_t>(bytes, 1u << 30);
}

// Sets a socket buffer: the FORCE variant lifts the net.core.*mem_max ceiling but needs
// CAP_NET_ADMIN; without it the plain option gets what the ceiling allows. Returns the size the
// kernel reports afterwards (it doubles the request to account for its own overhead).
int set_socket_buffer(int fd, int force_opt, int opt, uint32_t bytes) {
  const int want = static_cast<int>(socket_buffer_request(bytes));
  if (setsockopt(fd, SOL_SOCKET, force_opt, &want, sizeof(want)) != 0)
    (void)setsockopt(fd, SOL_SOCKET, opt, &want, sizeof(want));
  int got = 0;
  socklen_t len = sizeof(got);
  if (getsockopt(fd, SOL_SOCKET, opt, &got, &len) != 0) return -1;
  return got;
}

uint32_t datagram_bytes(const TxPacket& p) {
  return p.hdr_len + p.payload_len;
}

}  // namespace

struct UdpEndpoint::Buffers {
  mmsghdr tx_msgs[kTxMsgs];
  int tx_pkts[kTxMsgs];  // datagrams carried by each message
  iovec tx_iov[kTxIovecs];
  alignas(cmsghdr) uint8_t tx_ctrl[kTxMsgs][kTxCtrlBytes];
  mmsghdr rx_msgs[kRxSlots];
  // A slot's own buffer, or for a guessed receive (rx_burst_guessed) three parts: the header in
  // the slot, the payload in the guess, the rest in the slot where it would have gone.
  iovec rx_iov[kRxSlots][3];
  // Per slot of the last receive: the guess used (-1: none) and its bytes.
  int rx_guess[kRxSlots];
  uint8_t* rx_dst[kRxSlots];
  uint64_t rx_age[kRxSlots];  // RxPacket::age_ns of each slot's datagrams
  uint32_t rx_seg[kRxSlots];  // GRO segment size of each slot's receive (0: one datagram)
  uint32_t rx_dst_len[kRxSlots];
  uint32_t rx_split = 0;
  sockaddr_storage rx_from[kRxSlots];
  alignas(cmsghdr) uint8_t rx_ctrl[kRxSlots][kRxCtrlBytes];
  alignas(cmsghdr) uint8_t err_ctrl[kErrCtrlBytes];
  uint8_t err_data[kErrDataBytes];
  uint8_t* rx_data = nullptr;  // kRxSlots slots, `slot_stride` bytes apart
  uint32_t slot_stride = 0;

  ~Buffers() { std::free(rx_data); }
  uint8_t* slot(int i) const { return rx_data + static_cast<size_t>(i) * slot_stride; }
};

const UdpSyscalls& UdpSyscalls::system() {
  static const UdpSyscalls sc{sys_sendmmsg, sys_recvmmsg};
  return sc;
}

PeerAddress udp_peer_address(const sockaddr* sa) {
  PeerAddress a;
  if (sa->sa_family == AF_INET) {
    sockaddr_in in{};
    const auto* src = reinterpret_cast<const sockaddr_in*>(sa);
    in.sin_family = AF_INET;
    in.sin_port = src->sin_port;
    in.sin_addr = src->sin_addr;
    a.kind = kUdpAddressKind;
    a.len = sizeof(in);
    std::memcpy(a.data, &in, sizeof(in));
  } else if (sa->sa_family == AF_INET6) {
    sockaddr_in6 in6{};
    const auto* src = reinterpret_cast<const sockaddr_in6*>(sa);
    in6.sin6_family = AF_INET6;
    in6.sin6_port = src->sin6_port;
    in6.sin6_addr = src->sin6_addr;
    in6.sin6_scope_id = src->sin6_scope_id;
    a.kind = kUdpAddressKind;
    a.len = sizeof(in6);
    std::memcpy(a.data, &in6, sizeof(in6));
  }
  return a;
}
static_assert(sizeof(sockaddr_in6) <= PeerAddress::kMaxBytes);

bool udp_sockaddr(const PeerAddress& addr, sockaddr_storage* out, socklen_t* len) {
  if (addr.kind != kUdpAddressKind) return false;
  sa_family_t family;
  std::memcpy(&family, addr.data, sizeof(family));
  const size_t want = family == AF_INET    ? sizeof(sockaddr_in)
                      : family == AF_INET6 ? sizeof(sockaddr_in6)
                                           : 0;
  if (want == 0 || addr.len != want) return false;
  *out = sockaddr_storage{};
  std::memcpy(out, addr.data, want);
  *len = static_cast<socklen_t>(want);
  return true;
}

UdpEndpoint::UdpEndpoint(int fd, int family)
    : fd_(fd), family_(family), sys_(&UdpSyscalls::system()) {}

UdpEndpoint::~UdpEndpoint() {
  if (fd_ >= 0) ::close(fd_);
}

Status UdpEndpoint::open(const sockaddr* local, uint32_t mtu, const EndpointOptions& opts,
                         std::unique_ptr<UdpEndpoint>* out) {
  if (local->sa_family != AF_INET && local->sa_family != AF_INET6) {
    OR_WARN("UDP endpoint: address family %d is neither IPv4 nor IPv6", local->sa_family);
    return Status(Errc::kInternal);
  }
  const int fd = ::socket(local->sa_family, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, IPPROTO_UDP);
  if (fd < 0) {
    const int err = errno;
    OR_WARN("UDP endpoint: socket() failed: %s", std::strerror(err));
    return Status(Errc::kSystem, err);
  }
  // Owned from here on: the destructor closes it on every error path.
  std::unique_ptr<UdpEndpoint> ep(new (std::nothrow) UdpEndpoint(fd, local->sa_family));
  if (!ep) {
    ::close(fd);
    return Status(Errc::kSystem, ENOMEM);
  }
  const Status s = ep->configure(local, mtu, opts);
  if (!s) return s;
  *out = std::move(ep);
  return Status::ok();
}

Status UdpEndpoint::configure(const sockaddr* local, uint32_t mtu, const EndpointOptions& opts) {
  const uint32_t hdr = ip_udp_header_bytes(family_);
  if (mtu < hdr + kMinDatagramBytes) {
    OR_WARN("UDP endpoint: MTU %u is too small (need at least %u)", mtu, hdr + kMinDatagramBytes);
    return Status(Errc::kInvalidUsage);
  }
  const uint32_t mtu_datagram = std::min(mtu - hdr, kMaxUdpPayloadBytes);
  max_datagram_ = mtu_datagram;
  fixed_datagram_ = opts.max_datagram_bytes != 0;
  if (opts.max_datagram_bytes != 0) {
    max_datagram_ = std::max(opts.max_datagram_bytes, kMinDatagramBytes);
    if (max_datagram_ > mtu_datagram) {
      // Larger datagrams would fail with EMSGSIZE on the first send (fragmentation is off).
      OR_WARN("UDP endpoint: max datagram %u exceeds what MTU %u allows; using %u", max_datagram_,
              mtu, mtu_datagram);
      max_datagram_ = mtu_datagram;
    }
  }

  // A send buffer smaller than asked costs no datagram: a full one makes sendmmsg return
  // EAGAIN (tx_would_block), the protocol retries, and the peer's window is unaffected. So only
  // the receive side's grant shapes what this endpoint promises, and only its shortfall is
  // worth a warning; the send buffer's grant is in the INFO line below.
  const int snd = set_socket_buffer(fd_, SO_SNDBUFFORCE, SO_SNDBUF, opts.socket_buffer_bytes);
  const int rcv = set_socket_buffer(fd_, SO_RCVBUFFORCE, SO_RCVBUF, opts.socket_buffer_bytes);
  if (rcv <= 0) {
    const int err = errno;
    OR_WARN("UDP endpoint: cannot read the receive buffer's size: %s", std::strerror(err));
    return Status(Errc::kSystem, err);
  }
  // The kernel reports twice what it granted and charges each queued datagram's true size
  // (its data buffer plus the sk_buff) against that. Peers used to be promised half the size
  // asked, a quarter of the reported budget: room for a charge of up to 4x a datagram's length
  // (an MTU-sized datagram in a driver's 2-4 KiB page fragment costs 1.6-3.3x; loopback's large
  // paged datagrams about 1x) and for the protocol's headers. The same quarter of what the
  // kernel really granted keeps that margin when the grant falls short.
  receive_buffer_ = static_cast<uint64_t>(rcv) / 4;
  const uint32_t asked = socket_buffer_request(opts.socket_buffer_bytes);
  const uint64_t full_grant = 2 * uint64_t{std::min(asked, kMaxGrantBytes)};
  if (static_cast<uint64_t>(rcv) < full_grant && !g_short_rcvbuf_warned.exchange(true)) {
    // Without CAP_NET_ADMIN, SO_RCVBUF is cut to net.core.rmem_max; the request itself is the
    // ceiling that would let it through whole.
    OR_WARN(
        "UDP endpoint: the kernel granted a %d-byte receive buffer where "
        "OPTIREDUCE_SOCKET_BUFFER asked for %u (without CAP_NET_ADMIN, net.core.rmem_max caps "
        "it): connections offer their peers %llu bytes of receive window instead of %u, a "
        "ceiling on their throughput where that is below OPTIREDUCE_WINDOW_BYTES. Raise the cap "
        "with `sysctl -w net.core.rmem_max=%u` or give the process CAP_NET_ADMIN (said once per "
        "process).",
        rcv / 2, asked, static_cast<unsigned long long>(receive_buffer_), asked / 2, asked);
  }

  // Oversize datagrams must fail at the sender rather than travel as IP fragments, which one
  // lost fragment turns into a lost datagram and which many middleboxes drop outright.
  int rc;
  if (family_ == AF_INET) {
    const int v = IP_PMTUDISC_DO;
    rc = setsockopt(fd_, IPPROTO_IP, IP_MTU_DISCOVER, &v, sizeof(v));
  } else {
    const int v = IPV6_PMTUDISC_DO;
    rc = setsockopt(fd_, IPPROTO_IPV6, IPV6_MTU_DISCOVER, &v, sizeof(v));
  }
  if (rc != 0) {
    const int err = errno;
    OR_WARN("UDP endpoint: cannot turn fragmentation off: %s", std::strerror(err));
    return Status(Errc::kSystem, err);
  }

  sockaddr_storage bind_addr;
  const socklen_t bind_len = with_any_port(local, family_, &bind_addr);
  if (::bind(fd_, reinterpret_cast<const sockaddr*>(&bind_addr), bind_len) != 0) {
    const int err = errno;
    OR_WARN("UDP endpoint: bind to %s failed: %s",
            sockaddr_text(reinterpret_cast<const sockaddr*>(&bind_addr)).c_str(),
            std::strerror(err));
    return Status(Errc::kSystem, err);
  }
  sockaddr_storage bound{};
  socklen_t bound_len = sizeof(bound);
  if (getsockname(fd_, reinterpret_cast<sockaddr*>(&bound), &bound_len) != 0) {
    const int err = errno;
    OR_WARN("UDP endpoint: getsockname failed: %s", std::strerror(err));
    return Status(Errc::kSystem, err);
  }
  local_sa_ = bound;
  local_ = udp_peer_address(reinterpret_cast<const sockaddr*>(&bound));

  // Setting a segment size of 0 changes nothing but fails on kernels without UDP_SEGMENT.
  if (opts.gso) {
    const int zero = 0;
    gso_ = setsockopt(fd_, IPPROTO_UDP, UDP_SEGMENT, &zero, sizeof(zero)) == 0;
  }
  if (opts.gro) {
    const int one = 1;
    gro_ = setsockopt(fd_, IPPROTO_UDP, UDP_GRO, &one, sizeof(one)) == 0;
  }
  // Without IP_RECVERR an unconnected socket ignores ICMP errors altogether; with it they are
  // kept per destination for take_unreachable.
  unbound_ = opts.unbound;
  if (unbound_) {
    const int one = 1;
    rc = family_ == AF_INET ? setsockopt(fd_, IPPROTO_IP, IP_RECVERR, &one, sizeof(one))
                            : setsockopt(fd_, IPPROTO_IPV6, IPV6_RECVERR, &one, sizeof(one));
    if (rc != 0) {
      const int err = errno;
      OR_WARN("UDP endpoint: cannot queue ICMP errors per destination: %s", std::strerror(err));
      return Status(Errc::kSystem, err);
    }
  }
  // The socket's drop count rides on received datagrams from the first drop on (rx_kernel_drops):
  // without it, losses at a full receive buffer are invisible to the endpoint. Best effort.
  {
    const int one = 1;
    (void)setsockopt(fd_, SOL_SOCKET, SO_RXQ_OVFL, &one, sizeof(one));
  }
  // The kernel's receive timestamp on every datagram (RxPacket::age_ns): how long it waited in
  // the socket for this process. Best effort: without it the age is unknown (0).
  {
    const int one = 1;
    (void)setsockopt(fd_, SOL_SOCKET, SO_TIMESTAMPNS, &one, sizeof(one));
  }

  buf_.reset(new (std::nothrow) Buffers());
  if (!buf_) return Status(Errc::kSystem, ENOMEM);
  Buffers& b = *buf_;
  // With GRO one receive may hold many datagrams, so its slot must hold the largest batch.
  rx_slot_bytes_ = gro_ ? kGroSlotBytes : max_datagram_;
  rx_max_datagram_ =
      gro_ && !fixed_datagram_ ? std::min(kGroSlotBytes, kMaxUdpPayloadBytes) : max_datagram_;
  b.slot_stride = (rx_slot_bytes_ + kSlotAlign - 1) / kSlotAlign * kSlotAlign;
  b.rx_data = static_cast<uint8_t*>(
      std::aligned_alloc(kSlotAlign, static_cast<size_t>(b.slot_stride) * kRxSlots));
  if (b.rx_data == nullptr) return Status(Errc::kSystem, ENOMEM);

  // The fields that never change are set here once; the burst paths write only the rest.
  for (int i = 0; i < kTxMsgs; ++i) {
    b.tx_msgs[i] = mmsghdr{};
    auto* c = reinterpret_cast<cmsghdr*>(b.tx_ctrl[i]);
    c->cmsg_level = IPPROTO_UDP;
    c->cmsg_type = UDP_SEGMENT;
    c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
  }
  for (int i = 0; i < kRxSlots; ++i) {
    b.rx_iov[i][0] = iovec{b.slot(i), rx_slot_bytes_};
    b.rx_guess[i] = -1;
    b.rx_msgs[i] = mmsghdr{};
    b.rx_msgs[i].msg_hdr.msg_iov = b.rx_iov[i];
    b.rx_msgs[i].msg_hdr.msg_iovlen = 1;
    b.rx_msgs[i].msg_hdr.msg_name = &b.rx_from[i];
    b.rx_msgs[i].msg_hdr.msg_control = b.rx_ctrl[i];
  }

  OR_INFO(
      "UDP endpoint %s: max datagram %u bytes, send buffer %d, receive buffer %d bytes as the "
      "kernel reports them (asked %u each), %llu bytes of receive buffering offered, GSO %s, "
      "GRO %s, %s",
      sockaddr_text(reinterpret_cast<const sockaddr*>(&bound)).c_str(), max_datagram_, snd, rcv,
      opts.socket_buffer_bytes, static_cast<unsigned long long>(receive_buffer_),
      gso_ ? "on" : "off", gro_ ? "on" : "off",
      unbound_ ? "unbound (ICMP errors queued per destination)" : "for one peer");
  return Status::ok();
}

std::string UdpEndpoint::address_text(const PeerAddress& addr) const {
  sockaddr_storage sa;
  socklen_t len;
  if (!udp_sockaddr(addr, &sa, &len)) return {};
  return sockaddr_text(reinterpret_cast<const sockaddr*>(&sa));
}

std::string UdpEndpoint::address_host(const PeerAddress& addr) const {
  sockaddr_storage sa;
  socklen_t len;
  if (!udp_sockaddr(addr, &sa, &len)) return {};
  int port;
  return sockaddr_host(reinterpret_cast<const sockaddr*>(&sa), &port);
}

std::string UdpEndpoint::peer_text() const {
  return address_text(peer_addr_);
}

std::string UdpEndpoint::peer_host() const {
  return address_host(peer_addr_);
}

Status UdpEndpoint::set_peer(const PeerAddress& peer) {
  sockaddr_storage sa;
  socklen_t len;
  if (!udp_sockaddr(peer, &sa, &len) || sa.ss_family != family_) {
    OR_WARN("UDP endpoint: peer address (kind %d, %d bytes) is not a UDP address of this family",
            peer.kind, peer.len);
    return Status(Errc::kInternal);
  }
  // connect() makes the kernel fill in the destination and drop datagrams from anyone else.
  if (::connect(fd_, reinterpret_cast<const sockaddr*>(&sa), len) != 0) {
    const int err = errno;
    OR_WARN("UDP endpoint: connect to %s failed: %s",
            sockaddr_text(reinterpret_cast<const sockaddr*>(&sa)).c_str(), std::strerror(err));
    return Status(Errc::kSystem, err);
  }
  peer_ = sa;
  peer_addr_ = peer;
  has_peer_ = true;
  return Status::ok();
}

// Fills the message array from pkts[0, n), addressed to `dst` (nullptr: the connected peer).
// Returns the messages built; *built_pkts gets the datagrams they carry.
int UdpEndpoint::build_tx_batch(const sockaddr_storage* dst, socklen_t dst_len,
                                const TxPacket* pkts, int n, int* built_pkts) {
  Buffers& b = *buf_;
  int msgs = 0;
  int iovs = 0;
  int i = 0;
  while (i < n && msgs < kTxMsgs && iovs + 2 <= kTxIovecs) {
    const uint32_t seg = datagram_bytes(pkts[i]);
    int count = 1;
    if (gso_ && seg > 0 && seg <= max_datagram_) {
      const int room = std::min(kMaxGsoSegments, (kTxIovecs - iovs) / 2);
      uint32_t total = seg;
      while (i + count < n && count < room) {
        const uint32_t len = datagram_bytes(pkts[i + count]);
        if (len == 0 || len > seg || total + len > kMaxUdpPayloadBytes) break;
        total += len;
        ++count;
        if (len < seg) break;  // a shorter datagram can only end a GSO message
      }
    }
    mmsghdr& m = b.tx_msgs[msgs];
    m.msg_hdr.msg_name = const_cast<sockaddr_storage*>(dst);
    m.msg_hdr.msg_namelen = dst_len;
    m.msg_hdr.msg_iov = &b.tx_iov[iovs];
    m.msg_hdr.msg_iovlen = static_cast<size_t>(2 * count);
    for (int k = 0; k < count; ++k) {
      const TxPacket& p = pkts[i + k];
      b.tx_iov[iovs++] = iovec{const_cast<void*>(p.hdr), p.hdr_len};
      b.tx_iov[iovs++] = iovec{const_cast<void*>(p.payload), p.payload_len};
    }
    if (count > 1) {
      const uint16_t gso_size = static_cast<uint16_t>(seg);
      std::memcpy(CMSG_DATA(reinterpret_cast<cmsghdr*>(b.tx_ctrl[msgs])), &gso_size,
                  sizeof(gso_size));
      m.msg_hdr.msg_control = b.tx_ctrl[msgs];
      m.msg_hdr.msg_controllen = kTxCtrlBytes;
    } else {
      m.msg_hdr.msg_control = nullptr;
      m.msg_hdr.msg_controllen = 0;
    }
    b.tx_pkts[msgs] = count;
    ++msgs;
    i += count;
  }
  *built_pkts = i;
  return msgs;
}

// The socket's pending ICMP error, met by a send or a receive. It names no destination: on an
// unbound endpoint only take_unreachable says whose it was (and counts it in UdpCounters).
void UdpEndpoint::count_socket_unreachable() {
  if (!unbound_) ++udp_counters_.peer_unreachable;
  ++counters_.peer_unreachable;
  ++counters_.rx_errors;
}

int UdpEndpoint::tx_burst(const TxPacket* pkts, int n) {
  if (fatal_) return -fatal_;
  if (!has_peer_) return -EDESTADDRREQ;  // the caller's bug; not sticky
  return send_to(nullptr, 0, pkts, n);
}

int UdpEndpoint::tx_burst_to(const PeerAddress& to, const TxPacket* pkts, int n) {
  if (fatal_) return -fatal_;
  if (tx_to_len_ == 0 || !(to == tx_to_addr_)) {
    sockaddr_storage sa;
    socklen_t len;
    // The caller's bug, like tx_burst without a peer: not sticky.
    if (!udp_sockaddr(to, &sa, &len) || sa.ss_family != family_) return -EINVAL;
    tx_to_ = sa;
    tx_to_len_ = len;
    tx_to_addr_ = to;
  }
  return send_to(&tx_to_, tx_to_len_, pkts, n);
}

// tx_burst's loop, for the connected peer (dst == nullptr) or for `dst`.
int UdpEndpoint::send_to(const sockaddr_storage* dst, socklen_t dst_len, const TxPacket* pkts,
                         int n) {
  Buffers& b = *buf_;
  int taken = 0;
  int refused_in_row = 0;
  while (taken < n) {
    int built = 0;
    const int msgs = build_tx_batch(dst, dst_len, pkts + taken, n - taken, &built);
    const int r = sys_->sendmmsg(fd_, b.tx_msgs, static_cast<unsigned>(msgs), MSG_DONTWAIT);
    ++counters_.tx_syscalls;
    if (r > 0) {
      int sent = 0;
      for (int m = 0; m < r; ++m) {
        sent += b.tx_pkts[m];
        if (b.tx_pkts[m] > 1) ++udp_counters_.gso_sends;
      }
      taken += sent;
      counters_.tx_datagrams += static_cast<uint64_t>(sent);
      refused_in_row = 0;
      continue;
    }
    const int err = r == 0 ? EAGAIN : errno;
    if (err == EINTR) continue;
    if (is_would_block(err)) {
      ++counters_.tx_would_block;
      break;
    }
    if (is_unreachable(err)) {
      count_socket_unreachable();
      // A reported ICMP error is consumed by the report, so the retry normally goes out. A
      // second refusal of the same datagram is the route's own answer: drop it like the
      // network would.
      if (++refused_in_row >= 2) {
        ++taken;
        ++udp_counters_.unreachable_drops;
        refused_in_row = 0;
      }
      continue;
    }
    if ((err == EINVAL || err == EIO) && gso_ && b.tx_pkts[0] > 1) {
      // EINVAL: the kernel or route rejects the segment size; EIO: the device cannot checksum
      // for GSO. Either is permanent for this socket.
      OR_WARN("UDP endpoint %s: kernel refused a GSO send (%s); using plain sendmmsg from now on",
              sockaddr_text(reinterpret_cast<const sockaddr*>(&local_sa_)).c_str(),
              std::strerror(err));
      gso_ = false;
      udp_counters_.gso_fallbacks = 1;
      continue;
    }
    if (err == EMSGSIZE) {
      OR_WARN(
          "UDP endpoint %s: a %u-byte datagram does not fit the path to %s (EMSGSIZE; "
          "fragmentation is off). Lower OPTIREDUCE_MAX_DATAGRAM or raise the MTU.",
          sockaddr_text(reinterpret_cast<const sockaddr*>(&local_sa_)).c_str(),
          datagram_bytes(pkts[taken]),
          sockaddr_text(reinterpret_cast<const sockaddr*>(dst != nullptr ? dst : &peer_)).c_str());
    } else {
      OR_WARN("UDP endpoint %s: sendmmsg failed: %s",
              sockaddr_text(reinterpret_cast<const sockaddr*>(&local_sa_)).c_str(),
              std::strerror(err));
    }
    fatal_ = err;
    return -err;
  }
  return taken;
}

// Points slot i's receive three ways for guess `g`: the header into the slot, the payload into
// the guess, the rest into the slot where it would have gone. settle_guesses() undoes it.
void UdpEndpoint::aim_slot(int i, const RxGuesses::Guess& g, uint32_t split) {
  Buffers& b = *buf_;
  uint8_t* slot = b.slot(i);
  b.rx_iov[i][1] = iovec{g.dst, g.len};
  b.rx_iov[i][2] = iovec{slot + split + g.len, rx_slot_bytes_ - split - g.len};
  b.rx_iov[i][0].iov_len = split;
  b.rx_msgs[i].msg_hdr.msg_iovlen = 3;
  b.rx_guess[i] = -1;
  b.rx_dst[i] = g.dst;
  b.rx_dst_len[i] = g.len;
}

// Copies back what slot i's receive put into its guess, so that the slot holds the datagrams
// whole, and forgets the guess.
void UdpEndpoint::unguess_slot(int i) {
  Buffers& b = *buf_;
  std::memcpy(b.slot(i) + b.rx_split, b.rx_dst[i],
              std::min(b.rx_msgs[i].msg_len - b.rx_split, b.rx_dst_len[i]));
  b.rx_guess[i] = -1;
}

// After a guessed receive: keeps the guess of each slot whose first datagram may be the one
// guessed; a slot whose bytes landed where no RxPacket can describe (a coalesced receive whose
// segments are not header + guess long) is made whole at once.
void UdpEndpoint::settle_guesses(int received, int guessed, uint32_t split) {
  Buffers& b = *buf_;
  for (int i = 0; i < guessed; ++i) {
    msghdr& h = b.rx_msgs[i].msg_hdr;
    b.rx_iov[i][0].iov_len = rx_slot_bytes_;
    h.msg_iovlen = 1;
    if (i >= received) continue;
    const uint32_t len = b.rx_msgs[i].msg_len;
    if (len <= split || (h.msg_flags & MSG_TRUNC)) continue;  // nothing went to the guess
    const uint32_t seg = b.rx_seg[i];
    if (seg != 0 && seg < len && seg != split + b.rx_dst_len[i]) {
      unguess_slot(i);
      ++udp_counters_.rx_unguessed;
      continue;
    }
    b.rx_guess[i] = i;
  }
}

int UdpEndpoint::rx_burst_guessed(RxPacket* pkts, int max, const RxGuesses& g) {
  if (fatal_) return -fatal_;
  if (max <= 0) return 0;
  // Datagrams of an earlier receive first, never guessed; a fresh receive only when none is left.
  if (rx_next_ < rx_count_) return rx_burst(pkts, max);
  Buffers& b = *buf_;
  int n = std::min({max, kRxSlots, g.n});
  // Where the kernel coalesces datagrams (GRO), the first slot likely holds a run of them and
  // the second starts further on than its guess: guess the first slot alone. Datagrams of
  // which a slot holds only one (a peer on this host: 64 KiB ones) are never coalesced.
  const uint64_t guessed_datagram = uint64_t{g.split} + (g.n > 0 ? g.g[0].len : 0);
  if (gro_ && 2 * std::max<uint64_t>(max_datagram_, guessed_datagram) <= rx_slot_bytes_)
    n = std::min(n, 1);
  int guessed = 0;
  if (g.split != 0 && g.split <= rx_slot_bytes_) {
    while (guessed < n && g.g[guessed].dst != nullptr &&
           g.g[guessed].len <= rx_slot_bytes_ - g.split) {
      aim_slot(guessed, g.g[guessed], g.split);
      ++guessed;
    }
  }
  b.rx_split = g.split;
  const int r = recv_batch(max);
  settle_guesses(r > 0 ? r : 0, guessed, g.split);
  if (r <= 0) return r;
  const int got = drain_rx(pkts, max);
  // A slot the caller's array had no room for keeps no guess: the next call, perhaps another
  // caller's, could not know whose it was.
  for (int i = rx_next_; i < rx_count_; ++i) {
    if (b.rx_guess[i] >= 0 && !(i == rx_next_ && rx_offset_ != 0)) unguess_slot(i);
  }
  return got;
}

// One recvmmsg into the slots. Returns the messages received (0: none waiting) or -errno.
int UdpEndpoint::recv_batch(int max) {
  Buffers& b = *buf_;
  const int n = std::min(max, kRxSlots);
  for (int i = 0; i < n; ++i) {
    // The kernel overwrites these with what it used; restore the capacities.
    b.rx_msgs[i].msg_hdr.msg_namelen = sizeof(sockaddr_storage);
    b.rx_msgs[i].msg_hdr.msg_controllen = kRxCtrlBytes;
  }
  // A pending ICMP error is reported instead of data once; the second try gets the data.
  for (int attempt = 0; attempt < 2; ++attempt) {
    const int r = sys_->recvmmsg(fd_, b.rx_msgs, static_cast<unsigned>(n), MSG_DONTWAIT, nullptr);
    ++counters_.rx_syscalls;
    if (r >= 0) {
      rx_count_ = r;
      rx_next_ = 0;
      rx_offset_ = 0;
      read_control(r);
      return r;
    }
    const int err = errno;
    if (err == EAGAIN || err == EWOULDBLOCK) return 0;
    if (err == EINTR) continue;
    if (is_unreachable(err)) {
      count_socket_unreachable();
      continue;
    }
    OR_WARN("UDP endpoint %s: recvmmsg failed: %s",
            sockaddr_text(reinterpret_cast<const sockaddr*>(&local_sa_)).c_str(),
            std::strerror(err));
    fatal_ = err;
    return -err;
  }
  return 0;
}

int UdpEndpoint::take_unreachable(PeerAddress* out, int max) {
  // A connected socket queues nothing (no IP_RECVERR): spare the system call.
  if (!unbound_ || max <= 0) return 0;
  if (fatal_) return -fatal_;
  Buffers& b = *buf_;
  int got = 0;
  while (got < max) {
    sockaddr_storage dst{};
    iovec iov{b.err_data, sizeof(b.err_data)};
    msghdr h{};
    h.msg_name = &dst;
    h.msg_namelen = sizeof(dst);
    h.msg_iov = &iov;
    h.msg_iovlen = 1;
    h.msg_control = b.err_ctrl;
    h.msg_controllen = sizeof(b.err_ctrl);
    // MSG_TRUNC in msg_flags is expected: err_data holds only the datagram's start.
    if (::recvmsg(fd_, &h, MSG_ERRQUEUE | MSG_DONTWAIT) < 0) {
      const int err = errno;
      if (err == EAGAIN || err == EWOULDBLOCK) break;
      if (err == EINTR) continue;
      OR_WARN("UDP endpoint %s: reading the error queue failed: %s",
              sockaddr_text(reinterpret_cast<const sockaddr*>(&local_sa_)).c_str(),
              std::strerror(err));
      fatal_ = err;
      return -err;
    }
    bool reported = false;
    for (cmsghdr* c = CMSG_FIRSTHDR(&h); c != nullptr; c = CMSG_NXTHDR(&h, c)) {
      const bool recverr = (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_RECVERR) ||
                           (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_RECVERR);
      if (!recverr || c->cmsg_len < CMSG_LEN(sizeof(sock_extended_err))) continue;
      sock_extended_err ee;
      std::memcpy(&ee, CMSG_DATA(c), sizeof(ee));
      // Local errors (EMSGSIZE of our own oversize send) and other ICMP messages (fragmentation
      // needed) say nothing about whether the peer is there.
      const bool icmp = ee.ee_origin == SO_EE_ORIGIN_ICMP || ee.ee_origin == SO_EE_ORIGIN_ICMP6;
      if (icmp && is_unreachable(static_cast<int>(ee.ee_errno)) &&
          (dst.ss_family == AF_INET || dst.ss_family == AF_INET6)) {
        out[got++] = udp_peer_address(reinterpret_cast<const sockaddr*>(&dst));
        ++udp_counters_.peer_unreachable;
        reported = true;
      }
      break;
    }
    if (!reported) ++counters_.rx_errors;
  }
  return got;
}

bool UdpEndpoint::from_peer(const sockaddr_storage& src) const {
  if (src.ss_family != peer_.ss_family) return false;
  if (src.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&src);
    const auto* p = reinterpret_cast<const sockaddr_in*>(&peer_);
    return a->sin_port == p->sin_port && a->sin_addr.s_addr == p->sin_addr.s_addr;
  }
  const auto* a = reinterpret_cast<const sockaddr_in6*>(&src);
  const auto* p = reinterpret_cast<const sockaddr_in6*>(&peer_);
  return a->sin6_port == p->sin6_port &&
         std::memcmp(&a->sin6_addr, &p->sin6_addr, sizeof(in6_addr)) == 0;
}

// Reads each received message's control messages once, right after the receive:
//  - UDP_GRO: the segment size of a coalesced receive (rx_seg; 0: one datagram);
//  - SCM_TIMESTAMPNS: when it reached the socket, as an age (rx_age; wall clock, as the kernel
//    stamps it, one reading of which serves the whole batch; 0: unknown);
//  - SO_RXQ_OVFL: the socket's running drop count, which the kernel stamps at enqueue time and
//    only once the socket has dropped something.
void UdpEndpoint::read_control(int received) {
  Buffers& b = *buf_;
  timespec wall{};
  const bool have_now = clock_gettime(CLOCK_REALTIME, &wall) == 0;
  const int64_t now_ns = int64_t{wall.tv_sec} * 1'000'000'000 + wall.tv_nsec;
  for (int i = 0; i < received; ++i) {
    b.rx_seg[i] = 0;
    b.rx_age[i] = 0;
    msghdr& h = b.rx_msgs[i].msg_hdr;
    for (cmsghdr* c = CMSG_FIRSTHDR(&h); c != nullptr; c = CMSG_NXTHDR(&h, c)) {
      if (gro_ && c->cmsg_level == IPPROTO_UDP && c->cmsg_type == UDP_GRO) {
        int seg = 0;
        std::memcpy(&seg, CMSG_DATA(c), sizeof(seg));
        b.rx_seg[i] = seg > 0 ? static_cast<uint32_t>(seg) : 0;
      } else if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMPNS && have_now) {
        timespec ts;
        std::memcpy(&ts, CMSG_DATA(c), sizeof(ts));
        const int64_t age = now_ns - (int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec);
        if (age > 0) b.rx_age[i] = static_cast<uint64_t>(age);
      } else if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SO_RXQ_OVFL) {
        uint32_t total = 0;
        std::memcpy(&total, CMSG_DATA(c), sizeof(total));
        // The kernel's count is 32 bits wide and may wrap; the difference does not mind.
        udp_counters_.rx_kernel_drops += static_cast<uint32_t>(total - kernel_drops_seen_);
        kernel_drops_seen_ = total;
      }
    }
  }
}

// Hands out received datagrams not yet handed out, up to `max`.
int UdpEndpoint::drain_rx(RxPacket* pkts, int max) {
  Buffers& b = *buf_;
  int got = 0;
  while (got < max && rx_next_ < rx_count_) {
    mmsghdr& m = b.rx_msgs[rx_next_];
    const uint32_t len = m.msg_len;
    const uint8_t* data = b.slot(rx_next_);
    uint32_t seg = b.rx_seg[rx_next_];
    if (seg == 0 || seg > len) seg = len;
    bool drop = false;
    if (rx_offset_ == 0) {
      if (m.msg_hdr.msg_flags & MSG_TRUNC) {
        ++counters_.rx_truncated;
        drop = true;
      } else if (has_peer_ && !from_peer(b.rx_from[rx_next_])) {
        // Queued before connect() took effect: the kernel's filter did not see it.
        ++udp_counters_.rx_foreign;
        drop = true;
      } else if (seg < len) {
        ++udp_counters_.gro_receives;
      }
    }
    if (!drop) {
      const PeerAddress from =
          has_peer_ ? PeerAddress{}
                    : udp_peer_address(reinterpret_cast<sockaddr*>(&b.rx_from[rx_next_]));
      do {  // at least once, so that an empty datagram is delivered too
        const uint32_t chunk = std::min(seg, len - rx_offset_);
        if (chunk > rx_max_datagram_) {
          // GRO's slots hold more than one datagram may be: the size limit is ours to apply.
          ++counters_.rx_truncated;
          rx_offset_ += chunk;
          continue;
        }
        RxPacket& p = pkts[got];
        p.data = data + rx_offset_;
        p.len = chunk;
        p.from = from;
        p.age_ns = b.rx_age[rx_next_];
        p.rest = p.room = nullptr;
        p.placed = 0;
        p.guess = -1;
        if (rx_offset_ == 0 && b.rx_guess[rx_next_] >= 0) {
          p.room = const_cast<uint8_t*>(data) + b.rx_split;
          p.rest = b.rx_dst[rx_next_];
          p.placed = std::min(chunk - b.rx_split, b.rx_dst_len[rx_next_]);
          p.guess = b.rx_guess[rx_next_];
          b.rx_guess[rx_next_] = -1;  // handed out: its owner restores it if need be
        }
        ++got;
        rx_offset_ += chunk;
      } while (got < max && rx_offset_ < len);
      if (rx_offset_ < len) break;  // the caller's array is full; resume here next time
    }
    b.rx_guess[rx_next_] = -1;
    ++rx_next_;
    rx_offset_ = 0;
  }
  counters_.rx_datagrams += static_cast<uint64_t>(got);
  return got;
}

int UdpEndpoint::rx_burst(RxPacket* pkts, int max) {
  if (fatal_) return -fatal_;
  if (max <= 0) return 0;
  int got = drain_rx(pkts, max);
  for (int attempt = 0; got == 0 && attempt < kRxAttempts; ++attempt) {
    const int r = recv_batch(max);
    if (r <= 0) return r;
    got = drain_rx(pkts, max);
  }
  return got;
}

uint32_t UdpEndpoint::max_datagram_bytes_to(const PeerAddress& peer) const {
  // The route's MTU, as the kernel would apply it to a socket connected to the peer from this
  // endpoint's address: a peer on this host is reached through loopback (MTU 65536), whatever
  // the device's MTU. 1372-byte datagrams cost ranks on one host a packet's per-datagram work
  // (ours and the kernel's) every 1.3 KiB where TCP moves 64 KiB segments.
  if (fixed_datagram_ || rx_max_datagram_ <= max_datagram_) return max_datagram_;
  sockaddr_storage to;
  socklen_t to_len = 0;
  if (!udp_sockaddr(peer, &to, &to_len) || to.ss_family != family_) return max_datagram_;
  const int s = ::socket(family_, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) return max_datagram_;
  sockaddr_storage from;
  const socklen_t from_len = with_any_port(&local_sa_, family_, &from);
  int mtu = 0;
  socklen_t mtu_len = sizeof(mtu);
  const bool ok = ::bind(s, reinterpret_cast<const sockaddr*>(&from), from_len) == 0 &&
                  ::connect(s, reinterpret_cast<const sockaddr*>(&to), to_len) == 0 &&
                  ::getsockopt(s, family_ == AF_INET6 ? IPPROTO_IPV6 : IPPROTO_IP,
                               family_ == AF_INET6 ? IPV6_MTU : IP_MTU, &mtu, &mtu_len) == 0;
  ::close(s);
  const uint32_t hdr = ip_udp_header_bytes(family_);
  if (!ok || mtu <= 0 || uint32_t(mtu) <= hdr) return max_datagram_;
  // Never below the device's figure (receive_buffer_bytes counts in those), never above what a
  // receive slot holds.
  return std::clamp(uint32_t(mtu) - hdr, max_datagram_, rx_max_datagram_);
}

}  // namespace optireduce
