// Opens a receive lane (aim_lane.h) on a thread of its own, so that no call NCCL makes waits
// for one. A lane's set-up is a CQ, a QP taken to RTS and two registrations of about 1.3 MiB:
// on a real NIC a millisecond or more of firmware commands, and under the VM's emulation tens
// of milliseconds. Asked for from aim_open (which runs inside irecv), it would stall the very
// receive it was meant to speed up and every connection behind the endpoint's lock. Instead
// aim_open starts an opening and declines; the receive is copied as before, and a later one
// finds the lane ready.
//
// One opening at a time. The thread touches nothing of the endpoint's but the port's
// protection domain and the send CQ, which verbs lets threads share; it hands its result over
// under a mutex held only for that hand-over.
#pragma once

#include <memory>
#include <mutex>
#include <thread>

#include "verbs/aim_lane.h"

namespace optireduce::verbs {

class LaneOpener {
 public:
  LaneOpener() = default;
  ~LaneOpener() { abandon(); }
  LaneOpener(const LaneOpener&) = delete;
  LaneOpener& operator=(const LaneOpener&) = delete;

  // An opening started and not yet taken.
  bool busy() const { return started_; }

  // Starts opening a lane with AimLane::open's arguments; false (nothing started) while one is
  // still busy.
  bool start(PortContext* port, ibv_cq* send_cq, uint32_t depth, uint32_t max_datagram,
             uint64_t* stop_clock) {
    if (started_) return false;
    started_ = true;
    ready_ = false;
    thread_ = std::thread([=, this] {
      std::unique_ptr<AimLane> lane;
      const Status st = AimLane::open(port, send_cq, depth, max_datagram, stop_clock, &lane);
      std::lock_guard<std::mutex> lock(mu_);
      lane_ = std::move(lane);
      status_ = st;
      ready_ = true;
    });
    return true;
  }

  // The finished opening's result, without waiting: false while none is finished. On success
  // *lane holds the lane; otherwise *st says why not.
  bool take(std::unique_ptr<AimLane>* lane, Status* st) {
    if (!started_) return false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!ready_) return false;
      *lane = std::move(lane_);
      *st = status_;
    }
    thread_.join();  // it has published and returns at once
    started_ = false;
    return true;
  }

  // Waits for a running opening and closes what it opened: before the endpoint's send CQ goes.
  void abandon() {
    if (thread_.joinable()) thread_.join();
    lane_.reset();
    started_ = false;
  }

 private:
  std::thread thread_;
  bool started_ = false;  // the owner's: a thread runs or its result waits
  std::mutex mu_;
  bool ready_ = false;              // guarded by mu_
  std::unique_ptr<AimLane> lane_;   // guarded by mu_
  Status status_;                   // guarded by mu_
};

}  // namespace optireduce::verbs
