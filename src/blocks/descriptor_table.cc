#include "blocks/descriptor_table.h"

#include <pthread.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "blocks/flat_map.h"

namespace kvpool::blocks {
namespace {

constexpr uint8_t Bit(BlockTier t) { return static_cast<uint8_t>(1u << static_cast<int>(t)); }

// One change as told, queued to be applied in order.
struct Change {
  enum class Kind : uint8_t { kStage, kUnstage, kHoldings };
  Kind kind = Kind::kHoldings;
  HoldingsEvent event;    // kHoldings; the key of every kind in event.key
  uint64_t token = 0;     // kStage, kUnstage
  Descriptor descriptor;  // kStage
};

}  // namespace

struct DescriptorTable::Impl {
  // One key's descriptors: the one its held value was written with (live)
  // and one staged for a commit in flight.
  struct Entry {
    Descriptor live;
    uint64_t hash = 0;  // live.hash64(), kept here to spare a read of live
    uint8_t tiers = 0;  // Bit(tier) per tier holding the key
    Descriptor staged;
    uint64_t token = 0;  // staged's
  };
  struct Counts {
    uint32_t keys[2] = {0, 0};  // per BlockTier
  };

  Impl(uint64_t max, MetricsRegistry* metrics, std::chrono::microseconds interval)
      : max_bytes(max),
        apply_interval(interval),
        entries_gauge(metrics->GetGauge("kvpool_descriptors",
                                        "Keys with block descriptors kept (held, or staged)")),
        bytes_gauge(
            metrics->GetGauge("kvpool_descriptor_bytes", "Bytes of the block descriptors kept")),
        refused(metrics->GetCounter("kvpool_descriptors_refused_total",
                                    "Block descriptors not kept: the table was at its limit "
                                    "(the key is told by its key id)")) {}

  const uint64_t max_bytes;
  const std::chrono::microseconds apply_interval;
  Gauge* entries_gauge;
  Gauge* bytes_gauge;
  Counter* refused;

  // The applied state. Lock order: mu, then queue_mu.
  mutable std::mutex mu;
  // Written under both mu and queue_mu, read under either.
  BlockEventListener* events = nullptr;
  BlockTierListener* tiers = nullptr;
  // protected by mu
  FlatMap<KeyId, Entry, KeyIdHash> keys;
  // Engine hash -> keys per tier: counted from the first read that needs
  // it (Tiers, ForEachHeld) or the first tier listener on; until then only
  // each entry's tiers are kept, and a write costs no lookup here.
  FlatMap<uint64_t, Counts, std::hash<uint64_t>> blocks;
  bool counting = false;
  std::vector<Change> applying;                           // kept for its capacity

  // Bytes of the descriptors staged or kept: taken by a stage, given back
  // at the end of the apply that drops its descriptor.
  std::atomic<uint64_t> bytes{0};
  uint64_t freed = 0;  // protected by mu: what the apply running has dropped
  std::atomic<uint64_t> next_token{1};

  // The changes told and not yet applied.
  std::mutex queue_mu;
  std::condition_variable queue_cv;
  // protected by queue_mu
  std::vector<Change> queued;
  uint64_t unapplied = 0;  // queued, or taken by an apply still running
  bool keys_empty = true;  // as of the last apply
  bool applier_idle = false;
  bool stopping = false;
  std::thread applier;

  static uint64_t Cost(const Descriptor& d) { return d ? d.size() + kEntryOverheadBytes : 0; }

  void Report() {  // REQUIRES: mu held
    entries_gauge->Set(static_cast<int64_t>(keys.size()));
    bytes_gauge->Set(static_cast<int64_t>(bytes.load(std::memory_order_relaxed)));
  }

  // Queues a change; applies the queue here when it is full.
  void Tell(Change c) {
    bool full = false;
    {
      std::lock_guard lock(queue_mu);
      full = Queue(std::move(c));
    }
    if (full) Apply();
  }
  // Returns whether the queue is full (the caller then applies it).
  bool Queue(Change c) {  // REQUIRES: queue_mu held
    queued.push_back(std::move(c));
    ++unapplied;
    const bool full = queued.size() >= kMaxQueued;
    if (applier_idle && !full) {
      applier_idle = false;
      queue_cv.notify_one();
    }
    return full;
  }

  // Applies every change queued so far, in order.
  void Apply() {
    std::lock_guard lock(mu);
    ApplyLocked();
  }
  void ApplyLocked() {  // REQUIRES: mu held
    applying.clear();
    {
      std::lock_guard q(queue_mu);
      if (queued.empty()) return;
      applying.swap(queued);
    }
    // The keys' slots, and the descriptors the holdings events read, are
    // mostly out of the cache: each is asked for a few changes ahead, so
    // the loads overlap instead of each waiting its turn.
    const size_t n = applying.size();
    for (size_t i = 0; i < n; ++i) {
      if (i + kPrefetchSlots < n) keys.Prefetch(applying[i + kPrefetchSlots].event.key);
      if (i + kPrefetchDescriptors < n) PrefetchDescriptors(applying[i + kPrefetchDescriptors]);
      Change& c = applying[i];
      switch (c.kind) {
        case Change::Kind::kStage:
          ApplyStage(c);
          break;
        case Change::Kind::kUnstage:
          ApplyUnstage(c.event.key, c.token);
          break;
        case Change::Kind::kHoldings:
          ApplyHoldings(c.event);
          break;
      }
    }
    applying.clear();  // the descriptors the changes held go now
    // Given back once per apply: the writers' stages add to the same
    // counter from another core, and a subtraction per change moved its
    // cache line between the two cores twice a put.
    bytes.fetch_sub(freed, std::memory_order_relaxed);
    freed = 0;
    Report();
    std::lock_guard q(queue_mu);
    unapplied -= n;
    keys_empty = keys.empty();
  }

  // How many changes ahead ApplyLocked asks for a key's slot, and for the
  // descriptors its entry holds (read from the slot, which must be in by
  // then).
  static constexpr size_t kPrefetchSlots = 8;
  static constexpr size_t kPrefetchDescriptors = 4;
  void PrefetchDescriptors(const Change& c) {  // REQUIRES: mu held
    if (c.kind != Change::Kind::kHoldings) return;
    if (const Entry* e = keys.Find(c.event.key)) {
      e->live.Prefetch();
      e->staged.Prefetch();
    }
  }

  // Sets or clears a held key's tier, telling the tier listener when the
  // key's hash gains its first key or loses its last in that tier.
  void SetTier(Entry& e, BlockTier t, bool on) {  // REQUIRES: mu held
    const uint8_t bit = Bit(t);
    if (((e.tiers & bit) != 0) == on) return;
    e.tiers = static_cast<uint8_t>(on ? e.tiers | bit : e.tiers & ~bit);
    if (!counting) return;
    const uint64_t hash = e.hash;
    Counts& c = *blocks.Emplace(hash).first;
    uint32_t& n = c.keys[static_cast<int>(t)];
    n = on ? n + 1 : n - 1;
    if (tiers != nullptr && n == (on ? 1u : 0u)) tiers->OnBlockTier(hash, t, on);
    if (c.keys[0] == 0 && c.keys[1] == 0) blocks.Erase(hash);
  }

  // Counts every held key's tiers into blocks, once.
  void StartCounting() {  // REQUIRES: mu held
    if (counting) return;
    counting = true;
    keys.ForEach([&](const KeyId&, const Entry& e) {
      if (e.tiers == 0) return;
      Counts& c = *blocks.Emplace(e.hash).first;
      for (BlockTier t : {BlockTier::kDram, BlockTier::kSsd}) {
        if ((e.tiers & Bit(t)) != 0) ++c.keys[static_cast<int>(t)];
      }
    });
  }

  // The key left: its held descriptor goes.
  void DropLive(Entry& e) {  // REQUIRES: mu held
    SetTier(e, BlockTier::kDram, false);
    SetTier(e, BlockTier::kSsd, false);
    freed += Cost(e.live);
    e.live = {};
  }
  void DropStaged(Entry& e) {  // REQUIRES: mu held
    freed += Cost(e.staged);
    e.staged = {};
    e.token = 0;
  }

  void ApplyStage(Change& c) {  // REQUIRES: mu held
    Entry& e = *keys.Emplace(c.event.key).first;
    DropStaged(e);  // replaced
    e.staged = std::move(c.descriptor);
    e.token = c.token;
  }

  void ApplyUnstage(const KeyId& key, uint64_t token) {  // REQUIRES: mu held
    Entry* e = keys.Find(key);
    if (e == nullptr || e->token != token) return;
    DropStaged(*e);
    if (!e->live) keys.Erase(key);
  }

  void ApplyHoldings(const HoldingsEvent& e) {  // REQUIRES: mu held
    static const Descriptor kNone;
    Entry* found = keys.Find(e.key);
    if (found == nullptr) {
      if (events != nullptr) events->OnBlockEvent(e, kNone);
      return;
    }
    Entry& k = *found;
    if (e.enters_node() && k.staged) {
      // The written value's descriptor replaces what an earlier life left.
      if (k.live) DropLive(k);
      k.live = std::move(k.staged);
      k.hash = k.live.hash64();
      k.staged = {};
      k.token = 0;
    }
    const Descriptor* desc = &kNone;
    if (k.live) {
      desc = &k.live;
      if (e.kind == HoldingsEvent::Kind::kStored) {
        SetTier(k, BlockTier::kDram, true);
      } else {
        SetTier(k, e.tier == HoldingTier::kDram ? BlockTier::kDram : BlockTier::kSsd, false);
        if (e.why == HoldingsEvent::Why::kMovedToSsd) SetTier(k, BlockTier::kSsd, true);
      }
    } else if (e.leaves_node() && k.staged) {
      desc = &k.staged;  // told evicted before its write (holdings.h): named by the stage
    }
    if (events != nullptr) events->OnBlockEvent(e, *desc);
    if (e.leaves_node()) {
      if (k.live) {
        DropLive(k);
      } else if (k.staged) {
        DropStaged(k);
      }
      if (!k.live && !k.staged) keys.Erase(e.key);
    }
  }

  void Applier() {
    pthread_setname_np(pthread_self(), "kvpool-blocks");
    for (;;) {
      {
        std::unique_lock lock(queue_mu);
        while (!stopping && queued.empty()) {
          applier_idle = true;
          queue_cv.wait(lock);
        }
        applier_idle = false;
        // Lets a burst of changes gather, then applies them in one go.
        queue_cv.wait_for(lock, apply_interval, [&] { return stopping; });
        if (stopping) return;
      }
      Apply();
    }
  }
};

DescriptorTable::DescriptorTable(uint64_t max_bytes, MetricsRegistry* metrics,
                                 std::chrono::microseconds apply_interval)
    : impl_(std::make_unique<Impl>(max_bytes, metrics, apply_interval)) {
  if (apply_interval.count() > 0) {
    impl_->applier = std::thread([im = impl_.get()] { im->Applier(); });
  }
}

DescriptorTable::~DescriptorTable() {
  {
    std::lock_guard lock(impl_->queue_mu);
    impl_->stopping = true;
  }
  impl_->queue_cv.notify_all();
  if (impl_->applier.joinable()) impl_->applier.join();
}

void DescriptorTable::SetListeners(BlockEventListener* events, BlockTierListener* tiers) {
  std::lock_guard lock(impl_->mu);
  impl_->ApplyLocked();
  if (tiers != nullptr) impl_->StartCounting();
  std::lock_guard q(impl_->queue_mu);
  impl_->events = events;
  impl_->tiers = tiers;
}

uint64_t DescriptorTable::Stage(const KeyId& key, Descriptor descriptor) {
  if (!descriptor) return 0;
  const uint64_t add = Impl::Cost(descriptor);
  uint64_t have = impl_->bytes.load(std::memory_order_relaxed);
  do {
    if (have + add > impl_->max_bytes) {
      impl_->refused->Inc();
      return 0;
    }
  } while (!impl_->bytes.compare_exchange_weak(have, have + add, std::memory_order_relaxed));
  const uint64_t token = impl_->next_token.fetch_add(1, std::memory_order_relaxed);
  Change c;
  c.kind = Change::Kind::kStage;
  c.event.key = key;
  c.token = token;
  c.descriptor = std::move(descriptor);
  impl_->Tell(std::move(c));
  return token;
}

void DescriptorTable::Unstage(const KeyId& key, uint64_t token) {
  if (token == 0) return;
  Change c;
  c.kind = Change::Kind::kUnstage;
  c.event.key = key;
  c.token = token;
  impl_->Tell(std::move(c));
}

void DescriptorTable::OnHoldings(const HoldingsEvent& e) {
  bool full = false;
  {
    std::lock_guard q(impl_->queue_mu);
    if (impl_->unapplied == 0 && impl_->keys_empty) {
      // Nothing described, nothing queued: the event's key is undescribed
      // (its stage would be queued), and it passes on at once, in order.
      static const Descriptor kNone;
      if (impl_->events != nullptr) impl_->events->OnBlockEvent(e, kNone);
      return;
    }
    Change c;
    c.event = e;
    full = impl_->Queue(std::move(c));
  }
  if (full) impl_->Apply();
}

void DescriptorTable::Sync() { impl_->Apply(); }

void DescriptorTable::Tiers(std::span<const uint64_t> hashes, uint8_t* out) const {
  std::lock_guard lock(impl_->mu);
  impl_->ApplyLocked();
  impl_->StartCounting();
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
  impl_->ApplyLocked();
  impl_->StartCounting();
  impl_->blocks.ForEach([&](uint64_t hash, const Impl::Counts& c) {
    if (c.keys[0] > 0) fn(hash, BlockTier::kDram);
    if (c.keys[1] > 0) fn(hash, BlockTier::kSsd);
  });
}

uint64_t DescriptorTable::entries() const {
  std::lock_guard lock(impl_->mu);
  impl_->ApplyLocked();
  return impl_->keys.size();
}

uint64_t DescriptorTable::bytes() const {
  std::lock_guard lock(impl_->mu);
  impl_->ApplyLocked();
  return impl_->bytes.load(std::memory_order_relaxed);
}

}  // namespace kvpool::blocks
