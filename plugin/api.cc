// Implements plugin/api.h: the reference-counted process state (engine, contexts, NCCL's
// logger), the comm wrappers that give NCCL's opaque request pointers an owner, and the C query
// API of plugin/optireduce_net.h.
#include "plugin/api.h"

#include <strings.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "plugin/optireduce_net.h"
#include "transport/bounded.h"
#include "transport/log.h"
#include "transport/params.h"
#include "transport/transport.h"

namespace optireduce::plugin {
namespace {

using nccl::ncclDebugLogLevel;

// The peer's ConnectionHandle travels in the first bytes of NCCL's 128-byte handle. connect()
// keeps the engine's per-attempt state pointer in the last 8 bytes, which listen() zeroes and
// which therefore start as nullptr on the connecting side, as Engine::connect requires.
constexpr size_t kConnectStateOffset = nccl::NCCL_NET_HANDLE_MAXSIZE - sizeof(void*);
static_assert(sizeof(ConnectionHandle) <= kConnectStateOffset,
              "the connection handle and the connect state must both fit in NCCL's handle");
static_assert(kMaxRequests == nccl::NCCL_NET_MAX_REQUESTS);

// NCCL's own "max comms per device": a per-device table size, not a resource we reserve.
constexpr int kMaxComms = 65536;

// ---------------------------------------------------------------------------------------------
// Logging: the transport's sink forwards every line to the logger NCCL handed to init.

std::atomic<ncclDebugLogger_t> g_logger{nullptr};

ncclDebugLogLevel to_nccl_level(LogLevel level) {
  switch (level) {
    case LogLevel::kWarn:
      return nccl::NCCL_LOG_WARN;
    case LogLevel::kInfo:
      return nccl::NCCL_LOG_INFO;
    case LogLevel::kTrace:
      return nccl::NCCL_LOG_TRACE;
    case LogLevel::kNone:
      break;
  }
  return nccl::NCCL_LOG_NONE;
}

void nccl_sink(LogLevel level, const char* file, int line, const char* msg) {
  ncclDebugLogger_t logger = g_logger.load(std::memory_order_acquire);
  if (logger == nullptr) {
    std::fprintf(stderr, "NET/OptiReduce %s\n", msg);
    return;
  }
  logger(to_nccl_level(level), nccl::NCCL_NET, file, line, "NET/OptiReduce : %s", msg);
}

void install_logger(ncclDebugLogger_t logger) {
  if (logger != nullptr) g_logger.store(logger, std::memory_order_release);
  log_set_sink(nccl_sink);
  // NCCL filters by NCCL_DEBUG itself; raising our level only when NCCL will print INFO keeps
  // per-connection lines from being formatted for nothing otherwise.
  const char* debug = std::getenv("NCCL_DEBUG");
  if (debug != nullptr && (strcasecmp(debug, "INFO") == 0 || strcasecmp(debug, "TRACE") == 0) &&
      !log_enabled(LogLevel::kInfo)) {
    log_set_level(LogLevel::kInfo);
  }
}

// A line for the INIT/ENV subsystems (what NCCL users filter on for set-up decisions).
void log_init_info(const char* msg) {
  ncclDebugLogger_t logger = g_logger.load(std::memory_order_acquire);
  if (logger != nullptr) {
    logger(nccl::NCCL_LOG_INFO, nccl::NCCL_INIT | nccl::NCCL_ENV, __FILE__, __LINE__,
           "NET/OptiReduce : %s", msg);
  } else {
    OR_INFO("%s", msg);
  }
}

// ---------------------------------------------------------------------------------------------
// Counters: ConnStats sums, kept field by field because the C API mirrors them.

static_assert(sizeof(ConnStats) == 20 * 8 + 2 * 4,
              "ConnStats changed: update add_stats() and struct optireduceNetCounters");

void add_stats(ConnStats* into, const ConnStats& s, bool live) {
  into->msgs += s.msgs;
  into->bytes += s.bytes;
  into->data_pkts += s.data_pkts;
  into->ctrl_pkts += s.ctrl_pkts;
  into->retx_pkts += s.retx_pkts;
  into->rto_events += s.rto_events;
  into->probes += s.probes;
  into->cts_resent += s.cts_resent;
  into->drop_malformed += s.drop_malformed;
  into->drop_token += s.drop_token;
  into->drop_stale += s.drop_stale;
  into->drop_duplicate += s.drop_duplicate;
  into->drop_bounds += s.drop_bounds;
  into->drop_unexpected += s.drop_unexpected;
  into->bytes_expected += s.bytes_expected;
  into->bytes_lost += s.bytes_lost;
  into->deadline_hits += s.deadline_hits;
  into->early_timeouts += s.early_timeouts;
  into->late_pkts += s.late_pkts;
  into->expired_sends += s.expired_sends;
  // The timeouts are current values, not counters: only live connections have one.
  if (live) {
    into->tb_us = std::max(into->tb_us, s.tb_us);
    into->tc_us = std::max(into->tc_us, s.tc_us);
  }
}

void to_c(const ConnStats& s, optireduceNetCounters* c) {
  *c = optireduceNetCounters{};
  c->msgs = s.msgs;
  c->bytes = s.bytes;
  c->dataPkts = s.data_pkts;
  c->ctrlPkts = s.ctrl_pkts;
  c->retxPkts = s.retx_pkts;
  c->rtoEvents = s.rto_events;
  c->ctsResent = s.cts_resent;
  c->dropMalformed = s.drop_malformed;
  c->dropToken = s.drop_token;
  c->dropStale = s.drop_stale;
  c->dropDuplicate = s.drop_duplicate;
  c->dropBounds = s.drop_bounds;
  c->dropUnexpected = s.drop_unexpected;
  c->bytesExpected = s.bytes_expected;
  c->bytesLost = s.bytes_lost;
  c->deadlineHits = s.deadline_hits;
  c->earlyTimeouts = s.early_timeouts;
  c->latePkts = s.late_pkts;
  c->expiredSends = s.expired_sends;
  c->tbUs = s.tb_us;
  c->tcUs = s.tc_us;
  c->probes = s.probes;
}

// ---------------------------------------------------------------------------------------------
// Contexts, comms and requests.

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

  std::mutex mu;  // guards the four members below; taken after g_state.mu
  std::vector<SendWrap*> live_send;
  std::vector<RecvWrap*> live_recv;
  ConnStats closed_send;
  ConnStats closed_recv;
};

constexpr uint32_t kSendMagic = 0x53454E44;  // "SEND"
constexpr uint32_t kRecvMagic = 0x52454356;  // "RECV"

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
  ncclResult_t sticky = nccl::ncclSuccess;
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

// ---------------------------------------------------------------------------------------------
// Process state. A namespace-scope object: it lives exactly as long as the loaded library.

struct ProcessState {
  std::mutex mu;
  std::vector<std::shared_ptr<Context>> contexts;  // initialised and not yet finalized (v11)
  std::shared_ptr<Context> legacy;                 // v8..v10
  std::weak_ptr<Engine> engine;                    // devices/getProperties get no context
  ConnStats closed_send;                           // every comm closed in this process
  ConnStats closed_recv;
  // Stable storage for the strings getProperties hands out: NCCL may keep the pointers longer
  // than one engine lives.
  std::deque<std::string> interned;
};
ProcessState g_state;

const char* intern(const std::string& s) {
  std::lock_guard<std::mutex> lock(g_state.mu);
  for (const std::string& k : g_state.interned) {
    if (k == s) return k.c_str();
  }
  return g_state.interned.emplace_back(s).c_str();
}

std::shared_ptr<Context> find_context(void* ctx) {
  std::lock_guard<std::mutex> lock(g_state.mu);
  if (ctx == nullptr) return nullptr;
  if (g_state.legacy.get() == ctx) return g_state.legacy;
  for (const auto& c : g_state.contexts) {
    if (c.get() == ctx) return c;
  }
  return nullptr;
}

std::shared_ptr<Engine> current_engine() {
  std::lock_guard<std::mutex> lock(g_state.mu);
  return g_state.engine.lock();
}

// A library unloaded without a finalize (always so for v8..v10, whose NCCL adapters have none)
// must still stop the engine's thread before its code disappears. GCC runs destructor functions
// before the library's C++ static destructors, so every static is still alive here. Comms that
// NCCL never closed keep their context (and the engine) alive: leaked, but never freed under a
// running thread.
__attribute__((destructor)) void release_at_unload() {
  std::shared_ptr<Context> legacy;
  std::vector<std::shared_ptr<Context>> contexts;
  {
    std::lock_guard<std::mutex> lock(g_state.mu);
    legacy.swap(g_state.legacy);
    contexts.swap(g_state.contexts);
  }
  legacy.reset();
  contexts.clear();
  log_set_sink(nullptr);
}

// ---------------------------------------------------------------------------------------------
// Helpers shared by the entry points.

// Every entry point runs inside this: nothing may unwind through NCCL's C frames.
template <typename F>
ncclResult_t guarded(const char* what, F&& body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    OR_WARN("%s: out of memory", what);
    return nccl::ncclSystemError;
  } catch (const std::exception& e) {
    OR_WARN("%s: unexpected exception: %s", what, e.what());
    return nccl::ncclInternalError;
  } catch (...) {
    OR_WARN("%s: unexpected exception", what);
    return nccl::ncclInternalError;
  }
}

// NCCL broke the contract (a NULL pointer, a foreign handle): ncclInternalError per the docs.
ncclResult_t misuse(const char* what) {
  OR_WARN("%s", what);
  return nccl::ncclInternalError;
}

ncclResult_t fail(CommBase* w, Status s, const char* what) {
  w->sticky = to_nccl(s);
  OR_WARN("%s failed on comm %p: %s (errno %d)", what, static_cast<void*>(w), errc_name(s.code()),
          s.sys_errno());
  return w->sticky;
}

SendWrap* as_send(void* comm) {
  auto* w = static_cast<CommBase*>(comm);
  return (w != nullptr && w->magic == kSendMagic) ? static_cast<SendWrap*>(w) : nullptr;
}

RecvWrap* as_recv(void* comm) {
  auto* w = static_cast<CommBase*>(comm);
  return (w != nullptr && w->magic == kRecvMagic) ? static_cast<RecvWrap*>(w) : nullptr;
}

const char* delivery_name(Delivery d) {
  return d == Delivery::kBounded ? "bounded" : "exact";
}

// Bounded communicators must stay on NCCL's Simple protocol (an LL/LL128 line lost or
// zero-filled hangs the GPU forever). NCCL reads NCCL_PROTO after the plugin's init, so setting
// it here works; a user's own value is never overwritten.
void keep_simple_protocol() {
  const char* current = std::getenv("NCCL_PROTO");
  if (current == nullptr) {
    setenv("NCCL_PROTO", "Simple", 0);
    log_init_info("bounded communicator: set NCCL_PROTO=Simple (LL/LL128 cannot tolerate loss)");
  } else if (strcasecmp(current, "Simple") != 0) {
    OR_WARN(
        "bounded communicator but NCCL_PROTO=%s (kept, the user's); a connection that sees "
        "LL/LL128 falls back to exact delivery",
        current);
  }
}

ncclResult_t make_context(uint64_t comm_id, int traffic_class, std::shared_ptr<Context>* out) {
  std::string error;
  if (Status s = global_config_status(&error); !s) {
    OR_WARN("invalid configuration: %s", error.c_str());
    return nccl::ncclInvalidUsage;
  }
  std::shared_ptr<Engine> engine;
  if (Status s = Engine::acquire(&engine); !s) {
    OR_WARN("cannot start the transport: %s (errno %d)", errc_name(s.code()), s.sys_errno());
    return to_nccl(s);
  }
  if (engine->device_count() < 1) {
    OR_WARN("no usable network interface (see OPTIREDUCE_IFNAME)");
    return nccl::ncclSystemError;
  }
  const Config& cfg = engine->config();
  auto c = std::make_shared<Context>();
  c->comm_id = comm_id;
  c->bounded = cfg.mode == "bounded" || (traffic_class != nccl::NCCL_NET_TRAFFIC_CLASS_UNDEF &&
                                         traffic_class == cfg.bounded_traffic_class);
  c->fill = cfg.fill == "marker" ? Fill::kMarker : Fill::kZero;
  c->engine = engine;
  c->group = std::make_unique<BoundedGroup>(cfg);
  c->group->set_label(comm_id);
  {
    std::lock_guard<std::mutex> lock(g_state.mu);
    g_state.engine = engine;
  }
  if (c->bounded) keep_simple_protocol();
  OR_INFO("context %p comm 0x%016" PRIx64 ": %s delivery%s", static_cast<void*>(c.get()), comm_id,
          c->bounded ? "bounded" : "exact",
          c->bounded ? (c->fill == Fill::kMarker ? ", marker fill" : ", zero fill") : "");
  *out = std::move(c);
  return nccl::ncclSuccess;
}

// Moves a closing comm's final counters into its context's and the process's totals.
template <typename Wrap>
void retire(Wrap* w, std::vector<Wrap*> Context::*live, ConnStats Context::*ctx_closed,
            ConnStats ProcessState::*proc_closed) {
  std::lock_guard<std::mutex> lock(g_state.mu);
  Context& c = *w->ctx;
  std::lock_guard<std::mutex> lock_ctx(c.mu);
  auto& v = c.*live;
  v.erase(std::remove(v.begin(), v.end(), w), v.end());
  const ConnStats s = w->comm->stats();
  add_stats(&(c.*ctx_closed), s, false);
  add_stats(&(g_state.*proc_closed), s, false);
  OR_INFO("close %s comm %p (%s): msgs %" PRIu64 " bytes %" PRIu64 " data %" PRIu64 " retx %" PRIu64
          " rto %" PRIu64
          " drops malformed/token/stale/dup/bounds/unexpected "
          "%" PRIu64 "/%" PRIu64 "/%" PRIu64 "/%" PRIu64 "/%" PRIu64 "/%" PRIu64 " lost %" PRIu64
          "/%" PRIu64 " B",
          w->magic == kSendMagic ? "send" : "recv", static_cast<void*>(w),
          delivery_name(w->comm->delivery()), s.msgs, s.bytes, s.data_pkts, s.retx_pkts,
          s.rto_events, s.drop_malformed, s.drop_token, s.drop_stale, s.drop_duplicate,
          s.drop_bounds, s.drop_unexpected, s.bytes_lost, s.bytes_expected);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Entry points.

ncclResult_t to_nccl(Status s) noexcept {
  switch (s.code()) {
    case Errc::kOk:
      return nccl::ncclSuccess;
    case Errc::kSystem:
      return nccl::ncclSystemError;
    case Errc::kInternal:
      return nccl::ncclInternalError;
    case Errc::kInvalidUsage:
      return nccl::ncclInvalidUsage;
    case Errc::kRemote:
      return nccl::ncclRemoteError;
  }
  return nccl::ncclInternalError;
}

ncclResult_t init(void** ctx, uint64_t comm_id, const ncclNetCommConfig_v11_t* config,
                  ncclDebugLogger_t logger) noexcept {
  return guarded("init", [&] {
    install_logger(logger);
    if (ctx == nullptr) return misuse("init: ctx is NULL");
    *ctx = nullptr;
    std::shared_ptr<Context> c;
    const int tc = config != nullptr ? config->trafficClass : nccl::NCCL_NET_TRAFFIC_CLASS_UNDEF;
    if (ncclResult_t r = make_context(comm_id, tc, &c); r != nccl::ncclSuccess) return r;
    std::lock_guard<std::mutex> lock(g_state.mu);
    g_state.contexts.push_back(c);
    *ctx = c.get();
    return nccl::ncclSuccess;
  });
}

ncclResult_t finalize(void* ctx) noexcept {
  return guarded("finalize", [&] {
    // NCCL finalizes even after a failed init, whose ctx we left NULL.
    if (ctx == nullptr) return nccl::ncclSuccess;
    std::shared_ptr<Context> c;
    {
      std::lock_guard<std::mutex> lock(g_state.mu);
      if (g_state.legacy.get() == ctx) return nccl::ncclSuccess;  // released at unload
      auto it = std::find_if(g_state.contexts.begin(), g_state.contexts.end(),
                             [&](const auto& p) { return p.get() == ctx; });
      if (it == g_state.contexts.end()) return misuse("finalize: unknown context");
      c = std::move(*it);
      g_state.contexts.erase(it);
    }
    // Dropping the last reference outside the lock: the engine's destructor joins its thread.
    c.reset();
    return nccl::ncclSuccess;
  });
}

ncclResult_t init_legacy(ncclDebugLogger_t logger) noexcept {
  return guarded("init", [&] {
    install_logger(logger);
    {
      std::lock_guard<std::mutex> lock(g_state.mu);
      if (g_state.legacy != nullptr) return nccl::ncclSuccess;
    }
    std::shared_ptr<Context> c;
    if (ncclResult_t r = make_context(0, nccl::NCCL_NET_TRAFFIC_CLASS_UNDEF, &c);
        r != nccl::ncclSuccess) {
      return r;
    }
    std::lock_guard<std::mutex> lock(g_state.mu);
    if (g_state.legacy == nullptr) g_state.legacy = std::move(c);
    return nccl::ncclSuccess;
  });
}

void* legacy_context() noexcept {
  std::lock_guard<std::mutex> lock(g_state.mu);
  return g_state.legacy.get();
}

ncclResult_t devices(int* ndev) noexcept {
  return guarded("devices", [&] {
    if (ndev == nullptr) return misuse("devices: ndev is NULL");
    std::shared_ptr<Engine> e = current_engine();
    if (e == nullptr) return misuse("devices called before init");
    *ndev = e->device_count();
    return nccl::ncclSuccess;
  });
}

ncclResult_t get_properties(int dev, ncclNetProperties_v11_t* props) noexcept {
  return guarded("getProperties", [&] {
    if (props == nullptr) return misuse("getProperties: props is NULL");
    std::shared_ptr<Engine> e = current_engine();
    if (e == nullptr) return misuse("getProperties called before init");
    if (dev < 0 || dev >= e->device_count()) return misuse("getProperties: no such device");
    const DeviceInfo& info = e->device(dev);
    *props = ncclNetProperties_v11_t{};
    props->name = const_cast<char*>(intern(info.name));
    props->pciPath = info.pci_path.empty() ? nullptr : const_cast<char*>(intern(info.pci_path));
    props->guid = info.guid;
    props->ptrSupport = nccl::NCCL_PTR_HOST;
    props->regIsGlobal = 0;
    props->forceFlush = 0;
    props->speed = info.speed_mbps;
    props->port = info.port;
    props->latency = info.latency_us;
    props->maxComms = kMaxComms;
    props->maxRecvs = 1;
    props->netDeviceType = nccl::NCCL_NET_DEVICE_HOST;
    props->netDeviceVersion = nccl::NCCL_NET_DEVICE_VERSION_HOST;
    props->vProps.ndevs = 1;
    props->vProps.devs[0] = dev;
    props->maxP2pBytes = kMaxMessageBytes;
    props->maxCollBytes = kMaxMessageBytes;
    props->maxMultiRequestSize = 1;
    return nccl::ncclSuccess;
  });
}

ncclResult_t listen(void* ctx, int dev, void* handle, void** listen_comm) noexcept {
  return guarded("listen", [&] {
    if (handle == nullptr || listen_comm == nullptr) return misuse("listen: NULL argument");
    *listen_comm = nullptr;
    std::shared_ptr<Context> c = find_context(ctx);
    if (c == nullptr) return misuse("listen: unknown context (init not called?)");
    if (dev < 0 || dev >= c->engine->device_count()) return misuse("listen: no such device");
    std::memset(handle, 0, nccl::NCCL_NET_HANDLE_MAXSIZE);
    ConnectionHandle h;
    auto w = std::make_unique<ListenWrap>();
    if (Status s = c->engine->listen(dev, &h, &w->comm, c->group.get()); !s) {
      OR_WARN("listen on device %d failed: %s (errno %d)", dev, errc_name(s.code()), s.sys_errno());
      return to_nccl(s);
    }
    std::memcpy(handle, &h, sizeof(h));
    w->ctx = std::move(c);
    w->dev = dev;
    *listen_comm = w.release();
    return nccl::ncclSuccess;
  });
}

ncclResult_t connect(void* ctx, int dev, const ncclNetCommConfig_v11_t* config, void* handle,
                     void** send_comm, ncclNetDeviceHandle_v11_t** dev_comm) noexcept {
  return guarded("connect", [&] {
    if (handle == nullptr || send_comm == nullptr) return misuse("connect: NULL argument");
    *send_comm = nullptr;
    if (dev_comm != nullptr) *dev_comm = nullptr;  // a HOST plugin has no device handle
    std::shared_ptr<Context> c = find_context(ctx);
    if (c == nullptr) return misuse("connect: unknown context (init not called?)");
    if (dev < 0 || dev >= c->engine->device_count()) return misuse("connect: no such device");

    ConnectionHandle h;
    std::memcpy(&h, handle, sizeof(h));
    if (h.magic != ConnectionHandle::kMagic) return misuse("connect: not an OptiReduce handle");
    auto* state_slot = static_cast<unsigned char*>(handle) + kConnectStateOffset;
    void* state = nullptr;
    std::memcpy(&state, state_slot, sizeof(state));

    const bool bounded =
        (c->bounded ||
         (config != nullptr && config->trafficClass != nccl::NCCL_NET_TRAFFIC_CLASS_UNDEF &&
          config->trafficClass == c->engine->config().bounded_traffic_class)) &&
        !c->exact_only.load(std::memory_order_relaxed);
    ConnOptions opts;
    opts.delivery = bounded ? Delivery::kBounded : Delivery::kExact;
    opts.fill = c->fill;
    opts.group = c->group.get();

    std::unique_ptr<SendComm> out;
    const Status s = c->engine->connect(dev, h, opts, &state, &out);
    std::memcpy(state_slot, &state, sizeof(state));
    if (!s) {
      OR_WARN("connect on device %d failed: %s (errno %d)", dev, errc_name(s.code()),
              s.sys_errno());
      return to_nccl(s);
    }
    if (out == nullptr) return nccl::ncclSuccess;  // handshake still under way

    auto w = std::make_unique<SendWrap>(c);
    w->comm = std::move(out);
    {
      std::lock_guard<std::mutex> lock(c->mu);
      c->live_send.push_back(w.get());
    }
    OR_INFO("connected send comm %p on device %d (%s)", static_cast<void*>(w.get()), dev,
            delivery_name(w->comm->delivery()));
    *send_comm = w.release();
    return nccl::ncclSuccess;
  });
}

ncclResult_t accept(void* listen_comm, void** recv_comm,
                    ncclNetDeviceHandle_v11_t** dev_comm) noexcept {
  return guarded("accept", [&] {
    if (listen_comm == nullptr || recv_comm == nullptr) return misuse("accept: NULL argument");
    *recv_comm = nullptr;
    if (dev_comm != nullptr) *dev_comm = nullptr;
    auto* l = static_cast<ListenWrap*>(listen_comm);
    std::unique_ptr<RecvComm> out;
    if (Status s = l->comm->accept(&out); !s) {
      OR_WARN("accept on device %d failed: %s (errno %d)", l->dev, errc_name(s.code()),
              s.sys_errno());
      return to_nccl(s);
    }
    if (out == nullptr) return nccl::ncclSuccess;

    // The sender chose the delivery; the transport's handshake brought its choice here.
    auto w = std::make_unique<RecvWrap>(l->ctx);
    w->comm = std::move(out);
    {
      std::lock_guard<std::mutex> lock(l->ctx->mu);
      l->ctx->live_recv.push_back(w.get());
    }
    OR_INFO("accepted recv comm %p on device %d (%s)", static_cast<void*>(w.get()), l->dev,
            delivery_name(w->comm->delivery()));
    *recv_comm = w.release();
    return nccl::ncclSuccess;
  });
}

ncclResult_t reg_mr(void* comm, void* data, size_t size, int type, void** mhandle) noexcept {
  return guarded("regMr", [&] {
    if (comm == nullptr || mhandle == nullptr) return misuse("regMr: NULL argument");
    *mhandle = nullptr;
    if (type != nccl::NCCL_PTR_HOST) {
      // ptrSupport says HOST only; NCCL asking for anything else is a contract breach.
      OR_WARN("regMr: memory type 0x%x is not supported (host memory only)", type);
      return nccl::ncclInternalError;
    }
    // Overlapping registrations of one pool by many comms are normal: each gets its own handle.
    *mhandle = new MemHandle{data, size, type};
    return nccl::ncclSuccess;
  });
}

ncclResult_t reg_mr_dmabuf(void* comm, void* data, size_t size, int type, uint64_t /*offset*/,
                           int /*fd*/, void** mhandle) noexcept {
  // Host memory needs nothing from the dmabuf; other types are rejected by reg_mr.
  return reg_mr(comm, data, size, type, mhandle);
}

ncclResult_t dereg_mr(void* /*comm*/, void* mhandle) noexcept {
  delete static_cast<MemHandle*>(mhandle);
  return nccl::ncclSuccess;
}

ncclResult_t isend(void* send_comm, void* data, size_t size, int /*tag*/, void* /*mhandle*/,
                   void** request) noexcept {
  return guarded("isend", [&] {
    if (request == nullptr) return misuse("isend: request is NULL");
    *request = nullptr;
    SendWrap* w = as_send(send_comm);
    if (w == nullptr) return misuse("isend: not a send comm");
    if (w->sticky != nccl::ncclSuccess) return w->sticky;
    if (size > kMaxMessageBytes) return misuse("isend: message larger than maxP2pBytes");
    if (data == nullptr && size > 0) return misuse("isend: NULL buffer");
    Request* r = nullptr;  // stays null on back-pressure: NCCL retries
    if (Status s = w->comm->isend(data, size, &r); !s) return fail(w, s, "isend");
    *request = r;
    return nccl::ncclSuccess;
  });
}

ncclResult_t irecv(void* recv_comm, int n, void** data, size_t* sizes, int* /*tags*/,
                   void** /*mhandles*/, void** request) noexcept {
  return guarded("irecv", [&] {
    if (request == nullptr) return misuse("irecv: request is NULL");
    // NCCL may have stored the optional-completion sentinel for LL/LL128: read it, then always
    // overwrite it so that NCCL never mistakes it for one of our requests.
    const bool ll_hint = *request == nccl::kOptionalRecvSentinel;
    *request = nullptr;
    RecvWrap* w = as_recv(recv_comm);
    if (w == nullptr) return misuse("irecv: not a recv comm");
    if (w->sticky != nccl::ncclSuccess) return w->sticky;
    if (n != 1) return misuse("irecv: grouped receives are not supported (maxRecvs is 1)");
    if (data == nullptr || sizes == nullptr) return misuse("irecv: NULL argument");
    if (sizes[0] > kMaxMessageBytes) return misuse("irecv: buffer larger than maxP2pBytes");
    if (data[0] == nullptr && sizes[0] > 0) return misuse("irecv: NULL buffer");
    if (ll_hint && w->comm->delivery() == Delivery::kBounded) {
      // LL/LL128 spin on flags inside the data: a hole would hang the GPU. Exact from now on.
      w->comm->force_exact();
      if (!w->sentinel_warned) {
        w->sentinel_warned = true;
        OR_WARN(
            "recv comm %p: NCCL uses LL/LL128 on a bounded connection; it falls back to "
            "exact delivery (set NCCL_PROTO=Simple)",
            static_cast<void*>(w));
      }
    }
    Request* r = nullptr;
    if (Status s = w->comm->irecv(data[0], sizes[0], &r); !s) return fail(w, s, "irecv");
    *request = r;
    return nccl::ncclSuccess;
  });
}

ncclResult_t iflush(void* /*recv_comm*/, int /*n*/, void** /*data*/, int* /*sizes*/,
                    void** /*mhandles*/, void** request) noexcept {
  // Host memory is final once the receive completed: nothing to flush, no request to test.
  if (request == nullptr) return nccl::ncclInternalError;
  *request = nullptr;
  return nccl::ncclSuccess;
}

ncclResult_t test(void* request, int* done, int* sizes) noexcept {
  return guarded("test", [&] {
    if (request == nullptr || done == nullptr) return misuse("test: NULL argument");
    bool finished = false;
    size_t size = 0;
    if (Status s = test_request(static_cast<Request*>(request), &finished, &size); !s) {
      // The connection's error is sticky inside the transport; NCCL stops at the first one.
      OR_WARN("test failed on request %p: %s (errno %d)", request, errc_name(s.code()),
              s.sys_errno());
      return to_nccl(s);
    }
    *done = finished ? 1 : 0;
    // size <= the posted size <= kMaxMessageBytes < 2^31: the int cannot overflow.
    if (finished && sizes != nullptr) *sizes = static_cast<int>(size);
    return nccl::ncclSuccess;
  });
}

ncclResult_t close_send(void* send_comm) noexcept {
  return guarded("closeSend", [&] {
    if (send_comm == nullptr) return nccl::ncclSuccess;
    SendWrap* w = as_send(send_comm);
    if (w == nullptr) return misuse("closeSend: not a send comm");
    retire(w, &Context::live_send, &Context::closed_send, &ProcessState::closed_send);
    w->magic = 0;
    delete w;  // the transport owns the fate of requests still in flight
    return nccl::ncclSuccess;
  });
}

ncclResult_t close_recv(void* recv_comm) noexcept {
  return guarded("closeRecv", [&] {
    if (recv_comm == nullptr) return nccl::ncclSuccess;
    RecvWrap* w = as_recv(recv_comm);
    if (w == nullptr) return misuse("closeRecv: not a recv comm");
    retire(w, &Context::live_recv, &Context::closed_recv, &ProcessState::closed_recv);
    w->magic = 0;
    delete w;
    return nccl::ncclSuccess;
  });
}

ncclResult_t close_listen(void* listen_comm) noexcept {
  return guarded("closeListen", [&] {
    delete static_cast<ListenWrap*>(listen_comm);
    return nccl::ncclSuccess;
  });
}

ncclResult_t set_net_attr(void* ctx, ncclNetAttr_v11_t* attr) noexcept {
  return guarded("setNetAttr", [&] {
    if (attr == nullptr) return misuse("setNetAttr: attr is NULL");
    std::shared_ptr<Context> c = find_context(ctx);
    if (c == nullptr) return misuse("setNetAttr: unknown context");
    c->proto_bits.store(attr->proto, std::memory_order_relaxed);
    const uint32_t ll = nccl::NCCL_NET_PROTO_LL | nccl::NCCL_NET_PROTO_LL128;
    if (c->bounded && (attr->proto & ll) != 0 && !c->exact_only.exchange(true)) {
      OR_WARN("comm 0x%016" PRIx64
              ": NCCL announces LL/LL128 (proto 0x%x) on a bounded "
              "communicator; its new connections use exact delivery (set NCCL_PROTO=Simple)",
              c->comm_id, attr->proto);
    }
    return nccl::ncclSuccess;
  });
}

}  // namespace optireduce::plugin

// ---------------------------------------------------------------------------------------------
// The C query API (plugin/optireduce_net.h). Exported with default visibility for dlsym.

namespace optireduce::plugin {
namespace {

int collect_stats(uint64_t comm_id, optireduceNetStats* out) {
  ConnStats comm_send, comm_recv;
  ConnStats proc_send, proc_recv;
  bool found = false;
  bool bounded = false;
  uint32_t live_send = 0;
  uint32_t live_recv = 0;
  {
    std::lock_guard<std::mutex> lock(g_state.mu);
    proc_send = g_state.closed_send;
    proc_recv = g_state.closed_recv;
    std::vector<Context*> all;
    for (const auto& c : g_state.contexts) all.push_back(c.get());
    if (g_state.legacy != nullptr) all.push_back(g_state.legacy.get());
    for (Context* c : all) {
      std::lock_guard<std::mutex> lock_ctx(c->mu);
      const bool match = c->comm_id == comm_id;
      if (match) {
        found = true;
        bounded = bounded || c->bounded;
        add_stats(&comm_send, c->closed_send, false);
        add_stats(&comm_recv, c->closed_recv, false);
        live_send += static_cast<uint32_t>(c->live_send.size());
        live_recv += static_cast<uint32_t>(c->live_recv.size());
      }
      for (SendWrap* w : c->live_send) {
        const ConnStats s = w->comm->stats();
        add_stats(&proc_send, s, true);
        if (match) add_stats(&comm_send, s, true);
      }
      for (RecvWrap* w : c->live_recv) {
        const ConnStats s = w->comm->stats();
        add_stats(&proc_recv, s, true);
        if (match) add_stats(&comm_recv, s, true);
      }
    }
  }
  *out = optireduceNetStats{};
  out->version = OPTIREDUCE_NET_STATS_VERSION;
  out->bounded = bounded ? 1 : 0;
  out->commId = comm_id;
  out->liveSendComms = live_send;
  out->liveRecvComms = live_recv;
  to_c(comm_send, &out->send);
  to_c(comm_recv, &out->recv);
  to_c(proc_send, &out->processSend);
  to_c(proc_recv, &out->processRecv);
  return found ? 0 : 1;
}

}  // namespace
}  // namespace optireduce::plugin

extern "C" __attribute__((visibility("default"))) int optireduceNetStatsVersion(void) {
  return OPTIREDUCE_NET_STATS_VERSION;
}

extern "C" __attribute__((visibility("default"))) int optireduceNetGetStats(
    uint64_t commId, struct optireduceNetStats* out) {
  if (out == nullptr) return -1;
  try {
    return optireduce::plugin::collect_stats(commId, out);
  } catch (...) {
    return -1;
  }
}
