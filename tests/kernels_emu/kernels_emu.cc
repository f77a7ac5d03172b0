// cuda/kernels.cu compiled as host C++ for the emulation (cuda_emu.h): the GPU's source itself,
// not a copy of it.
#include "cuda/kernels.cu"
