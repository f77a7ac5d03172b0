// Interface discovery (getifaddrs) and the choice of interfaces (interfaces.h).
#include "udp/interfaces.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string_view>

#include "transport/ifname_filter.h"
#include "transport/log.h"

namespace optireduce {
namespace {

bool is_link_local6(const sockaddr_in6& a) {
  return IN6_IS_ADDR_LINKLOCAL(&a.sin6_addr);
}

// Keeps the better of the interface's address so far and `sa`.
void consider_address(const sockaddr* sa, UdpInterface* itf) {
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

bool usable(const UdpInterface& itf) {
  constexpr unsigned kUpRunning = IFF_UP | IFF_RUNNING;
  return (itf.flags & kUpRunning) == kUpRunning && itf.addr.ss_family != 0;
}

std::string address_text(const sockaddr_storage& ss) {
  char buf[INET6_ADDRSTRLEN] = "";
  if (ss.ss_family == AF_INET)
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(ss).sin_addr, buf, sizeof(buf));
  else if (ss.ss_family == AF_INET6)
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6&>(ss).sin6_addr, buf, sizeof(buf));
  return buf;
}

// Why an interface cannot carry traffic, or "up" and its address.
std::string state_text(const UdpInterface& itf) {
  if (!(itf.flags & IFF_UP)) return "down";
  if (!(itf.flags & IFF_RUNNING)) return "no carrier";
  if (itf.addr.ss_family == 0) return "no address";
  return std::string("up, ").append(address_text(itf.addr));
}

// "lo (up, 127.0.0.1), eth0 (no carrier), ...": what the host offers, for error messages.
std::string host_text(const std::vector<UdpInterface>& all) {
  if (all.empty()) return "none";
  std::string t;
  for (const auto& itf : all) {
    if (!t.empty()) t += ", ";
    t += itf.name + " (" + state_text(itf) + ")";
  }
  return t;
}

// NCCL's default choice (interfaces.h), one tier after the other until one selects something.
using Tier = bool (*)(const UdpInterface&);
constexpr Tier kDefaultTiers[] = {
    [](const UdpInterface& i) { return i.name.starts_with("ib"); },
    [](const UdpInterface& i) {
      return !(i.flags & IFF_LOOPBACK) && !i.name.starts_with("docker") &&
             !i.name.starts_with("virbr");
    },
    [](const UdpInterface& i) { return i.name.starts_with("docker"); },
    [](const UdpInterface& i) { return (i.flags & IFF_LOOPBACK) != 0; },
};

Status select_default(const std::vector<UdpInterface>& all, std::vector<UdpInterface>* out) {
  for (const Tier tier : kDefaultTiers) {
    for (const auto& itf : all)
      if (usable(itf) && tier(itf)) out->push_back(itf);
    if (!out->empty()) return Status::ok();
  }
  OR_WARN(
      "UDP: no network interface is up, running and has an IP address (OPTIREDUCE_IFNAME and "
      "NCCL_SOCKET_IFNAME unset); this host has: %s",
      host_text(all).c_str());
  return Status(Errc::kSystem, ENODEV);
}

Status select_listed(const std::vector<UdpInterface>& all, const std::string& ifname,
                     const std::string& var, const IfnameFilter& filter,
                     std::vector<UdpInterface>* out) {
  for (const auto& itf : all) {
    if (!filter.matches(itf.name)) continue;
    if (usable(itf)) {
      out->push_back(itf);
    } else {
      OR_INFO("UDP: %s matches %s=\"%s\" but is %s; skipped", itf.name.c_str(), var.c_str(),
              ifname.c_str(), state_text(itf).c_str());
    }
  }
  // An exact name that selects nothing is a typo or a host unlike the others: say so, and run
  // on what was found, as NCCL does with NCCL_SOCKET_IFNAME.
  if (filter.exact() && !filter.exclude() && !out->empty()) {
    for (const std::string& name : filter.items()) {
      const bool chosen = std::any_of(out->begin(), out->end(),
                                      [&](const UdpInterface& i) { return i.name == name; });
      if (!chosen)
        OR_WARN("UDP: %s names %s, which is absent or cannot carry traffic; using the others",
                var.c_str(), name.c_str());
    }
  }
  if (out->empty()) {
    OR_WARN(
        "UDP: %s=\"%s\" selects no interface that is up, running and has an IP address; this "
        "host has: %s",
        var.c_str(), ifname.c_str(), host_text(all).c_str());
    return Status(Errc::kInvalidUsage, ENODEV);
  }
  return Status::ok();
}

}  // namespace

bool natural_name_less(const std::string& a, const std::string& b) {
  size_t i = 0, j = 0;
  auto digit = [](char c) { return c >= '0' && c <= '9'; };
  while (i < a.size() && j < b.size()) {
    if (digit(a[i]) && digit(b[j])) {
      const size_t a0 = i, b0 = j;
      while (i < a.size() && digit(a[i])) ++i;
      while (j < b.size() && digit(b[j])) ++j;
      // Leading zeros do not make a number larger.
      std::string_view x(a.data() + a0, i - a0), y(b.data() + b0, j - b0);
      while (x.size() > 1 && x.front() == '0') x.remove_prefix(1);
      while (y.size() > 1 && y.front() == '0') y.remove_prefix(1);
      if (x.size() != y.size()) return x.size() < y.size();
      if (x != y) return x < y;
      continue;
    }
    if (a[i] != b[j]) return a[i] < b[j];
    ++i;
    ++j;
  }
  if (a.size() - i != b.size() - j) return a.size() - i < b.size() - j;
  return a < b;  // equal but for leading zeros: any fixed order
}

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
    std::string name = ifa->ifa_name;
    name.resize(std::min(name.size(), name.find(':')));  // an alias label's interface
    auto it = std::find_if(out->begin(), out->end(),
                           [&](const UdpInterface& known) { return known.name == name; });
    if (it == out->end()) {
      out->push_back(UdpInterface{name, ifa->ifa_flags, {}});
      it = out->end() - 1;
    }
    if (ifa->ifa_addr != nullptr) consider_address(ifa->ifa_addr, &*it);
  }
  ::freeifaddrs(head);
  return Status::ok();
}

Status select_udp_interfaces(const std::vector<UdpInterface>& all, const std::string& ifname,
                             std::vector<UdpInterface>* out, const std::string& var) {
  out->clear();
  IfnameFilter filter;
  std::string why;
  if (!IfnameFilter::parse(ifname, &filter, &why)) {
    OR_WARN("invalid %s=\"%s\": %s", var.c_str(), ifname.c_str(), why.c_str());
    return Status(Errc::kInvalidUsage);
  }
  const Status s =
      filter.empty() ? select_default(all, out) : select_listed(all, ifname, var, filter, out);
  if (!s) return s;
  std::stable_sort(out->begin(), out->end(), [](const UdpInterface& x, const UdpInterface& y) {
    return natural_name_less(x.name, y.name);
  });
  return Status::ok();
}

}  // namespace optireduce
