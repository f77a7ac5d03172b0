// Which thread is the transport's progress thread (engine.cc). Passes and drains it runs are
// not an owner's: an owner that polls serves its connections' timers itself, and the thread
// only stands in for owners that stopped (Conn::wake_ns, EndpointMux::last_caller_drain_ns_).
// Inline, so that the fuzz targets, which link transport sources one by one, need no source.
#pragma once

namespace optireduce {

namespace detail {
inline thread_local bool t_progress_thread = false;
}  // namespace detail

// Marks the calling thread, for the rest of its life, as the progress thread.
inline void mark_progress_thread() {
  detail::t_progress_thread = true;
}

inline bool on_progress_thread() {
  return detail::t_progress_thread;
}

}  // namespace optireduce
