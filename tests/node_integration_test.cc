// Integration tests against the real kvpool-node: C++ and C clients,
// kvpoolctl, concurrent byte-exact traffic, eviction under pins, /metrics.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <thread>

#include "harness/node_process.h"
#include "kvpool/client.h"
#include "kvpool/kvpool.h"
#include "testing/wait_for.h"

namespace kvpool::testing {
namespace {

kvpool_client* Open(const std::string& socket, uint32_t conns = 4, bool copy_mode = false) {
  kvpool_options o;
  kvpool_options_init(&o);
  o.socket_path = socket.c_str();
  o.max_connections = conns;
  o.copy_mode = copy_mode ? 1 : 0;
  kvpool_status st;
  kvpool_client* c = kvpool_open(&o, &st);
  EXPECT_NE(c, nullptr) << kvpool_status_name(st) << " " << kvpool_last_error();
  return c;
}

kvpool_key_id Id(const std::string& ns, const std::string& key) { return Client::KeyId(ns, key); }

nlohmann::json Stats(kvpool_client* c) {
  std::vector<char> buf(1 << 20);
  size_t len = 0;
  EXPECT_EQ(kvpool_stats_json(c, buf.data(), buf.size(), &len), KVPOOL_OK);
  return nlohmann::json::parse(std::string(buf.data(), len));
}

class NodeTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    node_ = NodeProcess::Start();
    ASSERT_NE(node_, nullptr);
  }
  std::unique_ptr<NodeProcess> node_;
};

TEST_P(NodeTest, PutGetExistsRemoveByteExact) {
  bool copy_mode = GetParam();
  kvpool_client* c = Open(node_->socket(), 2, copy_mode);
  ASSERT_NE(c, nullptr);
  const size_t kN = 40;
  std::vector<kvpool_key_id> ids;
  std::vector<std::vector<uint8_t>> vals;
  std::vector<const void*> ptrs;
  std::vector<uint64_t> sizes;
  for (size_t i = 0; i < kN; ++i) {
    ids.push_back(Id("it", "k" + std::to_string(i)));
    vals.push_back(Pattern(i, 1 + i * 3001));
  }
  for (auto& v : vals) {
    ptrs.push_back(v.data());
    sizes.push_back(v.size());
  }
  std::vector<kvpool_status> st(kN);
  ASSERT_EQ(kvpool_put(c, ids.data(), ptrs.data(), sizes.data(), kN, st.data()), KVPOOL_OK)
      << kvpool_last_error();
  for (auto s : st) EXPECT_EQ(s, KVPOOL_OK);

  std::vector<std::vector<uint8_t>> out(kN, std::vector<uint8_t>(200000, 0xee));
  std::vector<void*> bufs;
  std::vector<uint64_t> caps(kN, 200000), got(kN);
  for (auto& o : out) bufs.push_back(o.data());
  ASSERT_EQ(kvpool_get(c, ids.data(), bufs.data(), caps.data(), kN, got.data(), st.data()), KVPOOL_OK);
  for (size_t i = 0; i < kN; ++i) {
    ASSERT_EQ(st[i], KVPOOL_OK);
    ASSERT_EQ(got[i], vals[i].size());
    ASSERT_EQ(0, memcmp(out[i].data(), vals[i].data(), got[i])) << i;
    EXPECT_EQ(out[i][got[i]], 0xee);  // nothing written past the value
  }

  // First writer wins: a second put of a committed key keeps the first bytes.
  auto other = Pattern(999, sizes[0]);
  const void* op = other.data();
  kvpool_status one;
  ASSERT_EQ(kvpool_put(c, ids.data(), &op, sizes.data(), 1, &one), KVPOOL_OK);
  EXPECT_EQ(one, KVPOOL_ALREADY_EXISTS);
  ASSERT_EQ(kvpool_get(c, ids.data(), bufs.data(), caps.data(), 1, got.data(), &one), KVPOOL_OK);
  EXPECT_EQ(0, memcmp(out[0].data(), vals[0].data(), got[0]));

  // A buffer too small reports the size needed.
  uint64_t small = 10;
  ASSERT_EQ(kvpool_get(c, ids.data() + 5, bufs.data(), &small, 1, got.data(), &one), KVPOOL_OK);
  EXPECT_EQ(one, KVPOOL_RESOURCE_EXHAUSTED);
  EXPECT_EQ(got[0], sizes[5]);

  // Exists: hits and the hit prefix.
  std::vector<kvpool_key_id> probe = {ids[0], ids[1], Id("it", "absent"), ids[2]};
  uint8_t hits[4];
  size_t prefix = 0;
  ASSERT_EQ(kvpool_exists(c, probe.data(), 4, hits, &prefix), KVPOOL_OK);
  EXPECT_EQ(prefix, 2u);
  EXPECT_EQ(hits[2], 0);
  EXPECT_EQ(hits[3], 1);

  // Remove, then the key misses; namespaces separate keys.
  ASSERT_EQ(kvpool_remove(c, ids.data(), 1, &one), KVPOOL_OK);
  EXPECT_EQ(one, KVPOOL_OK);
  ASSERT_EQ(kvpool_get(c, ids.data(), bufs.data(), caps.data(), 1, got.data(), &one), KVPOOL_OK);
  EXPECT_EQ(one, KVPOOL_NOT_FOUND);
  kvpool_key_id other_ns = Id("it2", "k1");
  ASSERT_EQ(kvpool_exists(c, &other_ns, 1, hits, &prefix), KVPOOL_OK);
  EXPECT_EQ(hits[0], 0);
  kvpool_close(c);
}

INSTANTIATE_TEST_SUITE_P(MappedAndCopyMode, NodeTest, ::testing::Values(false, true));

// The names of process pid's threads (/proc/PID/task/*/comm).
std::multiset<std::string> ThreadNames(pid_t pid) {
  std::multiset<std::string> names;
  const std::string dir = "/proc/" + std::to_string(pid) + "/task";
  for (const auto& task : std::filesystem::directory_iterator(dir)) {
    std::ifstream in(task.path() / "comm");
    std::string name;
    std::getline(in, name);
    names.insert(name);
  }
  return names;
}

// With KV events on, the publisher's thread applies the block descriptor
// table, which has no thread of its own; with them off, the table has one.
TEST(NodeIntegration, TheEventsThreadAppliesTheDescriptorTableWhenEventsAreOn) {
  auto with = NodeProcess::Start({"--kv-events-endpoint", "tcp://127.0.0.1:0"});
  ASSERT_NE(with, nullptr);
  const auto on = ThreadNames(with->pid());
  EXPECT_EQ(on.count("kvpool-events"), 1u);
  EXPECT_EQ(on.count("kvpool-blocks"), 0u);
  auto without = NodeProcess::Start();
  ASSERT_NE(without, nullptr);
  const auto off = ThreadNames(without->pid());
  EXPECT_EQ(off.count("kvpool-events"), 0u);
  EXPECT_EQ(off.count("kvpool-blocks"), 1u);
}

TEST(NodeIntegration, ValueOverMaximumAndZeroSizeAreInvalid) {
  auto node = NodeProcess::Start({"--max-value-size", "1MiB", "--max-frame", "2MiB"});
  ASSERT_NE(node, nullptr);
  for (bool copy_mode : {false, true}) {
    kvpool_client* c = Open(node->socket(), 1, copy_mode);
    ASSERT_EQ(kvpool_max_value_size(c), 1u << 20);
    std::vector<uint8_t> big((1 << 20) + 1, 1);
    kvpool_key_id id = Id("it", "big");
    const void* p = big.data();
    uint64_t size = big.size();
    kvpool_status st;
    EXPECT_EQ(kvpool_put(c, &id, &p, &size, 1, &st), KVPOOL_INVALID_ARGUMENT);
    EXPECT_EQ(st, KVPOOL_INVALID_ARGUMENT);
    size = 0;
    EXPECT_EQ(kvpool_put(c, &id, &p, &size, 1, &st), KVPOOL_INVALID_ARGUMENT);
    uint8_t hit = 9;
    ASSERT_EQ(kvpool_exists(c, &id, 1, &hit, nullptr), KVPOOL_OK);
    EXPECT_EQ(hit, 0);
    kvpool_close(c);
  }
}

TEST(NodeIntegration, PutLargerThanTheFreeSegment) {
  auto node = NodeProcess::Start({"--dram-capacity", "16MiB", "--slab-size", "1MiB",
                                  "--max-value-size", "32MiB", "--max-frame", "40MiB"});
  ASSERT_NE(node, nullptr);
  kvpool_client* c = Open(node->socket(), 1);
  // A value larger than the whole segment can never fit: the node's maximum
  // is the segment size, and the put is invalid.
  EXPECT_EQ(kvpool_max_value_size(c), 16u << 20);
  std::vector<uint8_t> v(20 << 20, 3);
  kvpool_key_id id = Id("it", "huge");
  const void* p = v.data();
  uint64_t size = v.size();
  kvpool_status st;
  EXPECT_EQ(kvpool_put(c, &id, &p, &size, 1, &st), KVPOOL_INVALID_ARGUMENT);
  // Hold 12 MiB of reservations: an 8 MiB value does not fit in what is free.
  std::vector<kvpool_key_id> held;
  for (int i = 0; i < 12; ++i) held.push_back(Id("it", "held" + std::to_string(i)));
  std::vector<uint64_t> sizes(12, 1 << 20);
  std::vector<kvpool_region> regions(12);
  std::vector<kvpool_status> sts(12);
  ASSERT_EQ(kvpool_reserve(c, held.data(), sizes.data(), 12, regions.data(), sts.data()), KVPOOL_OK);
  size = 8 << 20;
  EXPECT_EQ(kvpool_put(c, &id, &p, &size, 1, &st), KVPOOL_RESOURCE_EXHAUSTED);
  EXPECT_EQ(st, KVPOOL_RESOURCE_EXHAUSTED);
  EXPECT_EQ(node->Metric("kvpool_put_failures_total"), 2);  // the invalid one and this
  // Once the reservations are gone it fits.
  std::vector<uint64_t> handles;
  for (auto& r : regions) handles.push_back(r.handle);
  ASSERT_EQ(kvpool_abort(c, handles.data(), handles.size()), KVPOOL_OK);
  EXPECT_EQ(kvpool_put(c, &id, &p, &size, 1, &st), KVPOOL_OK) << kvpool_last_error();
  kvpool_close(c);
}

// Memory moves to the value size being written, from values written
// before and never read, as one global LRU would: a 64 MiB node put over
// 32 times with 64 KiB values (batches of 16 from 100,000 keys drawn at
// random, as a benchmark's put run), then 8,000 values of 4 KiB (about 32
// MiB): every one of them reads back, byte-exact. Judged by slabs' last
// touch (as before entry stamps), the node kept 6,960 (28 slab moves of
// the 32 needed) and evicted the rest of its own fresh values.
TEST(NodeIntegration, ANewValueSizeTakesMemoryFromOlderValuesNeverRead) {
  auto node = NodeProcess::Start({"--dram-capacity", "64MiB", "--slab-size", "1MiB"});
  ASSERT_NE(node, nullptr);
  kvpool_client* c = Open(node->socket(), 1);
  ASSERT_NE(c, nullptr);
  auto value = [](uint64_t k, uint64_t size) {
    std::vector<uint8_t> v(size);
    for (uint64_t i = 0; i < size; i += 8) {
      const uint64_t w = (k + 1) * 0x9e3779b97f4a7c15ull ^ i;
      std::memcpy(v.data() + i, &w, std::min<uint64_t>(8, size - i));
    }
    return v;
  };
  // n puts of size in batches of 16; key i of them is key_of(i).
  auto put = [&](uint64_t n, uint64_t size, auto key_of) {
    for (uint64_t first = 0; first < n; first += 16) {
      const uint64_t m = std::min<uint64_t>(16, n - first);
      std::vector<kvpool_key_id> ids;
      std::vector<std::vector<uint8_t>> values;
      std::vector<const void*> ptrs;
      std::vector<uint64_t> sizes(m, size);
      std::vector<kvpool_status> sts(m);
      for (uint64_t i = 0; i < m; ++i) {
        const uint64_t k = key_of(first + i);
        ids.push_back(Id("mix", std::to_string(size) + "/" + std::to_string(k)));
        values.push_back(value(k, size));
        ptrs.push_back(values.back().data());
      }
      const kvpool_status st = kvpool_put(c, ids.data(), ptrs.data(), sizes.data(), m, sts.data());
      ASSERT_TRUE(st == KVPOOL_OK || st == KVPOOL_ALREADY_EXISTS) << kvpool_status_name(st);
    }
  };
  std::mt19937_64 rng(7);
  put(32 * 1024, 64 << 10, [&](uint64_t) { return rng() % 100000; });
  constexpr uint64_t kNew = 8000;
  put(kNew, 4 << 10, [](uint64_t i) { return i; });
  uint64_t hits = 0;
  std::vector<uint8_t> buf(4 << 10);
  for (uint64_t k = 0; k < kNew; ++k) {
    kvpool_key_id id = Id("mix", std::to_string(4 << 10) + "/" + std::to_string(k));
    void* p = buf.data();
    uint64_t cap = buf.size(), size = 0;
    kvpool_status st;
    if (kvpool_get(c, &id, &p, &cap, 1, &size, &st) != KVPOOL_OK || st != KVPOOL_OK) continue;
    ASSERT_EQ(size, buf.size());
    ASSERT_EQ(buf, value(k, buf.size())) << k;
    ++hits;
  }
  EXPECT_EQ(hits, kNew) << "slab moves " << node->Metric("kvpool_dram_slab_moves_total");
  kvpool_close(c);
}

// A get of many large values (acquire, copy out, release): every item
// keeps its own outcome: hits byte-exact, a miss NOT_FOUND, a too-small
// buffer RESOURCE_EXHAUSTED with the value's size and the buffer untouched,
// and no pin is left behind.
TEST(NodeIntegration, LargeBatchGetKeepsEachItemsOutcome) {
  auto node = NodeProcess::Start({"--dram-capacity", "64MiB", "--slab-size", "1MiB"});
  ASSERT_NE(node, nullptr);
  kvpool_client* c = Open(node->socket(), 1);
  constexpr size_t kN = 24;
  constexpr uint64_t kSize = 900 << 10;
  std::vector<kvpool_key_id> ids;
  std::vector<std::vector<uint8_t>> vals;
  for (size_t i = 0; i < kN; ++i) {
    ids.push_back(Id("chunks", "k" + std::to_string(i)));
    std::vector<uint8_t> v(kSize - i * 1000);
    for (size_t j = 0; j < v.size(); ++j) v[j] = static_cast<uint8_t>(i * 31 + j * 7 + (j >> 11));
    vals.push_back(std::move(v));
  }
  // Key 5 and key 17 are never stored.
  for (size_t i = 0; i < kN; ++i) {
    if (i == 5 || i == 17) continue;
    const void* p = vals[i].data();
    uint64_t size = vals[i].size();
    kvpool_status st;
    ASSERT_EQ(kvpool_put(c, &ids[i], &p, &size, 1, &st), KVPOOL_OK) << kvpool_last_error();
  }
  std::vector<std::vector<uint8_t>> bufs(kN, std::vector<uint8_t>(1 << 20, 0xee));
  std::vector<void*> ptrs;
  std::vector<uint64_t> caps(kN, 1 << 20), sizes(kN, 0);
  for (auto& b : bufs) ptrs.push_back(b.data());
  caps[20] = 1000;  // too small for its value
  std::vector<kvpool_status> st(kN);
  ASSERT_EQ(kvpool_get(c, ids.data(), ptrs.data(), caps.data(), kN, sizes.data(), st.data()),
            KVPOOL_OK)
      << kvpool_last_error();
  for (size_t i = 0; i < kN; ++i) {
    if (i == 5 || i == 17) {
      EXPECT_EQ(st[i], KVPOOL_NOT_FOUND) << i;
      continue;
    }
    EXPECT_EQ(sizes[i], vals[i].size()) << i;
    if (i == 20) {
      EXPECT_EQ(st[i], KVPOOL_RESOURCE_EXHAUSTED);
      EXPECT_EQ(bufs[i][0], 0xee);  // untouched
      continue;
    }
    ASSERT_EQ(st[i], KVPOOL_OK) << i;
    EXPECT_TRUE(std::equal(vals[i].begin(), vals[i].end(), bufs[i].begin())) << i;
  }
  // Every pin was released: the connection still serves, and the node
  // holds no pin.
  EXPECT_EQ(kvpool_get(c, ids.data(), ptrs.data(), caps.data(), kN, sizes.data(), st.data()),
            KVPOOL_OK);
  // (Stats goes over the same connection, behind the releases.)
  EXPECT_EQ(Stats(c)["dram"]["pinned"], 0);
  kvpool_close(c);
}

TEST(NodeIntegration, ZeroCopyPinsSurviveEvictionChurn) {
  auto node = NodeProcess::Start({"--dram-capacity", "32MiB", "--slab-size", "1MiB"});
  ASSERT_NE(node, nullptr);
  kvpool_client* c = Open(node->socket(), 2);
  const size_t kPinned = 8;
  const uint64_t kSize = 256 * 1024;
  std::vector<kvpool_key_id> ids;
  std::vector<uint64_t> sizes(kPinned, kSize);
  for (size_t i = 0; i < kPinned; ++i) ids.push_back(Id("pin", std::to_string(i)));
  std::vector<kvpool_region> regions(kPinned);
  std::vector<kvpool_status> st(kPinned);
  ASSERT_EQ(kvpool_reserve(c, ids.data(), sizes.data(), kPinned, regions.data(), st.data()), KVPOOL_OK);
  std::vector<uint64_t> handles;
  for (size_t i = 0; i < kPinned; ++i) {
    auto pat = Pattern(100 + i, kSize);
    memcpy(regions[i].data, pat.data(), kSize);
    handles.push_back(regions[i].handle);
  }
  ASSERT_EQ(kvpool_commit(c, handles.data(), kPinned, st.data()), KVPOOL_OK);
  ASSERT_EQ(kvpool_acquire(c, ids.data(), kPinned, regions.data(), st.data()), KVPOOL_OK);
  for (auto s : st) ASSERT_EQ(s, KVPOOL_OK);
  EXPECT_EQ(Stats(c)["dram"]["pinned"], kPinned);

  // Write four times the capacity through another client: everything
  // unpinned gets evicted, the pinned entries must stay intact.
  kvpool_client* w = Open(node->socket(), 1);
  auto filler = Pattern(7, kSize);
  for (int i = 0; i < 512; ++i) {
    kvpool_key_id id = Id("churn", std::to_string(i));
    const void* p = filler.data();
    uint64_t size = kSize;
    kvpool_status s;
    ASSERT_EQ(kvpool_put(w, &id, &p, &size, 1, &s), KVPOOL_OK) << i << " " << kvpool_last_error();
  }
  auto stats = Stats(w);
  EXPECT_GT(stats["dram"]["evictions"].get<uint64_t>(), 300u);
  for (size_t i = 0; i < kPinned; ++i) {
    auto pat = Pattern(100 + i, kSize);
    ASSERT_EQ(0, memcmp(regions[i].data, pat.data(), kSize)) << "pinned entry " << i << " changed";
  }
  for (auto& r : regions) handles[&r - regions.data()] = r.handle;
  ASSERT_EQ(kvpool_release(c, handles.data(), kPinned), KVPOOL_OK);
  kvpool_close(w);
  kvpool_close(c);
}

TEST(NodeIntegration, ConcurrentClientsByteExact) {
  auto node = NodeProcess::Start({"--dram-capacity", "256MiB"});
  ASSERT_NE(node, nullptr);
  kvpool_client* shared = Open(node->socket(), 4);
  std::atomic<uint64_t> wrong{0}, hits{0}, ops{0};
  auto worker = [&](int t, bool own) {
    kvpool_client* c = own ? Open(node->socket(), 1) : shared;
    for (int round = 0; round < 200; ++round) {
      int k = (t * 7919 + round * 31) % 300;  // keys overlap across threads
      kvpool_key_id id = Id("conc", std::to_string(k));
      size_t size = 1024 + (k * 977) % 60000;
      auto v = Pattern(k, size);
      const void* p = v.data();
      uint64_t sz = size;
      kvpool_status st;
      if (kvpool_put(c, &id, &p, &sz, 1, &st) != KVPOOL_OK) ++wrong;
      std::vector<uint8_t> out(65536);
      void* b = out.data();
      uint64_t cap = out.size(), got = 0;
      if (kvpool_get(c, &id, &b, &cap, 1, &got, &st) != KVPOOL_OK) ++wrong;
      if (st == KVPOOL_OK) {
        ++hits;
        if (got != size || memcmp(out.data(), v.data(), size) != 0) ++wrong;
      }
      ++ops;
    }
    if (own) kvpool_close(c);
  };
  std::vector<std::thread> ts;
  for (int t = 0; t < 6; ++t) ts.emplace_back(worker, t, t % 2 == 0);
  for (auto& t : ts) t.join();
  EXPECT_EQ(wrong.load(), 0u);
  EXPECT_EQ(ops.load(), 1200u);
  EXPECT_EQ(hits.load(), 1200u);  // 300 keys of < 64 KiB fit: no eviction
  kvpool_close(shared);
}

// Commits copied by the copy threads (--copy-threads 2, whatever the host's
// CPUs): four clients put batches of large values and read them back
// byte-exact while a forked client is killed in the middle of its puts;
// the node keeps serving, and the copies ran off the loop.
TEST(NodeIntegration, CopyThreadsCommitByteExactAndSurviveAClientKilledMidPut) {
  auto node = NodeProcess::Start({"--dram-capacity", "512MiB", "--copy-threads", "2"});
  ASSERT_NE(node, nullptr);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // puts until killed
    kvpool_client* c = Open(node->socket(), 1);
    if (c == nullptr) _exit(2);
    std::vector<uint8_t> v(1 << 20, 0x5a);
    for (uint64_t i = 0;; ++i) {
      kvpool_key_id ids[8];
      const void* ptrs[8];
      uint64_t sizes[8];
      kvpool_status st[8];
      for (int k = 0; k < 8; ++k) {
        ids[k] = Id("killed", std::to_string(i * 8 + k));
        ptrs[k] = v.data();
        sizes[k] = v.size();
      }
      kvpool_put(c, ids, ptrs, sizes, 8, st);
    }
  }
  std::atomic<uint64_t> wrong{0}, hits{0};
  auto worker = [&](int t) {
    kvpool_client* c = Open(node->socket(), 1);
    for (int round = 0; round < 12; ++round) {
      std::vector<kvpool_key_id> ids;
      std::vector<std::vector<uint8_t>> vals;
      for (int k = 0; k < 8; ++k) {
        const int n = t * 1000 + round * 8 + k;
        ids.push_back(Id("copies", std::to_string(n)));
        vals.push_back(Pattern(n, 200000 + (n * 7919) % 800000));
      }
      std::vector<const void*> ptrs;
      std::vector<uint64_t> sizes;
      for (auto& v : vals) {
        ptrs.push_back(v.data());
        sizes.push_back(v.size());
      }
      std::vector<kvpool_status> st(8);
      if (kvpool_put(c, ids.data(), ptrs.data(), sizes.data(), 8, st.data()) != KVPOOL_OK) ++wrong;
      for (int k = 0; k < 8; ++k) {
        std::vector<uint8_t> out(1 << 20);
        void* b = out.data();
        uint64_t cap = out.size(), got = 0;
        kvpool_status gs;
        if (kvpool_get(c, &ids[k], &b, &cap, 1, &got, &gs) != KVPOOL_OK || gs != KVPOOL_OK) {
          ++wrong;
          continue;
        }
        ++hits;
        if (got != vals[k].size() || memcmp(out.data(), vals[k].data(), got) != 0) ++wrong;
      }
      if (t == 0 && round == 2) {
        kill(child, SIGKILL);
        waitpid(child, nullptr, 0);
      }
    }
    kvpool_close(c);
  };
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t) ts.emplace_back(worker, t);
  for (auto& t : ts) t.join();
  EXPECT_EQ(wrong.load(), 0u);
  EXPECT_EQ(hits.load(), 4u * 12 * 8);
  EXPECT_GT(node->Metric("kvpool_commit_copy_bytes_total"), 4.0 * 12 * 8 * 200000);
  int status = 0;
  EXPECT_EQ(waitpid(node->pid(), &status, WNOHANG), 0) << "the node exited";
}

TEST(NodeIntegration, CProgramUsesTheAbi) {
  auto node = NodeProcess::Start();
  ASSERT_NE(node, nullptr);
  std::string out;
  EXPECT_EQ(RunCommand({CSmokeBinary(), node->socket()}, &out, true), 0) << out;
  EXPECT_EQ(out.rfind("ok ", 0), 0u) << out;
}

TEST(NodeIntegration, CppClientRoundTrip) {
  auto node = NodeProcess::Start();
  ASSERT_NE(node, nullptr);
  Client::Options o;
  o.socket_path = node->socket();
  kvpool_status st;
  auto c = Client::Open(o, &st);
  ASSERT_NE(c, nullptr);
  auto v = Pattern(5, 4096);
  ASSERT_EQ(c->Put("cpp", "page-0", v), KVPOOL_OK);
  std::vector<uint8_t> out;
  ASSERT_EQ(c->Get("cpp", "page-0", &out), KVPOOL_OK);
  EXPECT_EQ(out, v);
  EXPECT_EQ(c->Get("cpp", "page-1", &out), KVPOOL_NOT_FOUND);
  std::vector<std::string> keys = {"page-0", "page-1"};
  auto ids = Client::KeyIds("cpp", keys);
  std::vector<uint8_t> hits;
  size_t prefix;
  ASSERT_EQ(c->Exists(ids, &hits, &prefix), KVPOOL_OK);
  EXPECT_EQ(hits, (std::vector<uint8_t>{1, 0}));
  EXPECT_EQ(prefix, 1u);
}

TEST(NodeIntegration, KvpoolctlPutGetExistsStat) {
  auto node = NodeProcess::Start();
  ASSERT_NE(node, nullptr);
  const std::string s = node->socket();
  std::string out;
  ASSERT_EQ(RunCommand({CtlBinary(), "--socket", s, "put", "demo", "greeting", "--value", "hello kv"}, &out), 0);
  ASSERT_EQ(RunCommand({CtlBinary(), "--socket", s, "get", "demo", "greeting"}, &out), 0);
  EXPECT_EQ(out, "hello kv");  // into a pipe: the bytes as stored
  // On a terminal (script(1) gives it one) a newline follows the value.
  ASSERT_EQ(RunCommand({"/usr/bin/script", "-qec",
                        CtlBinary() + " --socket " + s + " get demo greeting", "/dev/null"},
                       &out),
            0);
  EXPECT_EQ(out, "hello kv\r\n");
  std::string bin(3000, '\0');
  for (size_t i = 0; i < bin.size(); ++i) bin[i] = static_cast<char>(i * 13);
  ASSERT_EQ(RunCommand({CtlBinary(), "--socket", s, "put", "demo", "bin", "-"}, &out, false, bin), 0);
  ASSERT_EQ(RunCommand({CtlBinary(), "--socket", s, "get", "demo", "bin"}, &out), 0);
  EXPECT_EQ(out, bin);
  EXPECT_EQ(RunCommand({CtlBinary(), "--socket", s, "get", "demo", "nope"}, &out), 1);
  EXPECT_EQ(RunCommand({CtlBinary(), "--socket", s, "exists", "demo", "greeting", "nope"}, &out), 1);
  EXPECT_EQ(out, "greeting 1\nnope 0\nprefix 1\n");
  ASSERT_EQ(RunCommand({CtlBinary(), "--socket", s, "stat", "--json"}, &out), 0);
  auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j["dram"]["entries"], 2);
  EXPECT_EQ(j["node_id"], "test-node");
  // For people: aligned rows of the same figures.
  ASSERT_EQ(RunCommand({CtlBinary(), "--socket", s, "stat"}, &out), 0);
  EXPECT_EQ(
      out.rfind(std::string("node           test-node (version ") + kvpool_version() + ")\n", 0),
      0u)
      << out;
  EXPECT_NE(out.find("\ndram entries   2\n"), std::string::npos) << out;
  EXPECT_NE(out.find("\nhits / misses  "), std::string::npos) << out;
  const std::string admin = "127.0.0.1:" + std::to_string(node->admin_port());
  ASSERT_EQ(RunCommand({CtlBinary(), "metrics", "--admin", admin}, &out), 0);
  EXPECT_NE(out.find("kvpool_ops_total{op=\"reserve\"}"), std::string::npos);
  // top: two frames, the second with rates over its interval.
  ASSERT_EQ(
      RunCommand({CtlBinary(), "top", "--admin", admin, "--count", "2", "--interval", "200ms"},
                 &out),
      0)
      << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 2 * 19) << out;
  EXPECT_NE(out.find("\nops/s          -\n"), std::string::npos) << out;  // first frame
  EXPECT_NE(out.find("\nops/s          0\n"), std::string::npos) << out;  // nothing since
  // Every command has --help, on stdout, exit 0; the usage lists them all.
  for (const char* cmd : {"put", "get", "exists", "remove", "stat", "flush", "clear", "metrics",
                          "members", "shards", "tenants", "clients", "top"}) {
    ASSERT_EQ(RunCommand({CtlBinary(), cmd, "--help"}, &out), 0) << cmd;
    EXPECT_EQ(
        out.rfind(std::string("usage: kvpoolctl [--socket PATH] [--timeout DURATION] ") + cmd, 0),
        0u)
        << out;
  }
  ASSERT_EQ(RunCommand({CtlBinary(), "--help"}, &out), 0);
  EXPECT_NE(out.find("  top [--admin HOST:PORT]"), std::string::npos) << out;
  EXPECT_EQ(RunCommand({CtlBinary(), "bogus"}, &out), 2);
  EXPECT_EQ(RunCommand({CtlBinary(), "get", "demo", "greeting", "--json"}, &out), 2);
}

// kvpoolctl clients: the engines connected to the socket, by the name their
// handshake gave, with their pid, user, tenant and traffic.
TEST(NodeIntegration, KvpoolctlClientsListsConnectedEnginesAndTheirTraffic) {
  auto node = NodeProcess::Start();
  ASSERT_NE(node, nullptr);
  kvpool_options o;
  kvpool_options_init(&o);
  const std::string socket = node->socket();
  o.socket_path = socket.c_str();
  o.max_connections = 1;
  o.client_name = "test-engine tp0";
  kvpool_status st;
  kvpool_client* c = kvpool_open(&o, &st);
  ASSERT_NE(c, nullptr) << kvpool_last_error();
  auto v = Pattern(7, 1000);
  kvpool_key_id id = Id("clients", "k");
  const void* vp = v.data();
  uint64_t size = v.size();
  kvpool_status item;
  ASSERT_EQ(kvpool_put(c, &id, &vp, &size, 1, &item), KVPOOL_OK);
  std::vector<uint8_t> back(1000);
  void* bp = back.data();
  uint64_t cap = back.size(), got = 0;
  ASSERT_EQ(kvpool_get(c, &id, &bp, &cap, 1, &got, &item), KVPOOL_OK);
  ASSERT_EQ(back, v);

  const std::string admin = "127.0.0.1:" + std::to_string(node->admin_port());
  std::string out;
  ASSERT_EQ(RunCommand({CtlBinary(), "clients", "--admin", admin, "--json"}, &out), 0) << out;
  auto j = nlohmann::json::parse(out);
  ASSERT_EQ(j.size(), 1u) << out;
  EXPECT_EQ(j[0]["name"], "test-engine tp0");
  EXPECT_EQ(j[0]["pid"], getpid());
  EXPECT_EQ(j[0]["uid"], getuid());
  EXPECT_EQ(j[0]["tenant"], "default");
  EXPECT_EQ(j[0]["bytes_written"], 1000);
  EXPECT_EQ(j[0]["bytes_read"], 1000);
  // hello, reserve, commit (the put), acquire, release (the get) at least.
  EXPECT_GE(j[0]["ops"].get<int>(), 4);
  EXPECT_GE(j[0]["age_s"].get<double>(), 0.0);
  ASSERT_EQ(RunCommand({CtlBinary(), "clients", "--admin", admin}, &out), 0) << out;
  EXPECT_EQ(out.rfind("PID      USER         NAME", 0), 0u) << out;
  EXPECT_NE(out.find(std::to_string(getpid()) + " "), std::string::npos) << out;
  EXPECT_NE(out.find("test-engine tp0"), std::string::npos) << out;
  EXPECT_NE(out.find("\n1 clients\n"), std::string::npos) << out;
  kvpool_close(c);
  // Gone with its connection.
  testing::WaitFor(
      [&] {
        return RunCommand({CtlBinary(), "clients", "--admin", admin, "--json"}, &out) == 0 &&
               nlohmann::json::parse(out, nullptr, false).empty();
      },
      std::chrono::seconds(2), std::chrono::milliseconds(20));
  EXPECT_EQ(nlohmann::json::parse(out).size(), 0u) << out;
}

TEST(NodeIntegration, MetricsPassPromtoolAndCountTraffic) {
  if (access("/usr/bin/promtool", X_OK) != 0) GTEST_SKIP() << "promtool not installed";
  auto node = NodeProcess::Start();
  ASSERT_NE(node, nullptr);
  kvpool_client* c = Open(node->socket(), 1);
  auto v = Pattern(1, 5000);
  kvpool_key_id ids[3] = {Id("m", "a"), Id("m", "b"), Id("m", "c")};
  const void* p[1] = {v.data()};
  uint64_t sz[1] = {v.size()};
  kvpool_status st[3];
  ASSERT_EQ(kvpool_put(c, ids, p, sz, 1, st), KVPOOL_OK);
  uint8_t hits[3];
  ASSERT_EQ(kvpool_exists(c, ids, 3, hits, nullptr), KVPOOL_OK);  // a is a prefix of 1
  kvpool_key_id b_then_a[2] = {ids[1], ids[0]};
  ASSERT_EQ(kvpool_exists(c, b_then_a, 2, hits, nullptr), KVPOOL_OK);  // a prefix of 0
  std::vector<uint8_t> got(2 * 5000);
  void* bufs[2] = {got.data(), got.data() + 5000};
  uint64_t caps[2] = {5000, 5000}, sizes[2];
  kvpool_get(c, ids, bufs, caps, 2, sizes, st);  // a hits, b misses
  EXPECT_EQ(st[0], KVPOOL_OK);
  EXPECT_EQ(st[1], KVPOOL_NOT_FOUND);
  kvpool_close(c);
  int status = 0;
  std::string metrics = node->HttpGet("/metrics", &status);
  ASSERT_EQ(status, 200);
  EXPECT_EQ(node->Metric("kvpool_exists_hits_total"), 2);
  EXPECT_EQ(node->Metric("kvpool_exists_misses_total"), 3);
  EXPECT_EQ(node->Metric("kvpool_exists_prefix_hits_total"), 1);
  // The recent windows hold all of this traffic.
  for (const char* w : {"1m", "10m"}) {
    const std::string l = std::string("{window=\"") + w + "\"}";
    EXPECT_DOUBLE_EQ(node->Metric("kvpool_exists_prefix_hit_ratio_recent" + l), 1.0 / 5);
    EXPECT_DOUBLE_EQ(node->Metric("kvpool_hit_ratio_recent" + l), 1.0 / 2);
  }
  EXPECT_EQ(node->Metric("kvpool_bytes_written_total"), 5000);
  EXPECT_EQ(node->Metric("kvpool_ops_total{op=\"commit\"}"), 1);
  std::string path = node->dir() + "/metrics.txt";
  std::ofstream(path) << metrics;
  std::string out;
  int rc = RunCommand({"/bin/sh", "-c", "/usr/bin/promtool check metrics < " + path}, &out, true);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(out, "") << out;
  // The other admin endpoints.
  EXPECT_EQ(node->HttpGet("/healthz", &status), "ok");
  EXPECT_EQ(status, 200);
  node->HttpGet("/readyz", &status);
  EXPECT_EQ(status, 200);
  auto j = nlohmann::json::parse(node->HttpGet("/api/v1/config", &status));
  EXPECT_EQ(j["dram-capacity"]["value"], "64MiB");
  auto s = nlohmann::json::parse(node->HttpGet("/api/v1/status", &status));
  EXPECT_EQ(s["dram"]["entries"], 1);
}

TEST(NodeIntegration, SigtermShutsDownGracefully) {
  auto node = NodeProcess::Start();
  ASSERT_NE(node, nullptr);
  kvpool_client* c = Open(node->socket(), 1);
  std::string socket = node->socket();
  int st = node->Stop(SIGTERM);
  EXPECT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 0);
  struct stat sb;
  EXPECT_NE(::stat(socket.c_str(), &sb), 0) << "socket file left behind";
  EXPECT_NE(node->Log().find("stopped"), std::string::npos);
  kvpool_key_id id = Id("x", "y");
  uint8_t hit;
  EXPECT_EQ(kvpool_exists(c, &id, 1, &hit, nullptr), KVPOOL_UNAVAILABLE);
  kvpool_close(c);
}

TEST(NodeIntegration, HelpAndBadFlags) {
  std::string out;
  EXPECT_EQ(RunCommand({NodeBinary(), "--help"}, &out), 0);
  EXPECT_NE(out.find("--dram-capacity"), std::string::npos);
  EXPECT_EQ(RunCommand({NodeBinary(), "--dram-capacity=lots"}, &out, true), 2);
  EXPECT_NE(out.find("--dram-capacity: not a size"), std::string::npos) << out;
  EXPECT_EQ(RunCommand({NodeBinary(), "--admin-address=0.0.0.0", "--socket=/tmp/kvpool-never.sock"}, &out, true), 1);
  EXPECT_NE(out.find("--insecure"), std::string::npos) << out;
}

}  // namespace
}  // namespace kvpool::testing
