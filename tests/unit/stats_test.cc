// Tests of the connection counters' one list (transport/stats.h) and what the plugin generates
// from it (plugin/stats.h, header-only): every listed field is summed or kept as the largest,
// and lands in its own member of the public C struct, in the list's order. Each field gets a
// value no other field has, so a field left out, or two fields crossed, shows as a wrong value.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>

#include "plugin/optireduce_net.h"
#include "plugin/stats.h"
#include "transport/stats.h"

namespace optireduce {
namespace {

// Field i of the list (from 1) holds scale * i.
ConnStats distinct(uint64_t scale) {
  ConnStats s;
  uint64_t i = 0;
#define OPTIREDUCE_SET_(name, c_name) s.name = static_cast<decltype(s.name)>(scale * ++i);
  OPTIREDUCE_CONN_STATS(OPTIREDUCE_SET_, OPTIREDUCE_SET_)
#undef OPTIREDUCE_SET_
  return s;
}

TEST(ConnStatsList, SumAddsEveryCounterAndKeepsTheLargestLiveGauge) {
  ConnStats sum = distinct(1);
  plugin::add_stats(&sum, distinct(1000), /*live=*/true);
  uint64_t i = 0;
#define OPTIREDUCE_COUNTER_(name, c_name) \
  ++i;                                    \
  EXPECT_EQ(sum.name, 1001 * i) << #name;
#define OPTIREDUCE_GAUGE_(name, c_name) \
  ++i;                                  \
  EXPECT_EQ(sum.name, 1000 * i) << #name;
  OPTIREDUCE_CONN_STATS(OPTIREDUCE_COUNTER_, OPTIREDUCE_GAUGE_)
#undef OPTIREDUCE_COUNTER_
#undef OPTIREDUCE_GAUGE_
  EXPECT_EQ(i, plugin::detail::kCounterCount);
}

TEST(ConnStatsList, ClosedConnectionsLeaveTheGaugesAlone) {
  ConnStats sum = distinct(1);
  plugin::add_stats(&sum, distinct(1000), /*live=*/false);
  uint64_t i = 0;
#define OPTIREDUCE_COUNTER_(name, c_name) \
  ++i;                                    \
  EXPECT_EQ(sum.name, 1001 * i) << #name;
#define OPTIREDUCE_GAUGE_(name, c_name) \
  ++i;                                  \
  EXPECT_EQ(sum.name, i) << #name;
  OPTIREDUCE_CONN_STATS(OPTIREDUCE_COUNTER_, OPTIREDUCE_GAUGE_)
#undef OPTIREDUCE_COUNTER_
#undef OPTIREDUCE_GAUGE_
}

// Read as C callers read it: the struct as consecutive uint64_t slots, none left over.
TEST(ConnStatsList, CStructGetsEveryFieldInListOrder) {
  const optireduceNetCounters c = plugin::to_c_counters(distinct(7));
  constexpr size_t kSlots = sizeof(c) / sizeof(uint64_t);
  ASSERT_EQ(kSlots, plugin::detail::kCounterCount);
  uint64_t slots[kSlots];
  std::memcpy(slots, &c, sizeof(c));
  for (size_t k = 0; k < kSlots; ++k) EXPECT_EQ(slots[k], 7 * (k + 1)) << "slot " << k;
  // By name, as the public header spells them; their slots are ABI and never move.
  EXPECT_EQ(c.msgs, 7u);
  EXPECT_EQ(c.tbUs, 7u * 20);
  EXPECT_EQ(c.repairedPkts, 7u * 24);
  EXPECT_EQ(c.spuriousRtos, 7u * 25);
  EXPECT_EQ(c.placedPkts, 7u * 27);
  EXPECT_EQ(c.budgetUs, 7u * 31);
  EXPECT_EQ(c.allowanceUs, 7u * 32);
}

// A gauge is 32 bits in ConnStats and 64 in the C struct: the widening keeps the whole value.
TEST(ConnStatsList, GaugesWidenIntoTheCStruct) {
  ConnStats s;
  s.tb_us = UINT32_MAX;
  s.tc_us = UINT32_MAX - 1;
  const optireduceNetCounters c = plugin::to_c_counters(s);
  EXPECT_EQ(c.tbUs, uint64_t{UINT32_MAX});
  EXPECT_EQ(c.tcUs, uint64_t{UINT32_MAX} - 1);
}

}  // namespace
}  // namespace optireduce
