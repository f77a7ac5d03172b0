// OPTIREDUCE_DATAPATH: which datapath's devices the engine opens (verbs, udp, or auto = verbs
// where an RDMA port is active, else UDP). The engine calls it through transport/transport.h,
// which declares the same function; the definition lives here because only this layer knows
// both datapaths.
#pragma once

#include <memory>
#include <vector>

#include "transport/datapath.h"
#include "transport/params.h"

namespace optireduce {

// verbs: the verbs devices, or kInvalidUsage (with a WARN saying why) when there are none.
// udp: the UDP devices. auto: the verbs devices when at least one port is active, else the UDP
// devices; a wrong OPTIREDUCE_GID_INDEX on an RDMA host is still an error.
Status open_datapath_devices(const Config& cfg, std::vector<std::unique_ptr<Device>>* out);

}  // namespace optireduce
