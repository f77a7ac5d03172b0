// The AVX2 + FMA + F16C variant of the host kernels (see kernels_host_impl.h); called only
// where the CPU has all three (kernels_host.cc checks once).
#define OR_KERNEL_NS avx2
#define OR_KERNEL_F16C 1
#include "collectives/kernels_host_impl.h"
