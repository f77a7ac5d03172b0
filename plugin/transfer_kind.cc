// Implements plugin/transfer_kind.h: the per-transfer rules, one function per side, so that the
// whole policy reads in one place and is tested without NCCL (tests/plugin/transfer_kind_test).
#include "plugin/transfer_kind.h"

#include <strings.h>

#include <bit>
#include <cstdlib>
#include <cstring>

#include "plugin/nccl/types.h"

namespace optireduce::plugin {
namespace {

bool env_is(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v != nullptr && strcasecmp(v, value) == 0;
}

// One collective, named by the last setNetAttr: its protocol bits are its own.
bool single_collective(const TransferAttr& a) {
  return a.seen && std::popcount(a.op) == 1 && (a.op & nccl::NCCL_NET_OP_COLLECTIVES) != 0;
}

// Point-to-point operations only (one, or the set a p2p connection was made for): the protocol
// bits say nothing about them.
bool point_to_point(const TransferAttr& a) {
  return a.seen && a.op != 0 && a.op != nccl::NCCL_NET_ATTR_UNDEF_BITS &&
         (a.op & nccl::NCCL_NET_OP_COLLECTIVES) == 0;
}

// The collective's protocol is Simple and nothing else (an undefined field has every bit set).
bool simple_only(uint32_t proto) {
  return proto == nccl::NCCL_NET_PROTO_SIMPLE;
}

}  // namespace

NcclEnvFacts NcclEnvFacts::from_environment() {
  NcclEnvFacts f;
  f.proto_simple_only = env_is("NCCL_PROTO", "Simple");
  f.p2p_ll_buffers = env_is("NCCL_ALLOC_P2P_NET_LL_BUFFERS", "1");
  f.optional_completion = !env_is("NCCL_NET_OPTIONAL_RECV_COMPLETION", "0");
  return f;
}

MsgDelivery send_delivery(const TransferFacts& f) {
  if (single_collective(f.attr)) {
    return simple_only(f.attr.proto) ? MsgDelivery::kAsConnection : MsgDelivery::kExact;
  }
  if (point_to_point(f.attr) || f.p2p_only) {
    return f.env.p2p_ll_buffers ? MsgDelivery::kAskReceiver : MsgDelivery::kAsConnection;
  }
  // Nothing names the transfer (ABI < v11, or no call yet): Simple only if the user pinned
  // NCCL there; otherwise the receiver, which may have the sentinel, decides.
  if (f.env.proto_simple_only && !f.env.p2p_ll_buffers) return MsgDelivery::kAsConnection;
  return MsgDelivery::kAskReceiver;
}

MsgDelivery recv_delivery(const TransferFacts& f) {
  if (f.ll_sentinel) return MsgDelivery::kExact;
  if (single_collective(f.attr)) {
    return simple_only(f.attr.proto) ? MsgDelivery::kAsConnection : MsgDelivery::kExact;
  }
  // NCCL 2.26+ (ABI v10+) marks every LL/LL128 receive with the sentinel unless the user turned
  // optional completion off: a receive without it is Simple. Older NCCL may not mark them.
  if (f.abi >= 10 && f.env.optional_completion) return MsgDelivery::kAsConnection;
  if ((point_to_point(f.attr) || f.p2p_only) && !f.env.p2p_ll_buffers) {
    return MsgDelivery::kAsConnection;
  }
  if (f.env.proto_simple_only && !f.env.p2p_ll_buffers) return MsgDelivery::kAsConnection;
  return MsgDelivery::kExact;
}

}  // namespace optireduce::plugin
