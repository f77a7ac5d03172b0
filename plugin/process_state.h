// The plugin's process-wide state and its lifetime: the contexts NCCL initialised (v11: one per
// communicator; v8..v10: one shared), the engine devices() and getProperties() ask, the counters
// of closed comms and the strings getProperties hands out. Its own file because the lifetime is
// the delicate part: the end of the process and the unload of the library run the plugin's
// teardown in opposite orders (issue 10, see process_state.cc), so the state lives on the heap,
// is never touched by a static destructor, and a phase says whether anything may still use it.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "plugin/context.h"
#include "transport/stats.h"
#include "transport/transport.h"

namespace optireduce::plugin {

// Moves only forward, once, from kAlive; every other change is refused (process_state.cc).
enum class Phase : uint8_t {
  kAlive,     // NCCL's calls are served
  kExiting,   // exit() began: the progress thread is stopped, nothing is freed, calls refused
  kUnloaded,  // the library is being unloaded: everything was released
};

struct ProcessState {
  std::mutex mu;  // guards everything below; taken before any Context::mu
  std::vector<std::shared_ptr<Context>> contexts;  // initialised and not yet finalized (v11)
  std::shared_ptr<Context> legacy;                 // v8..v10
  std::weak_ptr<Engine> engine;                    // devices/getProperties get no context
  ConnStats closed_send;                           // every comm closed in this process
  ConnStats closed_recv;
  // Stable storage for the strings getProperties hands out: NCCL may keep the pointers longer
  // than one engine lives.
  std::deque<std::string> interned;
};

Phase phase() noexcept;
// Every entry point checks this first (api.cc, guarded()) and refuses the call when false.
inline bool alive() noexcept {
  return phase() == Phase::kAlive;
}

// The state, or null before the first context was made. Its memory lasts until the library is
// unloaded, so the pointer stays valid while exit() runs (other threads may still hold it).
ProcessState* process_state() noexcept;

// The state for a context about to be registered: the first call creates it and arms the exit
// handling. Null once the phase left kAlive.
ProcessState* state_for_new_context();

// The registered context behind NCCL's opaque ctx (v11's or the legacy one), or null.
std::shared_ptr<Context> find_context(void* ctx);
// The engine of the latest context made, while any context keeps it alive.
std::shared_ptr<Engine> current_engine();
// A copy of `s` that lives as long as the state; requires the state (a context was made).
const char* intern(const std::string& s);

}  // namespace optireduce::plugin
