// Normally distributed elements of any storage type, for the kernel tests that compare a device
// kernel (on a GPU, or through the emulation) with its host reference.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "collectives/elem.h"

namespace optireduce::coll {

template <DType T>
std::vector<typename Elem<T>::S> random_elems(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> g;
  std::vector<typename Elem<T>::S> v(n);
  for (auto& x : v) x = Elem<T>::store(typename Elem<T>::A(g(rng)));
  return v;
}

}  // namespace optireduce::coll
