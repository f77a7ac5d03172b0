// Streams and events of the emulated GPU (streams.h).
#include "tests/gpu_emu/streams.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <set>
#include <thread>

#include "tests/gpu_emu/device_memory.h"

struct CUstream_st {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<optireduce::gpu_emu::Op> queue;
  uint64_t enqueued = 0;  // work items ever enqueued
  uint64_t done = 0;      // of which finished
  bool stop = false;
  std::thread worker;
};

struct CUevent_st {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t recorded = 0;  // records issued
  uint64_t reached = 0;   // the latest record the stream has run through
  // The handle's and each enqueued op's: as with cudaEventDestroy, an event destroyed while a
  // record or a wait on it is still queued (or still notifying its waiters) goes only once
  // that work is done. Without it the stream thread notified a freed event (ThreadSanitizer).
  std::atomic<int> refs{1};
};

namespace optireduce::gpu_emu {

namespace {

std::atomic<int> g_delay_us{200};

struct Registry {
  std::mutex mu;
  std::set<CUstream_st*> live;
  CUstream_st* default_stream = nullptr;
};

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: see device_memory.cc
  return *r;
}

void run(CUstream_st* s) {
  for (;;) {
    Op op;
    {
      std::unique_lock<std::mutex> lk(s->mu);
      s->cv.wait(lk, [&] { return s->stop || !s->queue.empty(); });
      if (s->queue.empty()) return;  // stop, and nothing left
      op = std::move(s->queue.front());
      s->queue.pop_front();
    }
    const int d = g_delay_us.load(std::memory_order_relaxed);
    if (d > 0) std::this_thread::sleep_for(std::chrono::microseconds(d));
    op();
    {
      std::lock_guard<std::mutex> lk(s->mu);
      ++s->done;
    }
    s->cv.notify_all();
  }
}

CUstream_st* start_stream() {
  auto* s = new CUstream_st;
  s->worker = std::thread(run, s);
  return s;
}

CUstream_st* resolve(CUstream_st* s) {
  if (s != nullptr) {
    Registry& r = registry();
    std::lock_guard<std::mutex> lk(r.mu);
    if (r.live.count(s) == 0) fault("stream %p is not a live stream", static_cast<void*>(s));
    return s;
  }
  Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  if (r.default_stream == nullptr) {
    r.default_stream = start_stream();
    r.live.insert(r.default_stream);
  }
  return r.default_stream;
}

}  // namespace

void set_op_delay_us(int us) {
  g_delay_us.store(us);
}

void enqueue(CUstream_st* s, Op op) {
  s = resolve(s);
  {
    std::lock_guard<std::mutex> lk(s->mu);
    s->queue.push_back(std::move(op));
    ++s->enqueued;
  }
  s->cv.notify_all();
}

void stream_sync(CUstream_st* s) {
  s = resolve(s);
  std::unique_lock<std::mutex> lk(s->mu);
  const uint64_t target = s->enqueued;
  s->cv.wait(lk, [&] { return s->done >= target; });
}

void device_sync() {
  std::set<CUstream_st*> all;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lk(r.mu);
    all = r.live;
  }
  for (CUstream_st* s : all) stream_sync(s);
}

CUstream_st* stream_create() {
  CUstream_st* s = start_stream();
  Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  r.live.insert(s);
  return s;
}

void stream_destroy(CUstream_st* s) {
  s = resolve(s);
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lk(r.mu);
    if (s == r.default_stream) fault("the default stream cannot be destroyed");
    r.live.erase(s);
  }
  // As cudaStreamDestroy: work already enqueued still runs.
  {
    std::lock_guard<std::mutex> lk(s->mu);
    s->stop = true;
  }
  s->cv.notify_all();
  s->worker.join();
  delete s;
}

CUevent_st* event_create() {
  return new CUevent_st;
}

namespace {

CUevent_st* hold(CUevent_st* e) {
  e->refs.fetch_add(1, std::memory_order_relaxed);
  return e;
}

void release(CUevent_st* e) {
  if (e->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete e;
}

}  // namespace

void event_destroy(CUevent_st* e) {
  release(e);
}

void event_record(CUevent_st* e, CUstream_st* s) {
  uint64_t gen;
  {
    std::lock_guard<std::mutex> lk(e->mu);
    gen = ++e->recorded;
  }
  enqueue(s, [e = hold(e), gen] {
    {
      std::lock_guard<std::mutex> lk(e->mu);
      if (gen > e->reached) e->reached = gen;
    }
    e->cv.notify_all();
    release(e);
  });
}

void event_sync(CUevent_st* e) {
  std::unique_lock<std::mutex> lk(e->mu);
  const uint64_t target = e->recorded;
  e->cv.wait(lk, [&] { return e->reached >= target; });
}

bool event_done(CUevent_st* e) {
  std::lock_guard<std::mutex> lk(e->mu);
  return e->reached >= e->recorded;
}

void stream_wait_event(CUstream_st* s, CUevent_st* e) {
  uint64_t target;
  {
    std::lock_guard<std::mutex> lk(e->mu);
    target = e->recorded;
  }
  enqueue(s, [e = hold(e), target] {
    {
      std::unique_lock<std::mutex> lk(e->mu);
      e->cv.wait(lk, [&] { return e->reached >= target; });
    }
    release(e);
  });
}

}  // namespace optireduce::gpu_emu
