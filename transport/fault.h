// The seeded fault injector: an Endpoint decorator that drops, duplicates, reorders and delays
// datagrams on transmit, like a lossy network would, reproducibly for a given seed and call
// sequence. Off by default; for tests, CI and benchmarks (OPTIREDUCE_FAULT_*).
#pragma once

#include <cstdint>
#include <memory>

#include "transport/clock.h"
#include "transport/datapath.h"
#include "transport/params.h"

namespace optireduce {

struct FaultPlan {
  uint64_t seed = 1;
  double drop = 0;           // probability that a datagram outside a loss burst starts one
  double burst = 1;          // mean loss-burst length in datagrams (geometric); 1: independent;
                             // a burst also ends after 10 ms without a datagram (fault.cc)
  double dup = 0;            // probability that a datagram is sent twice, back to back
  double reorder = 0;        // probability that a datagram is held and sent after 1-3 others
  double delay_prob = 0;     // probability that a datagram is delayed
  double delay_us = 0;       // Pareto scale: the shortest delay, in microseconds
  double delay_alpha = 1.5;  // Pareto shape: smaller is heavier-tailed
  uint32_t pool_slots = 0;   // datagrams held at once (delayed or reordered); 0: derived;
                             // no pool when the plan neither delays nor reorders

  static FaultPlan from_config(const Config& cfg);
  bool enabled() const { return drop > 0 || dup > 0 || reorder > 0 || delay_prob > 0; }
};

// Free-running counts of what the injector did. A datagram is counted once, when its fate is
// final (a duplicate when the copy was handed to the datapath).
struct FaultCounters {
  uint64_t dropped = 0;
  uint64_t duplicated = 0;
  uint64_t reordered = 0;
  uint64_t delayed = 0;
  uint64_t pool_exhausted = 0;  // would have been held, but no slot was free: sent unharmed
};

// Wraps `inner`. Faults apply to transmitted datagrams; tx_burst reports dropped datagrams as
// taken, as a lossy network would. Held datagrams are copied into a pool allocated here and go
// out, in release-time order, during later tx_burst or rx_burst calls: a caller that wants
// delayed datagrams to leave must keep calling one of them (nothing sleeps, no thread).
// `clock` must outlive the endpoint. Endpoints of one process sharing a seed see the same fault
// pattern; give each its own seed (e.g. seed + connection index) for independent patterns.
std::unique_ptr<Endpoint> make_faulty_endpoint(std::unique_ptr<Endpoint> inner,
                                               const FaultPlan& plan, const Clock& clock);

// The counters of an endpoint made by make_faulty_endpoint; nullptr for any other endpoint.
const FaultCounters* fault_counters(const Endpoint& ep);

}  // namespace optireduce
