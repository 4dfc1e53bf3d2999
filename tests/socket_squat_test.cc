// A squatted socket directory, tried as an attacker would: another uid
// makes the victim's per-user fallback directory (/tmp/kvpool-<uid>) or
// /run/kvpool and listens there. Every client the victim runs (the C ABI,
// kvpoolctl, the Python package) refuses it with a message naming the path,
// its owner and mode, and the squatter is never even connected to. The
// honest directories (a node of the victim's own, a root node in
// /run/kvpool) still serve. Runs in a private mount namespace with a fresh
// /run, so the host's /run/kvpool is neither seen nor touched. Needs root.
#include <gtest/gtest.h>
#include <grp.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "harness/node_process.h"
#include "kvpool/kvpool.h"

namespace kvpool::testing {
namespace {

constexpr uid_t kVictim = 64031;
constexpr uid_t kSquatter = 64032;
constexpr gid_t kNogroup = 65534;

// Runs argv (execv) as uid with env; returns "EXIT <code>\n" and its
// stdout and stderr.
std::string RunAs(uid_t uid, const std::vector<std::string>& argv,
                  const std::vector<std::string>& env) {
  return AsUser(uid, [&] {
    int p[2];
    if (pipe(p) != 0) return std::string("pipe failed");
    pid_t pid = fork();
    if (pid == 0) {
      dup2(p[1], 1);
      dup2(p[1], 2);
      close(p[0]);
      std::vector<char*> av, ev;
      for (const auto& a : argv) av.push_back(const_cast<char*>(a.c_str()));
      av.push_back(nullptr);
      for (const auto& e : env) ev.push_back(const_cast<char*>(e.c_str()));
      ev.push_back(nullptr);
      execve(av[0], av.data(), ev.data());
      _exit(127);
    }
    close(p[1]);
    std::string out;
    char buf[4096];
    for (ssize_t r; (r = read(p[0], buf, sizeof(buf))) > 0;) out.append(buf, static_cast<size_t>(r));
    close(p[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    return "EXIT " + std::to_string(WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st)) + "\n" +
           out;
  });
}

// A listener bound at `path` by the squatter, in a directory it made; it
// reports how many connections reached it.
class Squatter {
 public:
  explicit Squatter(const std::string& dir) : dir_(dir) {
    std::filesystem::remove_all(dir_);
    EXPECT_EQ(::mkdir(dir_.c_str(), 0755), 0) << dir_;
    EXPECT_EQ(::chown(dir_.c_str(), kSquatter, kNogroup), 0);
    int ready[2], done[2];
    EXPECT_EQ(pipe(ready), 0);
    EXPECT_EQ(pipe(done), 0);
    pid_ = fork();
    if (pid_ == 0) {
      if (setresgid(kNogroup, kNogroup, kNogroup) != 0 || setresuid(kSquatter, kSquatter, kSquatter) != 0) {
        _exit(2);
      }
      int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
      sockaddr_un a{};
      a.sun_family = AF_UNIX;
      const std::string path = dir_ + "/kvpool.sock";
      std::memcpy(a.sun_path, path.data(), path.size());
      if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(fd, 16) != 0) {
        _exit(3);
      }
      ::chmod(path.c_str(), 0777);
      ssize_t w = write(ready[1], "x", 1);
      (void)w;
      char c;
      // Until told to stop: count connections, answer nothing.
      uint8_t accepted = 0;
      while (read(done[0], &c, 1) <= 0 || c != 'q') {
      }
      while (::accept(fd, nullptr, nullptr) >= 0) ++accepted;
      w = write(ready[1], &accepted, 1);
      _exit(0);
    }
    ready_ = ready[0];
    done_ = done[1];
    close(ready[1]);
    close(done[0]);
    char x = 0;
    EXPECT_EQ(read(ready_, &x, 1), 1);
  }
  // Stops it; the connections it took.
  int Stop() {
    ssize_t w = write(done_, "q", 1);
    (void)w;
    uint8_t n = 255;
    if (read(ready_, &n, 1) != 1) n = 255;
    waitpid(pid_, nullptr, 0);
    close(ready_);
    close(done_);
    std::filesystem::remove_all(dir_);
    return n;
  }

 private:
  std::string dir_;
  pid_t pid_ = -1;
  int ready_ = -1, done_ = -1;
};

class SocketSquatTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root to run as other uids and mount /run";
    // A private /run: the host's stays as it is (ctest runs each test in a
    // process of its own).
    ASSERT_EQ(unshare(CLONE_NEWNS), 0) << std::strerror(errno);
    ASSERT_EQ(mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr), 0);
    ASSERT_EQ(mount("tmpfs", "/run", "tmpfs", 0, "mode=0755"), 0) << std::strerror(errno);
  }

  // The victim's three clients, default socket, no $XDG_RUNTIME_DIR: each
  // line "C|CTL|PY <outcome>".
  std::string VictimClients() {
    std::string c = AsUser(kVictim, [] {
      kvpool_options o;
      kvpool_options_init(&o);
      kvpool_status st;
      kvpool_client* cl = kvpool_open(&o, &st);
      if (cl != nullptr) {
        kvpool_close(cl);
        return std::string("opened");
      }
      return std::string(kvpool_status_name(st)) + " " + kvpool_last_error();
    });
    const std::vector<std::string> env = {"PATH=/usr/bin:/bin"};
    std::string ctl = RunAs(kVictim, {CtlBinary(), "stat"}, env);
    std::string py = RunAs(
        kVictim,
        {"/usr/bin/python3", "-c",
         "import kvpool\n"
         "try:\n"
         "    kvpool.Client().close(); print('opened')\n"
         "except kvpool.KvpoolError as e:\n"
         "    print(kvpool.StatusCode(e.code).name, e)\n"},
        {"PYTHONPATH=" KVPOOL_PYTHON_DIR, "KVPOOL_LIBRARY=" KVPOOL_LIBRARY_PATH,
         "PYTHONDONTWRITEBYTECODE=1"});
    return "C " + c + "\nCTL " + ctl + "\nPY " + py;
  }
};

TEST_F(SocketSquatTest, ASquattedFallbackDirectoryIsRefusedByEveryClientAndGetsNothing) {
  const std::string dir = "/tmp/kvpool-" + std::to_string(kVictim);
  Squatter squatter(dir);
  const std::string out = VictimClients();
  const std::string refusal = "refusing the socket " + dir + "/kvpool.sock: its directory " + dir +
                              " (owner uid " + std::to_string(kSquatter) + ", mode 755)";
  EXPECT_NE(out.find("C FailedPrecondition"), std::string::npos) << out;
  EXPECT_NE(out.find("CTL EXIT 3\n"), std::string::npos) << out;
  size_t n = 0;
  for (size_t at = 0; (at = out.find(refusal, at)) != std::string::npos; at += refusal.size()) ++n;
  EXPECT_EQ(n, 3u) << "C ABI, kvpoolctl and Python each name the path, owner and mode:\n" << out;
  EXPECT_NE(out.find("PY EXIT 0\nFAILED_PRECONDITION"), std::string::npos) << out;
  EXPECT_EQ(squatter.Stop(), 0) << "a client connected to the squatter";
}

TEST_F(SocketSquatTest, ASquattedRunKvpoolIsRefusedByEveryClientAndGetsNothing) {
  Squatter squatter("/run/kvpool");
  const std::string out = VictimClients();
  const std::string refusal =
      "refusing the socket /run/kvpool/kvpool.sock: its directory /run/kvpool (owner uid " +
      std::to_string(kSquatter) + ", mode 755) must belong to root, to this user";
  size_t n = 0;
  for (size_t at = 0; (at = out.find(refusal, at)) != std::string::npos; at += refusal.size()) ++n;
  EXPECT_EQ(n, 3u) << out;
  EXPECT_NE(out.find("C FailedPrecondition"), std::string::npos) << out;
  EXPECT_NE(out.find("CTL EXIT 3\n"), std::string::npos) << out;
  EXPECT_NE(out.find("PY EXIT 0\nFAILED_PRECONDITION"), std::string::npos) << out;
  EXPECT_EQ(squatter.Stop(), 0) << "a client connected to the squatter";
}

// The honest directories serve: the victim's own node in its private
// fallback, and a root node in /run/kvpool shared with the victim's group.
TEST_F(SocketSquatTest, HonestDirectoriesServeEveryClient) {
  const std::string own = "/tmp/kvpool-" + std::to_string(kVictim);
  std::filesystem::remove_all(own);
  // The victim's node makes its fallback itself (0700, its own).
  pid_t node = fork();
  if (node == 0) {
    if (setresgid(kNogroup, kNogroup, kNogroup) != 0 || setresuid(kVictim, kVictim, kVictim) != 0) {
      _exit(126);
    }
    const char* av[] = {KVPOOL_NODE_BIN_PATH, "--dram-capacity", "32MiB", "--admin-port", "0",
                        nullptr};
    char* ev[] = {nullptr};
    execve(av[0], const_cast<char**>(av), ev);
    _exit(127);
  }
  struct stat st;
  for (int i = 0; i < 200 && ::lstat((own + "/kvpool.sock").c_str(), &st) != 0; ++i) usleep(20000);
  std::string out = VictimClients();
  EXPECT_NE(out.find("C opened"), std::string::npos) << out;
  EXPECT_NE(out.find("CTL EXIT 0\n"), std::string::npos) << out;
  EXPECT_NE(out.find("PY EXIT 0\nopened"), std::string::npos) << out;
  kill(node, SIGTERM);
  waitpid(node, nullptr, 0);
  std::filesystem::remove_all(own);

  // A root node in /run/kvpool (made 0750, group nogroup: the victim's).
  std::string log;
  auto root_node = NodeProcess::Start({"--socket-group", "nogroup"}, "/run/kvpool/kvpool.sock", &log);
  ASSERT_NE(root_node, nullptr) << log;
  out = VictimClients();
  EXPECT_NE(out.find("C opened"), std::string::npos) << out;
  EXPECT_NE(out.find("CTL EXIT 0\n"), std::string::npos) << out;
  EXPECT_NE(out.find("PY EXIT 0\nopened"), std::string::npos) << out;
}

}  // namespace
}  // namespace kvpool::testing
