// Where a bounded receive's deadline comes from. A policy is shared by the connections of one
// group (a communicator) so they calibrate and adapt together; see bounded.h for the one the
// plugin and liboptireduce use, and docs/architecture.md ("Deadlines") for the reasoning.
#pragma once

#include <cstdint>

namespace optireduce {

enum class RecvEnd : uint8_t { kAll, kDeadline, kEarly, kExpired };

// A message posted this soon after its connection's previous one completed continues a burst
// rather than starting one: NCCL reposts a chunk's slot as soon as the GPU copied it out, within
// microseconds on a dedicated GPU, while the next step waits for the application.
inline constexpr uint64_t kBurstRefillNs = 500'000;

// Whether a message posted at `now` starts a burst on its connection (send or receive side):
// every earlier message is complete, and the last one ended kBurstRefillNs ago or more (0: none).
inline bool starts_burst(bool earlier_complete, uint64_t last_end_ns, uint64_t now) {
  return earlier_complete && (last_end_ns == 0 || now - last_end_ns >= kBurstRefillNs);
}

// What one finished receive tells the policy.
struct StepReport {
  uint64_t bytes = 0;       // message size (capacity when nothing arrived)
  uint64_t received = 0;    // bytes that arrived
  uint64_t elapsed_ns = 0;  // from becoming the oldest incomplete receive to the end
  // From the later of that and the sender's first packet to the end: the network's share of
  // the step, without the time the sender took to reach it (0: the sender never started).
  uint64_t network_ns = 0;
  RecvEnd how = RecvEnd::kAll;
  bool bounded = false;
  // Data was already arriving when the receive became the oldest: the elapsed time then
  // covers only the end of the transfer, not a whole step, and must not feed the estimates.
  bool pipelined = false;
  // The first receive of a burst on its connection (starts_burst), whose start delay is the
  // ranks' skew. NCCL cuts a step into chunks (8 receives posted ahead, dozens per step), and a
  // later chunk's start delay is the sender's pipeline between chunks, not skew: counted too,
  // the few skew samples fell out of the P95.
  bool burst_head = false;
};

// The deadline figures of one message size at one moment. tB alone does not say how long a
// step may take once the loss governor stretched the budget, hence the budget and allowance.
struct DeadlineQuote {
  uint64_t tb_ns = 0;         // the hard bound tB
  uint64_t tc_ns = 0;         // the agreed estimate tC
  uint64_t budget_ns = 0;     // as budget_ns() would give
  uint64_t allowance_ns = 0;  // as start_allowance_ns() would give
};

class DeadlinePolicy {
 public:
  virtual ~DeadlinePolicy() = default;
  // True while the group measures tB: receives then run exact.
  virtual bool calibrating() = 0;
  // Time a bounded transfer of `bytes` may take on the network, counted from when both sides
  // are under way: the receive is the connection's oldest incomplete one and the sender's
  // first packet arrived (or, for data that arrived first, from the former).
  virtual uint64_t budget_ns(uint64_t bytes) = 0;
  // How long a bounded receive waits, from becoming the oldest, for a sender that has not
  // started, and a sender for its receiver's CTS. Ranks reach a step at different times (a
  // data-parallel job's compute skew), and that lateness is not the network's: charged to the
  // budget, routine skew would cut whole messages. A peer that never starts in time (a
  // straggler, a stalled rank) costs the other side this much per step. At least budget_ns.
  virtual uint64_t start_allowance_ns(uint64_t bytes) = 0;
  // Early timeout: how long to wait after the tail packets arrived.
  virtual uint64_t early_ns(uint64_t bytes) = 0;
  // A receive finished.
  virtual void on_complete(const StepReport& step) = 0;
  // The first send of a burst on a connection started; this side posted it `lateness_ns`
  // after its receiver's CTS for it had arrived (0: the CTS came later): the skew as the later
  // rank sees it.
  virtual void on_send_lateness(uint64_t lateness_ns) { (void)lateness_ns; }
  // A sender this side cut before it started (a StepReport with nothing received, that waited
  // `counted_ns`) showed up `late_ns` after the receive began: its first packet of the message
  // after the cut, late DATA or its notice that it expired the message on finding it ended.
  virtual void on_late_sender(uint64_t counted_ns, uint64_t late_ns) {
    (void)counted_ns;
    (void)late_ns;
  }
  // A peer's piggybacked estimate tC (microseconds; 0 = none) for messages of `bytes`.
  virtual void on_peer_estimate(uint32_t tc_us, uint64_t bytes) = 0;
  // Our current estimate tC for messages of `bytes`, to piggyback (microseconds).
  virtual uint32_t estimate_us(uint64_t bytes) = 0;
  // What a receive of `bytes` would get now, for the counters users read; counts no use.
  virtual DeadlineQuote quote(uint64_t bytes) = 0;
};

}  // namespace optireduce
