// The per-transfer protocol rules (plugin/transfer_kind.h) as a table: every way NCCL can tell
// (or fail to tell) the plugin what a transfer is, and the delivery each side must choose.
#include "plugin/transfer_kind.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "plugin/nccl/types.h"

namespace optireduce::plugin {
namespace {

constexpr uint32_t kAllReduce = 1u << 4;
constexpr uint32_t kSend = 1u << 6;
constexpr uint32_t kRecv = 1u << 7;
constexpr uint32_t kP2pSet = (1u << 6) | (1u << 7) | (1u << 8);  // a p2p connection's attribute
constexpr uint32_t kLL = nccl::NCCL_NET_PROTO_LL;
constexpr uint32_t kLL128 = nccl::NCCL_NET_PROTO_LL128;
constexpr uint32_t kSimple = nccl::NCCL_NET_PROTO_SIMPLE;
constexpr uint32_t kUndef = nccl::NCCL_NET_ATTR_UNDEF_BITS;

constexpr MsgDelivery B = MsgDelivery::kAsConnection;  // bounded (as the connection)
constexpr MsgDelivery X = MsgDelivery::kExact;
constexpr MsgDelivery A = MsgDelivery::kAskReceiver;

TransferFacts facts(int abi, bool seen, uint32_t op, uint32_t proto) {
  TransferFacts f;
  f.abi = abi;
  f.attr = {seen, op, proto};
  return f;
}

TEST(TransferKind, CollectivesNamedBySetNetAttr) {
  for (const bool sentinel : {false, true}) {
    TransferFacts f = facts(11, true, kAllReduce, kSimple);
    f.ll_sentinel = sentinel;
    EXPECT_EQ(send_delivery(f), B);
    EXPECT_EQ(recv_delivery(f), sentinel ? X : B) << "the mark always wins";
  }
  for (const uint32_t proto : {kLL, kLL128, kLL | kSimple, kUndef}) {
    const TransferFacts f = facts(11, true, kAllReduce, proto);
    EXPECT_EQ(send_delivery(f), X) << proto;
    EXPECT_EQ(recv_delivery(f), X) << proto;
  }
}

TEST(TransferKind, PointToPointIgnoresStaleProtocolBits) {
  for (const uint32_t op : {kSend, kRecv, kP2pSet}) {
    const TransferFacts f = facts(11, true, op, kLL128);  // left over from a collective
    EXPECT_EQ(send_delivery(f), B) << op;
    EXPECT_EQ(recv_delivery(f), B) << op;
  }
  // With NCCL's p2p LL buffers on, small p2p transfers may be LL: the sender asks, the receiver
  // has the mark (or, with optional completion off, cannot know and stays exact).
  TransferFacts f = facts(11, true, kSend, kSimple);
  f.env.p2p_ll_buffers = true;
  EXPECT_EQ(send_delivery(f), A);
  EXPECT_EQ(recv_delivery(f), B);
  f.ll_sentinel = true;
  EXPECT_EQ(recv_delivery(f), X);
  f.ll_sentinel = false;
  f.env.optional_completion = false;
  EXPECT_EQ(recv_delivery(f), X);
}

TEST(TransferKind, NothingNamesTheTransfer) {
  // ABI v8/v9 (NCCL 2.20-2.25): no setNetAttr, and the LL mark only from 2.24.
  for (const int abi : {8, 9}) {
    const TransferFacts f = facts(abi, false, 0, 0);
    EXPECT_EQ(send_delivery(f), A) << abi;
    EXPECT_EQ(recv_delivery(f), X) << abi;
    TransferFacts user = f;
    user.env.proto_simple_only = true;  // the user pinned NCCL on Simple
    EXPECT_EQ(send_delivery(user), B) << abi;
    EXPECT_EQ(recv_delivery(user), B) << abi;
  }
  // ABI v10 (NCCL 2.26-2.27): the mark is there, so an unmarked receive is Simple.
  TransferFacts f = facts(10, false, 0, 0);
  EXPECT_EQ(send_delivery(f), A);
  EXPECT_EQ(recv_delivery(f), B);
  f.ll_sentinel = true;
  EXPECT_EQ(recv_delivery(f), X);
  f.ll_sentinel = false;
  f.env.optional_completion = false;
  EXPECT_EQ(recv_delivery(f), X);
  // v11 before any transfer: only the connect-time attribute (op undefined) was seen.
  const TransferFacts connect_time = facts(11, true, kUndef, kUndef);
  EXPECT_EQ(send_delivery(connect_time), A);
  EXPECT_EQ(recv_delivery(connect_time), B);
}

TEST(TransferKind, TheSiblingCommunicatorIsPointToPoint) {
  for (const int abi : {10, 11}) {
    TransferFacts f = facts(abi, false, 0, 0);
    f.p2p_only = true;
    EXPECT_EQ(send_delivery(f), B) << abi;
    EXPECT_EQ(recv_delivery(f), B) << abi;
    f.env.p2p_ll_buffers = true;
    EXPECT_EQ(send_delivery(f), A) << abi;
  }
}

TEST(TransferKind, NcclsEnvironmentIsReadNotWritten) {
  setenv("NCCL_PROTO", "simple", 1);
  setenv("NCCL_ALLOC_P2P_NET_LL_BUFFERS", "1", 1);
  setenv("NCCL_NET_OPTIONAL_RECV_COMPLETION", "0", 1);
  NcclEnvFacts e = NcclEnvFacts::from_environment();
  EXPECT_TRUE(e.proto_simple_only);
  EXPECT_TRUE(e.p2p_ll_buffers);
  EXPECT_FALSE(e.optional_completion);
  setenv("NCCL_PROTO", "Simple,LL", 1);  // more than Simple: not pinned
  unsetenv("NCCL_ALLOC_P2P_NET_LL_BUFFERS");
  unsetenv("NCCL_NET_OPTIONAL_RECV_COMPLETION");
  e = NcclEnvFacts::from_environment();
  EXPECT_FALSE(e.proto_simple_only);
  EXPECT_FALSE(e.p2p_ll_buffers);
  EXPECT_TRUE(e.optional_completion);
  EXPECT_STREQ(std::getenv("NCCL_PROTO"), "Simple,LL");
  unsetenv("NCCL_PROTO");
}

}  // namespace
}  // namespace optireduce::plugin
