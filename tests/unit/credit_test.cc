// Downlink (transport/credit.h): how a receiver's budget is measured and divided.
#include "transport/credit.h"

#include <gtest/gtest.h>

#include "transport/congestion.h"

namespace optireduce {
namespace {

constexpr uint32_t kPkt = 8952;  // a jumbo datagram's payload
constexpr uint64_t kMs = 1'000'000;

// `gbps` Gbit/s (gbps / 8 bytes per ns), delivered in bursts every 100 us for `ms` milliseconds.
void deliver(Downlink& d, uint64_t from_ns, uint64_t ms, uint64_t gbps = 1) {
  for (uint64_t t = from_ns; t <= from_ns + ms * kMs; t += 100'000) d.on_bytes(12'500 * gbps, t);
}

TEST(Downlink, BeforeAnyMeasurementTheInitialBudgetIsDividedAmongTheSenders) {
  Downlink d;
  d.join(1);
  EXPECT_EQ(d.credit_pkts(kPkt), Downlink::kInitialBudgetBytes / kPkt);
  for (int i = 0; i < 6; ++i) d.join(2);
  EXPECT_EQ(d.credit_pkts(kPkt), Downlink::kInitialBudgetBytes / 7 / kPkt);
  // Never below the floor, never above what the wire carries.
  for (int i = 0; i < 100; ++i) d.join(3);
  EXPECT_EQ(d.credit_pkts(kPkt), Downlink::kMinCreditPkts);
  for (int i = 0; i < 106; ++i) d.leave();
  EXPECT_EQ(d.snapshot().senders, 1u);
  EXPECT_EQ(d.credit_pkts(1), Downlink::kMaxCreditPkts);  // 256 Ki one-byte packets
}

TEST(Downlink, ACtsDividesByTheRecentPeakAnAckByTheSendersNow) {
  Downlink d;
  for (int i = 0; i < 4; ++i) d.join(10);
  for (int i = 0; i < 4; ++i) d.leave();  // the step ended
  d.join(20);                             // the next step's first receive
  EXPECT_EQ(d.snapshot().peak, 4u);
  EXPECT_EQ(d.credit_pkts(kPkt, true), Downlink::kInitialBudgetBytes / 4 / kPkt);
  EXPECT_EQ(d.credit_pkts(kPkt, false), Downlink::kInitialBudgetBytes / kPkt);
  // Two peak windows later the old peak is forgotten.
  d.join(20 + 2'500 * kMs);
  d.leave();
  d.join(20 + 3'600 * kMs);
  EXPECT_LE(d.snapshot().peak, 2u);
}

// At 10 Gbit/s the rate times the target RTT is above the floor (at 1 Gbit/s, 87.5 KB, it is not:
// the next test).
TEST(Downlink, TheBudgetIsTheMeasuredRateTimesTheTargetRtt) {
  Downlink d;
  d.join(1);
  deliver(d, 1, 20, 10);
  // The rate alone changes nothing until an RTT is known.
  EXPECT_EQ(d.snapshot().budget, Downlink::kInitialBudgetBytes);
  d.on_rtt(200'000, 21 * kMs);
  const DownlinkSnapshot s = d.snapshot();
  EXPECT_NEAR(s.rate, 1.25, 0.1);
  EXPECT_EQ(s.base_rtt, 200'000u);
  // 1.25 B/ns x (200 us + 500 us of queueing target) = 875 KB.
  const double want = 1.25 * double(queueing_target_ns(200'000));
  EXPECT_NEAR(double(s.budget), want, want * 0.08);
  EXPECT_EQ(d.credit_pkts(kPkt), uint32_t(s.budget / kPkt));
  // A larger RTT sample does not raise the base; a smaller one lowers it.
  d.on_rtt(900'000, 22 * kMs);
  EXPECT_EQ(d.snapshot().base_rtt, 200'000u);
  d.on_rtt(150'000, 23 * kMs);
  EXPECT_EQ(d.snapshot().base_rtt, 150'000u);
}

TEST(Downlink, AnIdleGapIsNotMeasuredAsASlowLink) {
  Downlink d;
  d.join(1);
  d.on_rtt(200'000, 1);
  deliver(d, 1, 10, 10);
  const uint64_t budget = d.snapshot().budget;
  EXPECT_GT(budget, Downlink::kMinBudgetBytes);
  // One burst, then 50 ms of silence between steps, then the next step at the same rate.
  d.on_bytes(125'000, 60 * kMs);
  deliver(d, 60 * kMs + 100'000, 10, 10);
  EXPECT_NEAR(d.snapshot().rate, 1.25, 0.1);
  EXPECT_NEAR(double(d.snapshot().budget), double(budget), double(budget) * 0.08);
}

// A slow link, or a busy host whose stalls make the link look slow, never brings the budget
// below the floor: credit caps incast, it does not throttle a link it mismeasured.
TEST(Downlink, NeverBelowTheMinimumBudget) {
  Downlink d;
  d.join(1);
  d.on_rtt(200'000, 1);
  deliver(d, 1, 20);  // 1 Gbit/s: 87.5 KB of rate x target RTT
  EXPECT_EQ(d.snapshot().budget, Downlink::kMinBudgetBytes);
  for (uint64_t t = 21 * kMs; t <= 40 * kMs; t += 100'000) d.on_bytes(10, t);  // a trickle
  EXPECT_EQ(d.snapshot().budget, Downlink::kMinBudgetBytes);
}

}  // namespace
}  // namespace optireduce
