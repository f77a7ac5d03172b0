// Free-running counters of one connection. Written by the connection under its lock; read as a
// snapshot copy. Every counter only grows.
#pragma once

#include <cstdint>

namespace optireduce {

struct ConnStats {
  // Traffic
  uint64_t msgs = 0;          // messages completed
  uint64_t bytes = 0;         // payload bytes completed (sent or delivered)
  uint64_t data_pkts = 0;     // DATA datagrams sent (sender) or accepted (receiver)
  uint64_t ctrl_pkts = 0;     // CTS/ACK/HELLO datagrams sent
  uint64_t retx_pkts = 0;     // DATA datagrams sent again (reliable mode)
  uint64_t rto_events = 0;    // retransmission timer expiries
  uint64_t probes = 0;        // tail loss probes sent
  uint64_t cts_resent = 0;    // CTS repeated because no DATA followed in time
  // Drops by reason (receiver of the bad datagram counts it)
  uint64_t drop_malformed = 0;  // failed decode(): truncated, bad magic/version/type/length
  uint64_t drop_token = 0;      // token of another connection (spoofed or misdirected)
  uint64_t drop_stale = 0;      // for a message already completed
  uint64_t drop_duplicate = 0;  // payload already received
  uint64_t drop_bounds = 0;     // outside the posted buffer or the packet grid
  uint64_t drop_unexpected = 0; // valid but not expected in the current state (e.g. ACK of an unsent message)
  // Bounded mode
  uint64_t bytes_expected = 0;  // bytes of bounded messages received
  uint64_t bytes_lost = 0;      // of which missing at completion (filled)
  uint64_t deadline_hits = 0;   // bounded receives ended by their deadline
  uint64_t early_timeouts = 0;  // bounded receives ended by the early timeout
  uint64_t late_pkts = 0;       // DATA for a bounded receive that had already completed
  uint64_t expired_sends = 0;   // bounded sends given up for want of a CTS
  uint64_t cut_sends = 0;       // bounded sends ended with packets unacknowledged (the
                                // receiver's deadline or the send budget came first)
  uint64_t repaired_pkts = 0;   // bounded packets sent again (lost early in a step)
  uint32_t tb_us = 0;           // current hard bound
  uint32_t tc_us = 0;           // current adaptive estimate
};

}  // namespace optireduce
