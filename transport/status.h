// Error values of the core. No exceptions cross the C ABI: every fallible core call returns a
// Status, and the plugin maps its code onto ncclResult_t in one place (plugin/api.cc).
#pragma once

#include <cstdint>

namespace optireduce {

enum class Errc : uint8_t {
  kOk = 0,
  kSystem,        // the OS or the network failed (socket error, device error)
  kInternal,      // the caller broke the contract (NCCL misuse, a bug of ours)
  kInvalidUsage,  // the user's configuration is wrong (bad env value, no such interface)
  kRemote,        // the peer misbehaved or went away
};

class [[nodiscard]] Status {
 public:
  constexpr Status() = default;
  constexpr Status(Errc code, int sys_errno = 0) : code_(code), errno_(sys_errno) {}
  static constexpr Status ok() { return Status(); }

  constexpr bool is_ok() const { return code_ == Errc::kOk; }
  constexpr explicit operator bool() const { return is_ok(); }
  constexpr Errc code() const { return code_; }
  constexpr int sys_errno() const { return errno_; }

 private:
  Errc code_ = Errc::kOk;
  int errno_ = 0;
};

const char* errc_name(Errc code);

}  // namespace optireduce
