// ConnGroup: the connections of one communicator, so that a call on any of them also serves
// the others that nobody is polling (NCCL's proxy polls every connection; a host-path caller
// may wait on one request while another connection of the same exchange has work to do), and
// so that their bounded packets share one pacer: a rank's connections share its link.
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

#include "transport/delivery_rate.h"
#include "transport/pacer.h"

namespace optireduce {

class Conn;

class ConnGroup {
 public:
  virtual ~ConnGroup() = default;
  void add(Conn* c);
  void remove(Conn* c);
  // Serves the members other than `self` that were not served in the last `idle_ns`. Only
  // try_lock is used (on the group and on each member), so no caller ever waits here.
  void serve_siblings(const Conn* self, uint64_t now, uint64_t idle_ns);

  // Rank-wide pacing of bounded packets. Exact traffic of every send connection of the group
  // reports what got acknowledged; over windows of at least `window_ns` that gives the rate
  // the group's path delivered together (a decaying maximum), and bounded packets of all of
  // them draw from one bucket at 1.25x that rate. Per-connection pacing alone overshoots
  // where a rank's connections share one link (measured in the tail lab: 45% delivered).
  // restart / idle_after: the reporting connection had nothing in flight before / after these
  // bytes (see DeliveryRate: no window spans idle time).
  void add_delivered(uint64_t bytes, uint64_t now, uint64_t window_ns, bool restart,
                     bool idle_after);
  // Bytes bounded packets may send now (UINT64_MAX while nothing was measured).
  uint64_t bounded_tokens(uint64_t now);
  void consume_bounded(uint64_t bytes);

 private:
  std::mutex mu_;
  std::vector<Conn*> conns_;

  std::mutex rate_mu_;  // leaf lock: taken under a connection's lock, takes nothing
  DeliveryRate delivery_;
  Pacer pacer_;
};

}  // namespace optireduce
