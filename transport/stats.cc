// conn_stats_text (stats.h): the one text of a connection's counters, for the close lines the
// plugin and liboptireduce's host path log.
#include "transport/stats.h"

#include <cinttypes>
#include <cstdio>

namespace optireduce {

std::string conn_stats_text(const ConnStats& s) {
  char buf[512];
  std::snprintf(buf, sizeof(buf),
                "msgs %" PRIu64 " bytes %" PRIu64 " data %" PRIu64 " ctrl %" PRIu64 " retx %" PRIu64
                " rto %" PRIu64 " (spurious %" PRIu64 ") probes %" PRIu64 " (spurious %" PRIu64
                ") reordered %" PRIu64 " cts resent %" PRIu64 " placed %" PRIu64
                " (aimed msgs %" PRIu64 ", resteered %" PRIu64
                ")"
                " drops malformed/token/stale/dup/bounds/unexpected %" PRIu64 "/%" PRIu64
                "/%" PRIu64 "/%" PRIu64 "/%" PRIu64 "/%" PRIu64 " lost %" PRIu64 "/%" PRIu64 " B",
                s.msgs, s.bytes, s.data_pkts, s.ctrl_pkts, s.retx_pkts, s.rto_events,
                s.spurious_rtos, s.probes, s.spurious_probes, s.reordered_losses, s.cts_resent,
                s.placed_pkts, s.aimed_msgs, s.resteers, s.drop_malformed, s.drop_token,
                s.drop_stale, s.drop_duplicate, s.drop_bounds, s.drop_unexpected, s.bytes_lost,
                s.bytes_expected);
  return buf;
}

}  // namespace optireduce
