#include "harness/cluster_harness.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace kvpool::testing {

std::string LoopbackAddr(int port) { return "127.0.0.1:" + std::to_string(port); }

int64_t MsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                               t0)
      .count();
}

nlohmann::json MembersJson(const NodeProcess& n) {
  int status = 0;
  std::string body = n.HttpGet("/api/v1/members", &status);
  if (status != 200) return nlohmann::json();
  auto j = nlohmann::json::parse(body, nullptr, false);
  return j.is_discarded() ? nlohmann::json() : j;
}

std::map<std::string, uint64_t> Members(const NodeProcess& n) {
  std::map<std::string, uint64_t> out;
  auto j = MembersJson(n);
  if (!j.is_object()) return out;
  for (const auto& m : j["members"]) out[m["node_id"]] = m["incarnation"].get<uint64_t>();
  return out;
}

bool Fenced(const NodeProcess& n) {
  auto j = MembersJson(n);
  return j.is_object() && j.value("fenced", false);
}

bool EtcdOutage(const NodeProcess& n) {
  auto j = MembersJson(n);
  return j.is_object() && j.value("etcd_outage", false);
}

uint64_t DramEntries(const NodeProcess& n) {
  auto j = nlohmann::json::parse(n.HttpGet("/api/v1/status"), nullptr, false);
  return j.is_discarded() ? 0 : j["dram"]["entries"].get<uint64_t>();
}

double PeerCallsOk(const NodeProcess& n) {
  return n.Metric("kvpool_transport_calls_total{result=\"ok\"}");
}

std::vector<kvpool_key_id> NumberedKeys(const std::string& ns, const std::string& prefix,
                                        size_t n) {
  std::vector<kvpool_key_id> ids;
  for (size_t i = 0; i < n; ++i) ids.push_back(Client::KeyId(ns, prefix + std::to_string(i)));
  return ids;
}

kvpool_client* OpenLocal(const NodeProcess& n, bool copy_mode) {
  kvpool_options o;
  kvpool_options_init(&o);
  o.socket_path = n.socket().c_str();
  o.copy_mode = copy_mode ? 1 : 0;
  o.timeout_ms = 10000;
  kvpool_status st;
  kvpool_client* c = kvpool_open(&o, &st);
  EXPECT_NE(c, nullptr) << kvpool_status_name(st) << " " << kvpool_last_error();
  return c;
}

kvpool_status PutValues(kvpool_client* c, const std::vector<kvpool_key_id>& ids,
                        const ByteValues& vals, std::vector<kvpool_status>* st) {
  std::vector<const void*> ptrs;
  std::vector<uint64_t> sizes;
  for (const auto& v : vals) {
    ptrs.push_back(v.data());
    sizes.push_back(v.size());
  }
  return kvpool_put(c, ids.data(), ptrs.data(), sizes.data(), ids.size(), st->data());
}

MaybeByteValues GetValues(kvpool_client* c, const std::vector<kvpool_key_id>& ids, size_t cap) {
  std::vector<std::vector<uint8_t>> bufs(ids.size(), std::vector<uint8_t>(cap, 0xee));
  std::vector<void*> ptrs;
  for (auto& b : bufs) ptrs.push_back(b.data());
  std::vector<uint64_t> caps(ids.size(), cap), got(ids.size());
  std::vector<kvpool_status> st(ids.size());
  MaybeByteValues out(ids.size());
  EXPECT_EQ(kvpool_get(c, ids.data(), ptrs.data(), caps.data(), ids.size(), got.data(), st.data()),
            KVPOOL_OK)
      << kvpool_last_error();
  for (size_t i = 0; i < ids.size(); ++i) {
    if (st[i] == KVPOOL_OK) {
      bufs[i].resize(got[i]);
      out[i] = std::move(bufs[i]);
    } else {
      EXPECT_EQ(st[i], KVPOOL_NOT_FOUND) << i;
    }
  }
  return out;
}

bool AllHit(const MaybeByteValues& got) {
  for (const auto& g : got) {
    if (!g) return false;
  }
  return true;
}

void ExpectValues(const MaybeByteValues& got, const ByteValues& want) {
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_TRUE(got[i].has_value()) << i;
    EXPECT_EQ(*got[i], want[i]) << i;
  }
}

bool StaticCluster::PickPorts(const std::vector<std::string>& ids) {
  bool ok = true;
  for (const auto& id : ids) {
    int p = FreePort();
    ok = ok && p > 0;
    ports.push_back(p);
    addrs.push_back(LoopbackAddr(p));
    members += (members.empty() ? "" : ",") + id + "=" + LoopbackAddr(p);
  }
  return ok;
}

bool StaticCluster::StartNodes(const std::vector<std::string>& ids,
                               const std::vector<std::string>& extra_args) {
  for (size_t i = 0; i < ids.size(); ++i) {
    std::vector<std::string> args = {"--node-id", ids[i],        "--peers",
                                     members,     "--peer-port", std::to_string(ports[i])};
    args.insert(args.end(), extra_args.begin(), extra_args.end());
    std::string log;
    auto n = NodeProcess::Start(args, "", &log);
    EXPECT_NE(n, nullptr) << log;
    if (n == nullptr) return false;
    nodes.push_back(std::move(n));
  }
  return true;
}

void EtcdClusterTest::SetUp() {
  auto etcd = EtcdTestServer::Start();
  ASSERT_TRUE(etcd.ok()) << etcd.status().ToString();
  etcd_ = std::move(etcd).value();
}

std::vector<std::string> EtcdClusterTest::Args(const std::string& id,
                                               const std::string& etcd_url) const {
  return {"--node-id",   id,       "--etcd",      etcd_url.empty() ? etcd_->endpoint() : etcd_url,
          "--cluster",   cluster_, "--peer-port", "0",
          "--lease-ttl", "2s"};
}

std::unique_ptr<NodeProcess> EtcdClusterTest::StartNodeWith(const std::vector<std::string>& args) {
  std::string log;
  auto n = NodeProcess::Start(args, "", &log);
  EXPECT_NE(n, nullptr) << log;
  return n;
}

}  // namespace kvpool::testing
