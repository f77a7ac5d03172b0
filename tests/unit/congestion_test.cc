// The path's congestion control: DelayController's rules (slow start, a decrease in proportion
// to the delay's excess once per RTT, random loss ignored and queue-full loss obeyed, a timeout
// halving, the floor, the base-RTT filter forgetting, competing on loss beside traffic that
// holds the queue and going back), and Path/PathTable's sharing of one
// window by every connection to the same host.
#include <gtest/gtest.h>

#include "transport/congestion.h"

namespace optireduce {
namespace {

constexpr uint32_t kMss = 8000;
constexpr uint64_t kUs = 1000;
constexpr uint64_t kMs = 1000 * kUs;

DelayController fresh() {
  DelayControlOptions o;
  o.mss = kMss;
  o.max_window = 100 * kMss;
  o.target_floor_ns = 500 * kUs;
  return DelayController(o);
}

TEST(DelayController, SlowStartDoublesPerRttWhileTheDelayIsOnTarget) {
  DelayController c = fresh();
  const uint64_t w0 = c.window_bytes();
  EXPECT_EQ(w0, 16u * kMss);
  uint64_t now = kMs;
  // One window acknowledged at the base RTT: the window doubles.
  c.on_ack(w0, 100 * kUs, now);
  EXPECT_EQ(c.window_bytes(), 2 * w0);
  EXPECT_EQ(c.base_rtt_ns(), 100 * kUs);
  EXPECT_EQ(c.target_ns(), 600 * kUs);  // base + the 500 us floor
  // Growth stops at the ceiling.
  for (int i = 0; i < 10; ++i) c.on_ack(c.window_bytes(), 100 * kUs, now += 100 * kUs);
  EXPECT_EQ(c.window_bytes(), 100u * kMss);
}

TEST(DelayController, ExcessDelayShrinksInProportionOncePerRtt) {
  DelayController c = fresh();
  uint64_t now = kMs;
  c.on_ack(kMss, 100 * kUs, now);  // base 100 us, target 600 us
  const double w = static_cast<double>(c.window_bytes());
  // 1100 us: excess 500 of 1100 -> factor 1 - 0.8 * 500/1100.
  c.on_ack(kMss, 1100 * kUs, now += 10 * kUs);
  EXPECT_NEAR(static_cast<double>(c.window_bytes()), w * (1 - 0.8 * 500.0 / 1100.0), 1.0);
  EXPECT_EQ(c.decreases(), 1u);
  // More samples of the same RTT describe the same queue: no second cut yet.
  const uint64_t after = c.window_bytes();
  c.on_ack(kMss, 1100 * kUs, now += 10 * kUs);
  EXPECT_EQ(c.window_bytes(), after);
  // One smoothed RTT later it cuts again, never by more than half.
  c.on_ack(kMss, 5 * kMs, now += 2 * kMs);
  EXPECT_EQ(c.decreases(), 2u);
  EXPECT_NEAR(static_cast<double>(c.window_bytes()), static_cast<double>(after) * 0.5, 1.0);
}

TEST(DelayController, AfterSlowStartGrowsOnePacketPerRtt) {
  DelayController c = fresh();
  uint64_t now = kMs;
  c.on_ack(kMss, 100 * kUs, now);
  c.on_ack(kMss, 2 * kMs, now += kMs);  // leaves slow start
  const uint64_t w = c.window_bytes();
  // A whole window acknowledged on target: about one packet more.
  for (uint64_t acked = 0; acked < w; acked += kMss) c.on_ack(kMss, 100 * kUs, now += kUs);
  EXPECT_NEAR(static_cast<double>(c.window_bytes()), static_cast<double>(w + kMss), kMss * 0.1);
}

TEST(DelayController, RandomLossOnAnIdleQueueIsNotCongestion) {
  DelayController c = fresh();
  uint64_t now = kMs;
  c.on_ack(kMss, 100 * kUs, now);
  c.on_ack(kMss, 2 * kMs, now += kMs);  // leave slow start
  c.on_ack(kMss, 100 * kUs, now += kMs);
  const uint64_t w = c.window_bytes();
  c.on_loss(now += kMs);  // the last RTT was at the base: a random loss
  EXPECT_EQ(c.window_bytes(), w);
  // The same loss with the queue full (RTT far above target) cuts by 30%.
  c.on_ack(kMss, 100 * kUs + 10, now += kMs);
  const uint64_t w2 = c.window_bytes();
  DelayController d = fresh();
  d.on_ack(kMss, 100 * kUs, now);
  d.on_ack(kMss, 2 * kMs, now + kMs);
  const uint64_t before = d.window_bytes();
  d.on_loss(now + 10 * kMs);
  EXPECT_NEAR(static_cast<double>(d.window_bytes()), static_cast<double>(before) * 0.7, 1.0);
  EXPECT_GT(w2, 0u);
}

TEST(DelayController, LossInSlowStartEndsIt) {
  DelayController c = fresh();
  const uint64_t w = c.window_bytes();
  c.on_loss(kMs);
  EXPECT_NEAR(static_cast<double>(c.window_bytes()), static_cast<double>(w) * 0.7, 1.0);
  c.on_ack(w, 100 * kUs, 2 * kMs);  // no more doubling
  EXPECT_LT(c.window_bytes(), w);
}

// The floor is four packets or 32 KiB, whichever is more: four 8000-byte packets are 31.25 KiB.
TEST(DelayController, TimeoutsHalveDownToAFloorOfFourPacketsOr32KiB) {
  DelayController c = fresh();
  for (int i = 0; i < 20; ++i) c.on_timeout(kMs * (i + 1));
  EXPECT_EQ(c.window_bytes(), 32u << 10);
  DelayControlOptions o;
  o.mss = 9000;
  DelayController jumbo(o);
  for (int i = 0; i < 20; ++i) jumbo.on_timeout(kMs * (i + 1));
  EXPECT_EQ(jumbo.window_bytes(), 4u * 9000);
  o.mss = 1424;  // a 1500-byte MTU
  DelayController small(o);
  for (int i = 0; i < 20; ++i) small.on_timeout(kMs * (i + 1));
  EXPECT_EQ(small.window_bytes(), 32u << 10);
}

TEST(DelayController, TheBaseRttForgetsARouteThatGotLonger) {
  DelayController c = fresh();
  uint64_t now = kMs;
  c.on_ack(kMss, 100 * kUs, now);
  EXPECT_EQ(c.base_rtt_ns(), 100 * kUs);
  // The path now takes 3 ms each way: within two 10 s windows the base follows.
  for (int i = 0; i < 30; ++i) c.on_ack(kMss, 3 * kMs, now += 1'000 * kMs);
  EXPECT_EQ(c.base_rtt_ns(), 3 * kMs);
}

// The base is the smallest whole round trip, not the smallest network part: one network sample
// whose waits were overestimated (10 us out of a 300 us round trip) must not become a base that
// every later sample exceeds.
TEST(DelayController, TheBaseIsTheSmallestWholeRoundTrip) {
  DelayController c = fresh();
  uint64_t now = kMs;
  c.on_ack(kMss, 250 * kUs, 300 * kUs, now);
  EXPECT_EQ(c.base_rtt_ns(), 300 * kUs);
  c.on_ack(kMss, 10 * kUs, 310 * kUs, now += 100 * kUs);
  EXPECT_EQ(c.base_rtt_ns(), 300 * kUs);
  EXPECT_EQ(c.target_ns(), 800 * kUs);
  // A network sample without a whole one (a short packet's) does not move it either.
  c.on_ack(kMss, 40 * kUs, 0, now += 100 * kUs);
  EXPECT_EQ(c.base_rtt_ns(), 300 * kUs);
}

TEST(DelayController, PacesAtAQuarterAboveWindowPerRtt) {
  DelayController c = fresh();
  EXPECT_EQ(c.pacing_rate(), 0.0);  // nothing measured: the window alone
  c.on_ack(0, 100 * kUs, kMs);
  EXPECT_NEAR(c.pacing_rate(), 1.25 * 16 * kMss / (100.0 * kUs), 1e-9);
}

// Feeds `ms` milliseconds of ACKs, one per 100 us, delivering `rate` bytes per ns at RTT `rtt`,
// from `*now` on (advanced).
void feed(DelayController* c, double rate, uint64_t rtt, uint64_t ms, uint64_t* now) {
  const auto per_ack = static_cast<uint64_t>(rate * 100.0 * kUs);
  for (uint64_t t = 0; t < ms * 10; ++t) c->on_ack(per_ack, rtt, *now += 100 * kUs);
}

// A path past slow start that ran at 1 Gbit/s (0.125 B/ns) on target: the delay rule's best
// rate is 0.125.
DelayController on_target_path(uint64_t* now) {
  DelayController c = fresh();
  feed(&c, 0.125, 200 * kUs, 5, now);
  c.on_ack(kMss, 2 * kMs, *now += 100 * kUs);  // leave slow start
  feed(&c, 0.125, 200 * kUs, 20, now);
  return c;
}

// That path then finds a queue it cannot drain (8 ms RTT) and only a few percent of that rate
// at its floor: someone who backs off only on loss holds the queue. It competes, from the
// window it had before that queue.
DelayController starved_path(uint64_t* now, uint64_t* window_before) {
  DelayController c = on_target_path(now);
  *window_before = c.window_bytes();
  feed(&c, 0.004, 8 * kMs, 40, now);  // the queue stands; the window falls to its floor
  return c;
}

TEST(DelayController, CompetesWhenAStandingQueueStarvesItAtItsFloor) {
  uint64_t now = kMs, before = 0;
  DelayController c = starved_path(&now, &before);
  EXPECT_TRUE(c.competing());
  EXPECT_EQ(c.compete_episodes(), 1u);
  EXPECT_GE(c.window_bytes(), before);
  // Loss is now the signal: one episode per RTT cuts 30%, whatever the RTT.
  const uint64_t w = c.window_bytes();
  c.on_loss(now += 9 * kMs);
  EXPECT_NEAR(static_cast<double>(c.window_bytes()), static_cast<double>(w) * 0.7, 1.0);
  c.on_loss(now += 10 * kUs);
  EXPECT_NEAR(static_cast<double>(c.window_bytes()), static_cast<double>(w) * 0.7, 1.0);
  // Between losses the window grows by about a packet per RTT although the RTT stays far above
  // target.
  const uint64_t w2 = c.window_bytes();
  for (uint64_t acked = 0; acked < w2; acked += kMss) c.on_ack(kMss, 8 * kMs, now += 50 * kUs);
  EXPECT_NEAR(static_cast<double>(c.window_bytes()), static_cast<double>(w2 + kMss), kMss * 0.2);
}

// Competing resumes the rate the path had on target, not its window. The path ran at 0.125 B/ns
// at a 2 ms RTT; behind the competitor's full queue the RTT is 16 ms, where the window it had
// would be an eighth of that rate or less. The device's best rate, at 16 ms, is the window to
// resume (within the cap, so exactly that). Before, it resumed the window (0.03 B/ns here).
TEST(DelayController, CompetesAtTheRateItHadOnTargetNotWithItsWindow) {
  DelayControlOptions o;
  o.mss = kMss;
  o.max_window = 64u << 20;  // the cap here is the device's rate, not this
  o.target_floor_ns = 500 * kUs;
  auto meter = std::make_shared<DeliveryMeter>();
  o.meter = meter;
  DelayController c(o);
  uint64_t now = kMs;
  feed(&c, 0.125, 2 * kMs, 3, &now);
  c.on_ack(kMss, 5 * kMs, now += 100 * kUs);  // leave slow start
  feed(&c, 0.125, 2 * kMs, 30, &now);
  const double best = meter->best_rate();
  ASSERT_NEAR(best, 0.125, 0.01);
  const double window_on_target = static_cast<double>(c.window_bytes());
  ASSERT_LT(window_on_target / (16.0 * kMs), 0.5 * best);  // the window alone would starve
  feed(&c, 0.004, 16 * kMs, 150, &now);
  ASSERT_TRUE(c.competing());
  const double rate = static_cast<double>(c.window_bytes()) / static_cast<double>(c.srtt_ns());
  EXPECT_GT(rate, 0.9 * best) << c.window_bytes() << " B at " << c.srtt_ns() << " ns";
  EXPECT_LT(rate, 1.1 * best) << "more than the device's best rate";
}

TEST(DelayController, StopsCompetingWhenTheQueueDrains) {
  uint64_t now = kMs, before = 0;
  DelayController c = starved_path(&now, &before);
  ASSERT_TRUE(c.competing());
  c.on_ack(kMss, 300 * kUs, now += 100 * kUs);  // on target again
  EXPECT_FALSE(c.competing());
  // The delay rule governs again: a high RTT cuts the window once more.
  const uint64_t w = c.window_bytes();
  c.on_ack(kMss, 8 * kMs, now += 10 * kMs);
  EXPECT_LT(c.window_bytes(), w);
}

TEST(DelayController, StopsCompetingWhenItsRateIsBack) {
  uint64_t now = kMs, before = 0;
  DelayController c = starved_path(&now, &before);
  ASSERT_TRUE(c.competing());
  // Still a standing queue, but the path delivers at its old rate: the queue is its own now.
  feed(&c, 0.12, 8 * kMs, 40, &now);
  EXPECT_FALSE(c.competing());
}

// Unresponsive traffic that leaves the path half the link, or a queue of its own making at an
// unchanged rate, is no reason to compete: the delay rule keeps the queue short.
TEST(DelayController, AHalfShareIsNoReasonToCompete) {
  uint64_t now = kMs;
  DelayController c = on_target_path(&now);
  feed(&c, 0.06, 2 * kMs, 100, &now);
  EXPECT_FALSE(c.competing());
  EXPECT_EQ(c.compete_episodes(), 0u);
}

// A queue that stands at little more than the target, with the path starved (many of our own
// paths at their floors into one downlink): no reason to compete, the delay rule keeps it.
TEST(DelayController, AShallowStandingQueueIsNoReasonToCompete) {
  uint64_t now = kMs;
  DelayController c = on_target_path(&now);
  feed(&c, 0.004, 1100 * kUs, 100, &now);  // 900 us above the base: under twice the 500 us
  EXPECT_FALSE(c.competing());
  c.on_ack(kMss, 300 * kUs, now += 100 * kUs);  // it drained once; then a deep one stands
  feed(&c, 0.004, 1300 * kUs, 100, &now);       // 1100 us above: deep
  EXPECT_TRUE(c.competing());
}

// The paths of one device share its meter: it measures what they deliver together, epoch by
// epoch, and leaves out the time the device had nothing to send.
TEST(DeliveryMeter, AddsUpADevicesPathsAndSkipsIdleSpells) {
  DeliveryMeter m;
  uint64_t now = kMs;
  for (int i = 0; i < 250; ++i) {  // 25 ms: two paths, 6250 bytes each per 100 us
    m.on_acked(6250, now += 50 * kUs);
    m.on_acked(6250, now += 50 * kUs);
  }
  EXPECT_NEAR(m.last_rate(), 0.125, 0.01);
  EXPECT_NEAR(m.best_rate(), 0.125, 0.01);
  now += 50 * kMs;  // idle
  for (int i = 0; i < 250; ++i) m.on_acked(1250, now += 100 * kUs);
  EXPECT_NEAR(m.last_rate(), 0.0125, 0.002);  // not diluted by the idle 50 ms
  EXPECT_NEAR(m.best_rate(), 0.125, 0.01);
}

std::unique_ptr<CongestionController> controller() {
  DelayControlOptions o;
  o.mss = kMss;
  return std::make_unique<DelayController>(o);
}

TEST(Path, ConnectionsShareOneWindow) {
  Path p(controller(), kMss, 0);
  const uint64_t w = p.snapshot().window;
  EXPECT_EQ(p.room(kMs), w);
  p.on_sent(w / 2);  // connection A
  p.on_sent(w / 2);  // connection B
  EXPECT_EQ(p.room(kMs), 0u);
  p.on_acked(w / 4, w / 4, 0, 0, kMs);    // A's ACK opens room for B as well
  EXPECT_EQ(p.room(kMs), w / 4 + w / 4);  // (slow start also grew the window by as much)
  p.release(w);                           // everything leaves flight: never below zero
  EXPECT_EQ(p.snapshot().inflight, 0u);
}

TEST(Path, AnEmptyPathAlwaysLetsOnePacketGo) {
  Path p(controller(), kMss, 0);
  for (int i = 0; i < 20; ++i) p.on_timeout(kMs * (i + 1));
  EXPECT_GE(p.room(kMs), uint64_t{kMss});
}

TEST(Path, TheRateCeilingCapsPacing) {
  Path p(controller(), kMss, 0.125);  // 1 Gbit/s
  uint64_t t = 10 * kMs;
  p.room(t);  // starts the bucket
  p.on_sent(p.room(t));
  // 100 us later the ceiling allows 12.5 kB, not the (unmeasured, unpaced) window's worth.
  EXPECT_NEAR(static_cast<double>(p.tokens(t + 100 * kUs)), 12'500.0, 1.0);
}

TEST(PathTable, OnePathPerHostWhileAnyConnectionUsesIt) {
  PathTable t;
  auto a = t.get("0", "10.0.0.2", kMss, 0);
  auto b = t.get("0", "10.0.0.2", kMss, 0);
  auto c = t.get("0", "10.0.0.3", kMss, 0);
  EXPECT_EQ(a.get(), b.get());
  EXPECT_NE(a.get(), c.get());
  a->on_sent(1000);
  EXPECT_EQ(b->snapshot().inflight, 1000u);
  a.reset();
  b.reset();
  // Nobody uses it any more: a later connection starts afresh.
  auto d = t.get("0", "10.0.0.2", kMss, 0);
  EXPECT_EQ(d->snapshot().inflight, 0u);
}

}  // namespace
}  // namespace optireduce
