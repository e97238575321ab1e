#include <gtest/gtest.h>

#include "common/error.hpp"
#include "common/log.hpp"
#include "common/strings.hpp"

TEST(StringsTest, ParseIntAcceptsOnlyWholeNumbersInRange) {
  EXPECT_EQ(pe::parse_int("42", 0, 100), 42);
  EXPECT_EQ(pe::parse_int("-3", -5, 5), -3);
  EXPECT_FALSE(pe::parse_int("", 0, 9));
  EXPECT_FALSE(pe::parse_int("4x", 0, 9));
  EXPECT_FALSE(pe::parse_int(" 4", 0, 9));
  EXPECT_FALSE(pe::parse_int("10", 0, 9));
  EXPECT_FALSE(pe::parse_int("-", 0, 9));
  EXPECT_FALSE(pe::parse_int("123456789012345678901234", 0, 9));
}

TEST(StringsTest, ParseSeconds) {
  EXPECT_DOUBLE_EQ(*pe::parse_seconds("1.5"), 1.5);
  EXPECT_DOUBLE_EQ(*pe::parse_seconds("0"), 0.0);
  EXPECT_FALSE(pe::parse_seconds("-1"));
  EXPECT_FALSE(pe::parse_seconds("inf"));
  EXPECT_FALSE(pe::parse_seconds("1e400"));
  EXPECT_FALSE(pe::parse_seconds("2s"));
}

TEST(StringsTest, EnvNames) {
  EXPECT_TRUE(pe::is_env_name("A_1"));
  EXPECT_TRUE(pe::is_env_name("_x"));
  EXPECT_FALSE(pe::is_env_name("1A"));
  EXPECT_FALSE(pe::is_env_name("A.B"));
  EXPECT_FALSE(pe::is_env_name(""));
}

TEST(StringsTest, Split) {
  EXPECT_EQ(pe::split("a::b", ':'), (std::vector<std::string>{"a", "", "b"}));
  EXPECT_EQ(pe::split("", ':'), (std::vector<std::string>{""}));
}

TEST(LogTest, LevelsComeFromVerbosityAndSpec) {
  pe::init_logging(0, "", "h");
  EXPECT_EQ(pe::logger("exec")->level(), spdlog::level::warn);
  pe::init_logging(2, "", "h");
  EXPECT_EQ(pe::logger("agent")->level(), spdlog::level::debug);
  pe::init_logging(0, "info,agent=trace", "h");
  EXPECT_EQ(pe::logger("exec")->level(), spdlog::level::info);
  EXPECT_EQ(pe::logger("agent")->level(), spdlog::level::trace);
  EXPECT_THROW(pe::init_logging(0, "loud", "h"), pe::UsageError);
  EXPECT_THROW(pe::init_logging(0, "nosuch=info", "h"), pe::UsageError);
}
