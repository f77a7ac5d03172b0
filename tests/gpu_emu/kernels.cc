// The kernels of the emulated GPU are cuda/kernels.cu itself, run by the CPU emulation of
// tests/kernels_emu (linked in as its library). This connects that emulation to the emulated
// runtime: every launch (and cudaMemsetAsync) queues on its stream and runs on the stream's
// thread, every pointer argument must be device memory, and a launch that breaks a rule of the
// execution model is a fault, as an illegal address is on a GPU.
#include <functional>
#include <string>
#include <utility>

#include "kernels_emu/cuda_emu.h"
#include "tests/gpu_emu/device_memory.h"
#include "tests/gpu_emu/streams.h"

namespace {

void queue(void* stream, std::function<void()> work) {
  optireduce::gpu_emu::enqueue(static_cast<CUstream_st*>(stream), std::move(work));
}

void check(const void* p, const char* what) {
  optireduce::gpu_emu::require_device(p, 1, what);
}

void failed(const std::string& why) {
  optireduce::gpu_emu::fault("kernel launch: %s", why.c_str());
}

// Before main: the hooks are plain pointers, constant-initialised, so nothing can launch first.
const bool g_installed = [] {
  optireduce::emu::set_hooks({queue, check, failed});
  return true;
}();

}  // namespace
