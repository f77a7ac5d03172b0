// What the Soft-RoCE suites (rxe-suite.sh, rxe-loss-suite.sh) tell the test binaries that run
// inside the rxe VM, read in one place: which device each rank uses, whether netem loss is on,
// and whether this is a dry run over UDP on any host.
#pragma once

#include <sys/stat.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "bench/flags.h"  // split_commas

namespace optireduce::testing {

// Guest under TCG emulation: a rank process may take minutes where a native one takes seconds.
inline constexpr unsigned kRxeRankTimeoutS = 240;

// RXE_TEST_LOSS=<%>: netem drops that share on the veth between the devices (then bounded
// calls must lose elements); 0 when unset.
inline int rxe_loss_percent() {
  const char* v = std::getenv("RXE_TEST_LOSS");
  return v != nullptr ? std::atoi(v) : 0;
}

// RXE_TEST_HCAS="rxe0,rxe1" (the default): the device of rank r is entry r % 2.
inline std::vector<std::string> rxe_hcas() {
  const char* v = std::getenv("RXE_TEST_HCAS");
  return bench::split_commas(v != nullptr ? v : "rxe0,rxe1");
}

// RXE_TEST_DATAPATH=udp: the same checks over UDP, on a host without the VM.
inline bool rxe_udp_dry_run() {
  const char* v = std::getenv("RXE_TEST_DATAPATH");
  return v != nullptr && std::string(v) == "udp";
}

// Whether this verbs device exists here (always, in a dry run).
inline bool rxe_have_device(const std::string& hca) {
  if (rxe_udp_dry_run()) return true;
  struct stat st;
  return !hca.empty() && ::stat(("/sys/class/infiniband/" + hca).c_str(), &st) == 0;
}

}  // namespace optireduce::testing
