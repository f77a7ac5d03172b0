// The launchers of cuda/launch.h for the emulated GPU: each checks that its buffers are device
// memory, copies its host-side arguments at launch (as a kernel launch copies its parameters),
// and enqueues the host twin (collectives/kernels_host.h) on the stream. Counters are added
// with atomics, as the CUDA kernels do, because two streams may run at once.
#include <atomic>
#include <vector>

#include "collectives/kernels_host.h"
#include "cuda/launch.h"
#include "tests/gpu_emu/device_memory.h"
#include "tests/gpu_emu/streams.h"

namespace optireduce::coll::cuda {

namespace {

namespace emu = optireduce::gpu_emu;

void add(unsigned long long* counters, int which, uint64_t v) {
  std::atomic_ref<unsigned long long>(counters[which]).fetch_add(v, std::memory_order_relaxed);
}

void check_counters(unsigned long long* counters) {
  emu::require_device(counters, sizeof(unsigned long long) * kNumCounters, "kernel counters");
}

std::vector<uint32_t> masks(uint64_t seed, uint64_t block) {
  std::vector<uint32_t> m(block);
  fill_sign_masks(m.data(), block, seed);
  return m;
}

}  // namespace

size_t hadamard_work_bytes(const HadamardGeometry& g, DType) {
  // The CUDA kernels transform in an fp32/fp64 copy; the twin needs none, but the schedule's
  // region must still be device memory of some size, so ask for a little.
  return g.block > 0 ? 256 : 0;
}

int encode(DType t, const void* in, void* out, const HadamardGeometry& g, uint64_t seed, void* work,
           Stream s) {
  const size_t es = dtype_size(t);
  emu::require_device(in, g.count * es, "encode input");
  emu::require_device(out, g.encoded() * es, "encode output");
  emu::require_device(work, hadamard_work_bytes(g, t), "encode workspace");
  emu::enqueue(s, [=] {
    const std::vector<uint32_t> m = masks(seed, g.block);
    hadamard_encode(t, in, out, g, m.data());
  });
  return 0;
}

int decode(DType t, const void* in, void* out, const HadamardGeometry& g, uint64_t seed,
           double scale, const void* fallback, double fallback_scale, Erasure policy, void* work,
           unsigned long long* counters, Stream s) {
  const size_t es = dtype_size(t);
  emu::require_device(in, g.encoded() * es, "decode input");
  emu::require_device(out, g.count * es, "decode output");
  if (fallback != nullptr) emu::require_device(fallback, g.count * es, "decode fallback");
  emu::require_device(work, hadamard_work_bytes(g, t), "decode workspace");
  check_counters(counters);
  emu::enqueue(s, [=] {
    const std::vector<uint32_t> m = masks(seed, g.block);
    const DecodeResult r =
        hadamard_decode(t, in, out, g, m.data(), scale, fallback, fallback_scale, policy);
    add(counters, kLostPhase2, r.lost);
    add(counters, kBlocksEmpty, r.blocks_empty);
  });
  return 0;
}

size_t reduce_work_bytes(size_t, int) {
  return 0;
}

int reduce(DType t, const void* const* srcs, const uint8_t* lossy, int nranks, void* out, size_t n,
           RedOp op, Erasure policy, void* work, unsigned long long* counters, Stream s) {
  const size_t es = dtype_size(t);
  // The pointer arrays live on the host and are copied into the launch, as kernels.cu does.
  std::vector<const void*> src(srcs, srcs + nranks);
  std::vector<uint8_t> lost(lossy, lossy + nranks);
  for (const void* p : src) emu::require_device(p, n * es, "reduce source");
  emu::require_device(out, n * es, "reduce output");
  emu::require_device(work, 0, "reduce workspace");
  check_counters(counters);
  emu::enqueue(s, [=, src = std::move(src), lost = std::move(lost)] {
    add(counters, kLostPhase1,
        reduce_shard(t, src.data(), lost.data(), nranks, out, n, op, policy));
  });
  return 0;
}

int fill_lost(DType t, void* dst, const void* received, const void* own, size_t n, double own_scale,
              Erasure policy, unsigned long long* counters, Stream s) {
  const size_t es = dtype_size(t);
  emu::require_device(dst, n * es, "fill_lost destination");
  emu::require_device(received, n * es, "fill_lost received");
  emu::require_device(own, n * es, "fill_lost own");
  check_counters(counters);
  emu::enqueue(s, [=] {
    add(counters, kLostPhase2, coll::fill_lost(t, dst, received, own, n, own_scale, policy));
  });
  return 0;
}

int safeguard_flag(unsigned long long* counters, const unsigned long long* base, double threshold,
                   uint64_t expected, uint8_t* flag, Stream s) {
  check_counters(counters);
  emu::require_device(base, sizeof(unsigned long long) * kNumCounters, "safeguard base");
  emu::require_device(flag, 1, "safeguard flag");
  emu::enqueue(s, [=] {
    std::atomic_ref<unsigned long long> l1(counters[kLostPhase1]), l2(counters[kLostPhase2]);
    const uint64_t lost = (l1.load() - base[kLostPhase1]) + (l2.load() - base[kLostPhase2]);
    const bool f = expected > 0 && double(lost) / double(expected) > threshold;
    *flag = f ? 1 : 0;
    if (f) add(counters, kSafeguardFlags, 1);
  });
  return 0;
}

int last_error() {
  return 0;
}

const char* error_string(int err) {
  return err == 0 ? "no error" : "emulated CUDA error";
}

}  // namespace optireduce::coll::cuda
