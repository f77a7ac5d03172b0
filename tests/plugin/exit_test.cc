// How a process that used the plugin ends (issue 10): returning from main after finalize, with
// comms still open and data in flight, exit() from another thread, dlclose before exit, the v8
// table that has no finalize, quick_exit. Each case runs tests/plugin/exit_driver.cc in a fresh
// process, because what is under test is the process's own end: it must exit 0 and print no
// sanitizer, UBSan or allocator complaint (a double free at exit aborted every such process).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tests/plugin/plugin_path.h"
#include "tests/sanitized.h"

extern char** environ;

namespace {

using optireduce::testing::plugin_path;

struct Outcome {
  int status = -1;  // as waitpid reports it
  std::string err;  // the child's whole stderr
};

// Runs the driver with the parent's environment (ASAN_OPTIONS and UBSAN_OPTIONS included) plus
// OPTIREDUCE_IFNAME=lo, collecting its stderr through a pipe until it closes. The plugin path
// goes in argv: the plugin warns about OPTIREDUCE_* variables it does not know.
Outcome run_driver(const std::string& name) {
  Outcome out;
  std::vector<std::string> env_store;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "OPTIREDUCE_IFNAME=", 18) != 0 &&
        std::strncmp(*e, "OPTIREDUCE_PLUGIN_PATH=", 23) != 0) {
      env_store.emplace_back(*e);
    }
  }
  env_store.emplace_back("OPTIREDUCE_IFNAME=lo");
  std::vector<char*> envp;
  for (std::string& s : env_store) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string driver = EXIT_DRIVER;
  std::string plugin = plugin_path();
  std::string case_name = name;
  char* argv[] = {driver.data(), case_name.data(), plugin.data(), nullptr};

  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    out.err = std::string("pipe2: ") + std::strerror(errno);
    return out;
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], STDERR_FILENO);  // dup2 clears O_CLOEXEC
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, driver.c_str(), &fa, nullptr, argv, envp.data());
  posix_spawn_file_actions_destroy(&fa);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    out.err = std::string("posix_spawn: ") + std::strerror(rc);
    return out;
  }
  char buf[4096];
  for (;;) {
    const ssize_t n = read(fds[0], buf, sizeof(buf));
    if (n > 0) {
      out.err.append(buf, static_cast<size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  close(fds[0]);
  while (waitpid(pid, &out.status, 0) < 0 && errno == EINTR) {
  }
  return out;
}

std::string describe(int status) {
  if (WIFEXITED(status)) return "exit status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return "killed by signal " + std::to_string(WTERMSIG(status)) + " (" +
           strsignal(WTERMSIG(status)) + ")";
  }
  return "status " + std::to_string(status);
}

// ThreadSanitizer keeps the atexit handlers that a library registers on a list of its own and
// runs them at exit, even after dlclose unmapped the library: any instrumented library with an
// atexit handler (ours quiesce the transport) that is dlclosed before exit makes the process
// jump into unmapped memory at exit (a 10-line library and main do it too;
// github.com/google/sanitizers/issues/318). So the dlclose cases say nothing about the plugin
// there. They run in the release and ASan builds.
#define SKIP_DLCLOSE_UNDER_TSAN() \
  OR_SKIP_UNDER_TSAN("dlclose then exit: unsupported by ThreadSanitizer")

void expect_clean_exit(const std::string& name) {
  const Outcome o = run_driver(name);
  EXPECT_TRUE(WIFEXITED(o.status) && WEXITSTATUS(o.status) == 0)
      << name << ": " << describe(o.status) << "\n--- stderr ---\n"
      << o.err;
  // The driver got through its case: what failed, if anything, is the process's end.
  EXPECT_NE(o.err.find("exit_driver: " + name + ": leaving"), std::string::npos)
      << name << ": the driver did not reach the end of its case\n--- stderr ---\n"
      << o.err;
  for (const char* bad : {"AddressSanitizer", "LeakSanitizer", "ThreadSanitizer", "runtime error",
                          "double free", "pure virtual", "terminate called"}) {
    EXPECT_EQ(o.err.find(bad), std::string::npos)
        << name << ": stderr mentions '" << bad << "'\n--- stderr ---\n"
        << o.err;
  }
}

TEST(Exit, FinalizeThenReturnFromMain) {
  expect_clean_exit("finalize_exit");
}
TEST(Exit, OpenCommsAndRequestsInFlight) {
  expect_clean_exit("open_exit");
}
TEST(Exit, ExitFromAnotherThread) {
  expect_clean_exit("thread_exit");
}
TEST(Exit, DlcloseThenExit) {
  SKIP_DLCLOSE_UNDER_TSAN();
  expect_clean_exit("dlclose_exit");
}
TEST(Exit, DlcloseWithoutFinalize) {
  SKIP_DLCLOSE_UNDER_TSAN();
  expect_clean_exit("dlclose_open_ctx_exit");
}
TEST(Exit, DlcloseUnderOpenComms) {
  SKIP_DLCLOSE_UNDER_TSAN();
  expect_clean_exit("dlclose_open_comms_exit");
}
TEST(Exit, V8WithoutFinalize) {
  expect_clean_exit("v8_exit");
}
TEST(Exit, QuickExit) {
  expect_clean_exit("quick_exit");
}

}  // namespace
