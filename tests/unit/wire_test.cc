// Header codec: round trips, every rejection rule, and a randomized malformed-input sweep that
// must never crash nor accept a datagram whose fields disagree with its length.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "transport/wire.h"

namespace optireduce {
namespace {

std::vector<uint8_t> datagram(const PacketHeader& h, size_t payload) {
  std::vector<uint8_t> d(kHeaderBytes + payload, 0);
  PacketHeader hh = h;
  hh.payload_len = static_cast<uint32_t>(payload);
  encode(hh, d.data());
  return d;
}

PacketHeader data_header() {
  PacketHeader h;
  h.type = PacketType::kData;
  h.flags = kFlagTail | kFlagRetx;
  h.token = 0x0123456789ABCDEFull;
  h.msg_seq = 0xFEDCBA98u;
  h.msg_size = 1ull << 40;
  h.offset = (1ull << 40) - 100;
  h.msg_floor = 77;
  h.timeout_us = 123456;
  return h;
}

TEST(Encode, RoundTripsEveryField) {
  const PacketHeader h = data_header();
  auto d = datagram(h, 100);
  PacketHeader out;
  ASSERT_EQ(decode(d.data(), d.size(), &out), DecodeError::kNone);
  EXPECT_EQ(out.type, h.type);
  EXPECT_EQ(out.flags, h.flags);
  EXPECT_EQ(out.token, h.token);
  EXPECT_EQ(out.msg_seq, h.msg_seq);
  EXPECT_EQ(out.payload_len, 100u);
  EXPECT_EQ(out.msg_size, h.msg_size);
  EXPECT_EQ(out.offset, h.offset);
  EXPECT_EQ(out.msg_floor, h.msg_floor);
  EXPECT_EQ(out.timeout_us, h.timeout_us);
}

TEST(Encode, RoundTripsTheCreditOfCtsAndAck) {
  for (PacketType t : {PacketType::kCts, PacketType::kAck}) {
    PacketHeader h;
    h.type = t;
    h.credit = 0xBEEF;
    auto d = datagram(h, 0);
    EXPECT_EQ(d[6], 0xEF);  // little-endian, at byte 6
    EXPECT_EQ(d[7], 0xBE);
    PacketHeader out;
    ASSERT_EQ(decode(d.data(), d.size(), &out), DecodeError::kNone);
    EXPECT_EQ(out.credit, 0xBEEF);
  }
}

// The steer (a receive lane's QPN) rides in a CTS's offset field, which no other meaning of a
// CTS uses; any other type leaves it 0 whatever its offset, and a CTS whose offset has upper
// bits set is no CTS we sent.
TEST(Encode, ACtsCarriesItsSteerInTheOffsetField) {
  PacketHeader h;
  h.type = PacketType::kCts;
  h.steer = 0x00ABCDEF;
  auto d = datagram(h, 0);
  EXPECT_EQ(d[32], 0xEF);  // little-endian, at the offset's byte 32
  EXPECT_EQ(d[34], 0xAB);
  PacketHeader out;
  ASSERT_EQ(decode(d.data(), d.size(), &out), DecodeError::kNone);
  EXPECT_EQ(out.steer, 0x00ABCDEFu);
  EXPECT_EQ(out.offset, 0u);

  d[39] = 1;  // the upper half of the field
  EXPECT_EQ(decode(d.data(), d.size(), &out), DecodeError::kBadField);

  PacketHeader data;
  data.type = PacketType::kData;
  data.steer = 0x1234;  // not a field of DATA: never encoded
  data.msg_size = 1 << 20;
  data.offset = 4096;
  auto dd = datagram(data, 0);
  ASSERT_EQ(decode(dd.data(), dd.size(), &out), DecodeError::kNone);
  EXPECT_EQ(out.steer, 0u);
  EXPECT_EQ(out.offset, 4096u);
}

TEST(Encode, AnAckCarriesItsHoldWhereOthersCarryTheirTimeout) {
  PacketHeader h;
  h.type = PacketType::kAck;
  h.hold_ns = 0xCAFE1234u;
  h.timeout_us = 777;  // an ACK does not carry it: the field holds the hold
  auto d = datagram(h, 0);
  EXPECT_EQ(d[44], 0x34);  // little-endian, at byte 44
  EXPECT_EQ(d[47], 0xCA);
  PacketHeader out;
  ASSERT_EQ(decode(d.data(), d.size(), &out), DecodeError::kNone);
  EXPECT_EQ(out.hold_ns, 0xCAFE1234u);
  EXPECT_EQ(out.timeout_us, 0u);
  h = data_header();
  h.hold_ns = 5;  // nor does anything but an ACK carry a hold
  d = datagram(h, 100);
  ASSERT_EQ(decode(d.data(), d.size(), &out), DecodeError::kNone);
  EXPECT_EQ(out.timeout_us, 123456u);
  EXPECT_EQ(out.hold_ns, 0u);
}

TEST(Encode, IsLittleEndianOnTheWire) {
  PacketHeader h;
  h.type = PacketType::kCts;
  h.token = 0x0807060504030201ull;
  auto d = datagram(h, 0);
  EXPECT_EQ(d[0], 0x52);  // magic 0x4F52, low byte first
  EXPECT_EQ(d[1], 0x4F);
  EXPECT_EQ(d[2], kWireVersion);
  EXPECT_EQ(d[3], 4);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(d[8 + i], i + 1);
}

TEST(Decode, RejectsEachBrokenRule) {
  PacketHeader out;
  auto d = datagram(data_header(), 100);
  EXPECT_EQ(decode(d.data(), kHeaderBytes - 1, &out), DecodeError::kTruncated);
  auto bad = d;
  bad[0] ^= 1;
  EXPECT_EQ(decode(bad.data(), bad.size(), &out), DecodeError::kBadMagic);
  bad = d;
  bad[2] = 99;
  EXPECT_EQ(decode(bad.data(), bad.size(), &out), DecodeError::kBadVersion);
  bad = d;
  bad[3] = 0;
  EXPECT_EQ(decode(bad.data(), bad.size(), &out), DecodeError::kBadType);
  bad[3] = kMaxPacketType + 1;
  EXPECT_EQ(decode(bad.data(), bad.size(), &out), DecodeError::kBadType);
  bad = d;
  bad[5] = 0x80;  // unknown flag
  EXPECT_EQ(decode(bad.data(), bad.size(), &out), DecodeError::kBadFlags);
  bad = d;
  bad[6] = 1;  // credit on DATA: only CTS and ACK carry it
  EXPECT_EQ(decode(bad.data(), bad.size(), &out), DecodeError::kBadField);
  EXPECT_EQ(decode(d.data(), d.size() - 1, &out), DecodeError::kBadLength);
  // DATA past the end of its message.
  PacketHeader h = data_header();
  h.offset = h.msg_size - 50;
  bad = datagram(h, 100);
  EXPECT_EQ(decode(bad.data(), bad.size(), &out), DecodeError::kBadField);
  h.offset = h.msg_size + 1;
  bad = datagram(h, 0);
  EXPECT_EQ(decode(bad.data(), bad.size(), &out), DecodeError::kBadField);
  // An offset near 2^64 must not wrap the check.
  h.msg_size = ~0ull;
  h.offset = ~0ull - 10;
  bad = datagram(h, 100);
  EXPECT_EQ(decode(bad.data(), bad.size(), &out), DecodeError::kBadField);
  // CTS carries no payload; ACK at most one SACK bitmap; HELLO exactly its body.
  PacketHeader c;
  c.type = PacketType::kCts;
  bad = datagram(c, 8);
  EXPECT_EQ(decode(bad.data(), bad.size(), &out), DecodeError::kBadLength);
  c.type = PacketType::kAck;
  bad = datagram(c, kSackBytes + 1);
  EXPECT_EQ(decode(bad.data(), bad.size(), &out), DecodeError::kBadLength);
  c.type = PacketType::kHello;
  bad = datagram(c, kHelloBodyBytes - 1);
  EXPECT_EQ(decode(bad.data(), bad.size(), &out), DecodeError::kBadLength);
}

TEST(Decode, RandomizedMalformedInputNeverAcceptsInconsistentFields) {
  std::mt19937_64 rng(12345);
  PacketHeader out;
  int accepted = 0;
  for (int iter = 0; iter < 200000; ++iter) {
    // Start from a valid datagram and corrupt a few random bytes, or use pure noise.
    std::vector<uint8_t> d;
    if (iter % 4 == 0) {
      d.resize(rng() % 200);
      for (auto& b : d) b = static_cast<uint8_t>(rng());
    } else {
      PacketHeader h = data_header();
      h.type = static_cast<PacketType>(1 + rng() % kMaxPacketType);
      h.msg_size = rng() % 5000;
      h.offset = rng() % 5000;
      d = datagram(h, rng() % 64);
      for (int k = 0, n = 1 + static_cast<int>(rng() % 3); k < n; ++k)
        d[rng() % d.size()] ^= static_cast<uint8_t>(1 + rng() % 255);
      if (rng() % 8 == 0) d.resize(rng() % d.size());
    }
    if (decode(d.data(), d.size(), &out) != DecodeError::kNone) continue;
    ++accepted;
    ASSERT_EQ(out.payload_len, d.size() - kHeaderBytes);
    if (out.type == PacketType::kData) {
      ASSERT_LE(out.offset, out.msg_size);
      ASSERT_LE(out.payload_len, out.msg_size - out.offset);
    }
  }
  EXPECT_GT(accepted, 0);  // the sweep really exercised the accepting paths
}

TEST(Hello, RoundTripAndLimits) {
  HelloBody b{9000, 1 << 20, kFeatureBounded | kFeatureMarkerFill, 0};
  uint8_t buf[kHelloBodyBytes];
  encode_hello(b, buf);
  HelloBody out;
  ASSERT_TRUE(decode_hello(buf, sizeof(buf), &out));
  EXPECT_EQ(out.max_datagram_bytes, 9000u);
  EXPECT_EQ(out.window_bytes, 1u << 20);
  EXPECT_EQ(out.features, kFeatureBounded | kFeatureMarkerFill);
  b.max_datagram_bytes = 100;  // too small to carry a header and useful payload
  encode_hello(b, buf);
  EXPECT_FALSE(decode_hello(buf, sizeof(buf), &out));
  b.max_datagram_bytes = 70000;  // larger than any UDP datagram
  encode_hello(b, buf);
  EXPECT_FALSE(decode_hello(buf, sizeof(buf), &out));
}

}  // namespace
}  // namespace optireduce
