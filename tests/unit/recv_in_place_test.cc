// Receiving into place as the transport sees it (issue 16, verbs receive lanes): a receive
// posted with a registration asks its datapath for a place of its own (Endpoint::aim_open), its
// CTS names the steer the datapath gave, the sender's DATA for that message carry it, what the
// datapath placed is not copied again, and the aim is closed before the buffer is final: when
// every packet came, and when the connection goes with the receive still posted. Bounded
// receives are not aimed. The datapath is the in-memory link behind a
// wrapper that plays a device with one receive lane.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "tests/unit/device_doubles.h"
#include "tests/unit/drive_pair.h"
#include "tests/unit/mem_link.h"
#include "tests/unit/pattern.h"
#include "tests/warn_capture.h"
#include "transport/recv.h"
#include "transport/send.h"
#include "transport/wire.h"

namespace optireduce {
namespace {

using testing::FakeRegion;
using testing::ForwardingEndpoint;
using testing::make_mem_pair;
using testing::pattern;

constexpr uint32_t kDgram = 1048;  // 1000-byte payloads
constexpr uint32_t kSteer = 0x77;

// Forwards to the link and keeps what the sender said of each DATA's destination.
class SteerSpy final : public ForwardingEndpoint {
 public:
  using ForwardingEndpoint::ForwardingEndpoint;
  int tx_burst(const TxPacket* pkts, int n) override {
    const int k = ForwardingEndpoint::tx_burst(pkts, n);
    for (int i = 0; i < k; ++i) {
      PacketHeader h;
      if (testing::tx_header(pkts[i], &h) && h.type == PacketType::kData) {
        data_steers.push_back(pkts[i].steer);
        data_retx.push_back((h.flags & kFlagRetx) != 0);
      }
    }
    return k;
  }

  std::vector<uint32_t> data_steers;
  std::vector<bool> data_retx;  // ... and whether each was sent again
};

// A device with one receive lane: while an aim is open, DATA of its message is written into
// the buffer as it arrives and handed out marked aimed; once closed, nothing is written.
// With `strand_after` set, the lane is lost once it placed that many packets (verbs: its QP
// recreated under a new QPN): every DATA its sender addressed to kSteer is dropped from then
// on, as a device drops datagrams for a QPN that no longer exists. The link keeps order and
// loses nothing, so the k-th DATA to arrive is the k-th the sender's spy saw leave. With
// `swallow_after` set, the lane silently eats its message's DATA after that many, while the
// aim is open, and says nothing (a lane defect of a kind not yet known).
// DATA its sender sent the common way (steer 0) for a place beyond every one the lane filled is
// dropped, as the verbs endpoint drops it for a place a lane's request still owns (on a real
// lane a later packet takes the request of one lost before it). With
// `lose_data_at`, the DATA that arrives as that one (from 0) is lost on the way; with
// `hold_acks`, the receiver's ACKs are lost until a retransmitted DATA arrives.
class LaneDevice final : public ForwardingEndpoint {
 public:
  using ForwardingEndpoint::ForwardingEndpoint;
  int rx_burst(RxPacket* pkts, int max) override {
    const int n = ForwardingEndpoint::rx_burst(pkts, max);
    int kept = 0;
    for (int i = 0; i < n; ++i) {
      PacketHeader h;
      if (decode(pkts[i].data, pkts[i].len, &h) == DecodeError::kNone &&
          h.type == PacketType::kData) {
        const size_t k = data_seen++;
        const uint32_t steer =
            sent_steers != nullptr && k < sent_steers->size() ? (*sent_steers)[k] : kSteer;
        if (static_cast<int>(k) == lose_data_at) continue;
        if ((h.flags & kFlagRetx) != 0) hold_acks = false;
        if (stranded && steer == kSteer) {
          ++stranded_drops;
          continue;
        }
        const bool ours = open && h.token == aim.token && h.msg_seq == aim.msg_seq;
        const uint64_t q = ours ? h.offset / aim.pkt_payload : 0;
        if (ours && !stranded && steer == 0 && q >= filled_end) {
          ++owned_drops;
          continue;
        }
        if (ours && swallowing) {  // the place takes it and hands nothing up
          ++swallowed;
          continue;
        }
        if (ours && !stranded && steer == kSteer && h.payload_len != 0 &&
            h.offset + h.payload_len <= aim.capacity) {
          std::memcpy(aim.base + h.offset, pkts[i].data + kHeaderBytes, h.payload_len);
          pkts[i].rest = aim.base + h.offset;
          pkts[i].placed = h.payload_len;
          pkts[i].aimed = true;
          filled_end = std::max(filled_end, q + 1);
          if (++placed == strand_after) {
            stranded = true;
            ++moves;
          }
          if (placed == swallow_after) swallowing = true;
        }
      }
      pkts[kept++] = pkts[i];
    }
    return kept;
  }
  // Drops the first `drop_moving_cts` CTS that move a message off the lost lane (steer 0).
  int tx_burst(const TxPacket* pkts, int n) override {
    std::vector<TxPacket> kept;
    for (int i = 0; i < n; ++i) {
      PacketHeader h;
      if (stranded && drop_moving_cts > 0 && testing::tx_header(pkts[i], &h) &&
          h.type == PacketType::kCts && h.steer == 0) {
        --drop_moving_cts;
        continue;
      }
      if (hold_acks && testing::tx_header(pkts[i], &h) && h.type == PacketType::kAck) {
        ++held_acks;
        continue;
      }
      kept.push_back(pkts[i]);
    }
    const int k = ForwardingEndpoint::tx_burst(kept.data(), static_cast<int>(kept.size()));
    return k == static_cast<int>(kept.size()) ? n : k;
  }
  uint64_t aim_moves() const override { return moves; }
  bool aim_reachable(uint32_t steer) override {
    EXPECT_EQ(steer, kSteer);
    return !stranded;
  }
  std::string aim_text(uint32_t steer) const override {
    EXPECT_EQ(steer, kSteer);
    return swallowing ? "the fake lane swallows its DATA" : "the fake lane places its DATA";
  }

  uint32_t aim_open(const AimTarget& t) override {
    if (!offer || open) return 0;
    aim = t;
    filled_end = 0;
    open = true;
    ++opens;
    return kSteer;
  }
  bool aim_close(uint32_t steer, bool wait) override {
    EXPECT_EQ(steer, kSteer);
    EXPECT_TRUE(open);
    if (!wait && not_yet > 0) {  // still taking its requests back
      --not_yet;
      ++asked_again;
      return false;
    }
    open = false;
    ++closes;
    if (on_close) on_close();
    return true;
  }

  bool offer = true;
  bool open = false;
  AimTarget aim;
  int opens = 0, closes = 0, placed = 0;
  int not_yet = 0;      // aim_close answers "not yet" this many times first
  int asked_again = 0;  // and counts them
  std::function<void()> on_close;
  const std::vector<uint32_t>* sent_steers = nullptr;  // the sender's spy's
  int strand_after = -1;
  bool stranded = false;
  uint64_t moves = 0;
  size_t data_seen = 0;
  int stranded_drops = 0;
  int drop_moving_cts = 0;
  int swallow_after = -1;
  bool swallowing = false;
  int swallowed = 0;
  uint64_t filled_end = 0;  // one past the last place of the aim written
  int owned_drops = 0;
  int lose_data_at = -1;
  bool hold_acks = false;
  int held_acks = 0;
};

// Every DATA the sender sent again went the common way, every other one to the lane (each
// retransmission here is its packet's first).
void expect_repairs_went_the_common_way(const SteerSpy& tx) {
  for (size_t k = 0; k < tx.data_steers.size(); ++k)
    EXPECT_EQ(tx.data_steers[k], tx.data_retx[k] ? 0u : kSteer) << "DATA " << k;
}

struct Rig {
  FakeClock clock;
  Config cfg;
  SteerSpy* tx = nullptr;
  LaneDevice* dev = nullptr;
  ConnParams cp;
  std::unique_ptr<SendConn> s;
  std::unique_ptr<RecvConn> r;

  explicit Rig(Delivery d = Delivery::kExact) {
    cfg.timeout_ms = 50;
    auto p = make_mem_pair(kDgram, &clock, 0);
    auto a = std::make_unique<SteerSpy>(std::move(p.a));
    auto b = std::make_unique<LaneDevice>(std::move(p.b));
    tx = a.get();
    dev = b.get();
    dev->sent_steers = &tx->data_steers;
    cp.token = 0x5EED;
    cp.pkt_payload = payload_for_datagram(kDgram);
    cp.peer_window = 256 * 1024;
    cp.delivery = d;
    s = std::make_unique<SendConn>(cfg, clock, std::move(a), cp, nullptr);
    r = std::make_unique<RecvConn>(cfg, clock, std::move(b), cp, nullptr);
  }

  bool run(Request* sr, Request* rr, int rounds = 20000) {
    return testing::drive_pair(*s, *r, clock, sr, rr, rounds);
  }
  // One message of `bytes` (pattern `seed`) into a registered buffer of its size: true when
  // both ends are done and the buffer holds the message exactly.
  bool transfer_exact(size_t bytes, uint64_t seed) {
    const auto src = pattern(bytes, seed);
    std::vector<uint8_t> dst(src.size(), 0xCD);
    FakeRegion region(dst.data(), dst.size());
    return transfer(src, dst, &region) && src == dst;
  }
  // One message of `src` into `dst`, registered as `region`: posted, sent, and both done.
  bool transfer(const std::vector<uint8_t>& src, std::vector<uint8_t>& dst,
                const MemoryRegion* region) {
    Request *sr, *rr;
    return r->irecv(dst.data(), dst.size(), MsgDelivery::kAsConnection, region, &rr).is_ok() &&
           s->isend(src.data(), src.size(), &sr).is_ok() && run(sr, rr);
  }
};

TEST(ReceiveInPlace, DataGoesWhereTheCtsSaidAndIsNotCopiedAgain) {
  Rig rig;
  const auto src = pattern(20'500, 5);  // 21 packets, the last one short
  std::vector<uint8_t> dst(24'000, 0xCD);
  FakeRegion region(dst.data(), dst.size());
  Request *sr, *rr;
  ASSERT_TRUE(
      rig.r->irecv(dst.data(), dst.size(), MsgDelivery::kAsConnection, &region, &rr).is_ok());
  ASSERT_EQ(rig.dev->opens, 1);
  EXPECT_EQ(rig.dev->aim.token, rig.cp.token);
  EXPECT_EQ(rig.dev->aim.msg_seq, 0u);
  EXPECT_EQ(rig.dev->aim.base, dst.data());
  EXPECT_EQ(rig.dev->aim.capacity, dst.size());
  EXPECT_EQ(rig.dev->aim.pkt_payload, rig.cp.pkt_payload);
  EXPECT_EQ(rig.dev->aim.mr, &region);
  bool closed_before_done = false;
  rig.dev->on_close = [&] { closed_before_done = true; };
  ASSERT_TRUE(rig.s->isend(src.data(), src.size(), &sr).is_ok());
  ASSERT_TRUE(rig.run(sr, rr));
  EXPECT_TRUE(closed_before_done);
  EXPECT_EQ(rig.dev->closes, 1);
  EXPECT_TRUE(std::equal(src.begin(), src.end(), dst.begin()));
  EXPECT_EQ(dst[src.size()], 0xCD);  // nothing past the message
  ASSERT_EQ(rig.tx->data_steers.size(), 21u);
  for (uint32_t steer : rig.tx->data_steers) EXPECT_EQ(steer, kSteer);
  const ConnStats st = rig.r->stats();
  EXPECT_EQ(st.aimed_msgs, 1u);
  EXPECT_EQ(st.placed_pkts, 21u);
  EXPECT_EQ(rig.dev->placed, 21);
}

// A datapath still taking its requests back when the receive ends (verbs: a lane's flushed
// requests come back asynchronously): the receive is done only once it says they are back,
// every test meanwhile asking it again.
TEST(ReceiveInPlace, AReceiveIsDoneOnlyOnceItsDatapathWritesIntoItNoMore) {
  Rig rig;
  rig.dev->not_yet = 3;
  const auto src = pattern(20'500, 9);
  std::vector<uint8_t> dst(24'000, 0xCD);
  FakeRegion region(dst.data(), dst.size());
  ASSERT_TRUE(rig.transfer(src, dst, &region));
  EXPECT_EQ(rig.dev->asked_again, 3);
  EXPECT_EQ(rig.dev->closes, 1);  // before the receive was done: the connection is still open
  EXPECT_TRUE(std::equal(src.begin(), src.end(), dst.begin()));
}

// The next message, posted without a registration, asks for nothing, and its DATA go to the
// connection's own address.
TEST(ReceiveInPlace, AReceiveWithoutARegionOrTooSmallAsksForNothing) {
  Rig rig;
  const auto src = pattern(20'000, 6);
  std::vector<uint8_t> dst(src.size());
  Request *sr, *rr;
  ASSERT_TRUE(rig.r->irecv(dst.data(), dst.size(), &rr).is_ok());
  ASSERT_TRUE(rig.s->isend(src.data(), src.size(), &sr).is_ok());
  ASSERT_TRUE(rig.run(sr, rr));
  EXPECT_EQ(src, dst);
  // Seven packets' worth: below what pays for a lane.
  std::vector<uint8_t> small(7 * rig.cp.pkt_payload);
  FakeRegion region(small.data(), small.size());
  ASSERT_TRUE(
      rig.r->irecv(small.data(), small.size(), MsgDelivery::kAsConnection, &region, &rr).is_ok());
  ASSERT_TRUE(rig.s->isend(small.data(), small.size(), &sr).is_ok());
  ASSERT_TRUE(rig.run(sr, rr));
  EXPECT_EQ(rig.dev->opens, 0);
  for (uint32_t steer : rig.tx->data_steers) EXPECT_EQ(steer, 0u);
  EXPECT_EQ(rig.r->stats().aimed_msgs, 0u);
}

// A datapath that declines (no lane free) leaves the receive as it always was.
TEST(ReceiveInPlace, ADeclinedAimCopiesAsBefore) {
  Rig rig;
  rig.dev->offer = false;
  const auto src = pattern(30'000, 7);
  std::vector<uint8_t> dst(src.size());
  FakeRegion region(dst.data(), dst.size());
  ASSERT_TRUE(rig.transfer(src, dst, &region));
  EXPECT_EQ(src, dst);
  EXPECT_EQ(rig.dev->closes, 0);
  for (uint32_t steer : rig.tx->data_steers) EXPECT_EQ(steer, 0u);
  EXPECT_EQ(rig.r->stats().placed_pkts, 0u);
}

// A bounded receive copies: a lane's first set-up may take longer than its sender waits for the
// CTS, and one cut at its deadline leaves stragglers in flight to shift the lane's next
// receive. One pinned exact (NCCL's LL/LL128) on the same connection is aimed.
TEST(ReceiveInPlace, OnABoundedConnectionOnlyAReceivePinnedExactIsAimed) {
  Rig rig(Delivery::kBounded);
  std::vector<uint8_t> dst(20'000, 0xCD);
  FakeRegion region(dst.data(), dst.size());
  Request* rr;
  ASSERT_TRUE(
      rig.r->irecv(dst.data(), dst.size(), MsgDelivery::kAsConnection, &region, &rr).is_ok());
  EXPECT_EQ(rig.dev->opens, 0);
  ASSERT_TRUE(rig.run(nullptr, rr));  // cut: nothing was sent
  EXPECT_EQ(request_outcome(rr).lost, dst.size());

  Rig pinned(Delivery::kBounded);
  const auto src = pattern(dst.size(), 8);
  Request* sr;
  ASSERT_TRUE(pinned.r->irecv(dst.data(), dst.size(), MsgDelivery::kExact, &region, &rr).is_ok());
  EXPECT_EQ(pinned.dev->opens, 1);
  ASSERT_TRUE(pinned.s->isend(src.data(), src.size(), MsgDelivery::kExact, &sr).is_ok());
  ASSERT_TRUE(pinned.run(sr, rr));
  EXPECT_EQ(src, dst);
  EXPECT_EQ(pinned.dev->closes, 1);
  EXPECT_GT(pinned.r->stats().placed_pkts, 0u);
}

// A receive that arrives short of its capacity leaves requests to take back (on verbs a trip
// through the error state): the next receive is copied, and a full one brings the aim back.
TEST(ReceiveInPlace, AfterAShortReceiveTheNextIsCopiedUntilOneArrivesFull) {
  Rig rig;
  std::vector<uint8_t> dst(24'000, 0xCD);
  FakeRegion region(dst.data(), dst.size());
  auto step = [&](size_t bytes, uint64_t seed) {
    const auto src = pattern(bytes, seed);
    EXPECT_TRUE(rig.transfer(src, dst, &region));
    EXPECT_TRUE(std::equal(src.begin(), src.end(), dst.begin())) << "seed " << seed;
  };
  step(20'500, 1);  // the first is aimed, and arrives short
  EXPECT_EQ(rig.dev->opens, 1);
  step(24'000, 2);  // copied, and arrives full
  EXPECT_EQ(rig.dev->opens, 1);
  step(24'000, 3);  // aimed again
  EXPECT_EQ(rig.dev->opens, 2);
  step(24'000, 4);
  EXPECT_EQ(rig.dev->opens, 3);
  EXPECT_EQ(rig.r->stats().aimed_msgs, 3u);
}

// A lane lost in mid-receive (verbs: its QP could be neither flushed nor reset in place and
// was recreated under a new QPN) strands what its sender still sends there: without a word
// from the receiver an exact receive waits for ever, its peer answering every PING. The
// receiver closes the lost aim and asks again with steer 0; the sender sends what was in
// flight again at once, and the rest, the common way. With `lost_ctses`, that many of the
// receiver's moving CTS are lost and it repeats the CTS until DATA follows.
void lose_the_lane_in_mid_receive(int lost_ctses) {
  Rig rig;
  rig.dev->strand_after = 40;
  rig.dev->drop_moving_cts = lost_ctses;
  ASSERT_TRUE(rig.transfer_exact(150'000, 11));  // 150 packets
  EXPECT_TRUE(rig.dev->stranded);
  EXPECT_EQ(rig.dev->placed, 40);
  EXPECT_GT(rig.dev->stranded_drops, 0);
  EXPECT_EQ(rig.dev->drop_moving_cts, 0);
  EXPECT_EQ(rig.dev->closes, 1);
  // The steer goes to 0 once and never back.
  const auto& st = rig.tx->data_steers;
  const auto first_moved = std::find(st.begin(), st.end(), 0u);
  ASSERT_NE(first_moved, st.end());
  EXPECT_EQ(std::count(first_moved, st.end(), kSteer), 0);
  EXPECT_EQ(rig.s->stats().resteers, 1u);
  EXPECT_EQ(rig.r->stats().resteers, 1u);
  EXPECT_GE(rig.r->stats().cts_resent, static_cast<uint64_t>(lost_ctses));
}

TEST(ReceiveInPlace, AReceiveWhoseLaneIsLostInMidMessageMovesItsSenderOffIt) {
  lose_the_lane_in_mid_receive(0);
}

TEST(ReceiveInPlace, TheCtsThatMovesASenderOffALostLaneIsRepeatedUntilDataFollows) {
  lose_the_lane_in_mid_receive(2);
}

// A place that eats what comes and says nothing (the kind of lane defect f13ff11 fixed: the
// last packet's request taken by a duplicate) would hold an exact receive for ever. One that
// took no byte for 4 of the sender's longest timeouts (800 ms) is moved off its place all the
// same, and the message completes, exact.
TEST(ReceiveInPlace, AnAimedReceiveThatStallsIsMovedOffItsPlace) {
  const testing::WarnCapture warns;
  Rig rig;
  rig.dev->swallow_after = 30;
  ASSERT_TRUE(rig.transfer_exact(150'000, 12));
  EXPECT_EQ(rig.dev->placed, 30);
  EXPECT_GT(rig.dev->swallowed, 0);
  EXPECT_EQ(rig.dev->closes, 1);
  EXPECT_EQ(rig.s->stats().resteers, 1u);
  EXPECT_EQ(rig.r->stats().resteers, 1u);
  // The warning says what the datapath knew of the place.
  const std::vector<std::string> w = warns.warnings();
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("no byte arrived in place"), std::string::npos) << w[0];
  EXPECT_NE(w[0].find("(the fake lane swallows its DATA)"), std::string::npos) << w[0];
}

// A packet's first retransmission is mostly a guess on a host that pauses (verbs: a duplicate
// on a lane shifts the rest of the message one request off, and it is copied). It goes the
// common way, where a spurious one is a duplicate like any other; the rest of the message goes
// to the lane. Here the probe: ACKs are lost until a repair arrives.
TEST(ReceiveInPlace, AFirstRetransmissionGoesTheCommonWay) {
  Rig rig;
  rig.dev->hold_acks = true;  // the sender hears nothing until it sends something again
  ASSERT_TRUE(rig.transfer_exact(20'500, 13));
  EXPECT_GT(rig.dev->held_acks, 0);
  const ConnStats s = rig.s->stats();
  ASSERT_GE(s.probes, 1u);
  EXPECT_EQ(s.spurious_probes, s.probes);
  EXPECT_EQ(rig.dev->placed, 21);  // every packet in place, once
  EXPECT_EQ(rig.dev->owned_drops, 0);
  EXPECT_EQ(s.rto_events, 0u);  // the probe fired first, and brought the ACKs back
  const auto& retx = rig.tx->data_retx;
  ASSERT_EQ(retx.size(), 21u + s.probes);
  EXPECT_EQ(static_cast<uint64_t>(std::count(retx.begin(), retx.end(), true)), s.probes);
  expect_repairs_went_the_common_way(*rig.tx);
}

// Lost in mid-message, a packet's place is no longer the lane's (the next packet took its
// request): its first repair, sent the common way on the SACK's word, is taken and copied.
TEST(ReceiveInPlace, APacketLostInMidMessageIsRepairedTheCommonWay) {
  Rig rig;
  rig.dev->lose_data_at = 5;
  ASSERT_TRUE(rig.transfer_exact(20'500, 15));
  EXPECT_EQ(rig.s->stats().rto_events, 0u);
  EXPECT_EQ(rig.dev->owned_drops, 0);
  EXPECT_EQ(rig.dev->placed, 20);  // all but the lost one
  ASSERT_EQ(rig.tx->data_steers.size(), 22u + rig.s->stats().probes);
  expect_repairs_went_the_common_way(*rig.tx);
  EXPECT_EQ(rig.r->stats().data_pkts, 21u);
}

// A tail that was truly lost: its first repair (the probe's) finds the place still owned by the
// lane's request and is dropped there; the next, the retransmission timer's, goes to the lane.
TEST(ReceiveInPlace, ATailTheFirstRepairCannotReachIsRepairedThroughTheLane) {
  Rig rig;
  rig.dev->lose_data_at = 20;  // the last packet of 21, the first time
  ASSERT_TRUE(rig.transfer_exact(20'500, 14));
  const ConnStats s = rig.s->stats();
  ASSERT_GE(s.probes, 1u);
  EXPECT_GE(s.rto_events, 1u);
  EXPECT_EQ(rig.dev->owned_drops, static_cast<int>(s.probes));
  EXPECT_EQ(rig.dev->placed, 21);
  const auto& steer = rig.tx->data_steers;
  ASSERT_GT(steer.size(), 21u);
  EXPECT_EQ(steer.back(), kSteer);  // the repair that completed it
  EXPECT_TRUE(rig.tx->data_retx.back());
}

TEST(ReceiveInPlace, AConnectionClosedWithAReceivePostedClosesItsAim) {
  Rig rig;
  std::vector<uint8_t> dst(20'000);
  FakeRegion region(dst.data(), dst.size());
  Request* rr;
  ASSERT_TRUE(
      rig.r->irecv(dst.data(), dst.size(), MsgDelivery::kAsConnection, &region, &rr).is_ok());
  LaneDevice* dev = rig.dev;
  int closes = 0;
  dev->on_close = [&] { ++closes; };
  rig.r.reset();
  EXPECT_EQ(closes, 1);
}

}  // namespace
}  // namespace optireduce
