#include "harness/load.h"

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <thread>

#include "harness/cluster_harness.h"
#include "kvpool/client.h"

namespace kvpool::testing {

using std::chrono::steady_clock;

std::vector<KeyRec> MakeKeys(const std::string& prefix, int holder, size_t n, uint64_t seed0,
                             uint32_t min_size, uint32_t spread) {
  std::vector<KeyRec> out;
  for (size_t i = 0; i < n; ++i) {
    uint32_t size = min_size + (spread == 0 ? 0 : static_cast<uint32_t>((i * 7919) % spread));
    out.push_back({Client::KeyId("cluster-ft", prefix + std::to_string(i)), seed0 + i, size, holder});
  }
  return out;
}

uint64_t WrongBytes(const KeyRec& k, const uint8_t* data, size_t got) {
  std::vector<uint8_t> want = Pattern(k.seed, k.size);
  if (got != want.size()) return std::max<uint64_t>(got, want.size());
  uint64_t wrong = 0;
  for (size_t i = 0; i < got; ++i) wrong += data[i] != want[i];
  return wrong;
}

Conn::Conn(const NodeProcess& n) : c_(OpenLocal(n, /*copy_mode=*/true)) {}

Conn::~Conn() {
  if (c_ != nullptr) kvpool_close(c_);
}

size_t Conn::Put(const std::vector<KeyRec>& keys) {
  std::vector<std::vector<uint8_t>> vals;
  std::vector<kvpool_key_id> ids;
  std::vector<const void*> ptrs;
  std::vector<uint64_t> sizes;
  for (const auto& k : keys) vals.push_back(Pattern(k.seed, k.size));
  for (size_t i = 0; i < keys.size(); ++i) {
    ids.push_back(keys[i].id);
    ptrs.push_back(vals[i].data());
    sizes.push_back(vals[i].size());
  }
  std::vector<kvpool_status> st(keys.size(), KVPOOL_INTERNAL);
  if (kvpool_put(c_, ids.data(), ptrs.data(), sizes.data(), ids.size(), st.data()) != KVPOOL_OK) {
    return 0;
  }
  size_t ok = 0;
  for (auto s : st) ok += s == KVPOOL_OK;
  return ok;
}

bool Conn::Get(const std::vector<KeyRec>& keys, std::vector<bool>* hit, uint64_t* wrong) {
  uint32_t cap = 0;
  for (const auto& k : keys) cap = std::max(cap, k.size);
  cap += 4096;
  buf_.resize(static_cast<size_t>(cap) * keys.size());
  std::vector<kvpool_key_id> ids;
  std::vector<void*> ptrs;
  for (size_t i = 0; i < keys.size(); ++i) {
    ids.push_back(keys[i].id);
    ptrs.push_back(buf_.data() + i * cap);
  }
  std::vector<uint64_t> caps(keys.size(), cap), got(keys.size(), 0);
  std::vector<kvpool_status> st(keys.size(), KVPOOL_INTERNAL);
  hit->assign(keys.size(), false);
  if (kvpool_get(c_, ids.data(), ptrs.data(), caps.data(), ids.size(), got.data(), st.data()) !=
      KVPOOL_OK) {
    return false;
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    if (st[i] == KVPOOL_OK) {
      (*hit)[i] = true;
      *wrong += WrongBytes(keys[i], buf_.data() + i * cap, got[i]);
    } else if (st[i] != KVPOOL_NOT_FOUND) {
      ADD_FAILURE() << "get status " << kvpool_status_name(st[i]);
    }
  }
  return true;
}

size_t Conn::ExistsCount(const std::vector<KeyRec>& keys) {
  std::vector<kvpool_key_id> ids;
  for (const auto& k : keys) ids.push_back(k.id);
  std::vector<uint8_t> hits(ids.size());
  size_t prefix = 0;
  if (kvpool_exists(c_, ids.data(), ids.size(), hits.data(), &prefix) != KVPOOL_OK) return 0;
  size_t n = 0;
  for (uint8_t h : hits) n += h;
  return n;
}

size_t HitCount(Conn& conn, const std::vector<KeyRec>& keys, uint64_t* wrong,
                std::vector<KeyRec>* missed) {
  size_t hits = 0;
  for (size_t i = 0; i < keys.size(); i += 32) {
    std::vector<KeyRec> batch(keys.begin() + i, keys.begin() + std::min(keys.size(), i + 32));
    std::vector<bool> hit;
    conn.Get(batch, &hit, wrong);
    for (size_t j = 0; j < batch.size(); ++j) {
      if (hit[j]) {
        ++hits;
      } else if (missed != nullptr) {
        missed->push_back(batch[j]);
      }
    }
  }
  return hits;
}

double LoadStats::P99() {
  std::lock_guard<std::mutex> l(mu);
  if (lat_ms.empty()) return 0;
  std::vector<double> v = lat_ms;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(v.size() * 0.99))];
}

double LoadStats::MaxMs() {
  std::lock_guard<std::mutex> l(mu);
  return lat_ms.empty() ? 0 : *std::max_element(lat_ms.begin(), lat_ms.end());
}

void Registry::Add(const std::vector<KeyRec>& ks) {
  std::lock_guard<std::mutex> l(mu_);
  keys_.insert(keys_.end(), ks.begin(), ks.end());
}

std::vector<KeyRec> Registry::Sample(std::mt19937_64& rng, size_t n) {
  std::lock_guard<std::mutex> l(mu_);
  std::vector<KeyRec> out;
  if (keys_.empty()) return out;
  for (size_t i = 0; i < n; ++i) out.push_back(keys_[rng() % keys_.size()]);
  return out;
}

std::vector<KeyRec> Registry::All() {
  std::lock_guard<std::mutex> l(mu_);
  return keys_;
}

void LoadThread(const NodeProcess& n, int node, int tid, Registry* reg, LoadStats* s,
                const std::atomic<bool>* stop, size_t max_keys) {
  Conn conn(n);
  if (!conn.ok()) return;
  std::mt19937_64 rng(1000 * node + tid);
  std::vector<double> lat;
  size_t written = 0;
  uint64_t iter = 0;
  auto timed = [&](auto&& fn) {
    auto t0 = steady_clock::now();
    fn();
    double ms = std::chrono::duration<double, std::milli>(steady_clock::now() - t0).count();
    lat.push_back(ms);
    s->ops++;
    if (ms > 3000) s->ops_over_3s++;
  };
  while (!stop->load()) {
    ++iter;
    if (written < max_keys) {
      std::string prefix = "load-" + std::to_string(node) + "-" + std::to_string(tid) + "-" +
                           std::to_string(iter) + "-";
      auto ks = MakeKeys(prefix, node, 4, (uint64_t(node) << 40) + (uint64_t(tid) << 32) + iter * 4,
                         512, 16384);
      size_t ok = 0;
      timed([&] { ok = conn.Put(ks); });
      s->puts++;
      if (ok == ks.size()) {
        reg->Add(ks);
        written += ks.size();
      } else {
        s->put_failed++;
      }
    }
    auto ks = reg->Sample(rng, 4);
    if (!ks.empty()) {
      std::vector<bool> hit;
      uint64_t wrong = 0;
      bool ok = true;
      timed([&] { ok = conn.Get(ks, &hit, &wrong); });
      s->gets++;
      if (!ok) s->call_errors++;
      s->wrong_bytes += wrong;
      for (size_t i = 0; i < ks.size() && ok; ++i) {
        bool local = ks[i].holder == node;
        (hit[i] ? s->hits : s->misses)++;
        if (local) {
          (hit[i] ? s->local_hits : s->local_misses)++;
        } else {
          (hit[i] ? s->remote_hits : s->remote_misses)++;
        }
      }
    }
    auto ek = reg->Sample(rng, 8);
    if (!ek.empty()) {
      timed([&] { conn.ExistsCount(ek); });
      s->exists_ops++;
    }
  }
  std::lock_guard<std::mutex> l(s->mu);
  s->lat_ms.insert(s->lat_ms.end(), lat.begin(), lat.end());
}

std::vector<std::thread> StartLoad(const std::vector<std::unique_ptr<NodeProcess>>& nodes,
                                   std::initializer_list<int> which, int threads_per_node,
                                   Registry* reg, LoadStats* s, const std::atomic<bool>* stop,
                                   size_t max_keys) {
  std::vector<std::thread> threads;
  for (int node : which) {
    for (int t = 0; t < threads_per_node; ++t) {
      threads.emplace_back(LoadThread, std::cref(*nodes[node]), node, t, reg, s, stop, max_keys);
    }
  }
  return threads;
}

}  // namespace kvpool::testing
