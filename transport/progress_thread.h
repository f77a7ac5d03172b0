// The transport's progress thread (engine.cc): which thread it is, and how others wake it out
// of its idle sleep (idle_sleep.h). Passes and drains it runs are not an owner's: an owner that
// polls serves its connections' timers itself, and the thread only stands in for owners that
// stopped (Conn::wake_ns, EndpointMux::last_caller_drain_ns_).
// Inline, so that the fuzz targets, which link transport sources one by one, need no source.
#pragma once

#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>

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

// An eventfd that ends the progress thread's idle sleep. Writers call wake() after making the
// change the thread must see (a timer armed, an endpoint opened, a blocked caller gone); it
// costs a system call only while the thread is in that sleep or about to enter it, so a busy
// process pays nothing for it.
class ProgressWaker {
 public:
  // Without an eventfd (usable() false) the thread keeps its timed sleep.
  ProgressWaker() : fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}
  ~ProgressWaker() {
    if (fd_ >= 0) ::close(fd_);
  }
  ProgressWaker(const ProgressWaker&) = delete;
  ProgressWaker& operator=(const ProgressWaker&) = delete;

  bool usable() const { return fd_ >= 0; }
  int fd() const { return fd_; }

  void wake() {
    if (fd_ < 0 || !sleeping_.load()) return;
    const uint64_t one = 1;
    // It fails only with the counter at its maximum, when the thread is woken already.
    (void)!::write(fd_, &one, sizeof one);
    // After the write: a reader that sees the flag finds the count to clear.
    written_.store(true);
  }

  // The thread's side, around everything it looks at before it sleeps and the sleep itself:
  // from the constructor on every wake() writes (both sides sequentially consistent, so a
  // change is seen by the thread's look or wakes its sleep); the destructor reads back what
  // they wrote, so that the next sleep does not end at once. Most scopes end without a sleep
  // (something armed, a caller busy) and nothing written: they make no system call. A write
  // whose flag comes after the read ends the next sleep at once, and that scope reads it back.
  class Sleep {
   public:
    explicit Sleep(ProgressWaker& w) : w_(w) { w_.sleeping_.store(true); }
    ~Sleep() {
      w_.sleeping_.store(false);
      uint64_t count = 0;
      if (w_.written_.exchange(false)) (void)!::read(w_.fd_, &count, sizeof count);
    }
    Sleep(const Sleep&) = delete;
    Sleep& operator=(const Sleep&) = delete;

   private:
    ProgressWaker& w_;
  };

 private:
  int fd_;
  std::atomic<bool> sleeping_{false};
  std::atomic<bool> written_{false};  // a wake() wrote since the last read back
};

}  // namespace optireduce
