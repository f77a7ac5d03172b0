// UDP device discovery: which network interfaces carry our datagrams, and what the plugin
// reports to NCCL about each (name, PCI path, speed, MTU, GUID).
#pragma once

#include <sys/socket.h>

#include <memory>
#include <string>
#include <vector>

#include "transport/datapath.h"
#include "transport/params.h"
#include "transport/status.h"

namespace optireduce {

// One network interface as discovery sees it.
struct UdpInterface {
  std::string name;
  unsigned flags = 0;       // IFF_* from getifaddrs
  sockaddr_storage addr{};  // its first IPv4 address, else its best IPv6 one; family 0: none
};

// Lists the interfaces of this host in the kernel's order (getifaddrs).
Status list_udp_interfaces(std::vector<UdpInterface>* out);

// Chooses interfaces from `all`: those named in `ifname` (comma-separated, in that order), or
// by default the first one that is up, running and not loopback, else loopback. A named
// interface that does not exist, is down or has no address is a configuration error (WARN
// naming it, kInvalidUsage). Separate from discovery so that tests can feed it any host.
Status select_udp_interfaces(const std::vector<UdpInterface>& all, const std::string& ifname,
                             std::vector<UdpInterface>* out);

// One device per interface that select_udp_interfaces picks for cfg.ifname.
Status open_udp_devices(const Config& cfg, std::vector<std::unique_ptr<Device>>* out);

}  // namespace optireduce
