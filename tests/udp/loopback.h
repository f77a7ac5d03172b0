// The loopback interface as a UDP device's interface, for tests of the engine over real
// sockets: 127.0.0.1 and 127.0.0.2 are both on lo, no root needed.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>

#include <memory>
#include <vector>

#include "transport/datapath.h"
#include "transport/params.h"
#include "udp/device.h"
#include "udp/interfaces.h"

namespace optireduce::testing {

inline UdpInterface loopback_at(const char* ipv4) {
  UdpInterface itf;
  itf.name = "lo";
  auto* a = reinterpret_cast<sockaddr_in*>(&itf.addr);
  a->sin_family = AF_INET;
  inet_pton(AF_INET, ipv4, &a->sin_addr);
  return itf;
}

// An engine's device opener (Engine::acquire) for one UDP device on 127.0.0.1.
inline Status open_loopback(const Config&, std::vector<std::unique_ptr<Device>>* out) {
  out->push_back(make_udp_device(loopback_at("127.0.0.1")));
  return Status::ok();
}

}  // namespace optireduce::testing
