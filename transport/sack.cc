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
  const uint32_t nbytes = nbits / 8;
  std::memset(out, 0, nbytes);
  // Bits at or beyond npkts_ read as 0 (the words hold no garbage past it after reset(), but
  // a longer message before may have left bits in the storage beyond this one's words).
  const uint32_t end = npkts_ > base ? std::min(npkts_ - base, nbits) : 0;
  uint32_t used = 0;
  for (uint32_t at = 0; at < end; at += 64) {
    // 64 bits from bit base + at, straddling two storage words unless aligned.
    const uint32_t i = base + at;
    const uint32_t shift = i & 63;
    uint64_t w = words_[i >> 6] >> shift;
    if (shift != 0 && (i >> 6) + 1 < words_.size()) w |= words_[(i >> 6) + 1] << (64 - shift);
    if (end - at < 64) w &= (uint64_t{1} << (end - at)) - 1;
    if (w == 0) continue;
    const uint32_t first_byte = at / 8;
    for (uint32_t b = 0; b < 8 && first_byte + b < nbytes; ++b)
      out[first_byte + b] = static_cast<uint8_t>(w >> (8 * b));
    used = first_byte + (63 - static_cast<uint32_t>(__builtin_clzll(w))) / 8 + 1;
  }
  return used;
}

}  // namespace optireduce
