// The local backend of the C ABI: a pool of connections to the node's Unix
// socket and the mapped shared segment (see backend.h).
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "client/backend.h"
#include "client/fork_guard.h"
#include "client/local_connection.h"
#include "common/key_id.h"
#include "protocol/codec.h"
#include "protocol/socket_path.h"
#include "transport/peer_auth.h"

namespace kvpool::client {
namespace {

using protocol::MessageType;

// One mapping of a node's segment. Kept alive while any handle issued from
// it is outstanding, so pointers handed to the caller stay valid even when
// the node restarts.
struct Mapping {
  uint8_t* base = nullptr;
  uint64_t size = 0;
  uint64_t instance_id = 0;
  // The segment's file: a node serves one segment per tenant, so a new
  // connection reuses a mapping only of the same file.
  dev_t dev = 0;
  ino_t ino = 0;
  ~Mapping() {
    UnregisterForkMapping(base);
    if (base != nullptr) ::munmap(base, size);
  }
};

// Handles handed to the caller: connection slot (8 bits), the slot's
// generation (8 bits), the node's handle (48 bits). A handle from a dead
// connection is recognised by its generation and ignored.
constexpr int kSlotShift = 56;
constexpr int kGenShift = 48;
// 8 bits of the fork generation (client/fork_guard.h) the handle's backend
// belongs to: a handle a parent got is never taken for one of its forked
// child's own connections, whose slots and generations start over.
constexpr int kForkShift = 40;
constexpr uint64_t kNodeHandleMask = (1ull << kForkShift) - 1;

struct Slot {
  std::unique_ptr<LocalConnection> link;
  std::shared_ptr<Mapping> mapping;
  // The connection's staging area, where reservations are written when the
  // segment is mapped read-only (null: written in place).
  std::shared_ptr<Mapping> staging;
  uint8_t gen = 0;
  bool busy = false;
  int64_t outstanding = 0;  // handles of this generation not yet returned
};

uint64_t MakeHandle(int slot, uint8_t gen, uint8_t fork_tag, uint64_t node_handle) {
  return (static_cast<uint64_t>(slot) << kSlotShift) | (static_cast<uint64_t>(gen) << kGenShift) |
         (static_cast<uint64_t>(fork_tag) << kForkShift) | (node_handle & kNodeHandleMask);
}

std::vector<uint8_t> EncodeIds(std::span<const KeyId> keys) {
  std::vector<uint8_t> body;
  protocol::EncodeKeys(keys, &body);
  return body;
}

void FillStatuses(kvpool_status* statuses, size_t from, size_t to, const Status& s) {
  for (size_t i = from; i < to; ++i) statuses[i] = static_cast<kvpool_status>(s.code());
}

class LocalBackend;

// A connection lent to one call. Returned to the pool when destroyed.
class Lease {
 public:
  Lease(LocalBackend* c, int slot) : c_(c), slot_(slot) {}
  Lease(Lease&& o) noexcept : c_(o.c_), slot_(o.slot_) { o.c_ = nullptr; }
  ~Lease();
  int slot() const { return slot_; }
  Slot& s();  // safe: busy flag gives exclusive use
  LocalConnection* link() { return s().link.get(); }

 private:
  LocalBackend* c_;
  int slot_;
};

class LocalBackend final : public ClientBackend, public LocalNodeOps {
 public:
  explicit LocalBackend(const kvpool_options& o) : options_(o) {
    // The C ABI has no main to read the environment: the default location's
    // $XDG_RUNTIME_DIR candidate is read here.
    socket_path_ = o.socket_path != nullptr
                       ? std::string(o.socket_path)
                       : protocol::FindDefaultSocket(std::getenv("XDG_RUNTIME_DIR"), ::geteuid());
    dir_kind_ = protocol::KindOfSocketDir(protocol::SocketDirOf(socket_path_),
                                          std::getenv("XDG_RUNTIME_DIR"), ::geteuid());
    if (o.tenant_token_file != nullptr) tenant_token_file_ = o.tenant_token_file;
    client_name_ = o.client_name != nullptr ? o.client_name : program_invocation_short_name;
    options_.socket_path = nullptr;  // the caller's strings are not kept
    options_.remote_peers = nullptr;
    options_.remote_token_file = nullptr;
    options_.tenant_token_file = nullptr;
    options_.client_name = nullptr;
    slots_.resize(o.max_connections);
  }

  // Reads the tenant token, then connects the first connection.
  Status Start() {
    if (!tenant_token_file_.empty()) {
      KVPOOL_ASSIGN_OR_RETURN(std::vector<transport::ClusterKey> tokens,
                              transport::LoadClientTokenFile(tenant_token_file_));
      token_ = LocalConnection::TenantToken{tokens.front().principal, tokens.front().bytes};
    }
    return Borrow(DeadlineOf()).status();
  }

  Status PutInPlace(std::span<const KeyId> keys, const void* const* values, const uint64_t* sizes,
                    const kvpool_descriptor* descs, kvpool_status* statuses);
  void CopyAndCommit(Lease& lease, SteadyClock::time_point deadline, bool staged,
                     const std::vector<size_t>& idx, const kvpool_region* regions,
                     const void* const* values, const uint64_t* sizes, kvpool_status* statuses);
  Status Put(std::span<const KeyId> keys, const void* const* values, const uint64_t* sizes,
             const kvpool_descriptor* descs, kvpool_status* statuses) override;
  Status Get(std::span<const KeyId> keys, void* const* buffers, const uint64_t* capacities,
             uint64_t* sizes, kvpool_status* statuses) override;
  Status Exists(std::span<const KeyId> keys, uint8_t* hits, size_t* prefix_len) override;
  uint64_t MaxValueBytes() override {
    std::lock_guard lock(mu_);
    return hello_.max_value_bytes;
  }
  LocalNodeOps* node_ops() override { return this; }

  Status Reserve(std::span<const KeyId> keys, const uint64_t* sizes, const kvpool_descriptor* descs,
                 kvpool_region* regions, kvpool_status* statuses) override;
  Status Commit(std::span<const uint64_t> handles, kvpool_status* statuses) override;
  Status Abort(std::span<const uint64_t> handles) override {
    return ReturnHandles(MessageType::kAbort, handles);
  }
  Status Acquire(std::span<const KeyId> keys, kvpool_region* regions,
                 kvpool_status* statuses) override;
  Status Release(std::span<const uint64_t> handles) override {
    return ReturnHandles(MessageType::kRelease, handles);
  }
  Status Remove(std::span<const KeyId> keys, kvpool_status* statuses) override;
  Result<std::string> StatsJson() override;
  Status Flush() override;
  Result<uint64_t> ClearNamespace(uint32_t tag) override;
  Result<std::string> LookupPrefix(std::span<const uint64_t> hashes, uint32_t timeout_ms) override;
  Status Hint(uint32_t op, std::span<const KeyId> keys, uint64_t ttl_ms, uint32_t priority,
              kvpool_hint_result* result) override;

 private:
  friend class Lease;

  SteadyClock::time_point DeadlineOf() const {
    return SteadyClock::now() + std::chrono::milliseconds(options_.timeout_ms);
  }
  void RetireLocked(int slot);
  Status ConnectSlot(int slot, SteadyClock::time_point deadline);
  Result<Lease> Borrow(SteadyClock::time_point deadline, int want = -1);
  template <typename Fn>
  Status WithConnection(Fn&& fn);
  // Runs fn(lease, idx) for the handles of each live connection (idx: their
  // positions in handles; zero handles skipped). The handles of a dead
  // connection are forgotten and given to dead(idx). Fails when a
  // connection cannot be borrowed in time.
  template <typename Fn, typename Dead>
  Status ForEachConnection(std::span<const uint64_t> handles, Fn&& fn, Dead&& dead);
  void AddOutstanding(int slot, int64_t n) {
    std::lock_guard lock(mu_);
    slots_[slot].outstanding += n;
  }
  void ReturnRetired(uint16_t key, int64_t n);
  uint32_t MaxBatch() {
    std::lock_guard lock(mu_);
    return std::max<uint32_t>(1, hello_.max_batch);
  }
  Status ReturnHandles(MessageType type, std::span<const uint64_t> handles);
  // One request on a borrowed connection and its reply (a retry on a
  // fresh connection as WithConnection does).
  Status OneCall(MessageType type, std::vector<uint8_t> body, std::vector<uint8_t>* reply);
  Status ZeroCopyAllowed() const {
    if (options_.copy_mode) {
      return FailedPrecondition("zero-copy calls need the mapped segment (copy_mode is on)");
    }
    return Status::Ok();
  }
  template <typename BodyOf>
  Status Regions(size_t n, MessageType type, BodyOf&& body_of, kvpool_region* regions,
                 kvpool_status* statuses);
  Status RegionCall(Lease& lease, SteadyClock::time_point deadline, MessageType type,
                    const std::vector<uint8_t>& body, size_t n, kvpool_region* regions,
                    kvpool_status* statuses);

  kvpool_options options_{};
  const uint8_t fork_tag_ = static_cast<uint8_t>(ForkGeneration());  // stamped on handles
  std::string socket_path_;
  // Whether socket_path_ is in one of this user's own default directories.
  protocol::SocketDirKind dir_kind_ = protocol::SocketDirKind::kShared;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Slot> slots_;                                  // protected by mu_
  std::shared_ptr<Mapping> mapping_;                         // protected by mu_
  // Handles of replaced connections, by slot and generation: the mappings
  // their pointers point into stay until they are all returned.
  struct Retired {
    std::shared_ptr<Mapping> mapping;
    std::shared_ptr<Mapping> staging;
    int64_t outstanding = 0;
  };
  std::map<uint16_t, Retired> retired_;  // mu_
  std::string tenant_token_file_;
  std::string client_name_;  // told to the node in each connection's hello
  std::optional<LocalConnection::TenantToken> token_;  // set by Start
  protocol::HelloReply hello_;                               // protected by mu_
};

Lease::~Lease() {
  if (c_ == nullptr) return;
  std::lock_guard lock(c_->mu_);
  c_->slots_[slot_].busy = false;
  c_->cv_.notify_all();
}

Slot& Lease::s() { return c_->slots_[slot_]; }

// Moves a slot's outstanding handles to the retired table before the slot's
// connection is replaced. REQUIRES: mu_ held.
void LocalBackend::RetireLocked(int slot) {
  Slot& s = slots_[slot];
  if (s.outstanding > 0 && s.mapping) {
    retired_[static_cast<uint16_t>(slot << 8 | s.gen)] = {s.mapping, s.staging, s.outstanding};
  }
  s.outstanding = 0;
  s.link.reset();
  s.mapping.reset();
  s.staging.reset();
  s.gen = static_cast<uint8_t>(s.gen + 1);
}

// Connects slot `slot` (owned by the caller through its lease).
Status LocalBackend::ConnectSlot(int slot, SteadyClock::time_point deadline) {
  KVPOOL_ASSIGN_OR_RETURN(auto link, LocalConnection::Connect(socket_path_, client_name_, deadline,
                                                              options_.expected_server_uid,
                                                              token_ ? &*token_ : nullptr,
                                                              dir_kind_));
  link->set_spin(std::chrono::microseconds(options_.spin_us));
  int fd = link->TakeSegmentFd();
  const uint64_t staging_bytes = link->hello().staging_bytes;
  std::shared_ptr<Mapping> staging;
  if (int sfd = link->TakeStagingFd(); sfd >= 0) {
    if (staging_bytes > 0 && !options_.copy_mode) {
      // Written by this process, read by the node's commit; pages appear
      // as they are first written.
      void* p = ::mmap(nullptr, staging_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, sfd, 0);
      int err = errno;
      ::close(sfd);
      if (p == MAP_FAILED) {
        if (fd >= 0) ::close(fd);
        return ErrnoStatus("mmap of the connection's staging area", err);
      }
      staging = std::make_shared<Mapping>();
      staging->base = static_cast<uint8_t*>(p);
      staging->size = staging_bytes;
      // A forked child must never write into this connection's staging.
      RegisterForkMapping(p, staging_bytes);
    } else {
      ::close(sfd);
    }
  }
  if (staging_bytes > 0 && !options_.copy_mode && !staging) {
    if (fd >= 0) ::close(fd);
    return Internal("the node did not pass the connection's staging area");
  }
  std::shared_ptr<Mapping> mapping;
  struct stat seg_stat {};
  if (fd >= 0 && fstat(fd, &seg_stat) != 0) seg_stat = {};
  {
    std::lock_guard lock(mu_);
    if (mapping_ && mapping_->instance_id == link->hello().instance_id &&
        mapping_->dev == seg_stat.st_dev && mapping_->ino == seg_stat.st_ino) {
      mapping = mapping_;
    }
  }
  if (!mapping && !options_.copy_mode) {
    if (fd < 0) return Internal("the node did not pass its segment");
    auto m = std::make_shared<Mapping>();
    m->size = link->hello().segment_bytes;
    m->instance_id = link->hello().instance_id;
    m->dev = seg_stat.st_dev;
    m->ino = seg_stat.st_ino;
    // MAP_POPULATE builds the page tables now, so the first get does not
    // take a minor fault per 4 KiB page.
    // Read-only when the node gave a staging area: the fd is sealed
    // against writable mappings then.
    int prot = staging_bytes > 0 ? PROT_READ : PROT_READ | PROT_WRITE;
    void* p = ::mmap(nullptr, m->size, prot, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      return ErrnoStatus("mmap of the node's segment", err);
    }
    m->base = static_cast<uint8_t*>(p);
    RegisterForkMapping(p, m->size);
    mapping = m;
  }
  if (fd >= 0) ::close(fd);
  std::lock_guard lock(mu_);
  if (mapping && mapping_ != mapping) mapping_ = mapping;
  hello_ = link->hello();
  Slot& s = slots_[slot];
  RetireLocked(slot);
  s.link = std::move(link);
  s.mapping = mapping;
  s.staging = std::move(staging);
  return Status::Ok();
}

// Lends a connected connection: `want` >= 0 asks for that slot (handles are
// bound to their connection), else any.
Result<Lease> LocalBackend::Borrow(SteadyClock::time_point deadline, int want) {
  int chosen = -1;
  bool need_connect = false;
  {
    std::unique_lock lock(mu_);
    while (true) {
      if (want >= 0) {
        if (!slots_[want].busy) chosen = want;
      } else {
        for (size_t i = 0; i < slots_.size(); ++i) {
          if (!slots_[i].busy && slots_[i].link && !slots_[i].link->broken()) {
            chosen = static_cast<int>(i);
            break;
          }
        }
        if (chosen < 0) {
          for (size_t i = 0; i < slots_.size(); ++i) {
            if (!slots_[i].busy) {
              chosen = static_cast<int>(i);
              break;
            }
          }
        }
      }
      if (chosen >= 0) break;
      if (cv_.wait_until(lock, deadline) == std::cv_status::timeout) {
        return DeadlineExceeded("no free connection to the node in time");
      }
    }
    slots_[chosen].busy = true;
    need_connect = !slots_[chosen].link || slots_[chosen].link->broken();
  }
  Lease lease(this, chosen);
  if (need_connect && want < 0) KVPOOL_RETURN_IF_ERROR(ConnectSlot(chosen, deadline));
  return lease;
}

// Runs fn(lease) on a connection; when the connection breaks and the client
// reconnects, retries once on a fresh one. fn must be safe to repeat.
template <typename Fn>
Status LocalBackend::WithConnection(Fn&& fn) {
  auto deadline = DeadlineOf();
  for (int attempt = 0;; ++attempt) {
    auto lease = Borrow(deadline);
    if (!lease.ok()) return lease.status();
    Status s = fn(*lease, deadline);
    if (s.ok() || !lease->link()->broken() || !options_.reconnect || attempt > 0 ||
        s.code() == StatusCode::kDeadlineExceeded) {
      return s;
    }
  }
}

template <typename Fn, typename Dead>
Status LocalBackend::ForEachConnection(std::span<const uint64_t> handles, Fn&& fn, Dead&& dead) {
  std::map<uint16_t, std::vector<size_t>> by_conn;
  std::vector<size_t> foreign;  // another process's (a parent's before a fork)
  for (size_t i = 0; i < handles.size(); ++i) {
    if (handles[i] == 0) continue;
    if (static_cast<uint8_t>(handles[i] >> kForkShift) != fork_tag_) {
      foreign.push_back(i);
      continue;
    }
    by_conn[static_cast<uint16_t>(handles[i] >> kGenShift)].push_back(i);
  }
  if (!foreign.empty()) dead(foreign);
  auto deadline = DeadlineOf();
  for (auto& [key, idx] : by_conn) {
    int slot = key >> 8;
    uint8_t gen = key & 0xff;
    if (slot >= static_cast<int>(slots_.size())) continue;
    auto lease = Borrow(deadline, slot);
    if (!lease.ok()) return lease.status();
    if (lease->s().gen != gen || !lease->link() || lease->link()->broken()) {
      // The connection died: the node dropped its pins and reservations.
      ReturnRetired(key, static_cast<int64_t>(idx.size()));
      dead(idx);
      continue;
    }
    AddOutstanding(slot, -static_cast<int64_t>(idx.size()));
    fn(*lease, deadline, idx);
  }
  return Status::Ok();
}

// Forgets handles of a dead generation; drops its mapping when none are left.
void LocalBackend::ReturnRetired(uint16_t key, int64_t n) {
  std::lock_guard lock(mu_);
  auto it = retired_.find(key);
  if (it == retired_.end()) return;
  it->second.outstanding -= n;
  if (it->second.outstanding <= 0) retired_.erase(it);
}

// Sends handles (release or abort) grouped by the connection they belong to.
Status LocalBackend::ReturnHandles(MessageType type, std::span<const uint64_t> handles) {
  return ForEachConnection(
      handles,
      [&](Lease& lease, SteadyClock::time_point deadline, const std::vector<size_t>& idx) {
        std::vector<uint64_t> list;
        for (size_t i : idx) list.push_back(handles[i] & kNodeHandleMask);
        std::vector<uint8_t> body;
        protocol::EncodeHandles(list, &body);
        iovec iov{body.data(), body.size()};
        Status s = lease.link()->Send(type, std::span(&iov, 1), deadline);
        (void)s;  // a dead connection released everything on the node already
      },
      [](const std::vector<size_t>&) {});
}

// Reserve or acquire a chunk of items on one lease; fills regions with
// caller-visible handles and pointers.
Status LocalBackend::RegionCall(Lease& lease, SteadyClock::time_point deadline, MessageType type,
                                const std::vector<uint8_t>& body, size_t n, kvpool_region* regions,
                                kvpool_status* statuses) {
  iovec iov{const_cast<uint8_t*>(body.data()), body.size()};
  std::vector<uint8_t> reply;
  KVPOOL_RETURN_IF_ERROR(lease.link()->Call(type, std::span(&iov, 1), deadline, &reply));
  std::vector<protocol::RegionItem> items;
  KVPOOL_RETURN_IF_ERROR(protocol::DecodeRegionItems(reply, protocol::kMaxBatch, &items));
  if (items.size() != n) return Internal("reply item count does not match the request");
  // Reservations point into the staging area when there is one.
  const bool reserve = type == MessageType::kReserve || type == MessageType::kReserveDescribed;
  const Mapping* into =
      reserve && lease.s().staging ? lease.s().staging.get() : lease.s().mapping.get();
  uint8_t* base = into != nullptr ? into->base : nullptr;
  uint64_t seg = into != nullptr ? into->size : 0;
  int64_t handed = 0;
  for (size_t i = 0; i < n; ++i) {
    statuses[i] = items[i].status;
    regions[i] = {nullptr, items[i].size, 0};
    if (items[i].status != 0) continue;
    if (items[i].offset + items[i].size > seg || base == nullptr) {
      return Internal("node returned a region outside the segment");
    }
    regions[i].data = base + items[i].offset;
    regions[i].handle = MakeHandle(lease.slot(), lease.s().gen, fork_tag_, items[i].handle);
    ++handed;
  }
  AddOutstanding(lease.slot(), handed);
  return Status::Ok();
}

// Reserve or acquire n items: every chunk on one connection, so the caller
// can commit them together; body_of(off, m) encodes items [off, off + m).
template <typename BodyOf>
Status LocalBackend::Regions(size_t n, MessageType type, BodyOf&& body_of, kvpool_region* regions,
                             kvpool_status* statuses) {
  KVPOOL_RETURN_IF_ERROR(ZeroCopyAllowed());
  uint32_t max_batch = MaxBatch();
  // Batches above the node's limit are split on that connection.
  Status s = WithConnection([&](Lease& lease, SteadyClock::time_point deadline) -> Status {
    for (size_t off = 0; off < n; off += max_batch) {
      size_t m = std::min<size_t>(max_batch, n - off);
      KVPOOL_RETURN_IF_ERROR(
          RegionCall(lease, deadline, type, body_of(off, m), m, regions + off, statuses + off));
    }
    return Status::Ok();
  });
  if (!s.ok()) FillStatuses(statuses, 0, n, s);
  return s;
}

// A reserve or put request's head: the sized keys of [off, off + m) and,
// when any of them is described, their descriptors (*type tells which).
static std::vector<uint8_t> SizedHead(std::span<const KeyId> keys, const uint64_t* sizes,
                                      const kvpool_descriptor* descs, size_t off, size_t m,
                                      bool put, MessageType* type) {
  std::vector<protocol::SizedKey> items(m);
  for (size_t i = 0; i < m; ++i) items[i] = {keys[off + i], sizes[off + i]};
  std::vector<protocol::KeyDescriptor> described;
  for (size_t i = 0; descs != nullptr && i < m; ++i) {
    const kvpool_descriptor& d = descs[off + i];
    if (d.size == 0 || d.data == nullptr) continue;
    described.push_back({keys[off + i], {static_cast<const uint8_t*>(d.data), d.size}});
  }
  std::vector<uint8_t> body;
  if (described.empty()) {
    *type = put ? MessageType::kPut : MessageType::kReserve;
    protocol::EncodeSizedKeys(items, &body);
  } else {
    *type = put ? MessageType::kPutDescribed : MessageType::kReserveDescribed;
    protocol::EncodeDescribedSizedKeys(items, described, &body);
  }
  return body;
}

Status LocalBackend::Reserve(std::span<const KeyId> keys, const uint64_t* sizes,
                             const kvpool_descriptor* descs, kvpool_region* regions,
                             kvpool_status* statuses) {
  KVPOOL_RETURN_IF_ERROR(ZeroCopyAllowed());
  uint32_t max_batch = MaxBatch();
  const size_t n = keys.size();
  Status s = WithConnection([&](Lease& lease, SteadyClock::time_point deadline) -> Status {
    for (size_t off = 0; off < n; off += max_batch) {
      size_t m = std::min<size_t>(max_batch, n - off);
      MessageType type;
      std::vector<uint8_t> body = SizedHead(keys, sizes, descs, off, m, false, &type);
      KVPOOL_RETURN_IF_ERROR(
          RegionCall(lease, deadline, type, body, m, regions + off, statuses + off));
    }
    return Status::Ok();
  });
  if (!s.ok()) FillStatuses(statuses, 0, n, s);
  return s;
}

Status LocalBackend::Commit(std::span<const uint64_t> handles, kvpool_status* statuses) {
  for (size_t i = 0; i < handles.size(); ++i) statuses[i] = KVPOOL_INVALID_ARGUMENT;
  uint32_t max_batch = MaxBatch();
  return ForEachConnection(
      handles,
      [&](Lease& lease, SteadyClock::time_point deadline, const std::vector<size_t>& idx) {
        for (size_t off = 0; off < idx.size(); off += max_batch) {
          size_t m = std::min<size_t>(max_batch, idx.size() - off);
          std::vector<uint64_t> list(m);
          for (size_t i = 0; i < m; ++i) list[i] = handles[idx[off + i]] & kNodeHandleMask;
          std::vector<uint8_t> body, reply;
          protocol::EncodeHandles(list, &body);
          iovec iov{body.data(), body.size()};
          Status s =
              lease.link()->Call(MessageType::kCommit, std::span(&iov, 1), deadline, &reply);
          std::vector<int32_t> st;
          if (s.ok()) s = protocol::DecodeStatuses(reply, protocol::kMaxBatch, &st);
          if (s.ok() && st.size() != m) s = Internal("reply item count does not match the request");
          for (size_t i = 0; i < m; ++i) {
            statuses[idx[off + i]] = s.ok() ? st[i] : static_cast<kvpool_status>(s.code());
          }
        }
      },
      [&](const std::vector<size_t>& idx) {
        for (size_t i : idx) statuses[i] = KVPOOL_UNAVAILABLE;
      });
}

Status LocalBackend::Acquire(std::span<const KeyId> keys, kvpool_region* regions,
                             kvpool_status* statuses) {
  auto body_of = [&](size_t off, size_t m) { return EncodeIds(keys.subspan(off, m)); };
  return Regions(keys.size(), MessageType::kAcquire, body_of, regions, statuses);
}

// One reserve batch of a put: reserve, copy, commit, on one connection
// held throughout, so no other thread's put takes this connection's
// staging room between the reserve and the commit.
Status LocalBackend::PutInPlace(std::span<const KeyId> keys, const void* const* values,
                                const uint64_t* sizes, const kvpool_descriptor* descs,
                                kvpool_status* statuses) {
  const size_t n = keys.size();
  const uint32_t max_batch = MaxBatch();
  bool staged;
  {
    std::lock_guard lock(mu_);
    staged = hello_.staging_bytes > 0;
  }
  std::vector<kvpool_region> regions(n);
  Status s = WithConnection([&](Lease& lease, SteadyClock::time_point deadline) -> Status {
    for (size_t off = 0; off < n; off += max_batch) {
      size_t m = std::min<size_t>(max_batch, n - off);
      MessageType type;
      std::vector<uint8_t> body = SizedHead(keys, sizes, descs, off, m, false, &type);
      KVPOOL_RETURN_IF_ERROR(
          RegionCall(lease, deadline, type, body, m, regions.data() + off, statuses + off));
    }
    std::vector<size_t> idx;
    for (size_t i = 0; i < n; ++i) {
      if (statuses[i] == KVPOOL_OK) idx.push_back(i);
    }
    if (!idx.empty()) {
      CopyAndCommit(lease, deadline, staged, idx, regions.data(), values, sizes, statuses);
    }
    return Status::Ok();
  });
  if (!s.ok()) FillStatuses(statuses, 0, n, s);
  return s;
}

// The reserved items idx, copied into their regions and committed on the
// lease they were reserved on. With a staging area the commits go in chunks
// without waiting for each answer: the node copies one chunk from the
// staging area into the segment while this thread copies the next. Sets
// statuses[idx[k]].
void LocalBackend::CopyAndCommit(Lease& lease, SteadyClock::time_point deadline, bool staged,
                                 const std::vector<size_t>& idx, const kvpool_region* regions,
                                 const void* const* values, const uint64_t* sizes,
                                 kvpool_status* statuses) {
  AddOutstanding(lease.slot(), -static_cast<int64_t>(idx.size()));
  uint64_t total = 0;
  for (size_t i : idx) total += sizes[i];
  // About eight chunks, none under 256 KiB: enough to overlap the two
  // copies, few enough that the frames cost nothing. In place, the node
  // copies nothing: one commit per batch.
  const uint64_t chunk_bytes =
      staged ? std::max<uint64_t>(256 << 10, total / 8) : std::numeric_limits<uint64_t>::max();
  const size_t max_batch = MaxBatch();
  std::vector<std::pair<size_t, size_t>> chunks;  // [begin, end) into idx
  std::vector<uint64_t> ids;
  Status s = Status::Ok();
  for (size_t b = 0; b < idx.size() && s.ok();) {
    size_t e = b;
    uint64_t bytes = 0;
    std::vector<uint64_t> list;
    while (e < idx.size() && e - b < max_batch && (e == b || bytes < chunk_bytes)) {
      const size_t i = idx[e++];
      std::memcpy(regions[i].data, values[i], sizes[i]);
      bytes += sizes[i];
      list.push_back(regions[i].handle & kNodeHandleMask);
    }
    std::vector<uint8_t> body;
    protocol::EncodeHandles(list, &body);
    iovec iov{body.data(), body.size()};
    auto id = lease.link()->Begin(MessageType::kCommit, std::span(&iov, 1), deadline);
    if (!id.ok()) {
      s = id.status();
      break;
    }
    chunks.emplace_back(b, e);
    ids.push_back(*id);
    b = e;
  }
  // Items of chunks never sent keep the send's failure.
  const kvpool_status unsent = s.ok() ? KVPOOL_INTERNAL : static_cast<kvpool_status>(s.code());
  for (size_t i : idx) statuses[i] = unsent;
  for (size_t k = 0; k < chunks.size(); ++k) {
    auto [b, e] = chunks[k];
    std::vector<uint8_t> reply;
    Status rs = lease.link()->Finish(MessageType::kCommit, ids[k], deadline, &reply);
    std::vector<int32_t> st;
    if (rs.ok()) rs = protocol::DecodeStatuses(reply, protocol::kMaxBatch, &st);
    if (rs.ok() && st.size() != e - b) rs = Internal("reply item count does not match the request");
    for (size_t j = b; j < e; ++j) {
      statuses[idx[j]] = rs.ok() ? st[j - b] : static_cast<kvpool_status>(rs.code());
    }
  }
}

Status LocalBackend::Put(std::span<const KeyId> keys, const void* const* values,
                         const uint64_t* sizes, const kvpool_descriptor* descs,
                         kvpool_status* statuses) {
  size_t n = keys.size();
  if (!options_.copy_mode) {
    // Reserve, copy into the segment (or the connection's staging area),
    // commit: one memcpy per value here. With a staging area, each reserve
    // batch must fit it: the batch is cut where it would not.
    uint64_t staging = 0;
    {
      std::lock_guard lock(mu_);
      staging = hello_.staging_bytes;
    }
    for (size_t off = 0; off < n;) {
      size_t m = 0;
      uint64_t bytes = 0;
      while (off + m < n) {
        uint64_t add = protocol::StagingBytes(sizes[off + m]);
        if (staging > 0 && m > 0 && bytes + add > staging) break;
        bytes += add;
        ++m;
      }
      Status s = PutInPlace(keys.subspan(off, m), values + off, sizes + off,
                            descs != nullptr ? descs + off : nullptr, statuses + off);
      if (!s.ok()) {
        FillStatuses(statuses, off + m, n, s);
        return s;
      }
      off += m;
    }
    return Status::Ok();
  }
  // Copy mode: values travel inline, in frames under the node's limit.
  uint64_t max_frame, max_batch;
  {
    std::lock_guard lock(mu_);
    max_frame = hello_.max_frame_bytes;
    max_batch = std::max<uint32_t>(1, hello_.max_batch);
  }
  size_t off = 0;
  while (off < n) {
    size_t m = 0;
    uint64_t bytes = 4;
    while (off + m < n && m < max_batch) {
      uint64_t add = 24 + sizes[off + m];
      if (descs != nullptr) add += 20 + descs[off + m].size;
      if (m > 0 && bytes + add > max_frame) break;
      bytes += add;
      ++m;
    }
    Status s = WithConnection([&](Lease& lease, SteadyClock::time_point deadline) -> Status {
      MessageType type;
      std::vector<uint8_t> head = SizedHead(keys, sizes, descs, off, m, true, &type);
      std::vector<uint8_t> reply;
      std::vector<iovec> iov;
      iov.push_back({head.data(), head.size()});
      for (size_t i = 0; i < m; ++i)
        iov.push_back({const_cast<void*>(values[off + i]), sizes[off + i]});
      KVPOOL_RETURN_IF_ERROR(lease.link()->Call(type, iov, deadline, &reply));
      std::vector<int32_t> st;
      KVPOOL_RETURN_IF_ERROR(protocol::DecodeStatuses(reply, protocol::kMaxBatch, &st));
      if (st.size() != m) return Internal("reply item count does not match the request");
      for (size_t i = 0; i < m; ++i) statuses[off + i] = st[i];
      return Status::Ok();
    });
    if (!s.ok()) {
      FillStatuses(statuses, off, off + m, s);
      return s;
    }
    off += m;
  }
  return Status::Ok();
}

Status LocalBackend::Get(std::span<const KeyId> keys, void* const* buffers,
                         const uint64_t* capacities, uint64_t* sizes, kvpool_status* statuses) {
  size_t n = keys.size();
  if (!options_.copy_mode) {
    // Acquire, copy out of the segment, release: one memcpy per value.
    std::vector<kvpool_region> regions(n);
    KVPOOL_RETURN_IF_ERROR(Acquire(keys, regions.data(), statuses));
    std::vector<uint64_t> handles;
    handles.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      sizes[i] = regions[i].size;
      if (statuses[i] != KVPOOL_OK) continue;
      handles.push_back(regions[i].handle);
      if (regions[i].size > capacities[i]) {
        statuses[i] = KVPOOL_RESOURCE_EXHAUSTED;
        continue;
      }
      std::memcpy(buffers[i], regions[i].data, regions[i].size);
    }
    if (!handles.empty()) Release(handles).IgnoreError();  // a dead connection released them
    return Status::Ok();
  }
  uint64_t max_frame, max_batch, max_value;
  {
    std::lock_guard lock(mu_);
    max_frame = hello_.max_frame_bytes;
    max_batch = std::max<uint32_t>(1, hello_.max_batch);
    max_value = hello_.max_value_bytes;
  }
  size_t off = 0;
  while (off < n) {
    size_t m = 0;
    uint64_t bytes = 4;
    while (off + m < n && m < max_batch) {
      uint64_t add = 12 + std::min(capacities[off + m], max_value);
      if (m > 0 && bytes + add > max_frame) break;
      bytes += add;
      ++m;
    }
    KVPOOL_RETURN_IF_ERROR(WithConnection([&](Lease& lease,
                                              SteadyClock::time_point deadline) -> Status {
      std::vector<protocol::SizedKey> items(m);
      for (size_t i = 0; i < m; ++i) items[i] = {keys[off + i], capacities[off + i]};
      std::vector<uint8_t> body, reply;
      protocol::EncodeSizedKeys(items, &body);
      iovec iov{body.data(), body.size()};
      KVPOOL_RETURN_IF_ERROR(lease.link()->Call(MessageType::kGet, std::span(&iov, 1), deadline, &reply));
      std::vector<protocol::GetItem> got;
      std::span<const uint8_t> data;
      KVPOOL_RETURN_IF_ERROR(protocol::DecodeGetReply(reply, protocol::kMaxBatch, &got, &data));
      if (got.size() != m) return Internal("reply item count does not match the request");
      uint64_t pos = 0;
      for (size_t i = 0; i < m; ++i) {
        statuses[off + i] = got[i].status;
        sizes[off + i] = got[i].size;
        if (got[i].status != 0) continue;
        if (got[i].size > capacities[off + i])
          return Internal("node returned more than the buffer holds");
        std::memcpy(buffers[off + i], data.data() + pos, got[i].size);
        pos += got[i].size;
      }
      return Status::Ok();
    }));
    off += m;
  }
  return Status::Ok();
}

Status LocalBackend::Exists(std::span<const KeyId> keys, uint8_t* hits, size_t* prefix_len) {
  size_t n = keys.size();
  uint32_t max_batch = MaxBatch();
  size_t prefix = 0;
  bool in_prefix = true;
  for (size_t off = 0; off < n; off += max_batch) {
    size_t m = std::min<size_t>(max_batch, n - off);
    std::vector<uint8_t> body = EncodeIds(keys.subspan(off, m));
    protocol::ExistsReply rep;
    KVPOOL_RETURN_IF_ERROR(WithConnection([&](Lease& lease,
                                              SteadyClock::time_point deadline) -> Status {
      iovec iov{body.data(), body.size()};
      std::vector<uint8_t> reply;
      KVPOOL_RETURN_IF_ERROR(lease.link()->Call(MessageType::kExists, std::span(&iov, 1), deadline, &reply));
      KVPOOL_RETURN_IF_ERROR(protocol::DecodeExistsReply(reply, protocol::kMaxBatch, &rep));
      if (rep.hits.size() != m) return Internal("reply item count does not match the request");
      return Status::Ok();
    }));
    if (hits != nullptr) std::memcpy(hits + off, rep.hits.data(), m);
    if (in_prefix) {
      prefix += rep.prefix_len;
      if (rep.prefix_len < m) in_prefix = false;
    }
  }
  if (prefix_len != nullptr) *prefix_len = prefix;
  return Status::Ok();
}

Status LocalBackend::Remove(std::span<const KeyId> keys, kvpool_status* statuses) {
  size_t n = keys.size();
  uint32_t max_batch = MaxBatch();
  for (size_t off = 0; off < n; off += max_batch) {
    size_t m = std::min<size_t>(max_batch, n - off);
    std::vector<uint8_t> body = EncodeIds(keys.subspan(off, m));
    KVPOOL_RETURN_IF_ERROR(WithConnection([&](Lease& lease,
                                              SteadyClock::time_point deadline) -> Status {
      iovec iov{body.data(), body.size()};
      std::vector<uint8_t> reply;
      KVPOOL_RETURN_IF_ERROR(lease.link()->Call(MessageType::kRemove, std::span(&iov, 1), deadline, &reply));
      std::vector<int32_t> st;
      KVPOOL_RETURN_IF_ERROR(protocol::DecodeStatuses(reply, protocol::kMaxBatch, &st));
      if (st.size() != m) return Internal("reply item count does not match the request");
      for (size_t i = 0; i < m; ++i) statuses[off + i] = st[i];
      return Status::Ok();
    }));
  }
  return Status::Ok();
}

Result<std::string> LocalBackend::StatsJson() {
  std::string json;
  KVPOOL_RETURN_IF_ERROR(
      WithConnection([&](Lease& lease, SteadyClock::time_point deadline) -> Status {
        std::vector<uint8_t> reply;
        KVPOOL_RETURN_IF_ERROR(lease.link()->Call(MessageType::kStats, {}, deadline, &reply));
        return protocol::DecodeString(reply, &json);
      }));
  return json;
}

Status LocalBackend::OneCall(MessageType type, std::vector<uint8_t> body,
                             std::vector<uint8_t>* reply) {
  return WithConnection([&](Lease& lease, SteadyClock::time_point deadline) -> Status {
    iovec iov{body.data(), body.size()};
    reply->clear();
    return lease.link()->Call(type, std::span(&iov, 1), deadline, reply);
  });
}

Result<std::string> LocalBackend::LookupPrefix(std::span<const uint64_t> hashes,
                                               uint32_t timeout_ms) {
  std::vector<uint8_t> body, reply;
  protocol::EncodeLookupPrefix(timeout_ms, hashes, &body);
  KVPOOL_RETURN_IF_ERROR(OneCall(MessageType::kLookupPrefix, std::move(body), &reply));
  std::string json;
  KVPOOL_RETURN_IF_ERROR(protocol::DecodeString(reply, &json));
  return json;
}

Result<uint64_t> LocalBackend::ClearNamespace(uint32_t tag) {
  std::vector<uint8_t> body, reply;
  protocol::EncodeU32Body(tag, &body);
  KVPOOL_RETURN_IF_ERROR(OneCall(MessageType::kClear, std::move(body), &reply));
  uint64_t dropped = 0;
  KVPOOL_RETURN_IF_ERROR(protocol::DecodeU64Body(reply, &dropped));
  return dropped;
}

Status LocalBackend::Hint(uint32_t op, std::span<const KeyId> keys, uint64_t ttl_ms,
                          uint32_t priority, kvpool_hint_result* result) {
  if (keys.size() > protocol::kMaxHintKeys) {
    return InvalidArgument(fmt::format("a hint names {} keys, more than the most of {}",
                                       keys.size(), protocol::kMaxHintKeys));
  }
  protocol::HintRequest m;
  m.op = op;
  m.priority = priority;
  m.ttl_ms = ttl_ms;
  m.keys.assign(keys.begin(), keys.end());
  std::vector<uint8_t> body, reply;
  protocol::EncodeHint(m, &body);
  KVPOOL_RETURN_IF_ERROR(OneCall(MessageType::kHint, std::move(body), &reply));
  protocol::HintReply r;
  KVPOOL_RETURN_IF_ERROR(protocol::DecodeHintReply(reply, &r));
  *result = {r.applied, r.unknown, r.clipped, r.moved};
  return Status::Ok();
}

Status LocalBackend::Flush() {
  return WithConnection([&](Lease& lease, SteadyClock::time_point deadline) -> Status {
    std::vector<uint8_t> reply;
    return lease.link()->Call(MessageType::kFlush, {}, deadline, &reply);
  });
}

}  // namespace

Result<std::unique_ptr<ClientBackend>> OpenLocalBackend(const kvpool_options& options) {
  auto b = std::make_unique<LocalBackend>(options);
  KVPOOL_RETURN_IF_ERROR(b->Start());
  return std::unique_ptr<ClientBackend>(std::move(b));
}

}  // namespace kvpool::client
