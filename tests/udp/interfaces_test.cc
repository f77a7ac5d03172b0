// Tests of udp/interfaces.cc: discovery on this host, and the choice of interfaces on synthetic
// hosts (the default, NCCL's; OPTIREDUCE_IFNAME's lists; what is said when nothing is chosen).
#include "udp/interfaces.h"

#include <arpa/inet.h>
#include <net/if.h>
#include <netinet/in.h>

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/warn_capture.h"

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

std::vector<std::string> names(const std::vector<UdpInterface>& v) {
  std::vector<std::string> n;
  for (const auto& itf : v) n.push_back(itf.name);
  return n;
}

using Names = std::vector<std::string>;

using testing::WarnCapture;

// A host with a bit of everything: loopback, NICs in the kernel's order (not the names'),
// unusable ones, and the virtual interfaces NCCL leaves out by default.
const std::vector<UdpInterface> kHost = {
    make_itf("lo", kUp | IFF_LOOPBACK, "127.0.0.1"),
    make_itf("eth10", kUp, "10.0.10.1"),
    make_itf("eth0", IFF_UP, "10.0.0.1"),  // up, no carrier
    make_itf("eth1", kUp, nullptr),        // no address
    make_itf("eth2", kUp, "10.0.2.1"),
    make_itf("eth3", 0, "10.0.3.1"),  // down
    make_itf("docker0", kUp, "172.17.0.1"),
    make_itf("virbr0", kUp, "192.168.122.1"),
    make_itf("ens1f0np0", kUp, "10.1.0.1"),
};

TEST(ListUdpInterfaces, IncludesLoopbackWithIpv4) {
  std::vector<UdpInterface> all;
  ASSERT_TRUE(list_udp_interfaces(&all));
  bool found = false;
  for (const auto& itf : all) {
    EXPECT_EQ(itf.name.find(':'), std::string::npos) << itf.name;  // alias labels are folded
    if (itf.name != "lo") continue;
    found = true;
    EXPECT_TRUE(itf.flags & IFF_LOOPBACK);
    EXPECT_EQ(itf.addr.ss_family, AF_INET);  // IPv4 is preferred over ::1
  }
  EXPECT_TRUE(found);
}

TEST(NaturalNameLess, NumbersCompareAsNumbers) {
  EXPECT_TRUE(natural_name_less("eth2", "eth10"));
  EXPECT_FALSE(natural_name_less("eth10", "eth2"));
  EXPECT_TRUE(natural_name_less("eth1", "ib0"));
  EXPECT_TRUE(natural_name_less("ens1f0np0", "ens1f1np0"));
  EXPECT_TRUE(natural_name_less("ens2f0", "ens10f0"));
  EXPECT_TRUE(natural_name_less("eth", "eth0"));
  EXPECT_FALSE(natural_name_less("eth0", "eth0"));
  // Equal but for leading zeros: ordered, one way only.
  EXPECT_NE(natural_name_less("eth01", "eth1"), natural_name_less("eth1", "eth01"));
}

TEST(SelectUdpInterfaces, DefaultTakesEveryUsableNicInNaturalOrder) {
  std::vector<UdpInterface> out;
  ASSERT_TRUE(select_udp_interfaces(kHost, "", &out));
  EXPECT_EQ(names(out), (Names{"ens1f0np0", "eth2", "eth10"}));
  ASSERT_TRUE(select_udp_interfaces(kHost, "  ", &out));  // blank is unset
  EXPECT_EQ(out.size(), 3u);
}

TEST(SelectUdpInterfaces, DefaultPrefersIb) {
  std::vector<UdpInterface> host = kHost;
  host.push_back(make_itf("ib1", kUp, "10.2.1.1"));
  host.push_back(make_itf("ib0", kUp, "10.2.0.1"));
  host.push_back(make_itf("ib2", IFF_UP, "10.2.2.1"));  // no carrier
  std::vector<UdpInterface> out;
  ASSERT_TRUE(select_udp_interfaces(host, "", &out));
  EXPECT_EQ(names(out), (Names{"ib0", "ib1"}));
}

TEST(SelectUdpInterfaces, DefaultFallsBackToDockerThenLoopback) {
  std::vector<UdpInterface> out;
  ASSERT_TRUE(select_udp_interfaces(
      {make_itf("lo", kUp | IFF_LOOPBACK, "127.0.0.1"), make_itf("virbr0", kUp, "192.168.122.1"),
       make_itf("docker0", kUp, "172.17.0.1"), make_itf("eth0", IFF_UP, "10.0.0.1")},
      "", &out));
  EXPECT_EQ(names(out), (Names{"docker0"}));
  // A libvirt bridge reaches only this host's VMs: loopback is as good, and never a surprise.
  ASSERT_TRUE(select_udp_interfaces(
      {make_itf("virbr0", kUp, "192.168.122.1"), make_itf("eth0", 0, "10.0.0.1"),
       make_itf("lo", kUp | IFF_LOOPBACK, "127.0.0.1")},
      "", &out));
  EXPECT_EQ(names(out), (Names{"lo"}));
}

TEST(SelectUdpInterfaces, NoUsableInterfaceListsWhatThereIs) {
  WarnCapture warns;
  std::vector<UdpInterface> out;
  EXPECT_EQ(
      select_udp_interfaces({make_itf("eth0", 0, "10.0.0.1"), make_itf("eth1", IFF_UP, "10.0.1.1"),
                             make_itf("eth2", kUp, nullptr)},
                            "", &out)
          .code(),
      Errc::kSystem);
  EXPECT_TRUE(out.empty());
  const std::string w = warns.text();
  EXPECT_NE(w.find("eth0 (down)"), std::string::npos) << w;
  EXPECT_NE(w.find("eth1 (no carrier)"), std::string::npos) << w;
  EXPECT_NE(w.find("eth2 (no address)"), std::string::npos) << w;
}

TEST(SelectUdpInterfaces, PrefixesTakeEveryUsableMatch) {
  std::vector<UdpInterface> out;
  ASSERT_TRUE(select_udp_interfaces(kHost, "eth", &out));
  EXPECT_EQ(names(out), (Names{"eth2", "eth10"}));
  ASSERT_TRUE(select_udp_interfaces(kHost, "ens, eth1", &out));  // eth1 is eth1 and eth10
  EXPECT_EQ(names(out), (Names{"ens1f0np0", "eth10"}));
  // Loopback is chosen when asked for, even beside NICs.
  ASSERT_TRUE(select_udp_interfaces(kHost, "lo,eth2", &out));
  EXPECT_EQ(names(out), (Names{"eth2", "lo"}));
}

TEST(SelectUdpInterfaces, ExactNamesKeepNaturalOrder) {
  std::vector<UdpInterface> out;
  ASSERT_TRUE(select_udp_interfaces(kHost, "=eth10,lo,eth2,eth10", &out));
  EXPECT_EQ(names(out), (Names{"eth2", "eth10", "lo"}));
}

TEST(SelectUdpInterfaces, ExcludeLists) {
  std::vector<UdpInterface> out;
  // Unlike the default, an exclusion list admits loopback, docker and virbr unless it names
  // them, as NCCL_SOCKET_IFNAME does.
  ASSERT_TRUE(select_udp_interfaces(kHost, "^eth,docker,virbr", &out));
  EXPECT_EQ(names(out), (Names{"ens1f0np0", "lo"}));
  ASSERT_TRUE(select_udp_interfaces(kHost, "^=eth1,lo,docker0,virbr0", &out));
  EXPECT_EQ(names(out), (Names{"ens1f0np0", "eth2", "eth10"}));
}

TEST(SelectUdpInterfaces, ExactNameThatCannotCarryTrafficIsSkippedWithAWarning) {
  WarnCapture warns;
  std::vector<UdpInterface> out;
  ASSERT_TRUE(select_udp_interfaces(kHost, "=eth2,eth3,eth9", &out));
  EXPECT_EQ(names(out), (Names{"eth2"}));
  const std::string w = warns.text();
  EXPECT_NE(w.find("eth3"), std::string::npos) << w;
  EXPECT_NE(w.find("eth9"), std::string::npos) << w;
}

TEST(SelectUdpInterfaces, SelectingNothingNamesTheVariableAndTheHost) {
  WarnCapture warns;
  std::vector<UdpInterface> out;
  EXPECT_EQ(select_udp_interfaces(kHost, "=eth0,eth1,eth3", &out).code(), Errc::kInvalidUsage);
  EXPECT_TRUE(out.empty());
  const std::string w = warns.text();
  EXPECT_NE(w.find("OPTIREDUCE_IFNAME=\"=eth0,eth1,eth3\""), std::string::npos) << w;
  EXPECT_NE(w.find("lo (up, 127.0.0.1)"), std::string::npos) << w;
  EXPECT_NE(w.find("eth0 (no carrier)"), std::string::npos) << w;
  EXPECT_NE(w.find("eth3 (down)"), std::string::npos) << w;
  EXPECT_NE(w.find("ens1f0np0 (up, 10.1.0.1)"), std::string::npos) << w;

  EXPECT_EQ(select_udp_interfaces(kHost, "wlan", &out).code(), Errc::kInvalidUsage);
  EXPECT_EQ(select_udp_interfaces(kHost, "^e,l,d,v", &out).code(), Errc::kInvalidUsage);
}

TEST(SelectUdpInterfaces, AValueFromNcclSocketIfnameIsReportedUnderThatName) {
  WarnCapture warns;
  std::vector<UdpInterface> out;
  EXPECT_EQ(select_udp_interfaces(kHost, "=eth0", &out, "NCCL_SOCKET_IFNAME").code(),
            Errc::kInvalidUsage);
  const std::string w = warns.text();
  EXPECT_NE(w.find("NCCL_SOCKET_IFNAME=\"=eth0\""), std::string::npos) << w;
  EXPECT_EQ(w.find("OPTIREDUCE_IFNAME"), std::string::npos) << w;
}

TEST(SelectUdpInterfaces, MalformedValueNamesTheVariable) {
  WarnCapture warns;
  std::vector<UdpInterface> out;
  EXPECT_EQ(select_udp_interfaces(kHost, "^", &out).code(), Errc::kInvalidUsage);
  EXPECT_NE(warns.text().find("OPTIREDUCE_IFNAME"), std::string::npos) << warns.text();
}

}  // namespace
}  // namespace optireduce
