// Which network interfaces carry our datagrams: the host's list (getifaddrs) and the choice
// OPTIREDUCE_IFNAME makes from it. Every interface chosen becomes one device.
#pragma once

#include <sys/socket.h>

#include <string>
#include <vector>

#include "transport/status.h"

namespace optireduce {

// One network interface as discovery sees it.
struct UdpInterface {
  std::string name;
  unsigned flags = 0;       // IFF_* from getifaddrs
  sockaddr_storage addr{};  // its first IPv4 address, else its best IPv6 one; family 0: none
};

// Lists the interfaces of this host, in the kernel's order. An alias label ("eth0:1", an
// address added with `ifconfig eth0:1`) is folded into its interface: it is an address, not a
// second NIC.
Status list_udp_interfaces(std::vector<UdpInterface>* out);

// Chooses interfaces from `all` for the OPTIREDUCE_IFNAME value `ifname` (its syntax:
// transport/ifname_filter.h): those it selects, or by default NCCL's own choice for
// NCCL_SOCKET_IFNAME: every ib* interface (IPoIB is the fabric where it exists); else every
// other one but loopback, docker* and virbr* (a libvirt bridge only reaches local VMs, and is
// never a default here); else docker*; else loopback. Only interfaces that are up, running and
// have an address count. The choice comes out in natural name order (eth2 before eth10),
// whatever the order of the list or of the kernel, so that device k is the same NIC on hosts
// named alike.
// Errors (each logged as a WARN that names the variable `var` the value came from and lists the
// interfaces there are, with their state): kInvalidUsage for a malformed value or one that
// selects nothing; kSystem when no interface at all can carry traffic. Separate from discovery
// so that tests can feed it any host.
Status select_udp_interfaces(const std::vector<UdpInterface>& all, const std::string& ifname,
                             std::vector<UdpInterface>* out,
                             const std::string& var = "OPTIREDUCE_IFNAME");

// Orders interface names as a person would: runs of digits compare as numbers.
bool natural_name_less(const std::string& a, const std::string& b);

}  // namespace optireduce
