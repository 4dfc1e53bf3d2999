// A byte-verified client load for the cluster tests: keys whose values
// regenerate from a seed, a local-socket client per thread, and load threads
// that put, get and ask exists while every operation is timed. Shared by the
// fault and churn tests. Not thread-safe unless said.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "harness/node_process.h"
#include "kvpool/kvpool.h"

namespace kvpool::testing {

// One value: its id and how to regenerate its bytes.
struct KeyRec {
  kvpool_key_id id;
  uint64_t seed;
  uint32_t size;
  int holder;  // index of the node it was written through
};

// n keys of namespace "cluster-ft" named prefix + i, sizes min_size plus up
// to spread.
std::vector<KeyRec> MakeKeys(const std::string& prefix, int holder, size_t n, uint64_t seed0,
                             uint32_t min_size, uint32_t spread);

// Bytes that differ from the expected pattern (a size mismatch counts the
// longer length).
uint64_t WrongBytes(const KeyRec& k, const uint8_t* data, size_t got);

// A client of one node's local socket (copy mode). One per thread.
class Conn {
 public:
  explicit Conn(const NodeProcess& n);
  ~Conn();
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;
  bool ok() const { return c_ != nullptr; }

  // Returns how many were stored (status OK).
  size_t Put(const std::vector<KeyRec>& keys);
  // Per key: hit (true) or miss; *wrong accumulates wrong bytes of hits.
  // Returns false when the call itself failed.
  bool Get(const std::vector<KeyRec>& keys, std::vector<bool>* hit, uint64_t* wrong);
  size_t ExistsCount(const std::vector<KeyRec>& keys);

 private:
  kvpool_client* c_ = nullptr;
  std::vector<uint8_t> buf_;
};

// Gets every key (batches of 32) through conn: hits, adding wrong bytes.
size_t HitCount(Conn& conn, const std::vector<KeyRec>& keys, uint64_t* wrong,
                std::vector<KeyRec>* missed = nullptr);

// What the load threads saw. Thread-safe.
struct LoadStats {
  std::atomic<uint64_t> ops{0}, puts{0}, put_failed{0}, gets{0}, hits{0}, misses{0},
      local_hits{0}, local_misses{0}, remote_hits{0}, remote_misses{0}, exists_ops{0},
      wrong_bytes{0}, ops_over_3s{0}, call_errors{0};
  std::mutex mu;
  std::vector<double> lat_ms;

  double P99();
  double MaxMs();
};

// Keys written so far (by holder), shared by the load threads. Thread-safe.
class Registry {
 public:
  void Add(const std::vector<KeyRec>& ks);
  std::vector<KeyRec> Sample(std::mt19937_64& rng, size_t n);
  std::vector<KeyRec> All();

 private:
  std::mutex mu_;
  std::vector<KeyRec> keys_;
};

// One load thread on node `node` (index), through its own connection.
// Writes up to max_keys new keys (4 per put), reads 4 sampled keys per get,
// asks 8 per exists. Runs until stop.
void LoadThread(const NodeProcess& n, int node, int tid, Registry* reg, LoadStats* s,
                const std::atomic<bool>* stop, size_t max_keys);

// Starts threads_per_node LoadThreads on each node of `which` (indexes into
// nodes); they run until *stop, and the caller joins them.
std::vector<std::thread> StartLoad(const std::vector<std::unique_ptr<NodeProcess>>& nodes,
                                   std::initializer_list<int> which, int threads_per_node,
                                   Registry* reg, LoadStats* s, const std::atomic<bool>* stop,
                                   size_t max_keys);

}  // namespace kvpool::testing
