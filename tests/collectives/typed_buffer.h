// Element access to an optiDataType_t buffer as doubles, for tests that check allreduce results
// of every type with one code path (fp16/bf16 go through the library's own conversions).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "collectives/elem.h"
#include "collectives/optireduce.h"

namespace optireduce::testing {

inline double get(optiDataType_t t, const std::vector<uint8_t>& b, size_t i) {
  using coll::DType;
  using coll::Elem;
  switch (t) {
    case optiFloat32:
      return Elem<DType::kF32>::load(reinterpret_cast<const uint32_t*>(b.data())[i]);
    case optiFloat16:
      return Elem<DType::kF16>::load(reinterpret_cast<const uint16_t*>(b.data())[i]);
    case optiBfloat16:
      return Elem<DType::kBF16>::load(reinterpret_cast<const uint16_t*>(b.data())[i]);
    case optiFloat64:
      return Elem<DType::kF64>::load(reinterpret_cast<const uint64_t*>(b.data())[i]);
  }
  return 0;
}

inline void set(optiDataType_t t, std::vector<uint8_t>& b, size_t i, double v) {
  using coll::DType;
  using coll::Elem;
  switch (t) {
    case optiFloat32:
      reinterpret_cast<uint32_t*>(b.data())[i] = Elem<DType::kF32>::store(float(v));
      break;
    case optiFloat16:
      reinterpret_cast<uint16_t*>(b.data())[i] = Elem<DType::kF16>::store(float(v));
      break;
    case optiBfloat16:
      reinterpret_cast<uint16_t*>(b.data())[i] = Elem<DType::kBF16>::store(float(v));
      break;
    case optiFloat64:
      reinterpret_cast<uint64_t*>(b.data())[i] = Elem<DType::kF64>::store(v);
      break;
  }
}

inline size_t esize(optiDataType_t t) { return t == optiFloat64 ? 8 : t == optiFloat32 ? 4 : 2; }

}  // namespace optireduce::testing
