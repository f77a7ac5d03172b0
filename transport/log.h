// The one logging facility of the core. The plugin points the sink at NCCL's logger at init;
// elsewhere (liboptireduce, tests, benchmarks) lines go to stderr, filtered by OPTIREDUCE_LOG.
#pragma once

#include <cstdarg>

namespace optireduce {

// Levels by frequency: WARN once per event, INFO per connection or step, TRACE per packet.
enum class LogLevel : int { kNone = 0, kWarn = 2, kInfo = 3, kTrace = 5 };

// OPTIREDUCE_LOG's values, in the order of params.h's LogChoice.
inline constexpr const char* kLogLevelNames = "none|warn|info|trace";
// The level OPTIREDUCE_LOG's value `v` names; false (and *out untouched) for any other value.
bool parse_log_level(const char* v, LogLevel* out);

// A sink receives one already formatted line (no trailing newline). It must be thread-safe.
using LogSink = void (*)(LogLevel level, const char* file, int line, const char* msg);

// Installs `sink` (nullptr restores stderr). Not synchronised with concurrent logging: call it
// before starting threads, as the plugin does in init.
void log_set_sink(LogSink sink);
void log_set_level(LogLevel level);
bool log_enabled(LogLevel level);
void log_write(LogLevel level, const char* file, int line, const char* fmt, ...)
    __attribute__((format(printf, 4, 5)));

}  // namespace optireduce

#define OPTIREDUCE_LOG(level, ...)                                                  \
  do {                                                                              \
    if (::optireduce::log_enabled(level))                                           \
      ::optireduce::log_write(level, __FILE__, __LINE__, __VA_ARGS__);              \
  } while (0)
#define OR_WARN(...) OPTIREDUCE_LOG(::optireduce::LogLevel::kWarn, __VA_ARGS__)
#define OR_INFO(...) OPTIREDUCE_LOG(::optireduce::LogLevel::kInfo, __VA_ARGS__)
// Per-packet tracing compiles away unless the build defines OPTIREDUCE_TRACE.
#ifdef OPTIREDUCE_TRACE
#define OR_TRACE(...) OPTIREDUCE_LOG(::optireduce::LogLevel::kTrace, __VA_ARGS__)
#else
#define OR_TRACE(...) \
  do {                \
  } while (0)
#endif
