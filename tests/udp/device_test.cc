// Tests of udp/device.cc: the devices this host gets (loopback only is ever used) and what a
// device reports.
#include "udp/device.h"

#include <arpa/inet.h>
#include <net/if.h>
#include <netinet/in.h>

#include <cstring>

#include <gtest/gtest.h>

#include "udp/endpoint.h"

namespace optireduce {
namespace {

TEST(OpenUdpDevices, LoopbackByName) {
  Config cfg;
  cfg.ifname = "=lo";
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
  cfg.ifname = "=lo";
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

TEST(OpenUdpDevices, SelectingNothingIsInvalidUsage) {
  Config cfg;
  cfg.ifname = "nosuchif0";
  std::vector<std::unique_ptr<Device>> devs;
  const Status s = open_udp_devices(cfg, &devs);
  EXPECT_EQ(s.code(), Errc::kInvalidUsage);
  EXPECT_TRUE(devs.empty());

  cfg.ifname = "=nosuchif0,nosuchif1";
  EXPECT_EQ(open_udp_devices(cfg, &devs).code(), Errc::kInvalidUsage);
}

TEST(OpenUdpDevices, AnExactNameMissingAmongOthersIsSkipped) {
  Config cfg;
  cfg.ifname = "=nosuchif0,lo";
  std::vector<std::unique_ptr<Device>> devs;
  ASSERT_TRUE(open_udp_devices(cfg, &devs));
  ASSERT_EQ(devs.size(), 1u);
  EXPECT_EQ(devs[0]->info().name, "lo");
}

TEST(OpenUdpDevices, MalformedValueIsInvalidUsage) {
  Config cfg;
  cfg.ifname = "=^lo";
  std::vector<std::unique_ptr<Device>> devs;
  EXPECT_EQ(open_udp_devices(cfg, &devs).code(), Errc::kInvalidUsage);
}

TEST(OpenUdpDevices, DefaultFindsAnInterface) {
  // Only discovery: nothing is sent on whatever interfaces this host offers.
  std::vector<std::unique_ptr<Device>> devs;
  ASSERT_TRUE(open_udp_devices(Config{}, &devs));
  EXPECT_GE(devs.size(), 1u);
  for (const auto& d : devs) EXPECT_GT(d->info().speed_mbps, 0);
}

TEST(OpenUdpDevices, LoopbackReportsTheUnknownSpeed) {
  Config cfg;
  cfg.ifname = "=lo";
  std::vector<std::unique_ptr<Device>> devs;
  ASSERT_TRUE(open_udp_devices(cfg, &devs));
  EXPECT_EQ(devs[0]->info().speed_mbps, kUnknownSpeedMbps);  // reading lo's speed fails
}

}  // namespace
}  // namespace optireduce
