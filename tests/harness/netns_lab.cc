#include "harness/netns_lab.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <cstdio>
#include <thread>

#include "harness/node_process.h"

namespace kvpool::testing {

int Sh(const std::string& cmd) {
  std::string out;
  int rc = RunCommand({"/bin/sh", "-c", cmd + " 2>&1"}, &out, true);
  if (rc != 0) std::fprintf(stderr, "`%s` -> %d: %s\n", cmd.c_str(), rc, out.c_str());
  return rc;
}

bool Have(const std::string& tool) {
  std::string out;
  return RunCommand({"/bin/sh", "-c", "command -v " + tool}, &out) == 0;
}

void InNs(const std::string& ns, const std::function<void()>& fn) {
  std::thread t([&] {
    int fd = open(("/var/run/netns/" + ns).c_str(), O_RDONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0) << ns;
    ASSERT_EQ(setns(fd, CLONE_NEWNET), 0) << ns;
    close(fd);
    fn();
  });
  t.join();
}

std::string NetnsLab::Unavailable() {
  if (geteuid() != 0) return "needs root";
  if (!Have("ip")) return "needs ip";
  return "";
}

NetnsLab::NetnsLab() {
  tag_ = std::to_string(getpid() % 100000);
  // A /24 per process, so labs of tests running at once do not overlap.
  net_ = "10." + std::to_string(200 + getpid() % 50) + "." + std::to_string(getpid() % 250) + ".";
  hub_ = "kvh" + tag_;
}

NetnsLab::~NetnsLab() {
  for (const auto& ns : made_) Sh("ip netns del " + ns);
}

bool NetnsLab::Init() {
  if (Sh("ip netns add " + hub_) != 0) return false;
  made_.push_back(hub_);
  std::string in = "ip netns exec " + hub_ + " ";
  return Sh(in + "ip link set lo up && " + in + "ip link add br0 type bridge && " + in +
            "ip addr add " + Ip(254) + "/24 dev br0 && " + in + "ip link set br0 up") == 0;
}

std::string NetnsLab::AddHost(int i) {
  std::string ns = "kvn" + std::to_string(i) + "-" + tag_;
  std::string peer = "h" + std::to_string(i);
  if (Sh("ip netns add " + ns) != 0) return "";
  made_.push_back(ns);
  std::string in = "ip netns exec " + ns + " ", hub = "ip netns exec " + hub_ + " ";
  if (Sh(in + "ip link add eth0 type veth peer name " + peer + " netns " + hub_ + " && " + in +
         "ip addr add " + Ip(i) + "/24 dev eth0 && " + in + "ip link set eth0 up && " + in +
         "ip link set lo up && " + hub + "ip link set " + peer + " master br0 && " + hub +
         "ip link set " + peer + " up") != 0) {
    return "";
  }
  hosts_.emplace_back(i, ns);
  return ns;
}

std::string NetnsLab::Host(int i) const {
  for (const auto& [n, ns] : hosts_) {
    if (n == i) return ns;
  }
  return "";
}

}  // namespace kvpool::testing
