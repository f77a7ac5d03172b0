// Tests of udp/device.cc: interface selection (on synthetic hosts and on this one, loopback
// only) and what a device reports.
#include "udp/device.h"

#include <arpa/inet.h>
#include <net/if.h>
#include <netinet/in.h>

#include <cstring>

#include <gtest/gtest.h>

#include "udp/endpoint.h"

namespace optireduce {
namespace {

UdpInterface make_itf(const char* name, unsigned flags, const char* ipv4) {
  UdpInterface itf;
  itf.name = name;
  itf.flags = flags;
  if (ipv4 != nullptr) {
    auto* a = reinterpret_cast<sockaddr_in*>(&itf.addr);
    a->sin_family = AF_INET;
    inet_pton(AF_INET, ipv4, &a->sin_addr);
  }
  return itf;
}

constexpr unsigned kUp = IFF_UP | IFF_RUNNING;

TEST(OpenUdpDevices, LoopbackByName) {
  Config cfg;
  cfg.ifname = "lo";
  std::vector<std::unique_ptr<Device>> devs;
  ASSERT_TRUE(open_udp_devices(cfg, &devs));
  ASSERT_EQ(devs.size(), 1u);
  const DeviceInfo& info = devs[0]->info();
  EXPECT_EQ(info.name, "lo");
  EXPECT_TRUE(info.pci_path.empty());  // loopback has no /sys/class/net/lo/device
  EXPECT_GT(info.speed_mbps, 0);
  EXPECT_GE(info.mtu, 1500u);
  EXPECT_NE(info.guid, 0u);

  // The GUID is a function of the interface alone: equal on a second discovery.
  std::vector<std::unique_ptr<Device>> again;
  ASSERT_TRUE(open_udp_devices(cfg, &again));
  EXPECT_EQ(again[0]->info().guid, info.guid);
}

TEST(OpenUdpDevices, LoopbackEndpointIsOn127001) {
  Config cfg;
  cfg.ifname = "lo";
  std::vector<std::unique_ptr<Device>> devs;
  ASSERT_TRUE(open_udp_devices(cfg, &devs));
  std::unique_ptr<Endpoint> ep;
  ASSERT_TRUE(devs[0]->open_endpoint(EndpointOptions{}, &ep));
  sockaddr_storage sa;
  socklen_t len;
  ASSERT_TRUE(udp_sockaddr(ep->local_address(), &sa, &len));
  ASSERT_EQ(sa.ss_family, AF_INET);
  const auto* in = reinterpret_cast<const sockaddr_in*>(&sa);
  EXPECT_EQ(ntohl(in->sin_addr.s_addr), INADDR_LOOPBACK);
  EXPECT_NE(in->sin_port, 0);
  // lo's MTU (65536 by default) allows the largest UDP payload there is.
  if (devs[0]->info().mtu >= 65536) {
    EXPECT_EQ(ep->max_datagram_bytes(), kMaxUdpPayloadBytes);
  }
}

TEST(OpenUdpDevices, UnknownNameIsInvalidUsage) {
  Config cfg;
  cfg.ifname = "nosuchif0";
  std::vector<std::unique_ptr<Device>> devs;
  const Status s = open_udp_devices(cfg, &devs);
  EXPECT_EQ(s.code(), Errc::kInvalidUsage);
  EXPECT_TRUE(devs.empty());

  cfg.ifname = "lo,nosuchif0";
  EXPECT_EQ(open_udp_devices(cfg, &devs).code(), Errc::kInvalidUsage);
}

TEST(OpenUdpDevices, DefaultFindsAnInterface) {
  // Only discovery: nothing is sent on whatever interface this host picks.
  std::vector<std::unique_ptr<Device>> devs;
  ASSERT_TRUE(open_udp_devices(Config{}, &devs));
  EXPECT_EQ(devs.size(), 1u);
}

TEST(ListUdpInterfaces, IncludesLoopbackWithIpv4) {
  std::vector<UdpInterface> all;
  ASSERT_TRUE(list_udp_interfaces(&all));
  bool found = false;
  for (const auto& itf : all) {
    if (itf.name != "lo") continue;
    found = true;
    EXPECT_TRUE(itf.flags & IFF_LOOPBACK);
    EXPECT_EQ(itf.addr.ss_family, AF_INET);  // IPv4 is preferred over ::1
  }
  EXPECT_TRUE(found);
}

TEST(SelectUdpInterfaces, DefaultPrefersRunningNonLoopback) {
  const std::vector<UdpInterface> host = {
      make_itf("lo", kUp | IFF_LOOPBACK, "127.0.0.1"),
      make_itf("eth0", IFF_UP, "10.0.0.1"),  // up, no carrier
      make_itf("eth1", kUp, nullptr),        // no address
      make_itf("eth2", kUp, "10.0.2.1"),
      make_itf("eth3", kUp, "10.0.3.1"),
  };
  std::vector<UdpInterface> out;
  ASSERT_TRUE(select_udp_interfaces(host, "", &out));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].name, "eth2");
}

TEST(SelectUdpInterfaces, DefaultFallsBackToLoopback) {
  const std::vector<UdpInterface> host = {
      make_itf("eth0", 0, "10.0.0.1"),
      make_itf("lo", kUp | IFF_LOOPBACK, "127.0.0.1"),
  };
  std::vector<UdpInterface> out;
  ASSERT_TRUE(select_udp_interfaces(host, "", &out));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].name, "lo");
}

TEST(SelectUdpInterfaces, NoUsableInterface) {
  const std::vector<UdpInterface> host = {make_itf("eth0", 0, "10.0.0.1")};
  std::vector<UdpInterface> out;
  EXPECT_EQ(select_udp_interfaces(host, "", &out).code(), Errc::kSystem);
}

TEST(SelectUdpInterfaces, NamedListKeepsOrderAndSkipsRepeats) {
  const std::vector<UdpInterface> host = {
      make_itf("lo", kUp | IFF_LOOPBACK, "127.0.0.1"),
      make_itf("eth0", kUp, "10.0.0.1"),
      make_itf("eth1", kUp, "10.0.1.1"),
  };
  std::vector<UdpInterface> out;
  ASSERT_TRUE(select_udp_interfaces(host, " eth1, lo,eth1,", &out));
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].name, "eth1");
  EXPECT_EQ(out[1].name, "lo");
}

TEST(SelectUdpInterfaces, NamedDownOrAddresslessIsInvalidUsage) {
  const std::vector<UdpInterface> host = {
      make_itf("eth0", 0, "10.0.0.1"),
      make_itf("eth1", kUp, nullptr),
  };
  std::vector<UdpInterface> out;
  EXPECT_EQ(select_udp_interfaces(host, "eth0", &out).code(), Errc::kInvalidUsage);
  EXPECT_EQ(select_udp_interfaces(host, "eth1", &out).code(), Errc::kInvalidUsage);
  EXPECT_EQ(select_udp_interfaces(host, ",", &out).code(), Errc::kInvalidUsage);
}

}  // namespace
}  // namespace optireduce
