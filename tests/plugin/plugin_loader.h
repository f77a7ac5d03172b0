// A version-neutral view of the plugin's exported tables, loaded exactly as NCCL loads them:
// dlopen(RTLD_NOW | RTLD_LOCAL) then dlsym("ncclNetPlugin_vN"). Shared by the plugin harness
// (tests/plugin/) and the point-to-point benchmark (bench/).
#pragma once

#include <dlfcn.h>
#include <unistd.h>

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "plugin/nccl/net_v10.h"
#include "plugin/nccl/net_v11.h"
#include "plugin/nccl/net_v12.h"
#include "plugin/nccl/net_v8.h"
#include "plugin/nccl/net_v9.h"
#include "plugin/optireduce_net.h"

namespace optireduce::testing {

using nccl::ncclResult_t;

// ---- A logger like NCCL's: counts warnings and keeps the lines for assertions.
struct LogCapture {
  std::mutex mu;
  std::vector<std::string> lines;  // "LEVEL message"
  std::atomic<int> warns{0};
  bool verbose = std::getenv("HARNESS_VERBOSE") != nullptr;

  bool contains(const char* needle) {
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& l : lines) {
      if (l.find(needle) != std::string::npos) return true;
    }
    return false;
  }
  // True if one line holds both strings.
  bool contains_line(const char* a, const char* b) {
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& l : lines) {
      if (l.find(a) != std::string::npos && l.find(b) != std::string::npos) return true;
    }
    return false;
  }
};
inline LogCapture& log_capture() {
  static LogCapture c;
  return c;
}

inline void capture_logger(nccl::ncclDebugLogLevel level, unsigned long /*flags*/,
                           const char* /*file*/, int /*line*/, const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  LogCapture& c = log_capture();
  const char* tag = level == nccl::NCCL_LOG_WARN   ? "WARN"
                    : level == nccl::NCCL_LOG_INFO ? "INFO"
                                                   : "LOG";
  if (level == nccl::NCCL_LOG_WARN) c.warns.fetch_add(1);
  if (level == nccl::NCCL_LOG_WARN || c.verbose)
    std::fprintf(stderr, "[%d] %s %s\n", getpid(), tag, buf);
  std::lock_guard<std::mutex> lock(c.mu);
  c.lines.push_back(std::string(tag) + " " + buf);
}

// The properties every version reports, in one shape.
struct NetProps {
  std::string name;
  bool has_pci_path = false;
  uint64_t guid = 0;
  int ptr_support = 0;
  int speed = 0;
  int max_comms = 0;
  int max_recvs = 0;
  int net_device_type = -1;
  size_t max_p2p_bytes = 0;  // 0 where the version has no such field
  size_t max_coll_bytes = 0;
  int max_multi_request_size = 0;
  int vprops_ndevs = 0;
  int rail_id = 0;  // v12 only; NCCL_NET_ID_UNDEF is -1
  int plane_id = 0;
};

class NetApi {
 public:
  virtual ~NetApi() {
    if (lib_ != nullptr) dlclose(lib_);
  }
  int version() const { return version_; }
  void* library() const { return lib_; }
  const void* raw_table() const { return table_; }

  // v11, v12: a context per communicator. v8..v10: the first call runs the process-wide init; the
  // returned ctx is a harness object that remembers the traffic class for v10's connect.
  virtual ncclResult_t init(void** ctx, uint64_t comm_id, int traffic_class) = 0;
  virtual ncclResult_t finalize(void* ctx) = 0;  // v8..v10: harness object freed only
  virtual ncclResult_t devices(int* n) = 0;
  virtual ncclResult_t properties(int dev, NetProps* p) = 0;
  virtual ncclResult_t listen(void* ctx, int dev, void* handle, void** listen_comm) = 0;
  virtual ncclResult_t connect(void* ctx, int dev, void* handle, void** send_comm) = 0;
  virtual ncclResult_t accept(void* listen_comm, void** recv_comm) = 0;
  virtual ncclResult_t reg_mr(void* comm, void* data, size_t size, int type, void** mh) = 0;
  virtual ncclResult_t dereg_mr(void* comm, void* mh) = 0;
  virtual ncclResult_t isend(void* comm, void* data, size_t size, int tag, void* mh,
                             void** req) = 0;
  virtual ncclResult_t irecv(void* comm, void* data, size_t size, int tag, void* mh,
                             void** req) = 0;
  virtual ncclResult_t iflush(void* comm, void* data, int size, void* mh, void** req) = 0;
  virtual ncclResult_t test(void* req, int* done, int* size) = 0;
  virtual ncclResult_t close_send(void* comm) = 0;
  virtual ncclResult_t close_recv(void* comm) = 0;
  virtual ncclResult_t close_listen(void* comm) = 0;

  // v11+: what NCCL tells the context right before posting an operation's transfers (`op` and
  // `proto` are NCCL's bit masks). Older tables have no such call: nothing is told.
  ncclResult_t set_net_attr(void* ctx, uint32_t op, uint32_t proto) const {
    if (version_ < 11) return nccl::ncclSuccess;
    nccl::ncclNetAttr_v11_t attr{};
    attr.op = op;
    attr.proto = proto;
    if (version_ >= 12) {
      return static_cast<const nccl::ncclNet_v12_t*>(table_)->setNetAttr(ctx, &attr);
    }
    return static_cast<const nccl::ncclNet_v11_t*>(table_)->setNetAttr(ctx, &attr);
  }
  // The id optireduceNetGetStats knows a communicator by: init's comm id from v11 on; the
  // legacy tables carry none, so their shared context is 0.
  uint64_t stats_id(uint64_t comm_id) const { return version_ >= 11 ? comm_id : 0; }

  // What v10+ init is given as NCCL's profiler callback, and what v10+ irecv passes as the
  // receive's profiler handle (NCCL: its proxy step's). Null by default, as without a profiler.
  nccl::ncclProfilerCallback_t profiler = nullptr;
  void* phandle = nullptr;

  // The C query API, found with dlsym in the same library (as another library would).
  int get_stats(uint64_t comm_id, optireduceNetStats* out) const {
    using Fn = int (*)(uint64_t, optireduceNetStats*);
    auto fn = reinterpret_cast<Fn>(dlsym(lib_, "optireduceNetGetStats"));
    return fn != nullptr ? fn(comm_id, out) : -100;
  }

  // Loads `path` and picks table `version` (8..12); nullptr and *error on failure.
  static std::unique_ptr<NetApi> load(const std::string& path, int version, std::string* error);

 protected:
  void* lib_ = nullptr;
  const void* table_ = nullptr;
  int version_ = 0;
};

namespace detail {

struct LegacyCtx {
  int traffic_class;
};

template <typename T>
struct VersionOf;
template <>
struct VersionOf<nccl::ncclNet_v12_t> {
  static constexpr int kValue = 12;
};
template <>
struct VersionOf<nccl::ncclNet_v11_t> {
  static constexpr int kValue = 11;
};
template <>
struct VersionOf<nccl::ncclNet_v10_t> {
  static constexpr int kValue = 10;
};
template <>
struct VersionOf<nccl::ncclNet_v9_t> {
  static constexpr int kValue = 9;
};
template <>
struct VersionOf<nccl::ncclNet_v8_t> {
  static constexpr int kValue = 8;
};

template <typename T>
class NetApiOf final : public NetApi {
  static constexpr int V = VersionOf<T>::kValue;
  // From v11 on, init takes the communicator's id and config and returns its context.
  static constexpr bool kContexts = V >= 11;

 public:
  NetApiOf(void* lib, const T* t) : t_(t) {
    lib_ = lib;
    table_ = t;
    version_ = V;
  }

  ncclResult_t init(void** ctx, uint64_t comm_id, int traffic_class) override {
    if constexpr (kContexts) {
      nccl::ncclNetCommConfig_v11_t config{traffic_class};
      return t_->init(ctx, comm_id, &config, capture_logger, profiler);
    } else {
      ncclResult_t r;
      if constexpr (V == 10) {
        r = t_->init(capture_logger, profiler);
      } else {
        r = t_->init(capture_logger);
      }
      *ctx = r == nccl::ncclSuccess ? new LegacyCtx{traffic_class} : nullptr;
      return r;
    }
  }
  ncclResult_t finalize(void* ctx) override {
    if constexpr (kContexts) {
      return t_->finalize(ctx);
    } else {
      delete static_cast<LegacyCtx*>(ctx);
      return nccl::ncclSuccess;
    }
  }
  ncclResult_t devices(int* n) override { return t_->devices(n); }
  ncclResult_t properties(int dev, NetProps* p) override {
    if constexpr (V == 8) {
      nccl::ncclNetProperties_v8_t q{};
      ncclResult_t r = t_->getProperties(dev, &q);
      copy_common(q, p);
      return r;
    } else if constexpr (V == 12) {
      nccl::ncclNetProperties_v12_t q{};
      ncclResult_t r = t_->getProperties(dev, &q);
      copy_common(q, p);
      p->max_p2p_bytes = q.maxP2pBytes;
      p->max_coll_bytes = q.maxCollBytes;
      p->max_multi_request_size = q.maxMultiRequestSize;
      p->vprops_ndevs = q.vProps.ndevs;
      p->rail_id = q.railId;
      p->plane_id = q.planeId;
      return r;
    } else if constexpr (V == 11) {
      nccl::ncclNetProperties_v11_t q{};
      ncclResult_t r = t_->getProperties(dev, &q);
      copy_common(q, p);
      p->max_p2p_bytes = q.maxP2pBytes;
      p->max_coll_bytes = q.maxCollBytes;
      p->max_multi_request_size = q.maxMultiRequestSize;
      p->vprops_ndevs = q.vProps.ndevs;
      return r;
    } else {
      nccl::ncclNetProperties_v10_t q{};
      ncclResult_t r = t_->getProperties(dev, &q);
      copy_common(q, p);
      p->max_p2p_bytes = q.maxP2pBytes;
      p->max_coll_bytes = q.maxCollBytes;
      p->vprops_ndevs = q.vProps.ndevs;
      return r;
    }
  }
  ncclResult_t listen(void* ctx, int dev, void* handle, void** lc) override {
    if constexpr (kContexts) {
      return t_->listen(ctx, dev, handle, lc);
    } else {
      return t_->listen(dev, handle, lc);
    }
  }
  ncclResult_t connect(void* ctx, int dev, void* handle, void** sc) override {
    if constexpr (kContexts) {
      return t_->connect(ctx, dev, handle, sc, nullptr);
    } else if constexpr (V == 10) {
      nccl::ncclNetCommConfig_v10_t config{static_cast<LegacyCtx*>(ctx)->traffic_class};
      return t_->connect(dev, &config, handle, sc, nullptr);
    } else {
      return t_->connect(dev, handle, sc, nullptr);
    }
  }
  ncclResult_t accept(void* lc, void** rc) override { return t_->accept(lc, rc, nullptr); }
  ncclResult_t reg_mr(void* comm, void* data, size_t size, int type, void** mh) override {
    return t_->regMr(comm, data, size, type, mh);
  }
  ncclResult_t dereg_mr(void* comm, void* mh) override { return t_->deregMr(comm, mh); }
  ncclResult_t isend(void* comm, void* data, size_t size, int tag, void* mh, void** req) override {
    if constexpr (V >= 10) {
      return t_->isend(comm, data, size, tag, mh, nullptr, req);
    } else if constexpr (V == 9) {
      return t_->isend(comm, data, size, tag, mh, req);
    } else {
      return t_->isend(comm, data, static_cast<int>(size), tag, mh, req);
    }
  }
  ncclResult_t irecv(void* comm, void* data, size_t size, int tag, void* mh, void** req) override {
    void* datas[1] = {data};
    int tags[1] = {tag};
    void* mhs[1] = {mh};
    if constexpr (V >= 10) {
      size_t sizes[1] = {size};
      void* phandles[1] = {phandle};
      return t_->irecv(comm, 1, datas, sizes, tags, mhs, phandles, req);
    } else if constexpr (V == 9) {
      size_t sizes[1] = {size};
      return t_->irecv(comm, 1, datas, sizes, tags, mhs, req);
    } else {
      int sizes[1] = {static_cast<int>(size)};
      return t_->irecv(comm, 1, datas, sizes, tags, mhs, req);
    }
  }
  ncclResult_t iflush(void* comm, void* data, int size, void* mh, void** req) override {
    void* datas[1] = {data};
    int sizes[1] = {size};
    void* mhs[1] = {mh};
    return t_->iflush(comm, 1, datas, sizes, mhs, req);
  }
  ncclResult_t test(void* req, int* done, int* size) override { return t_->test(req, done, size); }
  ncclResult_t close_send(void* c) override { return t_->closeSend(c); }
  ncclResult_t close_recv(void* c) override { return t_->closeRecv(c); }
  ncclResult_t close_listen(void* c) override { return t_->closeListen(c); }

 private:
  template <typename P>
  static void copy_common(const P& q, NetProps* p) {
    p->name = q.name != nullptr ? q.name : "";
    p->has_pci_path = q.pciPath != nullptr;
    p->guid = q.guid;
    p->ptr_support = q.ptrSupport;
    p->speed = q.speed;
    p->max_comms = q.maxComms;
    p->max_recvs = q.maxRecvs;
    p->net_device_type = q.netDeviceType;
  }

  const T* t_;
};

}  // namespace detail

inline std::unique_ptr<NetApi> NetApi::load(const std::string& path, int version,
                                            std::string* error) {
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    *error = std::string("dlopen: ") + dlerror();
    return nullptr;
  }
  const std::string sym = "ncclNetPlugin_v" + std::to_string(version);
  void* t = dlsym(lib, sym.c_str());
  if (t == nullptr) {
    *error = "dlsym(" + sym + ") failed";
    dlclose(lib);
    return nullptr;
  }
  switch (version) {
    case 12:
      return std::make_unique<detail::NetApiOf<nccl::ncclNet_v12_t>>(
          lib, static_cast<const nccl::ncclNet_v12_t*>(t));
    case 11:
      return std::make_unique<detail::NetApiOf<nccl::ncclNet_v11_t>>(
          lib, static_cast<const nccl::ncclNet_v11_t*>(t));
    case 10:
      return std::make_unique<detail::NetApiOf<nccl::ncclNet_v10_t>>(
          lib, static_cast<const nccl::ncclNet_v10_t*>(t));
    case 9:
      return std::make_unique<detail::NetApiOf<nccl::ncclNet_v9_t>>(
          lib, static_cast<const nccl::ncclNet_v9_t*>(t));
    case 8:
      return std::make_unique<detail::NetApiOf<nccl::ncclNet_v8_t>>(
          lib, static_cast<const nccl::ncclNet_v8_t*>(t));
    default:
      break;
  }
  dlclose(lib);
  *error = "unknown version " + std::to_string(version);
  return nullptr;
}

}  // namespace optireduce::testing
