// EngineImpl: acquire/release of the process-wide state, listen/connect, the progress thread.
#include "transport/engine.h"

#include <pthread.h>
#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <utility>

#include "transport/fault.h"
#include "transport/idle_sleep.h"
#include "transport/log.h"
#include "transport/progress_thread.h"

namespace optireduce {

namespace {
std::mutex g_engine_mu;
std::weak_ptr<EngineImpl> g_engine;
bool g_quiesced = false;         // guarded by g_engine_mu; see quiesce_engine()
bool g_exit_hook_armed = false;  // guarded by g_engine_mu

void arm_quiesce_at_exit_locked();
}  // namespace

uint64_t random_token() {
  uint64_t t = 0;
  // getrandom never fails for 8 bytes once the pool is initialised; fall back to time-based
  // bits rather than to a constant if it does, since tokens separate connections.
  if (getrandom(&t, sizeof(t), 0) != sizeof(t)) {
    t = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) *
        0x9E3779B97F4A7C15ull;
  }
  return t | 1;  // never 0: a zeroed header must not match
}

Status Engine::acquire(std::shared_ptr<Engine>* out, const Clock* clock, DeviceOpener opener) {
  std::lock_guard<std::mutex> lock(g_engine_mu);
  if (g_quiesced) {
    // A thread started now would outlive quiesce_engine() and run on into destroyed statics.
    OR_WARN("the transport was stopped for the end of the process: no new engine");
    return Status(Errc::kInvalidUsage);
  }
  if (auto e = g_engine.lock()) {
    *out = e;
    return Status::ok();
  }
  std::string err;
  Status st = global_config_status(&err);
  if (!st) {
    OR_WARN("%s", err.c_str());
    return st;
  }
  const Config& cfg = global_config();
  std::vector<std::unique_ptr<Device>> devices;
  st = (opener ? opener : &open_datapath_devices)(cfg, &devices);
  if (!st) return st;
  if (devices.empty()) {
    OR_WARN("no usable network device (%s=%s)", cfg.ifname_var.c_str(), cfg.ifname.c_str());
    return Status(Errc::kSystem);
  }
  auto e = std::make_shared<EngineImpl>(cfg, clock ? *clock : SteadyClock::instance(),
                                        std::move(devices));
  arm_quiesce_at_exit_locked();
  g_engine = e;
  *out = e;
  return Status::ok();
}

EngineImpl::EngineImpl(const Config& cfg, const Clock& clock,
                       std::vector<std::unique_ptr<Device>> devices)
    : cfg_(cfg), clock_(clock), devices_(std::move(devices)),
      registry_(std::make_shared<Registry>()) {
  registry_->set_waker(waker_);
  if (!waker_->usable())
    OR_WARN("eventfd failed (errno %d): the progress thread wakes every %lld us even when idle",
            errno, static_cast<long long>(cfg_.progress_us));
  thread_ = std::thread([this] { progress_loop(); });
  // Named here rather than by the thread itself, so that the name is there when init returns:
  // top -H, perf and gdb tell it from the application's threads, and the tests count the
  // plugin's threads by it (15 characters at most; a failure only leaves the process's name).
  (void)pthread_setname_np(thread_.native_handle(), "optireduce-prog");
}

EngineImpl::~EngineImpl() {
  stop_progress();
}

void EngineImpl::stop_progress() {
  {
    std::lock_guard<std::mutex> lock(thread_mu_);
    stop_ = true;
  }
  thread_cv_.notify_all();
  waker_->wake();
  std::lock_guard<std::mutex> lock(join_mu_);
  if (thread_.joinable()) thread_.join();
}

EndpointOptions EngineImpl::endpoint_options() const {
  EndpointOptions o;
  o.socket_buffer_bytes = static_cast<uint32_t>(cfg_.socket_buffer_bytes);
  o.max_datagram_bytes = static_cast<uint32_t>(cfg_.max_datagram_bytes);
  o.gso = cfg_.udp_gso;
  o.gro = cfg_.udp_gro;
  return o;
}

Status EngineImpl::mux_for(int dev, std::shared_ptr<EndpointMux>* out) {
  const std::thread::id me = std::this_thread::get_id();
  std::lock_guard<std::mutex> lock(muxes_mu_);
  for (const MuxEntry& e : muxes_) {
    if (e.dev != dev || e.thread != me) continue;
    *out = e.mux;
    return Status::ok();
  }
  EndpointOptions opts = endpoint_options();
  opts.unbound = true;
  std::unique_ptr<Endpoint> ep;
  Status st = devices_[dev]->open_endpoint(opts, &ep);
  if (!st) return st;
  *out = std::make_shared<EndpointMux>(std::move(ep), clock_, waker_);
  muxes_.push_back(MuxEntry{dev, me, *out});
  waker_->wake();  // an idle sleep waits on the descriptors it listed, not on this one
  return Status::ok();
}

void EngineImpl::live_muxes(std::vector<std::shared_ptr<EndpointMux>>* out) {
  out->clear();
  const uint64_t now = clock_.now_ns();
  const uint64_t linger_ns = static_cast<uint64_t>(cfg_.peer_timeout_ms) * 1'000'000;
  std::lock_guard<std::mutex> lock(muxes_mu_);
  // Only this list holds a mux whose use count is 1: no port, and no caller between mux_for
  // and open_port (mux_for copies it under muxes_mu_, which is held here), so none can open
  // a port on it once it is dropped.
  std::erase_if(muxes_, [&](const MuxEntry& e) {
    if (e.mux.use_count() != 1) return false;
    const uint64_t since = e.mux->portless_since_ns();
    return since != 0 && now - std::min(now, since) >= linger_ns;
  });
  for (const MuxEntry& e : muxes_) out->push_back(e.mux);
}

Status EngineImpl::open_endpoint(int dev, uint64_t rx_token, std::unique_ptr<Endpoint>* out) {
  Status st;
  if (cfg_.shared_endpoint && devices_[dev]->can_share()) {
    std::shared_ptr<EndpointMux> mux;
    st = mux_for(dev, &mux);
    if (st) st = mux->open_port(rx_token, out);
  } else {
    st = devices_[dev]->open_endpoint(endpoint_options(), out);
  }
  if (!st || !cfg_.fault_enabled()) return st;
  // Each endpoint gets its own stream of faults (seed + index), reproducible for a given
  // OPTIREDUCE_FAULT_SEED and order of connection set-up.
  FaultPlan plan = FaultPlan::from_config(cfg_);
  plan.seed += endpoints_opened_.fetch_add(1);
  *out = make_faulty_endpoint(std::move(*out), plan, clock_);
  return st;
}

Status EngineImpl::listen(int dev, ConnectionHandle* handle, std::unique_ptr<ListenComm>* out,
                          BoundedGroup* group) {
  *out = nullptr;
  if (dev < 0 || dev >= device_count()) return Status(Errc::kInternal);
  const uint64_t token = random_token();
  std::unique_ptr<Endpoint> ep;
  Status st = open_endpoint(dev, token, &ep);
  if (!st) return st;
  *handle = ConnectionHandle();
  handle->token = token;
  handle->addr = ep->local_address();
  handle->datapath = handle->addr.kind;
  *out = std::make_unique<ListenCommImpl>(this, dev, std::move(ep), handle->token, group);
  return Status::ok();
}

Status EngineImpl::register_memory(int dev, void* data, size_t bytes,
                                   std::unique_ptr<MemoryRegion>* out, int dmabuf_fd,
                                   uint64_t dmabuf_offset) {
  out->reset();
  if (dev < 0 || dev >= device_count()) return Status(Errc::kInternal);
  if (dmabuf_fd >= 0)
    return devices_[dev]->register_dmabuf(data, bytes, dmabuf_offset, dmabuf_fd, out);
  return devices_[dev]->register_memory(data, bytes, out);
}

std::shared_ptr<Path> EngineImpl::path_to(int dev, const Endpoint& ep, uint32_t pkt_payload) {
  const double ceiling = cfg_.rate_gbps / 8.0;  // Gbit/s to bytes per ns
  const std::string host = ep.peer_host();
  if (host.empty())
    return std::make_shared<Path>(make_default_controller(pkt_payload), pkt_payload, ceiling);
  return paths_.get(std::to_string(dev), host, pkt_payload, ceiling);
}

Status EngineImpl::connect(int dev, const ConnectionHandle& handle, const ConnOptions& opts,
                           void** state, std::unique_ptr<SendComm>* out) {
  *out = nullptr;
  if (dev < 0 || dev >= device_count()) return Status(Errc::kInternal);
  if (handle.magic != ConnectionHandle::kMagic || handle.version != 1 || handle.addr.empty()) {
    OR_WARN("connect: the handle is not an OptiReduce handle (magic %08x)", handle.magic);
    return Status(Errc::kInternal);
  }
  PendingConnect* pc = static_cast<PendingConnect*>(*state);
  if (pc == nullptr) {
    std::unique_ptr<Endpoint> ep;
    Status st = open_endpoint(dev, reply_token(handle.token), &ep);
    if (!st) return st;
    st = ep->set_peer(handle.addr);
    if (!st) return st;
    auto owned = std::make_unique<PendingConnect>(dev, std::move(ep), handle, opts);
    pc = owned.get();
    std::lock_guard<std::mutex> lock(pending_mu_);
    pending_.push_back(std::move(owned));
    *state = pc;
  }
  Status st = pc->poll(this, out);
  if (*out != nullptr || !st) {
    std::lock_guard<std::mutex> lock(pending_mu_);
    for (auto it = pending_.begin(); it != pending_.end(); ++it) {
      if (it->get() == pc) {
        pending_.erase(it);
        break;
      }
    }
    *state = nullptr;
  }
  return st;
}

void EngineImpl::progress_loop() {
  const uint64_t period_ns = static_cast<uint64_t>(cfg_.progress_us) * 1000;
  const uint64_t idle_ns = period_ns / 2;
  // Shortest sleep: a timer that is due but whose connection its owner holds right now is
  // served by that owner; waking again at once would spin.
  constexpr uint64_t kMinSleepNs = 20'000;
  mark_progress_thread();
  uint64_t next = 0;  // the earliest timer as of the last pass
  bool quick_wake = false;
  std::vector<std::shared_ptr<EndpointMux>> muxes;
  while (!stop_) {
    // Nothing armed: block on the shared endpoints until a datagram comes that nobody else
    // takes, or someone arms a timer (idle_sleep.h), instead of waking every period. An idle
    // sleep that ended at once is followed by a timed one: a descriptor that the pass after it
    // did not empty (a drain cut short) would otherwise spin the thread.
    IdleSleep idle = IdleSleep::kNotIdle;
    if (next == 0 && !std::exchange(quick_wake, false)) {
      ProgressWaker::Sleep sleep(*waker_);
      live_muxes(&muxes);
      const auto t0 = std::chrono::steady_clock::now();
      idle = idle_sleep(muxes, *registry_, *waker_, clock_.now_ns(), kIdleSleepNs, stop_);
      quick_wake = idle == IdleSleep::kWoke &&
                   std::chrono::steady_clock::now() - t0 < std::chrono::nanoseconds(kMinSleepNs);
    }
    if (idle == IdleSleep::kNotIdle) {
      // Else a whole period when nothing is armed (a caller polls, and the thread stands in
      // for it within a period should it stop), or until the earliest armed timer, so that a
      // connection nobody polls still meets a timer of tens of microseconds (a lost CTS or
      // tail on a fast fabric). A timer armed during the sleep waits for the next wake-up, at
      // most one period.
      const uint64_t now = clock_.now_ns();
      uint64_t sleep_ns = period_ns;
      if (next != 0) sleep_ns = std::clamp(next > now ? next - now : 0, kMinSleepNs, period_ns);
      std::unique_lock<std::mutex> lock(thread_mu_);
      thread_cv_.wait_for(lock, std::chrono::nanoseconds(sleep_ns),
                          [this] { return stop_.load(); });
    }
    if (stop_) break;
    // Shared endpoints first: what waits there goes to its connections, so that only those
    // with a due timer (or datagrams kept while they were busy) need a visit below.
    live_muxes(&muxes);
    for (const auto& mux : muxes) mux->serve();
    muxes.clear();  // the list alone holds a mux whose last port closed: live_muxes ends it
    const uint64_t t = clock_.now_ns();
    next = registry_->visit(t, [&](Conn* c) { c->background_progress(t, idle_ns); });
  }
}

// ---------------------------------------------------------------------------------------------
// The end of the process (issue 10). A program may return from main, or call exit() on any
// thread, with comms still open (liboptireduce's communicators, NCCL's). The progress thread
// would then run on while exit() destroys the statics it reads (SteadyClock::instance(): a call
// through the destroyed clock aborted with "pure virtual method called"), so an atexit handler
// stops it first. Nothing is freed at exit: other threads may still be inside the transport,
// and the OS takes the memory back.

void quiesce_engine() {
  std::shared_ptr<EngineImpl> e;
  {
    std::lock_guard<std::mutex> lock(g_engine_mu);
    g_quiesced = true;
    e = g_engine.lock();
  }
  // Joined outside g_engine_mu: a join lasts up to a progress round, acquire() must not wait.
  if (e != nullptr) e->stop_progress();
}

namespace {

void quiesce_at_exit() {
  quiesce_engine();
}

// Handlers run in the reverse order of registration, at exit() and, for those registered from a
// shared library, when it is unloaded too (atexit from a DSO registers with the DSO's handle).
// Armed after the first engine is built: SteadyClock::instance() and every static the device
// discovery created exist by then, so they are destroyed after the thread has stopped.
void arm_quiesce_at_exit_locked() {
  if (g_exit_hook_armed) return;
  (void)SteadyClock::instance();  // built before arming, whichever clock this engine uses
  if (std::atexit(quiesce_at_exit) != 0) {
    OR_WARN("atexit failed: the progress thread may run on while the process exits");
    return;
  }
  g_exit_hook_armed = true;
}

}  // namespace

}  // namespace optireduce
