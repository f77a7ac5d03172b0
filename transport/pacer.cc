// CongestionWindow and Pacer implementation.
#include "transport/pacer.h"

namespace optireduce {

namespace {
// Never shrink below a few packets: with fewer in flight, SACK-based loss detection (which
// needs packets above a hole to be acknowledged) stops working and every loss becomes a timeout.
constexpr uint64_t kMinWindowPkts = 4;
// Start large enough that a loopback or datacenter RTT fills quickly; slow start grows it.
constexpr uint64_t kInitialWindowPkts = 64;
// Multiplicative decrease factor on a loss (cubic's 0.7 rather than Reno's 0.5: random loss
// from a lossy fabric is common in the clouds we target, and halving starves the link).
constexpr double kDecrease = 0.7;
}  // namespace

CongestionWindow::CongestionWindow(uint32_t mss, uint64_t ceiling)
    : mss_(mss),
      ceiling_(std::max<uint64_t>(ceiling, kMinWindowPkts * mss)),
      cwnd_(std::min<uint64_t>(ceiling_, kInitialWindowPkts * mss)),
      ssthresh_(ceiling_) {}

void CongestionWindow::on_ack(uint64_t acked) {
  if (cwnd_ < ssthresh_) {
    cwnd_ += acked;
  } else {
    cwnd_ += std::max<uint64_t>(1, static_cast<uint64_t>(mss_) * acked / cwnd_);
  }
  cwnd_ = std::min(cwnd_, ceiling_);
}

void CongestionWindow::on_loss(uint64_t now_seq, uint64_t lost_seq) {
  if (lost_seq < recovery_end_) return;
  recovery_end_ = now_seq;
  ssthresh_ = std::max<uint64_t>(kMinWindowPkts * mss_, static_cast<uint64_t>(cwnd_ * kDecrease));
  cwnd_ = ssthresh_;
}

void CongestionWindow::on_timeout() {
  ssthresh_ = std::max<uint64_t>(kMinWindowPkts * mss_, cwnd_ / 2);
  cwnd_ = kMinWindowPkts * mss_;
}

void Pacer::set_rate(double bytes_per_ns, uint64_t burst_bytes) {
  rate_ = bytes_per_ns;
  burst_ = burst_bytes;
  if (tokens_ > burst_) tokens_ = burst_;
}

uint64_t Pacer::available(uint64_t now) {
  if (rate_ == 0) return UINT64_MAX;
  if (last_ns_ == 0) {
    last_ns_ = now;
    tokens_ = burst_;
  }
  if (now <= last_ns_) return tokens_;
  const auto add = static_cast<uint64_t>(static_cast<double>(now - last_ns_) * rate_);
  if (add > 0) {  // keep the remainder for later instead of truncating it away
    tokens_ = std::min<uint64_t>(burst_, tokens_ + add);
    last_ns_ = now;
  }
  return tokens_;
}

uint64_t Pacer::next_time_ns(uint64_t now, uint64_t bytes) const {
  if (rate_ == 0 || tokens_ >= bytes) return now;
  return now + static_cast<uint64_t>((bytes - tokens_) / rate_) + 1;
}

}  // namespace optireduce
