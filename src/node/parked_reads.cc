#include "node/parked_reads.h"

#include <unistd.h>

namespace kvpool {

ParkedReads::ParkedReads(TieredStore* store, RemoteReads* remote, int wake_fd, MetricsRegistry* m)
    : tiered_(store), remote_(remote), wake_fd_(wake_fd) {
  waits_ = m->GetCounter("kvpool_promotion_waits_total",
                         "Requests that waited for entries to be promoted from SSD");
  remote_waits_ = m->GetCounter("kvpool_remote_waits_total",
                                "Requests that waited for the cluster (local misses)");
}

ParkedReads::Pending& ParkedReads::Hold(uint64_t id, Request* request, size_t waits) {
  Pending& p = pending_[id];
  p.request = std::move(*request);
  p.remaining = waits;
  return p;
}

bool ParkedReads::Read(Request* request, bool may_wait) {
  const uint64_t id = next_id_;
  TieredStore::Promoted promoted;
  if (may_wait) {
    promoted = [this, id](uint32_t index, TieredStore::Pin pin) {
      Done d;
      d.id = id;
      d.index = index;
      if (pin.valid()) d.pins.push_back(std::move(pin));
      Post(std::move(d));
    };
  }
  batch_.pins.swap(request->pins);
  tiered_->ReadBatch(request->keys, &batch_, promoted);
  batch_.pins.swap(request->pins);
  request->run = batch_.run;
  const bool fetch = may_wait && remote_ != nullptr && !batch_.absent.empty();
  if (!may_wait || (batch_.cold.empty() && !fetch)) return false;
  // The promotions started post under this id, read once this returns.
  ++next_id_;
  Pending& p = Hold(id, request, batch_.cold.size() + (fetch ? 1 : 0));
  if (!batch_.cold.empty()) waits_->Inc();
  if (!fetch) return true;
  remote_waits_->Inc();
  p.absent = batch_.absent;
  std::vector<KeyId> absent;
  absent.reserve(p.absent.size());
  for (uint32_t i : p.absent) absent.push_back(p.request.keys[i]);
  remote_->Fetch(std::move(absent), [this, id](std::vector<TieredStore::Pin> pins) {
    for (const auto& pin : pins) tiered_->CountRead(pin.key());
    Done d;
    d.id = id;
    d.fetched = true;
    d.pins = std::move(pins);
    Post(std::move(d));
  });
  return true;
}

bool ParkedReads::Exists(Request* request) {
  if (remote_ == nullptr) return false;
  std::vector<KeyId> absent;
  for (const KeyId& k : request->keys) {
    if (!tiered_->Contains(k)) absent.push_back(k);
  }
  if (absent.empty()) return false;
  const uint64_t id = next_id_++;
  Hold(id, request, 1);
  remote_waits_->Inc();
  remote_->Exists(std::move(absent), [this, id](std::vector<KeyId> hits) {
    Done d;
    d.id = id;
    d.remote_hits = std::move(hits);
    Post(std::move(d));
  });
  return true;
}

void ParkedReads::ParkCall(Request* request, const std::function<void(CallDone)>& start) {
  const uint64_t id = next_id_++;
  Hold(id, request, 1);
  start([this, id](Status s, std::string answer) {
    Done d;
    d.id = id;
    d.call_status = std::move(s);
    d.answer = std::move(answer);
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
    Pending& p = it->second;
    Request& r = p.request;
    if (!d.fetched) {  // a promotion's pin
      for (auto& pin : d.pins) r.pins[d.index] = std::move(pin);
    } else {  // the fetched keys' pins: each in its key's first empty place
      for (auto& pin : d.pins) {
        for (uint32_t i : p.absent) {
          if (r.keys[i] != pin.key() || r.pins[i].valid()) continue;
          r.pins[i] = std::move(pin);
          break;
        }
      }
    }
    for (auto& k : d.remote_hits) r.remote_hits.insert(k);
    if (!d.call_status.ok() || !d.answer.empty()) {
      r.call_status = std::move(d.call_status);
      r.answer = std::move(d.answer);
    }
    if (--p.remaining > 0) continue;
    ready.push_back(std::move(r));
    pending_.erase(it);
  }
  return ready;
}

}  // namespace kvpool
