// A process that uses the plugin and then ends, one way per case (issue 10): run by
// tests/plugin/exit_test.cc in a child process, which checks that it exits 0 and that no
// sanitizer or allocator complaint reaches stderr. Plain on purpose: it links nothing but libdl
// and pthread and keeps no C++ statics of its own, so that what runs at exit is the plugin's.
//
//   exit_driver CASE PLUGIN_PATH
//
// Everything NCCL would keep (the library handle, comms, buffers) lives in globals, as it does
// in NCCL's heap reachable from its globals: LeakSanitizer then reports only what the plugin
// really lost. Both ends of each connection live in this process, on loopback.
#include <dlfcn.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "plugin/nccl/net_v11.h"
#include "plugin/nccl/net_v8.h"

namespace {

using namespace optireduce::nccl;  // NOLINT: the ABI's own type names read best unqualified

#define DCHECK(cond, ...)                                                          \
  do {                                                                             \
    if (!(cond)) {                                                                 \
      std::fprintf(stderr, "exit_driver:%d: check failed: %s: ", __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                           \
      std::fputc('\n', stderr);                                                    \
      _exit(2);                                                                    \
    }                                                                              \
  } while (0)
#define DCHECK_OK(expr)                                                   \
  do {                                                                    \
    const int dcheck_r_ = static_cast<int>(expr);                         \
    DCHECK(dcheck_r_ == ncclSuccess, "%s returned %d", #expr, dcheck_r_); \
  } while (0)

constexpr size_t kSmall = size_t{1} << 20;     // one completed transfer
constexpr size_t kInFlight = size_t{8} << 20;  // left in flight: the progress thread is busy
constexpr int kSpinLimit = 20'000'000;         // a hang ends in alarm() long before this

void* g_lib = nullptr;
const ncclNet_v11_t* g_v11 = nullptr;
const ncclNet_v8_t* g_v8 = nullptr;
void* g_ctx = nullptr;
void* g_listen = nullptr;
void* g_send = nullptr;
void* g_recv = nullptr;
unsigned char* g_send_buf = nullptr;
unsigned char* g_recv_buf = nullptr;

// NCCL's logger, minus NCCL: warnings to stderr (where the parent looks), the rest dropped.
void logger(ncclDebugLogLevel level, unsigned long /*flags*/, const char* /*file*/, int /*line*/,
            const char* fmt, ...) {
  if (level != NCCL_LOG_WARN) return;
  va_list ap;
  va_start(ap, fmt);
  std::fputs("exit_driver: plugin WARN ", stderr);
  std::vfprintf(stderr, fmt, ap);
  std::fputc('\n', stderr);
  va_end(ap);
}

void load(const char* path, int version) {
  g_lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  DCHECK(g_lib != nullptr, "dlopen %s: %s", path, dlerror());
  if (version == 11) {
    g_v11 = static_cast<const ncclNet_v11_t*>(dlsym(g_lib, "ncclNetPlugin_v11"));
    DCHECK(g_v11 != nullptr, "no ncclNetPlugin_v11");
    ncclNetCommConfig_v11_t config{NCCL_NET_TRAFFIC_CLASS_UNDEF};
    DCHECK_OK(g_v11->init(&g_ctx, 0x1234, &config, logger, nullptr));
  } else {
    g_v8 = static_cast<const ncclNet_v8_t*>(dlsym(g_lib, "ncclNetPlugin_v8"));
    DCHECK(g_v8 != nullptr, "no ncclNetPlugin_v8");
    DCHECK_OK(g_v8->init(logger));
  }
  int ndev = 0;
  DCHECK_OK(g_v11 != nullptr ? g_v11->devices(&ndev) : g_v8->devices(&ndev));
  DCHECK(ndev >= 1, "%d devices", ndev);
}

// Listen, then drive connect and accept together until both ends exist (NCCL does the same
// across two processes; here both are ours).
void connect_pair() {
  unsigned char handle[NCCL_NET_HANDLE_MAXSIZE] = {};
  if (g_v11 != nullptr) {
    DCHECK_OK(g_v11->listen(g_ctx, 0, handle, &g_listen));
  } else {
    DCHECK_OK(g_v8->listen(0, handle, &g_listen));
  }
  for (int i = 0; g_send == nullptr || g_recv == nullptr; ++i) {
    DCHECK(i < kSpinLimit, "connect/accept never finished");
    if (g_send == nullptr) {
      DCHECK_OK(g_v11 != nullptr ? g_v11->connect(g_ctx, 0, handle, &g_send, nullptr)
                                 : g_v8->connect(0, handle, &g_send, nullptr));
    }
    if (g_recv == nullptr) {
      DCHECK_OK(g_v11 != nullptr ? g_v11->accept(g_listen, &g_recv, nullptr)
                                 : g_v8->accept(g_listen, &g_recv, nullptr));
    }
  }
  g_send_buf = static_cast<unsigned char*>(std::malloc(kInFlight));
  g_recv_buf = static_cast<unsigned char*>(std::malloc(kInFlight));
  DCHECK(g_send_buf != nullptr && g_recv_buf != nullptr, "out of memory");
  for (size_t i = 0; i < kInFlight; ++i) g_send_buf[i] = static_cast<unsigned char>(i * 131 + 7);
}

// Posts one message each way; retries while the plugin answers "not now" (a null request).
void post(size_t size, void** sreq, void** rreq) {
  *sreq = nullptr;
  *rreq = nullptr;
  for (int i = 0; *sreq == nullptr || *rreq == nullptr; ++i) {
    DCHECK(i < kSpinLimit, "isend/irecv never accepted");
    if (*rreq == nullptr) {
      void* data[1] = {g_recv_buf};
      int tags[1] = {0};
      void* mh[1] = {nullptr};
      if (g_v11 != nullptr) {
        size_t sizes[1] = {size};
        void* ph[1] = {nullptr};
        DCHECK_OK(g_v11->irecv(g_recv, 1, data, sizes, tags, mh, ph, rreq));
      } else {
        int sizes[1] = {static_cast<int>(size)};
        DCHECK_OK(g_v8->irecv(g_recv, 1, data, sizes, tags, mh, rreq));
      }
    }
    if (*sreq == nullptr) {
      DCHECK_OK(g_v11 != nullptr
                    ? g_v11->isend(g_send, g_send_buf, size, 0, nullptr, nullptr, sreq)
                    : g_v8->isend(g_send, g_send_buf, static_cast<int>(size), 0, nullptr, sreq));
    }
  }
}

// One message, tested to completion and checked byte for byte.
void transfer(size_t size) {
  void* sreq = nullptr;
  void* rreq = nullptr;
  std::memset(g_recv_buf, 0, size);
  post(size, &sreq, &rreq);
  int sdone = 0;
  int rdone = 0;
  int got = -1;
  for (int i = 0; !sdone || !rdone; ++i) {
    DCHECK(i < kSpinLimit, "transfer never completed");
    int unused = 0;
    if (!sdone)
      DCHECK_OK(g_v11 != nullptr ? g_v11->test(sreq, &sdone, &unused)
                                 : g_v8->test(sreq, &sdone, &unused));
    if (!rdone)
      DCHECK_OK(g_v11 != nullptr ? g_v11->test(rreq, &rdone, &got)
                                 : g_v8->test(rreq, &rdone, &got));
    if (!sdone || !rdone) std::this_thread::yield();
  }
  DCHECK(got == static_cast<int>(size), "received %d bytes of %zu", got, size);
  DCHECK(std::memcmp(g_send_buf, g_recv_buf, size) == 0, "received bytes differ");
}

void close_comms() {
  DCHECK_OK(g_v11 != nullptr ? g_v11->closeSend(g_send) : g_v8->closeSend(g_send));
  DCHECK_OK(g_v11 != nullptr ? g_v11->closeRecv(g_recv) : g_v8->closeRecv(g_recv));
  DCHECK_OK(g_v11 != nullptr ? g_v11->closeListen(g_listen) : g_v8->closeListen(g_listen));
  g_send = g_recv = g_listen = nullptr;
  std::free(g_send_buf);
  std::free(g_recv_buf);
  g_send_buf = g_recv_buf = nullptr;
}

void finalize() {
  DCHECK_OK(g_v11->finalize(g_ctx));
  g_ctx = nullptr;
}

void unload() {
  DCHECK(dlclose(g_lib) == 0, "dlclose: %s", dlerror());
  g_lib = nullptr;
  g_v11 = nullptr;
  g_v8 = nullptr;
}

// What the parent looks for: the case ran to its end, its exit path is all that is left.
void reached(const char* name) {
  std::fprintf(stderr, "exit_driver: %s: leaving\n", name);
  std::fflush(stderr);
}

int run(const char* name, const char* path) {
  const bool v8 = std::strcmp(name, "v8_exit") == 0;
  load(path, v8 ? 8 : 11);
  connect_pair();
  transfer(kSmall);

  if (std::strcmp(name, "finalize_exit") == 0) {
    // The common end of a training program: everything closed and finalized, no dlclose.
    close_comms();
    finalize();
  } else if (std::strcmp(name, "open_exit") == 0) {
    // NCCL never got to clean up: comms open, a message each way posted and never tested.
    void* sreq = nullptr;
    void* rreq = nullptr;
    post(kInFlight, &sreq, &rreq);
  } else if (std::strcmp(name, "thread_exit") == 0) {
    // exit() from another thread while this one waits and the progress thread moves data.
    void* sreq = nullptr;
    void* rreq = nullptr;
    post(kInFlight, &sreq, &rreq);
    reached(name);
    std::thread t([] {
      usleep(20'000);
      std::exit(0);
    });
    t.join();
    DCHECK(false, "exit() on the other thread returned to main");
  } else if (std::strcmp(name, "dlclose_exit") == 0) {
    close_comms();
    finalize();
    unload();
  } else if (std::strcmp(name, "dlclose_open_ctx_exit") == 0) {
    // The context is never finalized: the unload releases it.
    close_comms();
    unload();
  } else if (std::strcmp(name, "dlclose_open_comms_exit") == 0) {
    // Unloaded under open comms with data in flight: the unload must stop the engine's thread
    // before the code goes away (its memory stays, reachable from the comms we still hold).
    void* sreq = nullptr;
    void* rreq = nullptr;
    post(kInFlight, &sreq, &rreq);
    unload();
    usleep(20'000);  // a thread left running in the unmapped code would crash in here
  } else if (std::strcmp(name, "v8_exit") == 0) {
    // v8..v10 have no finalize: NCCL closes its comms and the process ends.
    close_comms();
  } else if (std::strcmp(name, "quick_exit") == 0) {
    void* sreq = nullptr;
    void* rreq = nullptr;
    post(kInFlight, &sreq, &rreq);
    reached(name);
    std::quick_exit(0);
  } else {
    DCHECK(false, "unknown case '%s'", name);
  }
  reached(name);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s CASE PLUGIN_PATH\n", argv[0]);
    return 2;
  }
  alarm(60);  // a hang at exit ends in SIGALRM, which the parent reports
  return run(argv[1], argv[2]);
}
