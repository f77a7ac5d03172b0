// Memory layout and index arithmetic of the UD endpoint's receive and send rings, kept apart
// from the verbs calls so that it is tested without a device. Rings are powers of two indexed
// by free-running 64-bit sequence numbers (they never wrap in practice: 2^64 datagrams).
#pragma once

#include <cstdint>

#include "verbs/address.h"

namespace optireduce::verbs {

inline constexpr uint32_t kCacheLineBytes = 64;

constexpr bool is_pow2(uint64_t v) {
  return v != 0 && (v & (v - 1)) == 0;
}
constexpr uint32_t round_up(uint32_t v, uint32_t align) {
  return (v + align - 1) / align * align;
}

// One receive slot: [pad][40-byte GRH][payload rounded up to a cache line]. The pad puts the
// GRH's end, and so the payload, on a 64-byte boundary: the transport reads its header and
// copies payload out of aligned memory. The receive SGE covers GRH + capacity exactly, so a
// datagram larger than the capacity completes with a length error instead of overrunning.
struct RecvSlotLayout {
  uint32_t stride_bytes;    // distance between consecutive slots (a multiple of 64)
  uint32_t grh_offset;      // where the receive SGE starts within the slot
  uint32_t payload_offset;  // where the datagram starts (64-byte aligned)
  uint32_t sge_bytes;       // kGrhBytes + capacity
};
static_assert(kGrhBytes <= kCacheLineBytes, "the GRH must fit in the slot's first cache line");

constexpr RecvSlotLayout recv_slot_layout(uint32_t capacity_bytes) {
  return RecvSlotLayout{kCacheLineBytes + round_up(capacity_bytes, kCacheLineBytes),
                        kCacheLineBytes - kGrhBytes, kCacheLineBytes, kGrhBytes + capacity_bytes};
}

// The power-of-two slot count whose datagrams add up to at least `budget_bytes`, clamped to
// [min_slots, max_slots] (max_slots rounded down to a power of two; min_slots a power of two).
constexpr uint32_t ring_slots(uint64_t budget_bytes, uint32_t datagram_bytes, uint32_t min_slots,
                              uint32_t max_slots) {
  uint32_t cap = 1;
  while (cap * 2 <= max_slots && cap * 2 != 0) cap *= 2;
  uint64_t want = datagram_bytes ? (budget_bytes + datagram_bytes - 1) / datagram_bytes : 0;
  uint32_t slots = min_slots;
  while (slots < want && slots < cap) slots *= 2;
  return slots < cap ? slots : cap;
}

// An endpoint's receive slots. One connection's endpoint holds what its UDP socket buffer would
// (`budget_bytes`, OPTIREDUCE_SOCKET_BUFFER). An unbound endpoint is the one QP that receives for
// every connection of its device and thread, whose bursts add up and whose datagrams wait for
// whoever drains next: it takes the largest ring within [min_slots, max_slots] whatever the
// budget, since its memory is paid once per device and thread, not per connection.
constexpr uint32_t recv_ring_slots(uint64_t budget_bytes, uint32_t datagram_bytes, bool unbound,
                                   uint32_t min_slots, uint32_t max_slots) {
  const uint64_t largest = uint64_t{max_slots} * datagram_bytes;
  return ring_slots(unbound && largest > budget_bytes ? largest : budget_bytes, datagram_bytes,
                    min_slots, max_slots);
}

// The slot a free-running sequence number lands in.
constexpr uint32_t ring_slot(uint64_t seq, uint32_t slots) {
  return static_cast<uint32_t>(seq & (slots - 1));
}

// Selective signaling: send work request `seq` (0-based, free-running) asks for a completion
// when it closes a group of `every`; its completion then retires the whole group, because a
// queue pair completes its sends in order.
constexpr bool signal_wr(uint64_t seq, uint32_t every) {
  return (seq + 1) % every == 0;
}

}  // namespace optireduce::verbs
