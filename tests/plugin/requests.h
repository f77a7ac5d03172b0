// Posting a transfer and waiting for it as NCCL's proxy does, for the tests that drive the
// plugin through its ABI. A post may come back without a request: "not now" (the connection is
// still being set up, or the plugin's request slots are full), and NCCL simply posts again on
// its next pass. Each loop here gives up after a limit scaled by HARNESS_TIME_SCALE and names
// the call it was waiting for, so a stuck test fails with its reason instead of at the alarm.
#pragma once

#include <cstddef>

#include "tests/plugin/plugin_loader.h"
#include "tests/plugin/two_procs.h"

namespace optireduce::testing {

// Generous for a loaded 2-core host; the children's alarms are longer.
inline constexpr double kRequestLimitS = 30;

inline void* post_send(NetApi& net, void* comm, const void* data, size_t size, void* mh = nullptr,
                       double limit_s = kRequestLimitS) {
  const double deadline = deadline_in(limit_s);
  for (;;) {
    void* req = nullptr;
    HCHECK_OK(net.isend(comm, const_cast<void*>(data), size, 0, mh, &req));
    if (req != nullptr) return req;
    HCHECK(mono_s() < deadline, "isend of %zu B not taken in %.0f s", size, scaled_s(limit_s));
  }
}

// `sentinel`: post as NCCL posts a receive the sender may skip (LL, a zero-byte step), with
// nccl::kOptionalRecvSentinel in the request; the plugin must replace it with a real request.
inline void* post_recv(NetApi& net, void* comm, void* data, size_t size, void* mh = nullptr,
                       bool sentinel = false, double limit_s = kRequestLimitS) {
  const double deadline = deadline_in(limit_s);
  for (;;) {
    void* req = sentinel ? nccl::kOptionalRecvSentinel : nullptr;
    HCHECK_OK(net.irecv(comm, data, size, 0, mh, &req));
    HCHECK(req != nccl::kOptionalRecvSentinel, "irecv left NCCL's optional-receive sentinel");
    if (req != nullptr) return req;
    HCHECK(mono_s() < deadline, "irecv of %zu B not taken in %.0f s", size, scaled_s(limit_s));
  }
}

// Polls test() until the request is done; returns the size it reported.
inline int wait_done(NetApi& net, void* req, double limit_s = kRequestLimitS) {
  const double deadline = deadline_in(limit_s);
  int done = 0;
  int size = -1;
  for (;;) {
    HCHECK_OK(net.test(req, &done, &size));
    if (done) return size;
    HCHECK(mono_s() < deadline, "request not done in %.0f s", scaled_s(limit_s));
  }
}

}  // namespace optireduce::testing
