// Per-message packet bitmap: which packets of a message have arrived (receiver) or have been
// acknowledged (sender). Storage grows only when a message has more packets than any before it
// on this connection, so steady-state traffic allocates nothing.
#pragma once

#include <cstdint>
#include <vector>

namespace optireduce {

class PacketBitmap {
 public:
  // Clears the bitmap for a message of `npkts` packets.
  void reset(uint32_t npkts);

  uint32_t size() const { return npkts_; }
  uint32_t count() const { return count_; }
  bool full() const { return count_ == npkts_; }
  bool test(uint32_t i) const { return (words_[i >> 6] >> (i & 63)) & 1u; }
  // Sets bit i; returns false if it was already set (a duplicate).
  bool set(uint32_t i);
  // Index of the first clear bit at or after `from`, or size() if none.
  uint32_t first_clear(uint32_t from) const;
  // Writes bits [base, base + nbits) LSB-first into out (nbits/8 bytes, nbits % 8 == 0); bits
  // beyond size() read as 0. Returns the bytes needed to hold the last set bit. Works 64 bits
  // at a time: a SACK is built once per message per received burst, so at 1024 bits a
  // bit-at-a-time loop would cost more than the packets it acknowledges.
  uint32_t export_bits(uint32_t base, uint32_t nbits, uint8_t* out) const;

 private:
  std::vector<uint64_t> words_;
  uint32_t npkts_ = 0;
  uint32_t count_ = 0;
};

// Calls fn(i) for every set bit i of an LSB-first bitmap of `nbytes` bytes (the wire's SACK
// layout), in ascending order, until fn returns false. Reads 64 bits at a time and visits only
// the set bits (count trailing zeros), so a sparse or empty SACK costs a few loads.
template <typename Fn>
void for_each_set_bit(const uint8_t* bytes, uint32_t nbytes, Fn&& fn) {
  for (uint32_t at = 0; at < nbytes; at += 8) {
    const uint32_t take = nbytes - at < 8 ? nbytes - at : 8;
    uint64_t w = 0;
    for (uint32_t b = 0; b < take; ++b) w |= uint64_t{bytes[at + b]} << (8 * b);
    while (w != 0) {
      const uint32_t bit = static_cast<uint32_t>(__builtin_ctzll(w));
      w &= w - 1;
      if (!fn(at * 8 + bit)) return;
    }
  }
}

}  // namespace optireduce
