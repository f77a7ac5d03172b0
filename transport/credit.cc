// Downlink and DownlinkTable.
#include "transport/credit.h"

#include <algorithm>

#include "transport/congestion.h"

namespace optireduce {

void Downlink::join(uint64_t now) {
  std::lock_guard<std::mutex> l(mu_);
  ++senders_;
  if (peak_epoch_ns_ == 0 || now - peak_epoch_ns_ >= kPeakWindowNs) {
    peak_prev_ = peak_cur_;
    peak_cur_ = 0;
    peak_epoch_ns_ = now;
  }
  peak_cur_ = std::max(peak_cur_, senders_);
}

void Downlink::leave() {
  std::lock_guard<std::mutex> l(mu_);
  if (senders_ > 0) --senders_;
}

void Downlink::roll_locked(uint64_t now) {
  if (interval_start_ == 0) {
    interval_start_ = now;
    return;
  }
  const uint64_t len = now - interval_start_;
  if (len < kIntervalNs) return;
  // An interval that spans an idle gap (between steps) says nothing about the link's rate.
  if (len <= 2 * kIntervalNs) {
    rates_[cur_] = static_cast<double>(interval_bytes_) / static_cast<double>(len);
    cur_ = (cur_ + 1) % kIntervals;
    update_budget_locked();
  }
  interval_start_ = now;
  interval_bytes_ = 0;
}

void Downlink::on_bytes(uint64_t bytes, uint64_t now) {
  std::lock_guard<std::mutex> l(mu_);
  roll_locked(now);
  interval_bytes_ += bytes;
}

void Downlink::on_rtt(uint64_t rtt_ns, uint64_t now) {
  if (rtt_ns == 0) return;
  std::lock_guard<std::mutex> l(mu_);
  if (base_epoch_ns_ == 0 || now - base_epoch_ns_ >= kBaseWindowNs) {
    base_epoch_ns_ = now;
    base_rtt_ = rtt_ns;  // one window's memory; the next sample below it takes over
  } else {
    base_rtt_ = std::min(base_rtt_, rtt_ns);
  }
  update_budget_locked();
}

void Downlink::update_budget_locked() {
  const double rate = *std::max_element(rates_.begin(), rates_.end());
  if (rate <= 0 || base_rtt_ == 0) return;  // keep the initial budget until both are known
  const double bdp = rate * static_cast<double>(queueing_target_ns(base_rtt_));
  budget_ = std::max<uint64_t>(kMinBudgetBytes, static_cast<uint64_t>(bdp));
}

uint32_t Downlink::credit_pkts(uint32_t pkt_payload, bool first) const {
  std::lock_guard<std::mutex> l(mu_);
  uint32_t n = std::max<uint32_t>(1, senders_);
  if (first) n = std::max({n, peak_cur_, peak_prev_});
  const uint64_t share = budget_ / n;
  const uint64_t pkts = share / std::max<uint32_t>(1, pkt_payload);
  return static_cast<uint32_t>(
      std::clamp<uint64_t>(pkts, kMinCreditPkts, kMaxCreditPkts));
}

DownlinkSnapshot Downlink::snapshot() const {
  std::lock_guard<std::mutex> l(mu_);
  DownlinkSnapshot s;
  s.budget = budget_;
  s.senders = senders_;
  s.peak = std::max(peak_cur_, peak_prev_);
  s.rate = *std::max_element(rates_.begin(), rates_.end());
  s.base_rtt = base_rtt_;
  return s;
}

std::shared_ptr<Downlink> DownlinkTable::get(int dev) {
  if (dev < 0 || static_cast<size_t>(dev) >= links_.size()) return std::make_shared<Downlink>();
  std::lock_guard<std::mutex> l(mu_);
  auto& d = links_[static_cast<size_t>(dev)];
  if (!d) d = std::make_shared<Downlink>();
  return d;
}

}  // namespace optireduce
