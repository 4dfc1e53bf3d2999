#include "blocks/descriptor_table.h"

#include <atomic>
#include <mutex>
#include <unordered_map>

namespace kvpool::blocks {

uint64_t EngineHash64(const protocol::EngineHash& h) {
  if (h.kind != protocol::EngineHash::Kind::kBytes) return h.value;
  uint64_t v = 0;
  const size_t from = h.bytes.size() > 8 ? h.bytes.size() - 8 : 0;
  for (size_t i = from; i < h.bytes.size(); ++i) v = (v << 8) | static_cast<uint8_t>(h.bytes[i]);
  return v;
}

namespace {

constexpr uint8_t Bit(BlockTier t) { return static_cast<uint8_t>(1u << static_cast<int>(t)); }

}  // namespace

struct DescriptorTable::Impl {
  struct Staged {
    uint64_t token = 0;
    uint64_t hash = 0;
    std::shared_ptr<const std::string> bytes;
  };
  struct Live {
    uint64_t hash = 0;
    std::shared_ptr<const std::string> bytes;
    uint8_t tiers = 0;  // Bit(tier) per tier holding the key
  };
  struct Counts {
    uint32_t keys[2] = {0, 0};  // per BlockTier
  };

  Impl(uint64_t max, MetricsRegistry* metrics)
      : max_bytes(max),
        entries_gauge(metrics->GetGauge("kvpool_descriptors",
                                        "Block descriptors kept (of held keys, and staged)")),
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
  std::unordered_map<KeyId, Live, KeyIdHash> live;
  std::unordered_map<KeyId, Staged, KeyIdHash> staged;
  std::unordered_map<uint64_t, Counts> blocks;  // engine hash -> described keys per tier
  uint64_t bytes = 0;
  uint64_t next_token = 1;
  // live.size() + staged.size(), read without the lock: an empty table
  // passes events on without locking.
  std::atomic<uint64_t> count{0};

  static uint64_t Cost(const std::string& b) { return b.size() + kEntryOverheadBytes; }

  void Report() {  // REQUIRES: mu held
    count.store(live.size() + staged.size(), std::memory_order_release);
    entries_gauge->Set(static_cast<int64_t>(live.size() + staged.size()));
    bytes_gauge->Set(static_cast<int64_t>(bytes));
  }

  // Sets or clears a live key's tier, telling the tier listener when the
  // key's hash gains its first key or loses its last in that tier.
  void SetTier(Live& l, BlockTier t, bool on) {  // REQUIRES: mu held
    const uint8_t bit = Bit(t);
    if (((l.tiers & bit) != 0) == on) return;
    l.tiers = static_cast<uint8_t>(on ? l.tiers | bit : l.tiers & ~bit);
    Counts& c = blocks[l.hash];
    uint32_t& n = c.keys[static_cast<int>(t)];
    n = on ? n + 1 : n - 1;
    if (tiers != nullptr && n == (on ? 1u : 0u)) tiers->OnBlockTier(l.hash, t, on);
    if (c.keys[0] == 0 && c.keys[1] == 0) blocks.erase(l.hash);
  }

  void Drop(std::unordered_map<KeyId, Live, KeyIdHash>::iterator it) {  // REQUIRES: mu held
    SetTier(it->second, BlockTier::kDram, false);
    SetTier(it->second, BlockTier::kSsd, false);
    bytes -= Cost(*it->second.bytes);
    live.erase(it);
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

uint64_t DescriptorTable::Stage(const KeyId& key, std::span<const uint8_t> descriptor) {
  protocol::BlockDescriptor d;
  if (!protocol::DecodeDescriptor(descriptor, &d).ok()) return 0;
  auto bytes = std::make_shared<const std::string>(reinterpret_cast<const char*>(descriptor.data()),
                                                   descriptor.size());
  std::lock_guard lock(impl_->mu);
  auto it = impl_->staged.find(key);
  const uint64_t old = it == impl_->staged.end() ? 0 : Impl::Cost(*it->second.bytes);
  const uint64_t add = Impl::Cost(*bytes);
  if (impl_->bytes - old + add > impl_->max_bytes) {
    impl_->refused->Inc();
    return 0;
  }
  const uint64_t token = impl_->next_token++;
  impl_->bytes = impl_->bytes - old + add;
  impl_->staged[key] = Impl::Staged{token, EngineHash64(d.hash), std::move(bytes)};
  impl_->Report();
  return token;
}

void DescriptorTable::Unstage(const KeyId& key, uint64_t token) {
  if (token == 0) return;
  std::lock_guard lock(impl_->mu);
  auto it = impl_->staged.find(key);
  if (it == impl_->staged.end() || it->second.token != token) return;
  impl_->bytes -= Impl::Cost(*it->second.bytes);
  impl_->staged.erase(it);
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
  using K = HoldingsEvent::Kind;
  using W = HoldingsEvent::Why;
  auto live = impl_->live.find(e.key);
  auto staged = impl_->staged.find(e.key);
  if (e.enters_node() && staged != impl_->staged.end()) {
    // The written value's descriptor replaces what an earlier life left.
    if (live != impl_->live.end()) impl_->Drop(live);
    live =
        impl_->live.emplace(e.key, Impl::Live{staged->second.hash, staged->second.bytes, 0}).first;
    impl_->staged.erase(staged);
    staged = impl_->staged.end();
  }
  std::shared_ptr<const std::string> desc = kNone;
  if (live != impl_->live.end()) {
    desc = live->second.bytes;
    Impl::Live& l = live->second;
    if (e.kind == K::kStored) {
      impl_->SetTier(l, BlockTier::kDram, true);
    } else {
      impl_->SetTier(l, e.tier == HoldingTier::kDram ? BlockTier::kDram : BlockTier::kSsd, false);
      if (e.why == W::kMovedToSsd) impl_->SetTier(l, BlockTier::kSsd, true);
    }
  } else if (e.leaves_node() && staged != impl_->staged.end()) {
    // Told evicted before its write (holdings.h): named by, and drops, the
    // staged descriptor.
    desc = staged->second.bytes;
    impl_->bytes -= Impl::Cost(*desc);
    impl_->staged.erase(staged);
  }
  if (impl_->events != nullptr) impl_->events->OnBlockEvent(e, desc);
  if (e.leaves_node() && live != impl_->live.end()) impl_->Drop(live);
  impl_->Report();
}

void DescriptorTable::Tiers(std::span<const uint64_t> hashes, uint8_t* out) const {
  std::lock_guard lock(impl_->mu);
  for (size_t i = 0; i < hashes.size(); ++i) {
    auto it = impl_->blocks.find(hashes[i]);
    out[i] = 0;
    if (it == impl_->blocks.end()) continue;
    if (it->second.keys[0] > 0) out[i] |= Bit(BlockTier::kDram);
    if (it->second.keys[1] > 0) out[i] |= Bit(BlockTier::kSsd);
  }
}

void DescriptorTable::ForEachHeld(const std::function<void(uint64_t, BlockTier)>& fn) const {
  std::lock_guard lock(impl_->mu);
  for (const auto& [hash, c] : impl_->blocks) {
    if (c.keys[0] > 0) fn(hash, BlockTier::kDram);
    if (c.keys[1] > 0) fn(hash, BlockTier::kSsd);
  }
}

uint64_t DescriptorTable::entries() const {
  std::lock_guard lock(impl_->mu);
  return impl_->live.size() + impl_->staged.size();
}

uint64_t DescriptorTable::bytes() const {
  std::lock_guard lock(impl_->mu);
  return impl_->bytes;
}

}  // namespace kvpool::blocks
