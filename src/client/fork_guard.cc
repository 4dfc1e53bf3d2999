#include "client/fork_guard.h"

#include <pthread.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <unordered_map>
#include <unordered_set>

namespace kvpool::client {
namespace {

struct Registry {
  std::mutex mu;
  std::unordered_set<int> fds;                    // protected by mu
  std::unordered_map<void*, size_t> mappings;     // protected by mu
  std::mutex reopen_mu;
  std::atomic<uint64_t> generation{0};
};

Registry& R() {
  static Registry* r = [] {
    auto* reg = new Registry();  // never destroyed: a forked child may run past exit handlers
    pthread_atfork(
        [] {
          R().reopen_mu.lock();
          R().mu.lock();
        },
        [] {
          R().mu.unlock();
          R().reopen_mu.unlock();
        },
        [] {
          Registry& g = R();
          // Only this thread exists now; the parent's connections and
          // mappings are the parent's.
          for (int fd : g.fds) ::close(fd);
          for (const auto& [base, size] : g.mappings) ::munmap(base, size);
          g.fds.clear();
          g.mappings.clear();
          g.generation.fetch_add(1, std::memory_order_acq_rel);
          g.mu.unlock();
          g.reopen_mu.unlock();
        });
    return reg;
  }();
  return *r;
}

}  // namespace

uint64_t ForkGeneration() { return R().generation.load(std::memory_order_acquire); }

int OpenForkSafeSocket(int domain, int type, int protocol) {
  std::lock_guard lock(R().mu);
  const int fd = ::socket(domain, type, protocol);
  if (fd >= 0) R().fds.insert(fd);
  return fd;
}

void CloseForkSafe(int fd) {
  if (fd < 0) return;
  std::lock_guard lock(R().mu);
  R().fds.erase(fd);
  ::close(fd);
}

void RegisterForkMapping(void* base, size_t size) {
  if (base == nullptr) return;
  std::lock_guard lock(R().mu);
  R().mappings[base] = size;
}

void UnregisterForkMapping(void* base) {
  if (base == nullptr) return;
  std::lock_guard lock(R().mu);
  R().mappings.erase(base);
}

std::mutex& ForkReopenMutex() { return R().reopen_mu; }

}  // namespace kvpool::client
