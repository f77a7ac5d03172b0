// The parameter table: defaults, typed parsing, clear errors on bad values, and the README
// table kept equal to the generated one (pass the README path as argv[1]).
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>

#include "transport/log.h"
#include "transport/params.h"

namespace optireduce {
namespace {

std::map<std::string, std::string> g_env;
const char* lookup(const char* name) {
  auto it = g_env.find(name);
  return it == g_env.end() ? nullptr : it->second.c_str();
}
std::string g_readme;

TEST(ParseConfig, DefaultsWithEmptyEnvironment) {
  g_env.clear();
  Config c;
  std::string err;
  ASSERT_TRUE(parse_config(&c, &err, nullptr, lookup).is_ok());
  EXPECT_EQ(c.mode, ModeChoice::kExact);
  EXPECT_EQ(c.calibration_steps, 100);
  EXPECT_DOUBLE_EQ(c.early_fraction, 0.1);
  EXPECT_FALSE(c.fault_enabled());
}

TEST(ParseConfig, TypedValues) {
  g_env = {{"OPTIREDUCE_MODE", "bounded"},      {"OPTIREDUCE_UDP_GSO", "off"},
           {"OPTIREDUCE_FAULT_DROP", "0.05"},    {"OPTIREDUCE_BOUNDED_TRAFFIC_CLASS", "0x10"},
           {"OPTIREDUCE_IFNAME", "lo"},          {"OPTIREDUCE_INCAST", "3"}};
  Config c;
  std::string err;
  ASSERT_TRUE(parse_config(&c, &err, nullptr, lookup).is_ok()) << err;
  EXPECT_EQ(c.mode, ModeChoice::kBounded);
  EXPECT_FALSE(c.udp_gso);
  EXPECT_DOUBLE_EQ(c.fault_drop, 0.05);
  EXPECT_TRUE(c.fault_enabled());
  EXPECT_EQ(c.bounded_traffic_class, 16);
  EXPECT_EQ(c.ifname, "lo");
  EXPECT_EQ(c.incast, 3);
}

// Enumerated variables become enums, once, from their names in the row's order; OPTIREDUCE_INCAST
// takes its two names or a number within the one bound liboptireduce accepts.
TEST(ParseConfig, EnumeratedValuesAreTyped) {
  struct Case {
    const char* name;
    const char* value;
    bool (*check)(const Config&);
  };
  const Case cases[] = {
      {"OPTIREDUCE_DATAPATH", "udp",
       [](const Config& c) { return c.datapath == DatapathChoice::kUdp; }},
      {"OPTIREDUCE_DATAPATH", "verbs",
       [](const Config& c) { return c.datapath == DatapathChoice::kVerbs; }},
      {"OPTIREDUCE_FILL", "marker", [](const Config& c) { return c.fill == FillChoice::kMarker; }},
      {"OPTIREDUCE_ALLREDUCE_MODE", "bounded",
       [](const Config& c) { return c.allreduce_mode == ModeChoice::kBounded; }},
      {"OPTIREDUCE_INCAST", "max", [](const Config& c) { return c.incast == kIncastMax; }},
      {"OPTIREDUCE_INCAST", "auto", [](const Config& c) { return c.incast == kIncastAuto; }},
      {"OPTIREDUCE_INCAST", "1048576", [](const Config& c) { return c.incast == 1 << 20; }},
      {"OPTIREDUCE_LOG", "none", [](const Config& c) { return c.log == LogChoice::kNone; }},
      {"OPTIREDUCE_LOG", "trace", [](const Config& c) { return c.log == LogChoice::kTrace; }},
  };
  for (const Case& k : cases) {
    g_env = {{k.name, k.value}};
    Config c;
    std::string err;
    ASSERT_TRUE(parse_config(&c, &err, nullptr, lookup).is_ok()) << k.name << ": " << err;
    EXPECT_TRUE(k.check(c)) << k.name << "=" << k.value;
  }
  const Config d;
  EXPECT_EQ(d.datapath, DatapathChoice::kAuto);
  EXPECT_EQ(d.fill, FillChoice::kZero);
  EXPECT_EQ(d.incast, kIncastMax);
  for (const char* bad : {"1048577", "-1", "Max", "3x"}) {
    g_env = {{"OPTIREDUCE_INCAST", bad}};
    Config c;
    std::string err;
    EXPECT_FALSE(parse_config(&c, &err, nullptr, lookup).is_ok()) << bad;
    EXPECT_NE(err.find("one of max|auto or an integer in [1, 1048576]"), std::string::npos) << err;
  }
}

// Where a variable of ours is unset (or empty), NCCL's for the same setting stands in: its value
// is checked, and reported, under its own name; ours wins where both are set.
TEST(ParseConfig, NcclVariablesStandInForUnsetOnes) {
  struct Case {
    const char* ours;
    const char* theirs;
    const char* good;   // for theirs
    const char* other;  // for ours, beside theirs
    const char* bad;
    const char* why;  // in the message for bad
    std::string (*value)(const Config&);
    std::string Config::*source;  // where the name of the variable used is kept, if anywhere
  };
  const Case cases[] = {
      {"OPTIREDUCE_IFNAME", "NCCL_SOCKET_IFNAME", "=eth1", "ens", "=^eth0", "'^' must come",
       [](const Config& c) { return c.ifname; }, &Config::ifname_var},
      {"OPTIREDUCE_IB_HCA", "NCCL_IB_HCA", "=mlx5_0:1,mlx5_1", "^mlx5_bond", "mlx5_0:x",
       "port number from 1 to 255", [](const Config& c) { return c.ib_hca; }, &Config::ib_hca_var},
      {"OPTIREDUCE_GID_INDEX", "NCCL_IB_GID_INDEX", "3", "-1", "300", "",
       [](const Config& c) { return std::to_string(c.gid_index); }, &Config::gid_index_var},
      {"OPTIREDUCE_IB_TC", "NCCL_IB_TC", "106", "0", "256", "",
       [](const Config& c) { return std::to_string(c.ib_tc); }, nullptr},
      {"OPTIREDUCE_IB_SL", "NCCL_IB_SL", "3", "0", "16", "",
       [](const Config& c) { return std::to_string(c.ib_sl); }, nullptr},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.theirs);
    Config c;
    std::string err;
    g_env = {{k.theirs, k.good}};
    ASSERT_TRUE(parse_config(&c, &err, nullptr, lookup).is_ok()) << err;
    EXPECT_EQ(k.value(c), k.good);
    if (k.source) {
      EXPECT_EQ(c.*k.source, k.theirs);
    }
    g_env = {{k.theirs, k.good}, {k.ours, ""}};
    ASSERT_TRUE(parse_config(&c, &err, nullptr, lookup).is_ok()) << err;
    EXPECT_EQ(k.value(c), k.good);
    g_env = {{k.theirs, k.good}, {k.ours, k.other}};
    ASSERT_TRUE(parse_config(&c, &err, nullptr, lookup).is_ok()) << err;
    EXPECT_EQ(k.value(c), k.other);
    if (k.source) {
      EXPECT_EQ(c.*k.source, k.ours);
    }
    g_env = {{k.theirs, k.bad}};
    EXPECT_EQ(parse_config(&c, &err, nullptr, lookup).code(), Errc::kInvalidUsage);
    EXPECT_NE(err.find(std::string("invalid ") + k.theirs + "=\"" + k.bad + "\""),
              std::string::npos)
        << err;
    EXPECT_NE(err.find(k.why), std::string::npos) << err;
    g_env.clear();
    ASSERT_TRUE(parse_config(&c, &err, nullptr, lookup).is_ok()) << err;
    if (k.source) {
      EXPECT_EQ(c.*k.source, k.ours);
    }
  }
}

TEST(ParseConfig, BadValuesNameTheVariableAndWhatIsAllowed) {
  const std::pair<const char*, const char*> bad[] = {
      {"OPTIREDUCE_MODE", "fast"},        {"OPTIREDUCE_FAULT_DROP", "1.5"},
      {"OPTIREDUCE_FAULT_DROP", "abc"},   {"OPTIREDUCE_RTO_MIN_US", "12x"},
      {"OPTIREDUCE_UDP_GSO", "maybe"},    {"OPTIREDUCE_HADAMARD_BLOCK", "1000"},
      {"OPTIREDUCE_MAX_DATAGRAM", "100"}, {"OPTIREDUCE_INCAST", "0"},
      {"OPTIREDUCE_SOCKET_BUFFER", "-1"}, {"OPTIREDUCE_IFNAME", "^"},
      {"OPTIREDUCE_IFNAME", "=^eth0"},    {"OPTIREDUCE_IFNAME", "eth0:1"},
      {"OPTIREDUCE_LOG", "verbose"},      {"OPTIREDUCE_IB_HCA", "rxe0:0"},
      {"OPTIREDUCE_IB_HCA", ":1"},        {"OPTIREDUCE_IB_HCA", "=^mlx5"},
  };
  for (const auto& [name, value] : bad) {
    g_env = {{name, value}};
    Config c;
    std::string err;
    const Status st = parse_config(&c, &err, nullptr, lookup);
    EXPECT_EQ(st.code(), Errc::kInvalidUsage) << name << "=" << value;
    EXPECT_NE(err.find(name), std::string::npos) << err;
  }
}

// log.cc reads OPTIREDUCE_LOG before the table can (parse_log_level); both take the same names,
// in the same order.
TEST(ParseConfig, TheLoggerReadsTheLogLevelAsTheTableDoes) {
  const std::pair<const char*, LogLevel> names[] = {{"none", LogLevel::kNone},
                                                    {"warn", LogLevel::kWarn},
                                                    {"info", LogLevel::kInfo},
                                                    {"trace", LogLevel::kTrace}};
  for (size_t i = 0; i < std::size(names); ++i) {
    LogLevel level = LogLevel::kWarn;
    EXPECT_TRUE(parse_log_level(names[i].first, &level)) << names[i].first;
    EXPECT_EQ(level, names[i].second) << names[i].first;
    g_env = {{"OPTIREDUCE_LOG", names[i].first}};
    Config c;
    std::string err;
    ASSERT_TRUE(parse_config(&c, &err, nullptr, lookup).is_ok()) << err;
    EXPECT_EQ(static_cast<size_t>(c.log), i) << names[i].first;
  }
  for (const char* bad : {"", "inf", "infoo", "INFO", "warn|info"}) {
    LogLevel level = LogLevel::kTrace;
    EXPECT_FALSE(parse_log_level(bad, &level)) << bad;
    EXPECT_EQ(level, LogLevel::kTrace) << bad;
  }
}

TEST(ParseConfig, IfnameTakesNcclSocketIfnameSyntax) {
  for (const char* v : {"eth0", "=eth0,eth1", "^docker,lo", "^=eth0", " ib , eth "}) {
    g_env = {{"OPTIREDUCE_IFNAME", v}};
    Config c;
    std::string err;
    ASSERT_TRUE(parse_config(&c, &err, nullptr, lookup).is_ok()) << v << ": " << err;
    EXPECT_EQ(c.ifname, v);
  }
  g_env = {{"OPTIREDUCE_IFNAME", "^="}};
  Config c;
  std::string err;
  EXPECT_EQ(parse_config(&c, &err, nullptr, lookup).code(), Errc::kInvalidUsage);
  EXPECT_EQ(err, "invalid OPTIREDUCE_IFNAME=\"^=\": '^=' must be followed by interface names");
}

TEST(ParamsTable, ReadmeTableIsTheGeneratedOne) {
  if (g_readme.empty()) GTEST_SKIP() << "README path not given";
  std::ifstream in(g_readme);
  ASSERT_TRUE(in) << g_readme;
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  const std::string begin = "<!-- params:begin -->\n", end = "<!-- params:end -->";
  const auto b = text.find(begin), e = text.find(end);
  ASSERT_NE(b, std::string::npos);
  ASSERT_NE(e, std::string::npos);
  EXPECT_EQ(text.substr(b + begin.size(), e - b - begin.size()), params_markdown_table())
      << "README's variable table is stale: regenerate it with build/tests/unit/params_table";
}

}  // namespace
}  // namespace optireduce

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc > 1) optireduce::g_readme = argv[1];
  return RUN_ALL_TESTS();
}
