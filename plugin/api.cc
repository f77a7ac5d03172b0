// Implements plugin/api.h: NCCL's entry points over the transport, and the comm wrappers that
// give NCCL's opaque pointers an owner. A communicator's delivery (its traffic class, context,
// connection options and transfers) lives in context.cc, the process state and its lifetime in
// process_state.cc, the counters and their C query API in stats.cc, the logger glue in logger.cc.
#include "plugin/api.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <vector>

#include "plugin/context.h"
#include "plugin/logger.h"
#include "plugin/process_state.h"
#include "plugin/profiler_events.h"
#include "plugin/stats.h"
#include "transport/log.h"
#include "transport/params.h"
#include "transport/transport.h"

namespace optireduce::plugin {
namespace {

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
// Helpers shared by the entry points.

// A call that came after exit() began (NCCL's proxy thread may still be running) or, in
// principle, during the unload. Warned about once: a proxy loop would repeat it for every comm.
ncclResult_t refused(const char* what) {
  static std::atomic<bool> warned{false};
  if (!warned.exchange(true)) {
    OR_WARN("%s called while the process exits: refused (as is every later call)", what);
  }
  return nccl::ncclInternalError;
}

// Every entry point runs inside this: nothing may unwind through NCCL's C frames, and nothing
// starts once the plugin's phase left kAlive (see process_state.h).
template <typename F>
ncclResult_t guarded(const char* what, F&& body) noexcept {
  if (!alive()) return refused(what);
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

// Makes a context and records its engine in the process state, which `*state` then points to.
ncclResult_t make_context(uint64_t comm_id, int traffic_class, int abi,
                          std::shared_ptr<Context>* out, ProcessState** state) {
  std::shared_ptr<Context> c;
  if (ncclResult_t r = new_context(comm_id, traffic_class, abi, &c); r != nccl::ncclSuccess)
    return r;
  *state = state_for_new_context();
  if (*state == nullptr) return refused("init");
  {
    std::lock_guard<std::mutex> lock((*state)->mu);
    (*state)->engine = c->engine;
  }
  *out = std::move(c);
  return nccl::ncclSuccess;
}

// Moves a closing comm's final counters into its context's and the process's totals.
template <typename Wrap>
void retire(Wrap* w, std::vector<Wrap*> Context::*live, ConnStats Context::*ctx_closed,
            ConnStats ProcessState::*proc_closed) {
  // A comm exists only under a context, and a context only once the state does.
  ProcessState& state = *process_state();
  std::lock_guard<std::mutex> lock(state.mu);
  Context& c = *w->ctx;
  std::lock_guard<std::mutex> lock_ctx(c.mu);
  auto& v = c.*live;
  v.erase(std::remove(v.begin(), v.end(), w), v.end());
  const ConnStats s = w->comm->stats();
  add_stats(&(c.*ctx_closed), s, false);
  add_stats(&(state.*proc_closed), s, false);
  OR_INFO("close %s comm %p (%s): %s", w->magic == kSendMagic ? "send" : "recv",
          static_cast<void*>(w), delivery_name(w->comm->delivery()), conn_stats_text(s).c_str());
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
                  ncclDebugLogger_t logger, int abi,
                  nccl::ncclProfilerCallback_t profiler) noexcept {
  return guarded("init", [&] {
    install_logger(logger);
    set_profiler(profiler);
    if (ctx == nullptr) return misuse("init: ctx is NULL");
    *ctx = nullptr;
    std::shared_ptr<Context> c;
    const int tc = config != nullptr ? config->trafficClass : nccl::NCCL_NET_TRAFFIC_CLASS_UNDEF;
    ProcessState* state = nullptr;
    if (ncclResult_t r = make_context(comm_id, tc, abi, &c, &state); r != nccl::ncclSuccess) {
      return r;
    }
    std::lock_guard<std::mutex> lock(state->mu);
    state->contexts.push_back(c);
    *ctx = c.get();
    return nccl::ncclSuccess;
  });
}

ncclResult_t finalize(void* ctx) noexcept {
  return guarded("finalize", [&] {
    // NCCL finalizes even after a failed init, whose ctx we left NULL.
    if (ctx == nullptr) return nccl::ncclSuccess;
    ProcessState* state = process_state();
    if (state == nullptr) return misuse("finalize: unknown context");
    std::shared_ptr<Context> c;
    {
      std::lock_guard<std::mutex> lock(state->mu);
      if (state->legacy.get() == ctx) return nccl::ncclSuccess;  // released at unload
      auto it = std::find_if(state->contexts.begin(), state->contexts.end(),
                             [&](const auto& p) { return p.get() == ctx; });
      if (it == state->contexts.end()) return misuse("finalize: unknown context");
      c = std::move(*it);
      state->contexts.erase(it);
    }
    // Dropping the last reference outside the lock: the engine's destructor joins its thread.
    c.reset();
    return nccl::ncclSuccess;
  });
}

ncclResult_t init_legacy(ncclDebugLogger_t logger, int abi,
                         nccl::ncclProfilerCallback_t profiler) noexcept {
  return guarded("init", [&] {
    install_logger(logger);
    set_profiler(profiler);
    if (ProcessState* state = process_state(); state != nullptr) {
      std::lock_guard<std::mutex> lock(state->mu);
      if (state->legacy != nullptr) return nccl::ncclSuccess;
    }
    std::shared_ptr<Context> c;
    ProcessState* state = nullptr;
    if (ncclResult_t r = make_context(0, nccl::NCCL_NET_TRAFFIC_CLASS_UNDEF, abi, &c, &state);
        r != nccl::ncclSuccess) {
      return r;
    }
    std::lock_guard<std::mutex> lock(state->mu);
    if (state->legacy == nullptr) state->legacy = std::move(c);
    return nccl::ncclSuccess;
  });
}

void* legacy_context() noexcept {
  // Null once the process exits: the v8..v10 entry point that asked then refuses the call.
  ProcessState* state = alive() ? process_state() : nullptr;
  if (state == nullptr) return nullptr;
  std::lock_guard<std::mutex> lock(state->mu);
  return state->legacy.get();
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

    bool by_class = false;
    const ConnOptions opts = send_conn_options(*c, config, &by_class);

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
    w->dev = dev;
    w->p2p_only = c->p2p_only || by_class;
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
    w->dev = l->dev;
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

namespace {

// Registers with the datapath of the comm's device (verbs: ibv_reg_mr, or the dmabuf when
// `dmabuf_fd` >= 0). A failed registration does not fail NCCL: the handle carries no region and
// sends from the buffer are copied, as over UDP; said once per process.
ncclResult_t register_buffer(const char* what, void* comm, void* data, size_t size, int type,
                             int dmabuf_fd, uint64_t dmabuf_offset, void** mhandle) {
  return guarded(what, [&] {
    if (comm == nullptr || mhandle == nullptr) return misuse("regMr: NULL argument");
    *mhandle = nullptr;
    if (type != nccl::NCCL_PTR_HOST) {
      // ptrSupport says HOST only; NCCL asking for anything else is a contract breach.
      OR_WARN("%s: memory type 0x%x is not supported (host memory only)", what, type);
      return nccl::ncclInternalError;
    }
    CommBase* base = as_send(comm);
    if (base == nullptr) base = as_recv(comm);
    if (base == nullptr) return misuse("regMr: not a send or recv comm");
    const int dev = base->dev;
    // Overlapping registrations of one pool by many comms are normal: each gets its own handle
    // (and, over verbs, its own registration; the device pins the pages once).
    auto h = std::make_unique<MemHandle>();
    h->data = data;
    h->size = size;
    h->type = type;
    if (data != nullptr && size != 0) {
      const Status s =
          base->ctx->engine->register_memory(dev, data, size, &h->region, dmabuf_fd, dmabuf_offset);
      if (!s) {
        static std::atomic<bool> told{false};
        if (!told.exchange(true)) {
          OR_INFO(
              "%s: registering %zu bytes with device %d failed (%s, errno %d): sends from "
              "such buffers are copied (said once per process)",
              what, size, dev, errc_name(s.code()), s.sys_errno());
        }
        h->region.reset();
      }
    }
    *mhandle = h.release();
    return nccl::ncclSuccess;
  });
}

}  // namespace

ncclResult_t reg_mr(void* comm, void* data, size_t size, int type, void** mhandle) noexcept {
  return register_buffer("regMr", comm, data, size, type, -1, 0, mhandle);
}

ncclResult_t reg_mr_dmabuf(void* comm, void* data, size_t size, int type, uint64_t offset, int fd,
                           void** mhandle) noexcept {
  return register_buffer("regMrDmaBuf", comm, data, size, type, fd, offset, mhandle);
}

ncclResult_t dereg_mr(void* /*comm*/, void* mhandle) noexcept {
  return guarded("deregMr", [&] {
    delete static_cast<MemHandle*>(mhandle);  // and with it the registration
    return nccl::ncclSuccess;
  });
}

ncclResult_t isend(void* send_comm, void* data, size_t size, int /*tag*/, void* mhandle,
                   void** request) noexcept {
  return guarded("isend", [&] {
    if (request == nullptr) return misuse("isend: request is NULL");
    *request = nullptr;
    SendWrap* w = as_send(send_comm);
    if (w == nullptr) return misuse("isend: not a send comm");
    if (w->sticky != nccl::ncclSuccess) return w->sticky;
    if (size > kMaxMessageBytes) return misuse("isend: message larger than maxP2pBytes");
    if (data == nullptr && size > 0) return misuse("isend: NULL buffer");
    TransferFacts facts = facts_of(*w->ctx);
    facts.p2p_only = w->p2p_only;
    const MsgDelivery how =
        transfer_delivery(*w->ctx, w->comm->delivery() == Delivery::kBounded, facts, true);
    // The registration, where the datapath made one: the payload leaves from it (zero copy).
    const MemoryRegion* mr =
        mhandle != nullptr ? static_cast<const MemHandle*>(mhandle)->region.get() : nullptr;
    Request* r = nullptr;  // stays null on back-pressure: NCCL retries
    if (Status s = w->comm->isend(data, size, how, mr, &r); !s) return fail(w, s, "isend");
    *request = r;
    return nccl::ncclSuccess;
  });
}

ncclResult_t irecv(void* recv_comm, int n, void** data, size_t* sizes, int* /*tags*/,
                   void** mhandles, void* phandle, void** request) noexcept {
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
    TransferFacts facts = facts_of(*w->ctx);
    facts.ll_sentinel = ll_hint;
    const bool bounded = w->comm->delivery() == Delivery::kBounded;
    const MsgDelivery how = transfer_delivery(*w->ctx, bounded, facts, false);
    // The registration, where the datapath made one: verbs may receive into it in place.
    const MemoryRegion* mr = mhandles != nullptr && mhandles[0] != nullptr
                                 ? static_cast<const MemHandle*>(mhandles[0])->region.get()
                                 : nullptr;
    Request* r = nullptr;
    if (Status s = w->comm->irecv(data[0], sizes[0], how, mr, &r); !s) return fail(w, s, "irecv");
    if (r != nullptr && bounded) {
      w->events.start(r, phandle, w->ctx->comm_id, sizes[0]);
    }
    *request = r;
    return nccl::ncclSuccess;
  });
}

ncclResult_t iflush(void* /*recv_comm*/, int /*n*/, void** /*data*/, int* /*sizes*/,
                    void** /*mhandles*/, void** request) noexcept {
  return guarded("iflush", [&] {
    // Host memory is final once the receive completed: nothing to flush, no request to test.
    if (request == nullptr) return nccl::ncclInternalError;
    *request = nullptr;
    return nccl::ncclSuccess;
  });
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
    if (finished) RecvEvents::finish(static_cast<Request*>(request));
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
    // NCCL calls this on its proxy thread right before posting the transfers it describes, so
    // the next isend/irecv on this context reads it (transfer_kind.h).
    c->attr_op.store(attr->op, std::memory_order_relaxed);
    c->attr_proto.store(attr->proto, std::memory_order_relaxed);
    c->attr_seen.store(true, std::memory_order_relaxed);
    return nccl::ncclSuccess;
  });
}

}  // namespace optireduce::plugin
