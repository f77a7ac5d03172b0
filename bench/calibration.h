// How many calls a benchmark leaves out of its measured window so that none of the bounded
// transport's exact calibration receives (OPTIREDUCE_CALIBRATION_STEPS, counted over all of a
// communicator's connections) is measured as a bounded one.
#pragma once

#include <cstdlib>

#include "transport/params.h"

namespace optireduce::bench {

// receives_per_call: receives one rank completes per call (TAR: 2(N-1); one all-to-all step:
// N-1). The variable was validated by the transport already when this runs; atol suffices.
inline int calibration_calls(int receives_per_call) {
  const char* env = std::getenv("OPTIREDUCE_CALIBRATION_STEPS");
  const long steps = env != nullptr ? std::atol(env) : Config{}.calibration_steps;
  const long per = receives_per_call > 0 ? receives_per_call : 1;
  return static_cast<int>((steps + per - 1) / per);
}

}  // namespace optireduce::bench
