// The plugin's events for NCCL's profiler (optireduce_net.h, "Profiler events"): one per receive
// on a bounded connection, so that a profiler plugin sees where a step's time and data went.
// NCCL hands the same core callback to every init, so one process-wide pointer serves all.
#pragma once

#include <array>
#include <cstdint>

#include "plugin/nccl/types.h"
#include "plugin/optireduce_net.h"
#include "transport/transport.h"

namespace optireduce::plugin {

// Remembers NCCL's callback (null: NCCL has no profiler, or the table predates v10).
void set_profiler(nccl::ncclProfilerCallback_t fn) noexcept;

// The events of one receive comm's outstanding requests: a fixed slot each, nothing allocated
// per receive. Touched only by the thread that drives the comm (NCCL's proxy thread).
class RecvEvents {
 public:
  // After a bounded irecv was accepted: starts its event if NCCL gave a profiler handle.
  void start(Request* req, void* phandle, uint64_t comm_id, uint64_t bytes_posted) noexcept;
  // In the test() that reported `req` done: updates its event with the outcome and stops it.
  static void finish(Request* req) noexcept;

 private:
  struct Slot {
    void* handle = nullptr;  // NCCL's event handle; null = slot free
    optireduceProfilerRecv_v1_t data{};
  };
  std::array<Slot, kMaxRequests> slots_{};
};

}  // namespace optireduce::plugin
