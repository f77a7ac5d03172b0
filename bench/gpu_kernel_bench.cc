// GPU kernel bandwidth against device-to-device memcpy measured in the same run: Hadamard encode
// and decode (the default block, 4096), the phase-1 reduce of 4 sources and the phase-2 fill, per
// dtype, for bucket sizes from --min to --max MiB (x4 steps). GB/s counts every byte a kernel
// must read and write once (encode/decode: 2 x bucket; reduce: 5 x shard; fill: 3 x n); memcpy's
// is 2 x bytes too, so the ratio is the fraction of the copy's bandwidth the kernel reaches.
// Goals (issue 13): encode and decode >= 0.5, reduce >= 0.7.
//
// Built against the real CUDA runtime where one is found, and in the gpu_emu test suite against
// the emulated one (the kernels run by the CPU emulation), where --check compares every result
// with the host kernels bit for bit and the timings mean nothing.
//   gpu_kernel_bench [--min MiB=1] [--max MiB=256] [--reps N=20] [--check] [--kib N]
// (--kib: one bucket of N KiB instead of the MiB range, for the emulation's check.)
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "collectives/kernels_host.h"
#include "cuda/launch.h"
#include "tests/collectives/random_elems.h"

using namespace optireduce::coll;

namespace {

constexpr uint64_t kBlock = 4096;
constexpr int kSources = 4;
constexpr uint64_t kSeed = 7;

struct Options {
  uint64_t min_mib = 1, max_mib = 256, kib = 0;
  int reps = 20;
  bool check = false;
};

// False after printing the usage: to stdout for --help (*rc 0), else to stderr (*rc 2).
bool parse(int argc, char** argv, Options* o, int* rc) {
  const char* usage =
      "usage: gpu_kernel_bench [--min MiB] [--max MiB] [--reps N] [--check] [--kib N]\n";
  *rc = 2;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::fputs(usage, stdout);
      *rc = 0;
      return false;
    }
    auto num = [&](auto* v) {
      if (i + 1 >= argc) return false;
      char* end = nullptr;
      const long long x = std::strtoll(argv[++i], &end, 10);
      if (*end != '\0' || x <= 0) return false;
      *v = static_cast<std::remove_reference_t<decltype(*v)>>(x);
      return true;
    };
    bool good = true;
    if (a == "--min") {
      good = num(&o->min_mib);
    } else if (a == "--max") {
      good = num(&o->max_mib);
    } else if (a == "--reps") {
      good = num(&o->reps);
    } else if (a == "--kib") {
      good = num(&o->kib);
    } else if (a == "--check") {
      o->check = true;
    } else {
      good = false;
    }
    if (!good) {
      std::fputs(usage, stderr);
      return false;
    }
  }
  if (o->min_mib > o->max_mib) {
    std::fprintf(stderr, "--min: at most --max\n%s", usage);
    return false;
  }
  return true;
}

void ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "gpu_kernel_bench: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

void* dev(size_t bytes) {
  void* p = nullptr;
  ok(cudaMalloc(&p, bytes), "cudaMalloc");
  return p;
}

// Seconds per call: the best of `reps` timed calls, each synchronised.
template <class F>
double seconds(int reps, F&& fn) {
  double best = 1e30;
  for (int i = 0; i < reps + 1; ++i) {  // the first is a warm-up
    ok(cudaDeviceSynchronize(), "sync");
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    ok(cudaDeviceSynchronize(), "sync");
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (i > 0 && s < best) best = s;
  }
  return best;
}

template <class S>
std::vector<S> download(const void* p, size_t n) {
  std::vector<S> v(n);
  ok(cudaMemcpy(v.data(), p, n * sizeof(S), cudaMemcpyDeviceToHost), "download");
  return v;
}

int g_failures = 0;
template <class S>
void expect_equal(const std::vector<S>& got, const std::vector<S>& want, const char* what) {
  if (std::memcmp(got.data(), want.data(), want.size() * sizeof(S)) != 0) {
    std::fprintf(stderr, "gpu_kernel_bench --check: %s differs from the host kernel\n", what);
    ++g_failures;
  }
}

const char* name(DType t) {
  return t == DType::kF32    ? "fp32"
         : t == DType::kF16  ? "fp16"
         : t == DType::kBF16 ? "bf16"
                             : "fp64";
}

template <DType T>
void run(const Options& o, uint64_t kib) {
  using S = typename Elem<T>::S;
  const size_t n = (kib << 10) / sizeof(S);
  const HadamardGeometry g{n, kBlock};
  const auto host_in = random_elems<T>(n, uint32_t(kib));
  auto* in = static_cast<S*>(dev(n * sizeof(S)));
  auto* enc = static_cast<S*>(dev(g.encoded() * sizeof(S)));
  auto* out = static_cast<S*>(dev(g.encoded() * sizeof(S)));
  void* work = dev(cuda::hadamard_work_bytes(g, T) + cuda::reduce_work_bytes(n, kSources) + 256);
  auto* counters = static_cast<unsigned long long*>(dev(sizeof(unsigned long long) * kNumCounters));
  ok(cudaMemcpy(in, host_in.data(), n * sizeof(S), cudaMemcpyHostToDevice), "upload");
  ok(cudaMemset(counters, 0, sizeof(unsigned long long) * kNumCounters), "memset");
  const double bytes = double(n * sizeof(S));
  const double copy = seconds(o.reps, [&] {
    ok(cudaMemcpyAsync(out, in, n * sizeof(S), cudaMemcpyDeviceToDevice, nullptr), "memcpy");
  });
  const double enc_s = seconds(o.reps, [&] {
    ok(cudaError_t(cuda::encode(T, in, enc, g, kSeed, work, nullptr)), "encode");
  });
  const double dec_s = seconds(o.reps, [&] {
    ok(cudaError_t(cuda::decode(T, enc, out, g, kSeed, 1.0, in, 1.0, Erasure::kRescale, work,
                                counters, nullptr)),
       "decode");
  });
  // Reduce: 4 shards of n/4 (what one rank reduces of 4 ranks' buckets), in, enc, out, work.
  const size_t shard = n / kSources;
  const void* srcs[kSources] = {in, in + shard, in + 2 * shard, in + 3 * shard};
  const uint8_t lossy[kSources] = {0, 1, 1, 1};
  const double red_s = seconds(o.reps, [&] {
    ok(cudaError_t(cuda::reduce(T, srcs, lossy, kSources, out, shard, RedOp::kSum,
                                Erasure::kRescale, work, counters, nullptr)),
       "reduce");
  });
  const double fill_s = seconds(o.reps, [&] {
    ok(cudaError_t(cuda::fill_lost(T, out, enc, in, n, 4.0, Erasure::kRescale, counters, nullptr)),
       "fill");
  });
  const double copy_gbs = 2 * bytes / copy / 1e9;
  auto line = [&](const char* k, double moved, double s) {
    const double gbs = moved / s / 1e9;
    std::printf("%-7s %-5s %8llu KiB  %8.1f GB/s  %5.2fx memcpy (%.1f GB/s)\n", k, name(T),
                (unsigned long long)kib, gbs, gbs / copy_gbs, copy_gbs);
  };
  line("encode", 2 * bytes, enc_s);
  line("decode", 2 * bytes, dec_s);
  line("reduce", double(kSources + 1) * double(shard * sizeof(S)), red_s);
  line("fill", 3 * bytes, fill_s);
  std::fflush(stdout);
  if (o.check) {  // the last call of each kernel against its host reference
    std::vector<uint32_t> masks(kBlock);
    fill_sign_masks(masks.data(), kBlock, kSeed);
    std::vector<S> want(g.encoded());
    hadamard_encode(T, host_in.data(), want.data(), g, masks.data());
    const auto got_enc = download<S>(enc, g.encoded());
    expect_equal(got_enc, want, "encode");
    std::vector<S> dec(n);
    hadamard_decode(T, got_enc.data(), dec.data(), g, masks.data(), 1.0, host_in.data(), 1.0);
    // out was overwritten by reduce and fill since: decode once more.
    ok(cudaError_t(cuda::decode(T, enc, out, g, kSeed, 1.0, in, 1.0, Erasure::kRescale, work,
                                counters, nullptr)),
       "decode");
    expect_equal(download<S>(out, n), dec, "decode");
  }
  for (void* p : {static_cast<void*>(in), static_cast<void*>(enc), static_cast<void*>(out), work,
                  static_cast<void*>(counters)})
    cudaFree(p);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (int rc = 0; !parse(argc, argv, &o, &rc)) return rc;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("gpu_kernel_bench: no CUDA device\n");
    return 0;
  }
  std::vector<uint64_t> kibs;
  if (o.kib > 0) kibs.push_back(o.kib);
  for (uint64_t mib = o.min_mib; o.kib == 0 && mib <= o.max_mib; mib *= 4)
    kibs.push_back(mib << 10);
  for (uint64_t kib : kibs) {
    run<DType::kF32>(o, kib);
    run<DType::kF16>(o, kib);
    run<DType::kBF16>(o, kib);
    run<DType::kF64>(o, kib);
  }
  return g_failures == 0 ? 0 : 1;
}
