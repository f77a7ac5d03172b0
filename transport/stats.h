// Free-running counters of one connection. Written by the connection under its lock; read as a
// snapshot copy. Every counter only grows; the two gauges are current values.
#pragma once

#include <cstdint>
#include <string>

// The one list of a connection's counters. ConnStats below, the plugin's sums (plugin/stats.h)
// and the public C struct optireduceNetCounters (plugin/optireduce_net.h, proved member by member
// against this list in plugin/stats.h) all follow it, so no counter can reach one and miss another.
//   COUNTER(name, cName): uint64_t that only grows; summed over connections.
//   GAUGE(name, cName): uint32_t current value; over connections, the largest of the live ones.
// cName is the member's name in the C struct. The order is the C struct's, whose layout is ABI
// and only ever appended to: a new entry goes at the end.
#define OPTIREDUCE_CONN_STATS(COUNTER, GAUGE)                                                      \
  /* Traffic */                                                                                    \
  COUNTER(msgs, msgs)            /* messages completed (a bounded receive: one step) */            \
  COUNTER(bytes, bytes)          /* payload bytes completed: sent, or delivered */                 \
  COUNTER(data_pkts, dataPkts)   /* DATA sent (sender) or accepted (receiver) */                   \
  COUNTER(ctrl_pkts, ctrlPkts)   /* CTS/ACK/HELLO datagrams sent */                                \
  COUNTER(retx_pkts, retxPkts)   /* DATA sent again (bounded repairs too) */                       \
  COUNTER(rto_events, rtoEvents) /* retransmission timer expiries */                               \
  COUNTER(cts_resent, ctsResent) /* CTS repeated: no DATA followed in time */                      \
  /* Drops by reason (the receiver of the bad datagram counts it) */                               \
  COUNTER(drop_malformed, dropMalformed)   /* decode() failed: truncated, bad header */            \
  COUNTER(drop_token, dropToken)           /* another connection's token (spoofed, misdirected) */ \
  COUNTER(drop_stale, dropStale)           /* for a message already completed */                   \
  COUNTER(drop_duplicate, dropDuplicate)   /* payload already received */                          \
  COUNTER(drop_bounds, dropBounds)         /* outside the posted buffer or the packet grid */      \
  COUNTER(drop_unexpected, dropUnexpected) /* valid, not expected now (ACK of an unsent msg) */    \
  /* Bounded mode */                                                                               \
  COUNTER(bytes_expected, bytesExpected) /* bytes of bounded messages received */                  \
  COUNTER(bytes_lost, bytesLost)         /* of which missing at completion (filled) */             \
  COUNTER(deadline_hits, deadlineHits)   /* bounded receives ended by their deadline */            \
  COUNTER(early_timeouts, earlyTimeouts) /* bounded receives ended by the early timeout */         \
  COUNTER(late_pkts, latePkts)           /* DATA for a bounded receive already completed */        \
  COUNTER(expired_sends, expiredSends)   /* bounded sends given up for want of a CTS */            \
  GAUGE(tb_us, tbUs)                     /* current hard bound tB, microseconds */                 \
  GAUGE(tc_us, tcUs)                     /* current adaptive estimate tC, microseconds */          \
  /* Later additions (the C struct only appends) */                                                \
  COUNTER(probes, probes)              /* tail loss probes sent */                                 \
  COUNTER(cut_sends, cutSends)         /* bounded sends ended with packets unacknowledged */       \
  COUNTER(repaired_pkts, repairedPkts) /* bounded DATA sent again: lost early, repaired in time */ \
  COUNTER(spurious_rtos, spuriousRtos) /* of rto_events, those an ACK then showed were no loss */  \
  COUNTER(aimed_msgs, aimedMsgs)       /* receives whose datapath posted into their buffer */      \
  COUNTER(placed_pkts, placedPkts)     /* DATA that arrived in place: no copy (UDP, verbs) */      \
  COUNTER(resteers, resteers) /* aimed messages sent elsewhere mid-way: place lost or stalled */   \
  COUNTER(spurious_probes, spuriousProbes)   /* of probes, those the receiver had already got */   \
  COUNTER(reordered_losses, reorderedLosses) /* messages whose SACK-declared losses were late */   \
  GAUGE(budget_us, budgetUs)       /* a started bounded receive's budget now (stretched), us */    \
  GAUGE(allowance_us, allowanceUs) /* ... and its wait for a sender not started (+ skew), us */

namespace optireduce {

struct ConnStats {
#define OPTIREDUCE_CONN_STATS_COUNTER_(name, c_name) uint64_t name = 0;
#define OPTIREDUCE_CONN_STATS_GAUGE_(name, c_name) uint32_t name = 0;
  OPTIREDUCE_CONN_STATS(OPTIREDUCE_CONN_STATS_COUNTER_, OPTIREDUCE_CONN_STATS_GAUGE_)
#undef OPTIREDUCE_CONN_STATS_COUNTER_
#undef OPTIREDUCE_CONN_STATS_GAUGE_
};

namespace detail {
// The size ConnStats has when it holds the listed fields and nothing else.
struct ConnStatsListedOnly {
#define OPTIREDUCE_CONN_STATS_COUNTER_(name, c_name) uint64_t name;
#define OPTIREDUCE_CONN_STATS_GAUGE_(name, c_name) uint32_t name;
  OPTIREDUCE_CONN_STATS(OPTIREDUCE_CONN_STATS_COUNTER_, OPTIREDUCE_CONN_STATS_GAUGE_)
#undef OPTIREDUCE_CONN_STATS_COUNTER_
#undef OPTIREDUCE_CONN_STATS_GAUGE_
};
}  // namespace detail
// A member written into ConnStats by hand would be summed and reported by nobody.
static_assert(sizeof(ConnStats) == sizeof(detail::ConnStatsListedOnly),
              "ConnStats has a member outside OPTIREDUCE_CONN_STATS: add it to the list instead");

// What a connection did, as its close line logs it (the plugin's and the host path's): traffic,
// retransmissions, timer expiries, probes, CTS resends, drops by reason, bounded losses.
std::string conn_stats_text(const ConnStats& s);

}  // namespace optireduce
