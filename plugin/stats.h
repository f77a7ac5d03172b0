// Connection counters as the plugin keeps and reports them: ConnStats summed per context and per
// process (a comm's last counters are added when it closes), and the C query API of
// plugin/optireduce_net.h that hands them to other libraries in the process (stats.cc).
#pragma once

#include "transport/stats.h"

namespace optireduce::plugin {

// Adds `s` into `into`, counter by counter. tbUs/tcUs are current values, not counters: they are
// kept as the largest, and only from a `live` connection's counters.
void add_stats(ConnStats* into, const ConnStats& s, bool live);

}  // namespace optireduce::plugin
