// Implements the communicator half of plugin/context.h: what a communicator's traffic class asks
// of it, building its context over the process's engine, the options its send connections open
// with, and how each of its transfers is posted. The entry points (api.cc) call these and keep
// only NCCL's side of each call: argument checks, handles, errors.
#include <cinttypes>
#include <string>

#include "plugin/api.h"
#include "plugin/context.h"
#include "transport/log.h"
#include "transport/params.h"

namespace optireduce::plugin {

SiblingClass sibling_class(int traffic_class, const Config& cfg) {
  if (traffic_class == nccl::NCCL_NET_TRAFFIC_CLASS_UNDEF) return SiblingClass::kNone;
  if (traffic_class == cfg.bounded_traffic_class) return SiblingClass::kBounded;
  if (traffic_class == cfg.bounded_traffic_class + 1) return SiblingClass::kUntilStarted;
  return SiblingClass::kNone;
}

ncclResult_t new_context(uint64_t comm_id, int traffic_class, int abi,
                         std::shared_ptr<Context>* out) {
  std::string error;
  if (Status s = global_config_status(&error); !s) {
    OR_WARN("invalid configuration: %s", error.c_str());
    return nccl::ncclInvalidUsage;
  }
  std::shared_ptr<Engine> engine;
  if (Status s = Engine::acquire(&engine); !s) {
    OR_WARN("cannot start the transport: %s (errno %d)", errc_name(s.code()), s.sys_errno());
    return to_nccl(s);
  }
  if (engine->device_count() < 1) {
    OR_WARN("no usable network interface (see OPTIREDUCE_IFNAME)");
    return nccl::ncclSystemError;
  }
  const Config& cfg = engine->config();
  auto c = std::make_shared<Context>();
  c->comm_id = comm_id;
  const SiblingClass sibling = sibling_class(traffic_class, cfg);
  const bool by_class = sibling != SiblingClass::kNone;
  c->bounded = cfg.mode == ModeChoice::kBounded || by_class;
  c->p2p_only = by_class;
  c->until_started = sibling == SiblingClass::kUntilStarted;
  c->abi = abi;
  c->env = NcclEnvFacts::from_environment();
  // The bounded traffic class is liboptireduce's: its kernels find losses by the marker, and
  // zeros would pass for received data (lost contributions summed as 0, no estimate, no count).
  // So that communicator carries the marker whatever OPTIREDUCE_FILL says.
  c->fill = cfg.fill == FillChoice::kMarker || by_class ? Fill::kMarker : Fill::kZero;
  c->engine = std::move(engine);
  c->group = std::make_unique<BoundedGroup>(cfg);
  c->group->set_label(comm_id);
  OR_INFO("context %p comm 0x%016" PRIx64 ": %s delivery%s", static_cast<void*>(c.get()), comm_id,
          c->bounded ? "bounded" : "exact",
          c->bounded ? (c->fill == Fill::kMarker ? ", marker fill" : ", zero fill") : "");
  *out = std::move(c);
  return nccl::ncclSuccess;
}

ConnOptions send_conn_options(const Context& c, const ncclNetCommConfig_v11_t* config,
                              bool* by_class) {
  // v10 names the traffic class per connection; it means one of liboptireduce's communicators,
  // which need the marker (see new_context).
  const SiblingClass sibling = config != nullptr
                                   ? sibling_class(config->trafficClass, c.engine->config())
                                   : SiblingClass::kNone;
  *by_class = sibling != SiblingClass::kNone;
  ConnOptions opts;
  opts.delivery = c.bounded || *by_class ? Delivery::kBounded : Delivery::kExact;
  opts.fill = *by_class ? Fill::kMarker : c.fill;
  opts.group = c.group.get();
  // The receiver learns it from the handshake: on v8-v10 its context knows no class.
  opts.until_started = c.until_started || sibling == SiblingClass::kUntilStarted;
  return opts;
}

TransferFacts facts_of(const Context& c) {
  TransferFacts f;
  f.abi = c.abi;
  f.env = c.env;
  f.p2p_only = c.p2p_only;
  f.attr.seen = c.attr_seen.load(std::memory_order_relaxed);
  f.attr.op = c.attr_op.load(std::memory_order_relaxed);
  f.attr.proto = c.attr_proto.load(std::memory_order_relaxed);
  return f;
}

MsgDelivery transfer_delivery(Context& c, bool bounded_conn, const TransferFacts& facts,
                              bool send) {
  if (!bounded_conn) return MsgDelivery::kAsConnection;
  const MsgDelivery how = send ? send_delivery(facts) : recv_delivery(facts);
  if (how == MsgDelivery::kExact && !c.told_exact.exchange(true, std::memory_order_relaxed)) {
    OR_INFO("comm 0x%016" PRIx64
            ": LL/LL128 transfers on its bounded connections are "
            "delivered exact (NCCL's %s)",
            c.comm_id, facts.ll_sentinel ? "optional-completion mark" : "setNetAttr");
  }
  return how;
}

}  // namespace optireduce::plugin
