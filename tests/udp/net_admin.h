// Dropping CAP_NET_ADMIN for tests that must see what an unprivileged process gets from the
// kernel (SO_RCVBUF capped by net.core.rmem_max) while CI runs them as root. Raw capget/capset:
// libcap may not be installed. Capabilities belong to a thread, so this affects the calling
// thread only (and whatever it forks or spawns afterwards).
#pragma once

#include <linux/capability.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

namespace optireduce::testing {

// Removes CAP_NET_ADMIN from the calling thread's effective, permitted and inheritable sets (so
// that it cannot be raised again; the ambient set follows the other two). False on failure.
inline bool drop_net_admin() {
  __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3] = {};
  if (syscall(SYS_capget, &hdr, data) != 0) return false;
  const uint32_t bit = 1u << (CAP_NET_ADMIN % 32);
  __user_cap_data_struct& d = data[CAP_NET_ADMIN / 32];
  d.effective &= ~bit;
  d.permitted &= ~bit;
  d.inheritable &= ~bit;
  return syscall(SYS_capset, &hdr, data) == 0;
}

// Whether the calling thread has CAP_NET_ADMIN in effect.
inline bool has_net_admin() {
  __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3] = {};
  if (syscall(SYS_capget, &hdr, data) != 0) return false;
  return (data[CAP_NET_ADMIN / 32].effective & (1u << (CAP_NET_ADMIN % 32))) != 0;
}

// net.core.rmem_max, the most SO_RCVBUF grants without CAP_NET_ADMIN; 0 if unreadable.
inline uint64_t rmem_max_bytes() {
  FILE* f = std::fopen("/proc/sys/net/core/rmem_max", "r");
  if (f == nullptr) return 0;
  unsigned long long v = 0;
  if (std::fscanf(f, "%llu", &v) != 1) v = 0;
  std::fclose(f);
  return v;
}

}  // namespace optireduce::testing
