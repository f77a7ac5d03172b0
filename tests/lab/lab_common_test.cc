// Checks bench/lab_common.h, the logic the tail-lab benchmarks share: what a row reports must
// follow nccl-tests' definitions and the lab's (max over ranks, nearest-rank percentiles).
#include "bench/lab_common.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

namespace optireduce::lab {
namespace {

TEST(LabCommon, ParseSize) {
  EXPECT_EQ(parse_size("64"), 64u);
  EXPECT_EQ(parse_size("4K"), 4096u);
  EXPECT_EQ(parse_size("1M"), 1u << 20);
  EXPECT_EQ(parse_size("2G"), 2ull << 30);
  EXPECT_EQ(parse_size("0.5M"), 1u << 19);
  EXPECT_EQ(parse_size(""), 0u);
  EXPECT_EQ(parse_size("x"), 0u);
  EXPECT_EQ(parse_size("3Q"), 0u);
  EXPECT_EQ(parse_size("-1"), 0u);
}

TEST(LabCommon, AnExactRowOffByMoreThanRoundingIsAWrongResult) {
  Row r;
  r.algo = "gloo-ring";
  r.bytes = 4096;
  testing::internal::CaptureStderr();
  EXPECT_FALSE(wrong_exact_result(r));  // NaN: not checked
  r.error_max = 3e-7;                   // fp32 rounding
  EXPECT_FALSE(wrong_exact_result(r));
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
  r.error_max = 0.02;
  testing::internal::CaptureStderr();
  EXPECT_TRUE(wrong_exact_result(r));
  EXPECT_EQ(testing::internal::GetCapturedStderr(),
            "gloo-ring at 4096 bytes: wrong result (relative L2 error 0.02)\n");
}

TEST(LabCommon, SizeList) {
  EXPECT_EQ(size_list(1 << 20, 8 << 20, 2),
            (std::vector<uint64_t>{1 << 20, 2 << 20, 4 << 20, 8 << 20}));
  EXPECT_EQ(size_list(1 << 20, 1 << 20, 2), (std::vector<uint64_t>{1 << 20}));
  // A factor that does not land on -e stops below it, as nccl-tests does.
  EXPECT_EQ(size_list(1000, 10000, 3), (std::vector<uint64_t>{1000, 3000, 9000}));
  // Factor 1 would never end: just the two ends.
  EXPECT_EQ(size_list(1024, 4096, 1), (std::vector<uint64_t>{1024, 4096}));
  // Whole fp32 elements.
  EXPECT_EQ(size_list(1023, 1023, 2), (std::vector<uint64_t>{1020}));
  EXPECT_TRUE(size_list(8, 4, 2).empty());
}

TEST(LabCommon, SplitList) {
  EXPECT_EQ(split_list("a,b,,c"), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_TRUE(split_list("").empty());
  EXPECT_EQ(split_list("gloo-ring"), (std::vector<std::string>{"gloo-ring"}));
}

TEST(LabCommon, PercentileNearestRank) {
  std::vector<double> v;
  for (int i = 100; i >= 1; --i) v.push_back(i);
  EXPECT_EQ(percentile(v, 0.50), 50);
  EXPECT_EQ(percentile(v, 0.99), 99);
  EXPECT_EQ(percentile(v, 0.999), 100);
  EXPECT_EQ(percentile(v, 0.0), 1);
  EXPECT_TRUE(std::isnan(percentile({}, 0.5)));
}

TEST(LabCommon, InputsAreSeededPerRankAndBounded) {
  EXPECT_EQ(input_value(1, 0, 7), input_value(1, 0, 7));
  EXPECT_NE(input_value(1, 0, 7), input_value(1, 1, 7));
  EXPECT_NE(input_value(1, 0, 7), input_value(2, 0, 7));
  double mean = 0;
  for (uint64_t i = 0; i < 100000; ++i) {
    const float x = input_value(3, 2, i);
    ASSERT_GE(x, -1.0f);
    ASSERT_LT(x, 1.0f);
    mean += x;
  }
  EXPECT_NEAR(mean / 100000, 0.0, 0.01);
}

TEST(LabCommon, RelativeL2Error) {
  const auto exact = exact_sum(5, 3, 1000);
  std::vector<float> got(exact.begin(), exact.end());
  EXPECT_LT(rel_l2_error(got.data(), exact), 1e-6);
  // Zeroing a quarter of the elements: error about sqrt(1/4).
  for (size_t i = 0; i < got.size(); i += 4) got[i] = 0;
  EXPECT_NEAR(rel_l2_error(got.data(), exact), 0.5, 0.08);
  got[1] = NAN;
  EXPECT_TRUE(std::isinf(rel_l2_error(got.data(), exact)));
}

TEST(LabCommon, StragglerScheduleIsSeededWithTheRequestedRate) {
  EXPECT_EQ(straggler_schedule(1, 50, 0.1), straggler_schedule(1, 50, 0.1));
  EXPECT_NE(straggler_schedule(1, 200, 0.1), straggler_schedule(2, 200, 0.1));
  int hits = 0;
  for (uint64_t seed = 0; seed < 200; ++seed)
    for (bool b : straggler_schedule(seed, 100, 0.1)) hits += b;
  EXPECT_NEAR(hits / 20000.0, 0.1, 0.01);
  for (bool b : straggler_schedule(1, 30, 0.0)) EXPECT_FALSE(b);
  for (bool b : straggler_schedule(1, 30, 1.0)) EXPECT_TRUE(b);
}

TEST(LabCommon, SummarizeFollowsNcclTestsDefinitions) {
  std::vector<Iteration> it(100);
  for (int i = 0; i < 100; ++i) {
    it[size_t(i)].seconds = (i + 1) * 1e-3;  // 1..100 ms
    it[size_t(i)].expected = 1000;
    it[size_t(i)].lost = i < 10 ? 10 : 0;  // 100 of 100000 lost
    it[size_t(i)].deadline = i < 5 ? 1 : 0;
    it[size_t(i)].error = 0.01;
  }
  const Row r = summarize("idle", "x", 4, 50'000'000, it);
  EXPECT_DOUBLE_EQ(r.p50_ms, 50);
  EXPECT_DOUBLE_EQ(r.p99_ms, 99);
  EXPECT_DOUBLE_EQ(r.max_ms, 100);
  EXPECT_NEAR(r.mean_ms, 50.5, 1e-9);
  EXPECT_NEAR(r.tail_ratio, 99.0 / 50, 1e-12);
  EXPECT_NEAR(r.algbw, 1.0, 1e-9);              // 50 MB in 50 ms
  EXPECT_NEAR(r.busbw, 1.0 * 2 * 3 / 4, 1e-9);  // x 2(n-1)/n
  EXPECT_NEAR(r.delivered, 0.999, 1e-12);
  EXPECT_NEAR(r.deadline_frac, 0.05, 1e-12);
  EXPECT_NEAR(r.error, 0.01, 1e-12);
  const std::string line = csv_line(r);
  EXPECT_EQ(line.rfind("idle,x,4,50000000,100,", 0), 0u) << line;
  // As many fields as the header names.
  auto fields = [](const std::string& s) { return std::count(s.begin(), s.end(), ',') + 1; };
  EXPECT_EQ(fields(line), fields(csv_header()));
}

TEST(LabCommon, ParseOptions) {
  const char* argv[] = {"b",      "-b",          "1M",      "-e", "8M",
                        "-f",     "2",           "-n",      "10", "-w",
                        "2",      "-c",          "0",       "-g", "gloo-ring",
                        "--rank", "1",           "--world", "4",  "--straggler-prob",
                        "0.5",    "--interleave"};
  Options o;
  EXPECT_EQ(parse_options(int(std::size(argv)), const_cast<char**>(argv), &o), "");
  EXPECT_EQ(o.min_bytes, 1u << 20);
  EXPECT_EQ(o.max_bytes, 8u << 20);
  EXPECT_EQ(o.iters, 10);
  EXPECT_EQ(o.warmup, 2);
  EXPECT_EQ(o.check, 0);
  EXPECT_EQ(o.algos, "gloo-ring");
  EXPECT_EQ(o.rank, 1);
  EXPECT_EQ(o.world, 4);
  EXPECT_EQ(o.straggler_prob, 0.5);
  EXPECT_TRUE(o.interleave);
  EXPECT_FALSE(Options().interleave);  // one algorithm after another unless asked
  const char* bad[] = {"b", "--nope"};
  Options o2;
  EXPECT_NE(parse_options(2, const_cast<char**>(bad), &o2), "");
  const char* missing[] = {"b", "-n"};
  EXPECT_EQ(parse_options(2, const_cast<char**>(missing), &o2), "-n needs a value");
}

// A value that is not what its option takes stops the bench, naming the option, rather than
// running with something nobody asked for: strtod read "-n 1.5" as one iteration and rounded a
// seed past 2^53.
TEST(LabCommon, ParseOptionsRefusesWhatTheOptionDoesNotTake) {
  const std::vector<std::pair<const char*, const char*>> refused = {{"-n", "1.5"},
                                                                    {"-n", "0"},
                                                                    {"-n", "3x"},
                                                                    {"-w", "-1"},
                                                                    {"-f", "0"},
                                                                    {"-c", "2"},
                                                                    {"-b", "0"},
                                                                    {"-e", "1Q"},
                                                                    {"--rank", "x"},
                                                                    {"--world", "99999999999"},
                                                                    {"--seed", "-1"},
                                                                    {"--seed", "1e3"},
                                                                    {"--straggler-ms", "nan"},
                                                                    {"--straggler-prob", "1.5"},
                                                                    {"--timeout-ms", "0"},
                                                                    {"--background", "0"},
                                                                    {"--duty", "inf"}};
  for (const auto& [flag, value] : refused) {
    const char* argv[] = {"b", flag, value};
    Options o;
    EXPECT_EQ(parse_options(3, const_cast<char**>(argv), &o),
              std::string("invalid value for ") + flag + ": " + value);
  }
  // Whole numbers as written, however large their type takes them.
  const char* argv[] = {"b", "--seed", "18446744073709551615", "-f", "4", "--straggler-ms", "2.5"};
  Options o;
  ASSERT_EQ(parse_options(int(std::size(argv)), const_cast<char**>(argv), &o), "");
  EXPECT_EQ(o.seed, UINT64_MAX);
  EXPECT_EQ(o.factor, 4u);
  EXPECT_EQ(o.straggler_ms, 2.5);
  // RANK and WORLD_SIZE, read when the flags leave them unset, as strictly.
  ::setenv("RANK", "1.0", 1);
  const char* bare[] = {"b"};
  Options e;
  EXPECT_EQ(parse_options(1, const_cast<char**>(bare), &e), "invalid RANK: 1.0");
  ::setenv("RANK", "3", 1);
  ::setenv("WORLD_SIZE", "4", 1);
  Options f;
  EXPECT_EQ(parse_options(1, const_cast<char**>(bare), &f), "");
  EXPECT_EQ(f.rank, 3);
  EXPECT_EQ(f.world, 4);
  ::unsetenv("RANK");
  ::unsetenv("WORLD_SIZE");
}

// --help runs nothing, and the usage it prints lists every option the parser takes: each one
// named there is accepted (with a value where it needs one), and an option the parser does not
// know is not in the usage.
TEST(LabCommon, TheUsageListsEveryOptionTheParserTakes) {
  for (const char* h : {"-h", "--help"}) {
    const char* argv[] = {"b", "-n", "3", h, "--nope"};
    Options o;
    EXPECT_EQ(parse_options(int(std::size(argv)), const_cast<char**>(argv), &o), "") << h;
    EXPECT_TRUE(o.help) << h;
  }
  EXPECT_FALSE(Options().help);
  const std::string usage = options_usage();
  const std::vector<std::pair<std::string, const char*>> taken = {{"-b", "1M"},
                                                                  {"--minbytes", "1M"},
                                                                  {"-e", "2M"},
                                                                  {"--maxbytes", "2M"},
                                                                  {"-f", "2"},
                                                                  {"--stepfactor", "2"},
                                                                  {"-n", "5"},
                                                                  {"--iters", "5"},
                                                                  {"-w", "1"},
                                                                  {"--warmup_iters", "1"},
                                                                  {"-c", "1"},
                                                                  {"--check", "1"},
                                                                  {"-g", "tar-exact"},
                                                                  {"--algo", "tar-exact"},
                                                                  {"--rank", "0"},
                                                                  {"--world", "2"},
                                                                  {"--store", "/tmp/x"},
                                                                  {"--iface", "lo"},
                                                                  {"--env", "idle"},
                                                                  {"--csv", "r.csv"},
                                                                  {"--samples", "s.csv"},
                                                                  {"--seed", "3"},
                                                                  {"--straggler-rank", "1"},
                                                                  {"--straggler-ms", "5"},
                                                                  {"--straggler-prob", "0.1"},
                                                                  {"--timeout-ms", "100"},
                                                                  {"--background", "2"},
                                                                  {"--duty", "0.5"},
                                                                  {"--interleave", nullptr}};
  // Named as an option: after a space, before a space or a comma ("  -b, --minbytes SIZE").
  const auto listed = [&](const std::string& flag) {
    for (size_t at = usage.find(flag); at != std::string::npos; at = usage.find(flag, at + 1)) {
      const size_t end = at + flag.size();
      if (at > 0 && usage[at - 1] == ' ' && end < usage.size() &&
          (usage[end] == ' ' || usage[end] == ','))
        return true;
    }
    return false;
  };
  for (const auto& [flag, value] : taken) {
    EXPECT_TRUE(listed(flag)) << flag << " is not in the usage";
    std::vector<const char*> argv = {"b", flag.c_str()};
    if (value != nullptr) argv.push_back(value);
    Options o;
    EXPECT_EQ(parse_options(int(argv.size()), const_cast<char**>(argv.data()), &o), "") << flag;
  }
  // Every "--name" in the usage is one of them.
  for (size_t at = usage.find("--"); at != std::string::npos; at = usage.find("--", at + 2)) {
    const size_t end = usage.find_first_of(" ,\n", at);
    const std::string flag = usage.substr(at, end - at);
    bool known = false;
    for (const auto& t : taken) known = known || t.first == flag;
    EXPECT_TRUE(known) << flag << " is in the usage but not in this test's list";
  }
}

}  // namespace
}  // namespace optireduce::lab
