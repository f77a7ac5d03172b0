// Connection counters as the plugin keeps and reports them: ConnStats summed per context and per
// process (a comm's last counters are added when it closes), and copied into the public C struct
// of plugin/optireduce_net.h. Both operations, and the proof that the C struct matches, are
// generated from OPTIREDUCE_CONN_STATS (transport/stats.h). stats.cc serves the C query API.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <type_traits>

#include "plugin/optireduce_net.h"
#include "transport/stats.h"

namespace optireduce::plugin {

// Adds `s` into `into`, counter by counter. Gauges (tbUs, budgetUs, ...) are current values, not
// counters: they are kept as the largest, and only from a `live` connection's counters.
inline void add_stats(ConnStats* into, const ConnStats& s, bool live) {
#define OPTIREDUCE_ADD_COUNTER_(name, c_name) into->name += s.name;
#define OPTIREDUCE_MAX_GAUGE_(name, c_name) \
  if (live) into->name = std::max(into->name, s.name);
  OPTIREDUCE_CONN_STATS(OPTIREDUCE_ADD_COUNTER_, OPTIREDUCE_MAX_GAUGE_)
#undef OPTIREDUCE_ADD_COUNTER_
#undef OPTIREDUCE_MAX_GAUGE_
}

inline optireduceNetCounters to_c_counters(const ConnStats& s) {
  optireduceNetCounters c{};
#define OPTIREDUCE_COPY_(name, c_name) c.c_name = s.name;
  OPTIREDUCE_CONN_STATS(OPTIREDUCE_COPY_, OPTIREDUCE_COPY_)
#undef OPTIREDUCE_COPY_
  return c;
}

// The C struct stays written out in optireduce_net.h rather than generated from the list: it is
// the one header users read and bind to (C, ctypes, cffi), it must stay C89 and self-contained,
// and its layout is frozen ABI. to_c_counters above fails to compile for a listed counter the C
// struct lacks; the asserts below catch the reverse (a C member with no list entry) and a member
// out of the list's order, which would break callers built against an older header.
namespace detail {

// Each listed counter's position in the list, and how many there are.
enum CounterIndex : size_t {
#define OPTIREDUCE_INDEX_(name, c_name) k_##name,
  OPTIREDUCE_CONN_STATS(OPTIREDUCE_INDEX_, OPTIREDUCE_INDEX_)
#undef OPTIREDUCE_INDEX_
};
#define OPTIREDUCE_ONE_(name, c_name) +1
inline constexpr size_t kCounterCount = 0 OPTIREDUCE_CONN_STATS(OPTIREDUCE_ONE_, OPTIREDUCE_ONE_);
#undef OPTIREDUCE_ONE_

#define OPTIREDUCE_C_MEMBER_AT_ITS_PLACE_(name, c_name)                                      \
  static_assert(std::is_same_v<decltype(optireduceNetCounters::c_name), uint64_t> &&         \
                    offsetof(optireduceNetCounters, c_name) == k_##name * sizeof(uint64_t),  \
                "optireduceNetCounters." #c_name " is not a uint64_t at the place of " #name \
                " in OPTIREDUCE_CONN_STATS");
OPTIREDUCE_CONN_STATS(OPTIREDUCE_C_MEMBER_AT_ITS_PLACE_, OPTIREDUCE_C_MEMBER_AT_ITS_PLACE_)
#undef OPTIREDUCE_C_MEMBER_AT_ITS_PLACE_

static_assert(sizeof(optireduceNetCounters) == kCounterCount * sizeof(uint64_t),
              "optireduceNetCounters has a member OPTIREDUCE_CONN_STATS does not list");

// How many counters each OPTIREDUCE_NET_STATS_VERSION has: a counter appended to the list must
// come with a new version, so that callers can tell whether the library fills it.
inline constexpr size_t kCountersOfVersion[] = {0, 22, 24, 25, 27, 28, 29, 30, 32};
static_assert(OPTIREDUCE_NET_STATS_VERSION + 1 == std::size(kCountersOfVersion) &&
                  kCountersOfVersion[OPTIREDUCE_NET_STATS_VERSION] == kCounterCount,
              "counters added: bump OPTIREDUCE_NET_STATS_VERSION and extend kCountersOfVersion");

}  // namespace detail
}  // namespace optireduce::plugin
