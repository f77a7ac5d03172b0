// Host-callable launchers of the CUDA kernels (kernels.cu), one per host kernel of
// collectives/kernels_host.h with the same semantics, all asynchronous on the given stream.
// Plain C++ (no CUDA headers), so gpu_comm.cc compiles with g++.
#pragma once

#include <cstddef>
#include <cstdint>

#include "collectives/elem.h"
#include "collectives/kernels_host.h"

struct CUstream_st;

namespace optireduce::coll::cuda {

using Stream = CUstream_st*;

// Sources per reduce launch; more ranks take several launches through a fp32 workspace.
inline constexpr int kMaxSourcesPerLaunch = 16;

// counters: device array of kNumCounters unsigned 64-bit counters (elem.h's Counter).
// work: device scratch of at least work_bytes(...) bytes.
size_t hadamard_work_bytes(const HadamardGeometry& g, DType t);
int encode(DType t, const void* in, void* out, const HadamardGeometry& g, uint64_t seed, void* work,
           Stream s);
int decode(DType t, const void* in, void* out, const HadamardGeometry& g, uint64_t seed,
           double scale, const void* fallback, double fallback_scale, Erasure policy, void* work,
           unsigned long long* counters, Stream s);

size_t reduce_work_bytes(size_t n, int nranks);
int reduce(DType t, const void* const* srcs, const uint8_t* lossy, int nranks, void* out, size_t n,
           RedOp op, Erasure policy, void* work, unsigned long long* counters, Stream s);
int fill_lost(DType t, void* dst, const void* received, const void* own, size_t n, double own_scale,
              Erasure policy, unsigned long long* counters, Stream s);

// The safeguard's verdict on the device: ORs kFlagLost into *flag when (counters - base)[lost
// phase 1 + 2] exceeds threshold x expected (and counters[kSafeguardFlags] grows by one).
int safeguard_flag(unsigned long long* counters, const unsigned long long* base, double threshold,
                   uint64_t expected, uint8_t* flag, Stream s);

// The non-finite verdict (kernels_host.h's count_nonfinite and apply_nonfinite_verdict):
// count_nonfinite adds data's NaN/Inf elements to counters[kNonFiniteElements];
// nonfinite_flag writes *flag = kFlagNonFinite when that counter moved since `base`, else 0;
// nonfinite_verdict sets out[0, n) to the quiet NaN and counts kNonFiniteCalls when some byte of
// flags[0, nranks) (device memory) has kFlagNonFinite.
int count_nonfinite(DType t, const void* data, size_t n, unsigned long long* counters, Stream s);
int nonfinite_flag(const unsigned long long* counters, const unsigned long long* base,
                   uint8_t* flag, Stream s);
int nonfinite_verdict(DType t, void* out, size_t n, const uint8_t* flags, int nranks,
                      unsigned long long* counters, Stream s);

// Returns a cudaError_t value (0 = success) of the last launch on this thread.
int last_error();
const char* error_string(int err);

}  // namespace optireduce::coll::cuda
