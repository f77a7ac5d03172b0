// Addressing for UD verbs, as pure functions testable without a device: the PeerAddress
// encoding of (GID, QPN, Q_Key, LID), the choice of a port's GID, and the sender's GID as
// recovered from the 40-byte GRH area in front of every received datagram.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "transport/datapath.h"

namespace optireduce::verbs {

// PeerAddress::kind of a UD verbs address (1 is UDP's; 0 means empty).
inline constexpr uint8_t kUdAddressKind = 2;

// The bytes in front of every UD receive buffer where the device writes the global route
// header: a 40-byte IB/IPv6 GRH, or for RoCE v2 over IPv4 20 unspecified bytes followed by the
// IPv4 header.
inline constexpr uint32_t kGrhBytes = 40;

// Every optireduce endpoint uses this Q_Key. A received datagram does not reveal its sender's
// Q_Key, so the listen side of a handshake could not answer a peer whose Q_Key were private. A
// sender using any other Q_Key (another application's UD traffic) is dropped by the device. The
// most significant bit is clear: Q_Keys with it set are "controlled" and an unprivileged sender
// cannot use them. The value spells "ORUD".
inline constexpr uint32_t kDefaultQKey = 0x4F525544;

struct UdAddress {
  uint8_t gid[16] = {};  // network byte order, as in ibv_gid::raw
  uint32_t qpn = 0;      // 24-bit queue pair number
  uint32_t qkey = 0;
  uint16_t lid = 0;  // InfiniBand link layer only (0 on RoCE)

  bool operator==(const UdAddress&) const = default;
};

// Wire layout inside PeerAddress::data, big-endian: gid[16] qpn[4] qkey[4] lid[2].
inline constexpr uint8_t kUdAddressBytes = 26;
static_assert(kUdAddressBytes <= PeerAddress::kMaxBytes, "a UD address must fit a PeerAddress");

PeerAddress encode_address(const UdAddress& a);
// False (and *out untouched) when `p` is not a well-formed UD address.
bool decode_address(const PeerAddress& p, UdAddress* out);
// "gid ::ffff:10.77.0.1 qpn 17 qkey 0x4f525544", for logs.
std::string format_address(const UdAddress& a);
// The GID alone (the host part of an address: congestion state is shared per host).
std::string format_gid(const UdAddress& a);
// The same for a PeerAddress, as Endpoint::address_text/address_host want them: empty when `p`
// is not a UD address (a shared endpoint may be asked about any address).
std::string format_peer_address(const PeerAddress& p);
std::string format_peer_gid(const PeerAddress& p);

bool gid_is_zero(const uint8_t gid[16]);
bool gid_is_ipv4_mapped(const uint8_t gid[16]);  // ::ffff:a.b.c.d
bool gid_is_link_local(const uint8_t gid[16]);   // fe80::/10

enum class GidType : uint8_t { kUnknown, kIb, kRoceV1, kRoceV2 };
// Parses the text of sysfs gid_attrs/types/<i>: "RoCE v2" or "IB/RoCE v1".
GidType parse_gid_type(std::string_view sysfs_text);

struct GidEntry {
  uint32_t index = 0;
  uint8_t gid[16] = {};
  GidType type = GidType::kUnknown;
};

// The GID index to use on a port, or -1 when none fits. `override_index` >= 0 (from
// OPTIREDUCE_GID_INDEX) must name a non-zero entry. Otherwise on Ethernet (RoCE) the best
// entry by (RoCE v2 with an IPv4-mapped address) > (RoCE v2, global IPv6) > (RoCE v2,
// link-local) > RoCE v1 or unknown type, lowest index first among equals: v2 is routable
// and IPv4 is what rxe and most RoCE fabrics configure. On InfiniBand the first non-zero entry
// (the port GID at index 0).
int choose_gid_index(const GidEntry* entries, size_t n, bool ethernet, int64_t override_index);

// The sender's GID from a received GRH area; false when the area holds neither a GRH nor an
// IPv4 header. An IPv4 source is returned as the IPv4-mapped GID the sender addresses with.
bool grh_source_gid(const uint8_t grh[kGrhBytes], uint8_t gid[16]);

}  // namespace optireduce::verbs
