#include "cluster/directory.h"

#include <algorithm>
#include <array>
#include <mutex>
#include <string>
#include <unordered_map>

namespace kvpool::cluster {

namespace {

// A holder as stored: an interned node id and the incarnation.
struct Holder {
  uint32_t node = 0;
  uint64_t incarnation = 0;
};

struct Entry {
  uint64_t size = 0;
  uint8_t count = 0;
  std::array<Holder, kMaxHoldersPerKey> holders;
};

}  // namespace

struct Directory::Impl {
  DirectoryOptions opts;
  mutable std::mutex mu;
  // Protected by mu.
  std::unordered_map<KeyId, Entry, KeyIdHash> map;
  std::vector<std::string> node_names;                // interned node ids
  std::unordered_map<std::string, uint32_t> node_index;
  Counter* dropped = nullptr;
  Counter* applied = nullptr;
  Counter* lookups = nullptr;
  Counter* lookup_hits = nullptr;
  MetricsRegistry* metrics = nullptr;

  uint32_t Intern(const std::string& id) {
    auto [it, fresh] = node_index.emplace(id, static_cast<uint32_t>(node_names.size()));
    if (fresh) node_names.push_back(id);
    return it->second;
  }

  static void Erase(Entry& e, uint8_t i) {
    e.holders[i] = e.holders[e.count - 1];
    --e.count;
  }
};

Directory::Directory(const DirectoryOptions& options, MetricsRegistry* m)
    : impl_(std::make_unique<Impl>()) {
  impl_->opts = options;
  impl_->metrics = m;
  impl_->dropped = m->GetCounter("kvpool_directory_dropped_total",
                                 "Published keys not recorded because the directory was full");
  impl_->applied = m->GetCounter("kvpool_directory_updates_total",
                                 "Publish and unpublish items applied to the directory");
  impl_->lookups = m->GetCounter("kvpool_directory_lookups_total", "Keys looked up in the directory");
  impl_->lookup_hits = m->GetCounter("kvpool_directory_lookup_hits_total",
                                     "Keys looked up that had a holder");
  m->AddCallbackGauge("kvpool_directory_entries", "Keys in this node's directory", {},
                      [this] { return static_cast<double>(entries()); }, this);
  m->AddCallbackGauge("kvpool_directory_bytes", "Estimated memory of this node's directory", {},
                      [this] { return static_cast<double>(entries() * bytes_per_entry()); }, this);
}

Directory::~Directory() { impl_->metrics->RemoveCallbacks(this); }

uint64_t Directory::bytes_per_entry() {
  // The node of an unordered_map: key, value, next pointer, cached hash, plus
  // its bucket pointer.
  return sizeof(KeyId) + sizeof(Entry) + 2 * sizeof(void*) + sizeof(size_t);
}

uint64_t Directory::entries() const {
  std::lock_guard lock(impl_->mu);
  return impl_->map.size();
}

void Directory::Apply(const PublishBatch& batch) {
  std::lock_guard lock(impl_->mu);
  uint32_t node = impl_->Intern(batch.node_id);
  for (const auto& it : batch.items) {
    if (it.op == PublishOp::kAdd) {
      auto found = impl_->map.find(it.key);
      if (found == impl_->map.end()) {
        if (impl_->map.size() >= impl_->opts.max_entries) {
          impl_->dropped->Inc();
          continue;
        }
        found = impl_->map.emplace(it.key, Entry{}).first;
      }
      Entry& e = found->second;
      e.size = it.size;
      uint8_t i = 0;
      while (i < e.count && e.holders[i].node != node) ++i;
      if (i == e.count) {
        if (e.count == kMaxHoldersPerKey) Impl::Erase(e, 0);  // the oldest goes
        i = e.count++;
      }
      e.holders[i] = {node, batch.incarnation};
    } else {
      auto found = impl_->map.find(it.key);
      if (found == impl_->map.end()) continue;
      Entry& e = found->second;
      for (uint8_t i = 0; i < e.count; ++i) {
        if (e.holders[i].node == node && e.holders[i].incarnation == batch.incarnation) {
          Impl::Erase(e, i);
          break;
        }
      }
      if (e.count == 0) impl_->map.erase(found);
    }
    impl_->applied->Inc();
  }
}

std::vector<LookupResult> Directory::Lookup(std::span<const KeyId> keys) const {
  std::vector<LookupResult> out(keys.size());
  uint64_t hits = 0;
  {
    std::lock_guard lock(impl_->mu);
    for (size_t k = 0; k < keys.size(); ++k) {
      auto it = impl_->map.find(keys[k]);
      if (it == impl_->map.end()) continue;
      const Entry& e = it->second;
      out[k].size = e.size;
      for (uint8_t i = 0; i < e.count; ++i) {
        out[k].holders.push_back({impl_->node_names[e.holders[i].node], e.holders[i].incarnation});
      }
      ++hits;
    }
  }
  impl_->lookups->Inc(keys.size());
  impl_->lookup_hits->Inc(hits);
  return out;
}

void Directory::Prune(const MembershipView& view) {
  std::lock_guard lock(impl_->mu);
  // Per interned node: the live incarnation, or none.
  std::vector<int64_t> live(impl_->node_names.size(), -1);
  for (size_t n = 0; n < impl_->node_names.size(); ++n) {
    if (const Member* m = view.Find(impl_->node_names[n])) live[n] = static_cast<int64_t>(m->incarnation);
  }
  for (auto it = impl_->map.begin(); it != impl_->map.end();) {
    Entry& e = it->second;
    for (uint8_t i = 0; i < e.count;) {
      int64_t inc = live[e.holders[i].node];
      bool alive = inc == 0 || (inc > 0 && static_cast<uint64_t>(inc) == e.holders[i].incarnation);
      if (alive) {
        ++i;
      } else {
        Impl::Erase(e, i);
      }
    }
    it = e.count == 0 ? impl_->map.erase(it) : std::next(it);
  }
}

}  // namespace kvpool::cluster
