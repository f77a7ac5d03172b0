// Implements plugin/stats.h: ConnStats sums, kept field by field because the C API mirrors them,
// and the C query API (plugin/optireduce_net.h), exported with default visibility for dlsym.
#include "plugin/stats.h"

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <vector>

#include "plugin/context.h"
#include "plugin/optireduce_net.h"
#include "plugin/process_state.h"

namespace optireduce::plugin {

static_assert(sizeof(ConnStats) == 22 * 8 + 2 * 4,
              "ConnStats changed: update add_stats() and struct optireduceNetCounters");

void add_stats(ConnStats* into, const ConnStats& s, bool live) {
  into->msgs += s.msgs;
  into->bytes += s.bytes;
  into->data_pkts += s.data_pkts;
  into->ctrl_pkts += s.ctrl_pkts;
  into->retx_pkts += s.retx_pkts;
  into->rto_events += s.rto_events;
  into->probes += s.probes;
  into->cts_resent += s.cts_resent;
  into->drop_malformed += s.drop_malformed;
  into->drop_token += s.drop_token;
  into->drop_stale += s.drop_stale;
  into->drop_duplicate += s.drop_duplicate;
  into->drop_bounds += s.drop_bounds;
  into->drop_unexpected += s.drop_unexpected;
  into->bytes_expected += s.bytes_expected;
  into->bytes_lost += s.bytes_lost;
  into->deadline_hits += s.deadline_hits;
  into->early_timeouts += s.early_timeouts;
  into->late_pkts += s.late_pkts;
  into->expired_sends += s.expired_sends;
  into->cut_sends += s.cut_sends;
  into->repaired_pkts += s.repaired_pkts;
  // The timeouts are current values, not counters: only live connections have one.
  if (live) {
    into->tb_us = std::max(into->tb_us, s.tb_us);
    into->tc_us = std::max(into->tc_us, s.tc_us);
  }
}

namespace {

void to_c(const ConnStats& s, optireduceNetCounters* c) {
  *c = optireduceNetCounters{};
  c->msgs = s.msgs;
  c->bytes = s.bytes;
  c->dataPkts = s.data_pkts;
  c->ctrlPkts = s.ctrl_pkts;
  c->retxPkts = s.retx_pkts;
  c->rtoEvents = s.rto_events;
  c->ctsResent = s.cts_resent;
  c->dropMalformed = s.drop_malformed;
  c->dropToken = s.drop_token;
  c->dropStale = s.drop_stale;
  c->dropDuplicate = s.drop_duplicate;
  c->dropBounds = s.drop_bounds;
  c->dropUnexpected = s.drop_unexpected;
  c->bytesExpected = s.bytes_expected;
  c->bytesLost = s.bytes_lost;
  c->deadlineHits = s.deadline_hits;
  c->earlyTimeouts = s.early_timeouts;
  c->latePkts = s.late_pkts;
  c->expiredSends = s.expired_sends;
  c->tbUs = s.tb_us;
  c->tcUs = s.tc_us;
  c->probes = s.probes;
  c->cutSends = s.cut_sends;
  c->repairedPkts = s.repaired_pkts;
}

// 0: `comm_id` has a context; 1: it has none (the process totals are still filled in).
int collect_stats(uint64_t comm_id, optireduceNetStats* out) {
  ConnStats comm_send, comm_recv;
  ConnStats proc_send, proc_recv;
  bool found = false;
  bool bounded = false;
  uint32_t live_send = 0;
  uint32_t live_recv = 0;
  // Before the first context there is no state yet: nothing to count, every total is zero.
  if (ProcessState* state = process_state(); state != nullptr) {
    std::lock_guard<std::mutex> lock(state->mu);
    proc_send = state->closed_send;
    proc_recv = state->closed_recv;
    std::vector<Context*> all;
    for (const auto& c : state->contexts) all.push_back(c.get());
    if (state->legacy != nullptr) all.push_back(state->legacy.get());
    for (Context* c : all) {
      std::lock_guard<std::mutex> lock_ctx(c->mu);
      const bool match = c->comm_id == comm_id;
      if (match) {
        found = true;
        bounded = bounded || c->bounded;
        add_stats(&comm_send, c->closed_send, false);
        add_stats(&comm_recv, c->closed_recv, false);
        live_send += static_cast<uint32_t>(c->live_send.size());
        live_recv += static_cast<uint32_t>(c->live_recv.size());
      }
      for (SendWrap* w : c->live_send) {
        const ConnStats s = w->comm->stats();
        add_stats(&proc_send, s, true);
        if (match) add_stats(&comm_send, s, true);
      }
      for (RecvWrap* w : c->live_recv) {
        const ConnStats s = w->comm->stats();
        add_stats(&proc_recv, s, true);
        if (match) add_stats(&comm_recv, s, true);
      }
    }
  }
  *out = optireduceNetStats{};
  out->version = OPTIREDUCE_NET_STATS_VERSION;
  out->bounded = bounded ? 1 : 0;
  out->commId = comm_id;
  out->liveSendComms = live_send;
  out->liveRecvComms = live_recv;
  to_c(comm_send, &out->send);
  to_c(comm_recv, &out->recv);
  to_c(proc_send, &out->processSend);
  to_c(proc_recv, &out->processRecv);
  return found ? 0 : 1;
}

}  // namespace
}  // namespace optireduce::plugin

extern "C" __attribute__((visibility("default"))) int optireduceNetStatsVersion(void) {
  return OPTIREDUCE_NET_STATS_VERSION;
}

extern "C" __attribute__((visibility("default"))) int optireduceNetGetStats(
    uint64_t commId, struct optireduceNetStats* out) {
  if (out == nullptr) return -1;
  // Served after exit() began too (a framework's own atexit handler may print the final
  // counters): the exit handling frees nothing, and it only reads.
  try {
    return optireduce::plugin::collect_stats(commId, out);
  } catch (...) {
    return -1;
  }
}
