// How the fuzz targets read their input: a cursor over libFuzzer's bytes that hands out small
// little-endian numbers (zeros once the input is spent, so that every record is complete) and
// length-prefixed raw datagrams. Shared so that the two targets' inputs read the same way and a
// corpus entry of one means the same kind of thing to the other.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace optireduce::fuzz {

class Input {
 public:
  Input(const uint8_t* data, size_t size, size_t pos = 0) : data_(data), size_(size), pos_(pos) {}

  bool more() const { return pos_ < size_; }

  // The next n (at most 4) bytes as a little-endian number.
  uint32_t take(size_t n) {
    uint32_t v = 0;
    for (size_t i = 0; i < n && pos_ < size_; ++i) v |= uint32_t{data_[pos_++]} << (8 * i);
    return v;
  }

  // A raw datagram: a 2-byte length, then that many bytes (fewer where the input ends).
  std::vector<uint8_t> raw() {
    size_t len = take(2);
    if (len > size_ - pos_) len = size_ - pos_;
    std::vector<uint8_t> d(data_ + pos_, data_ + pos_ + len);
    pos_ += len;
    return d;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_;
};

}  // namespace optireduce::fuzz
