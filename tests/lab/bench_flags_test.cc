// Checks bench/flags.h, the command line every bench parses: a typo, a missing or bad value,
// or a combination the bench refuses must stop it with the reason and the usage (exit code 2),
// never run it with a default in place of what was asked.
#include "bench/flags.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

namespace optireduce::bench {
namespace {

struct Parsed {
  int rc = -1;
  std::string err;
  uint32_t size = 7;
  int8_t small = 0;
  std::string name = "unset";
};

// Parses `args` (after the program's name) into the three flags, with `check` between them.
Parsed parse(std::vector<std::string> args, const FlagCheck& check = nullptr) {
  Parsed p;
  std::vector<char*> argv = {const_cast<char*>("/x/prog")};
  for (std::string& a : args) argv.push_back(a.data());
  testing::internal::CaptureStderr();
  p.rc = parse_flags(static_cast<int>(argv.size()), argv.data(),
                     {number_flag("--size", &p.size), number_flag("--small", &p.small),
                      text_flag("--name", &p.name)},
                     check);
  p.err = testing::internal::GetCapturedStderr();
  return p;
}

constexpr const char* kUsage = "usage: prog [--size V] [--small V] [--name V]\n";

TEST(BenchFlags, KnownFlagsSetTheirValues) {
  const Parsed p = parse({"--size", "0x10", "--name", "a b", "--small", "-128"});
  EXPECT_EQ(p.rc, 0);
  EXPECT_EQ(p.err, "");
  EXPECT_EQ(p.size, 16u);
  EXPECT_EQ(p.small, -128);
  EXPECT_EQ(p.name, "a b");
}

TEST(BenchFlags, AnUnknownFlagStopsWithTheUsage) {
  const Parsed p = parse({"--size", "4", "--sise", "4"});
  EXPECT_EQ(p.rc, 2);
  EXPECT_EQ(p.err, std::string("unknown option --sise\n") + kUsage);
}

TEST(BenchFlags, AMissingValueStopsWithTheUsage) {
  const Parsed p = parse({"--size"});
  EXPECT_EQ(p.rc, 2);
  EXPECT_EQ(p.err, std::string("--size needs a value\n") + kUsage);
  EXPECT_EQ(p.size, 7u);
}

TEST(BenchFlags, ABadValueStopsWithTheUsage) {
  for (const char* bad : {"-1", "4x", "", "4294967296"}) {
    const Parsed p = parse({"--size", bad});
    EXPECT_EQ(p.rc, 2) << bad;
    EXPECT_EQ(p.err, std::string("invalid value for --size: ") + bad + "\n" + kUsage);
    EXPECT_EQ(p.size, 7u) << bad;
  }
  const Parsed p = parse({"--small", "128"});  // past int8_t
  EXPECT_EQ(p.rc, 2);
  EXPECT_EQ(p.small, 0);
}

TEST(BenchFlags, TheCheckSeesEveryValueAndItsReasonStopsWithTheUsage) {
  int calls = 0;
  const auto check = [&]() -> const char* {
    ++calls;
    return "--size: at least 8";
  };
  Parsed p = parse({"--size", "4"}, check);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(p.rc, 2);
  EXPECT_EQ(p.err, std::string("--size: at least 8\n") + kUsage);
  p = parse({"--size", "8", "--name", "n"}, [&]() -> const char* { return nullptr; });
  EXPECT_EQ(p.rc, 0);
  EXPECT_EQ(p.err, "");
  // Not consulted once a flag itself was refused: its reason would be about a default.
  calls = 0;
  p = parse({"--size", "x"}, check);
  EXPECT_EQ(calls, 0);
  EXPECT_EQ(p.rc, 2);
}

}  // namespace
}  // namespace optireduce::bench
