// RxBacklog: a byte ring of records. The producer copies under the lock (a rare path: only a
// busy connection gets copies); the consumer reads its records outside it, since the producer
// writes only beyond the tail the consumer saw and never past the head it has not advanced.
#include "transport/rx_backlog.h"

#include <cstring>
#include <new>

namespace optireduce {

struct RxBacklog::Record {
  static constexpr uint32_t kWrap = UINT32_MAX;  // len of a marker: go on at the ring's start
  uint32_t len = 0;
  // A datagram received in place (RxPacket::aimed): its last `placed` bytes are at `rest`, in
  // the receive's buffer, where no other datagram writes while the receive lasts, and only the
  // header is kept here. Not copied: once the receive has ended, its buffer is the caller's
  // again, and the connection drops the datagram as stale without reading it.
  uint32_t placed = 0;
  uint8_t* rest = nullptr;
  PeerAddress from;
  uint64_t arrived_ns = 0;  // when it reached the host, from its age when kept

  uint32_t stored() const { return len - placed; }
};

namespace {
constexpr uint64_t align8(uint64_t n) {
  return (n + 7) & ~uint64_t{7};
}
}  // namespace

int RxBacklog::push(const RxPacket* pkts, int n, uint64_t now) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!ring_) {
    ring_.reset(new (std::nothrow) uint8_t[kCapacityBytes]);
    if (!ring_) return n;
  }
  int dropped = 0;
  for (int i = 0; i < n; ++i) {
    const bool aimed = pkts[i].aimed && pkts[i].rest != nullptr && pkts[i].placed <= pkts[i].len;
    const uint32_t stored = aimed ? pkts[i].len - pkts[i].placed : pkts[i].len;
    const uint64_t need = align8(sizeof(Record) + stored);
    const uint64_t at = tail_ % kCapacityBytes;
    // A record never wraps: the rest of the ring is skipped when it does not fit there.
    const uint64_t skip = at + need > kCapacityBytes ? kCapacityBytes - at : 0;
    if (tail_ - head_ + skip + need > kCapacityBytes) {
      ++dropped;
      continue;
    }
    if (skip != 0) {
      const uint32_t wrap = Record::kWrap;
      std::memcpy(&ring_[at], &wrap, sizeof(wrap));
      tail_ += skip;
    }
    Record r;
    r.len = pkts[i].len;
    r.placed = aimed ? pkts[i].placed : 0;
    r.rest = aimed ? pkts[i].rest : nullptr;
    r.from = pkts[i].from;
    r.arrived_ns = pkts[i].age_ns < now ? now - pkts[i].age_ns : now;
    uint8_t* p = &ring_[tail_ % kCapacityBytes];
    std::memcpy(p, &r, sizeof(r));
    if (stored != 0) std::memcpy(p + sizeof(r), pkts[i].data, stored);
    tail_ += need;
  }
  if (tail_ != head_) pending_.store(true);
  return dropped;
}

static_assert(sizeof(PeerAddress) % 8 == 0, "records stay 8-byte aligned");

uint64_t RxBacklog::next_record(uint64_t at, RxPacket* pkt, uint64_t now) const {
  uint32_t len;
  std::memcpy(&len, &ring_[at % kCapacityBytes], sizeof(len));
  if (len == Record::kWrap) at += kCapacityBytes - at % kCapacityBytes;
  const uint8_t* p = &ring_[at % kCapacityBytes];
  Record r;
  std::memcpy(&r, p, sizeof(r));
  if (pkt != nullptr) {
    pkt->data = p + sizeof(r);
    pkt->len = r.len;
    pkt->from = r.from;
    pkt->rest = r.rest;
    pkt->placed = r.placed;
    pkt->aimed = r.rest != nullptr;
    pkt->room = nullptr;
    pkt->guess = -1;
    // Its age counts its wait here too: the congestion controller must not take that for
    // queueing in the network (RxPacket::age_ns).
    pkt->age_ns = now > r.arrived_ns ? now - r.arrived_ns : 0;
  }
  return at + align8(sizeof(Record) + r.stored());
}

void RxBacklog::advance_head(uint64_t to) {
  std::lock_guard<std::mutex> lock(mu_);
  head_ = to;
  if (head_ == tail_) {
    ring_.reset();  // empty: an idle connection keeps nothing
    head_ = tail_ = 0;
    pending_.store(false);
  }
}

int RxBacklog::take(RxHandler& own, uint64_t now) {
  uint64_t at, tail;
  {
    std::lock_guard<std::mutex> lock(mu_);
    at = head_;
    tail = tail_;
  }
  if (at == tail) return 0;
  RxPacket burst[32];
  int n = 0, total = 0;
  while (at != tail) {
    at = next_record(at, &burst[n], now);
    if (++n == 32) {
      own.on_rx(burst, n);
      total += n;
      n = 0;
    }
  }
  if (n > 0) own.on_rx(burst, n);
  advance_head(tail);
  return total + n;
}

int RxBacklog::peek(RxPacket* out, int max, uint64_t now) {
  uint64_t at, tail;
  {
    std::lock_guard<std::mutex> lock(mu_);
    at = head_;
    tail = tail_;
  }
  int n = 0;
  while (n < max && at != tail) at = next_record(at, &out[n++], now);
  return n;
}

void RxBacklog::consume(int n) {
  if (n <= 0) return;
  uint64_t at;
  {
    std::lock_guard<std::mutex> lock(mu_);
    at = head_;
  }
  for (int i = 0; i < n; ++i) at = next_record(at, nullptr, 0);
  advance_head(at);
}

}  // namespace optireduce
