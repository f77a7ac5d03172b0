// The core's WARN lines, collected while a WarnCapture lives (transport/log.h's sink), for the
// tests that check what a user would read. One at a time per process: the sink is global.
#pragma once

#include <mutex>
#include <string>
#include <vector>

#include "transport/log.h"

namespace optireduce::testing {

class WarnCapture {
 public:
  WarnCapture() {
    std::lock_guard<std::mutex> lock(mu());
    lines().clear();
    log_set_sink(&sink);
  }
  ~WarnCapture() { log_set_sink(nullptr); }
  WarnCapture(const WarnCapture&) = delete;
  WarnCapture& operator=(const WarnCapture&) = delete;

  std::vector<std::string> warnings() const {
    std::lock_guard<std::mutex> lock(mu());
    return lines();
  }
  // Every line, each ended by a newline.
  std::string text() const {
    std::string t;
    for (const auto& l : warnings()) t += l + "\n";
    return t;
  }

 private:
  static std::mutex& mu() {
    static std::mutex m;
    return m;
  }
  static std::vector<std::string>& lines() {
    static std::vector<std::string> l;
    return l;
  }
  static void sink(LogLevel level, const char*, int, const char* msg) {
    if (level != LogLevel::kWarn) return;
    std::lock_guard<std::mutex> lock(mu());
    lines().push_back(msg);
  }
};

}  // namespace optireduce::testing
