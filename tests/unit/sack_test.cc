// PacketBitmap: set/duplicate, first_clear across word boundaries, export for SACKs.
#include <gtest/gtest.h>

#include "transport/sack.h"

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

}  // namespace
}  // namespace optireduce
