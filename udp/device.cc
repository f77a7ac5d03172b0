// UDP device discovery (getifaddrs, /sys/class/net) and the Device that opens UdpEndpoints on
// an interface's address.
#include "udp/device.h"

#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include "transport/log.h"
#include "udp/endpoint.h"

namespace optireduce {
namespace {

// What DeviceInfo says when the kernel does not know the link speed (loopback, many virtual
// NICs): NCCL only compares speeds between devices, and 10 Gbit/s is a typical cloud NIC.
constexpr int kDefaultSpeedMbps = 10000;
// MTU assumed when neither sysfs nor SIOCGIFMTU answers: Ethernet's.
constexpr uint32_t kDefaultMtu = 1500;

bool is_link_local6(const sockaddr_in6& a) {
  return IN6_IS_ADDR_LINKLOCAL(&a.sin6_addr);
}

// Reads the first line of a small sysfs file as an integer. False when absent or unreadable
// (reading `speed` of a virtual or down interface fails with EINVAL).
bool read_sysfs_long(const std::string& path, long* out) {
  FILE* f = std::fopen(path.c_str(), "re");
  if (f == nullptr) return false;
  char line[64];
  const bool ok = std::fgets(line, sizeof(line), f) != nullptr;
  std::fclose(f);
  if (!ok) return false;
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(line, &end, 10);
  if (errno != 0 || end == line) return false;
  *out = v;
  return true;
}

uint32_t interface_mtu(const std::string& name) {
  long mtu = 0;
  if (read_sysfs_long("/sys/class/net/" + name + "/mtu", &mtu) && mtu > 0)
    return static_cast<uint32_t>(mtu);
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
  const std::string sys = "/sys/class/net/" + itf.name;
  char resolved[PATH_MAX];
  if (::realpath((sys + "/device").c_str(), resolved) != nullptr) info.pci_path = resolved;
  long speed = 0;
  info.speed_mbps = read_sysfs_long(sys + "/speed", &speed) && speed > 0 && speed <= INT_MAX
                        ? static_cast<int>(speed)
                        : kDefaultSpeedMbps;
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

 private:
  UdpInterface itf_;
  DeviceInfo info_;
};

const UdpInterface* find_interface(const std::vector<UdpInterface>& all, const std::string& name) {
  for (const auto& itf : all)
    if (itf.name == name) return &itf;
  return nullptr;
}

bool usable(const UdpInterface& itf) {
  return (itf.flags & IFF_UP) != 0 && itf.addr.ss_family != 0;
}

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return {};
  const size_t e = s.find_last_not_of(" \t");
  return s.substr(b, e - b + 1);
}

}  // namespace

Status list_udp_interfaces(std::vector<UdpInterface>* out) {
  ifaddrs* head = nullptr;
  if (::getifaddrs(&head) != 0) {
    const int err = errno;
    OR_WARN("UDP: getifaddrs failed: %s", std::strerror(err));
    return Status(Errc::kSystem, err);
  }
  out->clear();
  for (const ifaddrs* ifa = head; ifa != nullptr; ifa = ifa->ifa_next) {
    if (ifa->ifa_name == nullptr) continue;
    UdpInterface* itf = nullptr;
    for (auto& known : *out)
      if (known.name == ifa->ifa_name) itf = &known;
    if (itf == nullptr) {
      out->push_back(UdpInterface{ifa->ifa_name, ifa->ifa_flags, {}});
      itf = &out->back();
    }
    const sockaddr* sa = ifa->ifa_addr;
    if (sa == nullptr) continue;
    const int have = itf->addr.ss_family;
    if (sa->sa_family == AF_INET && have != AF_INET) {
      // IPv4 first: it is what RoCE v2 GIDs and most cluster networks use.
      itf->addr = sockaddr_storage{};
      std::memcpy(&itf->addr, sa, sizeof(sockaddr_in));
    } else if (sa->sa_family == AF_INET6 && have != AF_INET) {
      const auto& a6 = *reinterpret_cast<const sockaddr_in6*>(sa);
      // A global IPv6 address beats a link-local one, which needs a scope to be reached.
      const bool better =
          have == 0 ||
          (is_link_local6(reinterpret_cast<const sockaddr_in6&>(itf->addr)) && !is_link_local6(a6));
      if (better) {
        itf->addr = sockaddr_storage{};
        std::memcpy(&itf->addr, sa, sizeof(sockaddr_in6));
      }
    }
  }
  ::freeifaddrs(head);
  return Status::ok();
}

Status select_udp_interfaces(const std::vector<UdpInterface>& all, const std::string& ifname,
                             std::vector<UdpInterface>* out) {
  out->clear();
  if (trim(ifname).empty()) {
    for (const auto& itf : all) {
      if (usable(itf) && (itf.flags & IFF_RUNNING) && !(itf.flags & IFF_LOOPBACK)) {
        out->push_back(itf);
        return Status::ok();
      }
    }
    for (const auto& itf : all) {
      if (usable(itf) && (itf.flags & IFF_LOOPBACK)) {
        out->push_back(itf);
        return Status::ok();
      }
    }
    OR_WARN("UDP: no network interface is up and has an IP address");
    return Status(Errc::kSystem, ENODEV);
  }
  size_t start = 0;
  while (start <= ifname.size()) {
    const size_t comma = ifname.find(',', start);
    const size_t end = comma == std::string::npos ? ifname.size() : comma;
    const std::string name = trim(ifname.substr(start, end - start));
    start = end + 1;
    if (name.empty() || find_interface(*out, name) != nullptr) continue;
    const UdpInterface* itf = find_interface(all, name);
    if (itf == nullptr) {
      OR_WARN("OPTIREDUCE_IFNAME: network interface \"%s\" does not exist", name.c_str());
      return Status(Errc::kInvalidUsage, ENODEV);
    }
    if (!(itf->flags & IFF_UP)) {
      OR_WARN("OPTIREDUCE_IFNAME: network interface \"%s\" is down", name.c_str());
      return Status(Errc::kInvalidUsage, ENETDOWN);
    }
    if (itf->addr.ss_family == 0) {
      OR_WARN("OPTIREDUCE_IFNAME: network interface \"%s\" has no IPv4 or IPv6 address",
              name.c_str());
      return Status(Errc::kInvalidUsage, EADDRNOTAVAIL);
    }
    out->push_back(*itf);
  }
  if (out->empty()) {
    OR_WARN("OPTIREDUCE_IFNAME=\"%s\" names no interface", ifname.c_str());
    return Status(Errc::kInvalidUsage);
  }
  return Status::ok();
}

Status open_udp_devices(const Config& cfg, std::vector<std::unique_ptr<Device>>* out) {
  std::vector<UdpInterface> all;
  Status s = list_udp_interfaces(&all);
  if (!s) return s;
  std::vector<UdpInterface> chosen;
  s = select_udp_interfaces(all, cfg.ifname, &chosen);
  if (!s) return s;
  out->clear();
  for (const auto& itf : chosen) {
    auto dev = std::make_unique<UdpDevice>(itf);
    OR_INFO("UDP device %s: MTU %u, %d Mbit/s, PCI %s", dev->info().name.c_str(), dev->info().mtu,
            dev->info().speed_mbps,
            dev->info().pci_path.empty() ? "none" : dev->info().pci_path.c_str());
    out->push_back(std::move(dev));
  }
  return Status::ok();
}

}  // namespace optireduce
