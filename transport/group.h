// ConnGroup: the connections of one communicator, so that a call on any of them also serves
// the others that nobody is polling (NCCL's proxy polls every connection; a host-path caller
// may wait on one request while another connection of the same exchange has work to do).
// Congestion state is shared more widely, per pair of hosts: see congestion.h.
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

namespace optireduce {

class Conn;

class ConnGroup {
 public:
  virtual ~ConnGroup() = default;
  void add(Conn* c);
  void remove(Conn* c);
  // Serves the members other than `self` that were not served in the last `idle_ns`. Only
  // try_lock is used (on the group and on each member), so no caller ever waits here.
  void serve_siblings(const Conn* self, uint64_t now, uint64_t idle_ns);

 private:
  std::mutex mu_;
  std::vector<Conn*> conns_;
};

}  // namespace optireduce
