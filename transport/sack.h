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
  // beyond size() read as 0. Returns the bytes needed to hold the last set bit.
  uint32_t export_bits(uint32_t base, uint32_t nbits, uint8_t* out) const;

 private:
  std::vector<uint64_t> words_;
  uint32_t npkts_ = 0;
  uint32_t count_ = 0;
};

}  // namespace optireduce
