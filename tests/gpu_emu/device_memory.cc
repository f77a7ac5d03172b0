// Device memory of the emulated GPU (device_memory.h): one map of live allocations under a lock.
#include "tests/gpu_emu/device_memory.h"

#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

namespace optireduce::gpu_emu {

namespace {

struct Alloc {
  size_t bytes;
  MemKind kind;
};

struct Arena {
  std::mutex mu;
  std::map<uintptr_t, Alloc> live;  // by start address
  size_t bytes[3] = {0, 0, 0};
};

Arena& arena() {
  static Arena* a = new Arena;  // never destroyed: stream workers may outlive static destructors
  return *a;
}

const char* kind_name(MemKind k) {
  return k == MemKind::kDevice ? "device" : k == MemKind::kPinned ? "pinned host" : "host";
}

// New device memory holds garbage on a GPU; so does ours, so reading it before writing shows.
constexpr uint8_t kFreshByte = 0xA5;

}  // namespace

void fault(const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  std::fprintf(stderr, "[%d] gpu_emu: %s\n", getpid(), buf);
  std::fflush(stderr);
  _exit(90);
}

void* mem_alloc(size_t bytes, MemKind kind) {
  // 256-byte alignment, as cudaMalloc guarantees; a zero-byte allocation still gets an address.
  const size_t rounded = (bytes + 255) / 256 * 256 + 256;
  void* p = std::aligned_alloc(256, rounded);
  if (p == nullptr) return nullptr;
  std::memset(p, kFreshByte, rounded);
  Arena& a = arena();
  std::lock_guard<std::mutex> lk(a.mu);
  a.live[reinterpret_cast<uintptr_t>(p)] = Alloc{bytes, kind};
  a.bytes[int(kind)] += bytes;
  return p;
}

bool mem_free(void* p, MemKind kind) {
  Arena& a = arena();
  {
    std::lock_guard<std::mutex> lk(a.mu);
    auto it = a.live.find(reinterpret_cast<uintptr_t>(p));
    if (it == a.live.end() || it->second.kind != kind) return false;
    a.bytes[int(kind)] -= it->second.bytes;
    a.live.erase(it);
  }
  std::free(p);
  return true;
}

MemKind kind_of(const void* p, size_t bytes) {
  const auto x = reinterpret_cast<uintptr_t>(p);
  Arena& a = arena();
  std::lock_guard<std::mutex> lk(a.mu);
  auto it = a.live.upper_bound(x);
  if (it == a.live.begin()) return MemKind::kHost;
  --it;
  const uintptr_t start = it->first, end = start + it->second.bytes;
  if (x >= end && !(x == start && bytes == 0)) return MemKind::kHost;
  if (x + bytes > end)
    fault("[%p, +%zu) runs %zu bytes past the end of a %zu-byte %s allocation at %p", p, bytes,
          size_t(x + bytes - end), it->second.bytes, kind_name(it->second.kind),
          reinterpret_cast<void*>(start));
  return it->second.kind;
}

void require_device(const void* p, size_t bytes, const char* what) {
  const MemKind k = kind_of(p, bytes);
  if (k != MemKind::kDevice)
    fault("%s: %p (%zu bytes) is %s memory, not device memory", what, p, bytes, kind_name(k));
}

void require_host(const void* p, size_t bytes, const char* what) {
  const MemKind k = kind_of(p, bytes);
  if (k == MemKind::kDevice)
    fault("%s: %p (%zu bytes) is device memory where host memory is needed", what, p, bytes);
}

size_t live_bytes(MemKind kind) {
  Arena& a = arena();
  std::lock_guard<std::mutex> lk(a.mu);
  return a.bytes[int(kind)];
}

}  // namespace optireduce::gpu_emu
