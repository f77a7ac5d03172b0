// Congestion control of a path: how many bytes the connections from one local device to one
// remote host may keep in the network, and how fast they may put them there.
//
// Why per path and not per connection: NCCL opens several channels (connections) per peer pair
// and a communicator's collectives add more; TAR opens one per peer. Each of them controlled on
// its own is as aggressive as one flow, so k connections take k shares of a bottleneck and
// overflow a shallow queue k times as fast. All connections and communicators of a process
// between the same two hosts therefore draw from one window (PathTable hands out the shared
// Path).
//
// Why delay and not loss: a cloud fabric drops when a queue overflows, a lossless RoCE fabric
// pauses instead and never drops, and a shallow queue overflows before a loss-based window
// notices. The round-trip time rises in all three cases before anything is lost, so the window
// follows it (Swift's rule: grow while the RTT is below a target of the path's base RTT plus a
// small queueing allowance, shrink in proportion to the excess once per RTT). Loss alone cuts
// the window only when the RTT says the queue was full: random loss on an idle link is not
// congestion, and cutting for it starves the step that needs the link most.
//
// Why it sometimes competes on loss instead: traffic that backs off only on loss (TCP cubic or
// Reno, the usual background in a cloud) fills a drop-tail queue to the brim whatever a
// delay-based sender does. Obeying the delay then leaves the window at its floor for as long as
// that traffic lasts (a few percent of the link: every step starves). So a deep queue that
// outlasts several RTTs while the window sits at its floor and leaves the device's paths a
// small fraction of the rate they had (delivery_meter.h) is taken for someone else's, and the path
// competes on their terms (Copa and Compound TCP switch the same way): it resumes the rate it had
// at the last RTT on target, before the queue built (that window times the RTT the queue now
// imposes over the RTT then, within what the device's best rate needs at that RTT), and then
// grows by a packet per RTT and shrinks by 30% per loss episode, ignoring the delay. The window
// alone would be the same bytes spread over a round trip ten to forty times longer behind a
// full queue: a few percent of the link for as long as the competitor lasts. It goes back to
// the delay rule as soon as the RTT comes down to target (the queue drained) or the path's
// delivery rate is back to what it reached under the delay rule (whoever held the queue is
// gone, and the queue is ours).
//
// Bounded and exact traffic share the same window: bounded packets are acknowledged too (see
// send.h), so the rate follows the network during bounded steps instead of freezing at a
// figure measured during calibration.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "transport/delivery_meter.h"
#include "transport/pacer.h"

namespace optireduce {

// The RTT a path may run at: its base RTT plus a queueing allowance of the larger of `floor_ns`
// and half the base RTT (Swift's target). The receiver's credit (credit.h) aims at the same
// delay, so that the two never fight over the queue.
inline constexpr uint64_t kQueueTargetFloorNs = 500'000;
uint64_t queueing_target_ns(uint64_t base_rtt_ns, uint64_t floor_ns = kQueueTargetFloorNs);

// The decision rule, behind an interface so that a path can carry another one (a test double,
// a future receiver-credit rule) without the send side changing. Not thread-safe: Path
// serialises every call.
class CongestionController {
 public:
  virtual ~CongestionController() = default;
  // Bytes the path may have in flight.
  virtual uint64_t window_bytes() const = 0;
  // Bytes per ns at which packets may leave (0: unpaced, the window alone governs).
  virtual double pacing_rate() const = 0;
  // `acked` bytes newly acknowledged at `now`; rtt_ns: a round-trip sample taken from them (0 if
  // none: every acknowledged packet had been retransmitted), the network's part of it (the
  // hosts' waits taken out, send.h), and whole_rtt_ns the same round trip as measured, waits
  // included: an estimate that can only overstate the network's part, whereas taking the
  // waits out may overshoot. whole_rtt_ns is 0 where the sample is no measure of the base (a
  // short packet, which crosses each link faster than a full one).
  virtual void on_ack(uint64_t acked, uint64_t rtt_ns, uint64_t whole_rtt_ns, uint64_t now) = 0;
  // Where the two are the same (tests; a datapath that knows no waits).
  void on_ack(uint64_t acked, uint64_t rtt_ns, uint64_t now) { on_ack(acked, rtt_ns, rtt_ns, now); }
  // A packet was found lost (SACK hole).
  virtual void on_loss(uint64_t now) = 0;
  // The retransmission timer fired: nothing came back for a whole RTO.
  virtual void on_timeout(uint64_t now) = 0;
  // Whether it competes on loss right now, ignoring the delay (a statistic).
  virtual bool competing() const { return false; }
  // The base RTT it measures from, in ns (a statistic; 0 where it keeps none).
  virtual uint64_t base_rtt_ns() const { return 0; }
};

struct DelayControlOptions {
  uint32_t mss = 8192;              // payload bytes per packet
  uint64_t max_window = 64u << 20;  // never more in flight than this
  // Queueing allowed above the base RTT before the window shrinks. A floor, not a fraction of
  // the base RTT alone: on a host path the RTT includes scheduling noise of a few hundred us.
  uint64_t target_floor_ns = kQueueTargetFloorNs;
  // What the device's paths deliver together (delivery_meter.h), shared by them; null: a meter
  // of the controller's own.
  std::shared_ptr<DeliveryMeter> meter;
};

// Swift-like delay-based window with a pacing rate derived from it.
class DelayController final : public CongestionController {
 public:
  explicit DelayController(const DelayControlOptions& o);

  uint64_t window_bytes() const override { return static_cast<uint64_t>(cwnd_); }
  double pacing_rate() const override;
  using CongestionController::on_ack;
  void on_ack(uint64_t acked, uint64_t rtt_ns, uint64_t whole_rtt_ns, uint64_t now) override;
  void on_loss(uint64_t now) override;
  void on_timeout(uint64_t now) override;

  // For tests and statistics.
  uint64_t base_rtt_ns() const override { return base_rtt_; }
  uint64_t srtt_ns() const { return srtt_; }
  uint64_t target_ns() const;
  uint64_t decreases() const { return decreases_; }
  bool competing() const override { return competing_; }
  uint64_t compete_episodes() const { return compete_episodes_; }

 private:
  void decrease(double factor, uint64_t now);
  double floor_bytes() const;
  // The deep-queue bookkeeping behind the switch to competing.
  void track_queue(uint64_t rtt, uint64_t now);
  bool starved(uint64_t now) const;
  double compete_cap() const;
  void start_competing(uint64_t now);
  void stop_competing();

  DelayControlOptions o_;
  std::shared_ptr<DeliveryMeter> meter_;
  double cwnd_;
  bool slow_start_ = true;  // multiplicative growth until the first decrease
  // Base RTT: the smallest whole round trip of the current and the previous window of
  // kBaseWindowNs, so that a route change (or a VM migration) is forgotten within two windows.
  // The whole round trip, not its network part: a base is a minimum, and one network sample
  // whose waits were overestimated (a kernel timestamp against the steady clock, a receiver's
  // hold counted from a later arrival) once set it at 10 us for the next 10-20 s, a target
  // every ordinary sample exceeded, and kept TAR's windows at their floors in the lab.
  uint64_t base_rtt_ = 0;
  uint64_t base_cur_ = 0, base_prev_ = 0, base_epoch_ns_ = 0;
  uint64_t srtt_ = 0;
  uint64_t last_rtt_ = 0;
  uint64_t last_decrease_ns_ = 0;
  uint64_t decreases_ = 0;
  // Competing with loss-based traffic (see the top of this file).
  bool competing_ = false;
  uint64_t compete_episodes_ = 0;
  uint64_t deep_since_ns_ = 0;  // every RTT sample since then found a deep queue (0: none)
  // The window and the RTT sample at the last sample on target: the rate the path had before a
  // competitor's queue made the delay rule cut it, which competing resumes.
  double window_on_target_ = 0;
  uint64_t rtt_on_target_ = 0;
};

// What a path's state looks like from outside (tests, statistics).
struct PathSnapshot {
  uint64_t window = 0;
  uint64_t inflight = 0;
  double rate = 0;  // bytes per ns
  uint64_t senders = 0;
  bool competing = false;  // competing on loss (CongestionController::competing)
  uint64_t base_rtt_ns = 0;
};

// One path: the controller, the bytes its connections have in flight, the pacer. Connections
// call it under their own lock; its mutex is a leaf (it calls nothing outside).
class Path {
 public:
  // ceiling_bytes_per_ns: OPTIREDUCE_RATE_GBPS (0: none), a cap on the pacing rate only.
  Path(std::unique_ptr<CongestionController> cc, uint32_t mss, double ceiling_bytes_per_ns);

  // Bytes a connection may start sending now: the window's room (at least one packet when
  // nothing is in flight, so that a path can never stall) within the pacer's tokens.
  uint64_t room(uint64_t now);
  // The pacer's tokens alone: retransmissions replace packets that already left flight, so
  // they are paced but not held back by the window (a full window must not stall repair).
  uint64_t tokens(uint64_t now);
  // When a connection that found no room for `bytes` should look again: when the pacer will
  // have them, if the pacer held it back; else (the window full of other connections' bytes,
  // whose ACKs free it without telling this one) `fallback_ns` from now.
  uint64_t retry_ns(uint64_t now, uint64_t bytes, uint64_t fallback_ns);
  void on_sent(uint64_t bytes);
  // `acked` bytes were acknowledged, `left_flight` of them were still counted in flight (a
  // packet already declared lost was not); rtt_ns = 0: no sample (whole_rtt_ns: as on_ack).
  void on_acked(uint64_t left_flight, uint64_t acked, uint64_t rtt_ns, uint64_t whole_rtt_ns,
                uint64_t now);
  // Bytes found lost leave flight (their retransmission will be counted by on_sent again).
  void on_lost(uint64_t bytes, uint64_t now);
  void on_timeout(uint64_t now);
  // Bytes that leave flight without telling anything about the network (a message given up,
  // a connection closed with packets outstanding).
  void release(uint64_t bytes);

  void attach() {
    std::lock_guard<std::mutex> l(mu_);
    ++senders_;
  }
  void detach() {
    std::lock_guard<std::mutex> l(mu_);
    --senders_;
  }
  PathSnapshot snapshot() const;

 private:
  void update_pacer_locked();

  mutable std::mutex mu_;
  std::unique_ptr<CongestionController> cc_;
  const uint32_t mss_;
  const double ceiling_;
  uint64_t inflight_ = 0;
  uint64_t senders_ = 0;
  Pacer pacer_;
};

// The paths of a process, by key ("device/remote host"). Holds them weakly: a path lives as long
// as a connection uses it, and a later connection to the same host after all are gone starts
// afresh (the network may have changed meanwhile).
class PathTable {
 public:
  // The path from local device `device` to host `host`; the paths of one device share its
  // DeliveryMeter.
  std::shared_ptr<Path> get(const std::string& device, const std::string& host, uint32_t mss,
                            double ceiling_bytes_per_ns);

 private:
  std::mutex mu_;
  std::map<std::string, std::weak_ptr<Path>> paths_;
  std::map<std::string, std::weak_ptr<DeliveryMeter>> meters_;
};

// The controller every path gets: DelayController with the defaults above. `meter`: its
// device's (null: one of its own).
std::unique_ptr<CongestionController> make_default_controller(
    uint32_t mss, std::shared_ptr<DeliveryMeter> meter = nullptr);

}  // namespace optireduce
