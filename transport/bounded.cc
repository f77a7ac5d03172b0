// BoundedGroup implementation.
#include "transport/bounded.h"

#include <algorithm>
#include <cmath>

#include "transport/log.h"

namespace optireduce {

namespace {
// Index of the P95 among n >= 1 sorted values.
size_t p95_index(size_t n) {
  return std::min(n - 1, static_cast<size_t>(std::ceil(0.95 * static_cast<double>(n))) - 1);
}
}  // namespace

BoundedGroup::BoundedGroup(const Config& cfg)
    : fixed_tb_ns_(cfg.timeout_ms * 1e6),
      tb_headroom_(cfg.timeout_headroom),
      calibration_steps_(static_cast<uint64_t>(cfg.calibration_steps)),
      early_fraction_(cfg.early_fraction),
      stats_every_(static_cast<uint64_t>(cfg.stats_every)),
      calibrating_(cfg.timeout_ms <= 0 && cfg.calibration_steps > 0),
      governor_(cfg.timeout_ms > 0 ? 1.0 : cfg.loss_target) {
  stats_.calibrating = calibrating_;
}

int BoundedGroup::size_class(uint64_t bytes) {
  if (bytes <= 1) return 0;
  return std::min(kClasses - 1, 63 - __builtin_clzll(bytes));
}

bool BoundedGroup::calibrating() {
  std::lock_guard<std::mutex> lock(mu_);
  return calibrating_;
}

uint64_t BoundedGroup::tb_locked(int c) const {
  if (fixed_tb_ns_ > 0) return static_cast<uint64_t>(fixed_tb_ns_);
  if (classes_[c].tb_ns) return classes_[c].tb_ns;
  // No calibration in this class: scale from the nearest calibrated class. Larger messages
  // take proportionally longer (bandwidth-bound); smaller ones are bounded by the smaller
  // class's latency-dominated figure (never scaled below it).
  for (int d = 1; d < kClasses; ++d) {
    if (c - d >= 0 && classes_[c - d].tb_ns)
      return classes_[c - d].tb_ns << std::min(d, 20);
    if (c + d < kClasses && classes_[c + d].tb_ns) return classes_[c + d].tb_ns;
  }
  return 1'000'000'000;  // nothing calibrated at all (calibration disabled): one second
}

void BoundedGroup::Estimate::add(double projected) {
  if (tc_ns == 0) {
    tc_ns = projected;
    dev_ns = projected / 2;
    return;
  }
  dev_ns = (1 - kBeta) * dev_ns + kBeta * std::abs(projected - tc_ns);
  tc_ns = (1 - kAlpha) * tc_ns + kAlpha * projected;
}

void BoundedGroup::Estimate::add_peer(uint32_t tc_us) {
  peer_us[npeer % kPeerRing] = tc_us;
  ++npeer;
}

const BoundedGroup::Sized* BoundedGroup::find_sized_locked(uint64_t bytes) const {
  for (const Sized& z : sized_) {
    if (z.bytes == bytes) return &z;
  }
  return nullptr;
}

BoundedGroup::Sized& BoundedGroup::sized_locked(uint64_t bytes) {
  Sized* victim = &sized_[0];
  for (Sized& z : sized_) {
    if (z.bytes == bytes) {
      z.last_use = ++sized_clock_;
      return z;
    }
    if (z.last_use < victim->last_use) victim = &z;
  }
  *victim = Sized{};
  victim->bytes = bytes;
  victim->last_use = ++sized_clock_;
  return *victim;
}

const BoundedGroup::Estimate& BoundedGroup::own_estimate_locked(const Sized* z, int c) const {
  return z != nullptr && z->est.tc_ns > 0 ? z->est : classes_[c].est;
}

// Own estimate and peers' of this exact size (`z`, its entry or null), else of its class (a
// size not seen yet).
uint64_t BoundedGroup::agreed_tc_locked(int c, const Sized* z) const {
  const Estimate& own = own_estimate_locked(z, c);
  const Estimate& peers = z != nullptr ? z->est : classes_[c].est;
  const uint64_t tb = tb_locked(c);
  uint64_t vals[kPeerRing + 1];
  int n = 0;
  vals[n++] = own.tc_ns > 0 ? static_cast<uint64_t>(own.tc_ns) : tb;
  for (uint32_t i = 0; i < std::min<uint32_t>(peers.npeer, kPeerRing); ++i)
    vals[n++] = uint64_t{peers.peer_us[i]} * 1000;
  std::nth_element(vals, vals + n / 2, vals + n);
  return std::min(vals[n / 2], tb);
}

uint64_t BoundedGroup::agreed_tc_locked(uint64_t bytes) const {
  return agreed_tc_locked(size_class(bytes), find_sized_locked(bytes));
}

uint64_t BoundedGroup::unstretched_budget_locked(uint64_t bytes) const {
  const int c = size_class(bytes);
  const Sized* z = find_sized_locked(bytes);
  const auto tc = static_cast<double>(agreed_tc_locked(c, z));
  const double dev = own_estimate_locked(z, c).dev_ns;
  const auto adaptive = static_cast<uint64_t>(std::max(kHeadroom * tc, tc + kDeviations * dev));
  return std::max(kMinBudgetNs, std::min(tb_locked(c), adaptive));
}

uint64_t BoundedGroup::budget_locked(uint64_t bytes) const {
  return static_cast<uint64_t>(static_cast<double>(unstretched_budget_locked(bytes)) *
                               governor_.stretch());
}

uint64_t BoundedGroup::budget_ns(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  const int c = size_class(bytes);
  ++classes_[c].uses;
  return budget_locked(bytes);
}

// The transfer's budget plus the skew the group measured (every step's start delay, the
// calibration's exact steps included). With OPTIREDUCE_TIMEOUT_MS, that bound: the user set
// the most a step may cost, whatever the reason.
uint64_t BoundedGroup::start_allowance_ns(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  return start_allowance_locked(bytes);
}

uint64_t BoundedGroup::start_allowance_locked(uint64_t bytes) const {
  if (fixed_tb_ns_ > 0) return std::max(tb_locked(size_class(bytes)), budget_locked(bytes));
  return budget_locked(bytes) + skew_ns_;
}

// A lateness beyond the cap is not skew that waiting could cover: counted, a rank that was 2 s
// late for its own reasons (a straggler) raised its allowance to the cap, which its CTS then
// announces, so that its peers' sends waited up to the cap for it at its next straggle.
void BoundedGroup::on_send_lateness(uint64_t lateness_ns) {
  std::lock_guard<std::mutex> lock(mu_);
  if (lateness_ns > kMaxSkewNs) return;
  on_start_delay_locked(lateness_ns, false);
}

void BoundedGroup::on_start_delay_locked(uint64_t delay_ns, bool lower_bound) {
  const size_t i = nskew_ % kSkewSamples;
  skew_[i] = delay_ns;
  skew_bound_[i] = lower_bound;
  ++nskew_;
  // A P95 of up to 256 values: cheap, but not per step once the ring is full.
  if (nskew_ > kSkewSamples && nskew_ % 16 != 0) return;
  refresh_skew_locked();
}

void BoundedGroup::refresh_skew_locked() {
  const auto held = static_cast<size_t>(std::min<uint64_t>(nskew_, kSkewSamples));
  std::array<uint64_t, kSkewSamples> v;
  size_t n = 0;
  for (size_t i = 0; i < held; ++i)
    if (skew_[i] != kNoSkew) v[n++] = skew_[i];
  if (n == 0) {
    skew_ns_ = 0;
    return;
  }
  const size_t idx = p95_index(n);
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(idx),
                   v.begin() + static_cast<std::ptrdiff_t>(n));
  skew_ns_ = std::min(kMaxSkewNs, static_cast<uint64_t>(kSkewHeadroom * static_cast<double>(v[idx])));
}

// The newest sample counted at `counted_ns` as a lower bound gets the sender's real lateness,
// or leaves the ring where no allowance could have covered it. Matched by value: the bound is a
// nanosecond count of one receive's wait, and two receives that waited exactly as long would
// say the same.
void BoundedGroup::on_late_sender(uint64_t counted_ns, uint64_t late_ns) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t held = std::min<uint64_t>(nskew_, kSkewSamples);
  for (uint64_t back = 1; back <= held; ++back) {
    const size_t i = (nskew_ - back) % kSkewSamples;
    if (!skew_bound_[i] || skew_[i] != counted_ns) continue;
    skew_bound_[i] = false;
    skew_[i] = late_ns > kMaxSkewNs ? kNoSkew : std::max(late_ns, counted_ns);
    ++stats_.late_senders;
    refresh_skew_locked();
    return;
  }
}

// Never below the budget's own floor: NCCL's chunks take ~20 us each on a fast host, and a
// tenth of that closed a chunk a few microseconds after its tail, before the repair of a hole
// could arrive (two ranks on an H200 under 5% drops had most of their repairable chunks cut so).
uint64_t BoundedGroup::early_ns(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  return std::max(
      kMinBudgetNs,
      static_cast<uint64_t>(early_fraction_ * static_cast<double>(agreed_tc_locked(bytes))));
}

void BoundedGroup::on_complete(const StepReport& st) {
  std::lock_guard<std::mutex> lock(mu_);
  const int c = size_class(st.bytes);
  Class& k = classes_[c];
  ++stats_.steps;
  log_every_locked();
  if (st.bounded) {
    ++stats_.bounded_steps;
    stats_.bytes_expected += st.bytes;
    stats_.bytes_delivered += std::min(st.received, st.bytes);
    if (st.how == RecvEnd::kDeadline) ++stats_.deadline_hits;
    if (st.how == RecvEnd::kEarly) ++stats_.early_timeouts;
    if (st.how == RecvEnd::kExpired) ++stats_.expired;
  }
  if (st.how == RecvEnd::kExpired) return;  // says nothing about the network
  if (st.bounded && (st.received > 0 || st.network_ns > 0))
    governor_.on_step(st.bytes, st.received);
  // An abandoned exact receive (dead sender) measured nothing but the fallback bound.
  if (calibrating_ && !st.bounded && st.how == RecvEnd::kAll) {
    if (st.pipelined) {
      if (k.nall < kMaxSamples) k.all[k.nall] = st.elapsed_ns;
      ++k.nall;
    } else {
      if (k.nsamples < kMaxSamples) {
        k.samples[k.nsamples] = st.elapsed_ns;
        k.sample_bytes[k.nsamples] = st.bytes;
      }
      ++k.nsamples;
    }
    uint64_t whole = 0, total = 0;
    for (const Class& x : classes_) {
      whole += x.nsamples;
      total += x.nsamples + x.nall;
    }
    if (whole >= calibration_steps_ || total >= kCalibrationPatience * calibration_steps_)
      finish_calibration_locked();
  }
  if (st.pipelined) return;
  // A sender that never started says nothing about the network: it was late (a straggler),
  // or its every packet was lost, and the start allowance, not the budget, covers it. What it
  // says about the skew is a lower bound: that sender was at least the allowance late. Left
  // out, as it once was, the ring only ever saw the senders that came in time, so a skew that
  // outgrew the allowance could never raise it (GpuChunks.ComputeSkewIsWaitedFor cut 57% of
  // its sends so on a slow CI host). Counted at that bound, a skew beyond the allowance in
  // more than 5% of the bursts raises it (kSkewHeadroom). The sender's first packet after the
  // cut tells how late it really was (on_late_sender), and replaces the bound.
  if (st.received == 0 && st.bytes != 0 && st.network_ns == 0) {
    if (st.burst_head && st.how == RecvEnd::kDeadline) on_start_delay_locked(st.elapsed_ns, true);
    return;
  }
  if (st.burst_head)
    on_start_delay_locked(st.elapsed_ns - std::min(st.elapsed_ns, st.network_ns), false);
  // The projected time to receive 100%, network time only: elapsed / fraction received.
  // Capped at the stretched bound: a step in a burst is cut there, and tC should learn how
  // slow the burst made it.
  const uint64_t tb = tb_locked(c);
  const double cap = static_cast<double>(tb) * governor_.stretch();
  double projected = static_cast<double>(st.network_ns);
  if (st.bytes != 0 && st.received < st.bytes) {
    projected = static_cast<double>(st.network_ns) * static_cast<double>(st.bytes) /
                static_cast<double>(st.received);
  }
  projected = std::min(projected, cap);
  k.est.add(projected);
  sized_locked(st.bytes).est.add(projected);
  stats_.tb_us = static_cast<uint32_t>(tb / 1000);
  stats_.tc_us = static_cast<uint32_t>(agreed_tc_locked(st.bytes) / 1000);
}

void BoundedGroup::log_every_locked() {
  if (stats_every_ == 0 || stats_.steps % stats_every_ != 0) return;
  const GroupStats& s = stats_;
  const double lost = s.bytes_expected
                          ? 100.0 * static_cast<double>(s.bytes_expected - s.bytes_delivered) /
                                static_cast<double>(s.bytes_expected)
                          : 0.0;
  OR_INFO(
      "bounded group %016llx: steps %llu (bounded %llu) lost %.4f%% deadline %llu early %llu "
      "expired %llu tB %u us tC %u us skew allowance %llu us (late senders timed %llu) "
      "stretch %.2f%s",
      static_cast<unsigned long long>(label_), static_cast<unsigned long long>(s.steps),
      static_cast<unsigned long long>(s.bounded_steps), lost,
      static_cast<unsigned long long>(s.deadline_hits),
      static_cast<unsigned long long>(s.early_timeouts), static_cast<unsigned long long>(s.expired),
      s.tb_us, s.tc_us, static_cast<unsigned long long>(skew_ns_ / 1000),
      static_cast<unsigned long long>(s.late_senders), governor_.stretch(),
      s.calibrating ? " (calibrating)" : "");
}

void BoundedGroup::set_label(uint64_t label) {
  std::lock_guard<std::mutex> lock(mu_);
  label_ = label;
}

namespace {
// tB from one set of calibration samples (sorted in place): the headroom times the P95 of
// those within kOutlierFactor of their median. The calibration steps come in calls whose
// 2(N-1) receives share one fate: a call that met a burst of congestion brings them all slow,
// enough to become the P95 and set tB for the whole job. Samples beyond that factor of the
// median are that congestion, not the path's own variation, and tB exists to cut them.
uint64_t p95_of_kept(uint64_t* v, uint32_t n, uint64_t outlier_factor) {
  std::sort(v, v + n);
  const uint64_t median = v[(n - 1) / 2];
  const auto kept = static_cast<uint32_t>(std::upper_bound(v, v + n, outlier_factor * median) - v);
  return v[p95_index(kept)];
}
}  // namespace

// Per size within the class where sizes have enough samples of their own, the largest: sizes
// of one class can be different steps (DDP's first bucket overlaps the backward pass and takes
// 2-5x longer than another bucket of its class), and pooled, the slow size's samples all fell
// beyond twice the fast one's median and were dropped as congestion, leaving a tB that cut
// the slow bucket every step. Otherwise the class's samples pooled.
uint64_t BoundedGroup::calibrated_tb_locked(const Class& k) const {
  const bool whole = k.nsamples > 0;
  const uint32_t n = std::min<uint32_t>(whole ? k.nsamples : k.nall, kMaxSamples);
  std::array<std::pair<uint64_t, uint64_t>, kMaxSamples> by_size;  // (bytes, elapsed)
  std::array<uint64_t, kMaxSamples> v;
  uint64_t best = 0;
  if (whole) {
    for (uint32_t i = 0; i < n; ++i) by_size[i] = {k.sample_bytes[i], k.samples[i]};
    std::sort(by_size.begin(), by_size.begin() + n);
    for (uint32_t a = 0; a < n;) {
      uint32_t b = a;
      while (b < n && by_size[b].first == by_size[a].first) ++b;
      if (b - a >= kMinSizeSamples) {
        for (uint32_t i = a; i < b; ++i) v[i - a] = by_size[i].second;
        best = std::max(best, p95_of_kept(v.data(), b - a, kOutlierFactor));
      }
      a = b;
    }
  }
  if (best == 0) {
    const auto& src = whole ? k.samples : k.all;
    std::copy(src.begin(), src.begin() + n, v.begin());
    best = p95_of_kept(v.data(), n, kOutlierFactor);
  }
  return best;
}

void BoundedGroup::finish_calibration_locked() {
  calibrating_ = false;
  stats_.calibrating = false;
  for (int c = 0; c < kClasses; ++c) {
    Class& k = classes_[c];
    // Whole steps define the bound; a class that only ever saw pipelined ones uses those.
    const uint32_t n = std::min<uint32_t>(k.nsamples > 0 ? k.nsamples : k.nall, kMaxSamples);
    if (n == 0) continue;
    k.tb_ns = std::max(kMinBudgetNs, static_cast<uint64_t>(
                                         tb_headroom_ * static_cast<double>(calibrated_tb_locked(k))));
    OR_INFO("bounded: calibrated tB = %.3f ms for %llu-byte messages from %u steps",
            static_cast<double>(k.tb_ns) / 1e6, 1ull << c, n);
  }
}

void BoundedGroup::on_peer_estimate(uint32_t tc_us, uint64_t bytes) {
  if (tc_us == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  classes_[size_class(bytes)].est.add_peer(tc_us);
  sized_locked(bytes).est.add_peer(tc_us);
}

uint32_t BoundedGroup::estimate_us(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  const Estimate& e = own_estimate_locked(find_sized_locked(bytes), size_class(bytes));
  if (e.tc_ns <= 0) return 0;
  return static_cast<uint32_t>(std::min(e.tc_ns / 1000, 4e9));
}

uint64_t BoundedGroup::tb_ns(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  return tb_locked(size_class(bytes));
}

uint64_t BoundedGroup::tc_ns(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  return agreed_tc_locked(bytes);
}

DeadlineQuote BoundedGroup::quote(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  return {tb_locked(size_class(bytes)), agreed_tc_locked(bytes), budget_locked(bytes),
          start_allowance_locked(bytes)};
}

GroupStats BoundedGroup::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  GroupStats s = stats_;
  s.stretch = governor_.stretch();
  return s;
}

}  // namespace optireduce
