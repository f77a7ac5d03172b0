// DelayController, Path and PathTable.
#include "transport/congestion.h"

#include <algorithm>

namespace optireduce {

namespace {
// A fresh path starts with this many packets in flight and doubles per RTT from there while
// the RTT stays on target (slow start). 16 jumbo packets are 128 KiB: a millisecond at 1 Gbit/s,
// so three senders converging on one receiver start far below a 1 MB switch queue.
constexpr uint64_t kInitialPkts = 16;
// Never fewer: with fewer packets in flight, SACK-based loss detection (three acknowledged
// packets above a hole) stops working and every loss becomes a timeout.
constexpr uint64_t kMinPkts = 4;
// Nor fewer bytes. With small datagrams (1500-byte MTU, rxe's 1 KiB) four packets are ~5 KB,
// and on an overloaded host, whose scheduling delay the RTT cannot tell from queueing, the
// window sits at its floor: 5 KB per 20 ms RTT is 250 KB/s, and a test that moved tens of MB
// took minutes under load. 32 KiB keeps such a host moving and changes nothing for jumbo
// frames (4 x 9 KB is more).
constexpr uint64_t kMinBytes = 32 << 10;
// Swift's multiplicative decrease: the excess delay's share of the RTT, scaled by kBeta, capped
// at kMaxDecrease per RTT.
constexpr double kBeta = 0.8;
constexpr double kMaxDecrease = 0.5;
// A loss while the RTT says the queue was full.
constexpr double kLossDecrease = 0.7;
// Base-RTT filter window (see base_rtt_).
constexpr uint64_t kBaseWindowNs = 10'000'000'000;
// Competing with loss-based traffic: a deep queue must outlast this many smoothed RTTs (and
// kCompeteAfterMinNs) before it is taken for someone else's, the window at its floor all along:
// had the queue been ours, the delay rule's cuts (up to half per RTT) would have begun to drain
// it. Two RTTs: a background burst in a cloud lasts a few hundred ms, and every RTT at the floor
// is one in which the step starves.
constexpr uint64_t kCompeteAfterRtts = 2;
constexpr uint64_t kCompeteAfterMinNs = 1'000'000;
// "At its floor": within this factor of it (the delay rule's last cut may land a little above).
constexpr double kAtFloor = 1.5;
// Starved: the device's paths deliver less than this share of the best they did recently
// (delivery_meter.h). A quarter: unresponsive traffic taking half the link leaves more; a
// loss-based competitor leaves paths at their floors a few percent.
constexpr double kStarvedShare = 0.25;
// Deep: a queue whose delay above the base RTT is at least this many times the queueing the
// delay rule allows. A queue someone fills until it overflows is as deep as the
// buffer; one our own paths hold at their floors, or that unresponsive traffic holds beside the
// delay rule, sits near the target.
constexpr double kDeepQueue = 2.0;
// Back to the delay rule once the device delivers this share of its best rate again: the
// competitor is gone. Below 1 because a rate measured over milliseconds is noisy.
constexpr double kCompeteExitShare = 0.85;
// Packets leave at this multiple of window / RTT, so that pacing smooths bursts without
// becoming the bottleneck itself; and a burst of up to a quarter window may leave at once.
constexpr double kPacingGain = 1.25;
}  // namespace

DelayController::DelayController(const DelayControlOptions& o)
    : o_(o),
      meter_(o.meter ? o.meter : std::make_shared<DeliveryMeter>()),
      cwnd_(static_cast<double>(std::min<uint64_t>(o.max_window, kInitialPkts * o.mss))) {}

uint64_t queueing_target_ns(uint64_t base_rtt_ns, uint64_t floor_ns) {
  return base_rtt_ns + std::max(floor_ns, base_rtt_ns / 2);
}

uint64_t DelayController::target_ns() const {
  return queueing_target_ns(base_rtt_, o_.target_floor_ns);
}

double DelayController::pacing_rate() const {
  if (srtt_ == 0) return 0;
  return kPacingGain * cwnd_ / static_cast<double>(srtt_);
}

double DelayController::floor_bytes() const {
  return static_cast<double>(std::max(kMinPkts * o_.mss, kMinBytes));
}

void DelayController::decrease(double factor, uint64_t now) {
  // Once per RTT: the samples of the same RTT describe the same queue.
  if (last_decrease_ns_ != 0 && now - last_decrease_ns_ < std::max<uint64_t>(srtt_, 1)) return;
  last_decrease_ns_ = now;
  slow_start_ = false;
  ++decreases_;
  cwnd_ = std::max(cwnd_ * factor, floor_bytes());
}

void DelayController::track_queue(uint64_t rtt, uint64_t now) {
  if (rtt <= target_ns()) {
    window_on_target_ = cwnd_;
    rtt_on_target_ = rtt;
  }
  const uint64_t allowance = target_ns() - base_rtt_;
  if (rtt - base_rtt_ < static_cast<uint64_t>(kDeepQueue * static_cast<double>(allowance))) {
    deep_since_ns_ = 0;
    return;
  }
  if (deep_since_ns_ == 0) deep_since_ns_ = now;
}

bool DelayController::starved(uint64_t now) const {
  // Someone who backs off only on loss holds the queue: it has stood deep (such traffic fills
  // the buffer) for several RTTs although the window sits at its floor, and the device's paths
  // together get a small part of what they got before. Each condition rules out a look-alike:
  // a queue our own paths hold at their floors, or unresponsive traffic beside the delay rule,
  // sits near the target; a path that shares its device's link with siblings is not starved
  // while they all deliver. What remains alike: paths of several hosts that had a downlink
  // alone and now meet there, so many that their floors alone make the queue deep: they
  // compete until their transfers end and the queue drains. Loss is not required: a path at
  // its floor sends so little that it may see none.
  const double best = meter_->best_rate();
  return deep_since_ns_ != 0 && cwnd_ <= kAtFloor * floor_bytes() &&
         now - deep_since_ns_ >= std::max(kCompeteAfterRtts * srtt_, kCompeteAfterMinNs) &&
         best > 0 && meter_->last_rate() < kStarvedShare * best;
}

void DelayController::start_competing(uint64_t now) {
  competing_ = true;
  ++compete_episodes_;
  slow_start_ = false;
  // The rate on target at the RTT the queue imposes now (docs/lab.md, run 21: TAR exact's P99
  // beside background jobs 1.33-1.51x Gloo ring's -> 1.09-1.28x, the jobs' TCP keeping 0.91-0.99
  // of the rate it has beside Gloo ring).
  double resume = window_on_target_;
  if (rtt_on_target_ != 0 && srtt_ > rtt_on_target_)
    resume *= static_cast<double>(srtt_) / static_cast<double>(rtt_on_target_);
  cwnd_ = std::max(cwnd_, std::min(resume, compete_cap()));
  last_decrease_ns_ = now;  // the first loss episode counts from here
}

double DelayController::compete_cap() const {
  // What the device's best rate needs at the RTT the queue imposes: more cannot buy more than
  // the path had, and on a lossless fabric, where no loss would ever stop the growth, it bounds
  // what competing may put into the queue.
  const double need = meter_->best_rate() * static_cast<double>(srtt_);
  return std::clamp(need, floor_bytes(), static_cast<double>(o_.max_window));
}

void DelayController::stop_competing() {
  competing_ = false;
  deep_since_ns_ = 0;
}

void DelayController::on_ack(uint64_t acked, uint64_t rtt, uint64_t whole, uint64_t now) {
  if (whole != 0) {
    if (base_epoch_ns_ == 0 || now - base_epoch_ns_ >= kBaseWindowNs) {
      base_prev_ = base_cur_;
      base_cur_ = 0;
      base_epoch_ns_ = now;
    }
    base_cur_ = base_cur_ == 0 ? whole : std::min(base_cur_, whole);
    base_rtt_ = base_prev_ == 0 ? base_cur_ : std::min(base_cur_, base_prev_);
  }
  if (rtt != 0) {
    srtt_ = srtt_ == 0 ? rtt : (7 * srtt_ + rtt) / 8;
    last_rtt_ = rtt;
    track_queue(rtt, now);
    if (competing_ && rtt <= target_ns()) stop_competing();  // the queue drained
  }
  meter_->on_acked(acked, now);
  if (competing_ && meter_->last_rate() >= kCompeteExitShare * meter_->best_rate())
    stop_competing();  // the competitor is gone: the queue is ours
  if (competing_) {
    cwnd_ = std::min(cwnd_ + static_cast<double>(o_.mss) * static_cast<double>(acked) / cwnd_,
                     compete_cap());
    return;
  }
  if (starved(now)) {
    start_competing(now);
    return;
  }
  if (last_rtt_ != 0 && last_rtt_ > target_ns()) {
    const double excess =
        static_cast<double>(last_rtt_ - target_ns()) / static_cast<double>(last_rtt_);
    decrease(std::max(1 - kBeta * excess, 1 - kMaxDecrease), now);
    return;
  }
  const auto a = static_cast<double>(acked);
  if (slow_start_)
    cwnd_ += a;
  else
    cwnd_ += static_cast<double>(o_.mss) * a / cwnd_;  // one packet per RTT
  cwnd_ = std::min(cwnd_, static_cast<double>(o_.max_window));
}

void DelayController::on_loss(uint64_t now) {
  // Slow start overshoots by design; afterwards only a loss with the queue full is congestion
  // (competing, every loss episode is: loss is then the only signal).
  if (competing_ || slow_start_ || (last_rtt_ != 0 && last_rtt_ > target_ns()))
    decrease(kLossDecrease, now);
}

void DelayController::on_timeout(uint64_t now) {
  last_decrease_ns_ = 0;  // a timeout always counts
  decrease(kMaxDecrease, now);
}

std::unique_ptr<CongestionController> make_default_controller(
    uint32_t mss, std::shared_ptr<DeliveryMeter> meter) {
  DelayControlOptions o;
  o.mss = mss;
  o.meter = std::move(meter);
  return std::make_unique<DelayController>(o);
}

Path::Path(std::unique_ptr<CongestionController> cc, uint32_t mss, double ceiling)
    : cc_(std::move(cc)), mss_(mss), ceiling_(ceiling) {
  update_pacer_locked();
}

void Path::update_pacer_locked() {
  double rate = cc_->pacing_rate();
  if (ceiling_ > 0) rate = rate > 0 ? std::min(rate, ceiling_) : ceiling_;
  const uint64_t burst = std::max<uint64_t>(4 * uint64_t{mss_}, cc_->window_bytes() / 4);
  pacer_.set_rate(rate, burst);
}

uint64_t Path::room(uint64_t now) {
  std::lock_guard<std::mutex> l(mu_);
  const uint64_t w = cc_->window_bytes();
  uint64_t r = inflight_ < w ? w - inflight_ : 0;
  if (inflight_ == 0) r = std::max<uint64_t>(r, mss_);
  return std::min(r, pacer_.available(now));
}

uint64_t Path::tokens(uint64_t now) {
  std::lock_guard<std::mutex> l(mu_);
  return pacer_.available(now);
}

uint64_t Path::retry_ns(uint64_t now, uint64_t bytes, uint64_t fallback_ns) {
  std::lock_guard<std::mutex> l(mu_);
  const uint64_t paced = pacer_.next_time_ns(now, bytes);
  if (paced > now) return paced;
  return now + fallback_ns;
}

void Path::on_sent(uint64_t bytes) {
  std::lock_guard<std::mutex> l(mu_);
  inflight_ += bytes;
  pacer_.consume(bytes);
}

void Path::on_acked(uint64_t left_flight, uint64_t acked, uint64_t rtt_ns, uint64_t whole_rtt_ns,
                    uint64_t now) {
  std::lock_guard<std::mutex> l(mu_);
  inflight_ -= std::min(inflight_, left_flight);
  cc_->on_ack(acked, rtt_ns, whole_rtt_ns, now);
  update_pacer_locked();
}

void Path::on_lost(uint64_t bytes, uint64_t now) {
  std::lock_guard<std::mutex> l(mu_);
  inflight_ -= std::min(inflight_, bytes);
  cc_->on_loss(now);
  update_pacer_locked();
}

void Path::on_timeout(uint64_t now) {
  std::lock_guard<std::mutex> l(mu_);
  cc_->on_timeout(now);
  update_pacer_locked();
}

void Path::release(uint64_t bytes) {
  std::lock_guard<std::mutex> l(mu_);
  inflight_ -= std::min(inflight_, bytes);
}

PathSnapshot Path::snapshot() const {
  std::lock_guard<std::mutex> l(mu_);
  PathSnapshot s;
  s.window = cc_->window_bytes();
  s.inflight = inflight_;
  s.rate = cc_->pacing_rate();
  s.senders = senders_;
  s.competing = cc_->competing();
  s.base_rtt_ns = cc_->base_rtt_ns();
  return s;
}

std::shared_ptr<Path> PathTable::get(const std::string& device, const std::string& host,
                                     uint32_t mss, double ceiling) {
  std::lock_guard<std::mutex> l(mu_);
  for (auto it = paths_.begin(); it != paths_.end();) {  // forget paths nobody uses
    if (it->second.expired())
      it = paths_.erase(it);
    else
      ++it;
  }
  std::erase_if(meters_, [](const auto& m) { return m.second.expired(); });
  const std::string key = device + "/" + host;
  if (auto p = paths_[key].lock()) return p;
  std::shared_ptr<DeliveryMeter> meter = meters_[device].lock();
  if (!meter) {
    meter = std::make_shared<DeliveryMeter>();
    meters_[device] = meter;
  }
  auto p = std::make_shared<Path>(make_default_controller(mss, std::move(meter)), mss, ceiling);
  paths_[key] = p;
  return p;
}

}  // namespace optireduce
