#include "node/parked_reads.h"

#include <unistd.h>

namespace kvpool {

ParkedReads::ParkedReads(TieredStore* store, RemoteSource* remote, int wake_fd,
                         MetricsRegistry* m)
    : tiered_(store), remote_(remote), wake_fd_(wake_fd) {
  waits_ = m->GetCounter("kvpool_promotion_waits_total",
                         "Requests that waited for entries to be promoted from SSD");
  remote_waits_ = m->GetCounter("kvpool_remote_waits_total",
                                "Requests that waited for the cluster (local misses)");
}

bool ParkedReads::Park(Kind kind, Request* request) {
  const std::vector<KeyId>& keys = request->keys;
  std::vector<KeyId> cold, absent;
  std::vector<bool> is_cold(kind == Kind::kRead ? keys.size() : 0);
  for (size_t i = 0; i < keys.size(); ++i) {
    const KeyId& k = keys[i];
    if (kind == Kind::kExists) {
      if (remote_ != nullptr && !tiered_->Contains(k)) absent.push_back(k);
    } else if (tiered_->NeedsPromotion(k)) {
      cold.push_back(k);
      is_cold[i] = true;
    } else if (remote_ != nullptr && !tiered_->InDram(k)) {
      absent.push_back(k);
    }
  }
  if (cold.empty() && absent.empty()) return false;
  uint64_t id = next_id_++;
  Pending& p = pending_[id];
  p.request = std::move(*request);
  // The keys already in DRAM are pinned while the request waits, before
  // any promotion starts, so the promotions and fetches of the others
  // cannot evict them. These pins answer the request. A pin is a hit, and
  // a batch is a chain in order: pinned last to first, its head is the
  // most recent, as in a read that does not wait (LocalOps::AnswerAcquire).
  if (kind == Kind::kRead) {
    const std::vector<KeyId>& held = p.request.keys;
    for (size_t i = held.size(); i-- > 0;) {
      if (is_cold[i]) continue;  // pinned by its promotion below
      auto pin = tiered_->Hold(held[i]);
      if (pin.ok()) p.request.pins.push_back(std::move(pin).value());
    }
  }
  p.remaining = cold.size() + (absent.empty() ? 0 : 1);
  if (!cold.empty()) waits_->Inc();
  for (const auto& k : cold) {
    tiered_->AcquireOrPromote(k, [this, id](Status, TieredStore::Pin pin) {
      Done d{id, {}, {}, Status::Ok(), {}};
      if (pin.valid()) d.pins.push_back(std::move(pin));
      Post(std::move(d));
    });
  }
  if (!absent.empty()) {
    remote_waits_->Inc();
    if (kind == Kind::kExists) {
      remote_->Exists(std::move(absent), [this, id](std::vector<KeyId> hits) {
        Post(Done{id, {}, std::move(hits), Status::Ok(), {}});
      });
    } else {
      remote_->Fetch(std::move(absent), [this, id](std::vector<TieredStore::Pin> pins) {
        Post(Done{id, std::move(pins), {}, Status::Ok(), {}});
      });
    }
  }
  return true;
}

void ParkedReads::ParkCall(Request* request, const std::function<void(CallDone)>& start) {
  uint64_t id = next_id_++;
  Pending& p = pending_[id];
  p.request = std::move(*request);
  p.remaining = 1;
  start([this, id](Status s, std::string answer) {
    Done d{id, {}, {}, std::move(s), std::move(answer)};
    Post(std::move(d));
  });
}

void ParkedReads::Post(Done d) {
  {
    std::lock_guard lock(mu_);
    done_.push_back(std::move(d));
  }
  uint64_t one = 1;
  ssize_t r = ::write(wake_fd_, &one, sizeof(one));
  (void)r;
}

std::vector<ParkedReads::Request> ParkedReads::TakeReady() {
  std::vector<Done> done;
  {
    std::lock_guard lock(mu_);
    done.swap(done_);
  }
  std::vector<Request> ready;
  for (auto& d : done) {
    auto it = pending_.find(d.id);
    if (it == pending_.end()) continue;
    for (auto& pin : d.pins) it->second.request.pins.push_back(std::move(pin));
    for (auto& k : d.remote_hits) it->second.request.remote_hits.insert(k);
    if (!d.call_status.ok() || !d.answer.empty()) {
      it->second.request.call_status = std::move(d.call_status);
      it->second.request.answer = std::move(d.answer);
    }
    if (--it->second.remaining > 0) continue;
    ready.push_back(std::move(it->second.request));
    pending_.erase(it);
  }
  return ready;
}

}  // namespace kvpool
