// Command-line flags of the benches: "--name value" pairs, each parsed and checked by its own
// setter, so that a typo, a missing value or a value that is not a number stops the bench with
// the flag's name instead of running with a default.
#pragma once

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace optireduce::bench {

struct Flag {
  const char* name;                      // with its dashes: "--size"
  std::function<bool(const char*)> set;  // false: the value is not valid for this flag
  const char* value = "V";               // what the usage shows for the value: "BYTES"
};

// A whole decimal (or 0x hex) number, nothing after it, within T's range.
template <class T>
Flag number_flag(const char* name, T* out) {
  static_assert(std::is_integral_v<T>);
  return {name,
          [out](const char* v) {
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
          },
          "N"};
}

// A finite decimal number, nothing after it.
inline Flag real_flag(const char* name, double* out) {
  return {name,
          [out](const char* v) {
            char* end = nullptr;
            errno = 0;
            const double x = std::strtod(v, &end);
            if (errno != 0 || end == v || *end != '\0' || !std::isfinite(x)) return false;
            *out = x;
            return true;
          },
          "X"};
}

// A byte count as nccl-tests writes them: a whole number ("65536"), or a decimal one with a
// binary multiple ("64K", "1.5M", "2G"; K, KiB, M, MiB, G, GiB in either case, and a B alone
// is bytes). nullopt for anything else, for a negative value, or one past 2^64 - 1; the bytes
// of a fraction are rounded down.
inline std::optional<uint64_t> parse_bytes(std::string_view s) {
  uint64_t whole = 0;
  size_t i = 0;
  for (; i < s.size() && s[i] >= '0' && s[i] <= '9'; ++i) {
    const uint64_t d = uint64_t(s[i] - '0');
    if (whole > (UINT64_MAX - d) / 10) return std::nullopt;
    whole = whole * 10 + d;
  }
  if (i == 0) return std::nullopt;
  // At most 9 decimals (about a byte's resolution with G); more are refused rather than cut
  // silently.
  uint64_t frac = 0, scale = 1;
  if (i < s.size() && s[i] == '.') {
    const size_t first = ++i;
    for (; i < s.size() && s[i] >= '0' && s[i] <= '9'; ++i) {
      if (i - first == 9) return std::nullopt;
      frac = frac * 10 + uint64_t(s[i] - '0');
      scale *= 10;
    }
    if (i == first) return std::nullopt;
  }
  std::string unit(s.substr(i));
  for (char& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  int shift = 0;
  if (unit == "K" || unit == "KIB")
    shift = 10;
  else if (unit == "M" || unit == "MIB")
    shift = 20;
  else if (unit == "G" || unit == "GIB")
    shift = 30;
  else if (!unit.empty() && unit != "B")
    return std::nullopt;
  if (whole > (UINT64_MAX >> shift)) return std::nullopt;
  // frac / scale < 1 and scale <= 10^9 < 2^30, so frac << shift fits.
  return (whole << shift) + ((frac << shift) / scale);
}

// A byte count (parse_bytes) within T's range.
template <class T>
Flag size_flag(const char* name, T* out) {
  static_assert(std::is_integral_v<T> && std::is_unsigned_v<T>);
  return {name,
          [out](const char* v) {
            const std::optional<uint64_t> b = parse_bytes(v);
            if (!b || *b > std::numeric_limits<T>::max()) return false;
            *out = static_cast<T>(*b);
            return true;
          },
          "BYTES"};
}

// "a,b,c" as its items, empty ones kept ("a,,b" has three, "" has one), so that a caller can
// refuse them.
inline std::vector<std::string> split_commas(std::string_view s) {
  std::vector<std::string> out;
  while (true) {
    const size_t comma = s.find(',');
    out.emplace_back(s.substr(0, comma));
    if (comma == std::string_view::npos) return out;
    s.remove_prefix(comma + 1);
  }
}

// A comma-separated list, each item converted and checked by `conv(item, T*)`; refused if it is
// empty or an item is bad.
template <class T, class Conv>
Flag list_flag(const char* name, std::vector<T>* out, Conv conv) {
  return {name,
          [out, conv](const char* v) {
            std::vector<T> items;
            for (const std::string& x : split_commas(v)) {
              T t{};  // a converter that accepts without writing leaves a defined value
              if (!conv(x, &t)) return false;
              items.push_back(t);
            }
            if (items.empty()) return false;
            *out = std::move(items);
            return true;
          },
          "A,B,.."};
}

// Any text; `value` names it in the usage ("PATH").
inline Flag text_flag(const char* name, std::string* out, const char* value = "TEXT") {
  return {name,
          [out](const char* v) {
            *out = v;
            return true;
          },
          value};
}

// "usage: prog [--a N] [--b BYTES] ..." from the flags themselves, so that it cannot drift.
inline void print_usage(FILE* to, const char* prog, std::initializer_list<Flag> flags) {
  const char* slash = std::strrchr(prog, '/');
  std::fprintf(to, "usage: %s", slash != nullptr ? slash + 1 : prog);
  bool bytes = false;
  for (const Flag& c : flags) {
    std::fprintf(to, " [%s %s]", c.name, c.value);
    bytes = bytes || std::strcmp(c.value, "BYTES") == 0;
  }
  std::fprintf(to, "\n");
  if (bytes) std::fprintf(to, "BYTES: a count, or with a binary K, M or G: 65536, 64K, 1.5M\n");
}

// The rules between flags, checked once every flag is set: why the combination is invalid
// ("--max: at least --min"), or nullptr when it is valid.
using FlagCheck = std::function<const char*()>;

// Whether the command line asks for the usage (--help or -h anywhere), for the benches whose
// arguments are positional.
inline bool asks_for_help(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) return true;
  return false;
}

// 0 when every argument was a known flag with a valid value and `check` (if any) accepts the
// combination; else 2, after saying why and printing the usage. --help (or -h) prints the usage
// and exits with 0.
inline int parse_flags(int argc, char** argv, std::initializer_list<Flag> flags,
                       const FlagCheck& check = nullptr) {
  if (asks_for_help(argc, argv)) {
    print_usage(stdout, argv[0], flags);
    std::exit(0);
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
