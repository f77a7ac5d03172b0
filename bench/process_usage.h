// What this process has used so far, every thread included, for the benches that charge it to
// the algorithm they time: the plugin's or the library's own threads count against it.
#pragma once

#include <sys/resource.h>

namespace optireduce::bench {

struct ProcessUsage {
  double cpu_s = 0;  // user + system CPU seconds
  double csw = 0;    // context switches, voluntary and involuntary
};

inline ProcessUsage process_usage() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  auto sec = [](const timeval& t) { return double(t.tv_sec) + double(t.tv_usec) * 1e-6; };
  return ProcessUsage{sec(u.ru_utime) + sec(u.ru_stime), double(u.ru_nvcsw) + double(u.ru_nivcsw)};
}

}  // namespace optireduce::bench
