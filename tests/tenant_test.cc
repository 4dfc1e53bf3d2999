// Tenants on one real node, tried as an attacker would: clients of two
// tenants run as two other uids (child processes that drop to them), each
// mapped to its tenant by SO_PEERCRED. One tenant's client tries to read
// the other's values by key, by the key ids the node stores them under,
// through its own mapping and through the node's open memfds; pre-puts
// keys the other later writes; floods puts to evict the other. The owner
// tries to change its own committed values through every way the mapping
// and the fds offer. Prints `metric` lines (bench/compare.sh security).
// Needs root (to become the test uids); skipped without it.
#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/key_id.h"
#include "common/tenant_keys.h"
#include "harness/cluster_harness.h"
#include "harness/node_process.h"
#include "kvpool/kvpool.h"
#include "protocol/codec.h"

namespace kvpool::testing {
namespace {

constexpr uid_t kAlphaUid = 64001;
constexpr uid_t kBeeUid = 64002;
constexpr gid_t kSocketGid = 65534;  // nogroup: the socket's group
constexpr int kAlphaValues = 200;
constexpr size_t kValueBytes = 16 << 10;
const char* kNs = "sys";

void Metric(const std::string& name, double value) {
  std::printf("metric %s %g\n", name.c_str(), value);
  std::fflush(stdout);
}

// Runs fn in a forked child; true when the child was killed by SIGSEGV or
// SIGBUS (a write the mapping refused).
bool FaultsInChild(const std::function<void()>& fn) {
  pid_t pid = fork();
  if (pid == 0) {
    signal(SIGSEGV, SIG_DFL);  // no handler's report: the fault is the expected outcome
    signal(SIGBUS, SIG_DFL);
    fn();
    _exit(0);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFSIGNALED(st) && (WTERMSIG(st) == SIGSEGV || WTERMSIG(st) == SIGBUS);
}

// Says hello on a raw connection and returns the segment fd the reply
// passes (-1 on failure): what any client can keep.
int HandshakeSegmentFd(const std::string& socket_path) {
  int s = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, socket_path.c_str(), sizeof(addr.sun_path) - 1);
  if (connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(s);
    return -1;
  }
  std::vector<uint8_t> body;
  protocol::HelloRequest hello;
  hello.client_name = "attacker";
  protocol::EncodeHello(hello, &body);
  auto frame = protocol::EncodeFrame(protocol::MessageType::kHello, 1, 0, body, false);
  if (write(s, frame.data(), frame.size()) != static_cast<ssize_t>(frame.size())) {
    close(s);
    return -1;
  }
  uint8_t buf[256];
  iovec iov{buf, sizeof(buf)};
  alignas(cmsghdr) char ctrl[CMSG_SPACE(2 * sizeof(int))];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = ctrl;
  msg.msg_controllen = sizeof(ctrl);
  int fds[2] = {-1, -1};
  if (recvmsg(s, &msg, MSG_CMSG_CLOEXEC) > 0) {
    for (cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm != nullptr; cm = CMSG_NXTHDR(&msg, cm)) {
      if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
        std::memcpy(fds, CMSG_DATA(cm), std::min<size_t>(cm->cmsg_len - CMSG_LEN(0), sizeof(fds)));
      }
    }
  }
  close(s);
  if (fds[1] >= 0) close(fds[1]);
  return fds[0];
}

kvpool_client* Open(const std::string& socket) {
  kvpool_options o;
  kvpool_options_init(&o);
  o.socket_path = socket.c_str();
  o.max_connections = 2;
  kvpool_status st = KVPOOL_OK;
  return kvpool_open(&o, &st);
}

KeyId Id(const std::string& key) { return MakeKeyId(kNs, key); }
kvpool_key_id C(const KeyId& k) { return {k.hi, k.lo}; }

// A value that names its owner and index in its first bytes, so a scan
// finds it anywhere: "OWNER:INDEX:" then a pattern.
std::vector<uint8_t> Value(const std::string& owner, int i, size_t size = kValueBytes) {
  std::vector<uint8_t> v = Pattern(static_cast<uint64_t>(i) * 7919 + owner.size(), size);
  std::string tag = "kvpool-tenant-test:" + owner + ":" + std::to_string(i) + ":";
  std::memcpy(v.data(), tag.data(), std::min(tag.size(), v.size()));
  return v;
}

int PutMany(kvpool_client* c, const std::string& owner, const std::string& prefix, int n,
            size_t size, std::vector<kvpool_status>* statuses = nullptr) {
  int ok = 0;
  for (int i = 0; i < n; ++i) {
    auto v = Value(owner, i, size);
    kvpool_key_id id = C(Id(prefix + std::to_string(i)));
    const void* vp = v.data();
    uint64_t sz = v.size();
    kvpool_status st = KVPOOL_OK;
    kvpool_put(c, &id, &vp, &sz, 1, &st);
    if (statuses != nullptr) statuses->push_back(st);
    ok += st == KVPOOL_OK;
  }
  return ok;
}

// How many of ids come back from a get (any bytes).
int Hits(kvpool_client* c, const std::vector<kvpool_key_id>& ids) {
  int hits = 0;
  std::vector<uint8_t> buf(kValueBytes);
  for (const auto& id : ids) {
    void* b = buf.data();
    uint64_t cap = buf.size(), size = 0;
    kvpool_status st = KVPOOL_OK;
    kvpool_get(c, &id, &b, &cap, 1, &size, &st);
    hits += st == KVPOOL_OK;
  }
  return hits;
}

// Whether a get of key returns exactly `want`.
bool Reads(kvpool_client* c, const std::string& key, const std::vector<uint8_t>& want) {
  std::vector<uint8_t> buf(want.size() + 1);
  void* b = buf.data();
  uint64_t cap = buf.size(), size = 0;
  kvpool_status st = KVPOOL_OK;
  kvpool_key_id id = C(Id(key));
  kvpool_get(c, &id, &b, &cap, 1, &size, &st);
  return st == KVPOOL_OK && size == want.size() && std::memcmp(buf.data(), want.data(), size) == 0;
}

// Counts the values of `owner` whose tag appears in [p, p + n).
int CountTags(const uint8_t* p, size_t n, const std::string& owner = "alpha") {
  int found = 0;
  const std::string tag = "kvpool-tenant-test:" + owner + ":";
  for (const uint8_t* q = p; q + tag.size() <= p + n;) {
    q = static_cast<const uint8_t*>(
        memmem(q, static_cast<size_t>(p + n - q), tag.data(), tag.size()));
    if (q == nullptr) break;
    ++found;
    q += tag.size();
  }
  return found;
}

// Values of `owner` found by scanning every kvpool memfd mapping of this
// process.
int ScanOwnMappings(const std::string& owner = "alpha", const std::string& memfd = "kvpool") {
  std::ifstream maps("/proc/self/maps");
  int found = 0;
  for (std::string line; std::getline(maps, line);) {
    if (line.find("memfd:" + memfd) == std::string::npos) continue;
    uintptr_t lo = 0, hi = 0;
    char perms[8] = {};
    if (std::sscanf(line.c_str(), "%lx-%lx %7s", &lo, &hi, perms) != 3 || perms[0] != 'r') continue;
    found += CountTags(reinterpret_cast<const uint8_t*>(lo), hi - lo, owner);
  }
  return found;
}

class TenantTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root to run clients as other uids";
    char tmpl[] = "/tmp/kvpool-tenant-XXXXXX";
    dir_ = mkdtemp(tmpl);
    chmod(dir_.c_str(), 0755);
    std::filesystem::create_directories(dir_ + "/ssd");
    tenants_ = dir_ + "/tenants";
    std::ofstream(tenants_) << "# two tenants of the test\n"
                            << "tenant alpha dram=32MiB ssd=64MiB pins=4KiB uids=" << kAlphaUid
                            << "\n"
                            << "tenant bee dram=16MiB ssd=32MiB uids=" << kBeeUid << "\n";
    chmod(tenants_.c_str(), 0644);
    // Each tenant's figures and the clients are shown with the admin token.
    token_ = dir_ + "/admin.token";
    std::ofstream(token_) << "tenant-test-admin-token-0123456789\n";
    chmod(token_.c_str(), 0600);
  }
  void TearDown() override {
    node_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  void StartNode() {
    std::string log;
    node_ = NodeProcess::Start({"--tenants-file", tenants_, "--socket-group", "nogroup", "--ssd",
                                dir_ + "/ssd", "--ssd-capacity", "128MiB", "--ssd-region-size",
                                "4MiB", "--admin-token-file", token_},
                               dir_ + "/sock/kvpool.sock", &log);
    ASSERT_NE(node_, nullptr) << log;
  }
  nlohmann::json Tenant(const std::string& name) {
    auto j = nlohmann::json::parse(node_->HttpGet("/api/v1/status"));
    for (const auto& t : j["tenants"]) {
      if (t["name"] == name) return t;
    }
    return nullptr;
  }

  std::string dir_;
  std::string tenants_;
  std::string token_;
  std::unique_ptr<NodeProcess> node_;
};

TEST_F(TenantTest, NoTenantReadsPoisonsOrEvictsAnotherAndNoClientChangesACommittedValue) {
  StartNode();
  const std::string sock = node_->socket();
  const pid_t node_pid = node_->pid();

  // Alpha stores its values.
  std::string r = AsUser(kAlphaUid, [&] {
    kvpool_client* c = Open(sock);
    if (c == nullptr) return std::string("open failed: ") + kvpool_last_error();
    int ok = PutMany(c, "alpha", "prompt-", kAlphaValues, kValueBytes);
    kvpool_close(c);
    return std::to_string(ok);
  });
  ASSERT_EQ(r, std::to_string(kAlphaValues));
  auto alpha = Tenant("alpha");
  ASSERT_EQ(alpha["dram"]["entries"], kAlphaValues);
  ASSERT_EQ(Tenant("bee")["dram"]["entries"], 0);
  ASSERT_EQ(Tenant("default")["dram"]["entries"], 0);

  // Bee tries to read them: by key, by the ids the node stores alpha's
  // entries under, through its own mappings, through the node's fds.
  r = AsUser(kBeeUid, [&] {
    kvpool_client* c = Open(sock);
    if (c == nullptr) return std::string("open failed: ") + kvpool_last_error();
    std::vector<kvpool_key_id> by_key, by_id;
    TenantKeys alpha_keys("alpha");
    for (int i = 0; i < kAlphaValues; ++i) {
      KeyId k = Id("prompt-" + std::to_string(i));
      by_key.push_back(C(k));
      by_id.push_back(C(alpha_keys.Bind(k)));
    }
    int key_hits = Hits(c, by_key);
    int id_hits = Hits(c, by_id);
    int scanned = ScanOwnMappings();
    int opened = 0, node_scanned = 0;
    std::error_code ec;
    for (const auto& e :
         std::filesystem::directory_iterator("/proc/" + std::to_string(node_pid) + "/fd", ec)) {
      int fd = open(e.path().c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) continue;
      ++opened;
      struct stat st {};
      if (fstat(fd, &st) == 0 && st.st_size > 0) {
        void* p = mmap(nullptr, st.st_size, PROT_READ, MAP_SHARED, fd, 0);
        if (p != MAP_FAILED) {
          node_scanned += CountTags(static_cast<uint8_t*>(p), st.st_size);
          munmap(p, st.st_size);
        }
      }
      close(fd);
    }
    kvpool_close(c);
    std::ostringstream o;
    o << key_hits << " " << id_hits << " " << scanned << " " << opened << " " << node_scanned
      << " " << (ec ? 1 : 0);
    return o.str();
  });
  int key_hits = -1, id_hits = -1, scanned = -1, opened = -1, node_scanned = -1, denied = -1;
  ASSERT_EQ(std::sscanf(r.c_str(), "%d %d %d %d %d %d", &key_hits, &id_hits, &scanned, &opened,
                        &node_scanned, &denied),
            6)
      << r;
  EXPECT_EQ(key_hits, 0);
  EXPECT_EQ(id_hits, 0);
  EXPECT_EQ(scanned, 0);
  EXPECT_EQ(opened, 0);  // the node's fds are not another uid's to open
  EXPECT_EQ(node_scanned, 0);
  EXPECT_EQ(denied, 1);  // listing them is refused already
  Metric("cross_tenant_values_read_by_key", key_hits);
  Metric("cross_tenant_values_read_by_key_id", id_hits);
  Metric("cross_tenant_values_read_by_mapping", scanned + node_scanned);
  Metric("cross_tenant_values_read", key_hits + id_hits + scanned + node_scanned);

  // Poisoning: bee pre-puts keys alpha writes later.
  const int kPoison = 50;
  r = AsUser(kBeeUid, [&] {
    kvpool_client* c = Open(sock);
    if (c == nullptr) return std::string("open failed");
    int ok = PutMany(c, "bee", "system-prompt-", kPoison, 4096);
    kvpool_close(c);
    return std::to_string(ok);
  });
  ASSERT_EQ(r, std::to_string(kPoison));
  r = AsUser(kAlphaUid, [&] {
    kvpool_client* c = Open(sock);
    if (c == nullptr) return std::string("open failed");
    std::vector<kvpool_status> st;
    PutMany(c, "alpha", "system-prompt-", kPoison, 4096, &st);
    int poisoned = 0;
    for (int i = 0; i < kPoison; ++i) {
      if (st[i] != KVPOOL_OK || !Reads(c, "system-prompt-" + std::to_string(i),
                                       Value("alpha", i, 4096))) {
        ++poisoned;
      }
    }
    kvpool_close(c);
    return std::to_string(poisoned);
  });
  EXPECT_EQ(r, "0");
  Metric("cross_tenant_poisoned_keys", std::atoi(r.c_str()));

  // Alpha tries to change its own committed values: through an acquired
  // pointer, mprotect, a writable mapping of the segment fd (as passed and
  // reopened through /proc), write(2), a punched hole, and the staging area
  // after the commit.
  r = AsUser(kAlphaUid, [&] {
    kvpool_client* c = Open(sock);
    if (c == nullptr) return std::string("open failed");
    std::ostringstream o;
    kvpool_key_id id = C(Id("prompt-0"));
    kvpool_region reg{};
    kvpool_status st = KVPOOL_OK;
    kvpool_acquire(c, &id, 1, &reg, &st);
    if (st != KVPOOL_OK) return std::string("acquire failed");
    uint8_t* data = static_cast<uint8_t*>(reg.data);
    int refused = 0, attempts = 0;
    ++attempts;
    refused += FaultsInChild([&] { data[100] ^= 0xff; });
    ++attempts;
    uintptr_t page = reinterpret_cast<uintptr_t>(data) & ~uintptr_t{4095};
    refused += mprotect(reinterpret_cast<void*>(page), 4096, PROT_READ | PROT_WRITE) != 0;
    // A client may keep the segment fd the handshake passes (libkvpool
    // closes it once mapped): take one the way any client can.
    std::vector<int> fds;
    if (int fd = HandshakeSegmentFd(sock); fd >= 0) fds.push_back(fd);
    for (int fd : fds) {
      struct stat sst {};
      fstat(fd, &sst);
      ++attempts;
      void* p = mmap(nullptr, sst.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      refused += p == MAP_FAILED;
      if (p != MAP_FAILED) {
        std::memset(p, 0, sst.st_size);
        munmap(p, sst.st_size);
      }
      ++attempts;
      char zeros[4096] = {};
      refused += pwrite(fd, zeros, sizeof(zeros), 0) < 0;
      ++attempts;
      refused += fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, sst.st_size) != 0;
      ++attempts;
      int rw = open(("/proc/self/fd/" + std::to_string(fd)).c_str(), O_RDWR);
      void* q = rw >= 0 ? mmap(nullptr, sst.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, rw, 0)
                        : MAP_FAILED;
      refused += q == MAP_FAILED;
      if (q != MAP_FAILED) {
        std::memset(q, 0, sst.st_size);
        munmap(q, sst.st_size);
      }
      if (rw >= 0) close(rw);
      close(fd);
    }
    uint64_t handle = reg.handle;
    kvpool_release(c, &handle, 1);
    // Reserve, write, commit, then write the staging range again.
    kvpool_key_id sid = C(Id("staged"));
    uint64_t size = 4096;
    kvpool_region sreg{};
    kvpool_reserve(c, &sid, &size, 1, &sreg, &st);
    std::vector<uint8_t> want = Value("alpha", 9999, 4096);
    if (st == KVPOOL_OK) {
      std::memcpy(sreg.data, want.data(), want.size());
      uint64_t h = sreg.handle;
      kvpool_commit(c, &h, 1, &st);
      std::memset(sreg.data, 0, 4096);  // after the commit: must not change it
    }
    ++attempts;
    int modified = !Reads(c, "staged", want);
    // A removed value leaves nothing in the mapping.
    PutMany(c, "removed", "to-remove-", 4, 8192);
    int before_remove = ScanOwnMappings("removed", "kvpool-dram");
    for (int i = 0; i < 4; ++i) {
      kvpool_key_id rid = C(Id("to-remove-" + std::to_string(i)));
      kvpool_remove(c, &rid, 1, &st);
    }
    int after_remove = ScanOwnMappings("removed", "kvpool-dram");
    for (int i = 0; i < kAlphaValues; ++i) {
      modified += !Reads(c, "prompt-" + std::to_string(i), Value("alpha", i));
    }
    kvpool_close(c);
    o << modified << " " << refused << " " << attempts << " " << fds.size() << " "
      << before_remove << " " << after_remove;
    return o.str();
  });
  int modified = -1, refused = -1, attempts = -1, nfds = -1, before_remove = -1, after_remove = -1;
  ASSERT_EQ(std::sscanf(r.c_str(), "%d %d %d %d %d %d", &modified, &refused, &attempts, &nfds,
                        &before_remove, &after_remove),
            6)
      << r;
  EXPECT_EQ(before_remove, 4);  // the scan does find values
  EXPECT_EQ(after_remove, 0) << "a removed value's bytes are still in the mapping";
  Metric("removed_values_readable_in_mapping", after_remove);
  EXPECT_EQ(nfds, 1);
  EXPECT_EQ(modified, 0);
  EXPECT_EQ(refused, attempts - 1);  // every write path refused (the staging write is allowed)
  Metric("committed_values_modified_by_clients", modified);

  // Bee floods puts (three times its DRAM and SSD quotas); alpha loses
  // nothing and bee never holds more than its quotas.
  auto before = Tenant("alpha");
  const int kFlood = (3 * (48 << 20)) / (64 << 10);
  r = AsUser(kBeeUid, [&] {
    kvpool_client* c = Open(sock);
    if (c == nullptr) return std::string("open failed");
    int ok = PutMany(c, "bee", "flood-", kFlood, 64 << 10);
    kvpool_close(c);
    return std::to_string(ok);
  });
  EXPECT_GT(std::atoi(r.c_str()), 0) << r;
  auto bee = Tenant("bee");
  int64_t over = std::max<int64_t>(0, bee["dram"]["used_bytes"].get<int64_t>() -
                                          bee["dram"]["quota_bytes"].get<int64_t>());
  EXPECT_FALSE(bee["ssd"].is_null());
  if (!bee["ssd"].is_null()) {
    EXPECT_GT(bee["ssd"]["used_bytes"].get<int64_t>(), 0);  // the flood reached its SSD quota too
    over += std::max<int64_t>(0, bee["ssd"]["used_bytes"].get<int64_t>() -
                                     bee["ssd"]["quota_bytes"].get<int64_t>());
  }
  EXPECT_GT(bee["dram"]["evictions"].get<int64_t>(), 0);  // the flood did overflow its quota
  auto after = Tenant("alpha");
  EXPECT_EQ(after["dram"]["evictions"], before["dram"]["evictions"]);
  r = AsUser(kAlphaUid, [&] {
    kvpool_client* c = Open(sock);
    if (c == nullptr) return std::string("open failed");
    int lost = 0;
    for (int i = 0; i < kAlphaValues; ++i) {
      lost += !Reads(c, "prompt-" + std::to_string(i), Value("alpha", i));
    }
    kvpool_close(c);
    return std::to_string(lost);
  });
  EXPECT_EQ(r, "0");
  const int64_t alpha_evicted = after["dram"]["evictions"].get<int64_t>() -
                                before["dram"]["evictions"].get<int64_t>();
  Metric("cross_tenant_evictions", static_cast<double>(std::atoi(r.c_str()) + alpha_evicted));
  EXPECT_EQ(over, 0);
  Metric("quota_overrun_bytes", static_cast<double>(over));
}

}  // namespace
}  // namespace kvpool::testing

namespace kvpool::testing {
namespace {

TEST_F(TenantTest, EachTenantsFiguresShowInKvpoolctlMetricsAndStatusAndOthersAreTheDefault) {
  StartNode();
  const std::string sock = node_->socket();
  std::string r = AsUser(kAlphaUid, [&] {
    kvpool_client* c = Open(sock);
    if (c == nullptr) return std::string("open failed");
    int ok = PutMany(c, "alpha", "k-", 3, 4096);
    std::vector<kvpool_key_id> ids = {C(Id("k-0")), C(Id("k-1")), C(Id("absent"))};
    int hits = Hits(c, ids);
    // The node's statistics show a client its own tenant only.
    std::vector<char> buf(1 << 20);
    size_t len = 0;
    std::string seen = "none";
    if (kvpool_stats_json(c, buf.data(), buf.size(), &len) == KVPOOL_OK) {
      auto j = nlohmann::json::parse(std::string(buf.data(), len), nullptr, false);
      seen.clear();
      if (!j.is_discarded()) {
        for (const auto& t : j["tenants"]) seen += t.value("name", "?") + ",";
      }
    }
    kvpool_close(c);
    return std::to_string(ok) + " " + std::to_string(hits) + " " + seen;
  });
  EXPECT_EQ(r, "3 2 alpha,");
  // The stats' DRAM and SSD figures are its tenant's too, not the node's.
  r = AsUser(kAlphaUid, [&] {
    kvpool_client* c = Open(sock);
    if (c == nullptr) return std::string("open failed");
    std::vector<char> buf(1 << 20);
    size_t len = 0;
    std::string out = "none";
    if (kvpool_stats_json(c, buf.data(), buf.size(), &len) == KVPOOL_OK) {
      auto j = nlohmann::json::parse(std::string(buf.data(), len), nullptr, false);
      out = std::to_string(j["dram"].value("capacity_bytes", uint64_t{0})) + " " +
            std::to_string(j["dram"].value("entries", uint64_t{0})) + " " +
            std::to_string(j["ssd"].value("quota_bytes", uint64_t{0})) + " " +
            (std::string(buf.data(), len).find("bee") == std::string::npos ? "no-bee" : "bee");
    }
    kvpool_close(c);
    return out;
  });
  EXPECT_EQ(r, std::to_string(32 << 20) + " 3 " + std::to_string(64 << 20) + " no-bee");
  // A uid in no tenant is the default tenant.
  r = AsUser(64099, [&] {
    kvpool_client* c = Open(sock);
    if (c == nullptr) return std::string("open failed");
    int ok = PutMany(c, "other", "k-", 2, 4096);
    kvpool_close(c);
    return std::to_string(ok);
  });
  EXPECT_EQ(r, "2");
  auto alpha = Tenant("alpha");
  EXPECT_EQ(alpha["dram"]["entries"], 3);
  EXPECT_EQ(alpha["dram"]["quota_bytes"], 32 << 20);
  EXPECT_EQ(alpha["dram"]["capacity_bytes"], 32 << 20);
  EXPECT_EQ(alpha["ssd"]["quota_bytes"], 64 << 20);
  EXPECT_LE(alpha["ssd"]["capacity_bytes"], 64 << 20);  // less the tier's own records
  EXPECT_EQ(alpha["hits"], 2);
  EXPECT_EQ(alpha["misses"], 1);
  EXPECT_EQ(alpha["bytes_written"], 3 * 4096);
  EXPECT_EQ(Tenant("default")["dram"]["entries"], 2);
  EXPECT_EQ(Tenant("bee")["dram"]["entries"], 0);
  EXPECT_EQ(node_->Metric("kvpool_tenant_dram_entries{tenant=\"alpha\"}"), 3);
  EXPECT_EQ(node_->Metric("kvpool_tenant_hits_total{tenant=\"alpha\"}"), 2);
  EXPECT_EQ(node_->Metric("kvpool_tenant_dram_capacity_bytes{tenant=\"bee\"}"), 16 << 20);
  EXPECT_EQ(node_->Metric("kvpool_tenant_dram_entries{tenant=\"default\"}"), 2);
  // Cache hints name a tenant's keys as its clients do: the node binds
  // them to the tenant (alpha's k-2 is found in alpha's store; the default
  // tenant, which holds k-0 and k-1 only, has no such key).
  int hs = 0;
  auto hint = [&](const std::string& tenant) {
    std::string body = std::string("{\"op\": \"retain\", \"namespace\": \"") + kNs +
                       "\", \"keys\": [\"k-2\", \"k-9\"], \"ttl_s\": 60" +
                       (tenant.empty() ? "" : ", \"tenant\": \"" + tenant + "\"") + "}";
    return nlohmann::json::parse(node_->HttpPost("/api/v1/hints", body, &hs), nullptr, false);
  };
  auto h = hint("alpha");
  EXPECT_EQ(hs, 200);
  EXPECT_EQ(h["applied"], 1) << h.dump();
  EXPECT_EQ(h["unknown"], 1);
  h = hint("");
  EXPECT_EQ(h["applied"], 0) << h.dump();
  EXPECT_EQ(h["unknown"], 2);
  EXPECT_EQ(node_->Metric("kvpool_tenant_dram_retained_bytes{tenant=\"alpha\"}"), 4096);
  EXPECT_EQ(node_->Metric("kvpool_tenant_dram_retained_bytes{tenant=\"default\"}"), 0);
  // A tenant's pin budget is its own (alpha: pins=4KiB, one entry of 4 KiB;
  // the default tenant: --pin-max-bytes, 0 here).
  auto pin = [&](const std::string& tenant, const std::string& keys) {
    std::string body = std::string("{\"op\": \"pin\", \"namespace\": \"") + kNs +
                       "\", \"keys\": [" + keys + "], \"ttl_s\": 60" +
                       (tenant.empty() ? "" : ", \"tenant\": \"" + tenant + "\"") + "}";
    return nlohmann::json::parse(node_->HttpPost("/api/v1/hints", body, &hs), nullptr, false);
  };
  h = pin("alpha", "\"k-2\"");
  EXPECT_EQ(hs, 200) << h.dump();
  EXPECT_EQ(h["applied"], 1);
  h = pin("alpha", "\"k-0\"");  // alpha's k-0 is another 4 KiB: past the budget
  EXPECT_EQ(hs, 429) << h.dump();
  h = pin("", "\"k-0\"");
  EXPECT_EQ(hs, 429) << h.dump();
  EXPECT_EQ(node_->Metric("kvpool_tenant_dram_hint_pinned_bytes{tenant=\"alpha\"}"), 4096);
  EXPECT_EQ(node_->Metric("kvpool_tenant_dram_hint_pinned_bytes{tenant=\"default\"}"), 0);
  EXPECT_EQ(
      node_->Metric("kvpool_tenant_hints_refused_total{tenant=\"alpha\",reason=\"pin_budget\"}"),
      1);
  EXPECT_EQ(
      node_->Metric("kvpool_tenant_hints_refused_total{tenant=\"default\",reason=\"pin_budget\"}"),
      1);
  EXPECT_EQ(node_->Metric("kvpool_tenant_hints_total{tenant=\"alpha\",op=\"pin\"}"), 1);
  // A client's hints (kvpool_hint) reach its own tenant's keys: alpha's
  // client demotes alpha's k-1 to alpha's SSD space.
  r = AsUser(kAlphaUid, [&] {
    kvpool_client* c = Open(sock);
    if (c == nullptr) return std::string("open failed");
    std::vector<kvpool_key_id> ids = {C(Id("k-1")), C(Id("absent"))};
    kvpool_hint_result hr{};
    const kvpool_status st = kvpool_hint(c, KVPOOL_HINT_DEMOTE, ids.data(), ids.size(), 0, 0, &hr);
    kvpool_close(c);
    return std::to_string(st) + " " + std::to_string(hr.applied) + " " +
           std::to_string(hr.unknown) + " " + std::to_string(hr.moved);
  });
  EXPECT_EQ(r, "0 1 1 1");
  EXPECT_EQ(node_->Metric("kvpool_tenant_dram_entries{tenant=\"alpha\"}"), 2);
  EXPECT_EQ(node_->Metric("kvpool_tenant_ssd_entries{tenant=\"alpha\"}"), 1);
  EXPECT_EQ(node_->Metric("kvpool_tenant_dram_entries{tenant=\"default\"}"), 2);
  // Each tenant's store adapts on its own (3 puts move nothing: 70 %).
  EXPECT_EQ(alpha["dram"]["eviction"]["protected_share"], 0.7);
  EXPECT_EQ(node_->Metric("kvpool_tenant_dram_eviction_protected_share{tenant=\"alpha\"}"), 0.7);
  EXPECT_EQ(alpha["dram"]["eviction"]["insert"], "warm");
  EXPECT_EQ(node_->Metric("kvpool_tenant_dram_eviction_bimodal{tenant=\"alpha\"}"), 0);
  EXPECT_EQ(node_->Metric("kvpool_tenant_dram_eviction_share_changes{tenant=\"bee\"}"), 0);

  std::string out;
  ASSERT_EQ(RunCommand({CtlBinary(), "tenants", "--admin",
                        "127.0.0.1:" + std::to_string(node_->admin_port()), "--token-file",
                        token_},
                       &out),
            0);
  std::istringstream lines(out);
  std::string header, def, a, b;
  std::getline(lines, header);
  std::getline(lines, def);
  std::getline(lines, a);
  std::getline(lines, b);
  EXPECT_EQ(header.rfind("TENANT", 0), 0u) << out;
  auto words = [](const std::string& l) {
    std::istringstream in(l);
    std::vector<std::string> w;
    for (std::string x; in >> x;) w.push_back(x);
    return w;
  };
  auto wa = words(a);
  ASSERT_EQ(wa.size(), 11u) << out;
  EXPECT_EQ(wa[0], "alpha");
  EXPECT_EQ(wa[3], "32MiB");  // DRAM quota
  EXPECT_EQ(wa[4], "2");      // entries in DRAM (k-1 demoted above)
  EXPECT_EQ(wa[7], "64MiB");  // SSD quota
  EXPECT_EQ(wa[8], "2");      // hits
  EXPECT_EQ(wa[9], "1");      // misses
  EXPECT_EQ(words(def)[0], "default");
  EXPECT_EQ(words(b)[0], "bee");
}

TEST_F(TenantTest, ATenantsFileOthersMayWriteOrABadLineStopsTheStartSayingWhy) {
  chmod(tenants_.c_str(), 0666);
  std::string log;
  auto n = NodeProcess::Start({"--tenants-file", tenants_}, "", &log);
  EXPECT_EQ(n, nullptr);
  EXPECT_NE(log.find("group and others may not write it; chmod go-w"), std::string::npos) << log;
  std::ofstream(tenants_) << "tenant alpha dram=32MiB uids=1\ntenant beta dram=1GiB\n";
  chmod(tenants_.c_str(), 0644);
  n = NodeProcess::Start({"--tenants-file", tenants_}, "", &log);
  EXPECT_EQ(n, nullptr);
  EXPECT_NE(log.find("line 2: tenant 'beta' lists no uids, gids or tokens"), std::string::npos)
      << log;
  std::ofstream(tenants_) << "tenant alpha dram=32MiB ssd=1GiB uids=1\n";
  n = NodeProcess::Start({"--tenants-file", tenants_}, "", &log);
  EXPECT_EQ(n, nullptr);
  EXPECT_NE(log.find("has an SSD quota but the node has no SSD tier"), std::string::npos) << log;
}

}  // namespace
}  // namespace kvpool::testing

namespace kvpool::testing {
namespace {

// A file of lines, owned by uid, with this mode.
std::string WriteFile(const std::string& path, const std::string& text, uid_t uid, mode_t mode) {
  std::ofstream(path) << text;
  chown(path.c_str(), uid, kSocketGid);
  chmod(path.c_str(), mode);
  return path;
}

// Opens n raw connections to the socket as the calling user and keeps
// them; returns how many the node kept open after its refusals (a refused
// one is told RESOURCE_EXHAUSTED and closed), and the first refusal's text.
std::pair<int, std::string> HoldConnections(const std::string& sock, int n, std::vector<int>* fds) {
  for (int i = 0; i < n; ++i) {
    int s = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, sock.c_str(), sizeof(addr.sun_path) - 1);
    if (s < 0 || connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      if (s >= 0) close(s);
      continue;
    }
    fds->push_back(s);
  }
  // The node takes connections in the order they came, on its one loop: once
  // the last (over the cap: n is) has its refusal, every one before it has
  // its answer.
  if (!fds->empty()) {
    pollfd last{fds->back(), POLLIN, 0};
    poll(&last, 1, 10000);
  }
  int open = 0;
  std::string refusal;
  for (int s : *fds) {
    char buf[512];
    ssize_t r = recv(s, buf, sizeof(buf), MSG_DONTWAIT);
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      ++open;  // nothing said, still open: kept
    } else if (r > static_cast<ssize_t>(protocol::kHeaderBytes) && refusal.empty()) {
      refusal.assign(buf + protocol::kHeaderBytes + 4, static_cast<size_t>(r) - protocol::kHeaderBytes - 4);
    }
  }
  return {open, refusal};
}

// One uid opening 1,000 connections takes at most its cap; another uid of
// the default tenant and another tenant's client are still served, and
// their gets' p99 is reported. A tenant's own cap holds the same way.
TEST_F(TenantTest, OneUidsThousandConnectionsLeaveOtherUidsAndTenantsServed) {
  std::string log;
  node_ = NodeProcess::Start({"--tenants-file", tenants_, "--socket-group", "nogroup", "--ssd",
                              dir_ + "/ssd", "--ssd-capacity", "128MiB", "--ssd-region-size",
                              "4MiB", "--admin-token-file", token_, "--max-connections", "512"},
                             dir_ + "/sock/kvpool.sock", &log);
  ASSERT_NE(node_, nullptr) << log;
  const std::string sock = node_->socket();
  constexpr uid_t kFlooder = 64090, kNeighbour = 64091;
  // The flooder holds its connections in a child until told to let go.
  int ready[2], release[2];
  ASSERT_EQ(pipe(ready), 0);
  ASSERT_EQ(pipe(release), 0);
  pid_t flooder = fork();
  if (flooder == 0) {
    close(ready[0]);
    close(release[1]);
    rlimit nofile{4096, 4096};
    setrlimit(RLIMIT_NOFILE, &nofile);
    std::string out = "cannot drop";
    std::vector<int> fds;
    if (setgroups(0, nullptr) == 0 && setresgid(kSocketGid, kSocketGid, kSocketGid) == 0 &&
        setresuid(kFlooder, kFlooder, kFlooder) == 0) {
      auto [open, refusal] = HoldConnections(sock, 1000, &fds);
      out = std::to_string(open) + "|" + refusal;
    }
    ssize_t w = write(ready[1], out.data(), out.size());
    char c;
    ssize_t got = read(release[0], &c, 1);
    _exit(w > 0 && got >= 0 ? 0 : 1);
  }
  close(ready[1]);
  close(release[0]);
  char buf[1024];
  ssize_t r = read(ready[0], buf, sizeof(buf));
  ASSERT_GT(r, 0);
  const std::string held(buf, static_cast<size_t>(r));
  EXPECT_EQ(held.substr(0, held.find('|')), "256") << held;  // 512 / 2
  EXPECT_NE(held.find("too many connections for uid 64090 (limit 256)"), std::string::npos) << held;
  EXPECT_EQ(node_->Metric("kvpool_local_connections_refused_total{cap=\"uid\"}"), 1000 - 256);
  // The others are served, with their latencies.
  auto served = [&](uid_t uid, const std::string& owner) {
    return AsUser(uid, [&] {
      kvpool_client* c = Open(sock);
      if (c == nullptr) return std::string("open failed: ") + kvpool_last_error();
      if (PutMany(c, owner, "cap-", 1, 4096) != 1) return std::string("put failed");
      std::vector<double> us;
      const auto want = Value(owner, 0, 4096);
      int ok = 0;
      for (int i = 0; i < 2000; ++i) {
        auto t0 = std::chrono::steady_clock::now();
        ok += Reads(c, "cap-0", want);
        us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                         .count());
      }
      kvpool_close(c);
      std::sort(us.begin(), us.end());
      return std::to_string(ok) + " " + std::to_string(us[us.size() * 99 / 100]);
    });
  };
  const std::string neighbour = served(kNeighbour, "neighbour");
  const std::string alpha = served(kAlphaUid, "alpha");
  EXPECT_EQ(neighbour.substr(0, neighbour.find(' ')), "2000") << neighbour;
  EXPECT_EQ(alpha.substr(0, alpha.find(' ')), "2000") << alpha;
  Metric("cap_neighbour_get_p99_us", std::stod(neighbour.substr(neighbour.find(' ') + 1)));
  Metric("cap_other_tenant_get_p99_us", std::stod(alpha.substr(alpha.find(' ') + 1)));
  ssize_t w = write(release[1], "x", 1);
  (void)w;
  waitpid(flooder, nullptr, 0);
  close(ready[0]);
  close(release[1]);

  // A tenant's cap: alpha's uid may hold 300, the tenant 200.
  node_.reset();
  node_ = NodeProcess::Start({"--tenants-file", tenants_, "--socket-group", "nogroup", "--ssd",
                              dir_ + "/ssd", "--ssd-capacity", "128MiB", "--ssd-region-size",
                              "4MiB", "--admin-token-file", token_, "--max-connections", "512",
                              "--max-connections-per-uid", "300",
                              "--max-connections-per-tenant", "200"},
                             dir_ + "/sock/kvpool.sock", &log);
  ASSERT_NE(node_, nullptr) << log;
  std::string t = AsUser(kAlphaUid, [&] {
    rlimit nofile{4096, 4096};
    setrlimit(RLIMIT_NOFILE, &nofile);
    std::vector<int> fds;
    auto [open, refusal] = HoldConnections(node_->socket(), 250, &fds);
    for (int fd : fds) close(fd);
    return std::to_string(open) + "|" + refusal;
  });
  EXPECT_EQ(t.substr(0, t.find('|')), "200") << t;
  EXPECT_NE(t.find("too many connections for tenant alpha (limit 200)"), std::string::npos) << t;
  EXPECT_EQ(node_->Metric("kvpool_local_connections_refused_total{cap=\"tenant\"}"), 50);
}

// Without the admin token the admin endpoint of a node with tenants shows
// the node's figures summed, and nothing of any tenant or client; with the
// token it shows each tenant and every client.
TEST_F(TenantTest, UntokenedAdminViewsShowAggregatesOnlyAndTheTokenShowsEverything) {
  std::string log;
  const std::string dram_only = WriteFile(
      dir_ + "/tenants-dram", "tenant alpha dram=32MiB uids=" + std::to_string(kAlphaUid) +
                                  "\ntenant bee dram=16MiB uids=" + std::to_string(kBeeUid) + "\n",
      0, 0644);
  auto open_node = NodeProcess::Start({"--tenants-file", dram_only, "--socket-group", "nogroup"},
                                      dir_ + "/open/kvpool.sock", &log);
  ASSERT_NE(open_node, nullptr) << log;
  StartNode();  // the same tenants, with the admin token
  for (NodeProcess* n : {open_node.get(), node_.get()}) {
    const std::string sock = n->socket();
    EXPECT_EQ(AsUser(kAlphaUid, [&] {
                kvpool_client* c = Open(sock);
                if (c == nullptr) return std::string("open failed");
                int ok = PutMany(c, "alpha", "v-", 4, 4096);
                kvpool_close(c);
                return std::to_string(ok);
              }),
              "4");
  }
  // Untokened (no token configured): aggregates only.
  int code = 0;
  const std::string status = open_node->HttpGet("/api/v1/status", &code);
  EXPECT_EQ(code, 200);
  auto j = nlohmann::json::parse(status);
  EXPECT_EQ(j["tenants"].size(), 0u) << status;
  EXPECT_TRUE(j.contains("tenants_hidden")) << status;
  EXPECT_EQ(j["dram"]["capacity_bytes"], (64 + 32 + 16) << 20) << status;  // summed over the stores
  EXPECT_EQ(j["dram"]["entries"], 4);
  for (const char* name : {"\"alpha\"", "\"bee\""}) {
    EXPECT_EQ(status.find(name), std::string::npos) << status;
  }
  const std::string clients = open_node->HttpGet("/api/v1/clients", &code);
  EXPECT_EQ(code, 200);
  auto cj = nlohmann::json::parse(clients);
  EXPECT_EQ(cj["clients"].size(), 0u) << clients;
  EXPECT_TRUE(cj.contains("hidden")) << clients;
  const std::string metrics = open_node->HttpGet("/metrics", &code);
  EXPECT_EQ(code, 200);
  EXPECT_EQ(metrics.find("tenant=\""), std::string::npos);
  EXPECT_EQ(metrics.find("kvpool_tenant_"), std::string::npos);
  // Nor the default tenant's store alone (the sum less it is the others').
  EXPECT_EQ(metrics.find("kvpool_dram_"), std::string::npos);
  EXPECT_EQ(metrics.find("kvpool_ssd_"), std::string::npos);
  const std::string history = open_node->HttpGet("/api/v1/history", &code);
  EXPECT_EQ(code, 200);
  EXPECT_EQ(history.find("dram_used_bytes"), std::string::npos) << history.substr(0, 300);
  EXPECT_NE(history.find("ops_per_s"), std::string::npos);
  auto cluster = nlohmann::json::parse(open_node->HttpGet("/api/v1/cluster"));
  EXPECT_EQ(cluster["members"][0]["dram"]["capacity_bytes"], (64 + 32 + 16) << 20);
  EXPECT_NE(metrics.find("kvpool_ops_total"), std::string::npos);  // the node's own figures stay
  std::string out;
  EXPECT_EQ(RunCommand({CtlBinary(), "tenants", "--admin",
                        "127.0.0.1:" + std::to_string(open_node->admin_port())},
                       &out, /*merge_stderr=*/true),
            3)
      << out;
  EXPECT_NE(out.find("only with the admin token"), std::string::npos) << out;
  // The tokened node: without the token nothing but health; with it everything.
  node_->HttpGetWithoutToken("/api/v1/status", &code);
  EXPECT_EQ(code, 401);
  auto full = nlohmann::json::parse(node_->HttpGet("/api/v1/status"));
  EXPECT_EQ(full["tenants"].size(), 3u);
  EXPECT_EQ(Tenant("alpha")["dram"]["entries"], 4);
  EXPECT_EQ(node_->Metric("kvpool_tenant_dram_entries{tenant=\"alpha\"}"), 4);
  auto all_clients = nlohmann::json::parse(node_->HttpGet("/api/v1/clients"));
  EXPECT_FALSE(all_clients.contains("hidden"));
}

// A tenant defined on two nodes is one tenant across them: its client's
// value put on A reads byte-exact for the same tenant on B (through B's
// remote reads, tenant-scoped), and no other tenant and not the default one
// reads it on either node. A node that does not define a tenant refuses
// the tenant's peer requests (counted), and the tenant keeps its local
// service on the node that does.
TEST_F(TenantTest, ATenantIsOneTenantAcrossNodesAndNoOtherTenantReadsItThere) {
  StaticCluster c;
  ASSERT_TRUE(c.PickPorts({"a", "b"}));
  // a defines alpha only; b alpha and bee.
  const std::string tenants_a = WriteFile(
      dir_ + "/tenants-a", "tenant alpha dram=32MiB uids=" + std::to_string(kAlphaUid) + "\n", 0,
      0644);
  auto start = [&](const std::string& id, int port, const std::string& tenants) {
    std::string log;
    auto n = NodeProcess::Start({"--tenants-file", tenants, "--socket-group", "nogroup",
                                 "--node-id", id, "--peers", c.members, "--peer-port",
                                 std::to_string(port)},
                                dir_ + "/" + id + "/kvpool.sock", &log);
    EXPECT_NE(n, nullptr) << log;
    return n;
  };
  const std::string tenants_b =
      WriteFile(dir_ + "/tenants-b",
                "tenant alpha dram=32MiB uids=" + std::to_string(kAlphaUid) + "\n" +
                    "tenant bee dram=16MiB uids=" + std::to_string(kBeeUid) + "\n",
                0, 0644);
  auto a = start("a", c.ports[0], tenants_a);
  auto b = start("b", c.ports[1], tenants_b);
  ASSERT_TRUE(a && b);
  const std::string sa = a->socket(), sb = b->socket();
  constexpr int kN = 16;
  constexpr size_t kSize = 256 << 10;
  std::vector<kvpool_key_id> ids;
  for (int i = 0; i < kN; ++i) ids.push_back(C(Id("fleet-" + std::to_string(i))));
  EXPECT_EQ(AsUser(kAlphaUid, [&] {
              kvpool_client* cl = Open(sa);
              if (cl == nullptr) return std::string("open failed");
              int ok = PutMany(cl, "alpha", "fleet-", kN, kSize);
              kvpool_close(cl);
              return std::to_string(ok);
            }),
            std::to_string(kN));
  // Alpha on b: every value, byte-exact (a read may come before a's publish
  // reaches the key's home: read until all hit, for 5 s at most).
  std::string r = AsUser(kAlphaUid, [&] {
    kvpool_client* cl = Open(sb);
    if (cl == nullptr) return std::string("open failed");
    int read = 0;
    testing::WaitFor(
        [&] {
          read = 0;
          for (int i = 0; i < kN; ++i) {
            read += Reads(cl, "fleet-" + std::to_string(i), Value("alpha", i, kSize));
          }
          return read == kN;
        },
        std::chrono::seconds(5), std::chrono::milliseconds(50));
    kvpool_close(cl);
    return std::to_string(read);
  });
  EXPECT_EQ(r, std::to_string(kN)) << "a:\n" << a->Log() << "\nb:\n" << b->Log();
  Metric("tenant_cross_node_reads", std::stoi(r));
  // Nobody else reads any of it, on either node: bee (b's tenant; the
  // default one on a) and the default tenant (this root process).
  for (const std::string& sock : {sa, sb}) {
    EXPECT_EQ(AsUser(kBeeUid, [&] {
                kvpool_client* cl = Open(sock);
                if (cl == nullptr) return std::string("open failed");
                int hits = Hits(cl, ids);
                kvpool_close(cl);
                return std::to_string(hits);
              }),
              "0")
        << sock;
    kvpool_client* cl = Open(sock);
    ASSERT_NE(cl, nullptr);
    EXPECT_EQ(Hits(cl, ids), 0) << sock;
    kvpool_close(cl);
  }
  // bee's values put on b: those homed at a are refused there (a has no bee),
  // and bee still reads them all on b.
  EXPECT_EQ(AsUser(kBeeUid, [&] {
              kvpool_client* cl = Open(sb);
              if (cl == nullptr) return std::string("open failed");
              int ok = PutMany(cl, "bee", "bee-", kN, 4096);
              int read = 0;
              for (int i = 0; i < kN; ++i) {
                read += Reads(cl, "bee-" + std::to_string(i), Value("bee", i, 4096));
              }
              kvpool_close(cl);
              return std::to_string(ok) + " " + std::to_string(read);
            }),
            std::to_string(kN) + " " + std::to_string(kN));
  EXPECT_TRUE(WaitFor(std::chrono::milliseconds(3000), [&] {
    return a->Metric("kvpool_peer_tenant_refused_total") > 0;
  })) << a->Log();
  EXPECT_EQ(b->Metric("kvpool_peer_tenant_refused_total"), 0);
}

TEST_F(TenantTest, ATenantTokenInTheHandshakePutsAClientInItsTenantAndAWrongOneIsRefused) {
  const char* kSecret = "5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e";
  WriteFile(tenants_,
            "tenant alpha dram=32MiB uids=" + std::to_string(kAlphaUid) + " tokens=alpha-jobs\n" +
                "tenant bee dram=16MiB uids=" + std::to_string(kBeeUid) + "\n",
            0, 0644);
  std::string tokens =
      WriteFile(dir_ + "/client.tokens", std::string("alpha-jobs ") + kSecret + "\n", 0, 0600);
  std::string log;
  node_ = NodeProcess::Start({"--tenants-file", tenants_, "--socket-group", "nogroup",
                              "--client-token-file", tokens, "--admin-token-file", token_},
                             dir_ + "/sock/kvpool.sock", &log);
  ASSERT_NE(node_, nullptr) << log;
  const std::string sock = node_->socket();
  constexpr uid_t kJobUid = 64050;  // in no tenant: the token decides
  std::string good = WriteFile(dir_ + "/good.token", std::string("alpha-jobs ") + kSecret + "\n",
                               kJobUid, 0600);
  std::string bad = WriteFile(dir_ + "/bad.token",
                              std::string("alpha-jobs ") + std::string(64, 'f') + "\n", kJobUid,
                              0600);
  std::string r = AsUser(kJobUid, [&] {
    kvpool_options o;
    kvpool_options_init(&o);
    o.socket_path = sock.c_str();
    o.tenant_token_file = good.c_str();
    kvpool_status st = KVPOOL_OK;
    kvpool_client* c = kvpool_open(&o, &st);
    if (c == nullptr) return std::string("open failed: ") + kvpool_last_error();
    int ok = PutMany(c, "alpha", "job-", 5, 4096);
    kvpool_close(c);
    o.tenant_token_file = bad.c_str();
    c = kvpool_open(&o, &st);
    std::string refused = c == nullptr ? kvpool_status_name(st) : "opened";
    if (c != nullptr) kvpool_close(c);
    return std::to_string(ok) + " " + refused;
  });
  EXPECT_EQ(r, "5 PermissionDenied");
  EXPECT_EQ(Tenant("alpha")["dram"]["entries"], 5);
  EXPECT_EQ(Tenant("default")["dram"]["entries"], 0);
  EXPECT_EQ(node_->Metric("kvpool_protocol_errors_total{reason=\"bad_tenant_token\"}"), 1);
  // Alpha's own users read what the token's client wrote.
  r = AsUser(kAlphaUid, [&] {
    kvpool_client* c = Open(sock);
    if (c == nullptr) return std::string("open failed");
    int read = 0;
    for (int i = 0; i < 5; ++i) {
      read += Reads(c, "job-" + std::to_string(i), Value("alpha", i, 4096));
    }
    kvpool_close(c);
    return std::to_string(read);
  });
  EXPECT_EQ(r, "5");
}

}  // namespace
}  // namespace kvpool::testing

namespace kvpool::testing {
namespace {

// Puts from several threads share a client's connections: each batch is
// reserved, copied and committed on one connection held throughout, so no
// batch finds its connection's staging area taken by another's.
TEST(StagingTest, ConcurrentBatchPutsThroughTheStagingAreaAllSucceed) {
  std::string log;
  auto node = NodeProcess::Start({"--dram-capacity", "768MiB"}, "", &log);
  ASSERT_NE(node, nullptr) << log;
  kvpool_options o;
  kvpool_options_init(&o);
  std::string sock = node->socket();
  o.socket_path = sock.c_str();
  o.max_connections = 2;
  kvpool_status st = KVPOOL_OK;
  kvpool_client* c = kvpool_open(&o, &st);
  ASSERT_NE(c, nullptr) << kvpool_last_error();
  constexpr int kThreads = 4, kBatch = 40;  // 40 MiB a batch, staging 64 MiB a connection
  std::vector<int> failed(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<std::vector<uint8_t>> vals;
      std::vector<kvpool_key_id> ids;
      std::vector<const void*> ptrs;
      std::vector<uint64_t> sizes;
      for (int i = 0; i < kBatch; ++i) {
        vals.push_back(Value("t" + std::to_string(t), i, 1 << 20));
        ids.push_back(C(Id("concurrent-" + std::to_string(t) + "-" + std::to_string(i))));
      }
      for (auto& v : vals) {
        ptrs.push_back(v.data());
        sizes.push_back(v.size());
      }
      std::vector<kvpool_status> item(kBatch, -1);
      kvpool_put(c, ids.data(), ptrs.data(), sizes.data(), kBatch, item.data());
      for (int i = 0; i < kBatch; ++i) failed[t] += item[i] != KVPOOL_OK;
      for (int i = 0; i < kBatch; ++i) {
        failed[t] += !Reads(c, "concurrent-" + std::to_string(t) + "-" + std::to_string(i), vals[i]);
      }
    });
  }
  for (auto& th : threads) th.join();
  kvpool_close(c);
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failed[t], 0) << "thread " << t;
}

}  // namespace
}  // namespace kvpool::testing
