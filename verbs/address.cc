// PeerAddress encoding, GID choice and GRH parsing for UD verbs (see address.h).
#include "verbs/address.h"

#include <arpa/inet.h>

#include <cstdio>
#include <cstring>

namespace optireduce::verbs {
namespace {

void put_be32(uint8_t* p, uint32_t v) {
  p[0] = static_cast<uint8_t>(v >> 24);
  p[1] = static_cast<uint8_t>(v >> 16);
  p[2] = static_cast<uint8_t>(v >> 8);
  p[3] = static_cast<uint8_t>(v);
}
uint32_t get_be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

// Offsets inside the GRH area. IB/IPv6 GRH: version nibble in byte 0, source GID at 8..23.
// RoCE v2 over IPv4: the IPv4 header occupies the last 20 bytes; its version nibble is at 20
// and its source address at 20 + 12.
constexpr int kGrhSgidOffset = 8;
constexpr int kIpv4HeaderOffset = kGrhBytes - 20;
constexpr int kIpv4SourceOffset = kIpv4HeaderOffset + 12;

// Largest QPN: QPNs are 24-bit in every IB/RoCE header.
constexpr uint32_t kMaxQpn = (1u << 24) - 1;

int gid_rank(const GidEntry& e) {
  if (e.type != GidType::kRoceV2) return 0;
  if (gid_is_ipv4_mapped(e.gid)) return 3;
  return gid_is_link_local(e.gid) ? 1 : 2;
}

}  // namespace

PeerAddress encode_address(const UdAddress& a) {
  PeerAddress p;
  p.kind = kUdAddressKind;
  p.len = kUdAddressBytes;
  std::memcpy(p.data, a.gid, 16);
  put_be32(p.data + 16, a.qpn);
  put_be32(p.data + 20, a.qkey);
  p.data[24] = static_cast<uint8_t>(a.lid >> 8);
  p.data[25] = static_cast<uint8_t>(a.lid);
  return p;
}

bool decode_address(const PeerAddress& p, UdAddress* out) {
  if (p.kind != kUdAddressKind || p.len != kUdAddressBytes) return false;
  UdAddress a;
  std::memcpy(a.gid, p.data, 16);
  a.qpn = get_be32(p.data + 16);
  a.qkey = get_be32(p.data + 20);
  a.lid = static_cast<uint16_t>((p.data[24] << 8) | p.data[25]);
  if (a.qpn == 0 || a.qpn > kMaxQpn) return false;  // QP0 is the subnet manager's, never ours
  *out = a;
  return true;
}

std::string format_address(const UdAddress& a) {
  char ip[INET6_ADDRSTRLEN] = "?";
  inet_ntop(AF_INET6, a.gid, ip, sizeof(ip));
  char buf[128];
  std::snprintf(buf, sizeof(buf), "gid %s qpn %u qkey 0x%x lid %u", ip, a.qpn, a.qkey, a.lid);
  return buf;
}

std::string format_gid(const UdAddress& a) {
  char ip[INET6_ADDRSTRLEN] = "?";
  inet_ntop(AF_INET6, a.gid, ip, sizeof(ip));
  return ip;
}

std::string format_peer_address(const PeerAddress& p) {
  UdAddress a;
  return decode_address(p, &a) ? format_address(a) : std::string();
}

std::string format_peer_gid(const PeerAddress& p) {
  UdAddress a;
  return decode_address(p, &a) ? format_gid(a) : std::string();
}

bool gid_is_zero(const uint8_t gid[16]) {
  for (int i = 0; i < 16; i++)
    if (gid[i] != 0) return false;
  return true;
}

bool gid_is_ipv4_mapped(const uint8_t gid[16]) {
  for (int i = 0; i < 10; i++)
    if (gid[i] != 0) return false;
  return gid[10] == 0xff && gid[11] == 0xff;
}

bool gid_is_link_local(const uint8_t gid[16]) {
  return gid[0] == 0xfe && (gid[1] & 0xc0) == 0x80;
}

GidType parse_gid_type(std::string_view s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.remove_suffix(1);
  if (s == "RoCE v2") return GidType::kRoceV2;
  if (s == "IB/RoCE v1" || s == "RoCE v1") return GidType::kRoceV1;
  if (s == "IB") return GidType::kIb;
  return GidType::kUnknown;
}

int choose_gid_index(const GidEntry* entries, size_t n, bool ethernet, int64_t override_index) {
  if (override_index >= 0) {
    for (size_t i = 0; i < n; i++)
      if (entries[i].index == override_index && !gid_is_zero(entries[i].gid))
        return static_cast<int>(override_index);
    return -1;
  }
  int best = -1;
  int best_rank = -1;
  for (size_t i = 0; i < n; i++) {
    const GidEntry& e = entries[i];
    if (gid_is_zero(e.gid)) continue;
    const int rank = ethernet ? gid_rank(e) : 0;
    if (rank > best_rank || (rank == best_rank && static_cast<int>(e.index) < best)) {
      best = static_cast<int>(e.index);
      best_rank = rank;
    }
  }
  return best;
}

bool grh_source_gid(const uint8_t grh[kGrhBytes], uint8_t gid[16]) {
  if ((grh[0] >> 4) == 6) {
    std::memcpy(gid, grh + kGrhSgidOffset, 16);
    return true;
  }
  if ((grh[kIpv4HeaderOffset] >> 4) == 4) {
    std::memset(gid, 0, 10);
    gid[10] = gid[11] = 0xff;
    std::memcpy(gid + 12, grh + kIpv4SourceOffset, 4);
    return true;
  }
  return false;
}

}  // namespace optireduce::verbs
