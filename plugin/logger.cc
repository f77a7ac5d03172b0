// Implements plugin/logger.h: a transport log sink that forwards to NCCL's logger.
#include "plugin/logger.h"

#include <strings.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>

#include "transport/log.h"

namespace optireduce::plugin {
namespace {

using nccl::ncclDebugLogger_t;
using nccl::ncclDebugLogLevel;

std::atomic<ncclDebugLogger_t> g_logger{nullptr};

ncclDebugLogLevel to_nccl_level(LogLevel level) {
  switch (level) {
    case LogLevel::kWarn:
      return nccl::NCCL_LOG_WARN;
    case LogLevel::kInfo:
      return nccl::NCCL_LOG_INFO;
    case LogLevel::kTrace:
      return nccl::NCCL_LOG_TRACE;
    case LogLevel::kNone:
      break;
  }
  return nccl::NCCL_LOG_NONE;
}

void nccl_sink(LogLevel level, const char* file, int line, const char* msg) {
  ncclDebugLogger_t logger = g_logger.load(std::memory_order_acquire);
  if (logger == nullptr) {
    std::fprintf(stderr, "NET/OptiReduce %s\n", msg);
    return;
  }
  logger(to_nccl_level(level), nccl::NCCL_NET, file, line, "NET/OptiReduce : %s", msg);
}

}  // namespace

void install_logger(ncclDebugLogger_t logger) {
  if (logger != nullptr) g_logger.store(logger, std::memory_order_release);
  log_set_sink(nccl_sink);
  // NCCL filters by NCCL_DEBUG itself; raising our level only when NCCL will print INFO keeps
  // per-connection lines from being formatted for nothing otherwise.
  const char* debug = std::getenv("NCCL_DEBUG");
  if (debug != nullptr && (strcasecmp(debug, "INFO") == 0 || strcasecmp(debug, "TRACE") == 0) &&
      !log_enabled(LogLevel::kInfo)) {
    log_set_level(LogLevel::kInfo);
  }
}

void log_init_info(const char* msg) {
  ncclDebugLogger_t logger = g_logger.load(std::memory_order_acquire);
  if (logger != nullptr) {
    logger(nccl::NCCL_LOG_INFO, nccl::NCCL_INIT | nccl::NCCL_ENV, __FILE__, __LINE__,
           "NET/OptiReduce : %s", msg);
  } else {
    OR_INFO("%s", msg);
  }
}

void detach_logger() {
  log_set_sink(nullptr);
  g_logger.store(nullptr, std::memory_order_release);
}

}  // namespace optireduce::plugin
