#include "membership/membership.h"

#include <algorithm>
#include <utility>

#include "common/check.h"

namespace kvpool {

const Member* MembershipView::Find(const std::string& node_id) const {
  auto it = std::lower_bound(members.begin(), members.end(), node_id,
                             [](const Member& m, const std::string& id) { return m.node_id < id; });
  return (it != members.end() && it->node_id == node_id) ? &*it : nullptr;
}

Membership::Membership(std::string node_id, MetricsRegistry* metrics)
    : node_id_(std::move(node_id)), view_(std::make_shared<const MembershipView>()) {
  if (metrics != nullptr) {
    members_gauge_ = metrics->GetGauge("kvpool_membership_members",
                                       "Members in the current membership view.");
    epoch_gauge_ = metrics->GetGauge("kvpool_membership_epoch",
                                     "Epoch of the current membership view.");
    fenced_gauge_ = metrics->GetGauge(
        "kvpool_membership_fenced", "1 while this node cannot prove it holds its membership.");
  }
}

Membership::~Membership() = default;

std::shared_ptr<const MembershipView> Membership::view() const {
  std::lock_guard<std::mutex> l(view_mu_);
  return view_;
}

uint64_t Membership::SubscribeViews(ViewCallback cb) {
  std::lock_guard<std::mutex> l(cb_mu_);
  uint64_t id = next_cb_id_++;
  view_cbs_.emplace(id, std::move(cb));
  return id;
}

uint64_t Membership::SubscribeFence(FenceCallback cb) {
  std::lock_guard<std::mutex> l(cb_mu_);
  uint64_t id = next_cb_id_++;
  fence_cbs_.emplace(id, std::move(cb));
  return id;
}

void Membership::Unsubscribe(uint64_t id) {
  std::lock_guard<std::mutex> l(cb_mu_);
  view_cbs_.erase(id);
  fence_cbs_.erase(id);
}

bool Membership::Publish(std::vector<Member> members, uint64_t epoch) {
  std::sort(members.begin(), members.end(),
            [](const Member& a, const Member& b) { return a.node_id < b.node_id; });
  auto next = std::make_shared<MembershipView>();
  next->epoch = epoch;
  next->members = std::move(members);
  std::shared_ptr<const MembershipView> published = next;
  {
    std::lock_guard<std::mutex> l(view_mu_);
    if (view_->members == next->members) return false;
    KVPOOL_CHECK(epoch > view_->epoch);
    view_ = published;
  }
  if (members_gauge_ != nullptr) {
    members_gauge_->Set(static_cast<int64_t>(published->members.size()));
    epoch_gauge_->Set(static_cast<int64_t>(epoch));
  }
  // Publishers are serial (one loop per membership), so subscribers see
  // views in epoch order.
  std::lock_guard<std::mutex> l(cb_mu_);
  for (auto& [id, cb] : view_cbs_) cb(published);
  return true;
}

void Membership::SetFenced(bool fenced) {
  bool was = fenced_.exchange(fenced, std::memory_order_acq_rel);
  if (was == fenced) return;
  if (fenced_gauge_ != nullptr) fenced_gauge_->Set(fenced ? 1 : 0);
  std::lock_guard<std::mutex> l(cb_mu_);
  for (auto& [id, cb] : fence_cbs_) cb(fenced);
}

}  // namespace kvpool
