// Tests of udp/netdev_sysfs.cc on a sysfs tree built in a temporary directory, shaped like the
// kernel's: a PCI NIC, a virtio_net NIC (its device is virtioN under the PCI function), a
// virtual interface (no device), each with the speed its kind reports.
#include "udp/netdev_sysfs.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

namespace optireduce {
namespace {

namespace fs = std::filesystem;

class FakeSysfs : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/optireduce-sysfs-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    mkdir("bus/pci");
    mkdir("bus/virtio");
    // A PCI NIC: class/net/ens1f0 -> devices/.../0000:17:00.0/net/ens1f0.
    const std::string nic = "devices/pci0000:16/0000:16:02.0/0000:17:00.0";
    add_device(nic, "bus/pci");
    add_device("devices/pci0000:16/0000:16:02.0", "bus/pci");
    add_netdev("ens1f0", nic, "400000\n");
    // virtio_net: the netdev's device is virtio2, a child of the PCI function.
    add_device("devices/pci0000:00/0000:00:03.0", "bus/pci");
    add_device("devices/pci0000:00/0000:00:03.0/virtio2", "bus/virtio");
    add_netdev("eth0", "devices/pci0000:00/0000:00:03.0/virtio2", "-1\n");
    // Virtual: no device link, and no speed file the kernel would let us read.
    mkdir("devices/virtual/net/veth0");
    link("class/net/veth0", "../../devices/virtual/net/veth0");
    write("devices/virtual/net/veth0/mtu", "1500\n");
    // A device on a bus that is not PCI, and no PCI ancestor below devices/.
    add_device("devices/platform/soc0", "bus/virtio");
    add_netdev("end0", "devices/platform/soc0", "1000\n");
  }
  void TearDown() override { fs::remove_all(root_); }

  void mkdir(const std::string& rel) { fs::create_directories(root_ + "/" + rel); }
  void link(const std::string& rel, const std::string& target) {
    fs::create_directories(fs::path(root_ + "/" + rel).parent_path());
    fs::create_directory_symlink(target, root_ + "/" + rel);
  }
  void write(const std::string& rel, const std::string& text) {
    std::ofstream(root_ + "/" + rel) << text;
  }
  void add_device(const std::string& dir, const std::string& bus) {
    mkdir(dir);
    fs::create_directory_symlink(root_ + "/" + bus, root_ + "/" + dir + "/subsystem");
  }
  void add_netdev(const std::string& name, const std::string& device, const std::string& speed) {
    const std::string dir = device + "/net/" + name;
    mkdir(dir);
    link("class/net/" + name, "../../" + dir);
    fs::create_directory_symlink(root_ + "/" + device, root_ + "/" + dir + "/device");
    write(dir + "/speed", speed);
    write(dir + "/mtu", "9000\n");
  }
  std::string real(const std::string& rel) const {
    return fs::canonical(root_ + "/" + rel).string();
  }

  std::string root_;
};

TEST_F(FakeSysfs, SpeedIsTheKernelsFigure) {
  EXPECT_EQ(netdev_speed_mbps(root_, "ens1f0"), 400000);
  EXPECT_EQ(netdev_speed_mbps(root_, "end0"), 1000);
}

TEST_F(FakeSysfs, UnknownSpeedIsZero) {
  EXPECT_EQ(netdev_speed_mbps(root_, "eth0"), 0);   // virtio_net reads -1
  EXPECT_EQ(netdev_speed_mbps(root_, "veth0"), 0);  // no readable file
  EXPECT_EQ(netdev_speed_mbps(root_, "nosuch0"), 0);
}

TEST_F(FakeSysfs, Mtu) {
  EXPECT_EQ(netdev_mtu(root_, "ens1f0"), 9000u);
  EXPECT_EQ(netdev_mtu(root_, "veth0"), 1500u);
  EXPECT_EQ(netdev_mtu(root_, "nosuch0"), 0u);
}

TEST_F(FakeSysfs, PciNicIsItsOwnPciFunction) {
  EXPECT_EQ(netdev_pci_path(root_, "ens1f0"), real("devices/pci0000:16/0000:16:02.0/0000:17:00.0"));
}

TEST_F(FakeSysfs, VirtioNicIsThePciFunctionAboveIt) {
  // The virtioN node is not what NCCL's topology can place; its parent is.
  EXPECT_EQ(netdev_pci_path(root_, "eth0"), real("devices/pci0000:00/0000:00:03.0"));
}

TEST_F(FakeSysfs, NoPciDeviceIsEmpty) {
  EXPECT_EQ(netdev_pci_path(root_, "veth0"), "");
  EXPECT_EQ(netdev_pci_path(root_, "end0"), "");
  EXPECT_EQ(netdev_pci_path(root_, "nosuch0"), "");
}

TEST(NetdevSysfs, ThisHostsLoopbackHasNoDevice) {
  EXPECT_EQ(netdev_pci_path(kSysfsRoot, "lo"), "");
  EXPECT_EQ(netdev_speed_mbps(kSysfsRoot, "lo"), 0);
}

}  // namespace
}  // namespace optireduce
