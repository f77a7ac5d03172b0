// Hadamard encode + decode throughput of the host kernels against memcpy of the same bytes, per
// element type, block size and instruction set (every variant this CPU has, side by side).
// Usage: hadamard_bench [MiB=64] [repeats=5]. Prints one line per case; GB/s = bucket bytes /
// time (1e9); "x prev" is enc+dec throughput over the narrower variant's line above it.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "bench/flags.h"
#include "collectives/kernels_host.h"

using namespace optireduce::coll;

namespace {

double best_seconds(int repeats, auto&& fn) {
  double best = 1e30;
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = s < best ? s : best;
  }
  return best;
}

const char* name(DType t) {
  switch (t) {
    case DType::kF32:
      return "fp32";
    case DType::kF16:
      return "fp16";
    case DType::kBF16:
      return "bf16";
    case DType::kF64:
      return "fp64";
  }
  return "?";
}

// A whole number in [lo, hi], nothing after it.
bool whole(const char* s, long lo, long hi, long* out) {
  char* end = nullptr;
  const long v = std::strtol(s, &end, 10);
  if (end == s || *end != '\0' || v < lo || v > hi) return false;
  *out = v;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  long mib_arg = 64, repeats_arg = 5;
  const char* usage = "usage: hadamard_bench [MiB (1-4096), default 64] [repeats, default 5]\n";
  if (optireduce::bench::asks_for_help(argc, argv)) {
    std::fputs(usage, stdout);
    return 0;
  }
  if (argc > 3 || (argc > 1 && !whole(argv[1], 1, 4096, &mib_arg)) ||
      (argc > 2 && !whole(argv[2], 1, 1000000, &repeats_arg))) {
    std::fputs(usage, stderr);
    return 2;
  }
  const size_t mib = size_t(mib_arg);
  const int repeats = int(repeats_arg);
  const size_t bytes = mib << 20;
  std::vector<uint8_t> in(bytes), enc(bytes + (1 << 20)), out(bytes);
  for (size_t i = 0; i < bytes; i += 2) {  // finite values of every type: small fp16/bf16 pairs
    in[i] = uint8_t(i * 37);
    in[i + 1] = uint8_t(0x3C);
  }
  const double t_memcpy = best_seconds(repeats, [&] { std::memcpy(out.data(), in.data(), bytes); });
  std::printf("memcpy %zu MiB: %.2f GB/s\n", mib, double(bytes) / t_memcpy / 1e9);
  std::printf("%-5s %7s %-7s %10s %10s %12s %14s %7s\n", "type", "block", "simd", "enc GB/s",
              "dec GB/s", "enc+dec GB/s", "memcpy/(e+d)", "x prev");
  const HostSimd best = best_host_simd();
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16, DType::kF64}) {
    for (uint64_t block : {256u, 4096u, 65536u}) {
      const size_t count = bytes / dtype_size(t);
      HadamardGeometry g{count, block};
      std::vector<uint32_t> masks(block);
      fill_sign_masks(masks.data(), block, 1234);
      double prev = 0;
      for (int v = 0; v <= int(best); ++v) {
        const HostSimd simd = select_host_simd(HostSimd(v));  // every one up to the best
        const double te = best_seconds(
            repeats, [&] { hadamard_encode(t, in.data(), enc.data(), g, masks.data()); });
        const double td = best_seconds(repeats, [&] {
          hadamard_decode(t, enc.data(), out.data(), g, masks.data(), 1.0, in.data(), 1.0);
        });
        const double gbe = double(bytes) / te / 1e9, gbd = double(bytes) / td / 1e9;
        const double gbed = double(bytes) / (te + td) / 1e9;
        std::printf("%-5s %7llu %-7s %10.2f %10.2f %12.2f %14.2f", name(t),
                    (unsigned long long)block, host_simd_name(simd), gbe, gbd, gbed,
                    (double(bytes) / t_memcpy / 1e9) / gbed);
        if (prev > 0) std::printf(" %6.2fx", gbed / prev);
        std::printf("\n");
        prev = gbed;
      }
    }
  }
  return 0;
}
