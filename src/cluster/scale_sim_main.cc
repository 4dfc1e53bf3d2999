// kvpool-scale-sim: what a request costs as the cluster grows (ScaleSim,
// docs/scale.md). For each N it stands up N nodes' cluster services in one
// process, puts `chains` chains of `blocks` blocks (each from another
// node), reads each from a node that did not write it, and prints one JSON
// object per N. Before those, every node puts `fill` keys of its own (in
// chains of 128, 64-byte values), so each directory holds what a busy
// cluster's does per node and its bytes per key are a steady state's, not a
// fresh table's. Each chain is read twice, cold: with lookups at every
// key's home ("home_read") and as a chain read ("chain_read"). The object:
//   {"nodes", "setup_s", "fill_s", "keys_per_node",
//    "home_read" and "chain_read": {"messages_max", "messages_mean",
//      "lookup_messages_max", "lookup_messages_mean", "peers_asked_max",
//      "fetches_max", "misses", "get_us_10": {"p50", "p99"}, "get_us_50"},
//    "chain_put_messages_max", "chain_put_messages_mean",
//    "hot_prefix" and "hot_prefix_kept": {"readers", "busiest_node_messages",
//      "busiest_node_messages_per_reader", "misses", "get_us_10"},
//    "join" and "leave" (one node joins, then node 1 crashes, on the running
//      simulation; ScaleSim::ViewChange): {"shards_moved",
//      "shards_moved_vs_ideal", "keys_moved", "keys_lost", "views_s", "whole_s"},
//    "directory_bytes_per_key", "directory_bytes_max_node",
//    "membership_bytes_per_node", "peers_called_max", "shards_moved_join",
//    "shards_moved_join_vs_ideal", "shards_moved_leave_vs_ideal", "cpu_us"}
// get_us_L: the modelled latency of a read (ScaleSim::LatencyUs) with
// L-microsecond links, over every read and 200 draws of the jitter each;
// cpu_us: the measured CPU costs the model used.
// (A read that returned wrong bytes ends the run with an error.)
// Used by bench/compare.sh scale.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cluster/scale_sim.h"
#include "peer/peer_messages_format.h"

using kvpool::KeyId;
using kvpool::cluster::RequestCost;
using kvpool::cluster::ScaleSim;
using kvpool::cluster::ScaleSimOptions;

namespace {

// The reads of one kind at one N: their message counts and call graphs.
struct Reads {
  uint64_t messages_max = 0, messages_sum = 0, lookups_max = 0, lookups_sum = 0;
  uint64_t homes_max = 0, fetches_max = 0, misses = 0;
  std::vector<std::vector<kvpool::cluster::SimCall>> graphs;

  void Add(const RequestCost& c, uint64_t missed) {
    const uint64_t lookups = c.lookups + c.holder_lookups;
    messages_max = std::max(messages_max, c.messages);
    messages_sum += c.messages;
    lookups_max = std::max(lookups_max, lookups);
    lookups_sum += lookups;
    homes_max = std::max(homes_max, c.homes);
    fetches_max = std::max(fetches_max, c.fetches);
    misses += missed;
    graphs.push_back(c.calls);
  }
  // Modelled get latency percentiles over every read and kDraws draws of
  // the link model's jitter each.
  nlohmann::json Latency(const ScaleSim& sim, double link_us) const {
    static constexpr uint64_t kDraws = 200;
    kvpool::cluster::LinkModel link;
    link.latency_us = link_us;
    const kvpool::cluster::SimCostTable costs = sim.costs();
    std::vector<double> us;
    for (size_t r = 0; r < graphs.size(); ++r) {
      for (uint64_t d = 0; d < kDraws; ++d) {
        us.push_back(ScaleSim::LatencyUs(graphs[r], link, costs, r * kDraws + d + 1));
      }
    }
    std::sort(us.begin(), us.end());
    auto at = [&](double q) {
      return us.empty() ? 0.0 : us[static_cast<size_t>(q * (us.size() - 1))];
    };
    return {{"p50", at(0.5)}, {"p99", at(0.99)}};
  }
  nlohmann::json Json(const ScaleSim& sim, size_t chains) const {
    return {{"messages_max", messages_max},
            {"messages_mean", static_cast<double>(messages_sum) / chains},
            {"lookup_messages_max", lookups_max},
            {"lookup_messages_mean", static_cast<double>(lookups_sum) / chains},
            {"peers_asked_max", homes_max},
            {"fetches_max", fetches_max},
            {"misses", misses},
            {"get_us_10", Latency(sim, 10)},
            {"get_us_50", Latency(sim, 50)}};
  }
};

// The hot prefix: one chain (a shared system prompt) put by node 0 and read
// once by every other node, each keeping a copy (`keep`: replicas, as
// --read-replicas all does) or not (placement chain). The reads are made
// one after another, each finding the copies the earlier ones kept, and
// their call graphs are replayed as if all came at once (10 us links):
// the busiest node queues them. Null on an error (printed).
std::optional<nlohmann::json> HotPrefix(ScaleSim& sim, size_t blocks, uint64_t value_bytes,
                                        bool keep) {
  const size_t n = sim.size();
  std::vector<KeyId> keys;
  for (size_t b = 0; b < blocks; ++b) {
    keys.push_back(kvpool::MakeKeyId(keep ? "hot-kept" : "hot", std::to_string(b)));
  }
  kvpool::Status s = sim.Put(0, keys, value_bytes, nullptr);
  std::vector<kvpool::cluster::SimCall> all;
  std::vector<size_t> first_call;  // per reader, its first call's index in `all`
  std::vector<uint64_t> received(n, 0);
  uint64_t misses = 0;
  for (size_t r = 1; r < n && s.ok(); ++r) {
    RequestCost c;
    size_t found = 0;
    s = sim.Read(r, keep ? ScaleSim::ReadKind::kChainKeep : ScaleSim::ReadKind::kChain, keys,
                 &found, &c);
    misses += keys.size() - found;
    first_call.push_back(all.size());
    const int offset = static_cast<int>(all.size());
    for (kvpool::cluster::SimCall call : c.calls) {
      if (call.parent >= 0) call.parent += offset;
      ++received[call.to];
      all.push_back(call);
    }
  }
  if (!s.ok()) {
    std::fprintf(stderr, "kvpool-scale-sim: hot prefix: %s\n", s.ToString().c_str());
    return std::nullopt;
  }
  first_call.push_back(all.size());
  const kvpool::cluster::SimCostTable costs = sim.costs();
  kvpool::cluster::LinkModel link;
  link.latency_us = 10;
  std::vector<double> us;
  for (uint64_t d = 1; d <= 20; ++d) {
    std::vector<double> replied;
    ScaleSim::LatencyUs(all, link, costs, d, &replied);
    for (size_t r = 0; r + 1 < first_call.size(); ++r) {
      double end = 0;
      for (size_t i = first_call[r]; i < first_call[r + 1]; ++i) end = std::max(end, replied[i]);
      us.push_back(end);
    }
  }
  std::sort(us.begin(), us.end());
  auto at = [&](double q) {
    return us.empty() ? 0.0 : us[static_cast<size_t>(q * static_cast<double>(us.size() - 1))];
  };
  const uint64_t busiest = *std::max_element(received.begin(), received.end());
  return nlohmann::json{{"readers", n - 1},
                        {"busiest_node_messages", busiest},
                        {"busiest_node_messages_per_reader",
                         n > 1 ? static_cast<double>(busiest) / static_cast<double>(n - 1) : 0.0},
                        {"misses", misses},
                        {"get_us_10", {{"p50", at(0.5)}, {"p99", at(0.99)}}}};
}

}  // namespace

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
    // Each chain is read twice, cold, through the same node: with lookups
    // at every key's home, and as a chain read (its first key's home, then
    // its holder).
    Reads home, chain;
    uint64_t put_max = 0, put_sum = 0;
    for (size_t c = 0; c < chains; ++c) {
      std::vector<KeyId> keys;
      for (size_t b = 0; b < blocks; ++b) {
        keys.push_back(kvpool::MakeKeyId("scale", std::to_string(c) + "/" + std::to_string(b)));
      }
      const size_t writer = (c * 7919) % n;
      const size_t reader = (writer + 1 + c % std::max<size_t>(1, n - 1)) % n;
      RequestCost put, read, chain_read;
      kvpool::Status s = sim.Put(writer, keys, value_bytes, &put);
      size_t found = 0, chain_found = 0;
      if (s.ok()) s = sim.Read(reader, ScaleSim::ReadKind::kHomes, keys, &found, &read);
      if (s.ok()) s = sim.Read(reader, ScaleSim::ReadKind::kChain, keys, &chain_found, &chain_read);
      if (!s.ok()) {
        std::fprintf(stderr, "kvpool-scale-sim: N=%zu: %s\n", n, s.ToString().c_str());
        return 1;
      }
      home.Add(read, keys.size() - found);
      chain.Add(chain_read, keys.size() - chain_found);
      put_max = std::max(put_max, put.messages);
      put_sum += put.messages;
    }
    const auto hot = HotPrefix(sim, blocks, value_bytes, false);
    const auto hot_kept = HotPrefix(sim, blocks, value_bytes, true);
    if (!hot || !hot_kept) return 1;
    // The directory and the membership as the workload left them.
    const double entries = static_cast<double>(sim.directory_entries());
    const double dir_bytes = static_cast<double>(sim.directory_bytes());
    const uint64_t dir_max = sim.directory_bytes_max();
    const uint64_t view_bytes = sim.membership_bytes(0);
    uint64_t peers_max = 0;
    for (size_t i = 0; i < n; ++i) peers_max = std::max(peers_max, sim.peers_called(i));
    // One node joins, then node 1 crashes.
    ScaleSim::ViewChange join, leave;
    kvpool::Status vs = sim.Join(&join);
    if (vs.ok()) vs = sim.Leave(1, &leave);
    if (!vs.ok()) {
      std::fprintf(stderr, "kvpool-scale-sim: N=%zu: %s\n", n, vs.ToString().c_str());
      return 1;
    }
    auto view_json = [](const ScaleSim::ViewChange& v, double ideal) {
      return nlohmann::json{{"shards_moved", v.shards_moved},
                            {"shards_moved_vs_ideal", static_cast<double>(v.shards_moved) / ideal},
                            {"keys_moved", v.keys_moved},
                            {"keys_lost", v.keys_lost},
                            {"views_s", v.views_s},
                            {"whole_s", v.whole_s}};
    };
    uint64_t moved = 0;
    const double computed_join = kvpool::cluster::ShardsMovedVsIdeal(n, false, &moved);
    const double computed_leave =
        kvpool::cluster::ShardsMovedVsIdeal(n - 1 > 0 ? n - 1 : 1, true, nullptr);
    const kvpool::cluster::SimCostTable costs = sim.costs();
    nlohmann::json j = {{"nodes", n},
                        {"setup_s", setup_s},
                        {"fill_s", fill_s},
                        {"keys_per_node", entries / static_cast<double>(n)},
                        {"home_read", home.Json(sim, chains)},
                        {"chain_read", chain.Json(sim, chains)},
                        {"chain_put_messages_max", put_max},
                        {"hot_prefix", *hot},
                        {"hot_prefix_kept", *hot_kept},
                        {"join", view_json(join, 4096.0 / static_cast<double>(n + 1))},
                        {"leave", view_json(leave, 4096.0 / static_cast<double>(n + 1))},
                        {"chain_put_messages_mean", static_cast<double>(put_sum) / chains},
                        {"directory_bytes_per_key", entries > 0 ? dir_bytes / entries : 0.0},
                        {"directory_bytes_max_node", dir_max},
                        {"membership_bytes_per_node", view_bytes},
                        {"peers_called_max", peers_max},
                        {"shards_moved_join", moved},
                        {"shards_moved_join_vs_ideal", computed_join},
                        {"shards_moved_leave_vs_ideal", computed_leave},
                        {"cpu_us",
                         {{"lookup", costs.Handler(kvpool::cluster::kPeerLookup)},
                          {"holder_lookup", costs.Handler(kvpool::cluster::kPeerHolderLookup)},
                          {"fetch", costs.Handler(kvpool::cluster::kPeerFetch)},
                          {"send_lookup", costs.Send(kvpool::cluster::kPeerLookup)},
                          {"send_fetch", costs.Send(kvpool::cluster::kPeerFetch)}}}};
    std::printf("%s\n", j.dump().c_str());
    std::fflush(stdout);
  }
  return 0;
}
