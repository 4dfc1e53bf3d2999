// Shared helpers for the cluster tests (cluster_integration_test,
// cluster_fault_test, remote_client_test): free loopback ports, polling,
// /api/v1/members and /api/v1/status as the tests read them, byte-pattern
// put/get through a kvpool_client, a static --peers cluster and a fixture
// that runs a real etcd. Not thread-safe unless said.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/loopback_test_util.h"
#include "harness/node_process.h"
#include "kvpool/client.h"
#include "kvpool/kvpool.h"
#include "membership/etcd_test_util.h"
#include "testing/wait_for.h"

namespace kvpool::testing {

// "127.0.0.1:PORT"
std::string LoopbackAddr(int port);

int64_t MsSince(std::chrono::steady_clock::time_point t0);

// testing::WaitFor (testing/wait_for.h) with the timeout first, as the
// cluster tests read best (real processes, real leases: there is no clock
// to fake); polls every `step`.
template <typename Pred>
bool WaitFor(std::chrono::milliseconds timeout, Pred pred,
             std::chrono::milliseconds step = std::chrono::milliseconds(50)) {
  return WaitFor(std::function<bool()>(std::move(pred)), timeout, step);
}

// One node's /api/v1/members; a null json when it does not answer 200 with JSON.
nlohmann::json MembersJson(const NodeProcess& n);
// node id -> incarnation, as one node's /api/v1/members lists them.
std::map<std::string, uint64_t> Members(const NodeProcess& n);
// Whether the node reports itself fenced.
bool Fenced(const NodeProcess& n);
// Whether the node reports riding out an etcd outage with its last view.
bool EtcdOutage(const NodeProcess& n);
// dram.entries of /api/v1/status (0 when it does not answer).
uint64_t DramEntries(const NodeProcess& n);
// Peer calls this node made that were answered (-1 when it does not answer).
double PeerCallsOk(const NodeProcess& n);

// Key ids of namespace ns, named prefix + "0" .. prefix + (n-1).
std::vector<kvpool_key_id> NumberedKeys(const std::string& ns, const std::string& prefix, size_t n);

// Opens a client of one node's local socket (timeout 10 s); EXPECTs success.
kvpool_client* OpenLocal(const NodeProcess& n, bool copy_mode);

using ByteValues = std::vector<std::vector<uint8_t>>;
using MaybeByteValues = std::vector<std::optional<std::vector<uint8_t>>>;

// kvpool_put of vals under ids; *st must hold ids.size() entries (its
// initial values are what an item the call does not set keeps).
kvpool_status PutValues(kvpool_client* c, const std::vector<kvpool_key_id>& ids,
                        const ByteValues& vals, std::vector<kvpool_status>* st);
// kvpool_get into buffers of `cap` bytes: per key the value, or nullopt on a
// miss. EXPECTs the call to succeed and every item to be OK or NOT_FOUND.
MaybeByteValues GetValues(kvpool_client* c, const std::vector<kvpool_key_id>& ids, size_t cap);
// Whether every key was a hit.
bool AllHit(const MaybeByteValues& got);
// Every want[i] came back in got[i], byte-exact (fatal on a miss: wrap the
// call in ASSERT_NO_FATAL_FAILURE).
void ExpectValues(const MaybeByteValues& got, const ByteValues& want);

// Nodes of a static cluster (--peers), each on a free loopback peer port.
struct StaticCluster {
  std::vector<std::unique_ptr<NodeProcess>> nodes;
  std::vector<int> ports;          // peer port per node
  std::vector<std::string> addrs;  // "127.0.0.1:PORT" per node
  std::string members;             // "id=127.0.0.1:PORT,..." for --peers

  // Picks a free port per id and fills ports, addrs and members; false
  // when a port could not be had.
  bool PickPorts(const std::vector<std::string>& ids);
  // Starts one node per id (after PickPorts): --node-id, --peers members,
  // --peer-port its port, then extra_args. EXPECTs each to come up; false
  // at the first that does not.
  bool StartNodes(const std::vector<std::string>& ids,
                  const std::vector<std::string>& extra_args = {});
};

// A fixture that runs a real etcd per test; nodes join cluster `cluster`
// with a 2 s lease and an ephemeral peer port.
class EtcdClusterTest : public ::testing::Test {
 protected:
  explicit EtcdClusterTest(std::string cluster) : cluster_(std::move(cluster)) {}
  void SetUp() override;

  // Node flags for id; etcd_url empty: the test etcd.
  std::vector<std::string> Args(const std::string& id, const std::string& etcd_url = "") const;
  // Starts a node with args; EXPECTs it to come up (nullptr when not).
  std::unique_ptr<NodeProcess> StartNodeWith(const std::vector<std::string>& args);

  std::unique_ptr<EtcdTestServer> etcd_;

 private:
  std::string cluster_;
};

}  // namespace kvpool::testing
