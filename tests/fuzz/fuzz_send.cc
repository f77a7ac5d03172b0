// libFuzzer target: arbitrary bytes, cut into datagrams, go into a send connection with three
// sends in flight, in both delivery modes. A sender reads what its receiver says (CTS: posted
// capacity, credit, steer; ACK: cumulative point, SACK bitmap, packet count, hold time; CLOSE,
// PING, PONG) and acts on it: it retransmits, releases, expires and completes from those
// fields, so a spoofed or malformed one must be dropped and counted, never indexed with.
// fuzz_receive.cc covers the other side. Built with ASan+UBSan: a read outside the posted
// buffers or the SACK bitmap, or undefined behaviour, is a crash; a send reported done with
// more bytes than were posted, or a DATA packet whose bytes are not its message's at its
// offset, traps.
#include <cstdint>
#include <cstring>
#include <vector>

#include "tests/fuzz/input.h"
#include "tests/unit/mem_link.h"
#include "transport/log.h"
#include "transport/send.h"
#include "transport/wire.h"

namespace {

using optireduce::Config;
using optireduce::ConnParams;
using optireduce::Delivery;
using optireduce::FakeClock;
using optireduce::MsgDelivery;
using optireduce::PacketHeader;
using optireduce::PacketType;
using optireduce::Request;
using optireduce::SendConn;

// Small datagrams, so that a send longer than one SACK bitmap is still small (fast runs).
constexpr uint32_t kDgram = 128;

void run(const uint8_t* data, size_t size, Delivery delivery) {
  FakeClock clock;
  Config cfg;
  cfg.timeout_ms = 1;
  auto pair = optireduce::testing::make_mem_pair(kDgram);
  auto to_tx = pair.ba;  // what the receiver says
  auto from_tx = pair.ab;
  ConnParams p;
  // The first input byte chooses the token (its low 7 bits), so that matching and spoofed
  // tokens are reachable.
  p.token = size >= 1 ? data[0] & 0x7F : 0;
  p.pkt_payload = optireduce::payload_for_datagram(kDgram);
  p.peer_window = 1 << 20;
  p.delivery = delivery;
  SendConn s(cfg, clock, std::move(pair.a), p, nullptr);
  // Three sends: empty, a few packets, and more packets than one SACK bitmap covers.
  const size_t sizes[3] = {0, 5000, size_t{optireduce::kSackBits + 200} * p.pkt_payload};
  const MsgDelivery how[3] = {MsgDelivery::kAsConnection, MsgDelivery::kExact,
                              MsgDelivery::kAsConnection};
  // Each send's bytes tell their place (filled once: the sender only reads them).
  static const std::vector<std::vector<uint8_t>> src = [&sizes] {
    std::vector<std::vector<uint8_t>> v(3);
    for (size_t i = 0; i < 3; ++i) {
      v[i].resize(sizes[i]);
      for (size_t k = 0; k < sizes[i]; ++k) v[i][k] = uint8_t(k * 7 + k / 251 + i);
    }
    return v;
  }();
  Request* req[3] = {};
  for (int i = 0; i < 3; ++i) (void)s.isend(src[i].data(), sizes[i], how[i], nullptr, &req[i]);
  // Unless the first byte's top bit says otherwise, the receiver's CTS for each send comes
  // first, well formed, so that even short inputs reach what follows a CTS (transmission,
  // acknowledgement, retransmission, expiry) instead of spending their bytes on one.
  if (size >= 1 && (data[0] & 0x80) == 0) {
    for (uint32_t i = 0; i < 3; ++i) {
      PacketHeader h;
      h.type = PacketType::kCts;
      h.flags = delivery == Delivery::kBounded && i != 1 ? optireduce::kFlagBounded : 0;
      h.token = optireduce::reply_token(p.token);
      h.msg_seq = i;
      h.msg_size = sizes[i];
      h.timeout_us = 2000;
      std::vector<uint8_t> d(optireduce::kHeaderBytes);
      optireduce::encode(h, d.data());
      to_tx->q.push_back(std::move(d));
    }
  }
  // Input: records. Kind byte odd: a packet towards the sender built from the next bytes with a
  // real header (so that most reach the connection's own checks), its payload a SACK bitmap
  // from the input; even: raw bytes [len u16][bytes].
  optireduce::fuzz::Input in(data, size, 1);
  const auto take = [&in](size_t n) { return in.take(n); };
  while (in.more()) {
    std::vector<uint8_t> d;
    const uint32_t kind = take(1);
    if (kind & 1) {
      PacketHeader h;
      h.type = static_cast<PacketType>(1 + take(1) % optireduce::kMaxPacketType);
      h.flags = static_cast<uint16_t>(take(1) & optireduce::kKnownFlags);
      h.token = (kind & 2) ? p.token : optireduce::reply_token(p.token);
      h.msg_seq = take(1) % 5;
      const uint32_t what = take(1);
      if (h.type == PacketType::kCts) {
        h.msg_size = (what & 1) ? sizes[h.msg_seq % 3] : take(3);
        h.steer = (what & 2) ? take(2) : 0;
      } else if (h.type == PacketType::kAck) {
        // Mostly the message's real packet count (an ACK that names another is dropped at
        // once) and a first packet at most a little beyond the message's end.
        const uint64_t npkts = (sizes[h.msg_seq % 3] + p.pkt_payload - 1) / p.pkt_payload;
        h.msg_size = (what & 1) ? npkts : take(2);
        h.offset = (what & 2) ? take(2) % (npkts + 8) : take(4);
        h.hold_ns = take(4);
      } else {
        h.msg_size = take(2);
        h.offset = take(2);
      }
      h.credit = static_cast<uint16_t>((what & 4) ? take(2) : 0);
      h.msg_floor = (what & 8) ? take(1) % 6 : 0;
      if (h.type != PacketType::kAck) h.hold_ns = 0;
      if (h.type == PacketType::kData || h.type == PacketType::kCts) h.timeout_us = take(2);
      const uint32_t len =
          (h.type == PacketType::kAck) ? take(1) % (optireduce::kSackBytes + 9) : take(1) % 40;
      h.payload_len = len;
      d.assign(optireduce::kHeaderBytes + len, 0);
      optireduce::encode(h, d.data());
      for (uint32_t i = 0; i < len; ++i) d[optireduce::kHeaderBytes + i] = uint8_t(take(1));
    } else {
      d = in.raw();
    }
    to_tx->q.push_back(std::move(d));
    // Time between datagrams: up to 2.5 ms, or up to 127 ms (retransmission timeouts, expiry).
    const uint32_t gap = take(1);
    clock.advance_us((gap & 0x80) ? (gap & 0x7F) * 1000 : gap * 20);
    for (int i = 0; i < 3; ++i) {
      bool done = false;
      size_t got = 0;
      if (req[i] != nullptr && s.test(req[i], &done, &got).is_ok() && done) {
        if (got > sizes[i]) __builtin_trap();
        req[i] = nullptr;
      }
    }
    // Whatever the sender put on the wire must be a datagram it could have meant, and a DATA
    // packet must carry its message's own bytes at its offset (a retransmission of the wrong
    // packet, or of the right one from the wrong place, is caught here, not only reads outside
    // the buffer).
    while (!from_tx->q.empty()) {
      const std::vector<uint8_t>& out = from_tx->q.front();
      PacketHeader oh;
      if (optireduce::decode(out.data(), out.size(), &oh) != optireduce::DecodeError::kNone ||
          out.size() > kDgram) {
        __builtin_trap();
      }
      if (oh.type == PacketType::kData && oh.payload_len > 0) {
        if (oh.msg_seq >= 3 || oh.msg_size != sizes[oh.msg_seq] ||
            oh.offset + oh.payload_len > sizes[oh.msg_seq] ||
            std::memcmp(out.data() + optireduce::kHeaderBytes, src[oh.msg_seq].data() + oh.offset,
                        oh.payload_len) != 0) {
          __builtin_trap();
        }
      }
      from_tx->q.pop_front();
    }
  }
}

}  // namespace

// The connection's warnings are still formatted (that code runs too), but not printed: a peer
// that closed or a spoofed token is what most inputs are, and stderr would be most of the time.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  optireduce::log_set_sink([](optireduce::LogLevel, const char*, int, const char*) {});
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  run(data, size, Delivery::kExact);
  run(data, size, Delivery::kBounded);
  return 0;
}
