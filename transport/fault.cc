// The fault injector's decisions (seeded PRNG streams), its pool of held datagrams, and the
// bookkeeping that keeps tx_burst's "taken" count true when the inner datapath takes less.
//
// Design notes:
//  - Each fault draws from its own PRNG stream, so that turning one fault on does not change
//    the pattern of another (the same seed drops the same datagrams with or without dup).
//  - A datagram's fate is decided when it is first offered. Dropping it, or copying it into the
//    pool, cannot be undone, so the datagrams queued before it are handed to the inner endpoint
//    first; if the inner endpoint refuses some, tx_burst returns a count that stops before the
//    first refused one and the irrevocable step never happens. What the caller offers again is
//    decided afresh.
//  - Only one datagram is held for reordering at a time: reordering means "overtaken by its
//    next few successors"; longer displacements are the delay fault's job.
#include "transport/fault.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>
#include <vector>

#include "transport/anon_mapping.h"
#include "transport/log.h"

namespace optireduce {
namespace {

// Entries handed to the inner endpoint per call: large enough to amortise its system call.
constexpr int kOutBatch = 64;
// Entries one offered datagram can add: itself, its duplicate, and the reorder-held datagram
// it releases with that one's duplicate.
constexpr int kMaxOutPerDatagram = 4;
// A reorder-held datagram goes out after this many successors at most (drawn from 1..3).
constexpr uint64_t kMaxReorderGap = 3;
// ... or after this long if no successor comes: far below the smallest default retransmission
// timeout (OPTIREDUCE_RTO_MIN_US = 2 ms), so that reordering is not turned into loss.
constexpr uint64_t kReorderMaxHoldNs = 100'000;
// A loss burst also ends when the endpoint offers nothing for this long. A burst stands for a
// spell of congestion on the path, which passes in time, not for the next few datagrams whenever
// they come: counted in datagrams only, a burst that began as an endpoint fell quiet took its
// sparse control traffic for seconds (a burst of mean 4 spans 8 PONGs 13% of the time, 4.4 s at
// the default peer timeout's PING interval), and a peer that only answered PINGs was condemned
// as dead (GpuDefect and GpuPath under OPTIREDUCE_FAULT_DROP=0.1, BURST=4, 1 run in 4-8 under
// load). Far above any gap inside a busy flow, so dense traffic sees the configured bursts.
constexpr uint64_t kBurstQuietNs = 10'000'000;
// Pareto delays are capped at this multiple of their scale: the tail stays heavy over two
// decades but a single draw cannot stall a test for minutes.
constexpr double kDelayCapFactor = 100;
// Pool sizing when the plan does not say: up to 1024 datagrams, within 16 MiB (so 256 of
// loopback's 64 KiB datagrams), never fewer than 64.
constexpr uint64_t kPoolBudgetBytes = 16u << 20;
constexpr uint32_t kMaxDerivedSlots = 1024;
constexpr uint32_t kMinDerivedSlots = 64;

// SplitMix64: 64 bits of state, passes BigCrush, and is cheap enough to call per datagram.
class Prng {
 public:
  explicit Prng(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1), from the top 53 bits (a double's mantissa).
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  bool chance(double p) { return p > 0 && uniform() < p; }

 private:
  uint64_t state_;
};

enum class Fate : uint8_t { kSend, kDrop, kDelay, kReorder };

struct Decision {
  Fate fate = Fate::kSend;
  bool dup = false;
  uint64_t delay_ns = 0;     // kDelay
  uint32_t reorder_gap = 0;  // kReorder
};

// A datagram copied into the pool.
struct Held {
  uint64_t release_ns = 0;
  uint64_t seq = 0;  // tie-break: equal release times leave in the order they were held
  uint32_t slot = 0;
  uint32_t len = 0;
  uint32_t steer = 0;  // TxPacket::steer: a held DATA still goes to its receive lane
  bool dup = false;
};

// Heap order: the earliest release at the front.
bool later(const Held& a, const Held& b) {
  return a.release_ns != b.release_ns ? a.release_ns > b.release_ns : a.seq > b.seq;
}

// What an entry of the outgoing batch is, for settling after the inner endpoint answered.
enum class OutKind : uint8_t {
  kOffered,  // an offered datagram (index: its position in the caller's array)
  kCopy,     // a duplicate: lost if not taken
  kHeld,     // a held datagram (index: into released_): goes back to the heap if not taken
};

struct OutRef {
  OutKind kind;
  int index;
};

class FaultyEndpoint final : public Endpoint {
 public:
  FaultyEndpoint(std::unique_ptr<Endpoint> inner, const FaultPlan& plan, const Clock& clock,
                 uint32_t slots, uint32_t slot_bytes, AnonMapping pool)
      : inner_(std::move(inner)),
        plan_(plan),
        clock_(clock),
        slot_bytes_(slot_bytes),
        pool_(std::move(pool)),
        drop_rng_(stream_seed(plan.seed, 1)),
        dup_rng_(stream_seed(plan.seed, 2)),
        delay_rng_(stream_seed(plan.seed, 3)),
        reorder_rng_(stream_seed(plan.seed, 4)) {
    burst_continue_ = plan.burst > 1 ? 1.0 - 1.0 / plan.burst : 0.0;
    delay_scale_ns_ = plan.delay_us * 1000.0;
    free_.reserve(slots);
    for (uint32_t s = slots; s > 0; --s) free_.push_back(s - 1);
    heap_.reserve(slots);
  }

  const PeerAddress& local_address() const override { return inner_->local_address(); }
  Status set_peer(const PeerAddress& peer) override { return inner_->set_peer(peer); }
  uint32_t max_datagram_bytes() const override { return inner_->max_datagram_bytes(); }
  // The inner endpoint's figure (loopback's 64 KiB datagrams for a peer on this host), so that
  // the faults change what the network does to datagrams, not their size: with the interface's
  // MTU instead, ranks on one host moved 47 times the datagrams, and 1% loss cost TAR 3.5x its
  // time per call, against 1.35x in 64 KiB datagrams. Within a pool slot where datagrams may be
  // held.
  uint32_t max_datagram_bytes_to(const PeerAddress& peer) const override {
    const uint32_t m = inner_->max_datagram_bytes_to(peer);
    return holds() ? std::min(m, slot_bytes_) : m;
  }
  const DatapathCounters& counters() const override { return inner_->counters(); }
  // Faults (delays, reordering) are applied on transmit only: receiving is the inner endpoint's.
  uint64_t receive_buffer_bytes() const override { return inner_->receive_buffer_bytes(); }
  std::string peer_text() const override { return inner_->peer_text(); }
  std::string peer_host() const override { return inner_->peer_host(); }
  const FaultCounters& fault_counters() const { return counters_; }

  int tx_burst(const TxPacket* pkts, int n) override;
  int rx_burst(RxPacket* pkts, int max) override {
    const int r = release_due(clock_.now_ns());
    if (r < 0) return r;
    return inner_->rx_burst(pkts, max);
  }
  int rx_into(RxHandler& own, int max) override {
    const int r = release_due(clock_.now_ns());
    if (r < 0) return r;
    return inner_->rx_into(own, max);
  }
  void set_rx_sink(RxSink* sink) override { inner_->set_rx_sink(sink); }
  int rx_take_kept(RxHandler& own) override { return inner_->rx_take_kept(own); }
  void set_last_words(const uint8_t* dgram, uint32_t len) override {
    inner_->set_last_words(dgram, len);
  }
  bool rx_pending() const override { return inner_->rx_pending(); }
  uint32_t aim_open(const AimTarget& t) override { return inner_->aim_open(t); }
  bool aim_close(uint32_t steer, bool wait) override { return inner_->aim_close(steer, wait); }
  uint64_t aim_moves() const override { return inner_->aim_moves(); }
  bool aim_reachable(uint32_t steer) override { return inner_->aim_reachable(steer); }
  std::string aim_text(uint32_t steer) const override { return inner_->aim_text(steer); }
  // A plan that holds nothing (drops and duplicates) is a filter on transmit, so the endpoint
  // is waited on and served as the inner one is: a caller blocks on its descriptor, and over a
  // shared endpoint the other callers' drains serve its connection. One that holds datagrams
  // is neither: they leave only during this endpoint's own calls, so the progress thread must
  // keep visiting it as it visits an endpoint of its own, and a caller must not sleep on a
  // descriptor that does not show them.
  bool shared() const override { return !holds() && inner_->shared(); }
  int readable_fd() const override { return holds() ? -1 : inner_->readable_fd(); }
  int idle_fd() const override { return holds() ? -1 : inner_->idle_fd(); }
  bool prepare_wait() override { return holds() || inner_->prepare_wait(); }
  void note_readable() override { inner_->note_readable(); }
  void set_blocked_waiter(bool on) override { inner_->set_blocked_waiter(on); }
  uint64_t last_caller_drain_ns() const override {
    return holds() ? 0 : inner_->last_caller_drain_ns();
  }
  int rx_burst_guessed(RxPacket* pkts, int max, const RxGuesses& g) override {
    const int r = release_due(clock_.now_ns());
    if (r < 0) return r;
    return inner_->rx_burst_guessed(pkts, max, g);
  }
  std::string address_text(const PeerAddress& a) const override { return inner_->address_text(a); }
  std::string address_host(const PeerAddress& a) const override { return inner_->address_host(a); }

 private:
  static uint64_t stream_seed(uint64_t seed, uint64_t stream) {
    Prng p(seed ^ (stream * 0xd1b54a32d192ed03ull));
    return p.next();
  }

  // `now`: when the datagram is offered (a loss burst ends after kBurstQuietNs of quiet).
  Decision decide(uint64_t now);
  bool hold(const TxPacket& p, Held* h);
  void append(const TxPacket& p, OutKind kind, int index, bool dup);
  void append_reorder_release();
  int flush(int* taken);
  int release_due(uint64_t now);
  // Whether the plan holds datagrams (delays, reordering): the pool is mapped exactly then.
  bool holds() const { return static_cast<bool>(pool_); }
  uint8_t* slot_ptr(uint32_t slot) const {
    return pool_.data() + static_cast<size_t>(slot) * slot_bytes_;
  }
  TxPacket slot_packet(const Held& h) const {
    TxPacket p{slot_ptr(h.slot), h.len, 0, nullptr};
    p.steer = h.steer;
    return p;
  }

  std::unique_ptr<Endpoint> inner_;
  const FaultPlan plan_;
  const Clock& clock_;
  const uint32_t slot_bytes_;
  // Slots of slot_bytes_ each; none when nothing is held. Mapped (anon_mapping.h): malloc under
  // meson's MALLOC_PERTURB_ filled all 16 MiB on every endpoint, 12 s at 8 ranks' 112.
  const AnonMapping pool_;
  Prng drop_rng_, dup_rng_, delay_rng_, reorder_rng_;
  double burst_continue_ = 0;  // probability that a loss burst goes on to the next datagram
  double delay_scale_ns_ = 0;
  bool in_burst_ = false;  // the next datagram belongs to the current loss burst
  uint64_t last_offered_ns_ = 0;  // when the last datagram was offered (decide)

  std::vector<uint32_t> free_;  // free pool slots (capacity reserved at creation)
  std::vector<Held> heap_;      // delayed datagrams, a min-heap by release time (ditto)
  uint64_t held_seq_ = 0;

  // The reorder-held datagram, if any (release_ns: when it goes even without successors).
  bool reorder_held_ = false;
  Held reorder_;
  uint32_t reorder_gap_left_ = 0;  // successors still to go out before it

  TxPacket out_[kOutBatch];
  OutRef out_ref_[kOutBatch];
  int out_n_ = 0;
  Held released_[kOutBatch];
  int released_n_ = 0;

  FaultCounters counters_;
};

Decision FaultyEndpoint::decide(uint64_t now) {
  Decision d;
  if (in_burst_ && now - last_offered_ns_ >= kBurstQuietNs) in_burst_ = false;
  last_offered_ns_ = now;
  bool drop = in_burst_;
  if (!drop) drop = drop_rng_.chance(plan_.drop);
  if (drop) {
    in_burst_ = drop_rng_.chance(burst_continue_);
    d.fate = Fate::kDrop;
    return d;
  }
  d.dup = dup_rng_.chance(plan_.dup);
  if (delay_rng_.chance(plan_.delay_prob)) {
    d.fate = Fate::kDelay;
    // Pareto by inversion: scale / U^(1/shape) with U in (0, 1].
    const double u = 1.0 - delay_rng_.uniform();
    const double ns = delay_scale_ns_ / std::pow(u, 1.0 / plan_.delay_alpha);
    d.delay_ns = static_cast<uint64_t>(std::min(ns, delay_scale_ns_ * kDelayCapFactor));
    return d;
  }
  if (!reorder_held_ && reorder_rng_.chance(plan_.reorder)) {
    d.fate = Fate::kReorder;
    d.reorder_gap = static_cast<uint32_t>(1 + reorder_rng_.next() % kMaxReorderGap);
  }
  return d;
}

// Copies `p` into a free slot. False when none is free (or it does not fit one).
bool FaultyEndpoint::hold(const TxPacket& p, Held* h) {
  const uint32_t len = p.hdr_len + p.payload_len;
  if (free_.empty() || len > slot_bytes_) {
    ++counters_.pool_exhausted;
    return false;
  }
  h->slot = free_.back();
  free_.pop_back();
  h->len = len;
  h->steer = p.steer;
  h->seq = held_seq_++;
  uint8_t* dst = slot_ptr(h->slot);
  if (p.hdr_len) std::memcpy(dst, p.hdr, p.hdr_len);
  if (p.payload_len) std::memcpy(dst + p.hdr_len, p.payload, p.payload_len);
  return true;
}

void FaultyEndpoint::append(const TxPacket& p, OutKind kind, int index, bool dup) {
  out_[out_n_] = p;
  out_ref_[out_n_++] = OutRef{kind, index};
  if (dup) {
    out_[out_n_] = p;
    out_ref_[out_n_++] = OutRef{OutKind::kCopy, index};
  }
}

// Moves the reorder-held datagram into the outgoing batch. Should the inner endpoint not take
// it, it joins the delayed datagrams as already due, and a new one may be held meanwhile.
void FaultyEndpoint::append_reorder_release() {
  reorder_held_ = false;
  Held h = reorder_;
  h.release_ns = 0;
  released_[released_n_] = h;
  append(slot_packet(h), OutKind::kHeld, released_n_, h.dup);
  ++released_n_;
}

// Hands the outgoing batch to the inner endpoint and settles each entry by whether it was
// taken. Returns 1 when everything was taken, 0 when the inner endpoint took less (then
// *taken is the first offered datagram not taken), or -errno.
int FaultyEndpoint::flush(int* taken) {
  if (out_n_ == 0) return 1;
  const int k = inner_->tx_burst(out_, out_n_);
  if (k < 0) {
    out_n_ = 0;
    released_n_ = 0;
    return k;
  }
  bool cut = false;
  for (int j = 0; j < out_n_; ++j) {
    const OutRef& ref = out_ref_[j];
    const bool ok = j < k;
    switch (ref.kind) {
      case OutKind::kOffered:
        if (ok) {
          *taken = ref.index + 1;
        } else if (!cut) {
          *taken = ref.index;
          cut = true;
        }
        break;
      case OutKind::kCopy:
        if (ok) ++counters_.duplicated;
        break;
      case OutKind::kHeld: {
        const Held& h = released_[ref.index];
        if (ok) {
          free_.push_back(h.slot);
        } else {
          heap_.push_back(h);
          std::push_heap(heap_.begin(), heap_.end(), later);
        }
        break;
      }
    }
  }
  const bool all = k >= out_n_;
  out_n_ = 0;
  released_n_ = 0;
  return all ? 1 : 0;
}

// Sends what is due: the reorder-held datagram once its time is up (successors release it
// earlier, in tx_burst), then delayed datagrams whose time has come, earliest first. Returns 1 when
// all of it went, 0 when the inner endpoint is full, or -errno.
int FaultyEndpoint::release_due(uint64_t now) {
  int unused = 0;
  if (reorder_held_ && now >= reorder_.release_ns) append_reorder_release();
  while (!heap_.empty() && heap_.front().release_ns <= now) {
    if (out_n_ + 2 > kOutBatch) {
      const int r = flush(&unused);
      if (r <= 0) return r;
    }
    std::pop_heap(heap_.begin(), heap_.end(), later);
    const Held h = heap_.back();
    heap_.pop_back();
    released_[released_n_] = h;
    append(slot_packet(h), OutKind::kHeld, released_n_, h.dup);
    ++released_n_;
  }
  return flush(&unused);
}

int FaultyEndpoint::tx_burst(const TxPacket* pkts, int n) {
  const uint64_t now = clock_.now_ns();
  const int released = release_due(now);
  if (released <= 0) return released;  // fatal, or the inner queue is full: nothing taken
  int taken = 0;
  for (int i = 0; i < n; ++i) {
    const Decision d = decide(now);
    if (d.fate != Fate::kSend) {
      // Irrevocable: the datagrams before it must be taken first.
      const int r = flush(&taken);
      if (r <= 0) return r < 0 ? r : taken;
      Held h;
      h.dup = d.dup;
      bool done = true;
      switch (d.fate) {
        case Fate::kDrop:
          ++counters_.dropped;
          break;
        case Fate::kDelay:
          done = hold(pkts[i], &h);
          if (done) {
            h.release_ns = now + d.delay_ns;
            heap_.push_back(h);
            std::push_heap(heap_.begin(), heap_.end(), later);
            ++counters_.delayed;
          }
          break;
        case Fate::kReorder:
          done = hold(pkts[i], &h);
          if (done) {
            h.release_ns = now + kReorderMaxHoldNs;
            reorder_ = h;
            reorder_held_ = true;
            reorder_gap_left_ = d.reorder_gap;
            ++counters_.reordered;
          }
          break;
        case Fate::kSend:
          break;
      }
      if (done) {
        taken = i + 1;
        continue;
      }
      // No slot: the datagram goes out unharmed (counted as pool_exhausted).
    }
    if (out_n_ + kMaxOutPerDatagram > kOutBatch) {
      const int r = flush(&taken);
      if (r <= 0) return r < 0 ? r : taken;
    }
    append(pkts[i], OutKind::kOffered, i, d.dup);
    if (reorder_held_ && --reorder_gap_left_ == 0) append_reorder_release();
  }
  const int r = flush(&taken);
  return r < 0 ? r : taken;
}

}  // namespace

FaultPlan FaultPlan::from_config(const Config& cfg) {
  FaultPlan p;
  p.seed = cfg.fault_seed;
  p.drop = cfg.fault_drop;
  p.burst = cfg.fault_burst;
  p.dup = cfg.fault_dup;
  p.reorder = cfg.fault_reorder;
  p.delay_prob = cfg.fault_delay_prob;
  p.delay_us = cfg.fault_delay_us;
  p.delay_alpha = cfg.fault_delay_alpha;
  return p;
}

std::unique_ptr<Endpoint> make_faulty_endpoint(std::unique_ptr<Endpoint> inner,
                                               const FaultPlan& plan, const Clock& clock) {
  // Only delays and reordering hold datagrams: drops and duplicates need no pool at all. A slot
  // holds the largest datagram the inner endpoint agrees to with any peer: the one to a peer
  // on this host (max_datagram_bytes_to never exceeds it).
  const bool holds = plan.reorder > 0 || plan.delay_prob > 0;
  const uint32_t slot_bytes =
      std::max({inner->max_datagram_bytes(),
                holds ? inner->max_datagram_bytes_to(inner->local_address()) : 0u, 1u});
  uint32_t slots = holds ? plan.pool_slots : 0;
  if (holds && slots == 0) {
    const uint64_t fit = kPoolBudgetBytes / slot_bytes;
    slots = static_cast<uint32_t>(std::clamp<uint64_t>(fit, kMinDerivedSlots, kMaxDerivedSlots));
  }
  AnonMapping pool;
  if (slots > 0 && !pool.map(static_cast<size_t>(slots) * slot_bytes)) {
    OR_WARN("fault injector: no memory for %u held datagrams; faults are off", slots);
    return inner;
  }
  FaultPlan checked = plan;
  // A shape of 0 would divide by zero; the parameter table's floor is 0.1.
  checked.delay_alpha = std::max(plan.delay_alpha, 0.1);
  std::unique_ptr<Endpoint> ep(new (std::nothrow) FaultyEndpoint(
      std::move(inner), checked, clock, slots, slot_bytes, std::move(pool)));
  if (!ep) {
    // The allocation failed before `inner` (or the pool) was moved from: `inner` goes back
    // unwrapped, and the pool is unmapped on return.
    OR_WARN("fault injector: out of memory; faults are off");
    return inner;
  }
  return ep;
}

const FaultCounters* fault_counters(const Endpoint& ep) {
  const auto* f = dynamic_cast<const FaultyEndpoint*>(&ep);
  return f ? &f->fault_counters() : nullptr;
}

}  // namespace optireduce
