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
