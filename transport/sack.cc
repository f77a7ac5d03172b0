// PacketBitmap implementation.
#include "transport/sack.h"

#include <algorithm>
#include <cstring>

namespace optireduce {

void PacketBitmap::reset(uint32_t npkts) {
  const size_t words = (static_cast<size_t>(npkts) + 63) / 64;
  if (words_.size() < words) words_.resize(words);
  std::fill(words_.begin(), words_.begin() + static_cast<long>(words), 0);
  npkts_ = npkts;
  count_ = 0;
}

bool PacketBitmap::set(uint32_t i) {
  uint64_t& w = words_[i >> 6];
  const uint64_t bit = uint64_t{1} << (i & 63);
  if (w & bit) return false;
  w |= bit;
  ++count_;
  return true;
}

uint32_t PacketBitmap::first_clear(uint32_t from) const {
  for (uint32_t i = from; i < npkts_;) {
    const uint64_t w = ~words_[i >> 6] >> (i & 63);
    if (w != 0) return std::min(npkts_, i + static_cast<uint32_t>(__builtin_ctzll(w)));
    i = (i | 63) + 1;
  }
  return npkts_;
}

uint32_t PacketBitmap::export_bits(uint32_t base, uint32_t nbits, uint8_t* out) const {
  std::memset(out, 0, nbits / 8);
  uint32_t used = 0;
  const uint32_t end = std::min(npkts_, base + nbits);
  for (uint32_t i = base; i < end; ++i) {
    if (test(i)) {
      out[(i - base) >> 3] |= static_cast<uint8_t>(1u << ((i - base) & 7));
      used = ((i - base) >> 3) + 1;
    }
  }
  return used;
}

}  // namespace optireduce
