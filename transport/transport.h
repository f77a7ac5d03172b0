// The transport's public C++ API: connections that carry messages over datagrams, exactly
// (reliable) or under a deadline (bounded). Used by the NCCL plugin (plugin/) and by the host
// path of liboptireduce (collectives/). Knows nothing of NCCL or CUDA.
//
// Contract (mirrors what NCCL relies on; see docs/architecture.md):
//  - A connection is one-way: a SendComm on one side, a RecvComm on the other. The k-th isend
//    matches the k-th irecv (FIFO). At most kMaxRequests requests are in flight per comm.
//  - No call blocks. connect/accept return ok with a null comm until the handshake finishes;
//    isend/irecv return ok with a null request when the caller must retry (back-pressure).
//  - test() may be called on any outstanding request, from the thread that owns the comm.
//    After it reports done the request is gone.
//  - A send is done when the transport no longer reads its buffer; a receive is done when the
//    buffer holds its final contents (in bounded mode: missing bytes filled, never an error).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "transport/clock.h"
#include "transport/datapath.h"
#include "transport/params.h"
#include "transport/stats.h"
#include "transport/status.h"

namespace optireduce {

inline constexpr int kMaxRequests = 32;  // NCCL_NET_MAX_REQUESTS

class BoundedGroup;

enum class Delivery : uint8_t { kExact = 0, kBounded = 1 };
enum class Fill : uint8_t { kZero = 0, kMarker = 1 };  // what a bounded receive writes into holes

// What the caller knows about one message of a connection. A bounded connection may carry
// messages that must arrive whole (NCCL: its LL and LL128 protocols spin on flags inside the
// data, so a hole would hang the GPU; plugin/transfer_kind.h decides per transfer), so
// delivery is chosen per message within what the connection allows. On an exact connection
// every message is exact whatever is asked.
enum class MsgDelivery : uint8_t {
  // Bounded if the receiver's CTS says so; a send may expire before that CTS arrives (the
  // caller knows that its receiver will post it bounded).
  kAsConnection = 0,
  // Every byte, whatever the connection: never expires, never cut by a deadline. The receiver
  // tells the sender in its CTS, so a receiver's choice alone is enough.
  kExact = 1,
  // Sender only: the caller does not know, the receiver's CTS decides, and until it arrives
  // the send never expires (it might turn out exact).
  kAskReceiver = 2,
  // Receiver only, on a bounded connection: bounded until its sender starts, whole after. The
  // deadline cuts it only if no byte of it has arrived by then (a straggler, a stalled rank);
  // once its first DATA arrived every byte is waited for, as in an exact receive, so that a
  // slow but live sender costs time, never data. liboptireduce's phase 2 (the all-gather of the
  // reduced shards) uses it: a partly received shard would leave the ranks with different
  // results. Its CTS tells the sender, which then never cuts it once started. On isend it
  // means kAsConnection.
  kUntilStarted = 3,
};

// Per-connection behaviour chosen by the creator (the sender's choice is carried to the
// receiver in the handshake, so both ends of a connection always agree).
struct ConnOptions {
  Delivery delivery = Delivery::kExact;
  Fill fill = Fill::kZero;
  // Bounded mode: the group that shares timeout estimates (a communicator; see bounded.h).
  // May be null: deadlines are then a fixed budget (OPTIREDUCE_TIMEOUT_MS, else 1 s).
  BoundedGroup* group = nullptr;
  // Bounded connections only: the receiver posts every receive that does not say otherwise
  // (MsgDelivery::kAsConnection) as kUntilStarted. For a caller that cannot say it per
  // receive: NCCL's grouped calls on liboptireduce's phase-2 sibling communicator.
  bool until_started = false;
};

// The bytes a listener hands to its peer out of band (NCCL: the 128-byte handle). Pointer-free.
struct ConnectionHandle {
  static constexpr uint32_t kMagic = 0x4F505452;  // "OPTR"
  uint32_t magic = kMagic;
  uint16_t version = 1;
  uint16_t datapath = 0;  // which datapath kind the address belongs to
  uint64_t token = 0;     // random, echoed by every datagram of the connection
  PeerAddress addr;       // the listener's endpoint
};
static_assert(sizeof(ConnectionHandle) == 56);

class Engine;
class SendComm;
class RecvComm;

// An outstanding isend or irecv. Opaque; owned by its comm (a fixed slot, never allocated per
// call). NCCL's test() sees only the request, so the request knows its comm.
struct Request;

// Tests a request of either kind; same contract as SendComm::test / RecvComm::test.
Status test_request(Request* req, bool* done, size_t* size);

// The one call that blocks, for a caller with nothing to do until the network answers (the
// host path's exchange between two tests; never the plugin: no call NCCL makes may block).
// Sleeps until a datagram waits at the endpoint of one of these requests' connections, one of
// their timers is due, or `max_ns` passed, whichever comes first; a wake-up is a hint to test
// again, not a promise that anything changed. Returns false at once, without sleeping, where
// it cannot wait so (an endpoint with no descriptor to poll: the fault injector, the in-memory
// link, verbs without a completion channel or with receive lanes open; more distinct
// descriptors than it polls), and the caller naps instead.
// Null requests are skipped; the others must be outstanding, or done but not yet reposted.
bool wait_for_work(std::span<Request* const> reqs, uint64_t max_ns);

// How a receive ended, for its caller (the plugin reports it to NCCL's profiler). Valid from the
// test() that reported the receive done until the next irecv on its connection.
struct RecvOutcome {
  bool bounded = false;    // it could end without all its data (it was posted bounded)
  uint8_t end = 0;         // RecvEnd (deadline.h): all, deadline, early timeout, sender expired
  uint64_t expected = 0;   // the message's size (the posted capacity if none of it arrived)
  uint64_t lost = 0;       // of which missing at completion (filled)
};
const RecvOutcome& request_outcome(const Request* req);
// A pointer the caller may keep with an outstanding request (the transport never reads it).
void*& request_caller_data(Request* req);

// Opens the devices of the datapath OPTIREDUCE_DATAPATH selects (verbs where an RDMA port is
// active, else UDP). Defined by the datapath layer (verbs/select.cc), not by transport/.
using DeviceOpener = Status (*)(const Config&, std::vector<std::unique_ptr<Device>>*);
Status open_datapath_devices(const Config& cfg, std::vector<std::unique_ptr<Device>>* out);

class ListenComm {
 public:
  virtual ~ListenComm() = default;
  // Non-blocking: *out stays null until a peer's HELLO with our token arrived.
  virtual Status accept(std::unique_ptr<RecvComm>* out) = 0;
};

class SendComm {
 public:
  virtual ~SendComm() = default;
  // Queues a message. *req = nullptr means "not now, retry" (too many in flight). `mr`: the
  // registration `data` lies in (Engine::register_memory), or null; the datapath then sends
  // the payload straight from it where it can, and test() reports the send done only once the
  // device no longer reads it. The region must stay registered until then.
  virtual Status isend(const void* data, size_t size, MsgDelivery how, const MemoryRegion* mr,
                       Request** req) = 0;
  Status isend(const void* data, size_t size, MsgDelivery how, Request** req) {
    return isend(data, size, how, nullptr, req);
  }
  Status isend(const void* data, size_t size, Request** req) {
    return isend(data, size, MsgDelivery::kAsConnection, nullptr, req);
  }
  // A send posted while the caller still writes its buffer: bytes [0, ready) are final, and
  // no packet holding a byte past them leaves until release() says that byte is final too.
  // Lets the wire start on a message's head while its tail is produced (TAR posts each shard
  // before its Hadamard encode and releases it as the blocks come out), with the message's
  // CTS round trip, sequence and deadline those of one message. It takes no registration (its
  // one caller, the host exchange, has none), so every packet is read when it is sent.
  virtual Status isend_held(const void* data, size_t size, size_t ready, Request** req) = 0;
  // Bytes [0, ready) of an isend_held's buffer are final now. `ready` only grows, up to the
  // message's size; a send already done (a bounded one that expired) ignores it.
  virtual Status release(Request* req, size_t ready) = 0;
  // Bytes [0, n) of a send that test() has not reported done have left at least once (all of
  // it once it is done): a caller producing a held send's bytes keeps a lead over it instead of
  // producing them all at once.
  virtual uint64_t sent_prefix(Request* req) = 0;
  // *done = true once the buffer is no longer read. *size gets the bytes sent.
  virtual Status test(Request* req, bool* done, size_t* size) = 0;
  virtual ConnStats stats() const = 0;
  virtual Delivery delivery() const = 0;
};

class RecvComm {
 public:
  virtual ~RecvComm() = default;
  // `how`: kExact pins this message exact on a bounded connection; kAskReceiver means the same
  // as kAsConnection here (the receiver is the one that decides). `mr`: the registration
  // `data` lies in (Engine::register_memory), or null; a datapath that posts its receives
  // ahead (verbs) may then receive the payloads straight into `data` (Endpoint::aim_open).
  // The region must stay registered until test() reports the receive done.
  virtual Status irecv(void* data, size_t capacity, MsgDelivery how, const MemoryRegion* mr,
                       Request** req) = 0;
  Status irecv(void* data, size_t capacity, MsgDelivery how, Request** req) {
    return irecv(data, capacity, how, nullptr, req);
  }
  Status irecv(void* data, size_t capacity, Request** req) {
    return irecv(data, capacity, MsgDelivery::kAsConnection, nullptr, req);
  }
  // *size gets the message's real size (<= capacity).
  virtual Status test(Request* req, bool* done, size_t* size) = 0;
  // Bytes [0, n) of a receive that test() has not reported done yet that are in its buffer and
  // final: every packet below n arrived, and nothing writes there again (a later duplicate is
  // dropped, a deadline fills only holes above it). 0 before the first packet, and for a
  // receive the datapath writes into in place (`mr` given, Endpoint::aim_open), whose work
  // requests may land anywhere in it until it ends. Lets a caller start on the head of a long
  // message while its tail is on the wire (TAR reduces and decodes so).
  virtual uint64_t arrived_prefix(Request* req) = 0;
  virtual ConnStats stats() const = 0;
  virtual Delivery delivery() const = 0;
};

// Process-wide transport state: the devices, the background progress thread, the registry of
// live connections. Reference counted: the last release stops and joins the thread.
class Engine {
 public:
  virtual ~Engine() = default;

  // Gets the engine, creating it (device discovery, thread start) on the first acquire.
  // `clock` null = the steady clock; a test may inject a FakeClock on the first acquire.
  // `opener` null = open_datapath_devices; tests inject in-memory devices.
  static Status acquire(std::shared_ptr<Engine>* out, const Clock* clock = nullptr,
                        DeviceOpener opener = nullptr);

  virtual int device_count() const = 0;
  virtual const DeviceInfo& device(int dev) const = 0;
  virtual const Config& config() const = 0;
  virtual const Clock& clock() const = 0;

  // `group`: where bounded receives accepted on this listen comm take their deadlines from
  // (null: a fixed budget). Whether a connection is bounded is the sender's choice.
  virtual Status listen(int dev, ConnectionHandle* handle, std::unique_ptr<ListenComm>* out,
                        BoundedGroup* group = nullptr) = 0;
  // Non-blocking: call again with the same arguments until *out is non-null. `state` is an
  // opaque slot the caller keeps between calls (NCCL: inside its handle buffer); it must start
  // as nullptr and is owned by the engine (freed when the connect completes or the engine ends).
  virtual Status connect(int dev, const ConnectionHandle& handle, const ConnOptions& opts,
                         void** state, std::unique_ptr<SendComm>* out) = 0;
  // Registers host memory with device `dev` (Device::register_memory): *out stays null where
  // the datapath needs none. `dmabuf_fd` >= 0: the memory as that dmabuf describes it, at
  // `dmabuf_offset`, where the datapath can register one. A failure costs only the zero copy.
  virtual Status register_memory(int dev, void* data, size_t bytes,
                                 std::unique_ptr<MemoryRegion>* out, int dmabuf_fd = -1,
                                 uint64_t dmabuf_offset = 0) = 0;
};

// Stops and joins the live engine's progress thread, if any, for good, and makes every later
// Engine::acquire fail (issue 10). Runs by itself at exit (acquire arms it with atexit); a
// library that embeds the transport calls it when it is unloaded with comms still open, so that
// no thread runs on in unmapped code. Frees nothing: open comms stay valid memory.
void quiesce_engine();

}  // namespace optireduce
