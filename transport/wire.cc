// Header encoding and stateless validation.
#include "transport/wire.h"

#include <cstring>

namespace optireduce {
namespace {

inline void put16(uint8_t* p, uint16_t v) { p[0] = uint8_t(v); p[1] = uint8_t(v >> 8); }
inline void put32(uint8_t* p, uint32_t v) { put16(p, uint16_t(v)); put16(p + 2, uint16_t(v >> 16)); }
inline void put64(uint8_t* p, uint64_t v) { put32(p, uint32_t(v)); put32(p + 4, uint32_t(v >> 32)); }
inline uint16_t get16(const uint8_t* p) { return uint16_t(p[0] | (p[1] << 8)); }
inline uint32_t get32(const uint8_t* p) { return get16(p) | (uint32_t(get16(p + 2)) << 16); }
inline uint64_t get64(const uint8_t* p) { return get32(p) | (uint64_t(get32(p + 4)) << 32); }

// Byte offsets of each field in the 48-byte header.
enum : size_t {
  kOffMagic = 0,       // u16
  kOffVersion = 2,     // u8
  kOffType = 3,        // u8
  kOffFlags = 4,       // u16
  kOffCredit = 6,      // u16
  kOffToken = 8,       // u64
  kOffSeq = 16,        // u32
  kOffPayloadLen = 20, // u32
  kOffMsgSize = 24,    // u64
  kOffOffset = 32,     // u64
  kOffFloor = 40,      // u32
  kOffTimeout = 44,    // u32
};
static_assert(kOffTimeout + 4 == kHeaderBytes);
static_assert(kHeaderBytes % 8 == 0, "payload must start 8-byte aligned");

}  // namespace

void encode(const PacketHeader& h, uint8_t* b) {
  put16(b + kOffMagic, kWireMagic);
  b[kOffVersion] = kWireVersion;
  b[kOffType] = static_cast<uint8_t>(h.type);
  put16(b + kOffFlags, h.flags);
  put16(b + kOffCredit, h.credit);
  put64(b + kOffToken, h.token);
  put32(b + kOffSeq, h.msg_seq);
  put32(b + kOffPayloadLen, h.payload_len);
  put64(b + kOffMsgSize, h.msg_size);
  put64(b + kOffOffset, h.type == PacketType::kCts ? uint64_t{h.steer} : h.offset);
  put32(b + kOffFloor, h.msg_floor);
  put32(b + kOffTimeout, h.type == PacketType::kAck ? h.hold_ns : h.timeout_us);
}

bool peek_token(const uint8_t* b, size_t len, uint64_t* token) {
  if (len < kHeaderBytes) return false;
  *token = get64(b + kOffToken);
  return true;
}

DecodeError decode(const uint8_t* b, size_t len, PacketHeader* h) {
  if (len < kHeaderBytes) return DecodeError::kTruncated;
  if (get16(b + kOffMagic) != kWireMagic) return DecodeError::kBadMagic;
  if (b[kOffVersion] != kWireVersion) return DecodeError::kBadVersion;
  const uint8_t type = b[kOffType];
  if (type == 0 || type > kMaxPacketType) return DecodeError::kBadType;
  const uint16_t flags = get16(b + kOffFlags);
  if ((flags & ~kKnownFlags) != 0) return DecodeError::kBadFlags;
  h->type = static_cast<PacketType>(type);
  h->flags = flags;
  h->token = get64(b + kOffToken);
  h->msg_seq = get32(b + kOffSeq);
  h->payload_len = get32(b + kOffPayloadLen);
  h->msg_size = get64(b + kOffMsgSize);
  h->offset = get64(b + kOffOffset);
  h->steer = 0;
  if (h->type == PacketType::kCts) {
    if (h->offset >> 32 != 0) return DecodeError::kBadField;
    h->steer = static_cast<uint32_t>(h->offset);
    h->offset = 0;
  }
  h->msg_floor = get32(b + kOffFloor);
  h->timeout_us = h->type == PacketType::kAck ? 0 : get32(b + kOffTimeout);
  h->hold_ns = h->type == PacketType::kAck ? get32(b + kOffTimeout) : 0;
  h->credit = get16(b + kOffCredit);
  if (h->credit != 0 && h->type != PacketType::kCts && h->type != PacketType::kAck)
    return DecodeError::kBadField;
  if (h->payload_len != len - kHeaderBytes) return DecodeError::kBadLength;
  switch (h->type) {
    case PacketType::kHello:
    case PacketType::kHelloAck:
      if (h->payload_len != kHelloBodyBytes) return DecodeError::kBadLength;
      break;
    case PacketType::kData:
      // Checked in this order so that no sum can wrap: offset <= size, then len <= size-offset.
      if (h->offset > h->msg_size || h->payload_len > h->msg_size - h->offset)
        return DecodeError::kBadField;
      break;
    case PacketType::kCts:
    case PacketType::kClose:
    case PacketType::kPing:
    case PacketType::kPong:
      if (h->payload_len != 0) return DecodeError::kBadLength;
      break;
    case PacketType::kAck:
      if (h->payload_len > kSackBytes) return DecodeError::kBadLength;
      break;
  }
  return DecodeError::kNone;
}

const char* decode_error_name(DecodeError e) {
  switch (e) {
    case DecodeError::kNone: return "none";
    case DecodeError::kTruncated: return "truncated";
    case DecodeError::kBadMagic: return "bad magic";
    case DecodeError::kBadVersion: return "bad version";
    case DecodeError::kBadType: return "bad type";
    case DecodeError::kBadFlags: return "bad flags";
    case DecodeError::kBadLength: return "bad length";
    case DecodeError::kBadField: return "bad field";
  }
  return "unknown";
}

void encode_hello(const HelloBody& body, uint8_t* b) {
  put32(b, body.max_datagram_bytes);
  put32(b + 4, body.window_bytes);
  put32(b + 8, body.features);
  put32(b + 12, 0);
}

bool decode_hello(const uint8_t* b, size_t len, HelloBody* out) {
  if (len != kHelloBodyBytes || get32(b + 12) != 0) return false;
  out->max_datagram_bytes = get32(b);
  out->window_bytes = get32(b + 4);
  out->features = get32(b + 8);
  return out->max_datagram_bytes >= 256 && out->max_datagram_bytes <= 65507;
}

}  // namespace optireduce
