// Ranks as forked processes on loopback, each with its own transport engine as in real use: the
// scaffolding the collectives' process tests share (loopback_test.cc through the C API,
// host_exchange_test.cc beneath it).
#pragma once

#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace optireduce::testing {

// A fresh directory for one test's file rendezvous and markers.
inline std::string temp_dir() {
  char tmpl[] = "/tmp/optireduce-coll-XXXXXX";
  const char* d = ::mkdtemp(tmpl);
  return d ? d : "/tmp";
}

// Runs body(rank) in `n` forked processes and reports how many failed (a non-zero return, a
// signal, or the alarm after timeout_s that keeps a hung rank from hanging the suite). `env` is
// applied in the children only, after OPTIREDUCE_IFNAME=lo.
inline int run_ranks(int n, const std::vector<std::pair<std::string, std::string>>& env,
                     const std::function<int(int)>& body, int timeout_s = 240) {
  std::vector<pid_t> pids;
  std::fflush(nullptr);  // else every child prints again what the parent had buffered
  for (int r = 0; r < n; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0) {
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
  int failed = 0;
  for (pid_t p : pids) {
    int status = 0;
    ::waitpid(p, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
  }
  return failed;
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

}  // namespace optireduce::testing

// In a child: report a failed check with the rank and the library's last error, and fail it.
// `last_error` is an expression giving the library's message ("" where there is none).
#define FORKED_CHECK(cond, last_error, ...)                               \
  do {                                                                    \
    if (!(cond)) {                                                        \
      std::fprintf(stderr, "rank %d: %s:%d: ", rank, __FILE__, __LINE__); \
      std::fprintf(stderr, __VA_ARGS__);                                  \
      std::fprintf(stderr, " [%s]\n", (last_error));                      \
      return 1;                                                           \
    }                                                                     \
  } while (0)
