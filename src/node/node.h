// Node: the composition root of kvpool-node. Wires the metrics registry, the
// DRAM store, the local socket server and the admin endpoint together,
// starts their threads, and stops them in reverse order. Holds no cache
// logic of its own.
//
// Thread-safe: Stop() may be called from any thread (e.g. a signal waiter).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "common/status.h"
#include "node/node_options.h"

namespace kvpool {

class Node {
 public:
  // Opens every component and starts serving. `config_json` is what
  // /api/v1/config serves (the settings table's rendering).
  // `on_fatal` is called (once, from any thread) when the node can no
  // longer do what it was started for and should be stopped: its node id
  // stays registered by a live process, so it cannot join its cluster.
  static Result<std::unique_ptr<Node>> Start(const NodeOptions& options, std::string config_json,
                                             std::function<void(const Status&)> on_fatal = {});
  virtual ~Node() = default;

  // Drains and stops every component. Idempotent.
  virtual void Stop() = 0;
  // 0 when the admin endpoint is disabled.
  virtual int admin_port() const = 0;
};

}  // namespace kvpool
