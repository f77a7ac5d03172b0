// Pacer: the token bucket that spreads a path's window over its round trip.
#include <gtest/gtest.h>

#include "transport/pacer.h"

namespace optireduce {
namespace {

TEST(Pacer, UnlimitedByDefault) {
  Pacer p;
  EXPECT_TRUE(p.unlimited());
  EXPECT_EQ(p.available(123), UINT64_MAX);
}

TEST(Pacer, RefillsAtRateUpToBurst) {
  Pacer p;
  p.set_rate(1.0, 10'000);  // 1 byte per ns = 8 Gbit/s
  EXPECT_EQ(p.available(1'000), 10'000u);
  p.consume(10'000);
  EXPECT_EQ(p.available(1'000), 0u);
  EXPECT_EQ(p.next_time_ns(1'000, 500), 1'501u);
  EXPECT_EQ(p.available(1'500), 500u);
  EXPECT_EQ(p.available(1'000'000), 10'000u);
}

}  // namespace
}  // namespace optireduce
