// The emulation's scheduler (see cuda_emu.h): fibers per block, barriers, shuffles, schedules,
// guarded device memory.
// Fibers switch with _setjmp/_longjmp from one stack to another; the fortified longjmp refuses
// a jump to another stack, so this file is built without it.
#undef _FORTIFY_SOURCE
#include "kernels_emu/cuda_emu.h"

#include <setjmp.h>
#include <ucontext.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <utility>
#include <vector>

#include "transport/anon_mapping.h"

#if defined(__SANITIZE_ADDRESS__)
#include <dlfcn.h>
#include <sanitizer/common_interface_defs.h>
#define OR_EMU_ASAN 1
#endif

namespace optireduce::emu {
namespace {

constexpr unsigned kMaxThreadsPerBlock = 1024;
constexpr size_t kMaxSharedBytes = 48 << 10;  // without opting in, on every GPU since sm_70
constexpr size_t kGuardBytes = 256;
constexpr uint8_t kGuardByte = 0xA5;
constexpr size_t kStackBytes = 64 << 10;

enum class Wait : uint8_t { kRunnable, kBarrier, kShuffle, kDone };

// A fiber is made once (makecontext, entered with setcontext) and then runs the kernel body of
// every block and launch in a loop, switching with _setjmp/_longjmp: swapcontext saves and
// restores the signal mask with a system call on every switch, which made the emulation spend
// most of its time in the kernel.
struct Fiber {
  ucontext_t ctx{};  // the first entry only
  jmp_buf jb;
  bool live = false;     // its loop runs (it is parked in a switch)
  bool in_body = false;  // parked inside a kernel body (not between two)
  // Mapped above a guard page (transport/anon_mapping.h): an overflowing kernel body faults
  // instead of writing into its neighbour's stack, and untouched pages cost nothing.
  AnonMapping stack;
  ThreadCoords coords;
  Wait wait = Wait::kRunnable;
  // The shuffle it waits at: mask, delta, and its value (result written back on release).
  unsigned mask = 0;
  int delta = 0;
  bool xor_lanes = false;  // __shfl_xor_sync (else __shfl_down_sync)
  size_t bytes = 0;
  unsigned char value[8] = {};
  unsigned char* out = nullptr;
  void* fake_stack = nullptr;  // ASan's, while switched away
};

struct State {
  std::vector<Fiber> fibers;  // grown to the largest block, reused
  jmp_buf main_jb;
  int running = -1;
  unsigned nthreads = 0;
  const std::function<void()>* body = nullptr;
  std::vector<unsigned char> shared;
  std::string error;
  bool misaligned = false;  // this launch made a misaligned vector access (check_aligned)
  int schedules = 1;
  uint64_t launches = 0;
  ThreadCoords outside;  // what current() returns outside a kernel
#if defined(OR_EMU_ASAN)
  // The scheduler's stack (the calling thread's), as ASan reported it on switching away.
  void* main_fake_stack = nullptr;
  const void* main_bottom = nullptr;
  size_t main_size = 0;
#endif
};

// One scheduler per OS thread: launches from several threads (the GPU-path double's streams) run
// side by side, each on its own fibers.
State& st() {
  static thread_local State s;
  return s;
}

struct Alloc {
  size_t bytes;
  std::unique_ptr<unsigned char[]> mem;  // guard | bytes | guard
};
// Device memory is the process's, as on a GPU. Snapshots and guard checks read it while no
// other thread allocates (the checks are for single-threaded kernel tests).
std::mutex& allocs_mu() {
  static std::mutex m;
  return m;
}
std::map<unsigned char*, Alloc>& allocs() {  // by user pointer
  static std::map<unsigned char*, Alloc> a;
  return a;
}

void fail(const std::string& why) {
  if (st().error.empty()) st().error = why;
}

// The jump between stacks. Under ASan, libc's own _longjmp: ASan's interceptor asks the kernel
// for the signal stack (sigaltstack) on every jump, which made the sanitizer build spend most of
// its time in system calls; the fiber annotations already tell ASan about the stacks. The one
// frame a jump abandons is jump()'s own, which is therefore not instrumented (redzones left
// poisoned there would be taken for overflows by the next frames at those addresses).
#if defined(OR_EMU_ASAN)
using LongjmpFn = void (*)(jmp_buf, int);
LongjmpFn libc_longjmp() {
  static const LongjmpFn real = [] {
    void* libc = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
    void* p = libc != nullptr ? dlsym(libc, "_longjmp") : nullptr;
    return p != nullptr ? reinterpret_cast<LongjmpFn>(p) : nullptr;
  }();
  return real;
}
#endif

#if defined(OR_EMU_ASAN)
// Not [[noreturn]] either: ASan calls __asan_handle_no_return (and so sigaltstack) before every
// call to a function that is.
__attribute__((no_sanitize_address)) void jump(jmp_buf to, LongjmpFn real) {
  if (real != nullptr) real(to, 1);
  _longjmp(to, 1);
}
#define OR_JUMP(to) jump(to, libc_longjmp())
#else
#define OR_JUMP(to) _longjmp(to, 1)
#endif

void fiber_entry();

// Both switch points tell ASan about the stack they leave and enter (its fiber annotations),
// or it takes the fibers' frames for overflows of the thread's stack.
// The two switch points are not instrumented either: ASan treats the code around a _setjmp like
// a call that does not return and unpoisons the stack there (with a sigaltstack call) each time.
#if defined(OR_EMU_ASAN)
#define OR_SWITCH_POINT __attribute__((no_sanitize_address, noinline))
#else
#define OR_SWITCH_POINT
#endif

OR_SWITCH_POINT void resume(Fiber& f) {
  State& s = st();
#if defined(OR_EMU_ASAN)
  __sanitizer_start_switch_fiber(&s.main_fake_stack, f.stack.data(), kStackBytes);
#endif
  if (_setjmp(s.main_jb) == 0) {
    if (!f.live) {
      f.live = true;
      getcontext(&f.ctx);
      f.ctx.uc_stack.ss_sp = f.stack.data();
      f.ctx.uc_stack.ss_size = kStackBytes;
      f.ctx.uc_link = nullptr;
      makecontext(&f.ctx, fiber_entry, 0);
      setcontext(&f.ctx);
    }
    OR_JUMP(f.jb);
  }
#if defined(OR_EMU_ASAN)
  __sanitizer_finish_switch_fiber(s.main_fake_stack, nullptr, nullptr);
#endif
}

// Back to the scheduler from the running fiber.
OR_SWITCH_POINT void yield_to_scheduler() {
  State& s = st();
  Fiber& f = s.fibers[size_t(s.running)];
#if defined(OR_EMU_ASAN)
  __sanitizer_start_switch_fiber(&f.fake_stack, s.main_bottom, s.main_size);
#endif
  if (_setjmp(f.jb) == 0) OR_JUMP(s.main_jb);
#if defined(OR_EMU_ASAN)
  __sanitizer_finish_switch_fiber(f.fake_stack, &s.main_bottom, &s.main_size);
#endif
}

void fiber_entry() {
  State& s = st();
#if defined(OR_EMU_ASAN)
  __sanitizer_finish_switch_fiber(nullptr, &s.main_bottom, &s.main_size);
#endif
  for (;;) {  // one kernel body per turn: s.running names this fiber whenever it runs
    s.fibers[size_t(s.running)].in_body = true;
    (*s.body)();
    Fiber& f = s.fibers[size_t(s.running)];
    f.in_body = false;
    f.wait = Wait::kDone;
    yield_to_scheduler();
  }
}

// After a launch broke a rule, fibers left inside a body start afresh next time.
void reset_stuck_fibers(State& s) {
  for (Fiber& f : s.fibers) {
    if (f.in_body) {
      f.live = false;
      f.in_body = false;
    }
  }
}

std::string where(const ThreadCoords& c) {
  char b[96];
  std::snprintf(b, sizeof(b), "block (%u,%u,%u) thread (%u,%u,%u)", c.block.x, c.block.y, c.block.z,
                c.thread.x, c.thread.y, c.thread.z);
  return b;
}

// The order in which a schedule runs n items (threads of an epoch, blocks of a grid).
void order(int schedule, uint64_t salt, std::vector<unsigned>* o, unsigned n) {
  o->resize(n);
  for (unsigned i = 0; i < n; ++i) (*o)[i] = i;
  if (schedule == 1) std::reverse(o->begin(), o->end());
  if (schedule >= 2) {
    std::mt19937_64 rng(uint64_t(schedule) * 0x9e3779b97f4a7c15ull ^ salt);
    std::shuffle(o->begin(), o->end(), rng);
  }
}

// Releases the warps whose every live lane waits at a shuffle. Returns false on a rule broken.
bool release_shuffles(State& s) {
  const unsigned nwarps = (s.nthreads + 31) / 32;
  for (unsigned w = 0; w < nwarps; ++w) {
    const unsigned first = w * 32, lanes = std::min(32u, s.nthreads - first);
    unsigned waiting = 0, done = 0;
    for (unsigned l = 0; l < lanes; ++l) {
      const Wait x = s.fibers[first + l].wait;
      waiting += x == Wait::kShuffle;
      done += x == Wait::kDone;
    }
    if (waiting == 0 || waiting + done < lanes) continue;  // others still running
    for (unsigned l = 0; l < lanes; ++l) {
      Fiber& f = s.fibers[first + l];
      if (f.wait != Wait::kShuffle) continue;
      for (unsigned m = 0; m < 32; ++m) {
        if (!(f.mask >> m & 1)) continue;
        if (m >= lanes || s.fibers[first + m].wait != Wait::kShuffle) {
          fail("a warp shuffle at " + where(f.coords) + ": its mask names lane " +
               std::to_string(m) + ", which " + (m >= lanes ? "does not exist" : "has exited"));
          return false;
        }
      }
    }
    for (unsigned l = 0; l < lanes; ++l) {
      Fiber& f = s.fibers[first + l];
      if (f.wait != Wait::kShuffle) continue;
      const unsigned src = f.xor_lanes ? (l ^ unsigned(f.delta)) & 31 : l + unsigned(f.delta);
      if (src < 32 && (src >= lanes || s.fibers[first + src].wait != Wait::kShuffle)) {
        fail("a warp shuffle at " + where(f.coords) + " reads lane " + std::to_string(src) +
             ", which does not take part");
        return false;
      }
      const Fiber& from = src < 32 ? s.fibers[first + src] : f;
      std::memcpy(f.out, from.value, f.bytes);
    }
    for (unsigned l = 0; l < lanes; ++l) {
      Fiber& f = s.fibers[first + l];
      if (f.wait == Wait::kShuffle) f.wait = Wait::kRunnable;
    }
  }
  return true;
}

bool run_block(State& s, int schedule, dim3 grid, dim3 block, uint3 bid) {
  const uint64_t salt = (uint64_t(bid.z) * grid.y + bid.y) * grid.x + bid.x;
  // Shared memory starts as garbage, a different garbage in each schedule.
  std::fill(s.shared.begin(), s.shared.end(), static_cast<unsigned char>(0x5A + 0x3B * schedule));
  for (unsigned t = 0; t < s.nthreads; ++t) {
    Fiber& f = s.fibers[t];
    f.coords.thread = {t % block.x, t / block.x % block.y, t / (block.x * block.y)};
    f.coords.block = bid;
    f.coords.block_dim = block;
    f.coords.grid_dim = grid;
    f.wait = Wait::kRunnable;
  }
  std::vector<unsigned> o;
  for (uint64_t epoch = 0;; ++epoch) {
    order(schedule, salt * 1000003 + epoch, &o, s.nthreads);
    for (unsigned t : o) {
      Fiber& f = s.fibers[t];
      if (f.wait != Wait::kRunnable) continue;
      s.running = int(t);
      resume(f);
      s.running = -1;
    }
    if (s.misaligned) return false;
    unsigned at_barrier = 0, done = 0;
    for (unsigned t = 0; t < s.nthreads; ++t) {
      at_barrier += s.fibers[t].wait == Wait::kBarrier;
      done += s.fibers[t].wait == Wait::kDone;
    }
    if (done == s.nthreads) return true;
    if (!release_shuffles(s)) return false;
    if (at_barrier == s.nthreads) {
      for (unsigned t = 0; t < s.nthreads; ++t) s.fibers[t].wait = Wait::kRunnable;
      continue;
    }
    bool runnable = false;
    for (unsigned t = 0; t < s.nthreads; ++t) runnable |= s.fibers[t].wait == Wait::kRunnable;
    if (runnable) continue;
    // Nothing can run and nothing can be released: the block would hang (or, on some GPUs,
    // go on with undefined results).
    for (unsigned t = 0; t < s.nthreads; ++t) {
      if (s.fibers[t].wait == Wait::kBarrier) {
        fail("__syncthreads at " + where(s.fibers[t].coords) +
             " is not reached by every thread "
             "of the block (" +
             std::to_string(at_barrier) + " of " + std::to_string(s.nthreads) + " wait there, " +
             std::to_string(done) + " exited)");
        return false;
      }
    }
    fail("warp shuffle at " + where(s.fibers[o[0]].coords) + " never completes");
    return false;
  }
}

std::vector<unsigned char> snapshot() {
  std::vector<unsigned char> v;
  for (auto& [p, a] : allocs()) v.insert(v.end(), p, p + a.bytes);
  return v;
}

void restore(const std::vector<unsigned char>& v) {
  size_t off = 0;
  for (auto& [p, a] : allocs()) {
    std::memcpy(p, v.data() + off, a.bytes);
    off += a.bytes;
  }
}

bool guards_intact() {
  for (auto& [p, a] : allocs()) {
    const unsigned char* lo = a.mem.get();
    const unsigned char* hi = p + a.bytes;
    for (size_t i = 0; i < kGuardBytes; ++i) {
      if (lo[i] != kGuardByte || hi[i] != kGuardByte) {
        const long off = lo[i] != kGuardByte ? -long(kGuardBytes - i) : long(a.bytes + i);
        fail("a kernel wrote outside an allocation of " + std::to_string(a.bytes) +
             " bytes, at byte offset " + std::to_string(off));
        return false;
      }
    }
  }
  return true;
}

// The first differing byte of two snapshots, as text.
std::string first_difference(const std::vector<unsigned char>& a,
                             const std::vector<unsigned char>& b) {
  size_t off = 0;
  for (auto& [p, al] : allocs()) {
    for (size_t i = 0; i < al.bytes; ++i) {
      if (a[off + i] != b[off + i])
        return "byte " + std::to_string(i) + " of an allocation of " + std::to_string(al.bytes);
    }
    off += al.bytes;
  }
  return "?";
}

}  // namespace

const ThreadCoords& current() {
  State& s = st();
  return s.running >= 0 ? s.fibers[size_t(s.running)].coords : s.outside;
}

void* dynamic_shared() {
  return st().shared.data();
}

void syncthreads() {
  State& s = st();
  if (s.running < 0) return;
  s.fibers[size_t(s.running)].wait = Wait::kBarrier;
  yield_to_scheduler();
}

namespace {
void shuffle(unsigned mask, void* v, size_t bytes, int delta, bool xor_lanes) {
  State& s = st();
  if (s.running < 0) return;
  Fiber& f = s.fibers[size_t(s.running)];
  f.wait = Wait::kShuffle;
  f.mask = mask;
  f.delta = delta;
  f.xor_lanes = xor_lanes;
  f.bytes = bytes;
  std::memcpy(f.value, v, bytes);
  f.out = static_cast<unsigned char*>(v);
  yield_to_scheduler();
}
}  // namespace

// The thread stops there, as a GPU's would at the fault (the host might fault too: the compiler
// may use aligned vector instructions), and the launch fails when its epoch ends.
void check_aligned(const void* p, size_t bytes) {
  State& s = st();
  if (s.running < 0 || reinterpret_cast<uintptr_t>(p) % bytes == 0) return;
  Fiber& f = s.fibers[size_t(s.running)];
  s.misaligned = true;
  fail("a kernel accessed " + std::to_string(bytes) + " bytes at a misaligned address (" +
       std::to_string(reinterpret_cast<uintptr_t>(p) % bytes) + " past a multiple) at " +
       where(f.coords));
  f.wait = Wait::kDone;  // in_body stays set: reset_stuck_fibers restarts it
  yield_to_scheduler();  // never resumed
}

void shfl_down(unsigned mask, void* v, size_t bytes, int delta) {
  shuffle(mask, v, bytes, delta, false);
}
void shfl_xor(unsigned mask, void* v, size_t bytes, int lane_mask) {
  shuffle(mask, v, bytes, lane_mask, true);
}

bool run_grid(dim3 grid, dim3 block, size_t shmem, const std::function<void()>& body) {
  State& s = st();
  ++s.launches;
  const uint64_t threads = uint64_t(block.x) * block.y * block.z;
  if (threads == 0 || threads > kMaxThreadsPerBlock || grid.x == 0 || grid.y == 0 || grid.z == 0 ||
      grid.y > 65535 || grid.z > 65535 || grid.x > 0x7fffffffu) {
    fail("invalid launch configuration: grid (" + std::to_string(grid.x) + "," +
         std::to_string(grid.y) + "," + std::to_string(grid.z) + "), block of " +
         std::to_string(threads) + " threads");
    return false;
  }
  if (shmem > kMaxSharedBytes) {
    fail("a launch asked for " + std::to_string(shmem) +
         " bytes of dynamic shared memory (at "
         "most " +
         std::to_string(kMaxSharedBytes) + " without opting in)");
    return false;
  }
  s.nthreads = unsigned(threads);
  s.misaligned = false;
  // Parked fibers hold references into this vector: it must never move them.
  if (s.fibers.capacity() < kMaxThreadsPerBlock) s.fibers.reserve(kMaxThreadsPerBlock);
  if (s.fibers.size() < threads) {
    s.fibers.resize(threads);
    for (auto& f : s.fibers) {
      if (!f.stack && !f.stack.map(kStackBytes, 1)) {
        fail("no memory for the stacks of a block of " + std::to_string(threads) + " threads");
        return false;
      }
    }
  }
  s.shared.assign(shmem, 0);
  s.body = &body;
  const uint64_t nblocks = uint64_t(grid.x) * grid.y * grid.z;
  const std::vector<unsigned char> before =
      s.schedules > 1 ? snapshot() : std::vector<unsigned char>();
  std::vector<unsigned char> first;
  std::vector<unsigned> bo;
  bool ok = true;
  for (int sch = 0; sch < s.schedules && ok; ++sch) {
    if (sch > 0) restore(before);
    order(sch, 0xb10c, &bo, unsigned(nblocks));
    for (unsigned b : bo) {
      const uint3 bid{b % grid.x, b / grid.x % grid.y, unsigned(b / (uint64_t(grid.x) * grid.y))};
      if (!run_block(s, sch, grid, block, bid)) {
        reset_stuck_fibers(s);
        ok = false;
        break;
      }
    }
    if (ok) ok = guards_intact();
    if (ok && s.schedules > 1) {
      if (sch == 0) {
        first = snapshot();
      } else if (std::vector<unsigned char> now = snapshot(); now != first) {
        fail("the result depends on the order in which threads or blocks run (schedule " +
             std::to_string(sch) + " differs from schedule 0 first at " +
             first_difference(first, now) + "): a missing __syncthreads or a race");
        ok = false;
      }
    }
  }
  s.body = nullptr;
  return ok;
}

void* device_alloc(size_t bytes) {
  Alloc a{bytes, std::unique_ptr<unsigned char[]>(new unsigned char[bytes + 2 * kGuardBytes])};
  std::memset(a.mem.get(), kGuardByte, kGuardBytes);
  std::memset(a.mem.get() + kGuardBytes, 0xCD, bytes);  // device memory starts as garbage
  std::memset(a.mem.get() + kGuardBytes + bytes, kGuardByte, kGuardBytes);
  unsigned char* p = a.mem.get() + kGuardBytes;
  std::lock_guard<std::mutex> l(allocs_mu());
  allocs().emplace(p, std::move(a));
  return p;
}

void device_free(void* p) {
  std::lock_guard<std::mutex> l(allocs_mu());
  allocs().erase(static_cast<unsigned char*>(p));
}

namespace {
Hooks g_hooks;  // set once, before any launch
}  // namespace
void set_hooks(const Hooks& h) {
  g_hooks = h;
}
const Hooks& hooks() {
  return g_hooks;
}

void set_schedules(int n) {
  st().schedules = std::max(1, n);
}
std::string last_error_text() {
  return st().error;
}
void clear_error() {
  st().error.clear();
}
uint64_t launches() {
  return st().launches;
}

}  // namespace optireduce::emu

cudaError_t cudaGetLastError() {
  // A failed launch stays reported until emu::clear_error(), as a launch failure stays sticky
  // on a GPU (the emulation's only error).
  return optireduce::emu::last_error_text().empty() ? cudaSuccess : cudaErrorLaunchFailure;
}

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorLaunchFailure:
      return "unspecified launch failure";
  }
  return "unknown error";
}

cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, CUstream_st* stream) {
  const auto& h = optireduce::emu::hooks();
  if (h.check != nullptr) h.check(p, "cudaMemsetAsync destination");
  if (h.queue != nullptr) {
    h.queue(stream, [=] { std::memset(p, value, bytes); });
  } else {
    std::memset(p, value, bytes);
  }
  return cudaSuccess;
}
