// Implements plugin/process_state.h: the state's registry and, above all, its end.
//
// Two ways to end, with opposite orders (glibc):
//  - exit() (returning from main included) first runs the atexit/__cxa_atexit handlers, C++
//    static destructors among them, newest first, and only then _dl_fini runs each library's
//    destructor functions (.fini_array);
//  - dlclose() first runs the library's destructor functions, then __cxa_finalize runs the
//    handlers registered from that library (its static destructors and its atexit handlers).
// A static ProcessState with a destructor function releasing it was right for dlclose only: at
// exit the static was destroyed first and the destructor function freed it again (a double free
// that aborted every program that ended without dlclose). So nothing here has a destructor: the
// state lives on the heap behind g_state, and the phase decides who tears it down.
//  - At exit, quiesce_at_exit() (an atexit handler) moves to kExiting, stops the transport's
//    progress thread and frees nothing: NCCL's proxy thread may still be inside the plugin while
//    the process ends, and the OS takes the memory back. The state stays reachable from g_state,
//    so LeakSanitizer has nothing to report. release_at_unload() then finds kExiting and leaves.
//  - At dlclose, release_at_unload() moves to kUnloaded and releases everything; the progress
//    thread is stopped first even when comms NCCL never closed keep their engine alive (their
//    memory stays, but no thread may run on in code about to be unmapped). quiesce_at_exit(),
//    run next by __cxa_finalize, finds kUnloaded and leaves.
#include "plugin/process_state.h"

#include <atomic>
#include <cstdlib>
#include <stdexcept>
#include <type_traits>

#include "plugin/logger.h"
#include "transport/log.h"

namespace optireduce::plugin {
namespace {

std::atomic<Phase> g_phase{Phase::kAlive};
std::atomic<ProcessState*> g_state{nullptr};
std::mutex g_create_mu;     // creating the state and arming the exit handling
bool g_exit_armed = false;  // guarded by g_create_mu

// No static of this file may be destroyed at exit: that is the point of the design.
static_assert(std::is_trivially_destructible_v<std::atomic<Phase>> &&
              std::is_trivially_destructible_v<std::atomic<ProcessState*>> &&
              std::is_trivially_destructible_v<std::mutex>);

// The one place the phase changes: out of kAlive, once. A second way out (the unload after
// exit() began, the exit handler after the unload) is refused and its caller does nothing.
bool leave_alive(Phase to) {
  Phase expected = Phase::kAlive;
  return g_phase.compare_exchange_strong(expected, to, std::memory_order_acq_rel);
}

void quiesce_at_exit() {
  if (!leave_alive(Phase::kExiting)) return;
  quiesce_engine();
  detach_logger();
}

__attribute__((destructor)) void release_at_unload() {
  if (!leave_alive(Phase::kUnloaded)) return;
  quiesce_engine();
  // Contexts, the legacy context, and with the last of them the engine (joined already).
  delete g_state.exchange(nullptr, std::memory_order_acq_rel);
  detach_logger();
}

}  // namespace

Phase phase() noexcept {
  return g_phase.load(std::memory_order_acquire);
}

ProcessState* process_state() noexcept {
  return g_state.load(std::memory_order_acquire);
}

ProcessState* state_for_new_context() {
  std::lock_guard<std::mutex> lock(g_create_mu);
  if (!alive()) return nullptr;
  ProcessState* state = g_state.load(std::memory_order_acquire);
  if (state == nullptr) {
    state = new ProcessState;
    g_state.store(state, std::memory_order_release);
  }
  // Armed after the first context's engine exists: Engine::acquire has armed the transport's
  // own handler by then, and handlers run newest first, so at exit the calls are refused before
  // the thread stops, and both happen before the statics the transport built are destroyed.
  if (!g_exit_armed) {
    if (std::atexit(quiesce_at_exit) == 0) {
      g_exit_armed = true;
    } else {
      OR_WARN("atexit failed: the process state will be released by the unload code at exit");
    }
  }
  return state;
}

std::shared_ptr<Context> find_context(void* ctx) {
  ProcessState* state = process_state();
  if (ctx == nullptr || state == nullptr) return nullptr;
  std::lock_guard<std::mutex> lock(state->mu);
  if (state->legacy.get() == ctx) return state->legacy;
  for (const auto& c : state->contexts) {
    if (c.get() == ctx) return c;
  }
  return nullptr;
}

std::shared_ptr<Engine> current_engine() {
  ProcessState* state = process_state();
  if (state == nullptr) return nullptr;
  std::lock_guard<std::mutex> lock(state->mu);
  return state->engine.lock();
}

const char* intern(const std::string& s) {
  ProcessState* state = process_state();
  if (state == nullptr) throw std::logic_error("intern() before any context was made");
  std::lock_guard<std::mutex> lock(state->mu);
  for (const std::string& k : state->interned) {
    if (k == s) return k.c_str();
  }
  return state->interned.emplace_back(s).c_str();
}

}  // namespace optireduce::plugin
