// What sysfs says about a network interface: its link speed, its MTU and the PCI device behind
// it. Each function takes the sysfs mount point so that tests can hand it a tree of their own.
#pragma once

#include <cstdint>
#include <string>

namespace optireduce {

inline constexpr const char* kSysfsRoot = "/sys";

// <sysfs>/class/net/<ifname>/speed in Mbit/s; 0 where the kernel does not know it: virtual
// interfaces (loopback, bridges, veth) fail the read with EINVAL, and virtio_net or a link
// that is down reads -1.
int netdev_speed_mbps(const std::string& sysfs, const std::string& ifname);

// <sysfs>/class/net/<ifname>/mtu; 0 when unreadable.
uint32_t netdev_mtu(const std::string& sysfs, const std::string& ifname);

// The <sysfs>/devices/... path of the PCI function that carries the interface, in the form
// NCCL's topology reads (its last component a PCI address, its `subsystem` pci): the resolved
// <sysfs>/class/net/<ifname>/device, or, when that is no PCI device itself (virtio_net's
// virtioN, a USB adapter), its nearest PCI ancestor. Empty for an interface with no device
// (loopback, bridges, veth, tunnels) or none on PCI.
std::string netdev_pci_path(const std::string& sysfs, const std::string& ifname);

}  // namespace optireduce
