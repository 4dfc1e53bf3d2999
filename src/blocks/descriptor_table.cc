#include "blocks/descriptor_table.h"

#include <atomic>
#include <mutex>
#include <functional>

#include "blocks/flat_map.h"

namespace kvpool::blocks {
namespace {

uint64_t LastEightBytes(std::string_view b) {
  uint64_t v = 0;
  const size_t from = b.size() > 8 ? b.size() - 8 : 0;
  for (size_t i = from; i < b.size(); ++i) v = (v << 8) | static_cast<uint8_t>(b[i]);
  return v;
}

constexpr uint8_t Bit(BlockTier t) { return static_cast<uint8_t>(1u << static_cast<int>(t)); }

}  // namespace

uint64_t EngineHash64(const protocol::EngineHash& h) {
  return h.kind == protocol::EngineHash::Kind::kBytes ? LastEightBytes(h.bytes) : h.value;
}

uint64_t EngineHash64(const protocol::EngineHashView& h) {
  return h.kind == protocol::EngineHash::Kind::kBytes ? LastEightBytes(h.bytes) : h.value;
}

struct DescriptorTable::Impl {
  // One key's descriptors: the one its held value was written with (live)
  // and one staged for a commit in flight.
  struct Entry {
    std::shared_ptr<const std::string> live;
    uint64_t hash = 0;  // live's engine hash
    uint8_t tiers = 0;  // Bit(tier) per tier holding the key
    std::shared_ptr<const std::string> staged;
    uint64_t staged_hash = 0;
    uint64_t token = 0;  // staged's
  };
  struct Counts {
    uint32_t keys[2] = {0, 0};  // per BlockTier
  };

  Impl(uint64_t max, MetricsRegistry* metrics)
      : max_bytes(max),
        entries_gauge(metrics->GetGauge("kvpool_descriptors",
                                        "Keys with block descriptors kept (held, or staged)")),
        bytes_gauge(
            metrics->GetGauge("kvpool_descriptor_bytes", "Bytes of the block descriptors kept")),
        refused(metrics->GetCounter("kvpool_descriptors_refused_total",
                                    "Block descriptors not kept: the table was at its limit "
                                    "(the key is told by its key id)")) {}

  const uint64_t max_bytes;
  Gauge* entries_gauge;
  Gauge* bytes_gauge;
  Counter* refused;

  BlockEventListener* events = nullptr;
  BlockTierListener* tiers = nullptr;

  mutable std::mutex mu;
  // protected by mu
  FlatMap<KeyId, Entry, KeyIdHash> keys;
  FlatMap<uint64_t, Counts, std::hash<uint64_t>> blocks;  // engine hash -> keys per tier
  uint64_t bytes = 0;
  uint64_t next_token = 1;
  // keys.size(), read without the lock: an empty table passes events on
  // without locking.
  std::atomic<uint64_t> count{0};

  static uint64_t Cost(const std::shared_ptr<const std::string>& b) {
    return b ? b->size() + kEntryOverheadBytes : 0;
  }

  void Report() {  // REQUIRES: mu held
    count.store(keys.size(), std::memory_order_release);
    entries_gauge->Set(static_cast<int64_t>(keys.size()));
    bytes_gauge->Set(static_cast<int64_t>(bytes));
  }

  // Sets or clears a held key's tier, telling the tier listener when the
  // key's hash gains its first key or loses its last in that tier.
  void SetTier(Entry& e, BlockTier t, bool on) {  // REQUIRES: mu held
    const uint8_t bit = Bit(t);
    if (((e.tiers & bit) != 0) == on) return;
    e.tiers = static_cast<uint8_t>(on ? e.tiers | bit : e.tiers & ~bit);
    Counts& c = *blocks.Emplace(e.hash).first;
    uint32_t& n = c.keys[static_cast<int>(t)];
    n = on ? n + 1 : n - 1;
    if (tiers != nullptr && n == (on ? 1u : 0u)) tiers->OnBlockTier(e.hash, t, on);
    if (c.keys[0] == 0 && c.keys[1] == 0) blocks.Erase(e.hash);
  }

  // The key left: its held descriptor goes.
  void DropLive(Entry& e) {  // REQUIRES: mu held
    SetTier(e, BlockTier::kDram, false);
    SetTier(e, BlockTier::kSsd, false);
    bytes -= Cost(e.live);
    e.live.reset();
  }
  void DropStaged(Entry& e) {  // REQUIRES: mu held
    bytes -= Cost(e.staged);
    e.staged.reset();
    e.token = 0;
  }
};

DescriptorTable::DescriptorTable(uint64_t max_bytes, MetricsRegistry* metrics)
    : impl_(std::make_unique<Impl>(max_bytes, metrics)) {}

DescriptorTable::~DescriptorTable() = default;

void DescriptorTable::SetListeners(BlockEventListener* events, BlockTierListener* tiers) {
  std::lock_guard lock(impl_->mu);
  impl_->events = events;
  impl_->tiers = tiers;
}

uint64_t DescriptorTable::Stage(const KeyId& key, std::shared_ptr<const std::string> descriptor) {
  protocol::DescriptorView v;
  if (descriptor == nullptr ||
      !protocol::ParseDescriptor({reinterpret_cast<const uint8_t*>(descriptor->data()),
                                  descriptor->size()},
                                 &v)
           .ok()) {
    return 0;
  }
  const uint64_t hash = EngineHash64(v.hash);  // parsed before the lock
  std::lock_guard lock(impl_->mu);
  auto [entry, fresh] = impl_->keys.Emplace(key);
  Impl::Entry& e = *entry;
  const uint64_t add = Impl::Cost(descriptor);
  if (impl_->bytes - Impl::Cost(e.staged) + add > impl_->max_bytes) {
    if (fresh) impl_->keys.Erase(key);
    impl_->refused->Inc();
    return 0;
  }
  impl_->DropStaged(e);
  impl_->bytes += add;
  e.staged = std::move(descriptor);
  e.staged_hash = hash;
  e.token = impl_->next_token++;
  impl_->Report();
  return e.token;
}

void DescriptorTable::Unstage(const KeyId& key, uint64_t token) {
  if (token == 0) return;
  std::lock_guard lock(impl_->mu);
  Impl::Entry* e = impl_->keys.Find(key);
  if (e == nullptr || e->token != token) return;
  impl_->DropStaged(*e);
  if (!e->live) impl_->keys.Erase(key);
  impl_->Report();
}

void DescriptorTable::OnHoldings(const HoldingsEvent& e) {
  static const std::shared_ptr<const std::string> kNone;
  if (impl_->count.load(std::memory_order_acquire) == 0) {
    // Nothing described, so neither is this event's key (a stage happens
    // before its commit, so a write whose stage counts sees it): passed on
    // without the lock.
    if (impl_->events != nullptr) impl_->events->OnBlockEvent(e, kNone);
    return;
  }
  std::lock_guard lock(impl_->mu);
  Impl::Entry* found = impl_->keys.Find(e.key);
  if (found == nullptr) {
    if (impl_->events != nullptr) impl_->events->OnBlockEvent(e, kNone);
    return;
  }
  Impl::Entry& k = *found;
  if (e.enters_node() && k.staged) {
    // The written value's descriptor replaces what an earlier life left.
    if (k.live) impl_->DropLive(k);
    k.live = std::move(k.staged);
    k.hash = k.staged_hash;
    k.token = 0;
  }
  const std::shared_ptr<const std::string>* desc = &kNone;
  if (k.live) {
    desc = &k.live;
    if (e.kind == HoldingsEvent::Kind::kStored) {
      impl_->SetTier(k, BlockTier::kDram, true);
    } else {
      impl_->SetTier(k, e.tier == HoldingTier::kDram ? BlockTier::kDram : BlockTier::kSsd, false);
      if (e.why == HoldingsEvent::Why::kMovedToSsd) impl_->SetTier(k, BlockTier::kSsd, true);
    }
  } else if (e.leaves_node() && k.staged) {
    desc = &k.staged;  // told evicted before its write (holdings.h): named by the stage
  }
  if (impl_->events != nullptr) impl_->events->OnBlockEvent(e, *desc);
  if (e.leaves_node()) {
    if (k.live) {
      impl_->DropLive(k);
    } else if (k.staged) {
      impl_->DropStaged(k);
    }
    if (!k.live && !k.staged) impl_->keys.Erase(e.key);
    impl_->Report();
  } else if (e.enters_node()) {
    impl_->Report();
  }
}
void DescriptorTable::Tiers(std::span<const uint64_t> hashes, uint8_t* out) const {
  std::lock_guard lock(impl_->mu);
  for (size_t i = 0; i < hashes.size(); ++i) {
    const Impl::Counts* c = impl_->blocks.Find(hashes[i]);
    out[i] = 0;
    if (c == nullptr) continue;
    if (c->keys[0] > 0) out[i] |= Bit(BlockTier::kDram);
    if (c->keys[1] > 0) out[i] |= Bit(BlockTier::kSsd);
  }
}

void DescriptorTable::ForEachHeld(const std::function<void(uint64_t, BlockTier)>& fn) const {
  std::lock_guard lock(impl_->mu);
  impl_->blocks.ForEach([&](uint64_t hash, const Impl::Counts& c) {
    if (c.keys[0] > 0) fn(hash, BlockTier::kDram);
    if (c.keys[1] > 0) fn(hash, BlockTier::kSsd);
  });
}

uint64_t DescriptorTable::entries() const {
  std::lock_guard lock(impl_->mu);
  return impl_->keys.size();
}

uint64_t DescriptorTable::bytes() const {
  std::lock_guard lock(impl_->mu);
  return impl_->bytes;
}

}  // namespace kvpool::blocks
