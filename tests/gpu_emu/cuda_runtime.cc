// The part of the CUDA runtime API liboptireduce and the tests call, over the emulated memory
// (device_memory.h) and streams (streams.h). The declarations are the toolkit's own
// (cuda_runtime_api.h), so a signature that drifts from the real one fails to compile.
#include <cuda_runtime_api.h>

#include <cstring>

#include "tests/gpu_emu/device_memory.h"
#include "tests/gpu_emu/streams.h"

namespace emu = optireduce::gpu_emu;

namespace {

// Checks both ends of a copy against its direction and fails the process on a mismatch, as a
// real GPU would fault (or corrupt) on them. Returns the direction with Default resolved.
cudaMemcpyKind check_copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                          bool async) {
  if (kind == cudaMemcpyDefault) {
    const bool d_dev = emu::kind_of(dst, bytes) == emu::MemKind::kDevice;
    const bool s_dev = emu::kind_of(src, bytes) == emu::MemKind::kDevice;
    kind = d_dev ? (s_dev ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                 : (s_dev ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
  }
  const bool dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  if (dst_dev) emu::require_device(dst, bytes, "cudaMemcpy destination");
  else emu::require_host(dst, bytes, "cudaMemcpy destination");
  if (src_dev) emu::require_device(src, bytes, "cudaMemcpy source");
  else emu::require_host(src, bytes, "cudaMemcpy source");
  // An asynchronous copy to or from pageable memory is not asynchronous on a GPU: code that
  // relies on it being ordered with the stream must use pinned memory.
  if (async && !dst_dev && emu::kind_of(dst, bytes) != emu::MemKind::kPinned)
    emu::fault("cudaMemcpyAsync into pageable host memory %p: use cudaMallocHost", dst);
  if (async && !src_dev && emu::kind_of(src, bytes) != emu::MemKind::kPinned)
    emu::fault("cudaMemcpyAsync from pageable host memory %p: use cudaMallocHost", src);
  return kind;
}

}  // namespace

cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return cudaErrorInvalidValue;
  *count = 1;
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** p, size_t size) {
  if (p == nullptr) return cudaErrorInvalidValue;
  *p = emu::mem_alloc(size, emu::MemKind::kDevice);
  return *p != nullptr ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaFree(void* p) {
  if (p == nullptr) return cudaSuccess;
  // cudaFree synchronises the device: work still queued may use the memory.
  emu::device_sync();
  if (!emu::mem_free(p, emu::MemKind::kDevice))
    emu::fault("cudaFree(%p): not a live device allocation", p);
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void** p, size_t size) {
  if (p == nullptr) return cudaErrorInvalidValue;
  *p = emu::mem_alloc(size, emu::MemKind::kPinned);
  return *p != nullptr ? cudaSuccess : cudaErrorMemoryAllocation;
}

// cuda_runtime.h's C++ overload of cudaMallocHost with flags lands here.
cudaError_t cudaHostAlloc(void** p, size_t size, unsigned int) {
  return cudaMallocHost(p, size);
}

cudaError_t cudaFreeHost(void* p) {
  if (p == nullptr) return cudaSuccess;
  emu::device_sync();
  if (!emu::mem_free(p, emu::MemKind::kPinned))
    emu::fault("cudaFreeHost(%p): not a live pinned allocation", p);
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  check_copy(dst, src, count, kind, false);
  emu::device_sync();
  if (count > 0) std::memmove(dst, src, count);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  check_copy(dst, src, count, kind, true);
  if (count > 0) emu::enqueue(stream, [=] { std::memmove(dst, src, count); });
  return cudaSuccess;
}

cudaError_t cudaMemset(void* p, int value, size_t count) {
  emu::require_device(p, count, "cudaMemset");
  emu::device_sync();
  std::memset(p, value, count);
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* p, int value, size_t count, cudaStream_t stream) {
  emu::require_device(p, count, "cudaMemsetAsync");
  emu::enqueue(stream, [=] { std::memset(p, value, count); });
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* s) {
  if (s == nullptr) return cudaErrorInvalidValue;
  *s = emu::stream_create();
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int) {
  return cudaStreamCreate(s);
}

cudaError_t cudaStreamDestroy(cudaStream_t s) {
  emu::stream_destroy(s);
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  emu::stream_sync(s);
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
  emu::device_sync();
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int) {
  if (e == nullptr) return cudaErrorInvalidResourceHandle;
  emu::stream_wait_event(s, e);
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int) {
  if (e == nullptr) return cudaErrorInvalidValue;
  *e = emu::event_create();
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* e) {
  return cudaEventCreateWithFlags(e, 0);
}

cudaError_t cudaEventDestroy(cudaEvent_t e) {
  if (e == nullptr) return cudaErrorInvalidResourceHandle;
  emu::event_destroy(e);
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  if (e == nullptr) return cudaErrorInvalidResourceHandle;
  emu::event_record(e, s);
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  if (e == nullptr) return cudaErrorInvalidResourceHandle;
  emu::event_sync(e);
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t e) {
  if (e == nullptr) return cudaErrorInvalidResourceHandle;
  return emu::event_done(e) ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaGetLastError(void) {
  return cudaSuccess;
}

const char* cudaGetErrorString(cudaError_t e) {
  return e == cudaSuccess ? "no error" : "emulated CUDA error";
}
