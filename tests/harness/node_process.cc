#include "harness/node_process.h"

#include <fcntl.h>
#include <grp.h>
#include <httplib.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "testing/wait_for.h"

namespace kvpool::testing {

std::string NodeBinary() { return KVPOOL_NODE_BIN; }
std::string CtlBinary() { return KVPOOL_CTL_BIN; }
std::string CSmokeBinary() { return KVPOOL_C_SMOKE_BIN; }

namespace {
std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
}  // namespace

std::string TestClusterKeyFile() {
  static const std::string path = [] {
    char tmpl[] = "/tmp/kvpool-test-key-XXXXXX";
    const std::string dir = mkdtemp(tmpl);
    const std::string file = dir + "/cluster.key";
    std::ofstream(file) << "7465737420636c7573746572206b6579206f6620746865206861726e65737321\n";
    chmod(file.c_str(), 0600);
    // Removed with the process (each test binary makes its own).
    static struct Remover {
      std::string dir;
      ~Remover() { std::filesystem::remove_all(dir); }
    } remover{dir};
    return file;
  }();
  return path;
}

std::unique_ptr<NodeProcess> NodeProcess::Start(const std::vector<std::string>& extra_args,
                                                const std::string& socket_path, std::string* log) {
  std::unique_ptr<NodeProcess> n(new NodeProcess());
  char tmpl[] = "/tmp/kvpool-it-XXXXXX";
  n->dir_ = mkdtemp(tmpl);
  n->socket_ = socket_path.empty() ? n->dir_ + "/node.sock" : socket_path;
  n->log_path_ = n->dir_ + "/node.log";
  std::vector<std::string> args = {NodeBinary(), "--socket", n->socket_, "--dram-capacity", "64MiB", "--slab-size", "1MiB",
                                    "--admin-port", "0", "--node-id", "test-node"};
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  // A node with a peer port needs the cluster key (or --insecure): a test's
  // cluster gets the harness's, unless the test chose a key or none.
  auto has = [&](const char* flag) {
    return std::find(extra_args.begin(), extra_args.end(), flag) != extra_args.end();
  };
  if ((has("--peers") || has("--etcd")) && !has("--cluster-key-file") && !has("--insecure")) {
    args.insert(args.end(), {"--cluster-key-file", TestClusterKeyFile()});
  }
  pid_t pid = fork();
  if (pid == 0) {
    int fd = ::open(n->log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    std::vector<char*> av;
    for (auto& a : args) av.push_back(a.data());
    av.push_back(nullptr);
    execv(av[0], av.data());
    _exit(127);
  }
  n->pid_ = pid;
  // Wait (bounded) for the startup line that carries the admin port.
  std::regex re("admin http://[0-9.]+:([0-9]+)");
  std::smatch m;
  std::string text;
  WaitFor(
      [&] {
        text = ReadFile(n->log_path_);
        if (std::regex_search(text, m, re)) return true;
        int st;
        if (waitpid(pid, &st, WNOHANG) != pid) return false;
        n->pid_ = -1;  // exited
        return true;
      },
      std::chrono::seconds(20), std::chrono::milliseconds(10));
  if (n->pid_ < 0 || m.empty()) {
    if (log != nullptr) *log = ReadFile(n->log_path_);
    return nullptr;  // exited, or not serving in 20 s (the destructor kills it)
  }
  n->admin_port_ = std::stoi(m[1]);
  for (size_t i = 0; i + 1 < extra_args.size(); ++i) {
    if (extra_args[i] != "--admin-token-file") continue;
    std::string token = ReadFile(extra_args[i + 1]);
    n->admin_token_ = token.substr(0, token.find('\n'));
  }
  return n;
}

NodeProcess::~NodeProcess() {
  if (pid_ > 0) Stop(SIGKILL);
  std::string cmd = "rm -rf '" + dir_ + "'";
  int r = system(cmd.c_str());
  (void)r;
}

int NodeProcess::Stop(int sig) {
  if (pid_ <= 0) return -1;
  kill(pid_, sig);
  int st = 0;
  waitpid(pid_, &st, 0);
  pid_ = -1;
  return st;
}

std::string NodeProcess::Log() const { return ReadFile(log_path_); }

std::string NodeProcess::HttpGetWithoutToken(const std::string& path, int* status) const {
  httplib::Client c("127.0.0.1", admin_port_);
  c.set_connection_timeout(5);
  c.set_read_timeout(5);
  auto res = c.Get(path.c_str());
  if (status != nullptr) *status = res ? res->status : 0;
  return res ? res->body : "";
}

std::string NodeProcess::HttpGet(const std::string& path, int* status) const {
  if (admin_token_.empty()) return HttpGetWithoutToken(path, status);
  httplib::Client c("127.0.0.1", admin_port_);
  c.set_connection_timeout(5);
  c.set_read_timeout(5);
  c.set_bearer_token_auth(admin_token_);
  auto res = c.Get(path.c_str());
  if (status != nullptr) *status = res ? res->status : 0;
  return res ? res->body : "";
}

std::string NodeProcess::HttpPost(const std::string& path, const std::string& body,
                                  int* status) const {
  httplib::Client c("127.0.0.1", admin_port_);
  c.set_connection_timeout(5);
  c.set_read_timeout(15);
  if (!admin_token_.empty()) c.set_bearer_token_auth(admin_token_);
  auto res = c.Post(path.c_str(), body, "application/json");
  if (status != nullptr) *status = res ? res->status : 0;
  return res ? res->body : "";
}

double NodeProcess::Metric(const std::string& series) const {
  std::string text = HttpGet("/metrics");
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.size() > series.size() && line.compare(0, series.size(), series) == 0 &&
        line[series.size()] == ' ') {
      return std::stod(line.substr(series.size() + 1));
    }
  }
  return -1;
}

int RunCommand(const std::vector<std::string>& argv, std::string* out, bool merge_stderr,
               const std::string& stdin_data) {
  int outp[2], inp[2];
  if (pipe(outp) != 0 || pipe(inp) != 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    dup2(inp[0], 0);
    dup2(outp[1], 1);
    if (merge_stderr) dup2(outp[1], 2);
    close(outp[0]);
    close(inp[1]);
    std::vector<char*> av;
    for (auto& a : argv) av.push_back(const_cast<char*>(a.c_str()));
    av.push_back(nullptr);
    execv(av[0], av.data());
    _exit(127);
  }
  close(outp[1]);
  close(inp[0]);
  std::thread writer([&] {
    size_t off = 0;
    while (off < stdin_data.size()) {
      ssize_t w = write(inp[1], stdin_data.data() + off, stdin_data.size() - off);
      if (w <= 0) break;
      off += static_cast<size_t>(w);
    }
    close(inp[1]);
  });
  out->clear();
  char buf[65536];
  ssize_t r;
  while ((r = read(outp[0], buf, sizeof(buf))) > 0) out->append(buf, static_cast<size_t>(r));
  close(outp[0]);
  writer.join();
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

std::string InChild(const std::function<std::string()>& fn) {
  int p[2];
  if (pipe(p) != 0) return "pipe failed";
  pid_t pid = fork();
  if (pid == 0) {
    close(p[0]);
    const std::string out = fn();
    size_t off = 0;
    while (off < out.size()) {
      ssize_t w = write(p[1], out.data() + off, out.size() - off);
      if (w <= 0) break;
      off += static_cast<size_t>(w);
    }
    _exit(0);
  }
  close(p[1]);
  std::string got;
  char buf[4096];
  for (ssize_t r; (r = read(p[0], buf, sizeof(buf))) > 0;) got.append(buf, static_cast<size_t>(r));
  close(p[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  if (WIFSIGNALED(st)) return "died:" + std::to_string(WTERMSIG(st));
  return got;
}

std::string AsUser(uid_t uid, const std::function<std::string()>& fn, gid_t gid) {
  return InChild([&] {
    if (setgroups(0, nullptr) != 0 || setresgid(gid, gid, gid) != 0 ||
        setresuid(uid, uid, uid) != 0) {
      return "cannot become uid " + std::to_string(uid);
    }
    return fn();
  });
}

std::vector<uint8_t> Pattern(uint64_t seed, size_t size) {
  std::vector<uint8_t> v(size);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < size; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(v.data() + i, &x, std::min<size_t>(8, size - i));
  }
  return v;
}

}  // namespace kvpool::testing
