// RxBacklog: the copies a shared endpoint keeps for a connection that was busy when another
// caller received its datagrams (endpoint_mux.h). One producer (whoever drains the endpoint, under
// the endpoint's receive lock) and one consumer (the connection, under its own lock); the lock
// here guards two indices only, so neither side ever waits on the other's copying.
//
// Why a byte ring allocated on first use and freed once empty: contention is rare (a connection's
// lock is held by someone else at the instant its datagram arrives), so an idle connection costs
// nothing here, and one that was busy once does not keep a megabyte for life.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>

#include "transport/datapath.h"

namespace optireduce {

class RxBacklog {
 public:
  // Bytes kept at most per connection, records included: a burst of 32 loopback-sized datagrams
  // (64 KiB each) fits. Beyond it datagrams are dropped and counted, as a full socket would.
  static constexpr uint32_t kCapacityBytes = 2u << 20;

  // Copies pkts[0, n) in at time `now`. Returns how many did not fit (dropped).
  int push(const RxPacket* pkts, int n, uint64_t now);
  // Hands everything kept so far to `own`, in bursts of at most 32, oldest first, and forgets
  // it; returns how many. Datagrams pushed meanwhile wait for the next call. Their ages
  // (RxPacket::age_ns) are as of `now`, the time in the backlog included.
  int take(RxHandler& own, uint64_t now);
  // The oldest `max` at most, left in place (valid until consume() passes them); and forgetting
  // the oldest `n`. For a caller that wants datagrams back rather than handed over.
  int peek(RxPacket* out, int max, uint64_t now);
  void consume(int n);
  // Copies are waiting (read without the lock, by the progress thread: see registry.h).
  bool pending() const { return pending_.load(); }

 private:
  struct Record;  // a datagram's length, source and bytes, 8-byte aligned

  // Walks records from `at` (< tail): fills *pkt (when not null; its age as of `now`) and
  // returns where the next one starts. Wrap markers are stepped over.
  uint64_t next_record(uint64_t at, RxPacket* pkt, uint64_t now) const;
  void advance_head(uint64_t to);

  std::mutex mu_;
  std::unique_ptr<uint8_t[]> ring_;  // kCapacityBytes once the first copy is pushed
  uint64_t head_ = 0;                // free-running: bytes consumed
  uint64_t tail_ = 0;                // free-running: bytes written
  std::atomic<bool> pending_{false};
};

}  // namespace optireduce
