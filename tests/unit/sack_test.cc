// PacketBitmap: set/duplicate, first_clear across word boundaries, export for SACKs; the
// word-at-a-time SACK build (export_bits) and parse (for_each_set_bit) against bit-at-a-time
// references.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "transport/sack.h"
#include "transport/wire.h"

namespace optireduce {
namespace {

TEST(PacketBitmap, SetReportsDuplicatesAndCounts) {
  PacketBitmap b;
  b.reset(130);
  EXPECT_TRUE(b.set(0));
  EXPECT_FALSE(b.set(0));
  EXPECT_TRUE(b.set(129));
  EXPECT_EQ(b.count(), 2u);
  EXPECT_FALSE(b.full());
}

TEST(PacketBitmap, FirstClearSkipsFullWords) {
  PacketBitmap b;
  b.reset(200);
  for (uint32_t i = 0; i < 150; ++i) b.set(i);
  EXPECT_EQ(b.first_clear(0), 150u);
  EXPECT_EQ(b.first_clear(151), 151u);
  for (uint32_t i = 150; i < 200; ++i) b.set(i);
  EXPECT_EQ(b.first_clear(0), 200u);
  EXPECT_TRUE(b.full());
}

TEST(PacketBitmap, ResetClearsReusedStorage) {
  PacketBitmap b;
  b.reset(64);
  for (uint32_t i = 0; i < 64; ++i) b.set(i);
  b.reset(10);
  EXPECT_EQ(b.count(), 0u);
  EXPECT_EQ(b.first_clear(0), 0u);
  EXPECT_EQ(b.first_clear(5), 5u);
}

TEST(PacketBitmap, ExportBitsIsLsbFirstFromBase) {
  PacketBitmap b;
  b.reset(40);
  b.set(10);
  b.set(12);
  b.set(25);
  uint8_t out[4];
  EXPECT_EQ(b.export_bits(10, 32, out), 2u);  // last set bit (25) is in byte 1
  EXPECT_EQ(out[0], 0x05);
  EXPECT_EQ(out[1], 0x80);
  EXPECT_EQ(out[2], 0);
}

// The wire's SACK layout, one bit at a time: bit i of the bitmap is bit i % 8 of byte i / 8.
struct Reference {
  std::vector<bool> bits;  // which packets of the message are set

  // What export_bits must write, and return: the bytes up to the last set bit.
  uint32_t build(uint32_t base, uint32_t nbits, std::vector<uint8_t>* out) const {
    out->assign(nbits / 8, 0);
    uint32_t used = 0;
    for (uint32_t i = 0; i < nbits; ++i) {
      if (base + i < bits.size() && bits[base + i]) {
        (*out)[i / 8] |= static_cast<uint8_t>(1u << (i % 8));
        used = i / 8 + 1;
      }
    }
    return used;
  }
  static std::vector<uint32_t> parse(const std::vector<uint8_t>& sack) {
    std::vector<uint32_t> set;
    for (uint32_t byte = 0; byte < sack.size(); ++byte)
      for (uint32_t bit = 0; bit < 8; ++bit)
        if (sack[byte] >> bit & 1) set.push_back(byte * 8 + bit);
    return set;
  }
};

// Builds `bm` (reusing its storage, as a connection does) and the reference from one pattern.
void fill(PacketBitmap& bm, Reference& ref, uint32_t npkts, double density, std::mt19937& rng) {
  bm.reset(npkts);
  ref.bits.assign(npkts, false);
  std::bernoulli_distribution on(density);
  for (uint32_t i = 0; i < npkts; ++i) {
    if (on(rng)) {
      bm.set(i);
      ref.bits[i] = true;
    }
  }
}

void expect_same(const PacketBitmap& bm, const Reference& ref, uint32_t base, uint32_t nbits) {
  std::vector<uint8_t> want;
  const uint32_t want_used = ref.build(base, nbits, &want);
  std::vector<uint8_t> got(nbits / 8 + 8, 0xEE);  // guard bytes past nbits / 8
  EXPECT_EQ(bm.export_bits(base, nbits, got.data()), want_used);
  for (uint32_t i = 0; i < nbits / 8; ++i) ASSERT_EQ(got[i], want[i]) << "byte " << i;
  for (uint32_t i = nbits / 8; i < got.size(); ++i) ASSERT_EQ(got[i], 0xEE) << "wrote past";
  // Parsing what was built, word-wise, finds the reference's bits, in order.
  std::vector<uint32_t> parsed;
  for_each_set_bit(got.data(), want_used, [&](uint32_t i) {
    parsed.push_back(i);
    return true;
  });
  EXPECT_EQ(parsed, Reference::parse(want));
}

TEST(SackWords, BuildAndParseMatchTheBitwiseReferenceOnRandomPatterns) {
  std::mt19937 rng(16);
  PacketBitmap bm;
  Reference ref;
  for (int trial = 0; trial < 3000; ++trial) {
    const uint32_t npkts = 1 + rng() % 3000;
    const double density = std::vector<double>{0, 0.01, 0.2, 0.5, 0.9, 1}[rng() % 6];
    fill(bm, ref, npkts, density, rng);
    // Any base (word-aligned or not, at the end, past it), any whole-byte length.
    const uint32_t base = rng() % (npkts + 70);
    const uint32_t nbits = 8 * (1 + rng() % (kSackBytes + 3));
    SCOPED_TRACE(::testing::Message() << "npkts " << npkts << " base " << base << " nbits " << nbits
                                      << " density " << density);
    expect_same(bm, ref, base, nbits);
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(SackWords, Edges) {
  std::mt19937 rng(1);
  PacketBitmap bm;
  Reference ref;
  struct Case {
    uint32_t npkts;
    double density;
    uint32_t base, nbits;
  };
  const Case cases[] = {
      {1, 1, 0, kSackBits},        // one packet, set
      {1, 0, 0, kSackBits},        // empty
      {64, 1, 0, 64},              // one full word
      {1024, 1, 0, kSackBits},     // a full SACK
      {1030, 1, 3, kSackBits},     // full, unaligned: straddles every word
      {1030, 1, 1029, kSackBits},  // only the message's last bit
      {100, 1, 100, kSackBits},    // base at the end: nothing
      {70, 0.5, 64, 8},            // a partial last word, one byte out
      {2000, 0.3, 977, 72},        // a length that is not a whole word
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "npkts " << c.npkts << " base " << c.base);
    fill(bm, ref, c.npkts, c.density, rng);
    expect_same(bm, ref, c.base, c.nbits);
  }
  // First and last bit of a SACK alone.
  bm.reset(2048);
  ref.bits.assign(2048, false);
  for (uint32_t i : {100u, 100u + kSackBits - 1}) {
    bm.set(i);
    ref.bits[i] = true;
  }
  expect_same(bm, ref, 100, kSackBits);
  // Bits left in the storage by a longer message before never leak into a shorter one's SACK.
  fill(bm, ref, 3000, 1, rng);
  fill(bm, ref, 70, 0, rng);
  bm.set(69);
  ref.bits[69] = true;
  expect_same(bm, ref, 0, kSackBits);
  expect_same(bm, ref, 5, kSackBits);
}

TEST(SackWords, ParseStopsWhenTheVisitorSaysSo) {
  const uint8_t sack[10] = {0x01, 0, 0, 0, 0, 0, 0, 0x80, 0x03, 0};
  std::vector<uint32_t> seen;
  for_each_set_bit(sack, sizeof(sack), [&](uint32_t i) {
    seen.push_back(i);
    return i < 63;
  });
  EXPECT_EQ(seen, (std::vector<uint32_t>{0, 63}));
  seen.clear();
  for_each_set_bit(sack, sizeof(sack), [&](uint32_t i) {
    seen.push_back(i);
    return true;
  });
  EXPECT_EQ(seen, (std::vector<uint32_t>{0, 63, 64, 65}));
}

}  // namespace
}  // namespace optireduce
