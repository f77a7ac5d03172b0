// Compile-time agreement between our ABI declarations (plugin/nccl/) and the nccl.h installed
// on this machine. Built only when nccl.h is found, never linked into the plugin (nccl.h pulls
// in the CUDA runtime headers; no CUDA symbol is referenced, so nothing links CUDA).
#include <nccl.h>

#include <climits>
#include <type_traits>

#include "plugin/api.h"
#include "plugin/nccl/net_v11.h"
#include "plugin/nccl/types.h"

namespace ours = optireduce::nccl;

// Result codes: every value NCCL defines, and nothing beyond what we know.
static_assert(static_cast<int>(ours::ncclSuccess) == ncclSuccess);
static_assert(static_cast<int>(ours::ncclUnhandledCudaError) == ncclUnhandledCudaError);
static_assert(static_cast<int>(ours::ncclSystemError) == ncclSystemError);
static_assert(static_cast<int>(ours::ncclInternalError) == ncclInternalError);
static_assert(static_cast<int>(ours::ncclInvalidArgument) == ncclInvalidArgument);
static_assert(static_cast<int>(ours::ncclInvalidUsage) == ncclInvalidUsage);
static_assert(static_cast<int>(ours::ncclRemoteError) == ncclRemoteError);
static_assert(static_cast<int>(ours::ncclInProgress) == ncclInProgress);
static_assert(ncclNumResults == 8, "NCCL added a result code: review plugin/nccl/types.h");
static_assert(sizeof(ncclResult_t) == sizeof(ours::ncclResult_t));

// The net-plugin header is not public in 2.28; if a future nccl.h exposes these, compare them.
#ifdef NCCL_NET_HANDLE_MAXSIZE
static_assert(NCCL_NET_HANDLE_MAXSIZE == ours::NCCL_NET_HANDLE_MAXSIZE);
#endif
#ifdef NCCL_PTR_HOST
static_assert(NCCL_PTR_HOST == ours::NCCL_PTR_HOST);
static_assert(NCCL_PTR_CUDA == ours::NCCL_PTR_CUDA);
#endif
#ifdef NCCL_NET_MAX_REQUESTS
static_assert(NCCL_NET_MAX_REQUESTS == ours::NCCL_NET_MAX_REQUESTS);
#endif

// We target NCCL 2.28 (net ABI v11); an older nccl.h means the v11 facts were not checked.
static_assert(NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0),
              "nccl.h older than 2.28: the v11 plugin ABI facts do not apply");

// Bounded selection rides on ncclConfig_t.trafficClass (issue 3): it must exist and be an int,
// and NCCL's "unset" must not collide with a valid bounded class (>= 0).
static_assert(std::is_same_v<decltype(ncclConfig_t{}.trafficClass), int>);
static_assert(NCCL_CONFIG_UNDEF_INT < 0);
static_assert(ours::NCCL_NET_TRAFFIC_CLASS_UNDEF < 0);

// The ids NCCL passes to v11 init are 64-bit like ours; the handle NCCL exchanges between
// ranks for a communicator is 128 bytes, the same bound as the net handle.
static_assert(NCCL_UNIQUE_ID_BYTES == ours::NCCL_NET_HANDLE_MAXSIZE);
static_assert(optireduce::plugin::kMaxMessageBytes <= ours::NCCL_MAX_NET_SIZE_BYTES);
