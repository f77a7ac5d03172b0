// RDMA device discovery for the UD datapath (which HCAs and ports are usable, their GID, MTU,
// speed) and the per-port state every endpoint on the port shares: the device context, the
// protection domain and the address-handle cache.
#pragma once

#include <infiniband/verbs.h>

#include <memory>
#include <mutex>
#include <string_view>
#include <vector>

#include "transport/datapath.h"
#include "transport/params.h"
#include "verbs/address.h"
#include "verbs/device_api.h"
#include "verbs/ibv_symbols.h"

namespace optireduce {
namespace verbs {

// Whether OPTIREDUCE_IB_HCA's value (NCCL_IB_HCA's syntax: transport/ifname_filter.h) admits
// port `port` of `device`; empty admits all.
bool hca_selected(std::string_view filter, std::string_view device, int port);

// Link speed in Mbit/s from an IB speed code (active_speed_ex where non-zero, else
// active_speed) and ibv_port_attr's active_width code; 0 if either code is unknown, so that the
// caller can say so rather than report a wrong figure.
int port_speed_mbps(uint32_t speed_code, uint8_t width_code);

// One open port. Owned jointly by its Device and every endpoint opened on it, so that an
// endpoint outliving the device list (NCCL closes comms after finalising devices) still holds a
// valid context and PD.
class PortContext {
 public:
  PortContext(const IbvSymbols* ibv, ibv_context* ctx, ibv_pd* pd)
      : ibv_(ibv), ctx_(ctx), pd_(pd) {}
  ~PortContext();
  PortContext(const PortContext&) = delete;
  PortContext& operator=(const PortContext&) = delete;

  const IbvSymbols& ibv() const { return *ibv_; }
  ibv_context* context() const { return ctx_; }
  ibv_pd* pd() const { return pd_; }

  // The address handle for `peer`, created on first use and kept until the port closes: many
  // connections go to the same few hosts, and an AH is a device object whose creation may
  // resolve a route. Thread-safe (endpoints of different connections share the cache).
  Status address_handle(const UdAddress& peer, ibv_ah** out);
  size_t cached_address_handles();

  // Set once at discovery, read-only afterwards.
  std::string name;
  uint8_t port = 1;
  int gid_index = 0;
  uint8_t traffic_class = 0;  // OPTIREDUCE_IB_TC
  uint8_t service_level = 0;  // OPTIREDUCE_IB_SL
  uint8_t gid[16] = {};
  uint16_t lid = 0;
  bool ethernet = true;    // RoCE; false = InfiniBand link layer
  uint32_t mtu_bytes = 0;  // active MTU: the largest UD message
  uint32_t max_qp_wr = 0;  // device limits that bound ring sizes
  uint32_t max_cqe = 0;

 private:
  struct AhEntry {
    uint8_t gid[16];
    uint16_t lid;
    ibv_ah* ah;
  };
  const IbvSymbols* ibv_;
  ibv_context* ctx_;
  ibv_pd* pd_;
  std::mutex mu_;
  std::vector<AhEntry> ahs_;  // guarded by mu_; a handful of entries, one per peer host
};

// A caller's buffer registered with a port's protection domain (VerbsDevice::register_memory).
// Its domain() is the PD, which is how an endpoint knows the lkey below is valid for its QP.
// Holds the port, so the PD outlives the registration whatever order things close in.
class VerbsRegion final : public MemoryRegion {
 public:
  VerbsRegion(std::shared_ptr<PortContext> port, ibv_mr* mr, const void* data, size_t bytes,
              bool writable)
      : MemoryRegion(data, bytes, port->pd()),
        port_(std::move(port)),
        mr_(mr),
        lkey_(mr->lkey),
        writable_(writable) {}
  ~VerbsRegion() override;
  uint32_t lkey() const { return lkey_; }
  // Registered for local write: the device may receive into it (receive lanes, aim_lane.h).
  bool writable() const { return writable_; }

 private:
  std::shared_ptr<PortContext> port_;
  ibv_mr* mr_;
  uint32_t lkey_;  // mr_->lkey, read once: the send path takes it per datagram
  bool writable_;
};

class VerbsDevice final : public Device {
 public:
  VerbsDevice(std::shared_ptr<PortContext> port, DeviceInfo info)
      : port_(std::move(port)), info_(std::move(info)) {}
  const DeviceInfo& info() const override { return info_; }
  Status open_endpoint(const EndpointOptions& opts, std::unique_ptr<Endpoint>* out) override;
  // One unbound UD QP carries every connection of a device and thread (verbs/endpoint.h).
  bool can_share() const override { return true; }
  // ibv_reg_mr on the port's PD, with local write access where the pages allow it (a receive
  // posted into the buffer needs it; a send does not).
  Status register_memory(void* data, size_t bytes, std::unique_ptr<MemoryRegion>* out) override;
  // ibv_reg_dmabuf_mr where libibverbs has it (rdma-core 34 on), else register_memory.
  Status register_dmabuf(void* data, size_t bytes, uint64_t offset, int fd,
                         std::unique_ptr<MemoryRegion>* out) override;
  const std::shared_ptr<PortContext>& port() const { return port_; }

 private:
  std::shared_ptr<PortContext> port_;
  DeviceInfo info_;
};

// Zeroed, page-aligned memory for rings the device reads or writes (registration pins whole
// pages, and an aligned base keeps every slot's cache-line layout exact); std::free releases
// it. Null when out of memory.
uint8_t* alloc_ring_pages(size_t bytes);

// A UD QP from RESET (just created) through INIT (port, P_Key index 0, our Q_Key) and RTR to
// RTS: what the endpoint's QP and every receive lane's go through.
Status ud_qp_to_rts(const IbvSymbols& ibv, ibv_qp* qp, uint8_t port);

// open_verbs_devices (device_api.h) over the caller's libibverbs table instead of the
// process's. Tests wrap a call of it to make a device fail where real ones do so rarely that
// no run would show it (a QP that will not move to the error state); `ibv` must outlive the
// devices and every endpoint opened on them.
Status open_verbs_devices_with(const IbvSymbols& ibv, const Config& cfg,
                               std::vector<std::unique_ptr<Device>>* out);

}  // namespace verbs
}  // namespace optireduce
