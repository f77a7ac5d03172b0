// Formats log lines and hands them to the installed sink (stderr by default).
#include "transport/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>

#include "transport/params.h"
#include "transport/status.h"

namespace optireduce {
namespace {

void stderr_sink(LogLevel level, const char* file, int line, const char* msg) {
  const char* tag = level == LogLevel::kWarn ? "WARN" : level == LogLevel::kInfo ? "INFO" : "TRACE";
  const char* base = std::strrchr(file, '/');
  std::fprintf(stderr, "optireduce %s %s:%d %s\n", tag, base ? base + 1 : file, line, msg);
}

// OPTIREDUCE_LOG is read here and not through the parameter table because logging must work
// before (and while) the table is parsed; the table documents and validates the same variable
// (a bad value fails init there, with the message every variable gets).
LogLevel initial_level() {
  LogLevel level = LogLevel::kWarn;
  if (const char* v = std::getenv("OPTIREDUCE_LOG")) parse_log_level(v, &level);
  return level;
}

std::atomic<LogSink> g_sink{stderr_sink};
std::atomic<int> g_level{static_cast<int>(initial_level())};

}  // namespace

bool parse_log_level(const char* v, LogLevel* out) {
  constexpr LogLevel kLevels[] = {LogLevel::kNone, LogLevel::kWarn, LogLevel::kInfo,
                                  LogLevel::kTrace};
  const int i = choice_index(kLogLevelNames, v);
  if (i < 0 || i >= static_cast<int>(std::size(kLevels))) return false;
  *out = kLevels[i];
  return true;
}

void log_set_sink(LogSink sink) { g_sink.store(sink ? sink : stderr_sink); }
void log_set_level(LogLevel level) { g_level.store(static_cast<int>(level)); }
bool log_enabled(LogLevel level) {
  return static_cast<int>(level) <= g_level.load(std::memory_order_relaxed);
}

void log_write(LogLevel level, const char* file, int line, const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  g_sink.load()(level, file, line, buf);
}

const char* errc_name(Errc code) {
  switch (code) {
    case Errc::kOk: return "ok";
    case Errc::kSystem: return "system error";
    case Errc::kInternal: return "internal error";
    case Errc::kInvalidUsage: return "invalid usage";
    case Errc::kRemote: return "remote error";
  }
  return "unknown";
}

}  // namespace optireduce
