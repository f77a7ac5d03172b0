// What NCCL holds opaque pointers to: contexts (one per communicator, or one shared by v8..v10),
// send/recv/listen comms and memory handles. Shared by the entry points (api.cc), the process
// state that keeps the contexts (process_state.cc) and the counters query (stats.cc).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "plugin/nccl/types.h"
#include "transport/bounded.h"
#include "transport/stats.h"
#include "transport/transport.h"

namespace optireduce::plugin {

struct SendWrap;
struct RecvWrap;

// One per communicator (v11) or one for the whole process (v8..v10).
struct Context {
  uint64_t comm_id = 0;
  bool bounded = false;
  Fill fill = Fill::kZero;
  std::shared_ptr<Engine> engine;
  // Deadlines of this communicator's bounded connections (tB, tC, calibration) are shared:
  // see docs/architecture.md, "Where deadlines come from". Outlives every comm (they hold ctx).
  std::unique_ptr<BoundedGroup> group;
  // Set when setNetAttr announced LL/LL128 on a bounded context: later connections go exact.
  std::atomic<bool> exact_only{false};
  std::atomic<uint32_t> proto_bits{0};

  std::mutex mu;  // guards the four members below; taken after ProcessState::mu
  std::vector<SendWrap*> live_send;
  std::vector<RecvWrap*> live_recv;
  ConnStats closed_send;
  ConnStats closed_recv;
};

inline constexpr uint32_t kSendMagic = 0x53454E44;  // "SEND"
inline constexpr uint32_t kRecvMagic = 0x52454356;  // "RECV"

// What NCCL holds as a send or recv comm. The magic turns a foreign or closed pointer into an
// error instead of a crash. NCCL's requests are the transport's own (they know their comm).
struct CommBase {
  CommBase(uint32_t m, std::shared_ptr<Context> c) : magic(m), ctx(std::move(c)) {}
  virtual ~CommBase() = default;

  uint32_t magic;
  std::shared_ptr<Context> ctx;
  // The first fatal error sticks: NCCL tears the communicator down after it anyway, and a
  // half-failed connection must not report success later. Touched only by the comm's progress
  // thread (isend/irecv).
  nccl::ncclResult_t sticky = nccl::ncclSuccess;
};

struct SendWrap final : CommBase {
  explicit SendWrap(std::shared_ptr<Context> c) : CommBase(kSendMagic, std::move(c)) {}
  std::unique_ptr<SendComm> comm;
};

struct RecvWrap final : CommBase {
  explicit RecvWrap(std::shared_ptr<Context> c) : CommBase(kRecvMagic, std::move(c)) {}
  std::unique_ptr<RecvComm> comm;
  bool sentinel_warned = false;
};

struct ListenWrap {
  std::shared_ptr<Context> ctx;
  std::unique_ptr<ListenComm> comm;
  int dev = 0;
};

// Host memory needs no registration over UDP; the handle only records what NCCL asked for.
struct MemHandle {
  void* data;
  size_t size;
  int type;
};

}  // namespace optireduce::plugin
