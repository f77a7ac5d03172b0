// The lanes' worker thread (lane_worker.h).
#include "verbs/lane_worker.h"

#include <pthread.h>

#include <system_error>

namespace optireduce::verbs {

bool LaneWorker::ensure_thread_locked() {
  if (thread_.joinable()) return true;
  try {
    thread_ = std::thread([this] { run(); });
    // Named by its creator, so that it has the name before anyone can count it (top -H, perf,
    // gdb, the plugin's tests).
    (void)pthread_setname_np(thread_.native_handle(), "optireduce-lane");
  } catch (const std::system_error&) {
    return false;  // no thread: the caller does the work itself, or goes without
  }
  return true;
}

bool LaneWorker::start_open(PortContext* port, ibv_cq* send_cq, uint32_t depth,
                            uint32_t max_datagram, uint64_t* stop_clock) {
  if (open_started_) return false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ || !ensure_thread_locked()) return false;
    open_ = OpenArgs{port, send_cq, depth, max_datagram, stop_clock};
    open_queued_ = true;
    open_ready_ = false;
  }
  open_started_ = true;
  cv_.notify_one();
  return true;
}

bool LaneWorker::take_opened(std::unique_ptr<AimLane>* lane, Status* st) {
  if (!open_started_) return false;
  std::lock_guard<std::mutex> lock(mu_);
  if (!open_ready_) return false;
  *lane = std::move(opened_);
  *st = open_status_;
  open_ready_ = false;
  open_started_ = false;
  return true;
}

bool LaneWorker::submit(Flushable* lane) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ || nflush_ == kMaxFlushes || !ensure_thread_locked()) return false;
    flushes_[nflush_++] = lane;
  }
  cv_.notify_one();
  return true;
}

void LaneWorker::run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stopping_ || open_queued_ || nflush_ > 0; });
    if (stopping_) return;
    // Flushes first: a receive waits on each, while an opening only lets a later one in place.
    if (nflush_ > 0) {
      Flushable* lane = flushes_[0];
      for (int i = 1; i < nflush_; i++) flushes_[i - 1] = flushes_[i];
      nflush_--;
      lock.unlock();
      lane->flush_now();
      lock.lock();
      continue;
    }
    const OpenArgs a = open_;
    open_queued_ = false;
    lock.unlock();
    std::unique_ptr<AimLane> lane;
    const Status st =
        AimLane::open(a.port, a.send_cq, a.depth, a.max_datagram, a.stop_clock, this, &lane);
    lock.lock();
    opened_ = std::move(lane);
    open_status_ = st;
    open_ready_ = true;
  }
}

void LaneWorker::shutdown() {
  Flushable* left[kMaxFlushes];
  int nleft = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    for (int i = 0; i < nflush_; i++) left[nleft++] = flushes_[i];
    nflush_ = 0;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
  // Flushes still queued run here, so that whoever waits for one (AimLane::stop) is answered.
  for (int i = 0; i < nleft; i++) left[i]->flush_now();
  opened_.reset();
  open_started_ = false;
}

}  // namespace optireduce::verbs
