// Streams of the emulated GPU: each an in-order queue of work run by its own worker thread, so
// that work is asynchronous to the host exactly as on a GPU (host code that reads a result
// before synchronising sees the old contents); events mark points in a stream, and a stream
// can wait for another's event.
#pragma once

#include <cstdint>
#include <functional>

struct CUstream_st;
struct CUevent_st;

namespace optireduce::gpu_emu {

using Op = std::function<void()>;

// nullptr names the default stream (which here orders only its own work: the legacy default
// stream's implicit synchronisation with other streams is not emulated).
void enqueue(CUstream_st* s, Op op);
void stream_sync(CUstream_st* s);
// Waits until every stream is idle (cudaDeviceSynchronize, and the synchronous copies).
void device_sync();
CUstream_st* stream_create();
void stream_destroy(CUstream_st* s);

CUevent_st* event_create();
void event_destroy(CUevent_st* e);
void event_record(CUevent_st* e, CUstream_st* s);
void event_sync(CUevent_st* e);
bool event_done(CUevent_st* e);
void stream_wait_event(CUstream_st* s, CUevent_st* e);

// Every stream waits this long before each piece of work, so that a missing synchronisation
// shows as stale data rather than as a rare race (default 200 us).
void set_op_delay_us(int us);

}  // namespace optireduce::gpu_emu
