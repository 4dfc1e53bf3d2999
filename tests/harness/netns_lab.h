// Separate hosts for tests, made of network namespaces: a hub namespace
// with a bridge, and hosts joined to it by veth pairs, each with one address
// on a private /24. Only namespaces the lab creates are touched (each veth
// is made inside its host and its other end moved straight to the hub), and
// all of them are removed when the lab goes. Needs root and `ip`.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace kvpool::testing {

// Runs a shell command; logs it with its output when it fails. Returns the
// exit status.
int Sh(const std::string& cmd);
// Whether a program is on PATH.
bool Have(const std::string& tool);
// Runs fn on a thread inside network namespace ns (children it forks are
// born there too).
void InNs(const std::string& ns, const std::function<void()>& fn);

class NetnsLab {
 public:
  // Empty when this process can build a lab; else why not.
  static std::string Unavailable();
  NetnsLab();
  ~NetnsLab();
  NetnsLab(const NetnsLab&) = delete;
  NetnsLab& operator=(const NetnsLab&) = delete;

  // Makes the hub namespace and its bridge (address Ip(254)). False on failure.
  bool Init();
  // Adds host i (1..253) with address Ip(i); returns its namespace, or ""
  // on failure.
  std::string AddHost(int i);
  std::string Ip(int i) const { return net_ + std::to_string(i); }
  // The /24 prefix, "10.x.y.".
  const std::string& net() const { return net_; }
  const std::string& hub() const { return hub_; }
  // The namespace of host i ("" when not added).
  std::string Host(int i) const;

 private:
  std::string tag_, net_, hub_;
  std::vector<std::string> made_;
  std::vector<std::pair<int, std::string>> hosts_;
};

}  // namespace kvpool::testing
