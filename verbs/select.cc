// Chooses the datapath at engine start (see select.h); the only file that knows both.
#include "verbs/select.h"

#include "transport/log.h"
#include "udp/device.h"
#include "verbs/device_api.h"

namespace optireduce {

Status open_datapath_devices(const Config& cfg, std::vector<std::unique_ptr<Device>>* out) {
  if (cfg.datapath == DatapathChoice::kUdp) return open_udp_devices(cfg, out);
  std::vector<std::unique_ptr<Device>> rdma;
  const Status st = open_verbs_devices(cfg, &rdma);
  if (st.code() == Errc::kInvalidUsage) return st;  // already explained by a WARN
  if (st.is_ok() && !rdma.empty()) {
    OR_INFO("datapath: verbs (%zu RDMA port%s)", rdma.size(), rdma.size() == 1 ? "" : "s");
    for (auto& d : rdma) out->push_back(std::move(d));
    return Status::ok();
  }
  if (cfg.datapath == DatapathChoice::kVerbs) {
    if (st.is_ok())
      OR_WARN("OPTIREDUCE_DATAPATH=verbs but no RDMA port is active (or %s=\"%s\" admits none)",
              cfg.ib_hca_var.c_str(), cfg.ib_hca.c_str());
    else
      OR_WARN("OPTIREDUCE_DATAPATH=verbs but libibverbs is not available");
    return Status(Errc::kInvalidUsage);
  }
  OR_INFO("datapath: udp (%s)", st.is_ok() ? "no active RDMA port" : "no libibverbs");
  return open_udp_devices(cfg, out);
}

}  // namespace optireduce
