#include "cluster/directory.h"

#include <algorithm>
#include <bit>
#include <unordered_map>
#include <map>
#include <mutex>
#include <string>

#include "store/dram/ghost_bloom.h"

namespace kvpool::cluster {

namespace {

// One key of the open-addressing table (linear probing). Holders are
// indexes into the interned (node id, incarnation) table.
struct Slot {
  KeyId key;
  uint32_t size = 0;  // value bytes (values are < 4 GiB)
  uint8_t count = 0;  // holders in use
  uint8_t state = 0;  // kEmpty, kFull, kTombstone
  uint16_t holders[kDirectoryHoldersPerKey] = {};
};
static_assert(sizeof(Slot) == 32, "a directory slot is 32 bytes");

constexpr uint8_t kEmpty = 0;
constexpr uint8_t kFull = 1;
constexpr uint8_t kTombstone = 2;
constexpr size_t kInitialSlots = 1024;
// Grow (or clean tombstones) past this share of used slots.
constexpr double kMaxLoad = 0.8;
constexpr size_t kMaxHolderRefs = 65535;

// Holder-shard pairs of the digest table: ref << kShardBits | shard.
uint32_t DigestKey(uint16_t ref, uint32_t shard) { return (uint32_t{ref} << kShardBits) | shard; }

struct Digest {
  uint32_t keys = 0;
  uint64_t sum = 0;
};

}  // namespace

struct Directory::Impl {
  DirectoryOptions opts;
  mutable std::mutex mu;
  // Protected by mu.
  std::vector<Slot> slots = std::vector<Slot>(kInitialSlots);
  size_t full = 0;
  size_t tombstones = 0;
  std::vector<HolderRef> refs;  // interned holders
  std::map<std::pair<std::string, uint64_t>, uint16_t> ref_index;
  // The newest incarnation of each node seen in a view (Prune). Older ones
  // are dead; newer ones are alive but not in this node's view yet.
  std::map<std::string, uint64_t> last_seen;
  // Holders beyond a slot's kDirectoryHoldersPerKey, oldest first.
  std::unordered_map<KeyId, std::vector<uint16_t>, KeyIdHash> spares;
  size_t spare_count = 0;
  // Per (holder, shard): the keys it claims here (DigestKey).
  std::unordered_map<uint32_t, Digest> digests;

  // Keys whose last holder dropped them (ghost_ratio); its window follows
  // the keys listed, checked as it fills.
  std::unique_ptr<dram::GhostBloom> ghost;
  uint64_t ghost_added = 0;
  Counter* dropped = nullptr;
  uint64_t departures = 0;  // Directory::departures
  Counter* applied = nullptr;
  Counter* stale = nullptr;
  Counter* lookups = nullptr;
  Counter* lookup_hits = nullptr;
  MetricsRegistry* metrics = nullptr;

  // A key no holder lists any more: into the ghost, whose window is
  // re-sized to ghost_ratio x the keys listed each time it has taken that
  // many (a resize forgets: it happens once a window, and only on change).
  void NoteGone(const KeyId& key) {
    if (ghost == nullptr) return;
    ghost->Insert(key);
    if (++ghost_added < ghost->window()) return;
    ghost_added = 0;
    const uint64_t want = GhostWindow();
    if (want > ghost->window() * 2 || want < ghost->window() / 2) ghost->Resize(want);
  }
  uint64_t GhostWindow() const {
    return std::max<uint64_t>(1024, opts.ghost_ratio * full);
  }

  size_t mask() const { return slots.size() - 1; }
  // log2(slots.size())
  uint32_t bits() const { return static_cast<uint32_t>(std::countr_zero(slots.size())); }
  // The key's first slot: the top bits of its id (already a uniform hash),
  // so the table is ordered by shard.
  size_t IndexOf(const KeyId& k) const { return static_cast<size_t>(k.hi >> (64 - bits())); }

  void Account(uint16_t ref, const KeyId& key) {
    Digest& d = digests[DigestKey(ref, ShardOf(key))];
    ++d.keys;
    d.sum += ShardDigestOf(key);
  }
  void Unaccount(uint16_t ref, const KeyId& key) {
    auto it = digests.find(DigestKey(ref, ShardOf(key)));
    if (it == digests.end()) return;
    it->second.sum -= ShardDigestOf(key);
    if (--it->second.keys == 0) digests.erase(it);
  }

  // The slot holding key, or nullptr.
  Slot* Find(const KeyId& key) {
    for (size_t i = IndexOf(key);; i = (i + 1) & mask()) {
      Slot& s = slots[i];
      if (s.state == kEmpty) return nullptr;
      if (s.state == kFull && s.key == key) return &s;
    }
  }
  const Slot* Find(const KeyId& key) const { return const_cast<Impl*>(this)->Find(key); }

  // The slot for key, inserting an empty entry; nullptr when full (bound).
  Slot* FindOrInsert(const KeyId& key) {
    if (Slot* s = Find(key)) return s;
    if (full >= opts.max_entries) return nullptr;
    if (static_cast<double>(full + tombstones + 1) > kMaxLoad * static_cast<double>(slots.size())) {
      Rehash(static_cast<double>(full + 1) > 0.5 * kMaxLoad * static_cast<double>(slots.size())
                 ? slots.size() * 2
                 : slots.size());
    }
    for (size_t i = IndexOf(key);; i = (i + 1) & mask()) {
      Slot& s = slots[i];
      if (s.state != kFull) {
        if (s.state == kTombstone) --tombstones;
        s = Slot{};
        s.key = key;
        s.state = kFull;
        ++full;
        return &s;
      }
    }
  }

  void Erase(Slot* s) {
    s->state = kTombstone;
    --full;
    ++tombstones;
  }

  void Rehash(size_t n) {
    std::vector<Slot> old(n);
    old.swap(slots);
    tombstones = 0;
    for (const Slot& s : old) {
      if (s.state != kFull) continue;
      size_t i = IndexOf(s.key);
      while (slots[i].state == kFull) i = (i + 1) & mask();
      slots[i] = s;
    }
  }

  // The interned index of (node, incarnation); compacts the table when it
  // is full (restarts add incarnations over a long life).
  uint16_t Ref(const std::string& node, uint64_t incarnation) {
    auto it = ref_index.find({node, incarnation});
    if (it != ref_index.end()) return it->second;
    if (refs.size() >= kMaxHolderRefs) CompactRefs();
    uint16_t idx = static_cast<uint16_t>(refs.size());
    refs.push_back({node, incarnation});
    ref_index.emplace(std::make_pair(node, incarnation), idx);
    return idx;
  }

  void CompactRefs() {
    std::vector<int32_t> remap(refs.size(), -1);
    std::vector<HolderRef> kept;
    for (Slot& s : slots) {
      if (s.state != kFull) continue;
      for (uint8_t i = 0; i < s.count; ++i) {
        int32_t& r = remap[s.holders[i]];
        if (r < 0) {
          r = static_cast<int32_t>(kept.size());
          kept.push_back(refs[s.holders[i]]);
        }
        s.holders[i] = static_cast<uint16_t>(r);
      }
    }
    for (auto& [key, list] : spares) {
      for (uint16_t& h : list) {
        int32_t& r = remap[h];
        if (r < 0) {
          r = static_cast<int32_t>(kept.size());
          kept.push_back(refs[h]);
        }
        h = static_cast<uint16_t>(r);
      }
    }
    std::unordered_map<uint32_t, Digest> moved;
    for (const auto& [k, d] : digests) {
      int32_t r = remap[k >> kShardBits];
      if (r >= 0) moved[DigestKey(static_cast<uint16_t>(r), k & (kNumShards - 1))] = d;
    }
    digests = std::move(moved);
    refs = std::move(kept);
    ref_index.clear();
    for (size_t i = 0; i < refs.size(); ++i) {
      ref_index.emplace(std::make_pair(refs[i].node_id, refs[i].incarnation),
                        static_cast<uint16_t>(i));
    }
  }

  static void RemoveHolder(Slot& s, uint8_t i) {
    s.holders[i] = s.holders[s.count - 1];
    --s.count;
  }

  // Removes listed holder i of s (it no longer counts for the key) and
  // lists the newest spare in its place.
  void DropListed(Slot& s, uint8_t i) {
    Unaccount(s.holders[i], s.key);
    RemoveHolder(s, i);
    Promote(s);
  }
  void Promote(Slot& s) {
    auto sp = spares.find(s.key);
    if (sp == spares.end()) return;
    while (s.count < kDirectoryHoldersPerKey && !sp->second.empty()) {
      s.holders[s.count++] = sp->second.back();
      sp->second.pop_back();
      --spare_count;
    }
    if (sp->second.empty()) spares.erase(sp);
  }
  // Drops the key with every holder, listed or spare.
  void EraseKey(Slot* s) {
    for (uint8_t i = 0; i < s->count; ++i) Unaccount(s->holders[i], s->key);
    s->count = 0;
    auto sp = spares.find(s->key);
    if (sp != spares.end()) {
      for (uint16_t h : sp->second) Unaccount(h, s->key);
      spare_count -= sp->second.size();
      spares.erase(sp);
    }
    Erase(s);
  }

  uint64_t bytes() const {
    uint64_t b = slots.size() * sizeof(Slot) + refs.size() * (sizeof(HolderRef) + 64);
    for (const auto& r : refs) b += r.node_id.size();
    // Node-based hash tables: about 64 bytes a node plus the payload.
    b += spares.size() * 64 + spare_count * sizeof(uint16_t) + digests.size() * 48;
    return b;
  }
};

Directory::Directory(const DirectoryOptions& options, MetricsRegistry* m)
    : impl_(std::make_unique<Impl>()) {
  impl_->opts = options;
  impl_->metrics = m;
  if (options.ghost_ratio > 0) impl_->ghost = std::make_unique<dram::GhostBloom>(1024);
  impl_->dropped = m->GetCounter("kvpool_directory_dropped_total",
                                 "Published keys not recorded because the directory was full");
  impl_->applied = m->GetCounter("kvpool_directory_updates_total",
                                 "Publish and unpublish items applied to the directory");
  impl_->stale = m->GetCounter("kvpool_directory_stale_publish_total",
                               "Publish batches ignored: sent by an incarnation already replaced");
  impl_->lookups = m->GetCounter("kvpool_directory_lookups_total", "Keys looked up in the directory");
  impl_->lookup_hits = m->GetCounter("kvpool_directory_lookup_hits_total",
                                     "Keys looked up that had a holder");
  m->AddCallbackGauge("kvpool_directory_entries", "Keys in this node's directory", {},
                      [this] { return static_cast<double>(entries()); }, this);
  m->AddCallbackGauge(
      "kvpool_directory_bytes",
      "Memory of this node's directory (table and holder names; the ghost is "
      "kvpool_directory_ghost_bytes)",
      {}, [this] { return static_cast<double>(bytes()); }, this);
  m->AddCallbackGauge(
      "kvpool_directory_ghost_bytes",
      "Memory of the directory's ghost of keys dropped lately (--directory-ghost)", {},
      [this] { return static_cast<double>(ghost_bytes()); }, this);
}

Directory::~Directory() { impl_->metrics->RemoveCallbacks(this); }

uint64_t Directory::entries() const {
  std::lock_guard lock(impl_->mu);
  return impl_->full;
}

uint64_t Directory::departures() const {
  std::lock_guard lock(impl_->mu);
  return impl_->departures;
}

uint64_t Directory::bytes() const {
  std::lock_guard lock(impl_->mu);
  return impl_->bytes();
}

uint64_t Directory::ghost_bytes() const {
  std::lock_guard lock(impl_->mu);
  return impl_->ghost != nullptr ? impl_->ghost->bytes() : 0;
}

void Directory::Apply(const PublishBatch& batch) {
  std::lock_guard lock(impl_->mu);
  auto seen = impl_->last_seen.find(batch.node_id);
  if (batch.incarnation != 0 && seen != impl_->last_seen.end() && batch.incarnation < seen->second) {
    impl_->stale->Inc();  // a late batch from a life the node has left
    return;
  }
  uint16_t ref = impl_->Ref(batch.node_id, batch.incarnation);
  for (const auto& it : batch.items) {
    if (it.op == PublishOp::kAdd) {
      Slot* s = impl_->FindOrInsert(it.key);
      if (s == nullptr) {
        impl_->dropped->Inc();
        continue;
      }
      s->size = static_cast<uint32_t>(std::min<uint64_t>(it.size, UINT32_MAX));
      // The same node under another incarnation is replaced, not added.
      uint8_t i = 0;
      while (i < s->count && impl_->refs[s->holders[i]].node_id != batch.node_id) ++i;
      if (i < s->count) {
        if (s->holders[i] != ref) {
          impl_->Unaccount(s->holders[i], it.key);
          s->holders[i] = ref;
          impl_->Account(ref, it.key);
        }
      } else {
        // A spare of this node (under any incarnation) is listed again as
        // the newest.
        auto sp = impl_->spares.find(it.key);
        if (sp != impl_->spares.end()) {
          auto& list = sp->second;
          for (size_t j = 0; j < list.size(); ++j) {
            if (impl_->refs[list[j]].node_id != batch.node_id) continue;
            impl_->Unaccount(list[j], it.key);
            list.erase(list.begin() + static_cast<ptrdiff_t>(j));
            --impl_->spare_count;
            break;
          }
          if (list.empty()) impl_->spares.erase(sp);
        }
        if (s->count == kDirectoryHoldersPerKey) {
          // The oldest listed holder becomes a spare (dropped when the
          // spares are at their bound).
          uint16_t oldest = s->holders[0];
          Impl::RemoveHolder(*s, 0);
          if (impl_->spare_count < impl_->opts.max_entries) {
            impl_->spares[it.key].push_back(oldest);
            ++impl_->spare_count;
          } else {
            impl_->Unaccount(oldest, it.key);
            impl_->dropped->Inc();
          }
        }
        s->holders[s->count++] = ref;
        impl_->Account(ref, it.key);
      }
    } else {
      Slot* s = impl_->Find(it.key);
      if (s == nullptr) continue;
      bool listed = false;
      for (uint8_t i = 0; i < s->count; ++i) {
        if (s->holders[i] == ref) {
          impl_->DropListed(*s, i);
          listed = true;
          ++impl_->departures;
          break;
        }
      }
      if (!listed) {
        auto sp = impl_->spares.find(it.key);
        if (sp != impl_->spares.end()) {
          auto pos = std::find(sp->second.begin(), sp->second.end(), ref);
          if (pos != sp->second.end()) {
            impl_->Unaccount(ref, it.key);
            sp->second.erase(pos);
            --impl_->spare_count;
            if (sp->second.empty()) impl_->spares.erase(sp);
          }
        }
      }
      if (s->count == 0) {
        impl_->Erase(s);
        impl_->NoteGone(it.key);
      }
    }
    impl_->applied->Inc();
  }
}

std::vector<LookupResult> Directory::Lookup(std::span<const KeyId> keys, uint64_t asker) const {
  std::vector<LookupResult> out(keys.size());
  uint64_t hits = 0;
  {
    std::lock_guard lock(impl_->mu);
    for (size_t k = 0; k < keys.size(); ++k) {
      const Slot* s = impl_->Find(keys[k]);
      if (s == nullptr) {
        out[k].evicted_lately = impl_->ghost != nullptr && impl_->ghost->Contains(keys[k]);
        continue;
      }
      out[k].size = s->size;
      // Only a full slot can have spares.
      auto sp = asker == 0 || s->count < kDirectoryHoldersPerKey ? impl_->spares.end()
                                                                 : impl_->spares.find(keys[k]);
      if (sp == impl_->spares.end()) {
        for (uint8_t i = 0; i < s->count; ++i) {
          out[k].holders.push_back(impl_->refs[s->holders[i]]);
        }
      } else {
        const size_t total = s->count + sp->second.size();
        for (size_t j = 0; j < std::min<size_t>(kDirectoryHoldersPerKey, total); ++j) {
          const size_t at = (asker + j) % total;
          out[k].holders.push_back(
              impl_->refs[at < s->count ? s->holders[at] : sp->second[at - s->count]]);
        }
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
  auto& last_seen = impl_->last_seen;
  if (last_seen.size() > kMaxMembers) {  // bounded: forget nodes long gone
    std::erase_if(last_seen, [&](const auto& kv) { return view.Find(kv.first) == nullptr; });
  }
  for (const Member& m : view.members) {
    uint64_t& seen = last_seen[m.node_id];
    seen = std::max(seen, m.incarnation);
  }
  // Per interned holder: alive when the view has it with that incarnation
  // (0 in the view, a static member, matches any), or when it is newer than
  // any this node has seen: it re-registered and its publishes overtook the
  // view that announces it.
  std::vector<bool> alive(impl_->refs.size(), false);
  for (size_t r = 0; r < impl_->refs.size(); ++r) {
    const HolderRef& ref = impl_->refs[r];
    const Member* m = view.Find(ref.node_id);
    auto seen = last_seen.find(ref.node_id);
    uint64_t newest = seen == last_seen.end() ? 0 : seen->second;
    if (m != nullptr && m->incarnation == 0) {
      alive[r] = true;
    } else {
      // (newest 0: never seen in a view, so nothing says it is alive.)
      alive[r] = m != nullptr ? m->incarnation == ref.incarnation || ref.incarnation > newest
                              : newest != 0 && ref.incarnation > newest;
    }
  }
  // Spares first, so a dead listed holder's place goes to a live spare.
  for (auto it = impl_->spares.begin(); it != impl_->spares.end();) {
    auto& list = it->second;
    size_t before = list.size();
    std::erase_if(list, [&](uint16_t h) { return !alive[h]; });
    impl_->spare_count -= before - list.size();
    it = list.empty() ? impl_->spares.erase(it) : std::next(it);
  }
  for (Slot& s : impl_->slots) {
    if (s.state != kFull) continue;
    for (uint8_t i = 0; i < s.count;) {
      if (alive[s.holders[i]]) {
        ++i;
      } else {
        Impl::RemoveHolder(s, i);
      }
    }
    impl_->Promote(s);
    if (s.count == 0) impl_->Erase(&s);
  }
  // Dead holders claim nothing any more.
  std::erase_if(impl_->digests, [&](const auto& kv) { return !alive[kv.first >> kShardBits]; });
}

std::vector<uint32_t> Directory::MismatchedShards(const std::string& node, uint64_t incarnation,
                                                  std::span<const ShardDigest> shards,
                                                  const std::vector<bool>& owned) const {
  std::vector<uint32_t> out;
  std::lock_guard lock(impl_->mu);
  auto r = impl_->ref_index.find({node, incarnation});
  auto mine = [&](uint32_t shard) -> Digest {
    if (r == impl_->ref_index.end()) return {};
    auto d = impl_->digests.find(DigestKey(r->second, shard));
    return d == impl_->digests.end() ? Digest{} : d->second;
  };
  size_t j = 0;
  for (uint32_t shard = 0; shard < kNumShards; ++shard) {
    while (j < shards.size() && shards[j].shard < shard) ++j;
    if (!owned[shard]) continue;
    Digest theirs;
    if (j < shards.size() && shards[j].shard == shard) theirs = {shards[j].keys, shards[j].sum};
    Digest here = mine(shard);
    if (here.keys != theirs.keys || here.sum != theirs.sum) out.push_back(shard);
  }
  return out;
}

std::vector<KeyId> Directory::KeysOf(const std::string& node, uint64_t incarnation,
                                     std::span<const uint32_t> shards, uint32_t first,
                                     uint32_t* next) const {
  std::vector<KeyId> out;
  std::lock_guard lock(impl_->mu);
  *next = static_cast<uint32_t>(shards.size());
  auto r = impl_->ref_index.find({node, incarnation});
  if (r == impl_->ref_index.end()) return out;
  const uint16_t ref = r->second;
  const auto& slots = impl_->slots;
  const uint32_t bits = impl_->bits();
  for (uint32_t k = first; k < shards.size(); ++k) {
    if (out.size() >= kMaxShardKeys) {
      *next = k;
      break;
    }
    const uint32_t shard = shards[k];
    // The shard's keys start in its run of the table and may spill past
    // its end into the following run (linear probing): scan the run, then
    // on while the slots stay occupied.
    size_t begin = bits >= kShardBits ? size_t{shard} << (bits - kShardBits)
                                      : size_t{shard} >> (kShardBits - bits);
    size_t end = bits >= kShardBits ? size_t{shard + 1} << (bits - kShardBits) : begin + 1;
    for (size_t n = 0, i = begin; n < slots.size(); ++n, i = (i + 1) & impl_->mask()) {
      const Slot& s = slots[i];
      if (n >= end - begin && s.state == kEmpty) break;
      if (s.state != kFull || ShardOf(s.key) != shard) continue;
      bool held = std::find(s.holders, s.holders + s.count, ref) != s.holders + s.count;
      if (!held) {
        auto sp = impl_->spares.find(s.key);
        held = sp != impl_->spares.end() &&
               std::find(sp->second.begin(), sp->second.end(), ref) != sp->second.end();
      }
      if (held) out.push_back(s.key);
    }
  }
  return out;
}

void Directory::RetainShards(const std::vector<bool>& owned) {
  std::lock_guard lock(impl_->mu);
  for (Slot& s : impl_->slots) {
    if (s.state == kFull && !owned[ShardOf(s.key)]) impl_->EraseKey(&s);
  }
}

void Directory::Clear() {
  std::lock_guard lock(impl_->mu);
  impl_->slots.assign(kInitialSlots, Slot{});
  impl_->full = 0;
  impl_->tombstones = 0;
  impl_->spares.clear();
  impl_->spare_count = 0;
  impl_->digests.clear();
}

}  // namespace kvpool::cluster
