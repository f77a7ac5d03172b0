// The UDP Device (endpoints bound to one interface's address) and its description for NCCL.
#include "udp/device.h"

#include <net/if.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>

#include "transport/log.h"
#include "udp/endpoint.h"
#include "udp/netdev_sysfs.h"

namespace optireduce {
namespace {

// MTU assumed when neither sysfs nor SIOCGIFMTU answers: Ethernet's.
constexpr uint32_t kDefaultMtu = 1500;

uint32_t interface_mtu(const std::string& name) {
  if (const uint32_t mtu = netdev_mtu(kSysfsRoot, name); mtu > 0) return mtu;
  // No sysfs (some containers): ask the kernel through any socket.
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    ifreq req{};
    std::snprintf(req.ifr_name, sizeof(req.ifr_name), "%s", name.c_str());
    const int rc = ::ioctl(fd, SIOCGIFMTU, &req);
    ::close(fd);
    if (rc == 0 && req.ifr_mtu > 0) return static_cast<uint32_t>(req.ifr_mtu);
  }
  return kDefaultMtu;
}

// FNV-1a, 64-bit: stable across runs and hosts, unlike std::hash.
uint64_t fnv1a(uint64_t h, const void* data, size_t n) {
  constexpr uint64_t kFnvPrime = 0x100000001b3ull;
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * kFnvPrime;
  return h;
}

uint64_t interface_guid(const UdpInterface& itf) {
  constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ull;
  uint64_t h = fnv1a(kFnvOffset, itf.name.data(), itf.name.size());
  if (itf.addr.ss_family == AF_INET) {
    const auto& a = reinterpret_cast<const sockaddr_in&>(itf.addr);
    h = fnv1a(h, &a.sin_addr, sizeof(a.sin_addr));
  } else if (itf.addr.ss_family == AF_INET6) {
    const auto& a = reinterpret_cast<const sockaddr_in6&>(itf.addr);
    h = fnv1a(h, &a.sin6_addr, sizeof(a.sin6_addr));
  }
  return h;
}

DeviceInfo describe(const UdpInterface& itf) {
  DeviceInfo info;
  info.name = itf.name;
  info.pci_path = netdev_pci_path(kSysfsRoot, itf.name);
  info.speed_mbps = netdev_speed_mbps(kSysfsRoot, itf.name);
  if (info.speed_mbps <= 0) {
    OR_INFO("UDP: %s: the kernel does not know the link speed (virtual NIC?); reporting %d Mbit/s",
            itf.name.c_str(), kUnknownSpeedMbps);
    info.speed_mbps = kUnknownSpeedMbps;
  }
  info.mtu = interface_mtu(itf.name);
  info.guid = interface_guid(itf);
  return info;
}

class UdpDevice final : public Device {
 public:
  explicit UdpDevice(const UdpInterface& itf) : itf_(itf), info_(describe(itf)) {}
  const DeviceInfo& info() const override { return info_; }
  Status open_endpoint(const EndpointOptions& opts, std::unique_ptr<Endpoint>* out) override {
    std::unique_ptr<UdpEndpoint> ep;
    const Status s =
        UdpEndpoint::open(reinterpret_cast<const sockaddr*>(&itf_.addr), info_.mtu, opts, &ep);
    if (!s) return s;
    *out = std::move(ep);
    return Status::ok();
  }
  bool can_share() const override { return true; }

 private:
  UdpInterface itf_;
  DeviceInfo info_;
};

}  // namespace

std::unique_ptr<Device> make_udp_device(const UdpInterface& itf) {
  return std::make_unique<UdpDevice>(itf);
}

Status open_udp_devices(const Config& cfg, std::vector<std::unique_ptr<Device>>* out) {
  std::vector<UdpInterface> all;
  Status s = list_udp_interfaces(&all);
  if (!s) return s;
  std::vector<UdpInterface> chosen;
  // Which variable chose the interfaces: NCCL_SOCKET_IFNAME may stand in for ours.
  if (!cfg.ifname.empty())
    OR_INFO("UDP: interfaces from %s=\"%s\"", cfg.ifname_var.c_str(), cfg.ifname.c_str());
  s = select_udp_interfaces(all, cfg.ifname, &chosen, cfg.ifname_var);
  if (!s) return s;
  out->clear();
  for (const auto& itf : chosen) {
    auto dev = make_udp_device(itf);
    const DeviceInfo& info = dev->info();
    OR_INFO("UDP device %zu: %s, MTU %u, %d Mbit/s, PCI %s", out->size(), info.name.c_str(),
            info.mtu, info.speed_mbps, info.pci_path.empty() ? "none" : info.pci_path.c_str());
    out->push_back(std::move(dev));
  }
  return Status::ok();
}

}  // namespace optireduce
