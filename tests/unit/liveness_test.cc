// PeerLiveness (transport/liveness.h): when a connection asks its peer whether it is there,
// and when it gives up on it. Pure time stamps, no connection.
#include <gtest/gtest.h>

#include "transport/liveness.h"

namespace optireduce {
namespace {

using Verdict = PeerLiveness::Verdict;

constexpr uint64_t kMs = 1'000'000;
constexpr uint64_t kTimeout = 1000 * kMs;
constexpr uint64_t kInterval = kTimeout / PeerLiveness::kPingsPerTimeout;

// Polls every millisecond from `from` for `span` while `waiting`, sending every PING asked
// for (none answered). Returns when the verdict is kDead (its time in *dead_at) or the span
// ends (*dead_at = 0); *pings counts what was sent.
void run_silent(PeerLiveness& l, uint64_t from, uint64_t span, bool waiting, uint64_t* dead_at,
                int* pings) {
  *dead_at = 0;
  for (uint64_t t = from; t <= from + span; t += kMs) {
    const Verdict v = l.poll(t, waiting);
    if (v == Verdict::kDead) {
      *dead_at = t;
      return;
    }
    if (v == Verdict::kPing) {
      l.on_ping_sent(t);
      ++*pings;
    }
  }
}

TEST(PeerLiveness, ASilentPeerIsDeadAtTheTimeoutNotBefore) {
  PeerLiveness l(kTimeout);
  const uint64_t start = 5000 * kMs;
  l.on_heard(start - 1);
  uint64_t dead_at = 0;
  int pings = 0;
  run_silent(l, start, 3 * kTimeout, true, &dead_at, &pings);
  ASSERT_NE(dead_at, 0u);
  EXPECT_GE(dead_at - start, kTimeout);
  EXPECT_LE(dead_at - start, kTimeout + 2 * kMs);
  EXPECT_EQ(l.why(), PeerLiveness::Why::kSilent);
  // One PING per interval after the first interval of silence.
  EXPECT_EQ(pings, static_cast<int>(PeerLiveness::kPingsPerTimeout) - 1);
}

TEST(PeerLiveness, AnAnsweringPeerLivesForever) {
  PeerLiveness l(kTimeout);
  int pings = 0;
  uint64_t answer_at = 0;  // when the PONG in flight arrives; 0 = none
  for (uint64_t t = kMs; t < 50 * kTimeout; t += kMs) {
    if (answer_at != 0 && t >= answer_at) {
      l.on_heard(t);
      answer_at = 0;
    }
    const Verdict v = l.poll(t, true);
    ASSERT_NE(v, Verdict::kDead) << t / kMs << " ms";
    if (v == Verdict::kPing) {
      l.on_ping_sent(t);
      ++pings;
      // The PONG comes back 3 ms later, except every other one (50% loss of PING or PONG).
      if (pings % 2 == 0) answer_at = t + 3 * kMs;
    }
  }
  EXPECT_GT(pings, 100);
}

TEST(PeerLiveness, NothingWaitingMeansNoPingAndNoVerdict) {
  PeerLiveness l(kTimeout);
  uint64_t dead_at = 0;
  int pings = 0;
  run_silent(l, kMs, 100 * kTimeout, false, &dead_at, &pings);
  EXPECT_EQ(dead_at, 0u);
  EXPECT_EQ(pings, 0);
}

TEST(PeerLiveness, ALongIdlePeriodDoesNotCountAsSilence) {
  PeerLiveness l(kTimeout);
  l.on_heard(kMs);
  // An hour of nothing to wait for, then a wait: the first PING only an interval later.
  const uint64_t w = 3600'000 * kMs;
  EXPECT_EQ(l.poll(w - kMs, false), Verdict::kAlive);
  EXPECT_EQ(l.poll(w, true), Verdict::kAlive);
  EXPECT_EQ(l.poll(w + kInterval - kMs, true), Verdict::kAlive);
  ASSERT_EQ(l.poll(w + kInterval, true), Verdict::kPing);
  l.on_ping_sent(w + kInterval);
  // That PING is never answered; the wait ends, and another begins much later: the old PING
  // does not shorten the new wait's timeout.
  EXPECT_EQ(l.poll(w + kInterval + kMs, false), Verdict::kAlive);
  const uint64_t again = w + 100 * kTimeout;
  uint64_t dead_at = 0;
  int pings = 0;
  run_silent(l, again, 3 * kTimeout, true, &dead_at, &pings);
  ASSERT_NE(dead_at, 0u);
  EXPECT_GE(dead_at - again, kTimeout);
}

TEST(PeerLiveness, ShortWaitsBackToBackAddUpToTheTimeout) {
  // A stream of bounded steps to a dead peer: each wait ends by its deadline (40 ms) and the
  // next starts 1 ms later. The silence must add up across them.
  PeerLiveness l(kTimeout);
  const uint64_t start = 10 * kMs;
  uint64_t t = start;
  uint64_t dead_at = 0;
  while (t < start + 3 * kTimeout && dead_at == 0) {
    for (uint64_t end = t + 40 * kMs; t < end; t += kMs) {
      const Verdict v = l.poll(t, true);
      if (v == Verdict::kDead) {
        dead_at = t;
        break;
      }
      if (v == Verdict::kPing) l.on_ping_sent(t);
    }
    EXPECT_EQ(l.poll(t, false), Verdict::kAlive);
    t += kMs;
  }
  ASSERT_NE(dead_at, 0u);
  EXPECT_GE(dead_at - start, kTimeout);
  EXPECT_LE(dead_at - start, kTimeout + 50 * kMs);
}

TEST(PeerLiveness, RepeatedPortUnreachableIsDeathOneIsNot) {
  PeerLiveness l(kTimeout);
  l.on_unreachable(PeerLiveness::kUnreachableLimit - 1);
  EXPECT_NE(l.poll(kMs, true), Verdict::kDead);
  l.on_heard(2 * kMs);  // heard in between: the count starts over
  l.on_unreachable(PeerLiveness::kUnreachableLimit - 1);
  EXPECT_NE(l.poll(3 * kMs, true), Verdict::kDead);
  l.on_unreachable(1);
  EXPECT_EQ(l.poll(4 * kMs, false), Verdict::kDead);  // even with nothing waiting
  EXPECT_EQ(l.why(), PeerLiveness::Why::kUnreachable);
}

}  // namespace
}  // namespace optireduce
