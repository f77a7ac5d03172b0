// Zero-copy sends as the transport sees them (issue 16): a send posted with a registration names
// it, and its fence, in every DATA TxPacket, one without names nothing, and no send is reported
// done while the datapath still holds a fence of its buffer (a device reading it), exact or
// bounded. The datapath here is the in-memory link behind a wrapper that plays a device: it holds
// the fence of every packet it takes from a registered buffer until the test lets it go.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "tests/unit/device_doubles.h"
#include "tests/unit/drive_pair.h"
#include "tests/unit/mem_link.h"
#include "tests/unit/pattern.h"
#include "transport/recv.h"
#include "transport/send.h"
#include "transport/wire.h"

namespace optireduce {
namespace {

using testing::FakeRegion;
using testing::ForwardingEndpoint;
using testing::make_mem_pair;
using testing::MemEndpoint;
using testing::pattern;

constexpr uint32_t kDgram = 1048;  // 1000-byte payloads: many packets from small messages

// What one tx_burst entry carried.
struct Seen {
  PacketType type;
  const MemoryRegion* mr;
  TxFence* fence;
  const void* payload;
  uint32_t payload_len;
};

// The sender's datapath: the in-memory link (which copies what it takes, so the receiver gets
// the bytes) plus a device's view of zero copy: every packet with a region and a fence holds the
// fence until complete() (its send completion), as the verbs endpoint does.
class DeviceEndpoint final : public ForwardingEndpoint {
 public:
  using ForwardingEndpoint::ForwardingEndpoint;
  ~DeviceEndpoint() override { complete(); }

  int tx_burst(const TxPacket* pkts, int n) override {
    const int k = ForwardingEndpoint::tx_burst(pkts, n);
    for (int i = 0; i < k; ++i) {
      PacketHeader h;
      (void)testing::tx_header(pkts[i], &h);
      seen.push_back({h.type, pkts[i].payload_mr, pkts[i].payload_fence, pkts[i].payload,
                      pkts[i].payload_len});
      if (pkts[i].payload_mr != nullptr && pkts[i].payload_fence != nullptr) {
        pkts[i].payload_fence->hold();
        held_.push_back(pkts[i].payload_fence);
      }
    }
    return k;
  }
  int rx_burst(RxPacket* pkts, int max) override {
    if (complete_on_rx) complete();
    return ForwardingEndpoint::rx_burst(pkts, max);
  }

  // Every send posted so far completes.
  void complete() {
    for (TxFence* f : held_) f->release();
    held_.clear();
  }
  size_t held() const { return held_.size(); }

  std::vector<Seen> seen;
  bool complete_on_rx = true;  // completions are reaped on every receive call (a fast device)

 private:
  std::vector<TxFence*> held_;
};

struct Rig {
  FakeClock clock;
  Config cfg;
  DeviceEndpoint* dev = nullptr;
  MemEndpoint* tx_link = nullptr;  // the link under the sender's datapath (its loss policy)
  std::unique_ptr<SendConn> s;
  std::unique_ptr<RecvConn> r;

  explicit Rig(Delivery d = Delivery::kExact) {
    cfg.timeout_ms = 50;
    auto p = make_mem_pair(kDgram, &clock, 0);
    tx_link = p.a.get();
    auto ep = std::make_unique<DeviceEndpoint>(std::move(p.a));
    dev = ep.get();
    ConnParams cp;
    cp.token = 0x5EED;
    cp.pkt_payload = payload_for_datagram(kDgram);
    cp.peer_window = 256 * 1024;
    cp.delivery = d;
    s = std::make_unique<SendConn>(cfg, clock, std::move(ep), cp, nullptr);
    r = std::make_unique<RecvConn>(cfg, clock, std::move(p.b), cp, nullptr);
  }

  bool run(Request* sr, Request* rr, int rounds = 20000) {
    return testing::drive_pair(*s, *r, clock, sr, rr, rounds);
  }

  // A receive into `dst` and a send of `src` from `region`.
  void post(const std::vector<uint8_t>& src, std::vector<uint8_t>& dst, const MemoryRegion* region,
            Request** sr, Request** rr) {
    ASSERT_TRUE(r->irecv(dst.data(), dst.size(), rr).is_ok());
    ASSERT_TRUE(s->isend(src.data(), src.size(), MsgDelivery::kAsConnection, region, sr).is_ok());
  }

  // Both requests tested `steps` times, `step_us` apart, the send never done meanwhile (the
  // device holds its buffer); *rd says whether the receive ended.
  void step_with_send_held(Request* sr, Request* rr, int steps, uint64_t step_us, bool* rd) {
    bool sd = false;
    size_t sz = 0;
    for (int i = 0; i < steps; ++i) {
      ASSERT_TRUE(s->test(sr, &sd, &sz).is_ok());
      if (!*rd) {
        ASSERT_TRUE(r->test(rr, rd, &sz).is_ok());
      }
      ASSERT_FALSE(sd) << "reported done while the device held " << dev->held() << " posts";
      clock.advance_us(step_us);
    }
  }
};

TEST(ZeroCopySend, EveryDataPacketNamesTheRegionAndItsFence) {
  Rig rig;
  auto src = pattern(12'345, 3);
  FakeRegion region(src.data(), src.size());
  std::vector<uint8_t> dst(src.size());
  Request *sr, *rr;
  ASSERT_NO_FATAL_FAILURE(rig.post(src, dst, &region, &sr, &rr));
  ASSERT_TRUE(rig.run(sr, rr));
  EXPECT_EQ(dst, src);
  int data = 0;
  TxFence* fence = nullptr;
  for (const Seen& p : rig.dev->seen) {
    if (p.type != PacketType::kData) {
      // Control packets (the CLOSE, here) come from the connection's own memory.
      EXPECT_EQ(p.mr, nullptr);
      EXPECT_EQ(p.fence, nullptr);
      continue;
    }
    ++data;
    EXPECT_EQ(p.mr, &region);
    ASSERT_NE(p.fence, nullptr);
    if (fence == nullptr) fence = p.fence;
    EXPECT_EQ(p.fence, fence) << "one message, one fence";
    EXPECT_TRUE(region.contains(p.payload, p.payload_len));
  }
  EXPECT_EQ(data, 13);
}

TEST(ZeroCopySend, SendsWithoutARegionNameNoneAndStillArrive) {
  Rig rig;
  for (size_t size : {size_t{0}, size_t{1}, size_t{4000}, size_t{1} << 16}) {
    auto src = pattern(size, 7);
    std::vector<uint8_t> dst(size + 8, 0xEE);
    Request *sr, *rr;
    ASSERT_TRUE(rig.r->irecv(dst.data(), dst.size(), &rr).is_ok());
    ASSERT_TRUE(rig.s->isend(src.data(), size, &sr).is_ok());
    ASSERT_TRUE(rig.run(sr, rr)) << size;
    EXPECT_TRUE(std::equal(src.begin(), src.end(), dst.begin())) << size;
  }
  ASSERT_FALSE(rig.dev->seen.empty());
  for (const Seen& p : rig.dev->seen) {
    EXPECT_EQ(p.mr, nullptr);
    EXPECT_EQ(p.fence, nullptr);
  }
  EXPECT_EQ(rig.dev->held(), 0u);
}

// The receiver acknowledged every packet, yet the device still reads the buffer (a
// retransmission's post, say): the send is not done, nor its slot free, until it completes.
TEST(ZeroCopySend, AnExactSendIsNotDoneWhileTheDeviceReadsItsBuffer) {
  Rig rig;
  rig.dev->complete_on_rx = false;
  auto src = pattern(5'000, 4);
  FakeRegion region(src.data(), src.size());
  std::vector<uint8_t> dst(src.size());
  Request *sr, *rr;
  ASSERT_NO_FATAL_FAILURE(rig.post(src, dst, &region, &sr, &rr));
  bool rd = false;
  ASSERT_NO_FATAL_FAILURE(rig.step_with_send_held(sr, rr, 200, 100, &rd));
  ASSERT_TRUE(rd);
  EXPECT_EQ(dst, src);
  EXPECT_EQ(rig.s->inflight_bytes(), 0u) << "every packet is acknowledged";
  EXPECT_EQ(rig.dev->held(), 5u);
  rig.dev->complete();
  bool sd = false;
  size_t sz = 0;
  ASSERT_TRUE(rig.s->test(sr, &sd, &sz).is_ok());
  EXPECT_TRUE(sd);
  EXPECT_EQ(sz, src.size());
}

// A bounded send ends at the receiver's deadline with packets never acknowledged, some still
// posted: the buffer is not handed back while they are.
TEST(ZeroCopySend, ABoundedSendCutAtItsDeadlineWaitsForItsPostedSends) {
  Rig rig(Delivery::kBounded);
  rig.dev->complete_on_rx = false;
  // Every odd packet is lost, repairs included: only the deadline ends the step.
  rig.tx_link->policy = testing::drop_where([](const PacketHeader& h) {
    return h.type == PacketType::kData && (h.offset / 1000) % 2 == 1;
  });
  auto src = pattern(10'000, 9);
  FakeRegion region(src.data(), src.size());
  std::vector<uint8_t> dst(src.size());
  Request *sr, *rr;
  ASSERT_NO_FATAL_FAILURE(rig.post(src, dst, &region, &sr, &rr));
  bool rd = false;
  ASSERT_NO_FATAL_FAILURE(rig.step_with_send_held(sr, rr, 60, 1000, &rd));
  ASSERT_TRUE(rd) << "the receive ends at its 50 ms deadline";
  EXPECT_EQ(rig.s->stats().cut_sends, 1u) << "the protocol is done with the send";
  ASSERT_GT(rig.dev->held(), 0u);
  bool sd = true;
  size_t sz = 0;
  ASSERT_TRUE(rig.s->test(sr, &sd, &sz).is_ok());
  EXPECT_FALSE(sd);
  rig.dev->complete();
  ASSERT_TRUE(rig.s->test(sr, &sd, &sz).is_ok());
  EXPECT_TRUE(sd);
}

// A connection closed while the device still reads a buffer: its fences are left to the
// datapath, which releases them later (here, the endpoint's destructor) without a fault.
TEST(ZeroCopySend, ClosingWithPostsOutstandingLeavesTheFencesValid) {
  Rig rig;
  rig.dev->complete_on_rx = false;
  auto src = pattern(3'000, 5);
  FakeRegion region(src.data(), src.size());
  std::vector<uint8_t> dst(src.size());
  Request *sr, *rr;
  ASSERT_NO_FATAL_FAILURE(rig.post(src, dst, &region, &sr, &rr));
  ASSERT_GT(rig.dev->held(), 0u);
  // The endpoint, and with it the device, go with the connection: its destructor releases
  // every fence after the connection's own destructor ran (ASan: no use after free).
  rig.s.reset();
}

}  // namespace
}  // namespace optireduce
