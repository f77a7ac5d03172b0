// Kernels (exchange.h) on host memory: the host kernels of kernels_host.h plus the scratch
// buffers and the sign-mask cache of one communicator.
#pragma once

#include <cstring>
#include <memory>
#include <vector>

#include "collectives/exchange.h"
#include "collectives/kernels_host.h"

namespace optireduce::coll {

class HostKernels final : public Kernels {
 public:
  void* scratch(int slot, size_t bytes) override;
  void copy(void* dst, const void* src, size_t bytes) override {
    if (dst != src && bytes > 0) std::memcpy(dst, src, bytes);
  }
  void encode(DType t, const void* in, void* out, const HadamardGeometry& g,
              uint64_t seed) override;
  void decode(DType t, const void* in, void* out, const HadamardGeometry& g, uint64_t seed,
              double scale, const void* fallback, double fallback_scale, Erasure policy) override;
  void reduce(DType t, const void* const* srcs, const uint8_t* lossy, int nranks, void* out,
              size_t n, RedOp op, Erasure policy) override;
  void fill_lost(DType t, void* dst, const void* received, const void* own, size_t n,
                 double own_scale, Erasure policy) override;
  void flag_nonfinite(DType t, const void* data, size_t n, void* flag) override;
  void flag_lost(double threshold, uint64_t expected, void* flag) override;
  void nonfinite_verdict(DType t, void* out, size_t n, const void* flags, int nranks) override;
  void read_back(void* host_dst, const void* src, size_t bytes) override {
    if (bytes > 0) std::memcpy(host_dst, src, bytes);
  }
  void take_counters(uint64_t* out) override;

 private:
  const uint32_t* masks(uint64_t seed, size_t block);

  static constexpr int kSlots = 5;
  // 64-byte aligned so vector loads never split cache lines; grown, never shrunk.
  struct Region {
    std::unique_ptr<uint8_t[], void (*)(void*)> mem{nullptr, nullptr};
    size_t bytes = 0;
  };
  Region regions_[kSlots];
  std::vector<uint32_t> masks_;
  uint64_t masks_seed_ = 0;
  size_t masks_block_ = 0;
  uint64_t counters_[kNumCounters] = {};
};

}  // namespace optireduce::coll
