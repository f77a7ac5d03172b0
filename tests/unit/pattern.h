// Test data: a reproducible byte pattern per seed (xorshift32), so that a misplaced, duplicated
// or stale packet shows up as a byte that differs from what its seed says.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace optireduce::testing {

inline std::vector<uint8_t> pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& b : v) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    b = static_cast<uint8_t>(x);
  }
  return v;
}

}  // namespace optireduce::testing
