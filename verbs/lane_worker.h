// The receive lanes' firmware work (aim_lane.h), on a thread of the endpoint's own, so that no
// call NCCL makes waits for it:
//  - opening a lane: a CQ, a QP taken to RTS and two registrations of about 1.3 MiB, on a real
//    NIC a millisecond or more of firmware commands, under the VM's emulation tens of
//    milliseconds. aim_open runs inside irecv: it starts an opening and declines, the receive
//    is copied as before, and a later one finds the lane ready;
//  - flushing a lane whose receive ended with aimed requests still posted: the QP to the error
//    state, every request back, reset, and up to RTS again, five QP state changes. Each is a
//    firmware command of tens of microseconds on a NIC, and every collective's last step on a
//    connection ends short, so on NCCL's proxy thread they would add up to milliseconds per
//    collective. The receive asks again (Endpoint::aim_close) until the flush is done.
//
// One thread, started by the first job and asleep while there is none. The jobs are bounded by
// construction: one opening at a time, and at most one flush per lane (kMaxLanes). The thread
// touches nothing of the endpoint's but the port's protection domain and the send CQ, which
// verbs lets threads share, and a lane handed to it, which nobody else touches until the lane
// says it is flushed (AimLane::flushed).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>

#include "verbs/aim_lane.h"

namespace optireduce::verbs {

class LaneWorker final : public LaneFlusher {
 public:
  static constexpr int kMaxFlushes = 8;  // the endpoint's kMaxLanes

  LaneWorker() = default;
  ~LaneWorker() { shutdown(); }
  LaneWorker(const LaneWorker&) = delete;
  LaneWorker& operator=(const LaneWorker&) = delete;

  // An opening started and not yet taken.
  bool opening() const { return open_started_; }
  // Starts opening a lane with AimLane::open's arguments (its flusher: this worker); false
  // (nothing started) while one is still under way.
  bool start_open(PortContext* port, ibv_cq* send_cq, uint32_t depth, uint32_t max_datagram,
                  uint64_t* stop_clock);
  // The finished opening's result, without waiting: false while none is finished. On success
  // *lane holds the lane; otherwise *st says why not.
  bool take_opened(std::unique_ptr<AimLane>* lane, Status* st);

  // LaneFlusher: queues the lane's flush; false when no thread can take it (the lane then
  // flushes itself on the caller's thread).
  bool submit(Flushable* lane) override;

  // Finishes the job under way, drops a queued opening, and joins the thread; then runs the
  // flushes still queued on the caller's thread. Before the lanes and the send CQ go.
  void shutdown();

 private:
  struct OpenArgs {
    PortContext* port = nullptr;
    ibv_cq* send_cq = nullptr;
    uint32_t depth = 0;
    uint32_t max_datagram = 0;
    uint64_t* stop_clock = nullptr;
  };
  bool ensure_thread_locked();
  void run();

  bool open_started_ = false;  // the owner's: an opening queued, running, or its result waiting

  std::mutex mu_;
  std::condition_variable cv_;
  std::thread thread_;                  // started under mu_
  bool stopping_ = false;               // guarded by mu_
  bool open_queued_ = false;            // guarded by mu_
  OpenArgs open_;                       // guarded by mu_
  bool open_ready_ = false;             // guarded by mu_
  std::unique_ptr<AimLane> opened_;     // guarded by mu_
  Status open_status_;                  // guarded by mu_
  Flushable* flushes_[kMaxFlushes] = {};  // guarded by mu_
  int nflush_ = 0;                      // guarded by mu_
};

}  // namespace optireduce::verbs
