// What kernels.cu needs from CUDA, spelled so that the same source compiles twice: by nvcc for
// the GPU, and as host C++ for the CPU emulation of the execution model that the tests run it
// under (tests/kernels_emu: OPTIREDUCE_KERNEL_EMU). Only the two constructs plain C++ cannot
// parse are wrapped: the launch syntax and the dynamic shared-memory declaration (and one check
// only the emulation makes: the alignment of vector accesses). Everything
// else (threadIdx, __syncthreads, __shfl_down_sync, atomicAdd, ...) the emulation provides
// under its CUDA name.
#pragma once

#if defined(OPTIREDUCE_KERNEL_EMU)
#include "kernels_emu/cuda_emu.h"
// kernel<<<grid, block, shmem, stream>>>(args) is OR_LAUNCH(kernel, grid, block, shmem,
// stream)(args).
#define OR_LAUNCH(kernel, grid, block, shmem, stream) \
  ::optireduce::emu::launch(kernel, grid, block, shmem, stream)
// The block's dynamic shared memory (the launch's third argument) as `type* name`.
#define OR_DYNAMIC_SHARED(type, name) \
  type* name = static_cast<type*>(::optireduce::emu::dynamic_shared())
// A vector access of `bytes` at p must be aligned to them: a GPU faults, the emulation fails the
// launch, so that a kernel's alignment checks are tested too.
#define OR_CHECK_ALIGNED(p, bytes) ::optireduce::emu::check_aligned(p, bytes)
#else
#include <cuda_runtime.h>
#define OR_LAUNCH(kernel, grid, block, shmem, stream) kernel<<<grid, block, shmem, stream>>>
#define OR_DYNAMIC_SHARED(type, name)      \
  extern __shared__ type name##_storage[]; \
  type* name = name##_storage
#define OR_CHECK_ALIGNED(p, bytes) static_cast<void>(0)
#endif
