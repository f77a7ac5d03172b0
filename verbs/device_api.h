// The verbs datapath's entry point, declared without any libibverbs type so that the datapath
// selector (select.cc) builds on machines without the libibverbs headers.
#pragma once

#include <memory>
#include <vector>

#include "transport/datapath.h"
#include "transport/params.h"

namespace optireduce {

// Appends a Device for every ACTIVE port of every RDMA device that OPTIREDUCE_IB_HCA admits.
// Returns ok with nothing appended when libibverbs loads but no port is usable; kSystem
// (ENOENT, ENOSYS) when libibverbs itself is missing or incomplete, or the build had no
// verbs headers; kInvalidUsage when OPTIREDUCE_GID_INDEX names no GID on a selected port.
Status open_verbs_devices(const Config& cfg, std::vector<std::unique_ptr<Device>>* out);

}  // namespace optireduce
