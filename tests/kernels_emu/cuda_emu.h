// A CPU emulation of the part of CUDA's execution model that cuda/kernels.cu uses, so that the
// kernels' own source (not a host twin of it) runs in tests on machines without a GPU.
//
// Model. A launch runs its grid block by block on the calling thread; the threads of a block are
// fibers (ucontext) that the scheduler runs one at a time, each until it reaches a point where a
// GPU thread may wait for others: __syncthreads (the whole block) or a warp shuffle (its warp).
// Everything between two such points is an epoch; the scheduler releases a barrier only when
// every thread that must reach it has.
//
// Strictness. What a GPU leaves undefined, the emulation reports as a launch error
// (cudaGetLastError() != cudaSuccess, emu::last_error_text() says what and where):
//  - a __syncthreads that some threads of the block reach while others exit (or wait at a
//    shuffle), a shuffle whose mask names lanes that do not exist or have exited;
//  - a write outside an allocation made with emu::device_alloc (guard zones on both sides);
//  - a result that depends on the order in which threads or blocks run (a missing barrier, a race
//    on shared or global memory, one block writing another's range): with set_schedules(n > 1)
//    every launch runs n times from the same device memory, threads and blocks in different
//    orders (forward, reverse, seeded shuffles), and must leave every allocation byte-identical;
//  - a vector access (16 bytes, say) at an address that is not a multiple of its size
//    (check_aligned, which kernels.cu calls through device_compat.h's OR_CHECK_ALIGNED);
//  - reading shared memory that this block has not written: it starts, in each schedule, filled
//    with a different pattern, so such a read makes the result schedule-dependent.
// Not modelled: memory ordering between threads within an epoch (an epoch runs to completion),
// so a read-modify-write race whose updates commute (two threads' `s[0] += v`) gives the same
// result in every order and goes unseen; warp-synchronous code without shuffles; cooperative
// groups; streams (a launch runs at once, on the calling thread; launches from several threads
// run side by side, each with its own scheduler).
#pragma once

#include <math.h>  // sqrt(float) and the other overloads device code calls unqualified

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

namespace optireduce::emu {

struct uint3 {
  unsigned x = 0, y = 0, z = 0;
};
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
  dim3(int x_) : x(unsigned(x_)) {}
  dim3(uint64_t x_) : x(unsigned(x_)) {}
  operator uint3() const { return {x, y, z}; }
};

// The running emulated thread's coordinates.
struct ThreadCoords {
  uint3 thread, block;
  dim3 block_dim, grid_dim;
};
const ThreadCoords& current();

// Runs `body` as every thread of a grid (see the model above). Returns false, with the reason in
// last_error_text(), if the launch broke a rule; shmem: dynamic shared-memory bytes per block.
bool run_grid(dim3 grid, dim3 block, size_t shmem, const std::function<void()>& body);
// The reason of the last failed launch on this thread ("" if none since the last clear_error()).
std::string last_error_text();
void* dynamic_shared();
void syncthreads();
// A vector access of `bytes` (a power of two) at p: a GPU faults unless p is a multiple of it,
// and the emulation fails the launch.
void check_aligned(const void* p, size_t bytes);
// The warp shuffles on `bytes` (<= 8) bytes at `v`: v from lane + delta (own v past lane 31),
// or from lane ^ lane_mask.
void shfl_down(unsigned mask, void* v, size_t bytes, int delta);
void shfl_xor(unsigned mask, void* v, size_t bytes, int lane_mask);

// Where launches go. By default a launch runs at once, on the calling thread. A runtime double
// with streams installs hooks: `queue` receives each launch (and each cudaMemsetAsync) with its
// stream and runs it in stream order (on the stream's thread: every thread has a scheduler of
// its own), and `check` sees every pointer argument of a kernel first (a host pointer is the
// bug a GPU reports as an illegal address). A launch that breaks a rule under `queue` calls
// `failed` with the reason, on the thread that ran it.
struct Hooks {
  void (*queue)(void* stream, std::function<void()> work) = nullptr;
  void (*check)(const void* p, const char* what) = nullptr;
  void (*failed)(const std::string& why) = nullptr;
};
void set_hooks(const Hooks& h);
const Hooks& hooks();

// Launches from the kernel source: launch(kernel, grid, block, shmem, stream)(args...).
template <class... P>
class Launch {
 public:
  Launch(void (*k)(P...), dim3 g, dim3 b, size_t shmem, void* stream)
      : k_(k), g_(g), b_(b), shmem_(shmem), stream_(stream) {}
  template <class... A>
  void operator()(A&&... a) const {
    // What the launch copies to the GPU: the arguments, by value, now.
    auto args = std::make_shared<const std::tuple<P...>>(std::forward<A>(a)...);
    if (hooks().check != nullptr) {
      std::apply([](const auto&... x) { (check_arg(x), ...); }, *args);
    }
    auto work = [k = k_, g = g_, b = b_, shmem = shmem_, args] {
      if (!run_grid(g, b, shmem, [&] { std::apply(k, *args); }) && hooks().failed != nullptr)
        hooks().failed(last_error_text());
    };
    if (hooks().queue != nullptr) {
      hooks().queue(stream_, work);
    } else {
      work();
    }
  }

 private:
  template <class X>
  static void check_arg(const X& x) {
    if constexpr (std::is_pointer_v<X>) {
      if (x != nullptr) hooks().check(x, "kernel argument");
    }
  }
  void (*k_)(P...);
  dim3 g_, b_;
  size_t shmem_;
  void* stream_;
};
template <class... P, class S>
Launch<P...> launch(void (*k)(P...), dim3 g, dim3 b, size_t shmem, S* stream) {
  return Launch<P...>(k, g, b, shmem, static_cast<void*>(stream));
}
template <class... P>
Launch<P...> launch(void (*k)(P...), dim3 g, dim3 b, size_t shmem, std::nullptr_t) {
  return Launch<P...>(k, g, b, shmem, nullptr);
}

// Device memory for the emulation's checks: host memory between guard zones, registered so that
// launches can compare it across schedules. Memory not allocated here is not checked.
void* device_alloc(size_t bytes);
void device_free(void* p);

// Every launch runs this many times in different orders (1: once, threads and blocks in order).
void set_schedules(int n);
void clear_error();
// Launches run so far (tests use it to prove a launcher really went through the emulation).
uint64_t launches();

}  // namespace optireduce::emu

// ---- CUDA's names, as kernels.cu uses them ----

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static thread_local  // blocks run one after another on each thread
#define threadIdx (::optireduce::emu::current().thread)
#define blockIdx (::optireduce::emu::current().block)
#define blockDim (::optireduce::emu::current().block_dim)
#define gridDim (::optireduce::emu::current().grid_dim)

using ::optireduce::emu::dim3;

inline void __syncthreads() {
  ::optireduce::emu::syncthreads();
}

template <class T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta) {
  static_assert(sizeof(T) <= 8, "shuffles move at most 64 bits");
  ::optireduce::emu::shfl_down(mask, &v, sizeof(T), int(delta));
  return v;
}

template <class T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask) {
  static_assert(sizeof(T) <= 8, "shuffles move at most 64 bits");
  ::optireduce::emu::shfl_xor(mask, &v, sizeof(T), lane_mask);
  return v;
}

// A real read-modify-write: launches on several threads (the GPU-path double's streams) may
// share a counter, as kernels on several streams of one GPU do.
template <class T>
T atomicAdd(T* p, T v) {
  return std::atomic_ref<T>(*p).fetch_add(v, std::memory_order_relaxed);
}

enum cudaError_t : int {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorLaunchFailure = 719,
};
cudaError_t cudaGetLastError();
const char* cudaGetErrorString(cudaError_t e);
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, struct CUstream_st* stream);
