// ConnGroup implementation.
#include "transport/group.h"

#include <algorithm>

#include "transport/conn.h"

namespace optireduce {

void ConnGroup::add(Conn* c) {
  std::lock_guard<std::mutex> lock(mu_);
  conns_.push_back(c);
}

void ConnGroup::remove(Conn* c) {
  std::lock_guard<std::mutex> lock(mu_);
  conns_.erase(std::remove(conns_.begin(), conns_.end(), c), conns_.end());
}

void ConnGroup::serve_siblings(const Conn* self, uint64_t now, uint64_t idle_ns) {
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  if (!lock.owns_lock()) return;
  for (Conn* c : conns_) {
    if (c != self) c->background_progress(now, idle_ns);
  }
}

}  // namespace optireduce

namespace optireduce {

namespace {
// Bucket depth: 256 KiB lets a burst of packets leave back to back without overflowing a
// shallow (1 MB) bottleneck queue, and is a fraction of a millisecond on fast links.
constexpr uint64_t kGroupBurstBytes = 256 * 1024;
}  // namespace

void ConnGroup::add_delivered(uint64_t bytes, uint64_t now, uint64_t window_ns, bool restart,
                              bool idle_after) {
  std::lock_guard<std::mutex> lock(rate_mu_);
  if (delivery_.on_ack(bytes, now, window_ns, restart, idle_after))
    pacer_.set_rate(1.25 * delivery_.rate(), kGroupBurstBytes);
}

uint64_t ConnGroup::bounded_tokens(uint64_t now) {
  std::lock_guard<std::mutex> lock(rate_mu_);
  return pacer_.available(now);
}

void ConnGroup::consume_bounded(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(rate_mu_);
  pacer_.consume(bytes);
}

}  // namespace optireduce
