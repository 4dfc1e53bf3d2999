// kvpool-node: the cache daemon. Runs standalone with no flags.
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/log.h"
#include "common/sd_notify.h"
#include "common/settings.h"
#include "node/node.h"
#include "node/node_options.h"

int main(int argc, char** argv) {
  using namespace kvpool;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--version") == 0) {
      std::puts("kvpool-node " KVPOOL_VERSION);
      return 0;
    }
  }
  NodeOptions options;
  SettingsTable table;
  BuildNodeSettings(&options, &table);
  bool help = false;
  Status s = table.ParseArgs(argc, argv, &help);
  if (help) {
    std::fputs(table.HelpText("kvpool-node", "kvpool-node " KVPOOL_VERSION
                              ": a KV cache node for LLM inference (DRAM tier, local "
                              "zero-copy clients, admin HTTP).").c_str(), stdout);
    return 0;
  }
  if (!s.ok()) {
    std::fprintf(stderr, "kvpool-node: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  SetLogLevel(options.log_level);
  // The default socket's second location.
  if (const char* xdg = std::getenv("XDG_RUNTIME_DIR")) options.local.xdg_runtime_dir = xdg;
  // Every client, admin and peer connection is a descriptor: take all the
  // system allows, so connection caps and timeouts, not a soft limit of
  // 1024, decide who is served.
  rlimit nofile{};
  if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
    nofile.rlim_cur = nofile.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &nofile) != 0) LogWarn("cannot raise the descriptor limit");
  }

  // Signals are taken synchronously by this thread; every other thread
  // inherits the blocked mask.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);

  // A node that cannot go on (its id is live elsewhere) stops as SIGTERM
  // would stop it, and exits 1.
  static std::atomic<bool> fatal{false};
  auto node = Node::Start(options, table.ToJson(), [](const Status& why) {
    LogError("stopping: {}", why.ToString());
    fatal.store(true);
    ::kill(::getpid(), SIGTERM);
  });
  if (!node.ok()) {
    LogError("cannot start: {}", node.status().ToString());
    return 1;
  }
  // Under systemd (Type=notify): ready once the socket, the segment and the
  // admin endpoint serve.
  const char* notify_socket = std::getenv("NOTIFY_SOCKET");
  if (Status n = NotifyServiceManager(notify_socket, "READY=1\nSTATUS=serving"); !n.ok()) {
    LogWarn("cannot tell the service manager it is ready: {}", n.ToString());
  }
  int sig = 0;
  while (sigwait(&set, &sig) == 0 && sig == SIGHUP) {
  }
  if (!fatal.load()) LogInfo("signal {}: shutting down", sig);
  (void)NotifyServiceManager(notify_socket, "STOPPING=1\nSTATUS=stopping");
  (*node)->Stop();
  LogInfo("stopped");
  return fatal.load() ? 1 : 0;
}
