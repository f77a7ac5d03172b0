// The emulated GPU's memory: device allocations and pinned host allocations carved from host
// memory and tracked, so that every call that needs device memory can check the pointer's kind
// (a host pointer handed to NCCL or a kernel is a bug a real GPU reports as an illegal address).
#pragma once

#include <cstddef>
#include <cstdint>

namespace optireduce::gpu_emu {

enum class MemKind : uint8_t {
  kHost = 0,    // not from the arena: pageable host memory (stack, heap)
  kDevice = 1,  // cudaMalloc
  kPinned = 2,  // cudaMallocHost
};

void* mem_alloc(size_t bytes, MemKind kind);
// False when `p` is not the start of a live allocation of `kind`.
bool mem_free(void* p, MemKind kind);
// The kind of [p, p + bytes): an arena kind when wholly inside one allocation, kHost when
// outside every allocation. A range that starts inside an allocation and runs past its end is
// a bug: the emulator fails the process.
MemKind kind_of(const void* p, size_t bytes);
// Fails the process with a message naming `what` unless [p, p + bytes) is device memory.
void require_device(const void* p, size_t bytes, const char* what);
// Fails the process unless [p, p + bytes) is host memory (pageable or pinned).
void require_host(const void* p, size_t bytes, const char* what);
size_t live_bytes(MemKind kind);

// Prints "gpu_emu: <message>" and ends the process with a failure (the emulated GPU's fault:
// there is no way to continue, as after an illegal address on a real one).
[[noreturn]] void fault(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

}  // namespace optireduce::gpu_emu
