// Checks bench/flags.h, the command line every bench parses: a typo, a missing or bad value,
// or a combination the bench refuses must stop it with the reason and the usage (exit code 2),
// never run it with a default in place of what was asked.
#include "bench/flags.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
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

constexpr const char* kUsage = "usage: prog [--size N] [--small N] [--name TEXT]\n";

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

TEST(BenchFlags, ByteCountsTakeBinaryMultiples) {
  EXPECT_EQ(parse_bytes("65536"), 65536u);
  EXPECT_EQ(parse_bytes("0"), 0u);
  EXPECT_EQ(parse_bytes("64K"), 65536u);
  EXPECT_EQ(parse_bytes("64kib"), 65536u);
  EXPECT_EQ(parse_bytes("1M"), 1u << 20);
  EXPECT_EQ(parse_bytes("1.5MiB"), 3u << 19);
  EXPECT_EQ(parse_bytes("2G"), uint64_t{2} << 30);
  EXPECT_EQ(parse_bytes("100B"), 100u);
  EXPECT_EQ(parse_bytes("0.001K"), 1u);  // 1.024 bytes, rounded down
  // Exact where a double would not be: 2^64 - 1 itself, and 2^34 - 1 GiB.
  EXPECT_EQ(parse_bytes("18446744073709551615"), UINT64_MAX);
  EXPECT_EQ(parse_bytes("17179869183G"), UINT64_MAX - ((uint64_t{1} << 30) - 1));
  for (const char* bad : {"", "K", "-1", "+1", " 1", "1 ", "1.", ".5M", "1.2.3", "3Q", "1KB", "1e6",
                          "0x10", "18446744073709551616", "17179869184G", "1.0000000001M"})
    EXPECT_EQ(parse_bytes(bad), std::nullopt) << bad;
}

TEST(BenchFlags, ASizeFlagRefusesWhatItsTypeCannotHold) {
  uint32_t v = 7;
  const Flag f = size_flag("--bytes", &v);
  EXPECT_FALSE(f.set("4G"));
  EXPECT_EQ(v, 7u);
  EXPECT_TRUE(f.set("4095M"));
  EXPECT_EQ(v, 4095u << 20);
  EXPECT_FALSE(f.set("1x"));
  EXPECT_EQ(v, 4095u << 20);
}

TEST(BenchFlags, ListsKeepTheirEmptyItemsForTheCallerToRefuse) {
  EXPECT_EQ(split_commas("a,b,c"), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(split_commas("a,,b"), (std::vector<std::string>{"a", "", "b"}));
  EXPECT_EQ(split_commas(""), (std::vector<std::string>{""}));
  EXPECT_EQ(split_commas("a,"), (std::vector<std::string>{"a", ""}));

  std::vector<int> got = {9};
  const auto digit = [](const std::string& x, int* n) {
    if (x.size() != 1 || x[0] < '0' || x[0] > '9') return false;
    *n = x[0] - '0';
    return true;
  };
  const Flag f = list_flag<int>("--ranks", &got, digit);
  EXPECT_TRUE(f.set("2,4,8"));
  EXPECT_EQ(got, (std::vector<int>{2, 4, 8}));
  for (const char* bad : {"", "2,,4", "2,", "2,x"}) {
    EXPECT_FALSE(f.set(bad)) << bad;
    EXPECT_EQ(got, (std::vector<int>{2, 4, 8})) << bad;  // a refused list changes nothing
  }
}

TEST(BenchFlags, TheUsageNamesWhatEachValueIs) {
  std::string path;
  uint64_t bytes = 0;
  double x = 0;
  std::vector<int> list;
  const auto any = [](const std::string&, int*) { return true; };
  std::vector<std::string> args = {"/x/prog", "--oops", "1"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  testing::internal::CaptureStderr();
  EXPECT_EQ(
      parse_flags(static_cast<int>(argv.size()), argv.data(),
                  {size_flag("--bytes", &bytes), real_flag("--p", &x),
                   list_flag<int>("--ranks", &list, any), text_flag("--plugin", &path, "PATH")}),
      2);
  EXPECT_EQ(testing::internal::GetCapturedStderr(),
            "unknown option --oops\n"
            "usage: prog [--bytes BYTES] [--p X] [--ranks A,B,..] [--plugin PATH]\n"
            "BYTES: a count, or with a binary K, M or G: 65536, 64K, 1.5M\n");
}

TEST(BenchFlags, ARealMustBeAFiniteNumber) {
  double x = 0.5;
  const Flag f = real_flag("--drop", &x);
  EXPECT_TRUE(f.set("0.25"));
  EXPECT_EQ(x, 0.25);
  for (const char* bad : {"", "x", "0.1x", "nan", "inf", "1e999"}) {
    EXPECT_FALSE(f.set(bad)) << bad;
    EXPECT_EQ(x, 0.25) << bad;
  }
}

}  // namespace
}  // namespace optireduce::bench
