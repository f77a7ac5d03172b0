// Command-line flags of the benches: "--name value" pairs, each parsed and checked by its own
// setter, so that a typo, a missing value or a value that is not a number stops the bench with
// the flag's name instead of running with a default.
#pragma once

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <string>
#include <type_traits>

namespace optireduce::bench {

struct Flag {
  const char* name;                      // with its dashes: "--size"
  std::function<bool(const char*)> set;  // false: the value is not valid for this flag
};

// A whole decimal (or 0x hex) number, nothing after it, within T's range.
template <class T>
Flag number_flag(const char* name, T* out) {
  static_assert(std::is_integral_v<T>);
  return {name, [out](const char* v) {
            char* end = nullptr;
            errno = 0;
            if constexpr (std::is_signed_v<T>) {
              const long long x = std::strtoll(v, &end, 0);
              if (errno != 0 || end == v || *end != '\0' ||
                  x < static_cast<long long>(std::numeric_limits<T>::min()) ||
                  x > static_cast<long long>(std::numeric_limits<T>::max()))
                return false;
              *out = static_cast<T>(x);
            } else {
              if (*v == '-') return false;
              const unsigned long long x = std::strtoull(v, &end, 0);
              if (errno != 0 || end == v || *end != '\0' || x > std::numeric_limits<T>::max())
                return false;
              *out = static_cast<T>(x);
            }
            return true;
          }};
}

inline Flag text_flag(const char* name, std::string* out) {
  return {name, [out](const char* v) {
            *out = v;
            return true;
          }};
}

// "usage: prog [--a V] [--b V] ..." from the flags themselves, so that it cannot drift.
inline void print_usage(FILE* to, const char* prog, std::initializer_list<Flag> flags) {
  const char* slash = std::strrchr(prog, '/');
  std::fprintf(to, "usage: %s", slash != nullptr ? slash + 1 : prog);
  for (const Flag& c : flags) std::fprintf(to, " [%s V]", c.name);
  std::fprintf(to, "\n");
}

// The rules between flags, checked once every flag is set: why the combination is invalid
// ("--max: at least --min"), or nullptr when it is valid.
using FlagCheck = std::function<const char*()>;

// 0 when every argument was a known flag with a valid value and `check` (if any) accepts the
// combination; else 2, after saying why and printing the usage. --help (or -h) prints the usage
// and exits with 0.
inline int parse_flags(int argc, char** argv, std::initializer_list<Flag> flags,
                       const FlagCheck& check = nullptr) {
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--help" || k == "-h") {
      print_usage(stdout, argv[0], flags);
      std::exit(0);
    }
  }
  const auto refuse = [&](const std::string& why) {
    std::fprintf(stderr, "%s\n", why.c_str());
    print_usage(stderr, argv[0], flags);
    return 2;
  };
  for (int i = 1; i < argc; i += 2) {
    const std::string k = argv[i];
    const Flag* f = nullptr;
    for (const Flag& c : flags)
      if (k == c.name) f = &c;
    if (f == nullptr) return refuse("unknown option " + k);
    if (i + 1 >= argc) return refuse(k + " needs a value");
    if (!f->set(argv[i + 1])) return refuse("invalid value for " + k + ": " + argv[i + 1]);
  }
  if (check) {
    if (const char* why = check(); why != nullptr) return refuse(why);
  }
  return 0;
}

}  // namespace optireduce::bench
