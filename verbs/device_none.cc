// open_verbs_devices for builds without <infiniband/verbs.h>: no verbs devices, ever, so that
// OPTIREDUCE_DATAPATH=auto falls back to UDP and =verbs reports why it cannot.
#include <cerrno>

#include "transport/log.h"
#include "verbs/device_api.h"

namespace optireduce {

Status open_verbs_devices(const Config&, std::vector<std::unique_ptr<Device>>*) {
  OR_INFO("verbs: built without libibverbs headers");
  return Status(Errc::kSystem, ENOSYS);
}

}  // namespace optireduce
