// The plugin's end of NCCL's logger: the transport's lines (OR_WARN, OR_INFO) go to the function
// NCCL handed to init, and back to stderr once that function may be gone (exit, unload).
#pragma once

#include "plugin/nccl/types.h"

namespace optireduce::plugin {

// Routes the transport's log to `logger` (null keeps the one installed before) and raises the
// level to INFO when NCCL_DEBUG asks NCCL to print INFO lines.
void install_logger(nccl::ncclDebugLogger_t logger);

// A line for NCCL's INIT/ENV subsystems (what NCCL users filter on for set-up decisions).
void log_init_info(const char* msg);

// Back to stderr: NCCL's logger may use NCCL's own statics, destroyed during exit, and its code
// is no business of a library that is being unloaded.
void detach_logger();

}  // namespace optireduce::plugin
