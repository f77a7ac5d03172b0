// Reads /sys/class/net/<ifname>/{speed,mtu,device} (netdev_sysfs.h).
#include "udp/netdev_sysfs.h"

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>

namespace optireduce {
namespace {

// The first line of a small sysfs file as an integer. False when absent or unreadable.
bool read_long(const std::string& path, long* out) {
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

// `path` with every symbolic link resolved; empty when it does not exist.
std::string resolve(const std::string& path) {
  char resolved[PATH_MAX];
  return ::realpath(path.c_str(), resolved) != nullptr ? std::string(resolved) : std::string();
}

bool is_pci_device(const std::string& dir) {
  const std::string subsystem = resolve(dir + "/subsystem");
  const size_t slash = subsystem.rfind('/');
  return slash != std::string::npos && subsystem.compare(slash + 1, std::string::npos, "pci") == 0;
}

}  // namespace

int netdev_speed_mbps(const std::string& sysfs, const std::string& ifname) {
  long speed = 0;
  if (!read_long(sysfs + "/class/net/" + ifname + "/speed", &speed)) return 0;
  return speed > 0 && speed <= INT_MAX ? static_cast<int>(speed) : 0;
}

uint32_t netdev_mtu(const std::string& sysfs, const std::string& ifname) {
  long mtu = 0;
  if (!read_long(sysfs + "/class/net/" + ifname + "/mtu", &mtu)) return 0;
  return mtu > 0 && mtu <= UINT32_MAX ? static_cast<uint32_t>(mtu) : 0;
}

std::string netdev_pci_path(const std::string& sysfs, const std::string& ifname) {
  std::string dev = resolve(sysfs + "/class/net/" + ifname + "/device");
  // Resolved too, so that the prefix test below holds when the mount point is reached through
  // a link (a test's temporary directory).
  const std::string devices = resolve(sysfs + "/devices");
  if (dev.empty() || devices.empty()) return {};
  while (dev.size() > devices.size() && dev.starts_with(devices + "/")) {
    if (is_pci_device(dev)) return dev;
    dev.resize(dev.rfind('/'));
  }
  return {};
}

}  // namespace optireduce
