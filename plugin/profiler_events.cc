// Implements plugin/profiler_events.h. The descriptor lives in the request's slot for the
// event's whole life, as NCCL's own plugins keep theirs; the profiler reads it only inside the
// callback.
#include "plugin/profiler_events.h"

#include <atomic>

#include "transport/deadline.h"

namespace optireduce::plugin {
namespace {

std::atomic<nccl::ncclProfilerCallback_t> g_profiler{nullptr};

// The public `end` values are the transport's RecvEnd, passed through.
static_assert(static_cast<int>(RecvEnd::kAll) == optireduceRecvAll);
static_assert(static_cast<int>(RecvEnd::kDeadline) == optireduceRecvDeadline);
static_assert(static_cast<int>(RecvEnd::kEarly) == optireduceRecvEarlyTimeout);
static_assert(static_cast<int>(RecvEnd::kExpired) == optireduceRecvSenderExpired);

}  // namespace

void set_profiler(nccl::ncclProfilerCallback_t fn) noexcept {
  if (fn != nullptr) g_profiler.store(fn, std::memory_order_release);
}

void RecvEvents::start(Request* req, void* phandle, uint64_t comm_id,
                       uint64_t bytes_posted) noexcept {
  const nccl::ncclProfilerCallback_t fn = g_profiler.load(std::memory_order_acquire);
  if (fn == nullptr || phandle == nullptr) return;
  Slot* free = nullptr;
  for (Slot& s : slots_) {
    if (s.handle == nullptr) {
      free = &s;
      break;
    }
  }
  if (free == nullptr) return;  // more than kMaxRequests outstanding cannot happen
  free->data = optireduceProfilerRecv_v1_t{};
  free->data.type = optireduceProfileBoundedRecv;
  free->data.end = optireduceRecvPending;
  free->data.commId = comm_id;
  free->data.bytesPosted = bytes_posted;
  void* handle = nullptr;
  fn(&handle, nccl::ncclProfilerNetEventStart, phandle, OPTIREDUCE_PROFILER_NET_ID, &free->data);
  if (handle == nullptr) return;  // the profiler does not want these events
  free->handle = handle;
  request_caller_data(req) = free;
}

void RecvEvents::finish(Request* req) noexcept {
  auto* slot = static_cast<Slot*>(request_caller_data(req));
  if (slot == nullptr) return;
  request_caller_data(req) = nullptr;
  const RecvOutcome& o = request_outcome(req);
  slot->data.end = o.end;
  slot->data.bounded = o.bounded ? 1 : 0;
  slot->data.bytesExpected = o.expected;
  slot->data.bytesLost = o.lost;
  const nccl::ncclProfilerCallback_t fn = g_profiler.load(std::memory_order_acquire);
  if (fn != nullptr) {
    fn(&slot->handle, nccl::ncclProfilerNetEventUpdateAndStop, nullptr, OPTIREDUCE_PROFILER_NET_ID,
       &slot->data);
  }
  slot->handle = nullptr;
}

}  // namespace optireduce::plugin
