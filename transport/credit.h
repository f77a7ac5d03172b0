// Receiver-driven credit for bounded traffic: how much of its downlink a receiver lets each of
// its senders use.
//
// Why at the receiver: the sender's delay-based window (congestion.h) learns of a queue one RTT
// after it formed, and each of N senders converging on one receiver starts with a full initial
// window of its own, so the first RTT of an incast puts N windows into one downlink queue. The
// receiver is the one place that knows how many senders a step has and what its downlink
// delivers, so it divides that among them (Homa, NDP and EQDS pull this way): every CTS and ACK
// of a bounded message grants the sender a number of packets beyond the highest one received.
// The sender's path window still applies; credit only ever lowers what it may send.
//
// How much: the downlink's budget is its delivery rate times the RTT it may run at (the base
// RTT plus the same queueing target as the senders' controllers). The rate is the largest
// arrival rate measured over recent intervals; the base RTT is the smallest delay from a CTS to
// the first DATA it unlocked. A budget that limits the senders measures a rate of budget / RTT,
// so it grows while the RTT stays below its target and settles where the queue reaches it.
// Before any measurement the budget is kInitialBudgetBytes (congestion.cc's initial window
// times a few senders), so that the first RTT of an incast cannot fill a shallow queue; it is
// also the floor (see kMinBudgetBytes): measurements only ever raise it, on links fast enough
// that 256 KiB is less than their rate times the target RTT.
//
// One Downlink per local device, shared by every receiving connection on it (DownlinkTable);
// its mutex is a leaf, taken once per received burst, never per packet.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>

namespace optireduce {

struct DownlinkSnapshot {
  uint64_t budget = 0;    // bytes all senders together may have in flight to us
  uint32_t senders = 0;   // connections with a bounded receive posted
  uint32_t peak = 0;      // the most senders at once recently
  double rate = 0;        // bytes per ns, the windowed maximum (0: not measured yet)
  uint64_t base_rtt = 0;  // ns (0: not measured yet)
};

class Downlink {
 public:
  // Before any measurement. 256 KiB: two initial windows of jumbo packets (congestion.cc); 7
  // senders start with 4-5 packets each instead of 16.
  static constexpr uint64_t kInitialBudgetBytes = 256 << 10;
  // Never less, whatever the measurements say. The budget is measured from arrivals, and on a
  // busy host (4 ranks on 2 cores in bench/lab) a descheduled receiver or sender stretches the
  // RTT past the target: the link idles, the measured rate falls, the budget with it, and the
  // credit throttles the next RTT further. With a floor of 64 KiB that spiral cost TAR bounded
  // 18% of its idle P50 in the lab (64.3 ms against 56.7 ms without credit, 6.7% of receives
  // at their deadline); at the initial budget it costs nothing there (54.4 ms, none), and a
  // 7-sender incast still starts at 4 jumbo packets each instead of 16. Credit is a cap against
  // incast, not the controller of the rate: the senders' delay-based windows are.
  static constexpr uint64_t kMinBudgetBytes = kInitialBudgetBytes;
  // Never fewer packets granted to one sender (its SACK-based loss detection needs a few).
  static constexpr uint32_t kMinCreditPkts = 2;
  // The largest credit the wire can carry (a 16-bit field).
  static constexpr uint32_t kMaxCreditPkts = 0xFFFF;

  // A connection has bounded receives posted (join) or no longer has any (leave).
  void join(uint64_t now);
  void leave();
  // Bytes of DATA a connection accepted in one received burst, at `now`.
  void on_bytes(uint64_t bytes, uint64_t now);
  // The first DATA of a message arrived `rtt_ns` after its CTS was sent.
  void on_rtt(uint64_t rtt_ns, uint64_t now);
  // Packets of `pkt_payload` bytes each sender may have in flight now. `first`: for a CTS, the
  // credit a message starts with. The receives of a step are posted one after another, so the
  // first CTS of a step would see one sender and grant it the whole budget; a CTS therefore
  // divides by the most senders seen recently (the last step had as many as this one will),
  // an ACK by the senders active now (a straggler finishing alone gets the whole link).
  uint32_t credit_pkts(uint32_t pkt_payload, bool first = false) const;
  DownlinkSnapshot snapshot() const;

 private:
  // Rate intervals, and how many of them the maximum looks back over.
  static constexpr uint64_t kIntervalNs = 2'000'000;
  static constexpr size_t kIntervals = 8;
  // The base RTT forgets after this long (a route change, a migrated VM).
  static constexpr uint64_t kBaseWindowNs = 10'000'000'000;
  // The recent peak of senders covers this window and the one before it.
  static constexpr uint64_t kPeakWindowNs = 1'000'000'000;

  void update_budget_locked();
  void roll_locked(uint64_t now);

  mutable std::mutex mu_;
  uint32_t senders_ = 0;
  uint32_t peak_cur_ = 0, peak_prev_ = 0;
  uint64_t peak_epoch_ns_ = 0;
  uint64_t budget_ = kInitialBudgetBytes;
  std::array<double, kIntervals> rates_{};  // bytes per ns of the last intervals
  size_t cur_ = 0;
  uint64_t interval_start_ = 0;
  uint64_t interval_bytes_ = 0;
  uint64_t base_rtt_ = 0, base_epoch_ns_ = 0;
};

// The downlinks of a process, one per local device index.
class DownlinkTable {
 public:
  std::shared_ptr<Downlink> get(int dev);

 private:
  std::mutex mu_;
  std::array<std::shared_ptr<Downlink>, 64> links_{};
};

}  // namespace optireduce
