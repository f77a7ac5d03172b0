// UDP devices: one per interface that select_udp_interfaces chooses, and what the plugin reports
// to NCCL about each (name, PCI path, speed, MTU, GUID).
#pragma once

#include <memory>
#include <vector>

#include "transport/datapath.h"
#include "transport/params.h"
#include "transport/status.h"
#include "udp/interfaces.h"

namespace optireduce {

// The device for one interface: endpoints it opens are bound to itf.addr.
std::unique_ptr<Device> make_udp_device(const UdpInterface& itf);

// One device per interface that select_udp_interfaces picks for cfg.ifname, in its order.
Status open_udp_devices(const Config& cfg, std::vector<std::unique_ptr<Device>>* out);

}  // namespace optireduce
