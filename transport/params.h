// The one table of OPTIREDUCE_* environment variables. Each is parsed and validated once into a
// plain const Config; nothing else in the tree calls getenv for our variables. The README's
// table is generated from this one (tests/unit/params_test.cc keeps the two equal).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "transport/status.h"

namespace optireduce {

// The values of the table's enumerated variables, parsed once from their names (a row's
// `choices`, listed in enum order) so that nothing compares configuration strings at run time.
enum class DatapathChoice : uint8_t { kAuto, kUdp, kVerbs };
enum class ModeChoice : uint8_t { kExact, kBounded };
enum class FillChoice : uint8_t { kZero, kMarker };
enum class GatherFillChoice : uint8_t { kZero, kOwn };
// OPTIREDUCE_LOG, in the order of log.h's kLogLevelNames (log.cc parses the same names into a
// LogLevel itself, before the table is read).
enum class LogChoice : uint8_t { kNone, kWarn, kInfo, kTrace };
// OPTIREDUCE_ALLGATHER_MODE: how liboptireduce's bounded calls run phase 2 (collectives/tar.h).
enum class GatherModeChoice : uint8_t { kExact, kBounded, kStarted };
// OPTIREDUCE_INCAST: senders a receiver admits at once, >= 1, or one of these two names (the C
// API's OPTI_INCAST_MAX and OPTI_INCAST_AUTO: the same values, checked in collectives/api.cc).
inline constexpr int64_t kIncastMax = 0;    // `max`: all N-1
inline constexpr int64_t kIncastAuto = -1;  // `auto`: each receiver adapts it

struct Config {
  // --- devices and datapath
  std::string ifname;                               // OPTIREDUCE_IFNAME, else NCCL_SOCKET_IFNAME
  std::string ifname_var = "OPTIREDUCE_IFNAME";     // which of the two gave `ifname` (messages)
  DatapathChoice datapath = DatapathChoice::kAuto;  // OPTIREDUCE_DATAPATH
  std::string ib_hca;                               // OPTIREDUCE_IB_HCA, else NCCL_IB_HCA
  std::string ib_hca_var = "OPTIREDUCE_IB_HCA";     // which of the two gave `ib_hca` (messages)
  int64_t ib_tc = 0;                                // OPTIREDUCE_IB_TC, else NCCL_IB_TC
  int64_t ib_sl = 0;                                // OPTIREDUCE_IB_SL, else NCCL_IB_SL
  int64_t gid_index = -1;                           // OPTIREDUCE_GID_INDEX, else NCCL_IB_GID_INDEX
  std::string gid_index_var = "OPTIREDUCE_GID_INDEX";  // which of the two gave `gid_index`
  int64_t max_datagram_bytes = 0; // OPTIREDUCE_MAX_DATAGRAM
  int64_t socket_buffer_bytes = 8 << 20;  // OPTIREDUCE_SOCKET_BUFFER
  bool udp_gso = true;            // OPTIREDUCE_UDP_GSO
  bool udp_gro = true;            // OPTIREDUCE_UDP_GRO
  bool shared_endpoint = true;    // OPTIREDUCE_SHARED_ENDPOINT
  LogChoice log = LogChoice::kWarn;  // OPTIREDUCE_LOG (validated here; log.cc reads it itself)

  // --- reliable delivery, pacing
  int64_t rto_min_us = 100;       // OPTIREDUCE_RTO_MIN_US (the timeout follows the RTT above it)
  int64_t rto_max_us = 200000;    // OPTIREDUCE_RTO_MAX_US
  int64_t window_bytes = 4 << 20; // OPTIREDUCE_WINDOW_BYTES
  double rate_gbps = 0;           // OPTIREDUCE_RATE_GBPS (0 = no ceiling on a path's pacing)
  int64_t progress_us = 1000;     // OPTIREDUCE_PROGRESS_US
  int64_t peer_timeout_ms = 5000; // OPTIREDUCE_PEER_TIMEOUT_MS (see transport/liveness.h)

  // --- bounded mode
  ModeChoice mode = ModeChoice::kExact;  // OPTIREDUCE_MODE (the plugin: every communicator)
  ModeChoice allreduce_mode = ModeChoice::kExact;  // OPTIREDUCE_ALLREDUCE_MODE (liboptireduce)
  GatherModeChoice allgather_mode = GatherModeChoice::kStarted;  // OPTIREDUCE_ALLGATHER_MODE
  GatherFillChoice gather_fill = GatherFillChoice::kZero;  // OPTIREDUCE_GATHER_FILL (liboptireduce)
  int64_t bounded_traffic_class = 0x4F52;  // OPTIREDUCE_BOUNDED_TRAFFIC_CLASS
  FillChoice fill = FillChoice::kZero;  // OPTIREDUCE_FILL
  int64_t calibration_steps = 100; // OPTIREDUCE_CALIBRATION_STEPS
  double timeout_ms = 0;          // OPTIREDUCE_TIMEOUT_MS (0 = calibrate)
  double timeout_headroom = 1.5;  // OPTIREDUCE_TIMEOUT_HEADROOM (calibrated tB = this x P95)
  double early_fraction = 0.1;    // OPTIREDUCE_EARLY_FRACTION
  double loss_target = 0.005;     // OPTIREDUCE_LOSS_TARGET (see transport/loss_governor.h)
  int64_t stats_every = 0;        // OPTIREDUCE_STATS_EVERY

  // --- fault injection (tests and benchmarks; all off by default)
  uint64_t fault_seed = 1;        // OPTIREDUCE_FAULT_SEED
  double fault_drop = 0;          // OPTIREDUCE_FAULT_DROP
  double fault_burst = 1;         // OPTIREDUCE_FAULT_BURST
  double fault_dup = 0;           // OPTIREDUCE_FAULT_DUP
  double fault_reorder = 0;       // OPTIREDUCE_FAULT_REORDER
  double fault_delay_us = 0;      // OPTIREDUCE_FAULT_DELAY_US
  double fault_delay_alpha = 1.5; // OPTIREDUCE_FAULT_DELAY_ALPHA
  double fault_delay_prob = 0;    // OPTIREDUCE_FAULT_DELAY_PROB

  // --- collectives (liboptireduce)
  int64_t incast = kIncastMax;    // OPTIREDUCE_INCAST
  bool hadamard = true;           // OPTIREDUCE_HADAMARD
  int64_t hadamard_block = 4096;  // OPTIREDUCE_HADAMARD_BLOCK
  double safeguard = 0.05;        // OPTIREDUCE_SAFEGUARD
  bool safeguard_redo = false;    // OPTIREDUCE_SAFEGUARD_REDO
  int64_t exact_below_bytes = 4096;  // OPTIREDUCE_EXACT_BELOW
  bool nonfinite_agree = false;      // OPTIREDUCE_NONFINITE_AGREE
  int64_t resync_steps = 20;         // OPTIREDUCE_RESYNC_STEPS (the PyTorch hook reads it)

  // --- build and test tools: read by scripts, never by the libraries; in the table so that they
  // are documented with the rest and a process that inherits them gets no unknown-variable warning
  std::string home;            // OPTIREDUCE_HOME
  std::string nccl_tests_dir;  // OPTIREDUCE_NCCL_TESTS_DIR

  bool fault_enabled() const {
    return fault_drop > 0 || fault_dup > 0 || fault_reorder > 0 || fault_delay_prob > 0;
  }
};

// Parses `getenv` (or `lookup` when given, for tests) into *out. On a bad value returns
// kInvalidUsage and a message naming the variable, the value and what is allowed.
// Unknown OPTIREDUCE_* variables in the environment are reported as warnings in *warnings.
using EnvLookup = const char* (*)(const char* name);
Status parse_config(Config* out, std::string* error, std::vector<std::string>* warnings = nullptr,
                    EnvLookup lookup = nullptr);

// The process-wide configuration, parsed from the environment on first use. A parse error is
// sticky: global_config_status() keeps returning it (and its message).
const Config& global_config();
Status global_config_status(std::string* error = nullptr);
// Tests only: re-reads the environment.
void reload_global_config();

// The README table (markdown), one row per variable, in table order.
std::string params_markdown_table();

// The position of `v` among `choices`, '|'-separated names (a table row's, or log.h's
// kLogLevelNames), or -1.
int choice_index(const char* choices, const char* v);

}  // namespace optireduce
