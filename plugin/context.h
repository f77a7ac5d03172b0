// What NCCL holds opaque pointers to: contexts (one per communicator, or one shared by v8..v10),
// send/recv/listen comms and memory handles. Shared by the entry points (api.cc), the process
// state that keeps the contexts (process_state.cc) and the counters query (stats.cc). Below
// them, a communicator's delivery (context.cc): what its traffic class asks, its context, its
// send connections' options and how each of its transfers is posted.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "plugin/nccl/net_v11.h"
#include "plugin/nccl/types.h"
#include "plugin/profiler_events.h"
#include "plugin/transfer_kind.h"
#include "transport/bounded.h"
#include "transport/params.h"
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
  // The context was made bounded by one of liboptireduce's traffic classes: point-to-point only.
  bool p2p_only = false;
  // ... by the class of its phase-2 sibling: receives bounded until their sender starts.
  bool until_started = false;
  int abi = 11;      // the net ABI version NCCL loaded the plugin with
  NcclEnvFacts env;  // NCCL's protocol settings, read at init
  // What the last setNetAttr said (transfer_kind.h). NCCL's proxy thread writes it and then
  // posts the transfers it describes; atomics because NCCL's contract names no single thread
  // for a context's calls.
  std::atomic<bool> attr_seen{false};
  std::atomic<uint32_t> attr_op{0};
  std::atomic<uint32_t> attr_proto{0};
  std::atomic<bool> told_exact{false};  // the INFO line about exact LL/LL128 transfers, once

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
  int dev = 0;  // the device regMr registers this comm's buffers with
};

struct SendWrap final : CommBase {
  explicit SendWrap(std::shared_ptr<Context> c) : CommBase(kSendMagic, std::move(c)) {}
  std::unique_ptr<SendComm> comm;
  bool p2p_only = false;  // bounded by the traffic class (v10 names it per connection)
};

struct RecvWrap final : CommBase {
  explicit RecvWrap(std::shared_ptr<Context> c) : CommBase(kRecvMagic, std::move(c)) {}
  std::unique_ptr<RecvComm> comm;
  RecvEvents events;  // NCCL profiler events of its outstanding bounded receives
};

struct ListenWrap {
  std::shared_ptr<Context> ctx;
  std::unique_ptr<ListenComm> comm;
  int dev = 0;
};

// What regMr returns: the buffer NCCL named and, where the comm's datapath registers memory
// (verbs), its registration, through which sends leave without a copy. Null over UDP (sendmmsg
// gathers from any buffer) and where the registration failed (sends are then copied). The
// region lives until deregMr; NCCL deregisters a buffer only once its requests are done, and a
// send is done only when the device no longer reads it (transport.h).
struct MemHandle {
  void* data = nullptr;
  size_t size = 0;
  int type = 0;
  std::unique_ptr<MemoryRegion> region;
};

// What a traffic class asks of a communicator: liboptireduce's two siblings are named by
// OPTIREDUCE_BOUNDED_TRAFFIC_CLASS (phase 1, bounded) and the class after it (phase 2, bounded
// until each sender starts); every other class, and none, leaves the communicator as
// OPTIREDUCE_MODE says.
enum class SiblingClass : uint8_t { kNone, kBounded, kUntilStarted };
SiblingClass sibling_class(int traffic_class, const Config& cfg);

// A communicator's context over the process's engine (started here if it is not yet), bounded
// by OPTIREDUCE_MODE or by its traffic class. An invalid configuration, an engine that cannot
// start or no usable interface is logged and returned as NCCL's error.
nccl::ncclResult_t new_context(uint64_t comm_id, int traffic_class, int abi,
                               std::shared_ptr<Context>* out);

// The options a send connection of `c` opens with: v10's per-connection traffic class
// (`config`, null on the other versions) over the context's; *by_class: that class is one of
// liboptireduce's (its transfers are point-to-point only).
ConnOptions send_conn_options(const Context& c, const nccl::ncclNetCommConfig_v11_t* config,
                              bool* by_class);

// What `c` knows of its transfers (transfer_kind.h): the caller adds what the call says.
TransferFacts facts_of(const Context& c);

// How a transfer is posted on a connection: per transfer on a bounded one (transfer_kind.h).
// The first transfer a bounded context keeps exact is logged once, so that a user can see why
// a bounded communicator delivered some transfers whole.
MsgDelivery transfer_delivery(Context& c, bool bounded_conn, const TransferFacts& facts, bool send);

}  // namespace optireduce::plugin
