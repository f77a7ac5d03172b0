// Two-process scaffolding for driving the plugin as two NCCL ranks would: fork before any
// dlopen, a socketpair for out-of-band handle exchange, alarm()-bounded children, fail-fast
// checks that end the child, and the byte pattern every transfer is checked against.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "tests/sanitized.h"

namespace optireduce::testing {

// The longest message a failed check reports (longer ones are cut).
inline constexpr size_t kCheckMessageBytes = 512;

// The write end of the pipe through which a child's failed check also reaches the parent
// (-1: none, outside run_pair/run_ranks), so that what those return names the check and not
// only an exit status: a CI log cut for length may have lost the child's stderr.
inline int& hcheck_report_fd() {
  static int fd = -1;
  return fd;
}

// In a child: tells the parent that a check failed, and what it said (cut at
// kCheckMessageBytes). The first report of a child is the one the parent reads.
inline void hcheck_report(const char* why) {
  if (hcheck_report_fd() < 0) return;
  // One write, so the parent reads it whole: when the check failed, then what it said.
  char msg[sizeof(int64_t) + kCheckMessageBytes];
  const int64_t t = std::chrono::steady_clock::now().time_since_epoch().count();
  std::memcpy(msg, &t, sizeof(t));
  const size_t len = std::min(std::strlen(why), kCheckMessageBytes);
  std::memcpy(msg + sizeof(t), why, len);
  const ssize_t w = ::write(hcheck_report_fd(), msg, sizeof(t) + len);
  (void)w;  // the parent then reports the exit status alone
}

// A failed check's message, "FILE:LINE: check failed: COND: what fmt says", into `why` (cut at
// its kCheckMessageBytes); returns its length.
inline size_t format_check(char (&why)[kCheckMessageBytes], const char* file, int line,
                           const char* cond, const char* fmt, va_list ap) {
  constexpr int kLast = static_cast<int>(kCheckMessageBytes) - 1;
  int n = std::snprintf(why, sizeof(why), "%s:%d: check failed: %s: ", file, line, cond);
  n = std::clamp(n, 0, kLast);
  const int m = std::vsnprintf(why + n, sizeof(why) - static_cast<size_t>(n), fmt, ap);
  return static_cast<size_t>(std::clamp(n + std::max(m, 0), 0, kLast));
}

// In a child: print where and why, then leave at once (no destructors: the other child may be
// blocked on us, and the parent reports the exit status and this message).
[[noreturn]] __attribute__((format(printf, 4, 5))) inline void hcheck_fail(const char* file,
                                                                           int line,
                                                                           const char* cond,
                                                                           const char* fmt, ...) {
  char why[kCheckMessageBytes];
  va_list ap;
  va_start(ap, fmt);
  format_check(why, file, line, cond, fmt, ap);
  va_end(ap);
  std::fprintf(stderr, "[%d] %s\n", getpid(), why);
  std::fflush(stderr);
  hcheck_report(why);
  _exit(1);
}
#define HCHECK(cond, ...)                                                                    \
  do {                                                                                       \
    if (!(cond)) ::optireduce::testing::hcheck_fail(__FILE__, __LINE__, #cond, __VA_ARGS__); \
  } while (0)
#define HCHECK_OK(expr)                                                      \
  do {                                                                       \
    const int hcheck_r_ = static_cast<int>(expr);                            \
    HCHECK(hcheck_r_ == 0, "%s returned ncclResult_t %d", #expr, hcheck_r_); \
  } while (0)

// The out-of-band channel between the two ranks (NCCL uses its bootstrap network for this).
class Channel {
 public:
  explicit Channel(int fd) : fd_(fd) {}
  void send_bytes(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    while (n > 0) {
      ssize_t k = ::send(fd_, b, n, MSG_NOSIGNAL);
      if (k < 0 && errno == EINTR) continue;
      HCHECK(k > 0, "channel send: %s", std::strerror(errno));
      b += k;
      n -= static_cast<size_t>(k);
    }
  }
  void recv_bytes(void* p, size_t n) {
    auto* b = static_cast<uint8_t*>(p);
    while (n > 0) {
      ssize_t k = ::recv(fd_, b, n, 0);
      if (k < 0 && errno == EINTR) continue;
      HCHECK(k > 0, "channel recv: %s", k == 0 ? "peer exited" : std::strerror(errno));
      b += k;
      n -= static_cast<size_t>(k);
    }
  }
  template <typename T>
  void send(const T& v) {
    send_bytes(&v, sizeof(v));
  }
  template <typename T>
  T recv() {
    T v;
    recv_bytes(&v, sizeof(v));
    return v;
  }
  // Both sides call it; returns once both reached it.
  void barrier() {
    send<uint32_t>(0xBA77);
    HCHECK(recv<uint32_t>() == 0xBA77, "barrier out of step");
  }

 private:
  int fd_;
};

using Env = std::vector<std::pair<std::string, std::string>>;

// One pipe per child, through which its failed check (hcheck_fail) reaches the parent.
class CheckReports {
 public:
  explicit CheckReports(int n) : fds_(static_cast<size_t>(n), {-1, -1}) {
    for (auto& p : fds_) {
      if (pipe(p.data()) != 0) p = {-1, -1};
      if (p[0] >= 0) fcntl(p[0], F_SETFL, O_NONBLOCK);
    }
  }
  ~CheckReports() {
    for (auto& p : fds_) close_all(p);
  }
  CheckReports(const CheckReports&) = delete;
  CheckReports& operator=(const CheckReports&) = delete;

  // Child i keeps only its own write end.
  void in_child(int i) {
    for (size_t k = 0; k < fds_.size(); ++k) {
      if (static_cast<int>(k) == i) {
        close_one(fds_[k][0]);
        hcheck_report_fd() = fds_[k][1];
      } else {
        close_all(fds_[k]);
      }
    }
  }
  void in_parent() {
    for (auto& p : fds_) close_one(p[1]);
  }
  // When child i's check failed (steady_clock ticks) and what it said; {0, ""} if it said
  // nothing. Read once the child has exited.
  std::pair<int64_t, std::string> what(int i) const {
    char buf[sizeof(int64_t) + kCheckMessageBytes];
    const int fd = fds_[static_cast<size_t>(i)][0];
    const ssize_t n = fd >= 0 ? ::read(fd, buf, sizeof(buf)) : -1;
    if (n <= static_cast<ssize_t>(sizeof(int64_t))) return {0, std::string()};
    int64_t t = 0;
    std::memcpy(&t, buf, sizeof(t));
    return {t, std::string(buf + sizeof(t), static_cast<size_t>(n) - sizeof(t))};
  }

 private:
  static void close_one(int& fd) {
    if (fd >= 0) close(fd);
    fd = -1;
  }
  static void close_all(std::array<int, 2>& p) {
    close_one(p[0]);
    close_one(p[1]);
  }
  std::vector<std::array<int, 2>> fds_;
};

// Waits for forked ranks; returns "" or what went wrong with the rank that failed first ("rank
// K exited with status S: FILE:LINE: check failed: ...", "... killed by signal", "children did
// not exit in time"), after killing the others so that nothing outlives a failure. One
// failure makes others in turn (a channel read sees EOF) and waitpid() returns them in no
// useful order, so "first" is by the time a check failed (CheckReports), else by the time
// the child was reaped. `victim` is a rank that is meant to die of SIGKILL (-1: none).
inline std::string reap_children(std::vector<pid_t>& pids, int timeout_s, int victim = -1,
                                 const CheckReports* reports = nullptr) {
  using Clock = std::chrono::steady_clock;
  int64_t first_t = INT64_MAX;
  std::string failure;
  auto fail = [&](int64_t t, std::string what) {
    if (t < first_t) {
      first_t = t;
      failure = std::move(what);
    }
  };
  bool killing = false;  // the survivors of a failure are being killed by us
  auto kill_all = [&] {
    for (pid_t q : pids) {
      if (q > 0) kill(q, SIGKILL);
    }
    killing = true;
  };
  size_t alive = pids.size();
  const auto deadline = Clock::now() + std::chrono::seconds(timeout_s + 10);
  while (alive > 0) {
    int status = 0;
    const pid_t p = waitpid(-1, &status, WNOHANG);
    if (p == 0) {
      if (Clock::now() > deadline) {
        if (!killing)
          fail(Clock::now().time_since_epoch().count(), "children did not exit in time");
        kill_all();
      }
      struct timespec ts = {0, 5'000'000};
      nanosleep(&ts, nullptr);
      continue;
    }
    if (p < 0) break;
    const auto it = std::find(pids.begin(), pids.end(), p);
    if (it == pids.end()) continue;
    const int idx = static_cast<int>(it - pids.begin());
    *it = -1;
    --alive;
    const bool killed = WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
    if (killing && killed) continue;  // ours
    int64_t t = Clock::now().time_since_epoch().count();
    std::string what;
    if (idx == victim) {
      if (!killed) what = "was meant to die of SIGKILL but did not";
    } else if (WIFEXITED(status) && WEXITSTATUS(status) != 0) {
      what = "exited with status " + std::to_string(WEXITSTATUS(status));
      const auto [when, why] =
          reports != nullptr ? reports->what(idx) : std::pair<int64_t, std::string>{};
      if (!why.empty()) {
        what += ": " + why;
        t = when;
      }
    } else if (WIFSIGNALED(status)) {
      what = "killed by signal " + std::to_string(WTERMSIG(status)) +
             (WTERMSIG(status) == SIGALRM ? " (timeout: hung)" : "");
    }
    if (!what.empty()) {
      fail(t, "rank " + std::to_string(idx) + " " + what);
      if (!killing) kill_all();
    }
  }
  return failure;
}

// A harness variable holding an integer in [1, hi]: 1 when unset; a value outside the range is
// refused with a message, and 1 is used.
inline unsigned harness_env_factor(const char* name, long hi) {
  const char* v = std::getenv(name);
  if (v == nullptr) return 1u;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (end == v || *end != '\0' || x < 1 || x > hi) {
    std::fprintf(stderr, "%s=%s: not an integer in [1, %ld]; ignored\n", name, v, hi);
    return 1u;
  }
  return static_cast<unsigned>(x);
}

// HARNESS_TIME_SCALE=k (in [1, 100]) multiplies every time limit of the harness: each child's
// alarm (run_pair, run_ranks) and the loops that bound themselves (deadline_in). The Soft-RoCE
// guest runs under software emulation, 10-50x slower than the host, where
// Concurrency.SeveralContextsAndThreads took 140-151 s against limits of 120 and 150
// (rxe-plugin-suite.sh sets 3).
inline unsigned harness_time_scale() {
  static const unsigned k = harness_env_factor("HARNESS_TIME_SCALE", 100);
  return k;
}

// HARNESS_VOLUME_DIVISOR=k (in [1, 8]) divides the message counts of the harness's three longest
// transfers (MiniProxy.SimpleProtocolPatternEveryByteChecked,
// Concurrency.SeveralContextsAndThreads, FaultInjection.MiniProxyExactAndCountersMove) for the
// emulated guest, where the first two took 79 and 150 s of the suite's 230 whole, 26 and 50-63 s
// at a quarter (rxe-plugin-suite.sh sets 8). What they test there (NCCL's slot pattern, threads
// and contexts sharing a device) an eighth of the messages shows as well. Unset, it is 4 in a
// sanitizer build too (tests/sanitized.h: there Concurrency took 28 s under TSan and 11 under
// ASan, for threads that meet as often in a quarter of it), and 1 in release, which runs them
// whole. Above 1 it also takes Lifecycle.RepeatedInitFinalizeAndReload from three cycles to two
// (23 s of the guest's suite at three).
inline unsigned harness_volume_divisor() {
  static const unsigned k = std::getenv("HARNESS_VOLUME_DIVISOR") != nullptr
                                ? harness_env_factor("HARNESS_VOLUME_DIVISOR", 8)
                            : optireduce::testing::kSanitized ? 4u
                                                              : 1u;
  return k;
}
inline unsigned scaled_timeout(unsigned timeout_s) {
  return timeout_s * harness_time_scale();
}
// A loop's limit of `s` seconds as it applies: scaled by HARNESS_TIME_SCALE.
inline double scaled_s(double s) {
  return s * harness_time_scale();
}

inline double mono_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// When a loop given `s` seconds must give up (scaled_s).
inline double deadline_in(double s) {
  return mono_s() + scaled_s(s);
}

// Runs `a` and `b` in two forked children joined by a Channel, each with `env` applied (plus
// OPTIREDUCE_IFNAME=lo) and killed by SIGALRM after `timeout_s`. Returns "" when both exited 0,
// else what went wrong. When one child fails the other is killed at once.
inline std::string run_pair(const std::function<void(Channel&)>& a,
                            const std::function<void(Channel&)>& b, const Env& env = {},
                            unsigned timeout_s = 60) {
  timeout_s = scaled_timeout(timeout_s);
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return "socketpair failed";
  CheckReports reports(2);
  std::fflush(stdout);
  std::fflush(stderr);
  pid_t pids[2];
  const std::function<void(Channel&)>* fns[2] = {&a, &b};
  for (int i = 0; i < 2; ++i) {
    pids[i] = fork();
    if (pids[i] < 0) return "fork failed";
    if (pids[i] == 0) {
      close(sv[1 - i]);
      reports.in_child(i);
      alarm(timeout_s);
      setenv("OPTIREDUCE_IFNAME", "lo", 1);
      for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
      Channel ch(sv[i]);
      (*fns[i])(ch);
      std::fflush(stdout);
      std::fflush(stderr);
      _exit(0);
    }
  }
  close(sv[0]);
  close(sv[1]);
  reports.in_parent();
  std::vector<pid_t> ids(pids, pids + 2);
  return reap_children(ids, timeout_s, -1, &reports);
}

// ---- The byte pattern: every byte depends on (seed, message index, offset), so a misplaced,
// stale, duplicated or foreign packet shows up as a mismatch.
inline uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
inline uint64_t pattern_word(uint64_t seed, uint64_t msg, uint64_t word) {
  return mix64(seed * 0x100000001B3ull ^ (msg << 40) ^ word);
}
inline void fill_pattern(void* buf, size_t n, uint64_t seed, uint64_t msg) {
  auto* p = static_cast<uint8_t*>(buf);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint64_t w = pattern_word(seed, msg, i / 8);
    std::memcpy(p + i, &w, 8);
  }
  if (i < n) {
    const uint64_t w = pattern_word(seed, msg, i / 8);
    std::memcpy(p + i, &w, n - i);
  }
}
// Offset of the first byte that differs from the pattern, or -1.
inline long long find_mismatch(const void* buf, size_t n, uint64_t seed, uint64_t msg) {
  const auto* p = static_cast<const uint8_t*>(buf);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint64_t w = pattern_word(seed, msg, i / 8);
    if (std::memcmp(p + i, &w, 8) != 0) {
      for (size_t j = 0; j < 8; ++j) {
        if (p[i + j] != reinterpret_cast<const uint8_t*>(&w)[j])
          return static_cast<long long>(i + j);
      }
    }
  }
  if (i < n) {
    const uint64_t w = pattern_word(seed, msg, i / 8);
    for (size_t j = 0; i + j < n; ++j) {
      if (p[i + j] != reinterpret_cast<const uint8_t*>(&w)[j]) return static_cast<long long>(i + j);
    }
  }
  return -1;
}

}  // namespace optireduce::testing
