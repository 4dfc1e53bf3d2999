// The tools read sizes and durations with the node's settings parsers: for a
// table of inputs, what a tool gets from SettingsTable::ParseSize /
// ParseDuration equals what kvpool-node's bytes and duration rows store (or
// the same error), and the tool binaries accept, refuse and report values the
// same way.
#include <sys/wait.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>

#include <gtest/gtest.h>

#include "common/settings.h"

namespace kvpool {
namespace {

using std::chrono::milliseconds;

struct SizeCase {
  const char* text;
  std::optional<uint64_t> bytes;  // nullopt: refused
};

struct DurationCase {
  const char* text;
  std::optional<int64_t> ms;  // nullopt: refused
};

constexpr SizeCase kSizes[] = {
    {"4096", 4096},
    {"0", 0},
    {"1b", 1},
    {"64KiB", 64ull << 10},
    {"64k", 64ull << 10},
    {"64KB", 64ull << 10},
    {"1MiB", 1ull << 20},
    {"4M", 4ull << 20},
    {"1g", 1ull << 30},
    {"2GiB", 2ull << 30},
    {"1TiB", 1ull << 40},
    {" 16 MiB ", 16ull << 20},
    {"", std::nullopt},
    {"MiB", std::nullopt},
    {"1.5GiB", std::nullopt},
    {"-1", std::nullopt},
    {"10x", std::nullopt},
    {"1PiB", std::nullopt},
    {"99999999999999999999", std::nullopt},
    {"17179869184GiB", std::nullopt},  // 2^64 bytes: overflows
};

constexpr DurationCase kDurations[] = {
    {"250", 250},  // a bare number is milliseconds, as in the node
    {"5", 5},
    {"0", 0},
    {"500ms", 500},
    {"5s", 5000},
    {"2m", 120000},
    {"2min", 120000},
    {"1h", 3600000},
    {" 10s ", 10000},
    {"", std::nullopt},
    {"s", std::nullopt},
    {"1.5s", std::nullopt},
    {"-1s", std::nullopt},
    {"5x", std::nullopt},
    {"5S", std::nullopt},
    {"10us", std::nullopt},
};

TEST(ToolFlagsTest, SizesMatchTheNodesBytesRows) {
  for (const SizeCase& c : kSizes) {
    SCOPED_TRACE(std::string("input '") + c.text + "'");
    Result<uint64_t> tool = SettingsTable::ParseSize("value-size", c.text);

    uint64_t field = 7;
    SettingsTable node;
    node.AddBytes("value-size", &field, 0, UINT64_MAX, "bytes per value");
    Status node_st = node.Set("value-size", c.text);

    if (c.bytes) {
      ASSERT_TRUE(tool.ok()) << tool.status().ToString();
      EXPECT_EQ(*tool, *c.bytes);
      ASSERT_TRUE(node_st.ok()) << node_st.ToString();
      EXPECT_EQ(field, *c.bytes);
    } else {
      ASSERT_FALSE(tool.ok());
      EXPECT_EQ(tool.status().code(), StatusCode::kInvalidArgument);
      EXPECT_EQ(tool.status().message(),
                std::string("--value-size: not a size (e.g. 64MiB, 1G, 4096): '") + c.text + "'");
      EXPECT_EQ(node_st.ToString(), tool.status().ToString());
      EXPECT_EQ(field, 7u);
    }
  }
}

TEST(ToolFlagsTest, DurationsMatchTheNodesDurationRows) {
  for (const DurationCase& c : kDurations) {
    SCOPED_TRACE(std::string("input '") + c.text + "'");
    Result<milliseconds> tool = SettingsTable::ParseDuration("duration", c.text);

    milliseconds field{7};
    SettingsTable node;
    node.AddDuration("duration", &field, milliseconds(0), milliseconds::max(), "run length");
    Status node_st = node.Set("duration", c.text);

    if (c.ms) {
      ASSERT_TRUE(tool.ok()) << tool.status().ToString();
      EXPECT_EQ(tool->count(), *c.ms);
      ASSERT_TRUE(node_st.ok()) << node_st.ToString();
      EXPECT_EQ(field.count(), *c.ms);
    } else {
      ASSERT_FALSE(tool.ok());
      EXPECT_EQ(tool.status().code(), StatusCode::kInvalidArgument);
      EXPECT_EQ(tool.status().message(),
                std::string("--duration: not a duration (e.g. 10s, 500ms): '") + c.text + "'");
      EXPECT_EQ(node_st.ToString(), tool.status().ToString());
      EXPECT_EQ(field.count(), 7);
    }
  }
}

// Runs a command; returns its exit status and what it wrote (stdout+stderr).
std::pair<int, std::string> RunTool(const std::string& cmd) {
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return {-1, ""};
  char buf[512];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int st = pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

TEST(ToolFlagsTest, KvpoolBenchReportsBadValuesWithTheNodesMessages) {
  const std::string bin = KVPOOL_BENCH_BIN;
  EXPECT_EQ(RunTool(bin + " --socket /nonexistent/kvpool.sock --duration 5x"),
            std::make_pair(2, std::string("kvpool-bench: --duration: not a duration (e.g. 10s, 500ms): '5x'\n")));
  EXPECT_EQ(RunTool(bin + " --socket /nonexistent/kvpool.sock --warmup 1.5s"),
            std::make_pair(2, std::string("kvpool-bench: --warmup: not a duration (e.g. 10s, 500ms): '1.5s'\n")));
  EXPECT_EQ(RunTool(bin + " --socket /nonexistent/kvpool.sock --value-size 1PiB"),
            std::make_pair(2, std::string("kvpool-bench: --value-size: not a size (e.g. 64MiB, 1G, 4096): '1PiB'\n")));
  EXPECT_EQ(RunTool(bin + " --socket /nonexistent/kvpool.sock --buffer-size MiB"),
            std::make_pair(2, std::string("kvpool-bench: --buffer-size: not a size (e.g. 64MiB, 1G, 4096): 'MiB'\n")));
  EXPECT_EQ(RunTool(bin + " --socket /nonexistent/kvpool.sock --duration 0"),
            std::make_pair(2, std::string("kvpool-bench: --duration must be > 0\n")));
  // Well-formed values (a bare duration included) pass parsing; the run then
  // stops at the missing node.
  auto [rc, out] = RunTool(bin + " --socket /nonexistent/kvpool.sock --duration 5 --warmup 0 --value-size 64KiB"
                       " --buffer-size 1M");
  EXPECT_EQ(rc, 1) << out;
  EXPECT_EQ(out.rfind("kvpool-bench: cannot connect to /nonexistent/kvpool.sock: ", 0), 0u) << out;
}

TEST(ToolFlagsTest, MemcpyBenchReadsSizesAsTheNode) {
  const std::string bin = KVPOOL_MEMCPY_BENCH_BIN;
  EXPECT_EQ(RunTool(bin + " --duration 3sec"),
            std::make_pair(2, std::string("kvpool-memcpy-bench: --duration: not a duration (e.g. 10s, 500ms): '3sec'\n")));
  EXPECT_EQ(RunTool(bin + " --block-size 64KiB,x"),
            std::make_pair(2, std::string("kvpool-memcpy-bench: --block-size: not a size (e.g. 64MiB, 1G, 4096): 'x'\n")));
  EXPECT_EQ(RunTool(bin + " --block-size 0"),
            std::make_pair(2, std::string("kvpool-memcpy-bench: --block-size must be > 0\n")));
  // The parsed values show in the refusal of a block over half the working set.
  auto [rc, out] = RunTool(bin + " --block-size 3145728 --working-set 4M --duration 1");
  EXPECT_EQ(rc, 2);
  EXPECT_EQ(out, "kvpool-memcpy-bench: warning: working set 4MiB < 1GiB may fit in caches and overstate "
                 "memory bandwidth\nkvpool-memcpy-bench: block 3MiB needs a working set of at least twice that\n");
}

TEST(ToolFlagsTest, KvpoolctlTimeoutIsANodeDuration) {
  const std::string bin = std::string(KVPOOL_CTL_BIN) + " --socket /nonexistent/kvpool.sock";
  EXPECT_EQ(RunTool(bin + " --timeout 5x stat"),
            std::make_pair(2, std::string("kvpoolctl: --timeout: not a duration (e.g. 10s, 500ms): '5x'\n")));
  EXPECT_EQ(RunTool(bin + " --timeout=0 stat"),
            std::make_pair(2, std::string("kvpoolctl: --timeout: 0ms is outside 1ms..4294967295ms\n")));
  EXPECT_EQ(RunTool(bin + " --timeout 50d stat"),
            std::make_pair(2, std::string("kvpoolctl: --timeout: not a duration (e.g. 10s, 500ms): '50d'\n")));
  EXPECT_EQ(RunTool(bin + " --timeout 1200h stat"),
            std::make_pair(2, std::string("kvpoolctl: --timeout: 4320000000ms is outside 1ms..4294967295ms\n")));
  // Well-formed timeouts, with and without a unit, get as far as connecting.
  for (const char* t : {"250", "5s", "1m"}) {
    auto [rc, out] = RunTool(bin + " --timeout " + t + " stat");
    EXPECT_EQ(rc, 3) << t << ": " << out;
    EXPECT_EQ(out.rfind("kvpoolctl: cannot connect: ", 0), 0u) << t << ": " << out;
  }
}

}  // namespace
}  // namespace kvpool
