// BoundedGroup: the group of one communicator's connections (ConnGroup: they serve each
// other's progress) and the deadline policy of its bounded ones. It measures the
// hard bound tB (headroom x P95 of the first calibration steps, which run exact, leaving out
// congestion outliers; or OPTIREDUCE_TIMEOUT_MS),
// keeps the adaptive estimate tC (smoothed projected time to receive 100% of a step), agrees
// with the peers on the median of their piggybacked tC, and turns both into per-step budgets
// that scale with message size; its LossGovernor stretches them while steps lose more than the
// loss target. See docs/architecture.md, "Deadlines", for why per group.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>

#include "transport/deadline.h"
#include "transport/group.h"
#include "transport/loss_governor.h"
#include "transport/params.h"

namespace optireduce {

struct GroupStats {
  uint64_t steps = 0;            // receives completed (exact and bounded)
  uint64_t bounded_steps = 0;
  uint64_t bytes_expected = 0;   // of bounded receives
  uint64_t bytes_delivered = 0;
  uint64_t deadline_hits = 0;
  uint64_t early_timeouts = 0;
  uint64_t expired = 0;          // receives completed because the sender gave up
  uint64_t late_senders = 0;     // cut senders whose real lateness was learned (on_late_sender)
  bool calibrating = true;
  uint32_t tb_us = 0;            // hard bound of the most used size class
  uint32_t tc_us = 0;            // agreed estimate of that class
  double stretch = 1.0;          // LossGovernor's factor on every budget (filled by stats())
};

class BoundedGroup final : public ConnGroup, public DeadlinePolicy {
 public:
  explicit BoundedGroup(const Config& cfg);

  bool calibrating() override;
  uint64_t budget_ns(uint64_t bytes) override;
  uint64_t start_allowance_ns(uint64_t bytes) override;
  uint64_t early_ns(uint64_t bytes) override;
  void on_complete(const StepReport& step) override;
  void on_send_lateness(uint64_t lateness_ns) override;
  void on_late_sender(uint64_t counted_ns, uint64_t late_ns) override;
  void on_peer_estimate(uint32_t tc_us, uint64_t bytes) override;
  uint32_t estimate_us(uint64_t bytes) override;

  DeadlineQuote quote(uint64_t bytes) override;
  // The current hard bound tB and the agreed estimate tC for messages of `bytes`.
  uint64_t tb_ns(uint64_t bytes);
  uint64_t tc_ns(uint64_t bytes);

  GroupStats stats() const;
  // Names the group in its periodic log line (OPTIREDUCE_STATS_EVERY), e.g. a comm id.
  void set_label(uint64_t label);

  // Messages are grouped by size into power-of-two classes (class k: [2^k, 2^(k+1)) bytes).
  static constexpr int kClasses = 41;  // up to 1 TiB, NCCL's largest message
  static int size_class(uint64_t bytes);

 private:
  // Smallest budget ever given: a descheduled thread on a loaded host alone costs this much,
  // and cutting a step for scheduling noise loses data for nothing.
  static constexpr uint64_t kMinBudgetNs = 1'000'000;
  // Calibration also ends after this many times the configured steps even if few of them
  // were whole steps (a fully pipelined stream); tB then comes from every sample.
  static constexpr uint64_t kCalibrationPatience = 10;
  // tC is a central estimate; a step somewhat slower than usual should still complete.
  static constexpr double kHeadroom = 1.5;
  // Smoothing of tC: a quarter of each new projection, so a burst of congestion shows within a
  // few steps and a single outlier does not dominate.
  static constexpr double kAlpha = 0.25;
  // ... and of its mean deviation, which widens the budget where steps vary (as TCP's RTO
  // covers SRTT + 4 RTTVAR): the budget is at least tC + kDeviations x deviation. Where the
  // network is steady the 1.5 x tC above decides; where a step's time swings (a shared host's
  // scheduler, bursty background traffic) cutting at 1.5 x its mean cut one step in several:
  // 4 DDP ranks on a 2-core host lost ~15% of their gradients to it, none of it to the network.
  static constexpr double kBeta = 0.25;
  static constexpr double kDeviations = 4.0;
  // Calibration samples slower than this many times their median are left out of the P95.
  static constexpr uint64_t kOutlierFactor = 2;
  // A size of a class needs this many whole calibration steps for a P95 of its own (below).
  static constexpr uint32_t kMinSizeSamples = 3;
  // Calibration samples kept per class (P95 of at most this many).
  static constexpr int kMaxSamples = 256;
  // Peer estimates remembered per class for the median.
  static constexpr int kPeerRing = 15;
  // Skew samples remembered for the start allowance, of every size: skew is the ranks', not
  // the network's, and does not scale with message size. Both directions of it: how late a
  // peer's first packet came after this side's receive became the oldest (StepReport), and
  // how late this side posted a send its receiver had already asked for (on_send_lateness).
  // With the first alone, a rank that was routinely the later one never saw the skew it
  // caused, and cut its peer's data the first time the roles swapped. Only the first message
  // of a burst on its connection counts (burst_head): one per step on the host path, one per
  // step and NCCL channel among the dozens of chunks of the GPU path.
  static constexpr int kSkewSamples = 256;
  // The allowance waits this many times the P95 of those delays: routine skew is waited for.
  // A sender later than the allowance is cut and counts as exactly that late (all that is
  // known then), so one straggler in a full ring cannot raise it, while a skew beyond it in
  // more than 5% of the bursts raises it by at least this factor per refresh (every 16
  // samples). When the cut sender shows up, its real lateness replaces that lower bound.
  static constexpr double kSkewHeadroom = 2.0;
  // ... and never more than this for the skew: what a straggler costs the others at most. A
  // lateness beyond it is not counted at all: no allowance would have covered it, and counted
  // as a bound, a 2 s straggler in one step of ten (6% of the samples) raised the allowance,
  // doubling per refresh, towards this cap: each of its later straggles cost the others up to
  // a second where its first ones had cost them one allowance (about 90 ms in the tail lab).
  static constexpr uint64_t kMaxSkewNs = 1'000'000'000;
  // A sample left out of the ring's P95: a cut sender that turned out to be beyond the cap.
  static constexpr uint64_t kNoSkew = UINT64_MAX;

  // Sizes with an estimate of their own: one per message size in recent use (LRU).
  static constexpr int kSizes = 64;

  // The adaptive estimate tC and the peers' piggybacked ones.
  struct Estimate {
    double tc_ns = 0;  // 0 = no estimate yet
    double dev_ns = 0;  // smoothed |projection - tc_ns|
    std::array<uint32_t, kPeerRing> peer_us{};
    uint32_t npeer = 0;
    void add(double projected);
    void add_peer(uint32_t tc_us);
  };
  struct Class {
    uint32_t nsamples = 0;
    std::array<uint64_t, kMaxSamples> samples{};  // calibration completion times (whole steps)
    std::array<uint64_t, kMaxSamples> sample_bytes{};  // ... and their message sizes
    uint32_t nall = 0;                            // ... and of pipelined ones
    std::array<uint64_t, kMaxSamples> all{};
    uint64_t tb_ns = 0;  // 0 = not calibrated in this class
    Estimate est;        // of every size in the class: for a size not seen yet
    uint64_t uses = 0;
  };
  // tC per exact size as well: one size is one step of one bucket (a TAR phase of one DDP
  // bucket), and sizes of one class can live very different lives. In a DDP job the first
  // bucket's transfers overlap the rest of the backward pass and the last bucket's do not: on
  // loopback their times differed 2-5x within one class, whose shared tC then cut 75% of the
  // slow bucket's messages.
  struct Sized {
    uint64_t bytes = 0;  // 0 = free
    uint64_t last_use = 0;
    Estimate est;
  };

  uint64_t tb_locked(int c) const;
  // The budget from tB and tC alone, and with the governor's stretch.
  uint64_t unstretched_budget_locked(uint64_t bytes) const;
  uint64_t budget_locked(uint64_t bytes) const;
  uint64_t start_allowance_locked(uint64_t bytes) const;
  uint64_t agreed_tc_locked(uint64_t bytes) const;
  uint64_t agreed_tc_locked(int c, const Sized* z) const;
  // This rank's estimate for a size: its entry's once it has one, else its class's.
  const Estimate& own_estimate_locked(const Sized* z, int c) const;
  // The exact size's entry: find_sized_locked gives null when it has none; sized_locked finds
  // or makes it (reusing the least recently used one).
  const Sized* find_sized_locked(uint64_t bytes) const;
  Sized& sized_locked(uint64_t bytes);
  void finish_calibration_locked();
  uint64_t calibrated_tb_locked(const Class& k) const;
  // `lower_bound`: a cut sender counted at the allowance, until on_late_sender corrects it.
  void on_start_delay_locked(uint64_t delay_ns, bool lower_bound);
  void refresh_skew_locked();  // skew_ns_ from the ring
  void log_every_locked();

  mutable std::mutex mu_;
  const double fixed_tb_ns_;  // OPTIREDUCE_TIMEOUT_MS in ns; 0 = calibrate
  const double tb_headroom_;  // OPTIREDUCE_TIMEOUT_HEADROOM
  const uint64_t calibration_steps_;
  const double early_fraction_;
  const uint64_t stats_every_;
  uint64_t label_ = 0;
  bool calibrating_;
  std::array<Class, kClasses> classes_{};
  std::array<Sized, kSizes> sized_{};
  uint64_t sized_clock_ = 0;
  std::array<uint64_t, kSkewSamples> skew_{};    // start delays, a ring (kNoSkew: left out)
  std::array<bool, kSkewSamples> skew_bound_{};  // ... that one is a cut sender's lower bound
  uint64_t nskew_ = 0;
  uint64_t skew_ns_ = 0;  // kSkewHeadroom x P95 of skew_, refreshed as samples come
  LossGovernor governor_;  // never stretches a bound the user fixed (OPTIREDUCE_TIMEOUT_MS)
  GroupStats stats_;
};

}  // namespace optireduce
