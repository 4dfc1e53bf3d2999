#include "transport/in_process_transport.h"

#include <algorithm>
#include <map>

#include "transport/transport_contract_test.h"

namespace kvpool::transport::testing {
namespace {

class InProcessCluster final : public TestCluster {
 public:
  ~InProcessCluster() override { nodes_.clear(); }
  Transport* Add() override {
    auto node = network_.AddNode("node" + std::to_string(next_++) + ":1");
    Transport* t = node.get();
    nodes_.push_back(std::move(node));
    return t;
  }
  void Kill(Transport* node) override {
    auto it = std::find_if(nodes_.begin(), nodes_.end(),
                           [&](const auto& n) { return n.get() == node; });
    if (it != nodes_.end()) nodes_.erase(it);
  }
  std::string DeadAddress() override { return "nowhere:1"; }

 private:
  InProcessNetwork network_;
  int next_ = 1;
  std::vector<std::unique_ptr<LocalTransport>> nodes_;
};

INSTANTIATE_TEST_SUITE_P(InProcess, TransportContractTest,
                         ::testing::Values(ClusterFactory{"InProcess", [] {
                           return std::unique_ptr<TestCluster>(new InProcessCluster());
                         }}),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace kvpool::transport::testing
