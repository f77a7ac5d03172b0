// Which transfers of a bounded communicator may lose data. NCCL's LL and LL128 protocols put
// flags inside the data that the GPU spins on: a hole, or a marker written into one, hangs the
// kernel. Only Simple-protocol transfers can be bounded, and NCCL may mix protocols on the same
// connection from one collective to the next, so the choice is made per transfer, from what
// NCCL tells the plugin about it, never by changing NCCL's environment (issue 14).
//
// What NCCL tells, by version (facts from NCCL's src/transport/net.cc):
//  - ABI v11+ (NCCL 2.28+): setNetAttr on the communicator's context right before the first
//    isend/irecv of each proxy operation, on the proxy thread that then posts it. For a
//    collective the attribute names the one protocol in use; for point-to-point operations it
//    names the operation only (the protocol bits are left over from an earlier call).
//  - NCCL 2.24+ (ABI v9 late, v10+): an LL/LL128 receive comes with NCCL's optional-completion
//    sentinel pre-stored in *request, unless NCCL_NET_OPTIONAL_RECV_COMPLETION=0.
//  - Point-to-point transfers use LL over the network only when the user set
//    NCCL_ALLOC_P2P_NET_LL_BUFFERS=1 (off by default); otherwise they are always Simple.
//  - NCCL_PROTO=Simple, set by the user, keeps every collective on Simple.
// The receiver's choice wins (its CTS pins a message exact, transport.h), so a sender that
// cannot tell asks the receiver instead of guessing, and never expires the message early.
#pragma once

#include <cstdint>

#include "transport/transport.h"

namespace optireduce::plugin {

// NCCL's own settings that change which protocols reach the network. Read, never written.
struct NcclEnvFacts {
  bool proto_simple_only = false;   // NCCL_PROTO=Simple (case-insensitive)
  bool p2p_ll_buffers = false;      // NCCL_ALLOC_P2P_NET_LL_BUFFERS=1
  bool optional_completion = true;  // NCCL_NET_OPTIONAL_RECV_COMPLETION is not 0
  static NcclEnvFacts from_environment();
};

// What setNetAttr last said on this context. `op` and `proto` are NCCL's bit masks; an
// attribute with an undefined or multi-bit op (the one NCCL sets at connect time) tells
// nothing about a transfer.
struct TransferAttr {
  bool seen = false;
  uint32_t op = 0;
  uint32_t proto = 0;
};

// The facts about one transfer, at its isend or irecv.
struct TransferFacts {
  int abi = 11;              // the net ABI version NCCL loaded the plugin with
  TransferAttr attr;         // the context's, at the time of the call
  bool ll_sentinel = false;  // irecv only: NCCL pre-stored the LL/LL128 sentinel
  bool p2p_only = false;     // the connection belongs to liboptireduce's sibling
                             // communicator (bounded traffic class): point-to-point only
  NcclEnvFacts env;
};

// How to post a transfer on a bounded connection (exact connections ignore it).
MsgDelivery send_delivery(const TransferFacts& f);
MsgDelivery recv_delivery(const TransferFacts& f);

}  // namespace optireduce::plugin
