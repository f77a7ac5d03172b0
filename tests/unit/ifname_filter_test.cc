// Tests of transport/ifname_filter.cc: NCCL_SOCKET_IFNAME's syntax, read the way NCCL reads it,
// and the values it would read differently from what their author meant, refused.
#include "transport/ifname_filter.h"

#include <gtest/gtest.h>

namespace optireduce {
namespace {

IfnameFilter parsed(const char* text) {
  IfnameFilter f;
  std::string why;
  EXPECT_TRUE(IfnameFilter::parse(text, &f, &why)) << text << ": " << why;
  return f;
}

std::string refusal(const char* text) {
  IfnameFilter f;
  std::string why;
  EXPECT_FALSE(IfnameFilter::parse(text, &f, &why)) << text;
  EXPECT_FALSE(why.empty()) << text;
  return why;
}

TEST(IfnameFilterParse, BlankIsNotGiven) {
  EXPECT_TRUE(parsed("").empty());
  EXPECT_TRUE(parsed("  \t").empty());
}

TEST(IfnameFilterMatches, PrefixByDefault) {
  const IfnameFilter f = parsed("eth,ib");
  EXPECT_FALSE(f.exclude());
  EXPECT_FALSE(f.exact());
  EXPECT_TRUE(f.matches("eth0"));
  EXPECT_TRUE(f.matches("eth"));
  EXPECT_TRUE(f.matches("ib12"));
  EXPECT_FALSE(f.matches("ens1f0"));
  EXPECT_FALSE(f.matches("et"));
}

TEST(IfnameFilterMatches, ExactWithEquals) {
  const IfnameFilter f = parsed("=eth1,lo");
  EXPECT_TRUE(f.exact());
  EXPECT_TRUE(f.matches("eth1"));
  EXPECT_TRUE(f.matches("lo"));
  EXPECT_FALSE(f.matches("eth10"));  // a prefix match would take it
  EXPECT_FALSE(f.matches("eth"));
}

TEST(IfnameFilterMatches, ExcludeWithCaret) {
  const IfnameFilter f = parsed("^docker,lo");
  EXPECT_TRUE(f.exclude());
  EXPECT_FALSE(f.exact());
  EXPECT_FALSE(f.matches("docker0"));
  EXPECT_FALSE(f.matches("lo"));
  EXPECT_FALSE(f.matches("lowpan0"));  // prefixes exclude whatever starts with them
  EXPECT_TRUE(f.matches("eth0"));
}

TEST(IfnameFilterMatches, ExcludeExact) {
  const IfnameFilter f = parsed("^=eth0");
  EXPECT_TRUE(f.exclude());
  EXPECT_TRUE(f.exact());
  EXPECT_FALSE(f.matches("eth0"));
  EXPECT_TRUE(f.matches("eth01"));
  EXPECT_TRUE(f.matches("eth1"));
}

TEST(IfnameFilterParse, SkipsEmptyItemsAndTrimsBlanks) {
  const IfnameFilter f = parsed(" ,eth0 ,, \tib1 ,");
  ASSERT_EQ(f.items().size(), 2u);
  EXPECT_EQ(f.items()[0], "eth0");
  EXPECT_EQ(f.items()[1], "ib1");
  // Blanks around the markers too: " ^ = eth0" is "^=eth0".
  for (const char* text : {" ^= eth0", "^ =eth0", " ^ = eth0 "}) {
    const IfnameFilter g = parsed(text);
    EXPECT_TRUE(g.exclude()) << text;
    EXPECT_TRUE(g.exact()) << text;
    ASSERT_EQ(g.items().size(), 1u) << text;
    EXPECT_EQ(g.items()[0], "eth0") << text;
  }
}

TEST(IfnameFilterParse, MarkersWithoutNamesAreRefused) {
  EXPECT_NE(refusal("^").find("'^' must be followed"), std::string::npos);
  EXPECT_NE(refusal("=").find("'=' must be followed"), std::string::npos);
  EXPECT_NE(refusal("^=,").find("'^=' must be followed"), std::string::npos);
  EXPECT_NE(refusal(",, ,").find("no interface"), std::string::npos);
}

TEST(IfnameFilterParse, BadValuesSayWhy) {
  EXPECT_NE(refusal("=^eth0").find("before"), std::string::npos);
  EXPECT_NE(refusal("eth0,^eth1").find("lead"), std::string::npos);
  EXPECT_NE(refusal("eth0,=eth1").find("lead"), std::string::npos);
  EXPECT_NE(refusal("eth 0").find("blank"), std::string::npos);
  EXPECT_NE(refusal("eth0:1").find("':'"), std::string::npos);
  EXPECT_NE(refusal("mlx5_0:1").find("':'"), std::string::npos);
  EXPECT_NE(refusal("net/eth0").find("'/'"), std::string::npos);
  EXPECT_NE(refusal("averyveryverylongname0").find("15 characters"), std::string::npos);
  // The longest name the kernel allows is fine.
  EXPECT_EQ(parsed("abcdefghijklmno").items().size(), 1u);
}

}  // namespace
}  // namespace optireduce
