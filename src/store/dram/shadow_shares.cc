#include "store/dram/shadow_shares.h"

#include <algorithm>
#include <cmath>

#include "common/check.h"

namespace kvpool::dram {

ShadowShares::ShadowShares(double max_rate) : max_rate_(std::clamp(max_rate, 1e-6, 1.0)) {
  SetCapacityEntries(1);
}

void ShadowShares::SetCapacityEntries(uint64_t entries) {
  entries = std::max<uint64_t>(entries, 1);
  // At most max_rate and kShadowEntries keys a shadow; but on a small store
  // at least kMinShadowEntries, or all of its keys.
  const double rate =
      std::min(1.0, std::max(std::min(max_rate_, static_cast<double>(kShadowEntries) / entries),
                             static_cast<double>(kMinShadowEntries) / entries));
  const bool resample = rate > rate_ * 5 / 4 || rate < rate_ * 3 / 4 || keys_ == 0;
  if (resample) {
    rate_ = rate;
    threshold_ = rate >= 1 ? UINT64_MAX : static_cast<uint64_t>(std::ldexp(rate, 64));
  }
  capacity_ = std::max<uint64_t>(1, static_cast<uint64_t>(std::llround(rate_ * entries)));
  window_ = std::max<uint64_t>(kMinWindow, capacity_);
  if (resample) {
    Reset();
    return;
  }
  for (size_t i = 0; i < kCandidates; ++i) {
    while (shadows_[i].size() > capacity_) Evict(i);
  }
}

void ShadowShares::Reset() {
  // Most keys are held by every shadow: room for a quarter more than one
  // shadow's capacity before the vector grows.
  entries_.clear();
  entries_.shrink_to_fit();
  entries_.reserve(capacity_ + capacity_ / 4);
  free_.clear();
  free_.shrink_to_fit();
  index_.assign(64, kNone);
  index_.shrink_to_fit();
  keys_ = 0;
  for (Shadow& s : shadows_) {
    s = Shadow{};
    s.ghost.Resize(std::max<uint64_t>(64, capacity_));
  }
  accesses_ = 0;
  in_window_ = 0;
}

void ShadowShares::Insert(const KeyId& key, Place place, bool returning, uint8_t* run) {
  Access(key, /*insert=*/true, place, returning, run);
}

void ShadowShares::Touch(const KeyId& key) {
  if (batching_) {
    batch_.push_back(key);
    return;
  }
  Access(key, /*insert=*/false, Place::kWarm, /*returning=*/false, nullptr);
}

void ShadowShares::EndHits(uint8_t* run) {
  batching_ = false;
  // Judged from the chain's first block (batch_ is last to first): shadow
  // i's hit counts while every sampled block before it hit there too.
  hits_.resize(batch_.size());
  uint8_t alive = kRunAlive;
  for (size_t k = batch_.size(); k-- > 0;) {
    const uint32_t e = Find(batch_[k]);
    alive &= e == kNone ? 0 : entries_[e].held;
    hits_[k] = alive;
  }
  // Applied last to first, as the store touches them. Each key is looked
  // up again: applying one may have evicted another from every shadow
  // (its entry dropped), and it then enters afresh.
  for (size_t k = 0; k < batch_.size(); ++k) {
    ApplyAll(FindOrAdd(batch_[k]), hits_[k], /*insert=*/false, Place::kWarm, false);
    Count(hits_[k]);
  }
  batch_.clear();
  if (run != nullptr) *run = alive;
}

void ShadowShares::Access(const KeyId& key, bool insert, Place place, bool returning,
                          uint8_t* run) {
  const uint32_t e = FindOrAdd(key);
  const uint8_t alive = run != nullptr ? *run : kRunAlive;
  const uint8_t hit = entries_[e].held & alive;
  ApplyAll(e, hit, insert, place, returning);
  if (run != nullptr) *run = hit;
  Count(hit);
}

void ShadowShares::ApplyAll(uint32_t e, uint8_t counted, bool insert, Place place, bool returning) {
  for (size_t i = 0; i < kCandidates; ++i) {
    const bool held = (entries_[e].held >> i) & 1;
    const bool counts = (counted >> i) & 1;
    // Held behind the shadow's first miss: the engine neither reads it nor
    // writes it there.
    if (held && !counts) continue;
    Apply(i, e, held && counts, insert, place, returning);
  }
}

void ShadowShares::Apply(size_t i, uint32_t e, bool hit, bool insert, Place place, bool returning) {
  Shadow& s = shadows_[i];
  if (hit) {
    // A hit: to protected's warm end (probation's, at a share of 0).
    Unlink(i, e);
    PushTail(i, kShareTenths[i] == 0 ? kProbation : kProtected, e);
    if (insert) s.last_chain = e;
    return;
  }
  // A miss here: room first (as the store reserves before it commits),
  // then the key enters. Evict never drops `e`: this shadow does not hold
  // it and it was just made or is held by another.
  while (s.size() >= capacity_) Evict(i);
  Add(i, e, insert ? place : Place::kWarm, insert && returning);
}

void ShadowShares::Count(uint8_t hit) {
  const bool chosen_hits = (hit >> chosen_) & 1;
  accesses_ += 1;
  for (size_t i = 0; i < kCandidates; ++i) {
    Shadow& s = shadows_[i];
    if ((hit >> i) & 1) {
      s.hits += 1;
      if (!chosen_hits) s.wins += 1;
    } else if (chosen_hits) {
      s.losses += 1;
    }
  }
  if (++in_window_ >= window_) EndWindow();
}

void ShadowShares::Add(size_t i, uint32_t e, Place place, bool returning) {
  Shadow& s = shadows_[i];
  entries_[e].held |= static_cast<uint8_t>(1u << i);
  if (kShareTenths[i] == 0) {
    // An LRU of chains, as the policy at a share of 0: the warm end, or just
    // colder than the chain's previous entry; no ghost, no replica place.
    const uint32_t prev = place == Place::kInChain ? s.last_chain : kNone;
    if (prev != kNone) {
      InsertBefore(i, prev, e);
    } else {
      PushTail(i, kProbation, e);
    }
    s.last_chain = place == Place::kColdest ? kNone : e;
    return;
  }
  const uint8_t list = returning || s.ghost.Contains(entries_[e].key) ? kProtected : kProbation;
  const uint32_t prev = place == Place::kInChain ? s.last_chain : kNone;
  if (prev != kNone && ((entries_[prev].protected_ >> i) & 1) == list) {
    InsertBefore(i, prev, e);
  } else if (s.lists[list].head != kNone &&
             ((place == Place::kColdest && list == kProbation) ||
              (kBimodal[i] && ++s.warm_inserts % kBimodalEvery != 0))) {
    InsertBefore(i, s.lists[list].head, e);
  } else {
    PushTail(i, list, e);
  }
  s.last_chain = place == Place::kColdest ? kNone : e;
}

void ShadowShares::Evict(size_t i) {
  Shadow& s = shadows_[i];
  List& probation = s.lists[kProbation];
  List& prot = s.lists[kProtected];
  auto demote = [&] {
    const uint32_t old = prot.head;
    Unlink(i, old);
    PushTail(i, kProbation, old);
  };
  const uint64_t tenths = kShareTenths[i];
  const uint64_t share = tenths == 0 ? 0 : std::max<uint64_t>(1, capacity_ * tenths / 10);
  while (prot.count > share) demote();
  if (++s.victims % kAgeEvery == 0 && prot.count > 0) demote();
  const bool from_probation = probation.head != kNone;
  const uint32_t victim = from_probation ? probation.head : prot.head;
  KVPOOL_CHECK(victim != kNone);
  if (from_probation && tenths != 0) s.ghost.Insert(entries_[victim].key);
  Unlink(i, victim);
  if (s.last_chain == victim) s.last_chain = kNone;
  entries_[victim].held &= static_cast<uint8_t>(~(1u << i));
  if (entries_[victim].held == 0) Drop(victim);
}

void ShadowShares::Choose() {
  // The share whose shadow hit where the chosen one missed more often than
  // the other way round, by more than kZ standard deviations of that
  // difference (a paired sign test over the same sampled accesses).
  size_t best = chosen_;
  double best_gain = 0;
  for (size_t i = 0; i < kCandidates; ++i) {
    const Shadow& s = shadows_[i];
    const double gain = s.wins - s.losses;
    const double bar = kBimodal[i] != kBimodal[chosen_] ? kZInsertion : kZ;
    if (i == chosen_ || gain <= best_gain || gain <= bar * std::sqrt(s.wins + s.losses)) continue;
    best = i;
    best_gain = gain;
  }
  if (best == chosen_) return;
  chosen_ = best;
  ++changes_;
  for (Shadow& s : shadows_) s.wins = s.losses = 0;
}

void ShadowShares::EndWindow() {
  in_window_ = 0;
  ++windows_;
  Choose();
  accesses_ *= kKeep;
  for (Shadow& s : shadows_) {
    s.hits *= kKeep;
    s.wins *= kKeep;
    s.losses *= kKeep;
  }
}

std::array<double, ShadowShares::kCandidates> ShadowShares::hit_ratios() const {
  std::array<double, kCandidates> out{};
  for (size_t i = 0; i < kCandidates; ++i) {
    out[i] = accesses_ > 0 ? shadows_[i].hits / accesses_ : 0;
  }
  return out;
}

uint64_t ShadowShares::bytes() const {
  uint64_t b = entries_.capacity() * sizeof(Entry) + free_.capacity() * sizeof(uint32_t) +
               index_.capacity() * sizeof(uint32_t) + batch_.capacity() * sizeof(KeyId) +
               hits_.capacity();
  for (const Shadow& s : shadows_) b += s.ghost.bytes();
  return b;
}

uint32_t ShadowShares::Find(const KeyId& key) const {
  for (size_t h = Home(key);; h = (h + 1) & (index_.size() - 1)) {
    const uint32_t e = index_[h];
    if (e == kNone || entries_[e].key == key) return e;
  }
}

uint32_t ShadowShares::FindOrAdd(const KeyId& key) {
  if ((keys_ + 1) * 2 > index_.size()) Rehash(index_.size() * 2);
  size_t h = Home(key);
  for (;; h = (h + 1) & (index_.size() - 1)) {
    const uint32_t e = index_[h];
    if (e == kNone) break;
    if (entries_[e].key == key) return e;
  }
  uint32_t e;
  if (!free_.empty()) {
    e = free_.back();
    free_.pop_back();
  } else {
    e = static_cast<uint32_t>(entries_.size());
    entries_.emplace_back();
  }
  Entry& x = entries_[e];
  x.key = key;
  x.prev.fill(kNone);
  x.next.fill(kNone);
  x.held = x.protected_ = 0;
  index_[h] = e;
  ++keys_;
  return e;
}

void ShadowShares::Drop(uint32_t e) {
  const size_t mask = index_.size() - 1;
  size_t h = Home(entries_[e].key);
  while (index_[h] != e) h = (h + 1) & mask;
  // Backward shift: later entries of the run move into the hole when their
  // home does not lie between the hole and them.
  for (size_t j = (h + 1) & mask;; j = (j + 1) & mask) {
    const uint32_t f = index_[j];
    if (f == kNone) break;
    const size_t home = Home(entries_[f].key);
    if (((j - home) & mask) >= ((j - h) & mask)) {
      index_[h] = f;
      h = j;
    }
  }
  index_[h] = kNone;
  free_.push_back(e);
  --keys_;
}

void ShadowShares::Rehash(size_t buckets) {
  index_.assign(buckets, kNone);
  for (uint32_t e = 0; e < entries_.size(); ++e) {
    if (entries_[e].held == 0) continue;
    size_t h = Home(entries_[e].key);
    while (index_[h] != kNone) h = (h + 1) & (buckets - 1);
    index_[h] = e;
  }
}

void ShadowShares::Unlink(size_t i, uint32_t e) {
  Entry& x = entries_[e];
  List& l = shadows_[i].lists[(x.protected_ >> i) & 1];
  if (x.prev[i] != kNone) {
    entries_[x.prev[i]].next[i] = x.next[i];
  } else {
    l.head = x.next[i];
  }
  if (x.next[i] != kNone) {
    entries_[x.next[i]].prev[i] = x.prev[i];
  } else {
    l.tail = x.prev[i];
  }
  x.prev[i] = x.next[i] = kNone;
  --l.count;
}

void ShadowShares::PushTail(size_t i, uint8_t list, uint32_t e) {
  Entry& x = entries_[e];
  List& l = shadows_[i].lists[list];
  x.protected_ = static_cast<uint8_t>((x.protected_ & ~(1u << i)) | (uint32_t{list} << i));
  x.prev[i] = l.tail;
  x.next[i] = kNone;
  if (l.tail != kNone) {
    entries_[l.tail].next[i] = e;
  } else {
    l.head = e;
  }
  l.tail = e;
  ++l.count;
}

void ShadowShares::InsertBefore(size_t i, uint32_t before, uint32_t e) {
  Entry& b = entries_[before];
  Entry& x = entries_[e];
  const uint8_t list = (b.protected_ >> i) & 1;
  List& l = shadows_[i].lists[list];
  x.protected_ = static_cast<uint8_t>((x.protected_ & ~(1u << i)) | (uint32_t{list} << i));
  x.next[i] = before;
  x.prev[i] = b.prev[i];
  if (b.prev[i] != kNone) {
    entries_[b.prev[i]].next[i] = e;
  } else {
    l.head = e;
  }
  b.prev[i] = e;
  ++l.count;
}

}  // namespace kvpool::dram
