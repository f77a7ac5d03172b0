// Discovery of RDMA ports for the UD datapath: filters devices by OPTIREDUCE_IB_HCA, keeps
// ACTIVE ports, picks each port's GID (RoCE v2 IPv4 unless OPTIREDUCE_GID_INDEX says
// otherwise) and fills DeviceInfo. Also the per-port address-handle cache.
#include "verbs/device.h"

#include <endian.h>
#include <fcntl.h>
#include <limits.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#include "transport/ifname_filter.h"
#include "transport/log.h"
#include "verbs/endpoint.h"

namespace optireduce {
namespace verbs {
namespace {

// GID table entries scanned per port. Devices fill their table from index 0 up, one or two
// entries per address of the bound netdev; 256 covers any realistic address count while
// keeping discovery fast on devices whose table is large (rxe reports 1024 entries).
constexpr uint32_t kMaxGidScan = 256;

// Hop limit of the GRH we send: RoCE v2 puts it in the IP TTL, so it must allow routed
// fabrics; 64 is the usual IP default.
constexpr uint8_t kHopLimit = 64;

// Reads a small sysfs text file; empty on error.
std::string read_sysfs(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};
  char buf[128];
  ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
  ::close(fd);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

std::string port_sysfs(const std::string& dev, int port) {
  return "/sys/class/infiniband/" + dev + "/ports/" + std::to_string(port);
}

GidType gid_type_of(const IbvSymbols& ibv, ibv_context* ctx, const std::string& dev, int port,
                    uint32_t index) {
  if (ibv.query_gid_ex != nullptr) {
    ibv_gid_entry e{};
    if (ibv.query_gid_ex(ctx, static_cast<uint32_t>(port), index, &e, 0, sizeof(e)) == 0) {
      switch (e.gid_type) {
        case IBV_GID_TYPE_IB:
          return GidType::kIb;
        case IBV_GID_TYPE_ROCE_V1:
          return GidType::kRoceV1;
        case IBV_GID_TYPE_ROCE_V2:
          return GidType::kRoceV2;
      }
    }
  }
  return parse_gid_type(
      read_sysfs(port_sysfs(dev, port) + "/gid_attrs/types/" + std::to_string(index)));
}

// Reads the port's non-zero GIDs into *out.
void read_gid_table(const IbvSymbols& ibv, ibv_context* ctx, const std::string& dev, int port,
                    uint32_t table_len, std::vector<GidEntry>* out) {
  const uint32_t n = table_len < kMaxGidScan ? table_len : kMaxGidScan;
  for (uint32_t i = 0; i < n; i++) {
    ibv_gid g{};
    if (ibv.query_gid(ctx, static_cast<uint8_t>(port), static_cast<int>(i), &g) != 0) continue;
    GidEntry e;
    e.index = i;
    std::memcpy(e.gid, g.raw, 16);
    if (gid_is_zero(e.gid)) continue;
    e.type = gid_type_of(ibv, ctx, dev, port, i);
    out->push_back(e);
  }
}

std::string pci_path_of(const std::string& dev) {
  char resolved[PATH_MAX];
  const std::string link = "/sys/class/infiniband/" + dev + "/device";
  if (::realpath(link.c_str(), resolved) == nullptr) return {};  // software devices (rxe, siw)
  return resolved;
}

// Opens one port: its context, PD, GID and limits. *skip is set (and ok returned) when the
// port is simply unusable (not active, no suitable GID without an override).
Status open_port(const IbvSymbols& ibv, ibv_device* device, const std::string& name, int port,
                 const ibv_device_attr& dattr, const ibv_port_attr& pattr, uint32_t speed_ex,
                 const Config& cfg, std::unique_ptr<Device>* out) {
  const bool ethernet = pattr.link_layer == IBV_LINK_LAYER_ETHERNET;
  ibv_context* ctx = ibv.open_device(device);
  if (ctx == nullptr) return Status(Errc::kSystem, errno);
  std::vector<GidEntry> gids;
  read_gid_table(ibv, ctx, name, port, static_cast<uint32_t>(pattr.gid_tbl_len), &gids);
  const int gid_index = choose_gid_index(gids.data(), gids.size(), ethernet, cfg.gid_index);
  if (gid_index < 0) {
    ibv.close_device(ctx);
    if (cfg.gid_index >= 0) {
      OR_WARN("%s=%lld: no such GID on %s port %d", cfg.gid_index_var.c_str(),
              static_cast<long long>(cfg.gid_index), name.c_str(), port);
      return Status(Errc::kInvalidUsage);
    }
    OR_INFO("verbs: %s port %d has no usable GID; skipped", name.c_str(), port);
    return Status::ok();
  }
  ibv_pd* pd = ibv.alloc_pd(ctx);
  if (pd == nullptr) {
    const int err = errno;
    ibv.close_device(ctx);
    return Status(Errc::kSystem, err);
  }
  auto pc = std::make_shared<PortContext>(&ibv, ctx, pd);
  pc->name = name;
  pc->port = static_cast<uint8_t>(port);
  pc->gid_index = gid_index;
  pc->traffic_class = static_cast<uint8_t>(cfg.ib_tc);
  pc->service_level = static_cast<uint8_t>(cfg.ib_sl);
  for (const GidEntry& e : gids)
    if (static_cast<int>(e.index) == gid_index) std::memcpy(pc->gid, e.gid, 16);
  pc->lid = ethernet ? 0 : pattr.lid;
  pc->ethernet = ethernet;
  // ibv_mtu enumerates 256 << (value - 1): IBV_MTU_256 = 1 ... IBV_MTU_4096 = 5.
  pc->mtu_bytes = 128u << pattr.active_mtu;
  pc->max_qp_wr = static_cast<uint32_t>(dattr.max_qp_wr);
  pc->max_cqe = static_cast<uint32_t>(dattr.max_cqe);

  DeviceInfo info;
  info.name = name;
  info.pci_path = pci_path_of(name);
  info.guid = be64toh(ibv.get_device_guid(device));
  const uint32_t speed_code = speed_ex != 0 ? speed_ex : pattr.active_speed;
  const int mbps = port_speed_mbps(speed_code, pattr.active_width);
  if (mbps > 0) {
    info.speed_mbps = mbps;
  } else {
    // NCCL weighs devices by speed: a guess is better than 0, and the user must know it is one.
    OR_WARN(
        "verbs: %s port %d: unknown link speed (speed code %u, width code %u): reporting %d "
        "Mbit/s to NCCL",
        name.c_str(), port, speed_code, pattr.active_width, kUnknownSpeedMbps);
  }
  info.port = port;
  info.mtu = pc->mtu_bytes;
  UdAddress self;
  std::memcpy(self.gid, pc->gid, 16);
  self.lid = pc->lid;
  OR_INFO(
      "verbs: %s port %d %s mtu %u gid index %d (%s) speed %d Mb/s, traffic class %u, "
      "service level %u",
      name.c_str(), port, ethernet ? "RoCE" : "IB", pc->mtu_bytes, gid_index,
      format_address(self).c_str(), info.speed_mbps, pc->traffic_class, pc->service_level);
  *out = std::make_unique<VerbsDevice>(std::move(pc), std::move(info));
  return Status::ok();
}

}  // namespace

bool hca_selected(std::string_view filter, std::string_view device, int port) {
  IfnameFilter f;
  std::string why;
  // The parameter table refuses a malformed value before any device is opened.
  if (!IfnameFilter::parse(filter, &f, &why, IfnameFilter::Kind::kRdmaPorts)) return false;
  return f.empty() || f.matches(device, port);
}

int port_speed_mbps(uint32_t speed_code, uint8_t width_code) {
  // (code, Mbit/s per lane) of the IB speed codes SDR, DDR, QDR, FDR10, FDR, EDR, HDR, NDR, XDR;
  // XDR's 256 exists only as active_speed_ex.
  static constexpr uint32_t kLaneMbps[][2] = {{1, 2500},   {2, 5000},     {4, 10000},
                                              {8, 10000},  {16, 14000},   {32, 25000},
                                              {64, 50000}, {128, 100000}, {256, 200000}};
  // (code, lanes) of the width codes 1x, 4x, 8x, 12x, 2x.
  static constexpr uint32_t kLanes[][2] = {{1, 1}, {2, 4}, {4, 8}, {8, 12}, {16, 2}};
  uint32_t lane = 0, lanes = 0;
  for (const auto& e : kLaneMbps)
    if (e[0] == speed_code) lane = e[1];
  for (const auto& e : kLanes)
    if (e[0] == width_code) lanes = e[1];
  return static_cast<int>(lane * lanes);  // at most 200000 x 12
}

PortContext::~PortContext() {
  for (const AhEntry& e : ahs_) ibv_->destroy_ah(e.ah);
  ibv_->dealloc_pd(pd_);
  ibv_->close_device(ctx_);
}

namespace {

// Always global: RoCE needs the GRH to build the IP header (rxe rejects an AH without it), and
// on InfiniBand a GRH is harmless within a subnet and required across subnets. The traffic
// class and service level are the port's (OPTIREDUCE_IB_TC, OPTIREDUCE_IB_SL).
ibv_ah_attr address_handle_attributes(const PortContext& pc, const UdAddress& peer) {
  ibv_ah_attr attr{};
  attr.is_global = 1;
  std::memcpy(attr.grh.dgid.raw, peer.gid, 16);
  attr.grh.sgid_index = static_cast<uint8_t>(pc.gid_index);
  attr.grh.hop_limit = kHopLimit;
  attr.grh.traffic_class = pc.traffic_class;
  attr.sl = pc.service_level;
  attr.dlid = peer.lid;
  attr.port_num = pc.port;
  return attr;
}

}  // namespace

Status PortContext::address_handle(const UdAddress& peer, ibv_ah** out) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const AhEntry& e : ahs_) {
    if (e.lid == peer.lid && std::memcmp(e.gid, peer.gid, 16) == 0) {
      *out = e.ah;
      return Status::ok();
    }
  }
  ibv_ah_attr attr = address_handle_attributes(*this, peer);
  ibv_ah* ah = ibv_->create_ah(pd_, &attr);
  if (ah == nullptr) {
    const int err = errno;
    OR_WARN("verbs: %s: ibv_create_ah(%s) failed: %s", name.c_str(), format_address(peer).c_str(),
            std::strerror(err));
    return Status(Errc::kSystem, err);
  }
  AhEntry e;
  std::memcpy(e.gid, peer.gid, 16);
  e.lid = peer.lid;
  e.ah = ah;
  ahs_.push_back(e);
  *out = ah;
  return Status::ok();
}

size_t PortContext::cached_address_handles() {
  std::lock_guard<std::mutex> lock(mu_);
  return ahs_.size();
}

VerbsRegion::~VerbsRegion() {
  port_->ibv().dereg_mr(mr_);
}

Status VerbsDevice::register_memory(void* data, size_t bytes, std::unique_ptr<MemoryRegion>* out) {
  out->reset();
  if (data == nullptr || bytes == 0) return Status::ok();  // nothing to send from
  const IbvSymbols& ibv = port_->ibv();
  ibv_mr* mr = ibv.reg_mr(port_->pd(), data, bytes, IBV_ACCESS_LOCAL_WRITE);
  int err = errno;
  const bool writable = mr != nullptr;
  // Read-only pages refuse local write; sending needs only read.
  if (mr == nullptr) mr = ibv.reg_mr(port_->pd(), data, bytes, 0);
  if (mr == nullptr) return Status(Errc::kSystem, err != 0 ? err : EINVAL);
  *out = std::make_unique<VerbsRegion>(port_, mr, data, bytes, writable);
  return Status::ok();
}

Status VerbsDevice::register_dmabuf(void* data, size_t bytes, uint64_t offset, int fd,
                                    std::unique_ptr<MemoryRegion>* out) {
  out->reset();
  const IbvSymbols& ibv = port_->ibv();
  if (fd < 0 || ibv.reg_dmabuf_mr == nullptr || data == nullptr || bytes == 0)
    return register_memory(data, bytes, out);
  // The iova is the buffer's address, so that SGEs name it as they would a host registration.
  ibv_mr* mr = ibv.reg_dmabuf_mr(port_->pd(), offset, bytes, reinterpret_cast<uintptr_t>(data), fd,
                                 IBV_ACCESS_LOCAL_WRITE);
  if (mr == nullptr) return register_memory(data, bytes, out);  // the pages are host memory
  *out = std::make_unique<VerbsRegion>(port_, mr, data, bytes, /*writable=*/true);
  return Status::ok();
}

uint8_t* alloc_ring_pages(size_t bytes) {
  constexpr size_t kPageBytes = 4096;
  const size_t rounded = (bytes + kPageBytes - 1) / kPageBytes * kPageBytes;
  void* p = std::aligned_alloc(kPageBytes, rounded);
  if (p != nullptr) std::memset(p, 0, rounded);
  return static_cast<uint8_t*>(p);
}

Status ud_qp_to_rts(const IbvSymbols& ibv, ibv_qp* qp, uint8_t port) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = port;
  a.qkey = kDefaultQKey;
  if (ibv.modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY))
    return Status(Errc::kSystem, errno);
  a = ibv_qp_attr{};
  a.qp_state = IBV_QPS_RTR;
  if (ibv.modify_qp(qp, &a, IBV_QP_STATE)) return Status(Errc::kSystem, errno);
  a = ibv_qp_attr{};
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = 0;  // UD has no PSN checking; the field is merely required by the transition
  if (ibv.modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN)) return Status(Errc::kSystem, errno);
  return Status::ok();
}

Status VerbsDevice::open_endpoint(const EndpointOptions& opts, std::unique_ptr<Endpoint>* out) {
  std::unique_ptr<UdEndpoint> ep;
  Status st = UdEndpoint::open(port_, opts, &ep);
  if (st.is_ok()) *out = std::move(ep);
  return st;
}

}  // namespace verbs

Status open_verbs_devices(const Config& cfg, std::vector<std::unique_ptr<Device>>* out) {
  std::string error;
  const verbs::IbvSymbols* ibv = verbs::ibv_symbols(&error);
  if (ibv == nullptr) {
    OR_INFO("verbs: %s", error.c_str());
    return Status(Errc::kSystem, ENOENT);
  }
  return verbs::open_verbs_devices_with(*ibv, cfg, out);
}

Status verbs::open_verbs_devices_with(const IbvSymbols& ibv, const Config& cfg,
                                      std::vector<std::unique_ptr<Device>>* out) {
  int n = 0;
  ibv_device** list = ibv.get_device_list(&n);
  if (list == nullptr) {
    // ENOSYS: the kernel has no RDMA subsystem; that is "no devices", not an error.
    OR_INFO("verbs: ibv_get_device_list: %s", std::strerror(errno));
    return Status::ok();
  }
  Status result = Status::ok();
  for (int d = 0; d < n && result.is_ok(); d++) {
    const std::string name = ibv.get_device_name(list[d]);
    ibv_context* probe = ibv.open_device(list[d]);
    if (probe == nullptr) continue;
    ibv_device_attr dattr{};
    if (ibv.query_device(probe, &dattr) != 0) {
      ibv.close_device(probe);
      continue;
    }
    for (int port = 1; port <= dattr.phys_port_cnt && result.is_ok(); port++) {
      if (!verbs::hca_selected(cfg.ib_hca, name, port)) continue;
      ibv_port_attr pattr{};
      uint32_t speed_ex = 0;
      if (ibv.query_port(probe, static_cast<uint8_t>(port), &pattr, &speed_ex) != 0) continue;
      if (pattr.state != IBV_PORT_ACTIVE) continue;
      std::unique_ptr<Device> dev;
      result = verbs::open_port(ibv, list[d], name, port, dattr, pattr, speed_ex, cfg, &dev);
      if (dev) out->push_back(std::move(dev));
    }
    ibv.close_device(probe);
  }
  ibv.free_device_list(list);
  return result;
}

}  // namespace optireduce
