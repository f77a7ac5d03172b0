// The parameter table and its parser. To add a variable: a field in Config (params.h), a row in
// kParams below (name, type, default, range, doc, and a check for a syntax of its own), then
// regenerate the README table with `build/tests/unit/params_table` (the params test fails until
// you do).
#include "transport/params.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <variant>

#include "transport/ifname_filter.h"
#include "transport/log.h"

extern char** environ;

namespace optireduce {
namespace {

using Field = std::variant<std::string Config::*, int64_t Config::*, uint64_t Config::*,
                           double Config::*, bool Config::*, DatapathChoice Config::*,
                           ModeChoice Config::*, FillChoice Config::*, GatherFillChoice Config::*,
                           GatherModeChoice Config::*, LogChoice Config::*>;

struct ParamSpec {
  const char* name;
  Field field;
  double min;           // numeric types: inclusive bounds
  double max;
  const char* choices;  // '|'-separated names. Enums: their values in enum order; strings: the
                        // allowed values (nullptr = free text); integers: names that stand
                        // for the values in `named` (besides numbers in [min, max])
  const char* doc;
  // A string with a syntax of its own: empty when `value` is well-formed, else why not (in
  // words that follow "invalid NAME=\"value\": "). nullptr = no check beyond the above.
  std::string (*check)(const char* value) = nullptr;
  const int64_t* named = nullptr;  // integers with `choices`: the value of each name
  // Read in the variable's place when it is unset: another program's variable for the same
  // setting, which a user may have set already (NCCL_SOCKET_IFNAME for NCCL's own sockets).
  const char* fallback = nullptr;
  // Where the name of the variable that gave the value is kept, for messages about it.
  std::string Config::*source = nullptr;
};

// OPTIREDUCE_IFNAME (kInterfaces) and OPTIREDUCE_IB_HCA (kRdmaPorts): IfnameFilter's syntax.
template <IfnameFilter::Kind kKind>
std::string check_name_list(const char* value) {
  IfnameFilter filter;
  std::string why;
  return IfnameFilter::parse(value, &filter, &why, kKind) ? std::string() : why;
}

constexpr int64_t kIncastNamed[] = {kIncastMax, kIncastAuto};  // "max|auto"

// clang-format off
const ParamSpec kParams[] = {
  {"OPTIREDUCE_IFNAME", &Config::ifname, 0, 0, nullptr,
   "Network interfaces for UDP, in `NCCL_SOCKET_IFNAME`'s syntax: comma-separated name prefixes (`eth,ens`); a leading `=` makes them exact names (`=eth0,eth1`), a leading `^` excludes them (`^docker,eth0`), `^=` both. Every selected interface that is up, running and has an address is one device, in natural name order (`eth2` before `eth10`). Unset, `NCCL_SOCKET_IFNAME` is read in its place (a cluster that names NCCL's interface names ours too); both unset: every `ib*` interface; else every other one but loopback, `docker*` and `virbr*`; else `docker*`; else loopback.",
   &check_name_list<IfnameFilter::Kind::kInterfaces>, nullptr, "NCCL_SOCKET_IFNAME", &Config::ifname_var},
  {"OPTIREDUCE_DATAPATH", &Config::datapath, 0, 0, "auto|udp|verbs",
   "`verbs` uses UD queue pairs, `udp` UDP sockets, `auto` verbs where an active RDMA port exists, else UDP."},
  {"OPTIREDUCE_IB_HCA", &Config::ib_hca, 0, 0, nullptr,
   "RDMA devices to use, in `NCCL_IB_HCA`'s syntax: comma-separated name prefixes, each optionally with a port (`mlx5_0:1,mlx5_1`; `mlx5_1` also selects `mlx5_10`); a leading `=` makes them exact names (`=mlx5_1`), a leading `^` excludes them (`^mlx5_bond`), `^=` both. Unset, `NCCL_IB_HCA` is read in its place; both unset: every device with an active port.",
   &check_name_list<IfnameFilter::Kind::kRdmaPorts>, nullptr, "NCCL_IB_HCA", &Config::ib_hca_var},
  {"OPTIREDUCE_GID_INDEX", &Config::gid_index, -1, 255, nullptr,
   "RoCE GID index; -1 selects a RoCE v2 IPv4 GID automatically. Unset, `NCCL_IB_GID_INDEX` is read in its place.",
   nullptr, nullptr, "NCCL_IB_GID_INDEX", &Config::gid_index_var},
  {"OPTIREDUCE_IB_TC", &Config::ib_tc, 0, 255, nullptr,
   "Traffic class of every datagram over verbs (the GRH's; on RoCE the IP header's DSCP and ECN bits, which a lossless fabric maps to its PFC priority). Unset, `NCCL_IB_TC` is read in its place, so the plugin's traffic takes the class NCCL's own takes there.",
   nullptr, nullptr, "NCCL_IB_TC"},
  {"OPTIREDUCE_IB_SL", &Config::ib_sl, 0, 15, nullptr,
   "InfiniBand service level of every datagram over verbs. Unset, `NCCL_IB_SL` is read in its place.",
   nullptr, nullptr, "NCCL_IB_SL"},
  {"OPTIREDUCE_MAX_DATAGRAM", &Config::max_datagram_bytes, 0, 65507, nullptr,
   "Largest datagram in bytes, header included; 0 derives it from the route to each peer: the "
   "interface MTU, or loopback's for a peer on the same host (64 KiB datagrams where the kernel "
   "has UDP GRO). A value set here holds for every peer. Must be 0 or at least 256."},
  {"OPTIREDUCE_SOCKET_BUFFER", &Config::socket_buffer_bytes, 65536, 1 << 30, nullptr,
   "UDP socket send/receive buffer in bytes (set with SO_*BUFFORCE when permitted)."},
  {"OPTIREDUCE_UDP_GSO", &Config::udp_gso, 0, 1, nullptr,
   "Use UDP segmentation offload (UDP_SEGMENT) where the kernel has it."},
  {"OPTIREDUCE_UDP_GRO", &Config::udp_gro, 0, 1, nullptr,
   "Use UDP receive coalescing (UDP_GRO) where the kernel has it."},
  {"OPTIREDUCE_SHARED_ENDPOINT", &Config::shared_endpoint, 0, 1, nullptr,
   "One UDP socket per device and thread, shared by every connection that thread opens, incoming datagrams told apart by their connection's token; 0 gives each connection a socket of its own (what an idle connection costs then grows with their number)."},
  {"OPTIREDUCE_LOG", &Config::log, 0, 0, kLogLevelNames,
   "Log level outside NCCL (inside NCCL, NCCL_DEBUG governs). `info` adds one line per connection when a host-path communicator closes: messages, retransmissions, timer expiries, probes, drops."},
  {"OPTIREDUCE_RTO_MIN_US", &Config::rto_min_us, 50, 10'000'000, nullptr,
   "Lower bound of the retransmission timeout in microseconds. Above it the timeout follows the RTT each connection measures (the larger of 2 x smoothed RTT and smoothed RTT + 4 x its variation; 20 ms before the first sample), so it suits a 10 us fabric and a millisecond network alike; lost tail packets and lost CTS are repaired after a few RTTs, by the tail loss probe and the CTS repeat, without waiting for it."},
  {"OPTIREDUCE_RTO_MAX_US", &Config::rto_max_us, 1000, 60'000'000, nullptr,
   "Upper bound of the retransmission timeout in microseconds (reliable mode)."},
  {"OPTIREDUCE_WINDOW_BYTES", &Config::window_bytes, 65536, 1 << 30, nullptr,
   "Most unacknowledged bytes a connection keeps in flight, whatever its path's congestion window allows (also capped by the receive buffer the peer advertises)."},
  {"OPTIREDUCE_RATE_GBPS", &Config::rate_gbps, 0, 1000, nullptr,
   "A ceiling, in Gbit/s, on the pacing rate of each path (the connections from one device to one remote host), exact and bounded alike. 0: none; the delay-based congestion control decides alone, which is what every published figure uses."},
  {"OPTIREDUCE_PROGRESS_US", &Config::progress_us, 50, 100000, nullptr,
   "Longest sleep of the background progress thread that serves timers and idle connections, in microseconds; it wakes sooner for the earliest timer a connection has armed. With no timer armed and no caller receiving, it sleeps on the endpoints instead, until a datagram or a timer comes."},
  {"OPTIREDUCE_PEER_TIMEOUT_MS", &Config::peer_timeout_ms, 100, 3'600'000, nullptr,
   "A peer that answers no keepalive for this long while a request waits on it, or whose host reports its port closed three times, is dead: every pending and later request on its connections fails with ncclRemoteError (bounded ones too). Also how long a thread's shared endpoint stays open after its last connection closed, to answer a peer that missed the CLOSE. At least 4 x OPTIREDUCE_RTO_MAX_US."},
  {"OPTIREDUCE_MODE", &Config::mode, 0, 0, "exact|bounded",
   "`bounded` makes every connection of every communicator bounded (the only way on ABI v8/v9). The plugin's setting, not liboptireduce's: a GPU communicator of liboptireduce refuses to start while it is set, since its exact steps (and the application's own collectives) would turn lossy too."},
  {"OPTIREDUCE_ALLREDUCE_MODE", &Config::allreduce_mode, 0, 0, "exact|bounded",
   "liboptireduce's default allreduce mode (optiOptionsDefault). Its bounded steps always run on a communicator of their own, so this never makes other traffic lossy."},
  {"OPTIREDUCE_ALLGATHER_MODE", &Config::allgather_mode, 0, 0, "exact|bounded|started",
   "How liboptireduce's bounded calls run their phase 2 (the all-gather of the reduced shards). `started`: a peer's shard is cut at the deadline only if none of it has arrived by then (a straggler, a stalled rank: it costs the others at most a deadline per phase); once its first bytes arrived it is received whole, so a slow but live peer costs time, not data, and the ranks' results stay the same bits. `bounded`: cut at its deadline like phase 1; each rank estimates what it lost there on its own, and data-parallel replicas drift apart until re-synchronised. `exact`: every rank gets the same bits, and a straggler's reduced shard is waited for. On the GPU path phase 2 `started` runs on a second sibling communicator (traffic class OPTIREDUCE_BOUNDED_TRAFFIC_CLASS + 1), and NCCL cuts each shard into chunks: a chunk none of which arrived by its deadline is cut whole."},
  {"OPTIREDUCE_GATHER_FILL", &Config::gather_fill, 0, 0, "zero|own",
   "What liboptireduce's bounded calls give what a rank lost in phase 2 (a peer's reduced shard). `zero`: a lost element is 0, so this rank skips its update this step; with Hadamard, lost coordinates are 0 and a block is decoded from what it kept, unscaled (an error of at most the block's own norm). `own`: its own contribution x N (an average of one: unbiased, but as noisy as one rank's gradient scaled by N); with Hadamard, a partly kept block is rescaled by d/k (unbiased, an error of sqrt((d-k)/k) times the block's norm) and an empty one gets own x N. In bench/tta at Gloo P99/P50 ~3, bounded TAR ended at 84.2% and 84.3% with `zero` against 84.0% and 82.8% with `own` (seeds 1 and 2; exact TAR 84.5% and 84.9%)."},
  {"OPTIREDUCE_BOUNDED_TRAFFIC_CLASS", &Config::bounded_traffic_class, 0, 2147483646, nullptr,
   "A communicator whose ncclConfig_t.trafficClass equals this value runs bounded (ABI v10 to v12), one whose class is the next value bounded until each sender starts (liboptireduce's phase 1 and phase 2 siblings on the GPU path). Default 0x4F52 = 20306."},
  {"OPTIREDUCE_FILL", &Config::fill, 0, 0, "zero|marker",
   "What a bounded receive writes into missing bytes: zeros, or the erasure marker 0x7FF1 repeated (a NaN in fp16/bf16/fp32/fp64). A communicator of OPTIREDUCE_BOUNDED_TRAFFIC_CLASS (liboptireduce's) always gets the marker."},
  {"OPTIREDUCE_CALIBRATION_STEPS", &Config::calibration_steps, 0, 100000, nullptr,
   "Bounded mode: receives (over all of a communicator's connections) that run exact at start to measure the hard bound tB (their P95). A TAR call makes 2(N-1) of them; spanning many calls keeps one burst of congestion from setting tB."},
  {"OPTIREDUCE_TIMEOUT_MS", &Config::timeout_ms, 0, 600000, nullptr,
   "Bounded mode: fixed hard bound tB in milliseconds instead of calibrating; 0 calibrates."},
  {"OPTIREDUCE_TIMEOUT_HEADROOM", &Config::timeout_headroom, 1, 10, nullptr,
   "Bounded mode: the calibrated tB is this times the P95 of the calibration steps (a bounded step paced at the link's share takes about as long as an exact one; without headroom every jitter cuts it). Larger: more delivered under congestion, a higher worst case (docs/lab.md measures 1.1, 1.3, 1.5)."},
  {"OPTIREDUCE_EARLY_FRACTION", &Config::early_fraction, 0, 1, nullptr,
   "Bounded mode: once tail packets arrived, close a step after this fraction of the estimate tC."},
  {"OPTIREDUCE_LOSS_TARGET", &Config::loss_target, 0, 1, nullptr,
   "Bounded mode: the fraction of their bytes that started steps may lose to their deadlines, on average. Each step that started stretches the deadlines by exp(lost - target) (up to 4x): a step that lost more than the target widens the next ones, one that lost less gives time back, and over many steps the loss settles at the target. Stragglers (senders that never started) are the start allowance's and stretch nothing. 1: never stretch; a fixed OPTIREDUCE_TIMEOUT_MS is never stretched."},
  {"OPTIREDUCE_STATS_EVERY", &Config::stats_every, 0, 1'000'000'000, nullptr,
   "Bounded mode: log a compact statistics line every N steps per communicator; 0 = never."},
  {"OPTIREDUCE_FAULT_SEED", &Config::fault_seed, 0, 1.8e19, nullptr,
   "Seed of the fault injector (tests, benchmarks)."},
  {"OPTIREDUCE_FAULT_DROP", &Config::fault_drop, 0, 1, nullptr,
   "Fault injector: probability that a transmitted datagram starts a loss burst."},
  {"OPTIREDUCE_FAULT_BURST", &Config::fault_burst, 1, 1e6, nullptr,
   "Fault injector: mean length of a loss burst in datagrams (1 = independent losses); a "
   "burst also ends when the endpoint sends nothing for 10 ms."},
  {"OPTIREDUCE_FAULT_DUP", &Config::fault_dup, 0, 1, nullptr,
   "Fault injector: probability that a datagram is sent twice."},
  {"OPTIREDUCE_FAULT_REORDER", &Config::fault_reorder, 0, 1, nullptr,
   "Fault injector: probability that a datagram is held back and sent after its successors."},
  {"OPTIREDUCE_FAULT_DELAY_PROB", &Config::fault_delay_prob, 0, 1, nullptr,
   "Fault injector: probability that a datagram is delayed."},
  {"OPTIREDUCE_FAULT_DELAY_US", &Config::fault_delay_us, 0, 1e8, nullptr,
   "Fault injector: scale (minimum) of the Pareto-distributed delay, in microseconds."},
  {"OPTIREDUCE_FAULT_DELAY_ALPHA", &Config::fault_delay_alpha, 0.1, 100, nullptr,
   "Fault injector: Pareto shape of the delay; smaller is heavier-tailed."},
  {"OPTIREDUCE_INCAST", &Config::incast, 1, 1 << 20, "max|auto",
   "TAR: senders a receiver admits at once (`max`: all N-1; `auto`: each receiver adapts it).",
   nullptr, kIncastNamed},
  {"OPTIREDUCE_HADAMARD", &Config::hadamard, 0, 1, nullptr,
   "TAR: encode buckets with the randomized Hadamard transform in bounded mode."},
  {"OPTIREDUCE_HADAMARD_BLOCK", &Config::hadamard_block, 2, 1 << 24, nullptr,
   "TAR: Hadamard block size in elements (a power of two)."},
  {"OPTIREDUCE_SAFEGUARD", &Config::safeguard, 0, 1, nullptr,
   "TAR: fraction of elements lost in one call above which the call is flagged (and redone if OPTIREDUCE_SAFEGUARD_REDO)."},
  {"OPTIREDUCE_SAFEGUARD_REDO", &Config::safeguard_redo, 0, 1, nullptr,
   "TAR: redo a flagged call exactly."},
  {"OPTIREDUCE_EXACT_BELOW", &Config::exact_below_bytes, 0, 1 << 30, nullptr,
   "TAR: buffers smaller than this many bytes always go exactly (norms, loss values)."},
  {"OPTIREDUCE_NONFINITE_AGREE", &Config::nonfinite_agree, 0, 1, nullptr,
   "TAR, bounded calls: each rank scans its input for NaN/Inf and the ranks agree exactly (a 1-byte all-to-all, shared with the safeguard's redo) whether any had one; then every rank's output is the quiet NaN throughout (the exact result with OPTIREDUCE_SAFEGUARD_REDO), so all ranks take the same decision (e.g. a GradScaler skipping the step). Off, a NaN lost in transit can come out finite on some ranks only. Costs each bounded call a wait for the slowest rank to finish its pass, which gives up bounded mode's tolerance of stragglers: off by default."},
  {"OPTIREDUCE_RESYNC_STEPS", &Config::resync_steps, 0, 1000000, nullptr,
   "PyTorch hook (`optireduce.torch`; the libraries validate it and nothing else): every this many steps of a bounded training, the hook asks in one exact 4-byte call whether any rank lost phase-2 elements since the last time (its replica then drifted from its peers'), and if one did, averages the model's parameters exactly during that step's backward pass, so every replica holds the same bits again. 0: never. Exact mode and OPTIREDUCE_ALLGATHER_MODE=exact never drift."},
  {"OPTIREDUCE_HOME", &Config::home, 0, 0, nullptr,
   "Build tools only (the libraries never read it): where `nccl-tests-patches/apply-and-build.sh` finds an installed liboptireduce, the install prefix holding `include/optireduce.h` (docs/gpu.md)."},
  {"OPTIREDUCE_NCCL_TESTS_DIR", &Config::nccl_tests_dir, 0, 0, nullptr,
   "Tests only: an nccl-tests checkout; the `nccl_tests` test suite then checks that `nccl-tests-patches/` applies to it and builds, and skips without it."},
};
// clang-format on

bool parse_bool(const char* v, bool* out) {
  if (!std::strcmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes") ||
      !strcasecmp(v, "on")) {
    *out = true;
    return true;
  }
  if (!std::strcmp(v, "0") || !strcasecmp(v, "false") || !strcasecmp(v, "no") ||
      !strcasecmp(v, "off")) {
    *out = false;
    return true;
  }
  return false;
}

// The names of a row's '|'-separated `choices`, in order. Only parsing and the README table
// read it, never a hot path.
std::vector<std::string> choice_list(const char* choices) {
  std::vector<std::string> out;
  for (const char* p = choices;;) {
    const char* bar = std::strchr(p, '|');
    if (bar == nullptr) {
      out.emplace_back(p);
      return out;
    }
    out.emplace_back(p, static_cast<size_t>(bar - p));
    p = bar + 1;
  }
}

std::string int_range_text(const ParamSpec& s) {
  return "an integer in [" + std::to_string(static_cast<long long>(s.min)) + ", " +
         std::to_string(static_cast<long long>(s.max)) + "]";
}

std::string range_text(const ParamSpec& s) {
  char buf[96];
  std::snprintf(buf, sizeof(buf), "a number in [%g, %g]", s.min, s.max);
  return buf;
}

// Applies one value; returns an empty string or the reason it is invalid.
std::string apply(const ParamSpec& s, const char* v, Config* c) {
  return std::visit(
      [&](auto member) -> std::string {
        using T = std::remove_reference_t<decltype(c->*member)>;
        if constexpr (std::is_same_v<T, std::string>) {
          if (s.choices && choice_index(s.choices, v) < 0)
            return std::string("one of ") + s.choices;
          c->*member = v;
        } else if constexpr (std::is_enum_v<T>) {
          const int i = choice_index(s.choices, v);
          if (i < 0) return std::string("one of ") + s.choices;
          c->*member = static_cast<T>(i);
        } else if constexpr (std::is_same_v<T, bool>) {
          bool b;
          if (!parse_bool(v, &b)) return "0/1, true/false, yes/no or on/off";
          c->*member = b;
        } else if constexpr (std::is_same_v<T, double>) {
          char* end = nullptr;
          errno = 0;
          const double d = std::strtod(v, &end);
          if (errno || end == v || *end || !std::isfinite(d) || d < s.min || d > s.max)
            return range_text(s);
          c->*member = d;
        } else {
          if (s.choices != nullptr) {
            if (const int i = choice_index(s.choices, v); i >= 0) {
              c->*member = static_cast<T>(s.named[i]);
              return {};
            }
          }
          char* end = nullptr;
          errno = 0;
          // base 0 accepts 0x.. so that hex traffic classes read naturally.
          const long long x = std::strtoll(v, &end, 0);
          if (errno || end == v || *end || static_cast<double>(x) < s.min ||
              static_cast<double>(x) > s.max)
            return (s.choices != nullptr ? std::string("one of ") + s.choices + " or " : "") +
                   int_range_text(s);
          c->*member = static_cast<T>(x);
        }
        return {};
      },
      s.field);
}

std::string default_text(const ParamSpec& s) {
  const Config d;
  return std::visit(
      [&](auto member) -> std::string {
        using T = std::remove_cvref_t<decltype(d.*member)>;
        if constexpr (std::is_same_v<T, std::string>) {
          return (d.*member).empty() ? "(auto)" : d.*member;
        } else if constexpr (std::is_enum_v<T>) {
          return choice_list(s.choices).at(static_cast<size_t>(d.*member));
        } else if constexpr (std::is_same_v<T, bool>) {
          return d.*member ? "1" : "0";
        } else if constexpr (std::is_same_v<T, double>) {
          char buf[32];
          std::snprintf(buf, sizeof(buf), "%g", d.*member);
          return buf;
        } else {
          if (s.choices != nullptr) {
            const std::vector<std::string> names = choice_list(s.choices);
            for (size_t i = 0; i < names.size(); ++i) {
              if (s.named[i] == static_cast<int64_t>(d.*member)) return names[i];
            }
          }
          return std::to_string(d.*member);
        }
      },
      s.field);
}

std::mutex g_mu;
Config g_config;
Status g_status;
std::string g_error;
bool g_loaded = false;

void load_locked() {
  std::vector<std::string> warnings;
  g_config = Config();
  g_status = parse_config(&g_config, &g_error, &warnings);
  for (const auto& w : warnings) std::fprintf(stderr, "optireduce WARN %s\n", w.c_str());
  g_loaded = true;
}

}  // namespace

int choice_index(const char* choices, const char* v) {
  const std::vector<std::string> names = choice_list(choices);
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == v) return static_cast<int>(i);
  }
  return -1;
}

Status parse_config(Config* out, std::string* error, std::vector<std::string>* warnings,
                    EnvLookup lookup) {
  Config c;
  auto get = [&](const char* name) { return lookup ? lookup(name) : std::getenv(name); };
  for (const auto& s : kParams) {
    const char* name = s.name;
    const char* v = get(name);
    if ((v == nullptr || *v == '\0') && s.fallback != nullptr) v = get(name = s.fallback);
    if (v == nullptr || *v == '\0') continue;
    const std::string why = apply(s, v, &c);
    if (!why.empty()) {
      if (error) *error = std::string("invalid ") + name + "=\"" + v + "\": expected " + why;
      return Status(Errc::kInvalidUsage);
    }
    if (s.check != nullptr) {
      if (const std::string bad = s.check(v); !bad.empty()) {
        if (error) *error = std::string("invalid ") + name + "=\"" + v + "\": " + bad;
        return Status(Errc::kInvalidUsage);
      }
    }
    if (s.source != nullptr) c.*s.source = name;
  }
  if (c.max_datagram_bytes != 0 && c.max_datagram_bytes < 256) {
    if (error) *error = "invalid OPTIREDUCE_MAX_DATAGRAM: must be 0 or at least 256";
    return Status(Errc::kInvalidUsage);
  }
  if (c.rto_min_us > c.rto_max_us) {
    if (error) *error = "invalid OPTIREDUCE_RTO_MIN_US: larger than OPTIREDUCE_RTO_MAX_US";
    return Status(Errc::kInvalidUsage);
  }
  // Below a few retransmission timeouts, a peer behind a congested path would be condemned
  // while the protocol is still legitimately backing off.
  if (c.peer_timeout_ms * 1000 < 4 * c.rto_max_us) {
    if (error)
      *error = "invalid OPTIREDUCE_PEER_TIMEOUT_MS=" + std::to_string(c.peer_timeout_ms) +
               ": must be at least 4 x OPTIREDUCE_RTO_MAX_US (" +
               std::to_string(4 * c.rto_max_us / 1000) + " ms)";
    return Status(Errc::kInvalidUsage);
  }
  if (c.hadamard_block & (c.hadamard_block - 1)) {
    if (error) *error = "invalid OPTIREDUCE_HADAMARD_BLOCK: must be a power of two";
    return Status(Errc::kInvalidUsage);
  }
  // A misspelt variable silently doing nothing is the worst kind of configuration bug.
  if (warnings && !lookup) {
    for (char** e = environ; e && *e; ++e) {
      if (std::strncmp(*e, "OPTIREDUCE_", 11) != 0) continue;
      const char* eq = std::strchr(*e, '=');
      const std::string name(*e, eq ? static_cast<size_t>(eq - *e) : std::strlen(*e));
      bool known = false;
      for (const auto& s : kParams) known = known || name == s.name;
      if (!known) warnings->push_back("unknown variable " + name + " ignored (see README)");
    }
  }
  *out = c;
  return Status::ok();
}

const Config& global_config() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_loaded) load_locked();
  return g_config;
}

Status global_config_status(std::string* error) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_loaded) load_locked();
  if (error) *error = g_error;
  return g_status;
}

void reload_global_config() {
  std::lock_guard<std::mutex> lock(g_mu);
  load_locked();
}

std::string params_markdown_table() {
  std::string t = "| Variable | Default | Meaning |\n|---|---|---|\n";
  for (const auto& s : kParams) {
    std::string allowed;
    if (s.choices) {
      const std::vector<std::string> names = choice_list(s.choices);
      allowed = " One of `" + names.front() + "`";
      for (size_t i = 1; i < names.size(); ++i) allowed += ", `" + names[i] + "`";
      if (std::holds_alternative<int64_t Config::*>(s.field)) allowed += ", or " + int_range_text(s);
      allowed += ".";
    }
    t += std::string("| `") + s.name + "` | `" + default_text(s) + "` | " + s.doc + allowed + " |\n";
  }
  return t;
}

}  // namespace optireduce
