// Unit tests of the verbs datapath's pure logic, runnable on any host (no RDMA device): the
// PeerAddress encoding, GID choice, GRH parsing, ring layout and index arithmetic, the
// OPTIREDUCE_IB_HCA filter, port speed, the dlopen loader's failure paths, the datapath
// selector's fallback to UDP, and the lanes' worker thread with stand-in flushes.
#include <gtest/gtest.h>

#include <arpa/inet.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "verbs/address.h"
#include "verbs/device.h"
#include "verbs/ibv_symbols.h"
#include "verbs/lane_worker.h"
#include "verbs/ring.h"
#include "verbs/select.h"

namespace optireduce::verbs {
namespace {

GidEntry entry(uint32_t index, const char* ip6, GidType type) {
  GidEntry e;
  e.index = index;
  EXPECT_EQ(inet_pton(AF_INET6, ip6, e.gid), 1) << ip6;
  e.type = type;
  return e;
}

TEST(EncodeAddress, RoundTrips) {
  UdAddress a;
  ASSERT_EQ(inet_pton(AF_INET6, "::ffff:10.77.0.2", a.gid), 1);
  a.qpn = 0xABCDEF;
  a.qkey = kDefaultQKey;
  a.lid = 0x1234;
  const PeerAddress p = encode_address(a);
  EXPECT_EQ(p.kind, kUdAddressKind);
  EXPECT_EQ(p.len, kUdAddressBytes);
  UdAddress b;
  ASSERT_TRUE(decode_address(p, &b));
  EXPECT_EQ(a, b);
  EXPECT_EQ(p, encode_address(b));
}

TEST(EncodeAddress, IsBigEndianOnTheWire) {
  UdAddress a;
  a.qpn = 0x000102;
  a.qkey = 0x4F525544;
  const PeerAddress p = encode_address(a);
  const uint8_t want[] = {0x00, 0x00, 0x01, 0x02, 0x4F, 0x52, 0x55, 0x44};
  EXPECT_EQ(std::memcmp(p.data + 16, want, sizeof(want)), 0);
}

TEST(DecodeAddress, RejectsForeignAndMalformed) {
  UdAddress a;
  a.qpn = 17;
  PeerAddress p = encode_address(a);
  UdAddress out;
  PeerAddress udp = p;
  udp.kind = 1;
  EXPECT_FALSE(decode_address(udp, &out));
  PeerAddress shortp = p;
  shortp.len = 10;
  EXPECT_FALSE(decode_address(shortp, &out));
  a.qpn = 0;  // QP0 is never a UD data QP
  EXPECT_FALSE(decode_address(encode_address(a), &out));
  a.qpn = 1u << 24;  // QPNs are 24 bits
  EXPECT_FALSE(decode_address(encode_address(a), &out));
  EXPECT_FALSE(decode_address(PeerAddress(), &out));
}

TEST(FormatAddress, ShowsIpv4MappedGid) {
  UdAddress a;
  ASSERT_EQ(inet_pton(AF_INET6, "::ffff:10.77.0.1", a.gid), 1);
  a.qpn = 17;
  a.qkey = 0x10;
  EXPECT_EQ(format_address(a), "gid ::ffff:10.77.0.1 qpn 17 qkey 0x10 lid 0");
}

TEST(FormatPeerAddress, FormatsUdAddressesOnly) {
  UdAddress a;
  ASSERT_EQ(inet_pton(AF_INET6, "::ffff:10.77.0.2", a.gid), 1);
  a.qpn = 0x1a2;
  a.qkey = kDefaultQKey;
  const PeerAddress p = encode_address(a);
  EXPECT_EQ(format_peer_address(p), "gid ::ffff:10.77.0.2 qpn 418 qkey 0x4f525544 lid 0");
  EXPECT_EQ(format_peer_gid(p), "::ffff:10.77.0.2");
  PeerAddress udp = p;  // what a shared endpoint may be asked about: not ours, so no text
  udp.kind = 1;
  EXPECT_EQ(format_peer_address(udp), "");
  EXPECT_EQ(format_peer_gid(udp), "");
  EXPECT_EQ(format_peer_address(PeerAddress()), "");
  EXPECT_EQ(format_peer_gid(PeerAddress()), "");
}

TEST(ParseGidType, ReadsSysfsText) {
  EXPECT_EQ(parse_gid_type("RoCE v2\n"), GidType::kRoceV2);
  EXPECT_EQ(parse_gid_type("IB/RoCE v1\n"), GidType::kRoceV1);
  EXPECT_EQ(parse_gid_type(""), GidType::kUnknown);
  EXPECT_EQ(parse_gid_type("something else"), GidType::kUnknown);
}

TEST(ChooseGidIndex, PrefersRoceV2Ipv4) {
  // The table a RoCE NIC with one IPv4 and one link-local IPv6 address shows: every address
  // once per RoCE version.
  const GidEntry t[] = {
      entry(0, "fe80::1", GidType::kRoceV1),         entry(1, "fe80::1", GidType::kRoceV2),
      entry(2, "::ffff:10.0.0.5", GidType::kRoceV1), entry(3, "::ffff:10.0.0.5", GidType::kRoceV2),
      entry(4, "2001:db8::5", GidType::kRoceV2),
  };
  EXPECT_EQ(choose_gid_index(t, 5, true, -1), 3);
  EXPECT_EQ(choose_gid_index(t, 3, true, -1), 1);  // no IPv4: v2 link-local beats v1
  EXPECT_EQ(choose_gid_index(t + 4, 1, true, -1), 4);
  const GidEntry g[] = {entry(1, "fe80::1", GidType::kRoceV2),
                        entry(2, "2001:db8::5", GidType::kRoceV2)};
  EXPECT_EQ(choose_gid_index(g, 2, true, -1), 2);  // global IPv6 beats link-local
}

TEST(ChooseGidIndex, LowestIndexAmongEquals) {
  const GidEntry t[] = {entry(7, "::ffff:10.0.0.6", GidType::kRoceV2),
                        entry(5, "::ffff:10.0.0.5", GidType::kRoceV2)};
  EXPECT_EQ(choose_gid_index(t, 2, true, -1), 5);
}

TEST(ChooseGidIndex, OverrideMustNameANonZeroEntry) {
  const GidEntry t[] = {entry(0, "fe80::1", GidType::kRoceV1), entry(1, "::", GidType::kRoceV2),
                        entry(3, "::ffff:10.0.0.5", GidType::kRoceV2)};
  EXPECT_EQ(choose_gid_index(t, 3, true, 0), 0);   // the user's choice wins over the ranking
  EXPECT_EQ(choose_gid_index(t, 3, true, 1), -1);  // empty entry
  EXPECT_EQ(choose_gid_index(t, 3, true, 9), -1);  // absent
}

TEST(ChooseGidIndex, InfiniBandTakesThePortGid) {
  const GidEntry t[] = {entry(0, "fe80::2:c903:1", GidType::kIb),
                        entry(1, "fe80::2:c903:2", GidType::kIb)};
  EXPECT_EQ(choose_gid_index(t, 2, false, -1), 0);
  EXPECT_EQ(choose_gid_index(t, 0, false, -1), -1);
}

TEST(GrhSourceGid, ReadsIpv4HeaderOfRoceV2) {
  // RoCE v2 over IPv4: 20 undefined bytes, then the IPv4 header (source at offset 12).
  uint8_t grh[kGrhBytes] = {};
  const uint8_t ip[20] = {0x45, 0, 0, 60, 0, 0, 0x40, 0, 64, 17, 0, 0, 10, 77, 0, 2, 10, 77, 0, 1};
  std::memcpy(grh + 20, ip, 20);
  uint8_t gid[16];
  ASSERT_TRUE(grh_source_gid(grh, gid));
  uint8_t want[16];
  ASSERT_EQ(inet_pton(AF_INET6, "::ffff:10.77.0.2", want), 1);
  EXPECT_EQ(std::memcmp(gid, want, 16), 0);
}

TEST(GrhSourceGid, ReadsIpv6Grh) {
  uint8_t grh[kGrhBytes] = {};
  grh[0] = 0x60;  // IP version 6
  uint8_t sgid[16], dgid[16];
  ASSERT_EQ(inet_pton(AF_INET6, "fe80::2:c903:1", sgid), 1);
  ASSERT_EQ(inet_pton(AF_INET6, "fe80::2:c903:2", dgid), 1);
  std::memcpy(grh + 8, sgid, 16);
  std::memcpy(grh + 24, dgid, 16);
  uint8_t gid[16];
  ASSERT_TRUE(grh_source_gid(grh, gid));
  EXPECT_EQ(std::memcmp(gid, sgid, 16), 0);
}

TEST(GrhSourceGid, RejectsNeither) {
  uint8_t grh[kGrhBytes] = {};
  uint8_t gid[16];
  EXPECT_FALSE(grh_source_gid(grh, gid));
}

TEST(RecvSlotLayout, PayloadIsCacheLineAligned) {
  for (uint32_t cap : {256u, 512u, 1000u, 1024u, 2048u, 4096u}) {
    const RecvSlotLayout l = recv_slot_layout(cap);
    EXPECT_EQ(l.payload_offset % kCacheLineBytes, 0u) << cap;
    EXPECT_EQ(l.stride_bytes % kCacheLineBytes, 0u) << cap;
    EXPECT_EQ(l.grh_offset + kGrhBytes, l.payload_offset) << cap;
    EXPECT_EQ(l.sge_bytes, kGrhBytes + cap) << cap;
    EXPECT_GE(l.stride_bytes, l.grh_offset + l.sge_bytes) << cap;  // slots never overlap
  }
  EXPECT_EQ(recv_slot_layout(4096).stride_bytes, 4160u);
}

TEST(RingSlots, CoversTheBudgetWithinBounds) {
  EXPECT_EQ(ring_slots(8u << 20, 4096, 256, 16384), 2048u);
  EXPECT_EQ(ring_slots(8u << 20, 1024, 256, 16384), 8192u);
  EXPECT_EQ(ring_slots(8u << 20, 256, 256, 16384), 16384u);  // clamped high
  EXPECT_EQ(ring_slots(1024, 4096, 256, 16384), 256u);       // clamped low
  EXPECT_EQ(ring_slots(8u << 20, 1024, 256, 5000), 4096u);   // device limit, rounded down
  EXPECT_EQ(ring_slots(3 * 4096, 4096, 1, 1024), 4u);
}

TEST(RecvRingSlots, UnboundTakesTheLargestRing) {
  // Bound: the socket-buffer budget, as ring_slots.
  EXPECT_EQ(recv_ring_slots(8u << 20, 4096, false, 256, 16384), 2048u);
  EXPECT_EQ(recv_ring_slots(1024, 1024, false, 256, 16384), 256u);
  // Unbound: the endpoint's maximum whatever the budget, within the device's limit.
  EXPECT_EQ(recv_ring_slots(8u << 20, 4096, true, 256, 16384), 16384u);
  EXPECT_EQ(recv_ring_slots(1024, 1024, true, 256, 16384), 16384u);
  EXPECT_EQ(recv_ring_slots(0, 4096, true, 256, 16384), 16384u);
  EXPECT_EQ(recv_ring_slots(8u << 20, 4096, true, 256, 5000), 4096u);
  // A budget beyond the maximum is clamped the same either way.
  EXPECT_EQ(recv_ring_slots(uint64_t{1} << 40, 4096, true, 256, 16384), 16384u);
  EXPECT_EQ(recv_ring_slots(uint64_t{1} << 40, 4096, false, 256, 16384), 16384u);
}

TEST(VerbsDevice, CanShare) {
  // The engine shares one unbound endpoint per device and thread only where this says so.
  VerbsDevice d(nullptr, DeviceInfo{});
  EXPECT_TRUE(d.can_share());
}

TEST(RingSlot, WrapsFreeRunningSequences) {
  EXPECT_EQ(ring_slot(0, 256), 0u);
  EXPECT_EQ(ring_slot(255, 256), 255u);
  EXPECT_EQ(ring_slot(256, 256), 0u);
  EXPECT_EQ(ring_slot((uint64_t{1} << 40) + 3, 256), 3u);
}

TEST(SignalWr, OnePerGroupClosingIt) {
  int signaled = 0;
  for (uint64_t s = 0; s < 320; s++) signaled += signal_wr(s, 32);
  EXPECT_EQ(signaled, 10);
  EXPECT_FALSE(signal_wr(0, 32));
  EXPECT_TRUE(signal_wr(31, 32));
  EXPECT_TRUE(signal_wr(63, 32));
}

// NCCL_IB_HCA's syntax: prefixes unless '=', '^' inverts, ':port' narrows an item to a port.
TEST(HcaSelected, ReadsNcclIbHcaSyntax) {
  EXPECT_TRUE(hca_selected("", "mlx5_0", 1));
  EXPECT_TRUE(hca_selected("mlx5_0,mlx5_1", "mlx5_1", 1));
  EXPECT_TRUE(hca_selected("mlx5_0,mlx5_1", "mlx5_10", 1));  // a prefix, as NCCL reads it
  EXPECT_FALSE(hca_selected("=mlx5_0,mlx5_1", "mlx5_10", 1));
  EXPECT_TRUE(hca_selected("=mlx5_0, mlx5_1", "mlx5_1", 2));
  EXPECT_FALSE(hca_selected("mlx5_0,mlx5_1", "bnxt_re0", 1));
  EXPECT_TRUE(hca_selected("rxe0:1", "rxe0", 1));
  EXPECT_FALSE(hca_selected("rxe0:2", "rxe0", 1));
  EXPECT_TRUE(hca_selected("^mlx5_bond", "mlx5_0", 1));
  EXPECT_FALSE(hca_selected("^mlx5_bond", "mlx5_bond_0", 1));
  EXPECT_FALSE(hca_selected("^=mlx5_0:1", "mlx5_0", 1));
  EXPECT_TRUE(hca_selected("^=mlx5_0:1", "mlx5_0", 2));
  EXPECT_TRUE(hca_selected("^=mlx5_0:1", "mlx5_00", 1));
  for (const char* bad : {"rxe0:x", "rxe0:0", "rxe0:256", ":1", "=^rxe0", "rxe0:1:2"})
    EXPECT_FALSE(hca_selected(bad, "rxe0", 1)) << bad;
}

// The address handles a port makes carry its traffic class and service level (NCCL_IB_TC and
// NCCL_IB_SL's, where a lossless fabric keys its PFC priority), and one per peer is cached.
ibv_ah_attr g_ah_attr;
int g_ahs_made = 0;
alignas(8) char g_ah_storage[64];

TEST(PortContext, AddressHandlesCarryTheTrafficClassAndServiceLevel) {
  IbvSymbols ibv;
  ibv.create_ah = [](ibv_pd*, ibv_ah_attr* attr) {
    g_ah_attr = *attr;
    ++g_ahs_made;
    return reinterpret_cast<ibv_ah*>(g_ah_storage);
  };
  ibv.destroy_ah = [](ibv_ah*) { return 0; };
  ibv.dealloc_pd = [](ibv_pd*) { return 0; };
  ibv.close_device = [](ibv_context*) { return 0; };
  PortContext pc(&ibv, nullptr, nullptr);
  pc.port = 2;
  pc.gid_index = 3;
  pc.traffic_class = 106;
  pc.service_level = 5;
  UdAddress peer;
  for (int i = 0; i < 16; ++i) peer.gid[i] = static_cast<uint8_t>(i + 1);
  peer.lid = 7;
  ibv_ah* ah = nullptr;
  ASSERT_TRUE(pc.address_handle(peer, &ah));
  EXPECT_EQ(g_ah_attr.is_global, 1);
  EXPECT_EQ(g_ah_attr.grh.traffic_class, 106);
  EXPECT_EQ(g_ah_attr.sl, 5);
  EXPECT_EQ(g_ah_attr.grh.sgid_index, 3);
  EXPECT_EQ(g_ah_attr.port_num, 2);
  EXPECT_EQ(g_ah_attr.dlid, 7);
  EXPECT_EQ(std::memcmp(g_ah_attr.grh.dgid.raw, peer.gid, 16), 0);
  ASSERT_TRUE(pc.address_handle(peer, &ah));
  EXPECT_EQ(g_ahs_made, 1);
}

TEST(PortSpeedMbps, MultipliesLaneRateByWidth) {
  EXPECT_EQ(port_speed_mbps(32, 2), 100000);    // EDR 4x
  EXPECT_EQ(port_speed_mbps(64, 2), 200000);    // HDR 4x
  EXPECT_EQ(port_speed_mbps(1, 1), 2500);       // SDR 1x (what rxe reports for unknown links)
  EXPECT_EQ(port_speed_mbps(8, 2), 40000);      // FDR10 4x
  EXPECT_EQ(port_speed_mbps(16, 2), 56000);     // FDR 4x
  EXPECT_EQ(port_speed_mbps(128, 2), 400000);   // NDR 4x
  EXPECT_EQ(port_speed_mbps(128, 16), 200000);  // NDR 2x
  EXPECT_EQ(port_speed_mbps(32, 8), 300000);    // EDR 12x
}

TEST(PortSpeedMbps, KnowsXdr) {
  // XDR is 200 Gbit/s a lane (NCCL's table says the same); its code, 256, only ever comes in
  // active_speed_ex.
  EXPECT_EQ(port_speed_mbps(256, 2), 800000);   // XDR 4x
  EXPECT_EQ(port_speed_mbps(256, 16), 400000);  // XDR 2x
  EXPECT_EQ(port_speed_mbps(256, 1), 200000);
}

TEST(PortSpeedMbps, UnknownCodesAreZeroNotAGuess) {
  EXPECT_EQ(port_speed_mbps(3, 2), 0);    // not a speed code
  EXPECT_EQ(port_speed_mbps(512, 2), 0);  // a speed after XDR
  EXPECT_EQ(port_speed_mbps(0, 2), 0);    // no code at all
  EXPECT_EQ(port_speed_mbps(32, 3), 0);   // not a width code
  EXPECT_EQ(port_speed_mbps(32, 0), 0);
}

TEST(LoadIbvSymbols, MissingLibraryIsACleanError) {
  IbvSymbols s;
  std::string err;
  const Status st = load_ibv_symbols("liboptireduce-no-such-verbs.so.1", &s, &err);
  EXPECT_EQ(st.code(), Errc::kSystem);
  EXPECT_EQ(st.sys_errno(), ENOENT);
  EXPECT_NE(err.find("liboptireduce-no-such-verbs.so.1"), std::string::npos) << err;
  EXPECT_EQ(s.get_device_list, nullptr);
}

TEST(LoadIbvSymbols, LibraryWithoutVerbsIsACleanError) {
  IbvSymbols s;
  std::string err;
  const Status st = load_ibv_symbols("libc.so.6", &s, &err);
  EXPECT_EQ(st.sys_errno(), ENOSYS);
  EXPECT_NE(err.find("ibv_get_device_list"), std::string::npos) << err;
}

TEST(IbvSymbols, LoadsTheSystemLibraryWhenInstalled) {
  std::string err;
  const IbvSymbols* s = ibv_symbols(&err);
  if (s == nullptr) GTEST_SKIP() << "no libibverbs.so.1 here: " << err;
  EXPECT_NE(s->get_device_list, nullptr);
  EXPECT_NE(s->create_ah, nullptr);
}

TEST(OpenDatapathDevices, FallsBackToUdpWithoutRdma) {
  Config cfg;
  std::vector<std::unique_ptr<Device>> rdma;
  const Status vst = open_verbs_devices(cfg, &rdma);
  if (vst.is_ok() && !rdma.empty()) GTEST_SKIP() << "this host has an active RDMA port";
  cfg.ifname = "lo";
  std::vector<std::unique_ptr<Device>> devs;
  ASSERT_TRUE(open_datapath_devices(cfg, &devs).is_ok());
  ASSERT_FALSE(devs.empty());
  EXPECT_EQ(devs[0]->info().name, "lo");
  cfg.datapath = DatapathChoice::kVerbs;
  devs.clear();
  EXPECT_EQ(open_datapath_devices(cfg, &devs).code(), Errc::kInvalidUsage);
  EXPECT_TRUE(devs.empty());
}

// A stand-in for a lane's flush: records the thread that ran it, and can be held until the
// test lets it finish.
class FakeFlush final : public Flushable {
 public:
  void flush_now() override {
    ran_on = std::this_thread::get_id();
    started.store(true);
    while (hold.load()) std::this_thread::yield();
    done.store(true);
  }
  std::atomic<bool> started{false};
  std::atomic<bool> hold{false};
  std::atomic<bool> done{false};
  std::thread::id ran_on;
};

bool wait_done(const FakeFlush& f) {
  for (const auto t0 = std::chrono::steady_clock::now();
       std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10);)
    if (f.done.load()) return true;
  return f.done.load();
}

TEST(LaneWorker, FlushesRunOnItsThreadNotTheCallers) {
  LaneWorker w;
  FakeFlush a, b;
  ASSERT_TRUE(w.submit(&a));
  ASSERT_TRUE(w.submit(&b));
  ASSERT_TRUE(wait_done(a));
  ASSERT_TRUE(wait_done(b));
  EXPECT_NE(a.ran_on, std::this_thread::get_id());
  EXPECT_EQ(a.ran_on, b.ran_on);  // one thread per endpoint
}

TEST(LaneWorker, ItsQueueIsBoundedAndAShutdownRunsWhatIsQueued) {
  LaneWorker w;
  FakeFlush first;
  first.hold.store(true);  // keeps the thread busy: what follows stays queued
  ASSERT_TRUE(w.submit(&first));
  for (int spins = 0; !first.started.load() && spins < 10'000'000; spins++)
    std::this_thread::yield();
  ASSERT_TRUE(first.started.load());
  FakeFlush queued[LaneWorker::kMaxFlushes];
  for (auto& q : queued) ASSERT_TRUE(w.submit(&q));
  FakeFlush extra;
  EXPECT_FALSE(w.submit(&extra)) << "one more than the queue holds";
  std::thread release([&first] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    first.hold.store(false);
  });
  w.shutdown();
  release.join();
  EXPECT_TRUE(first.done.load());
  for (auto& q : queued) EXPECT_TRUE(q.done.load()) << "a queued flush was dropped";
  EXPECT_FALSE(w.submit(&extra)) << "nothing is taken after the shutdown";
}

}  // namespace
}  // namespace optireduce::verbs
