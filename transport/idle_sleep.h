// The progress thread's sleep while nothing is armed (engine.cc).
//
// Why: the thread's timed sleep lasts at most OPTIREDUCE_PROGRESS_US (1 ms), so that datagrams
// for endpoints nobody polls are taken within a period. So an idle process (its communicators
// open, no request in flight: an inference server between requests, a training rank in a long
// forward pass) woke about a thousand times a second for as long as it lived, each time to find
// nothing: a context switch each, on cores the application or a co-tenant wants, and a timer
// that keeps a core out of its idle states. NCCL's own proxy thread sleeps on a condition
// variable while it has no work.
//
// When no connection has a timer armed or datagrams kept (Registry::idle) and no caller has
// received on any shared endpoint for a millisecond (EndpointMux::prepare_idle_wait), the
// thread blocks instead on the endpoints' descriptors and an eventfd (ProgressWaker), up to
// kIdleSleepNs. Whatever it would have found in a period wakes it: a datagram (a peer's PING,
// CTS or retransmission for a connection whose owner is away), or the ProgressWaker
// (progress_thread.h), woken by
//  - a connection that arms a timer or keeps datagrams (Registry::arm), or that has an
//    endpoint of its own (Registry::add: it is polled every period),
//  - a thread that opens a shared endpoint (its descriptor is not in the set yet),
//  - a caller that stops blocking on an endpoint the sleep left to it (kCovered),
//  - stop_progress.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "transport/progress_thread.h"

namespace optireduce {

class EndpointMux;
class Registry;

enum class IdleSleep {
  kNotIdle,  // something is armed or polled, or an endpoint cannot be waited on: no sleep
  kWoke,     // slept until something came (or up to max_ns), or found work waiting: serve now
};

// The longest idle sleep: live_muxes() closes endpoints that lingered a peer timeout after
// their last port (engine.h), which nothing else wakes the thread for.
constexpr uint64_t kIdleSleepNs = 1'000'000'000;

// One idle sleep over `muxes` (taken inside the caller's ProgressWaker::Sleep, so that an
// endpoint opened after the list was made wakes it), up to max_ns; `stop` ends it before it
// begins. Readable endpoints are told so (EndpointMux::note_readable): the serve() that follows
// reads them whatever their streak of empty drains says.
IdleSleep idle_sleep(const std::vector<std::shared_ptr<EndpointMux>>& muxes, Registry& registry,
                     ProgressWaker& waker, uint64_t now, uint64_t max_ns,
                     const std::atomic<bool>& stop);

}  // namespace optireduce
