// Ranks as forked processes on loopback, each with its own transport engine as in real use: the
// scaffolding the collectives' process tests share (loopback_test.cc through the C API,
// host_exchange_test.cc beneath it). Reaping and failure reports are tests/plugin/two_procs.h's.
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <csignal>
#include <cstdarg>
#include <cstdio>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "tests/plugin/two_procs.h"

namespace optireduce::testing {

// A fresh directory for one test's file rendezvous and markers.
inline std::string temp_dir() {
  char tmpl[] = "/tmp/optireduce-coll-XXXXXX";
  const char* d = ::mkdtemp(tmpl);
  return d ? d : "/tmp";
}

// Runs body(rank) in `n` forked processes. Returns "" when every rank returned 0, else what
// went wrong with the rank that failed first (tests/plugin/two_procs.h's reap_children: "rank
// K exited with status 1: FILE:LINE: ..." with FORKED_CHECK's message, a signal, or the alarm
// after timeout_s that keeps a hung rank from hanging the suite); the other ranks are then
// killed, so a failure does not wait for their deadlines. `env` is applied in the children
// only, after OPTIREDUCE_IFNAME=lo.
inline std::string run_ranks(int n, const std::vector<std::pair<std::string, std::string>>& env,
                             const std::function<int(int)>& body, int timeout_s = 240) {
  std::vector<pid_t> pids;
  CheckReports reports(n);
  std::fflush(nullptr);  // else every child prints again what the parent had buffered
  for (int r = 0; r < n; ++r) {
    const pid_t pid = ::fork();
    if (pid < 0) {
      for (pid_t p : pids) ::kill(p, SIGKILL);
      return "fork failed";
    }
    if (pid == 0) {
      reports.in_child(r);
      ::alarm(unsigned(timeout_s));
      ::setenv("OPTIREDUCE_IFNAME", "lo", 1);
      for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
      const int rc = body(r);
      std::fflush(stdout);
      std::fflush(stderr);
      ::_exit(rc);
    }
    pids.push_back(pid);
  }
  reports.in_parent();
  return reap_children(pids, timeout_s, -1, &reports);
}

// Marker files: one rank says a step is done, another waits for it (at most timeout_ms).
inline void mark(const std::string& dir, const std::string& name) {
  const std::string path = dir + "/" + name;
  if (FILE* f = std::fopen(path.c_str(), "w")) std::fclose(f);
}
inline bool marked(const std::string& dir, const std::string& name) {
  return ::access((dir + "/" + name).c_str(), F_OK) == 0;
}
inline bool wait_mark(const std::string& dir, const std::string& name, int timeout_ms = 30'000) {
  const std::string path = dir + "/" + name;
  for (int waited = 0; waited < timeout_ms; waited += 10) {
    if (marked(dir, name)) return true;
    ::usleep(10'000);
  }
  return false;
}

// FORKED_CHECK's report: on stderr, and to the parent (run_ranks names it).
__attribute__((format(printf, 6, 7))) inline void forked_check_failed(int rank, const char* file,
                                                                      int line, const char* cond,
                                                                      const char* last_error,
                                                                      const char* fmt, ...) {
  char why[kCheckMessageBytes];
  va_list ap;
  va_start(ap, fmt);
  const size_t n = format_check(why, file, line, cond, fmt, ap);
  va_end(ap);
  if (last_error != nullptr && *last_error != '\0')
    std::snprintf(why + n, sizeof(why) - n, " [%s]", last_error);
  std::fprintf(stderr, "rank %d: %s\n", rank, why);
  std::fflush(stderr);
  hcheck_report(why);
}

}  // namespace optireduce::testing

// In a child: report a failed check with the rank and the library's last error, and fail it.
// `last_error` is an expression giving the library's message ("" where there is none).
#define FORKED_CHECK(cond, last_error, ...)                                                     \
  do {                                                                                          \
    if (!(cond)) {                                                                              \
      ::optireduce::testing::forked_check_failed(rank, __FILE__, __LINE__, #cond, (last_error), \
                                                 __VA_ARGS__);                                  \
      return 1;                                                                                 \
    }                                                                                           \
  } while (0)
