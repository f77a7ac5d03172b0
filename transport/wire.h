// The on-wire format, and nothing else. Every datagram starts with one fixed 48-byte header,
// little-endian, encoded and decoded field by field (no struct is ever cast onto the wire).
// Payload therefore starts 8-byte aligned relative to the datagram.
//
// Adding a packet type: (1) a value in PacketType below, (2) its rule in decode() (wire.cc),
// (3) its handler in the connection's dispatch (conn.cc), (4) docs/architecture.md's table.
#pragma once

#include <cstddef>
#include <cstdint>

namespace optireduce {

inline constexpr uint16_t kWireMagic = 0x4F52;  // "OR"
// 2: credit (was reserved, zero); 3: reply tokens; 4: hold_ns in ACKs; 5: the WHOLE flag;
// 6: steer in CTS; 7: the DUP flag in ACKs
inline constexpr uint8_t kWireVersion = 7;
inline constexpr uint32_t kHeaderBytes = 48;

enum class PacketType : uint8_t {
  kHello = 1,     // sender -> listener: open a connection; payload = HelloBody
  kHelloAck = 2,  // listener -> sender: connection accepted; payload = HelloBody
  kData = 3,      // sender -> receiver: bytes [offset, offset+payload_len) of message msg_seq
  kCts = 4,       // receiver -> sender: clear to send msg_seq into a buffer of msg_size bytes
  kAck = 5,       // receiver -> sender: packets of msg_seq received; payload = SACK bitmap
  kClose = 6,     // either side: the connection is going away. Pending requests end (what the
                  // receiver's msg_floor says it completed as done, other bounded ones as
                  // expired, exact ones with an error); sent twice, and repeated by a shared
                  // endpoint to a peer heard again on the closed token (endpoint_mux.h)
  kPing = 7,      // either side: are you there? Sent only while a request waits on a silent peer
  kPong = 8,      // the answer to PING, from the peer's transport whatever its application does
};
inline constexpr uint8_t kMaxPacketType = 8;

// A connection's two directions carry two tokens: packets towards its receiver (HELLO, DATA,
// the sender's CLOSE/PING/PONG) the token of the listen handle, packets towards its sender
// (HELLO_ACK, CTS, ACK, the receiver's CLOSE/PING/PONG) that token with this bit flipped. Both
// ends of a connection inside one process share one endpoint (endpoint_mux.h), which tells
// their datagrams apart by token alone.
inline constexpr uint64_t kReplyTokenBit = 1ull << 63;
inline constexpr uint64_t reply_token(uint64_t token) {
  return token ^ kReplyTokenBit;
}

// Flag bits.
enum : uint16_t {
  kFlagTail = 1u << 0,     // DATA: part of the last ~1% of the message (early-timeout hint)
  kFlagBounded = 1u << 1,  // CTS/DATA: the message is delivered under a deadline
  kFlagExpired = 1u << 2,  // DATA (0 bytes): the sender gave up on this message (bounded),
                           // or found that the receiver's deadline had ended it (the
                           // receiver learns when the sender came: on_late_sender)
  kFlagRetx = 1u << 3,     // DATA: a retransmission (for RTT sampling: Karn's rule)
  kFlagFinal = 1u << 4,    // ACK: the message is complete at the receiver
  kFlagExact = 1u << 5,    // CTS on a bounded connection: this message is pinned exact (NCCL's
                           // LL/LL128 transfer): the receiver never completes it without all
                           // its data, so the sender must neither expire nor cut it
  kFlagWhole = 1u << 6,    // CTS of a bounded message: cut by its deadline only while its
                           // sender has not started it; from its first DATA on, the receiver
                           // waits for every byte, so a started send is never cut at its budget
                           // (MsgDelivery::kUntilStarted)
  kFlagDup = 1u << 7,      // ACK: a retransmitted packet of this message arrived whose
                           // original was here already (since the last ACK, or, on a FINAL,
                           // after the message was complete): a retransmission that was not
                           // needed, which tells the sender its loss probe fires too early for
                           // this receiver, or the network reorders (on_dup_report_locked)
};
inline constexpr uint16_t kKnownFlags = 0xFF;

// The decoded header. Field meanings per type:
//   token       random 64-bit connection identifier from the listen handle, with kReplyTokenBit
//               flipped on packets towards the sender; every packet of the connection carries
//               it, a mismatch is dropped as spoofed.
//   msg_seq     index of the message on this connection, from 0, the k-th isend/irecv.
//               HELLO/HELLO_ACK/CLOSE/PING/PONG: 0.
//   payload_len bytes after the header; must equal datagram length - kHeaderBytes.
//   msg_size    DATA: total bytes of the message. CTS: capacity of the posted buffer.
//               ACK: number of packets of the message (0 if unknown). Others: 0.
//   offset      DATA: byte offset of the payload in the message, a multiple of the
//               connection's packet payload size. ACK: index of the first packet the SACK
//               bitmap describes; every packet below it has arrived. CTS: `steer` (below),
//               the upper 32 bits zero. Others: 0.
//   steer       CTS only, in offset's place: where the message's DATA go at the receiver,
//               opaque to the protocol (verbs: the QPN of a receive lane whose work requests
//               point into the posted buffer; datapath.h, Endpoint::aim_open). 0: the
//               connection's own address, as every other packet.
//   msg_floor   CTS/ACK, and a receiver's CLOSE: every message below this sequence is complete
//               at the receiver (repairs lost final ACKs, also when the receiver closes before
//               the repair). DATA: the sender's oldest unfinished message. A sender's CLOSE: 0.
//   timeout_us  the sender's current step-time estimate tC in microseconds (bounded mode;
//               0 = none). Piggybacked so receivers can agree on a median. Not in ACKs.
//   hold_ns     ACK only, in timeout_us's place: nanoseconds from the arrival of the newest
//               DATA at the receiver's host to this ACK (capped): the time the receiver's
//               process took to get to it, which the sender subtracts from its RTT sample
//               before its congestion controller sees it (a busy host is not a full queue).
//   credit      CTS/ACK of a bounded message: packets the sender may have sent of it beyond
//               `offset` (the ACK's cumulative point; 0 for a CTS), the receiver's share of its
//               downlink (credit.h); 0 = no limit. Other types: 0.
struct PacketHeader {
  PacketType type = PacketType::kData;
  uint16_t flags = 0;
  uint64_t token = 0;
  uint32_t msg_seq = 0;
  uint32_t payload_len = 0;
  uint64_t msg_size = 0;
  uint64_t offset = 0;
  uint32_t msg_floor = 0;
  uint32_t timeout_us = 0;
  uint32_t hold_ns = 0;
  uint16_t credit = 0;
  uint32_t steer = 0;
};

// Why a datagram was rejected by decode().
enum class DecodeError : uint8_t {
  kNone = 0,
  kTruncated,    // shorter than the header
  kBadMagic,     // not ours
  kBadVersion,   // ours, but a version we do not speak
  kBadType,      // unknown type
  kBadFlags,     // unknown flag bits
  kBadLength,    // payload_len disagrees with the datagram length, or a type's own limits
  kBadField,     // a field outside its type's range (e.g. offset + len beyond msg_size)
};
const char* decode_error_name(DecodeError e);

// Writes the header into buf[0, kHeaderBytes).
void encode(const PacketHeader& h, uint8_t* buf);

// Checks everything that can be checked without connection state: length, magic, version,
// type, flags, reserved bytes, payload length, per-type field limits. Connection state
// (token, sequence window, buffer bounds) is checked by the receiver.
DecodeError decode(const uint8_t* buf, size_t len, PacketHeader* out);

// The token of a datagram, read without decoding the rest, for a shared endpoint to find the
// datagram's connection (which then checks everything). False when it is shorter than a header.
bool peek_token(const uint8_t* buf, size_t len, uint64_t* token);

// HELLO/HELLO_ACK payload: what each side proposes; the connection uses the minimum.
struct HelloBody {
  uint32_t max_datagram_bytes = 0;  // largest datagram this side can receive
  uint32_t window_bytes = 0;        // receive buffering this side offers
  uint32_t features = 0;            // kFeature* bits
  uint32_t reserved = 0;
};
inline constexpr uint32_t kHelloBodyBytes = 16;
inline constexpr uint32_t kFeatureBounded = 1u << 0;     // the sender asks for bounded delivery
inline constexpr uint32_t kFeatureMarkerFill = 1u << 1;  // bounded holes get the erasure marker
// The receiver posts its receives bounded until their sender starts (ConnOptions::until_started).
inline constexpr uint32_t kFeatureUntilStarted = 1u << 2;
void encode_hello(const HelloBody& b, uint8_t* buf);
bool decode_hello(const uint8_t* buf, size_t len, HelloBody* out);

// ACK payload: a bitmap of up to kSackBits packets starting at header.offset, bit i of byte
// i/8 (LSB first) = packet offset+i arrived.
inline constexpr uint32_t kSackBits = 1024;
inline constexpr uint32_t kSackBytes = kSackBits / 8;

}  // namespace optireduce
