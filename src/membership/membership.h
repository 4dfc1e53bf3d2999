// Membership: who is in the cluster, published as immutable snapshots.
//
// A MembershipView is never modified once published; readers take the
// current one with view() and keep it as long as they like. Each change of
// the member set publishes a new view with a larger epoch, and subscribers
// are told (on the publisher's thread, in epoch order). Implementations:
// StaticMembership (a fixed --peers list) and EtcdMembership (leases and a
// watch on etcd). Thread-safe: every public method may be called from any
// thread, except as noted for callbacks.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/metrics.h"

namespace kvpool {

enum class MemberState : uint8_t {
  kAlive = 0,  // registered and (as far as this node knows) holding its lease
};

struct Member {
  std::string node_id;
  std::string address;       // peer endpoint, "host:port"
  uint64_t incarnation = 0;  // changes on every start or re-registration; 0 = unknown (static)
  double weight = 1.0;       // relative share of shards; <= 0 owns none
  MemberState state = MemberState::kAlive;

  friend bool operator==(const Member&, const Member&) = default;
};

struct MembershipView {
  // Larger for every newer view on this node. For EtcdMembership it is the
  // etcd revision the view reflects, so two nodes that publish the same
  // epoch publish the same member set.
  uint64_t epoch = 0;
  std::vector<Member> members;  // sorted by node_id, ids unique

  // nullptr when node_id is not a member.
  const Member* Find(const std::string& node_id) const;
};

using ViewCallback = std::function<void(const std::shared_ptr<const MembershipView>&)>;
using FenceCallback = std::function<void(bool fenced)>;

class Membership {
 public:
  virtual ~Membership();
  Membership(const Membership&) = delete;
  Membership& operator=(const Membership&) = delete;

  // The current view; never null (epoch 0 and no members before the first).
  std::shared_ptr<const MembershipView> view() const;

  // This node's identity as currently registered.
  const std::string& node_id() const { return node_id_; }
  uint64_t incarnation() const { return incarnation_.load(std::memory_order_acquire); }

  // True while this node cannot prove it still holds its membership (its
  // lease could not be renewed in time): it must stop serving remote work
  // until the flag clears. Always false for static membership.
  bool fenced() const { return fenced_.load(std::memory_order_acquire); }

  // Callbacks run on the thread that publishes (the membership's loop),
  // serially, after the new view is visible through view(); they must be
  // quick. A view callback is not called with the view current at
  // subscription time. Unsubscribe*() waits for a running callback to
  // return, so it must not be called from inside a callback.
  uint64_t SubscribeViews(ViewCallback cb);
  uint64_t SubscribeFence(FenceCallback cb);
  void Unsubscribe(uint64_t id);

 protected:
  // metrics may be null (no metrics); otherwise it must outlive this object.
  Membership(std::string node_id, MetricsRegistry* metrics);

  // Publishes a view if its member set differs from the current one.
  // REQUIRES: epoch greater than the current view's epoch when it differs.
  // Returns true when a new view was published.
  bool Publish(std::vector<Member> members, uint64_t epoch);
  void SetIncarnation(uint64_t inc) { incarnation_.store(inc, std::memory_order_release); }
  // Sets the fence flag; tells fence subscribers when it changes.
  void SetFenced(bool fenced);

 private:
  const std::string node_id_;
  std::atomic<uint64_t> incarnation_{0};
  std::atomic<bool> fenced_{false};

  mutable std::mutex view_mu_;
  std::shared_ptr<const MembershipView> view_;  // protected by view_mu_

  // Held while callbacks run, so Unsubscribe can promise none is running.
  std::mutex cb_mu_;
  // Protected by cb_mu_. (std::mutex carries no clang capability
  // annotation, so GUARDED_BY cannot be checked here.)
  uint64_t next_cb_id_ = 1;
  std::map<uint64_t, ViewCallback> view_cbs_;
  std::map<uint64_t, FenceCallback> fence_cbs_;

  Gauge* members_gauge_ = nullptr;
  Gauge* epoch_gauge_ = nullptr;
  Gauge* fenced_gauge_ = nullptr;
};

}  // namespace kvpool
