// AnonMapping: private anonymous pages of one owner, optionally above inaccessible guard pages.
//
// Why mapped rather than allocated: the pages cost nothing until they are touched. A large
// malloc does not promise that: under glibc's MALLOC_PERTURB_ (which meson's test runner sets)
// it fills the whole block, and calloc zeroes it from the heap once glibc's mmap threshold has
// grown past its size. The fault injector's pool (16 MiB per endpoint, mostly never touched) and
// the emulated GPU's fiber stacks (tests/kernels_emu) both want that.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <utility>

namespace optireduce {

class AnonMapping {
 public:
  AnonMapping() = default;
  AnonMapping(const AnonMapping&) = delete;
  AnonMapping& operator=(const AnonMapping&) = delete;
  AnonMapping(AnonMapping&& o) noexcept
      : base_(std::exchange(o.base_, nullptr)), total_(o.total_), guard_(o.guard_) {}
  AnonMapping& operator=(AnonMapping&& o) noexcept {
    std::swap(base_, o.base_);
    std::swap(total_, o.total_);
    std::swap(guard_, o.guard_);
    return *this;
  }
  ~AnonMapping() {
    if (base_ != nullptr) munmap(base_, total_);
  }

  static size_t page_bytes() { return static_cast<size_t>(sysconf(_SC_PAGESIZE)); }

  // Maps `bytes` above `guard_pages` pages that fault when touched (a stack that overflows meets
  // them first). False, and nothing mapped, when the system refuses.
  bool map(size_t bytes, size_t guard_pages = 0) {
    const size_t guard = guard_pages * page_bytes();
    void* m =
        mmap(nullptr, guard + bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return false;
    if (guard != 0 && mprotect(m, guard, PROT_NONE) != 0) {
      munmap(m, guard + bytes);
      return false;
    }
    base_ = static_cast<uint8_t*>(m);
    total_ = guard + bytes;
    guard_ = guard;
    return true;
  }
  // The usable bytes (above the guard); nullptr when nothing is mapped.
  uint8_t* data() const { return base_ == nullptr ? nullptr : base_ + guard_; }
  explicit operator bool() const { return base_ != nullptr; }

 private:
  uint8_t* base_ = nullptr;  // the guard pages, then the usable bytes
  size_t total_ = 0;
  size_t guard_ = 0;
};

}  // namespace optireduce
