#include "common/settings.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>

namespace kvpool {
namespace {

struct Opts {
  uint64_t capacity = 1ull << 30;
  uint32_t conns = 256;
  bool flag = true;
  std::string name = "n";
  std::string mode = "a";
  std::chrono::milliseconds ttl{10000};
};

struct Fixture {
  Opts o;
  SettingsTable t;
  Fixture() {
    t.AddBytes("capacity", &o.capacity, 1 << 20, 1ull << 40, "Capacity");
    t.AddInt("conns", &o.conns, 1, 1000, "Connections");
    t.AddBool("flag", &o.flag, "A flag");
    t.AddString("name", &o.name, "Name");
    t.AddEnum("mode", &o.mode, {"a", "b"}, "Mode");
    t.AddDuration("ttl", &o.ttl, std::chrono::milliseconds(1000), std::chrono::milliseconds(60000), "TTL");
  }
  Status Parse(std::vector<const char*> args) {
    args.insert(args.begin(), "prog");
    bool help;
    return t.ParseArgs(static_cast<int>(args.size()), args.data(), &help);
  }
};

TEST(SettingsTest, ParsesEveryType) {
  Fixture f;
  ASSERT_TRUE(f.Parse({"--capacity=2GiB", "--conns", "7", "--no-flag", "--name=x y", "--mode", "b",
                       "--ttl=3s"}).ok());
  EXPECT_EQ(f.o.capacity, 2ull << 30);
  EXPECT_EQ(f.o.conns, 7u);
  EXPECT_FALSE(f.o.flag);
  EXPECT_EQ(f.o.name, "x y");
  EXPECT_EQ(f.o.mode, "b");
  EXPECT_EQ(f.o.ttl.count(), 3000);
}

// An enum row binds the enum itself: its names are the table's (one place),
// a name sets the value, the JSON and --help show the name, and a name not
// in the table is refused with the choices.
enum class Color { kRed, kDeepBlue };
constexpr EnumNames<Color, 2> kColorNames = {
    {{"red", Color::kRed}, {"deep-blue", Color::kDeepBlue}}};

TEST(SettingsTest, EnumRowsBindTheEnumByItsNames) {
  Color c = Color::kRed;
  SettingsTable t;
  t.AddEnum("color", &c, kColorNames, "Color");
  auto j = nlohmann::json::parse(t.ToJson());
  EXPECT_EQ(j["color"]["default"], "red");
  EXPECT_EQ(j["color"]["type"], "enum");
  ASSERT_TRUE(t.Set("color", "deep-blue").ok());
  EXPECT_EQ(c, Color::kDeepBlue);
  EXPECT_EQ(nlohmann::json::parse(t.ToJson())["color"]["value"], "deep-blue");
  Status s = t.Set("color", "blue");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "--color: 'blue' is not one of red|deep-blue");
  EXPECT_EQ(c, Color::kDeepBlue);  // unchanged
  EXPECT_NE(t.HelpText("p", "s").find("allowed: red|deep-blue"), std::string::npos);
  EXPECT_EQ(NameOf(kColorNames, Color::kRed), "red");
  EXPECT_EQ(ValueOf(kColorNames, "deep-blue"), Color::kDeepBlue);
  EXPECT_EQ(ValueOf(kColorNames, "green"), std::nullopt);
}

// An integer row bound to a duration field counts in the field's unit.
TEST(SettingsTest, IntRowsBindADurationInItsOwnUnit) {
  std::chrono::microseconds spin{50};
  uint16_t port = 0;
  SettingsTable t;
  t.AddInt("spin-us", &spin, 0, 10000, "Spin");
  t.AddInt("port", &port, 0, 65535, "Port");
  EXPECT_EQ(nlohmann::json::parse(t.ToJson())["spin-us"]["default"], "50");
  ASSERT_TRUE(t.Set("spin-us", "7").ok());
  EXPECT_EQ(spin, std::chrono::microseconds(7));
  ASSERT_TRUE(t.Set("port", "65535").ok());
  EXPECT_EQ(port, 65535);
  Status s = t.Set("spin-us", "10001");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(spin, std::chrono::microseconds(7));  // unchanged
  EXPECT_FALSE(t.Set("port", "65536").ok());
  EXPECT_EQ(port, 65535);
}

TEST(SettingsTest, RejectsBadValuesWithClearErrors) {
  Fixture f;
  Status s = f.Parse({"--conns=0"});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--conns: 0 is outside 1..1000"), std::string::npos) << s.ToString();
  EXPECT_EQ(f.Parse({"--capacity=12XB"}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(f.Parse({"--capacity=1KiB"}).code(), StatusCode::kInvalidArgument);  // below min
  EXPECT_EQ(f.Parse({"--mode=c"}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(f.Parse({"--nope=1"}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(f.Parse({"positional"}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(f.Parse({"--conns"}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(f.Parse({"--ttl=5 days"}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(f.Parse({"--capacity=99999999999999999999"}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(f.o.conns, 256u);  // untouched by the failures
}

TEST(SettingsTest, ConfigFileThenFlagsOverride) {
  char path[] = "/tmp/kvpool-settings-XXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  {
    std::ofstream out(path);
    out << "# comment\nconns = 9\nname = \"from file\"  # trailing\n\nmode=b\n";
  }
  Fixture f;
  ASSERT_TRUE(f.Parse({"--conns=11", "--config", path}).ok());
  EXPECT_EQ(f.o.conns, 11u);
  EXPECT_EQ(f.o.name, "from file");
  EXPECT_EQ(f.o.mode, "b");
  {
    std::ofstream out(path);
    out << "conns = 9\nbogus line\n";
  }
  Fixture g;
  Status s = g.Parse({"--config", path});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find(":2:"), std::string::npos) << s.ToString();
  unlink(path);
}

TEST(SettingsTest, HelpAndJsonListEveryRow) {
  Fixture f;
  std::string help = f.t.HelpText("prog", "summary");
  for (auto name : {"--capacity", "--conns", "--flag", "--name", "--mode", "--ttl"}) {
    EXPECT_NE(help.find(name), std::string::npos) << name;
  }
  EXPECT_NE(help.find("default: 1GiB"), std::string::npos);
  auto j = nlohmann::json::parse(f.t.ToJson());
  EXPECT_EQ(j["capacity"]["value"], "1GiB");
  EXPECT_EQ(j["conns"]["default"], "256");
  EXPECT_EQ(j["mode"]["allowed"], "a|b");
}

TEST(SettingsTest, ByteAndDurationParsers) {
  uint64_t b;
  EXPECT_TRUE(SettingsTable::ParseBytes("64MiB", &b));
  EXPECT_EQ(b, 64ull << 20);
  EXPECT_TRUE(SettingsTable::ParseBytes("1g", &b));
  EXPECT_EQ(b, 1ull << 30);
  EXPECT_TRUE(SettingsTable::ParseBytes("4096", &b));
  EXPECT_EQ(b, 4096u);
  EXPECT_FALSE(SettingsTable::ParseBytes("", &b));
  EXPECT_FALSE(SettingsTable::ParseBytes("MiB", &b));
  int64_t ms;
  EXPECT_TRUE(SettingsTable::ParseDurationMs("10s", &ms));
  EXPECT_EQ(ms, 10000);
  EXPECT_TRUE(SettingsTable::ParseDurationMs("250", &ms));
  EXPECT_EQ(ms, 250);
  EXPECT_EQ(SettingsTable::FormatBytes(3ull << 20), "3MiB");
  EXPECT_EQ(SettingsTable::FormatBytes(1000), "1000");
}

}  // namespace
}  // namespace kvpool
