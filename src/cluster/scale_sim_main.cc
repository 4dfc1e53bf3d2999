// kvpool-scale-sim: what a request costs as the cluster grows (ScaleSim,
// docs/scale.md). For each N it stands up N nodes' cluster services in one
// process, puts `chains` chains of `blocks` blocks (each from another
// node), reads each from a node that did not write it, and prints one JSON
// object per N. Before those, every node puts `fill` keys of its own (in
// chains of 128, 64-byte values), so each directory holds what a busy
// cluster's does per node and its bytes per key are a steady state's, not a
// fresh table's. The object:
//   {"nodes", "setup_s", "chain_read_messages_max", "chain_read_messages_mean",
//    "chain_read_lookups_mean", "chain_read_homes_max", "chain_put_messages_max",
//    "chain_put_messages_mean", "directory_bytes_per_key", "directory_bytes_max_node",
//    "membership_bytes_per_node", "peers_called_max", "shards_moved_join",
//    "shards_moved_join_vs_ideal", "shards_moved_leave_vs_ideal", "chain_read_misses"}
// (A read that returned wrong bytes ends the run with an error.)
// Used by bench/compare.sh scale.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cluster/scale_sim.h"

using kvpool::KeyId;
using kvpool::cluster::RequestCost;
using kvpool::cluster::ScaleSim;
using kvpool::cluster::ScaleSimOptions;

int main(int argc, char** argv) {
  CLI::App app{"kvpool-scale-sim: per-request costs of N simulated nodes (docs/scale.md)"};
  std::vector<size_t> sizes = {4, 16, 64};
  size_t chains = 8;
  size_t blocks = 128;
  size_t threads = 4;
  uint64_t value_bytes = 1024;
  size_t fill = 1024;
  app.add_option("--nodes", sizes, "cluster sizes, e.g. --nodes 4 16 64 256")->delimiter(',');
  app.add_option("--chains", chains, "chains put and read per size")->check(CLI::Range(1, 4096));
  app.add_option("--blocks", blocks, "blocks per chain")->check(CLI::Range(1, 4096));
  app.add_option("--threads", threads, "threads the nodes share")->check(CLI::Range(1, 64));
  app.add_option("--value-bytes", value_bytes, "bytes per block")->check(CLI::Range(1, 1 << 20));
  app.add_option("--fill", fill, "keys each node puts before the measured chains")
      ->check(CLI::Range(0, 1 << 20));
  CLI11_PARSE(app, argc, argv);

  for (size_t n : sizes) {
    const auto t0 = std::chrono::steady_clock::now();
    ScaleSimOptions o;
    o.nodes = n;
    o.threads = threads;
    o.dram_bytes = 16ull << 20;
    auto opened = ScaleSim::Open(o);
    if (!opened.ok()) {
      std::fprintf(stderr, "kvpool-scale-sim: %s\n", opened.status().ToString().c_str());
      return 1;
    }
    ScaleSim& sim = **opened;
    const double setup_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (size_t w = 0; w < n && fill > 0; ++w) {
      for (size_t done = 0; done < fill; done += 128) {
        std::vector<KeyId> keys;
        for (size_t b = done; b < std::min(fill, done + 128); ++b) {
          keys.push_back(kvpool::MakeKeyId("fill", std::to_string(w) + "/" + std::to_string(b)));
        }
        kvpool::Status s = sim.Put(w, keys, 64, nullptr);
        if (!s.ok()) {
          std::fprintf(stderr, "kvpool-scale-sim: N=%zu fill: %s\n", n, s.ToString().c_str());
          return 1;
        }
      }
    }
    const double fill_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() - setup_s;
    uint64_t read_max = 0, read_sum = 0, lookups_sum = 0, homes_max = 0, put_max = 0, put_sum = 0;
    uint64_t misses = 0;
    for (size_t c = 0; c < chains; ++c) {
      std::vector<KeyId> keys;
      for (size_t b = 0; b < blocks; ++b) {
        keys.push_back(kvpool::MakeKeyId("scale", std::to_string(c) + "/" + std::to_string(b)));
      }
      const size_t writer = (c * 7919) % n;
      const size_t reader = (writer + 1 + c % std::max<size_t>(1, n - 1)) % n;
      RequestCost put, read;
      kvpool::Status s = sim.Put(writer, keys, value_bytes, &put);
      size_t found = 0;
      if (s.ok()) s = sim.Read(reader, keys, &found, &read);
      if (!s.ok()) {
        std::fprintf(stderr, "kvpool-scale-sim: N=%zu: %s\n", n, s.ToString().c_str());
        return 1;
      }
      misses += keys.size() - found;
      read_max = std::max(read_max, read.messages);
      read_sum += read.messages;
      lookups_sum += read.lookups;
      homes_max = std::max(homes_max, read.homes);
      put_max = std::max(put_max, put.messages);
      put_sum += put.messages;
    }
    const double entries = static_cast<double>(sim.directory_entries());
    uint64_t peers_max = 0;
    for (size_t i = 0; i < n; ++i) peers_max = std::max(peers_max, sim.peers_called(i));
    uint64_t moved = 0;
    const double join = kvpool::cluster::ShardsMovedVsIdeal(n, false, &moved);
    const double leave = kvpool::cluster::ShardsMovedVsIdeal(n - 1 > 0 ? n - 1 : 1, true, nullptr);
    nlohmann::json j = {
        {"nodes", n},
        {"setup_s", setup_s},
        {"fill_s", fill_s},
        {"keys_per_node", entries / static_cast<double>(n)},
        {"chain_read_messages_max", read_max},
        {"chain_read_messages_mean", static_cast<double>(read_sum) / chains},
        {"chain_read_lookups_mean", static_cast<double>(lookups_sum) / chains},
        {"chain_read_homes_max", homes_max},
        {"chain_put_messages_max", put_max},
        {"chain_put_messages_mean", static_cast<double>(put_sum) / chains},
        {"directory_bytes_per_key", entries > 0 ? sim.directory_bytes() / entries : 0.0},
        {"directory_bytes_max_node", sim.directory_bytes_max()},
        {"membership_bytes_per_node", sim.membership_bytes(0)},
        {"peers_called_max", peers_max},
        {"shards_moved_join", moved},
        {"shards_moved_join_vs_ideal", join},
        {"shards_moved_leave_vs_ideal", leave},
        {"chain_read_misses", misses}};
    std::printf("%s\n", j.dump().c_str());
    std::fflush(stdout);
  }
  return 0;
}
