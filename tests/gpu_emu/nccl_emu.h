// The emulated NCCL's test-facing side: how a test makes the "user's" communicator (the
// emulator's ncclCommInitRank) over the out-of-band mesh of tests/plugin/procs.h, and reads what
// the real plugin saw on a communicator.
#pragma once

#include <nccl.h>

#include <string>

#include "plugin/optireduce_net.h"
#include "tests/plugin/procs.h"

namespace optireduce::gpu_emu {

// Every communicator of this process bootstraps over `mesh` (it plays NCCL's bootstrap
// network) and loads the plugin at `plugin_path` (it plays NCCL_NET_PLUGIN).
void set_bootstrap(testing::Mesh* mesh, const std::string& plugin_path);

// Collective over the mesh: a communicator of every rank, as ncclCommInitRank makes one, with
// `traffic_class` as its config (-1: none, as NCCL passes NCCL_NET_TRAFFIC_CLASS_UNDEF).
ncclComm_t comm_init(int traffic_class = -1);

// What the plugin's optireduceNetGetStats says about this communicator.
optireduceNetStats plugin_stats(ncclComm_t comm);
// The traffic class the plugin was given for this communicator.
int traffic_class(ncclComm_t comm);
// The most receives that one group (ncclGroupStart .. ncclGroupEnd) held on this process's
// communicators of `traffic_class`: what a receiver's incast was, as NCCL would run it.
int max_group_recvs(int traffic_class);

// What the last ncclCommSplit of this process asked for.
struct SplitConfig {
  std::string net_name;  // "" when the config named none
  int traffic_class = -1;
  int split_share = 0;
};
SplitConfig last_split();
// The NCCL version ncclGetVersion reports (default: the header's NCCL_VERSION_CODE).
void set_version(int version_code);

// The p2p chunk (NCCL_P2P_NET_CHUNKSIZE's default) and the slots per connection.
inline constexpr size_t kChunkBytes = 128 * 1024;
inline constexpr int kSlots = 8;

}  // namespace optireduce::gpu_emu
