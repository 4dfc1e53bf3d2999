// The behaviour every Transport implementation promises (transport.h),
// written once and instantiated per implementation with a ClusterFactory.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>

#include "transport/transport.h"

namespace kvpool::transport::testing {

// A set of nodes of one implementation.
class TestCluster {
 public:
  virtual ~TestCluster() = default;
  // Starts a node; it lives until Kill() or the cluster's destruction.
  virtual Transport* Add() = 0;
  // Destroys a node abruptly (its peers must see it as gone).
  virtual void Kill(Transport* node) = 0;
  // An address at which nothing listens.
  virtual std::string DeadAddress() = 0;
};

struct ClusterFactory {
  std::string name;
  std::function<std::unique_ptr<TestCluster>()> make;
};

class TransportContractTest : public ::testing::TestWithParam<ClusterFactory> {
 protected:
  void SetUp() override { cluster_ = GetParam().make(); }
  void TearDown() override { cluster_.reset(); }
  std::unique_ptr<TestCluster> cluster_;
};

}  // namespace kvpool::transport::testing
