// Registry: the live connections, and which of them the progress thread must visit. It visits
// connections with an endpoint of their own on every pass (someone has to poll their endpoint)
// and, of those on a shared endpoint (endpoint_mux.h), only the armed ones: a timer armed or
// datagrams kept for them while they were busy. So a pass costs the connections with something
// to do, not the thousands NCCL may hold open (issue 16).
//
// Arming is lock-free for a connection that is armed already (its every pass ends with arm());
// disarming happens only in visit(), which clears the flag before it looks at the connection's
// timer, while a connection stores its timer before it looks at the flag (both sequentially
// consistent): a timer armed meanwhile is seen by one side or the other, never lost.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace optireduce {

class Conn;
class ProgressWaker;

class Registry {
 public:
  void add(Conn* c);
  void remove(Conn* c);  // waits for a visit() in progress: the connection is then never touched
  // The connection wants visits until it has neither timer nor kept datagrams. Wakes the
  // progress thread out of its idle sleep (idle_sleep.h), which no timer ends.
  void arm(Conn* c);
  // Nothing to visit: no connection with an endpoint of its own, none armed.
  bool idle();
  // The progress thread's waker, set once before the first connection is added.
  void set_waker(std::shared_ptr<ProgressWaker> w) { waker_ = std::move(w); }

  // The progress thread's pass: fn(conn) for every connection it must visit, under the lock
  // that keeps connections alive; then those that want no more visits are disarmed. Returns
  // when the thread should wake for a timer (the earliest Conn::wake_ns() of those it
  // visits, as of `now`), 0 if none.
  template <typename Fn>
  uint64_t visit(uint64_t now, Fn&& fn) {
    std::lock_guard<std::mutex> lock(mu_);
    due_.assign(polled_.begin(), polled_.end());
    {
      std::lock_guard<std::mutex> armed(armed_mu_);
      due_.insert(due_.end(), armed_.begin(), armed_.end());
    }
    for (Conn* c : due_) fn(c);
    return prune_and_earliest(now);
  }

  size_t size();
  size_t armed();

 private:
  uint64_t prune_and_earliest(uint64_t now);

  std::mutex mu_;
  std::vector<Conn*> conns_;   // every live connection
  std::vector<Conn*> polled_;  // those with an endpoint of their own
  std::vector<Conn*> due_;     // visit()'s list, kept to reuse its memory
  std::mutex armed_mu_;        // a leaf: taken inside a connection's pass
  std::vector<Conn*> armed_;   // shared-endpoint connections with something to do
  std::shared_ptr<ProgressWaker> waker_;
};

}  // namespace optireduce
