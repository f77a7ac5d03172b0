// The C query API of plugin/optireduce_net.h, exported with default visibility for dlsym: the
// counters of a communicator and of the process, summed and copied by plugin/stats.h.
#include "plugin/stats.h"

#include <cstdint>
#include <mutex>
#include <vector>

#include "plugin/context.h"
#include "plugin/optireduce_net.h"
#include "plugin/process_state.h"

namespace optireduce::plugin {
namespace {

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
  out->send = to_c_counters(comm_send);
  out->recv = to_c_counters(comm_recv);
  out->processSend = to_c_counters(proc_send);
  out->processRecv = to_c_counters(proc_recv);
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
