// Registry: membership, arming, and the progress thread's pruning.
#include "transport/registry.h"

#include <algorithm>

#include "transport/conn.h"
#include "transport/progress_thread.h"

namespace optireduce {

void Registry::add(Conn* c) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    conns_.push_back(c);
    if (c->shared_endpoint()) return;
    polled_.push_back(c);
  }
  if (waker_) waker_->wake();  // it is polled on every pass: no more idle sleep
}

void Registry::remove(Conn* c) {
  std::lock_guard<std::mutex> lock(mu_);
  std::erase(conns_, c);
  std::erase(polled_, c);
  std::lock_guard<std::mutex> armed(armed_mu_);
  std::erase(armed_, c);
  c->armed_.store(false);
}

void Registry::arm(Conn* c) {
  if (c->armed_.load()) return;
  {
    std::lock_guard<std::mutex> lock(armed_mu_);
    if (c->armed_.load()) return;
    c->armed_.store(true);
    armed_.push_back(c);
  }
  if (waker_) waker_->wake();  // after the push: idle() sees it, or the thread is woken
}

bool Registry::idle() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!polled_.empty()) return false;
  std::lock_guard<std::mutex> armed(armed_mu_);
  return armed_.empty();
}

uint64_t Registry::prune_and_earliest(uint64_t now) {
  uint64_t next = 0;
  auto earliest = [&next, now](const Conn* c) {
    const uint64_t t = c->wake_ns(now);
    if (t != 0 && (next == 0 || t < next)) next = t;
  };
  for (const Conn* c : polled_) earliest(c);
  std::lock_guard<std::mutex> lock(armed_mu_);
  std::erase_if(armed_, [&](Conn* c) {
    c->armed_.store(false);  // first, then look: see the header
    if (!c->wants_visit()) return true;
    c->armed_.store(true);
    earliest(c);
    return false;
  });
  return next;
}

size_t Registry::size() {
  std::lock_guard<std::mutex> lock(mu_);
  return conns_.size();
}

size_t Registry::armed() {
  std::lock_guard<std::mutex> lock(armed_mu_);
  return armed_.size();
}

}  // namespace optireduce
