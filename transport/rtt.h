// Round-trip time estimates. RttEstimator: the sender's smoothed RTT and retransmission timeout
// (RFC 6298 smoothing, Karn's rule applied by the caller: only packets sent once give samples).
// MinRttFilter: the receiver's view, from samples that can only overstate the RTT.
#pragma once

#include <algorithm>
#include <cstdint>

namespace optireduce {

class RttEstimator {
 public:
  RttEstimator(uint64_t rto_min_ns, uint64_t rto_max_ns, uint64_t initial_rto_ns)
      : rto_min_ns_(rto_min_ns), rto_max_ns_(rto_max_ns), rto_ns_(initial_rto_ns) {}

  // The timeout follows the measured RTT: RFC 6298's srtt + 4 rttvar, but never below twice
  // the smoothed RTT (on a steady path rttvar decays to nearly 0, and an ACK that waits for
  // the receiver's next burst or pass would then time out spuriously, which collapses the
  // window), nor outside [rto_min, rto_max]. So a 10 us fabric gets a timeout of tens of
  // microseconds above rto_min, and a 2 ms one a timeout above 4 ms.
  //
  // It also never falls below 5/4 of the largest sample of the last kMaxWindow to 2 x
  // kMaxWindow: a receiver that stops polling now and then (NCCL's proxy while the GPU, or here
  // the CPU, works on a slot; a descheduled process) makes the ACKs of every packet in flight
  // at that moment as late as the pause, once per pause, and the smoothed variation forgets such
  // a sample within a few dozen quick ones, so each pause used to fire a spurious timeout (on
  // loopback with NCCL's proxy pattern, one in seven packets went twice). A path without pauses
  // keeps its small timeout: its largest recent sample is close to its mean.
  void sample(uint64_t rtt_ns);
  // An upper bound of a round trip, where Karn's rule allows no sample: the ACK of a packet sent
  // more than once, timed from its first copy. Only the largest recent sample takes it, so the
  // timeout can only grow by it (to 5/4 of it); the smoothed RTT and its variation are left
  // alone, since the bound overstates the RTT by up to a timeout where the first copy was lost.
  void sample_bound(uint64_t bound_ns);
  // Doubles the timeout after an expiry (exponential backoff), up to the maximum.
  void backoff();
  // The peer acknowledged new data: the path works again, so the timeout returns from its
  // backoff to what the samples say. Without it a timeout stays doubled until the next sample,
  // and Karn's rule gives none while every packet in flight is a retransmission (the timeout
  // marked a whole window lost): under a burst of loss each further timeout doubled it again.
  void on_progress();

  bool has_sample() const { return srtt_ns_ != 0; }
  uint64_t srtt_ns() const { return srtt_ns_; }
  uint64_t rttvar_ns() const { return rttvar_ns_; }
  uint64_t rto_ns() const { return rto_ns_; }
  // The largest sample of the recent windows (0 before the first).
  uint64_t recent_max_ns() const { return std::max(cur_max_, prev_max_); }

  static constexpr uint32_t kMaxWindow = 64;

 private:
  uint64_t computed_rto() const;
  void note_max(uint64_t r);  // into the largest-sample windows

  uint64_t rto_min_ns_, rto_max_ns_;
  uint64_t cur_max_ = 0, prev_max_ = 0;  // of the current window and the one before
  uint32_t in_cur_ = 0;
  uint64_t srtt_ns_ = 0;
  uint64_t rttvar_ns_ = 0;
  uint64_t rto_ns_;
};

// The smallest of the recent samples of a quantity that is only ever overstated (a receiver's
// CTS-to-first-DATA time: the RTT plus however long the sender took to post and to poll). The
// minimum of a window finds the RTT as soon as one sample caught a sender that was waiting;
// two windows of kWindow samples let it rise again within 2 x kWindow samples when the path's
// RTT grows (a smoothed mean of such samples would carry every late isend).
class MinRttFilter {
 public:
  static constexpr uint32_t kWindow = 16;

  // Inline: the receive path's fuzz target links transport sources one by one, without rtt.cc.
  void sample(uint64_t ns) {
    if (ns == 0) ns = 1;
    cur_min_ = cur_min_ == 0 || ns < cur_min_ ? ns : cur_min_;
    if (++in_cur_ == kWindow) {
      prev_min_ = cur_min_;
      cur_min_ = 0;
      in_cur_ = 0;
    }
    best_ns_ = prev_min_ == 0                          ? cur_min_
               : cur_min_ == 0 || prev_min_ < cur_min_ ? prev_min_
                                                       : cur_min_;
  }
  bool has_sample() const { return best_ns_ != 0; }
  uint64_t min_ns() const { return best_ns_; }  // 0 before the first sample

 private:
  uint64_t cur_min_ = 0;   // of the current window (0: empty)
  uint64_t prev_min_ = 0;  // of the window before it
  uint32_t in_cur_ = 0;
  uint64_t best_ns_ = 0;
};

}  // namespace optireduce
