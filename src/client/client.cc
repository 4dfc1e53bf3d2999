// The C ABI of libkvpool (include/kvpool/kvpool.h) over a pool of local
// connections and the mapped shared segment.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "client/local_connection.h"
#include "client/remote_client.h"
#include "common/key_id.h"
#include "kvpool/kvpool.h"
#include "protocol/codec.h"
#include "protocol/socket_path.h"

namespace kvpool {
namespace {

using protocol::MessageType;

thread_local std::string g_last_error;

kvpool_status Fail(const Status& s) {
  g_last_error = s.ToString();
  return static_cast<kvpool_status>(s.code());
}

// One mapping of a node's segment. Kept alive while any handle issued from
// it is outstanding, so pointers handed to the caller stay valid even when
// the node restarts.
struct Mapping {
  uint8_t* base = nullptr;
  uint64_t size = 0;
  uint64_t instance_id = 0;
  ~Mapping() {
    if (base != nullptr) ::munmap(base, size);
  }
};

// Handles handed to the caller: connection slot (8 bits), the slot's
// generation (8 bits), the node's handle (48 bits). A handle from a dead
// connection is recognised by its generation and ignored.
constexpr int kSlotShift = 56;
constexpr int kGenShift = 48;
constexpr uint64_t kNodeHandleMask = (1ull << kGenShift) - 1;

struct Slot {
  std::unique_ptr<LocalConnection> link;
  std::shared_ptr<Mapping> mapping;
  uint8_t gen = 0;
  bool busy = false;
  int64_t outstanding = 0;  // handles of this generation not yet returned
};

}  // namespace
}  // namespace kvpool

struct kvpool_client {
  kvpool_options options{};
  std::string socket_path;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<kvpool::Slot> slots;                                 // protected by mu
  std::shared_ptr<kvpool::Mapping> mapping;                        // protected by mu
  std::map<uint16_t, std::pair<std::shared_ptr<kvpool::Mapping>, int64_t>> retired;  // mu
  kvpool::protocol::HelloReply hello;                              // protected by mu
  // Remote mode (options.remote_peers): set, and everything above unused.
  std::unique_ptr<kvpool::client::RemoteClient> remote;
};

namespace kvpool {
namespace {

Clock::time_point DeadlineOf(const kvpool_client* c) {
  return Clock::now() + std::chrono::milliseconds(c->options.timeout_ms);
}

// A connection lent to one call. Returned to the pool when destroyed.
class Lease {
 public:
  Lease(kvpool_client* c, int slot) : c_(c), slot_(slot) {}
  Lease(Lease&& o) noexcept : c_(o.c_), slot_(o.slot_) { o.c_ = nullptr; }
  ~Lease() {
    if (c_ == nullptr) return;
    std::lock_guard lock(c_->mu);
    c_->slots[slot_].busy = false;
    c_->cv.notify_all();
  }
  int slot() const { return slot_; }
  Slot& s() { return c_->slots[slot_]; }  // safe: busy flag gives exclusive use
  LocalConnection* link() { return s().link.get(); }

 private:
  kvpool_client* c_;
  int slot_;
};

// Moves a slot's outstanding handles to the retired table before the slot's
// connection is replaced. REQUIRES: c->mu held.
void RetireLocked(kvpool_client* c, int slot) {
  Slot& s = c->slots[slot];
  if (s.outstanding > 0 && s.mapping) {
    c->retired[static_cast<uint16_t>(slot << 8 | s.gen)] = {s.mapping, s.outstanding};
  }
  s.outstanding = 0;
  s.link.reset();
  s.mapping.reset();
  s.gen = static_cast<uint8_t>(s.gen + 1);
}

// Connects slot `slot` (owned by the caller through its lease).
Status ConnectSlot(kvpool_client* c, int slot, Clock::time_point deadline) {
  KVPOOL_ASSIGN_OR_RETURN(auto link, LocalConnection::Connect(c->socket_path, "libkvpool", deadline,
                                                              c->options.expected_server_uid));
  link->set_spin(std::chrono::microseconds(c->options.spin_us));
  int fd = link->TakeSegmentFd();
  std::shared_ptr<Mapping> mapping;
  {
    std::lock_guard lock(c->mu);
    if (c->mapping && c->mapping->instance_id == link->hello().instance_id) mapping = c->mapping;
  }
  if (!mapping && !c->options.copy_mode) {
    if (fd < 0) return Internal("the node did not pass its segment");
    auto m = std::make_shared<Mapping>();
    m->size = link->hello().segment_bytes;
    m->instance_id = link->hello().instance_id;
    // MAP_POPULATE builds the page tables now, so the first get does not
    // take a minor fault per 4 KiB page.
    void* p = ::mmap(nullptr, m->size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      return ErrnoStatus("mmap of the node's segment", err);
    }
    m->base = static_cast<uint8_t*>(p);
    mapping = m;
  }
  if (fd >= 0) ::close(fd);
  std::lock_guard lock(c->mu);
  if (mapping && (!c->mapping || c->mapping->instance_id != mapping->instance_id)) {
    c->mapping = mapping;
  }
  c->hello = link->hello();
  Slot& s = c->slots[slot];
  RetireLocked(c, slot);
  s.link = std::move(link);
  s.mapping = mapping;
  return Status::Ok();
}

// Lends a connected connection: `want` >= 0 asks for that slot (handles are
// bound to their connection), else any.
Result<Lease> Borrow(kvpool_client* c, Clock::time_point deadline, int want = -1) {
  int chosen = -1;
  bool need_connect = false;
  {
    std::unique_lock lock(c->mu);
    while (true) {
      if (want >= 0) {
        if (!c->slots[want].busy) chosen = want;
      } else {
        for (size_t i = 0; i < c->slots.size(); ++i) {
          if (!c->slots[i].busy && c->slots[i].link && !c->slots[i].link->broken()) {
            chosen = static_cast<int>(i);
            break;
          }
        }
        if (chosen < 0) {
          for (size_t i = 0; i < c->slots.size(); ++i) {
            if (!c->slots[i].busy) {
              chosen = static_cast<int>(i);
              break;
            }
          }
        }
      }
      if (chosen >= 0) break;
      if (c->cv.wait_until(lock, deadline) == std::cv_status::timeout) {
        return DeadlineExceeded("no free connection to the node in time");
      }
    }
    c->slots[chosen].busy = true;
    need_connect = !c->slots[chosen].link || c->slots[chosen].link->broken();
  }
  Lease lease(c, chosen);
  if (need_connect && want < 0) KVPOOL_RETURN_IF_ERROR(ConnectSlot(c, chosen, deadline));
  return lease;
}

// Runs fn(lease) on a connection; when the connection breaks and the client
// reconnects, retries once on a fresh one. fn must be safe to repeat.
template <typename Fn>
Status WithConnection(kvpool_client* c, Fn&& fn) {
  auto deadline = DeadlineOf(c);
  for (int attempt = 0;; ++attempt) {
    auto lease = Borrow(c, deadline);
    if (!lease.ok()) return lease.status();
    Status s = fn(*lease, deadline);
    if (s.ok() || !lease->link()->broken() || !c->options.reconnect || attempt > 0 ||
        s.code() == StatusCode::kDeadlineExceeded) {
      return s;
    }
  }
}

uint64_t MakeHandle(int slot, uint8_t gen, uint64_t node_handle) {
  return (static_cast<uint64_t>(slot) << kSlotShift) | (static_cast<uint64_t>(gen) << kGenShift) |
         (node_handle & kNodeHandleMask);
}

// Counts handles given out on a lease's slot. The lease gives exclusive use
// of the slot's connection, but the counters are read under mu elsewhere.
void AddOutstanding(kvpool_client* c, int slot, int64_t n) {
  std::lock_guard lock(c->mu);
  c->slots[slot].outstanding += n;
}

// Forgets handles of a dead generation; drops its mapping when none are left.
void ReturnRetired(kvpool_client* c, uint16_t key, int64_t n) {
  std::lock_guard lock(c->mu);
  auto it = c->retired.find(key);
  if (it == c->retired.end()) return;
  it->second.second -= n;
  if (it->second.second <= 0) c->retired.erase(it);
}

uint8_t* MappingBase(kvpool_client* c, Lease& lease) {
  return lease.s().mapping ? lease.s().mapping->base : nullptr;
}

uint32_t MaxBatch(kvpool_client* c) {
  std::lock_guard lock(c->mu);
  return std::max<uint32_t>(1, c->hello.max_batch);
}

// Sends handles (release or abort) grouped by the connection they belong to.
kvpool_status ReturnHandles(kvpool_client* c, MessageType type, const uint64_t* handles,
                            size_t n) {
  std::map<uint16_t, std::vector<uint64_t>> by_conn;
  for (size_t i = 0; i < n; ++i) {
    if (handles[i] == 0) continue;
    by_conn[static_cast<uint16_t>(handles[i] >> kGenShift)].push_back(handles[i] & kNodeHandleMask);
  }
  auto deadline = DeadlineOf(c);
  for (auto& [key, list] : by_conn) {
    int slot = key >> 8;
    uint8_t gen = key & 0xff;
    if (slot >= static_cast<int>(c->slots.size())) continue;
    auto lease = Borrow(c, deadline, slot);
    if (!lease.ok()) return Fail(lease.status());
    if (lease->s().gen != gen || !lease->link() || lease->link()->broken()) {
      ReturnRetired(c, key, static_cast<int64_t>(list.size()));
      continue;
    }
    AddOutstanding(c, slot, -static_cast<int64_t>(list.size()));
    std::vector<uint8_t> body;
    protocol::EncodeHandles(list, &body);
    iovec iov{body.data(), body.size()};
    Status s = lease->link()->Send(type, std::span(&iov, 1), deadline);
    (void)s;  // a dead connection released everything on the node already
  }
  return KVPOOL_OK;
}

kvpool_status ZeroCopyAllowed(kvpool_client* c) {
  if (c->options.copy_mode) {
    return Fail(FailedPrecondition("zero-copy calls need the mapped segment (copy_mode is on)"));
  }
  return KVPOOL_OK;
}

// Reserve or acquire a chunk of items on one lease; fills regions with
// caller-visible handles and pointers.
Status RegionCall(kvpool_client* c, Lease& lease, Clock::time_point deadline, MessageType type,
                  const std::vector<uint8_t>& body, size_t n, kvpool_region* regions,
                  kvpool_status* statuses) {
  iovec iov{const_cast<uint8_t*>(body.data()), body.size()};
  std::vector<uint8_t> reply;
  KVPOOL_RETURN_IF_ERROR(lease.link()->Call(type, std::span(&iov, 1), deadline, &reply));
  std::vector<protocol::RegionItem> items;
  KVPOOL_RETURN_IF_ERROR(protocol::DecodeRegionItems(reply, protocol::kMaxBatch, &items));
  if (items.size() != n) return Internal("reply item count does not match the request");
  uint8_t* base = MappingBase(c, lease);
  uint64_t seg = lease.s().mapping ? lease.s().mapping->size : 0;
  int64_t handed = 0;
  for (size_t i = 0; i < n; ++i) {
    statuses[i] = items[i].status;
    regions[i] = {nullptr, items[i].size, 0};
    if (items[i].status != 0) continue;
    if (items[i].offset + items[i].size > seg || base == nullptr) {
      return Internal("node returned a region outside the segment");
    }
    regions[i].data = base + items[i].offset;
    regions[i].handle = MakeHandle(lease.slot(), lease.s().gen, items[i].handle);
    ++handed;
  }
  AddOutstanding(c, lease.slot(), handed);
  return Status::Ok();
}

std::vector<uint8_t> EncodeIds(const kvpool_key_id* ids, size_t n) {
  std::vector<uint8_t> body;
  std::vector<KeyId> keys(n);
  for (size_t i = 0; i < n; ++i) keys[i] = KeyId{ids[i].hi, ids[i].lo};
  protocol::EncodeKeys(keys, &body);
  return body;
}

kvpool_status Overall(const kvpool_status* statuses, size_t n, bool existing_ok) {
  for (size_t i = 0; i < n; ++i) {
    if (statuses[i] == KVPOOL_OK) continue;
    if (existing_ok && statuses[i] == KVPOOL_ALREADY_EXISTS) continue;
    g_last_error = fmt::format("item {}: {}", i,
                               StatusCodeName(static_cast<StatusCode>(statuses[i])));
    return statuses[i];
  }
  return KVPOOL_OK;
}

// Remote mode has no shared segment, no node-side handles and no node of its own.
kvpool_status NotInRemoteMode(const char* call) {
  return Fail(FailedPrecondition(fmt::format("{} is not available in remote mode", call)));
}

kvpool_client* OpenRemote(const kvpool_options& o, kvpool_status* status) {
  auto seeds = client::ParsePeerList(o.remote_peers);
  if (!seeds.ok()) {
    *status = Fail(seeds.status());
    return nullptr;
  }
  client::RemoteClientOptions ro;
  ro.seeds = std::move(seeds).value();
  ro.timeout = std::chrono::milliseconds(o.timeout_ms);
  if (o.remote_refresh_ms > 0) ro.refresh_interval = std::chrono::milliseconds(o.remote_refresh_ms);
  auto remote = client::RemoteClient::Open(ro);
  if (!remote.ok()) {
    *status = Fail(remote.status());
    return nullptr;
  }
  auto c = std::make_unique<kvpool_client>();
  c->options = o;
  c->options.socket_path = nullptr;  // the caller's strings are not kept
  c->options.remote_peers = nullptr;
  c->remote = std::move(remote).value();
  *status = KVPOOL_OK;
  return c.release();
}

std::span<const KeyId> AsKeys(const kvpool_key_id* ids, size_t n) {
  static_assert(sizeof(KeyId) == sizeof(kvpool_key_id) && offsetof(KeyId, lo) == offsetof(kvpool_key_id, lo));
  return {reinterpret_cast<const KeyId*>(ids), n};
}

}  // namespace
}  // namespace kvpool

using namespace kvpool;

extern "C" {

const char* kvpool_status_name(kvpool_status status) {
  if (status < 0 || status > KVPOOL_INTERNAL) return "Unknown";
  return StatusCodeName(static_cast<StatusCode>(status)).data();
}

const char* kvpool_version(void) { return KVPOOL_VERSION; }

const char* kvpool_last_error(void) { return g_last_error.c_str(); }

void kvpool_options_init(kvpool_options* o) {
  if (o == nullptr) return;
  std::memset(o, 0, sizeof(*o));
  o->struct_size = sizeof(*o);
  o->socket_path = nullptr;
  o->timeout_ms = 5000;
  o->max_connections = 8;
  o->reconnect = 1;
  o->copy_mode = 0;
  o->spin_us = 50;
  o->remote_peers = nullptr;
  o->remote_refresh_ms = 2000;
  o->expected_server_uid = LocalConnection::kSocketDirOwner;
}

kvpool_client* kvpool_open(const kvpool_options* options, kvpool_status* status) {
  kvpool_status dummy;
  if (status == nullptr) status = &dummy;
  g_last_error.clear();
  kvpool_options o;
  kvpool_options_init(&o);
  if (options != nullptr) {
    if (options->struct_size < offsetof(kvpool_options, timeout_ms) ||
        options->struct_size > sizeof(kvpool_options)) {
      *status = Fail(InvalidArgument("kvpool_options.struct_size is not set (use kvpool_options_init)"));
      return nullptr;
    }
    std::memcpy(&o, options, options->struct_size);
    o.struct_size = sizeof(o);
  }
  if (o.timeout_ms == 0 || o.max_connections == 0 || o.max_connections > 255) {
    *status = Fail(InvalidArgument("timeout_ms must be > 0 and max_connections in 1..255"));
    return nullptr;
  }
  if (o.remote_peers != nullptr) return OpenRemote(o, status);
  auto c = std::make_unique<kvpool_client>();
  c->options = o;
  // The C ABI has no main to read the environment: the default location's
  // $XDG_RUNTIME_DIR candidate is read here.
  c->socket_path = o.socket_path != nullptr
                       ? std::string(o.socket_path)
                       : protocol::FindDefaultSocket(std::getenv("XDG_RUNTIME_DIR"), ::geteuid());
  c->options.socket_path = nullptr;  // the caller's string is not kept
  c->slots.resize(o.max_connections);
  {
    auto lease = Borrow(c.get(), DeadlineOf(c.get()));
    if (!lease.ok()) {
      *status = Fail(lease.status());
      return nullptr;
    }
  }
  *status = KVPOOL_OK;
  return c.release();
}

void kvpool_close(kvpool_client* client) {
  // Closing the connections makes the node release every pin and reservation.
  delete client;
}

void kvpool_key_ids(const void* ns, size_t ns_len, const void* const* keys, const size_t* key_lens,
                    size_t n, kvpool_key_id* out) {
  std::string_view nsv(static_cast<const char*>(ns), ns_len);
  for (size_t i = 0; i < n; ++i) {
    KeyId id = MakeKeyId(nsv, std::string_view(static_cast<const char*>(keys[i]), key_lens[i]));
    out[i] = {id.hi, id.lo};
  }
}

kvpool_status kvpool_reserve(kvpool_client* c, const kvpool_key_id* ids, const uint64_t* sizes,
                             size_t n, kvpool_region* regions, kvpool_status* statuses) {
  if (c == nullptr) return Fail(InvalidArgument("client is NULL"));
  if (c->remote) return NotInRemoteMode("kvpool_reserve");
  if (kvpool_status z = ZeroCopyAllowed(c); z != KVPOOL_OK) return z;
  uint32_t max_batch = MaxBatch(c);
  // All items of one call go to one connection so the caller can commit them
  // together; batches above the node's limit are split on that connection.
  Status s = WithConnection(c, [&](Lease& lease, Clock::time_point deadline) -> Status {
    for (size_t off = 0; off < n; off += max_batch) {
      size_t m = std::min<size_t>(max_batch, n - off);
      std::vector<protocol::SizedKey> items(m);
      for (size_t i = 0; i < m; ++i) items[i] = {KeyId{ids[off + i].hi, ids[off + i].lo}, sizes[off + i]};
      std::vector<uint8_t> body;
      protocol::EncodeSizedKeys(items, &body);
      KVPOOL_RETURN_IF_ERROR(RegionCall(c, lease, deadline, MessageType::kReserve, body, m,
                                        regions + off, statuses + off));
    }
    return Status::Ok();
  });
  if (!s.ok()) {
    for (size_t i = 0; i < n; ++i) statuses[i] = static_cast<kvpool_status>(s.code());
    return Fail(s);
  }
  return Overall(statuses, n, /*existing_ok=*/true);
}

kvpool_status kvpool_commit(kvpool_client* c, const uint64_t* handles, size_t n,
                            kvpool_status* statuses) {
  if (c == nullptr) return Fail(InvalidArgument("client is NULL"));
  if (c->remote) return NotInRemoteMode("kvpool_commit");
  std::map<uint16_t, std::vector<size_t>> by_conn;
  for (size_t i = 0; i < n; ++i) {
    statuses[i] = KVPOOL_INVALID_ARGUMENT;
    if (handles[i] != 0) by_conn[static_cast<uint16_t>(handles[i] >> kGenShift)].push_back(i);
  }
  auto deadline = DeadlineOf(c);
  uint32_t max_batch = MaxBatch(c);
  for (auto& [key, idx] : by_conn) {
    int slot = key >> 8;
    uint8_t gen = key & 0xff;
    if (slot >= static_cast<int>(c->slots.size())) continue;
    auto lease = Borrow(c, deadline, slot);
    if (!lease.ok()) return Fail(lease.status());
    if (lease->s().gen != gen || !lease->link() || lease->link()->broken()) {
      // The connection died: the node dropped its reservations.
      ReturnRetired(c, key, static_cast<int64_t>(idx.size()));
      for (size_t i : idx) statuses[i] = KVPOOL_UNAVAILABLE;
      continue;
    }
    AddOutstanding(c, slot, -static_cast<int64_t>(idx.size()));
    for (size_t off = 0; off < idx.size(); off += max_batch) {
      size_t m = std::min<size_t>(max_batch, idx.size() - off);
      std::vector<uint64_t> list(m);
      for (size_t i = 0; i < m; ++i) list[i] = handles[idx[off + i]] & kNodeHandleMask;
      std::vector<uint8_t> body, reply;
      protocol::EncodeHandles(list, &body);
      iovec iov{body.data(), body.size()};
      Status s = lease->link()->Call(MessageType::kCommit, std::span(&iov, 1), deadline, &reply);
      std::vector<int32_t> st;
      if (s.ok()) s = protocol::DecodeStatuses(reply, protocol::kMaxBatch, &st);
      if (s.ok() && st.size() != m) s = Internal("reply item count does not match the request");
      if (!s.ok()) {
        for (size_t i = 0; i < m; ++i) statuses[idx[off + i]] = static_cast<kvpool_status>(s.code());
        g_last_error = s.ToString();
        continue;
      }
      for (size_t i = 0; i < m; ++i) statuses[idx[off + i]] = st[i];
    }
  }
  return Overall(statuses, n, /*existing_ok=*/true);
}

kvpool_status kvpool_abort(kvpool_client* c, const uint64_t* handles, size_t n) {
  if (c == nullptr) return Fail(InvalidArgument("client is NULL"));
  if (c->remote) return NotInRemoteMode("kvpool_abort");
  return ReturnHandles(c, MessageType::kAbort, handles, n);
}

kvpool_status kvpool_acquire(kvpool_client* c, const kvpool_key_id* ids, size_t n,
                             kvpool_region* regions, kvpool_status* statuses) {
  if (c == nullptr) return Fail(InvalidArgument("client is NULL"));
  if (c->remote) return NotInRemoteMode("kvpool_acquire");
  if (kvpool_status z = ZeroCopyAllowed(c); z != KVPOOL_OK) return z;
  uint32_t max_batch = MaxBatch(c);
  Status s = WithConnection(c, [&](Lease& lease, Clock::time_point deadline) -> Status {
    for (size_t off = 0; off < n; off += max_batch) {
      size_t m = std::min<size_t>(max_batch, n - off);
      KVPOOL_RETURN_IF_ERROR(RegionCall(c, lease, deadline, MessageType::kAcquire,
                                        EncodeIds(ids + off, m), m, regions + off, statuses + off));
    }
    return Status::Ok();
  });
  if (!s.ok()) {
    for (size_t i = 0; i < n; ++i) statuses[i] = static_cast<kvpool_status>(s.code());
    return Fail(s);
  }
  return KVPOOL_OK;
}

kvpool_status kvpool_release(kvpool_client* c, const uint64_t* handles, size_t n) {
  if (c == nullptr) return Fail(InvalidArgument("client is NULL"));
  if (c->remote) return NotInRemoteMode("kvpool_release");
  return ReturnHandles(c, MessageType::kRelease, handles, n);
}

kvpool_status kvpool_put(kvpool_client* c, const kvpool_key_id* ids, const void* const* values,
                         const uint64_t* sizes, size_t n, kvpool_status* statuses) {
  if (c == nullptr) return Fail(InvalidArgument("client is NULL"));
  if (c->remote) {
    Status s = c->remote->Put(AsKeys(ids, n), values, sizes, statuses);
    if (!s.ok()) return Fail(s);
    return Overall(statuses, n, true);
  }
  if (!c->options.copy_mode) {
    // Reserve, copy into the segment, commit: one memcpy per value.
    std::vector<kvpool_region> regions(n);
    kvpool_status st = kvpool_reserve(c, ids, sizes, n, regions.data(), statuses);
    if (st != KVPOOL_OK && st != KVPOOL_ALREADY_EXISTS && st != KVPOOL_INVALID_ARGUMENT &&
        st != KVPOOL_RESOURCE_EXHAUSTED) {
      return st;
    }
    std::vector<uint64_t> handles;
    std::vector<size_t> idx;
    handles.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      if (statuses[i] != KVPOOL_OK) continue;
      std::memcpy(regions[i].data, values[i], sizes[i]);
      handles.push_back(regions[i].handle);
      idx.push_back(i);
    }
    if (handles.empty()) return Overall(statuses, n, true);
    std::vector<kvpool_status> cst(handles.size());
    kvpool_commit(c, handles.data(), handles.size(), cst.data());
    for (size_t k = 0; k < idx.size(); ++k) statuses[idx[k]] = cst[k];
    return Overall(statuses, n, true);
  }
  // Copy mode: values travel inline, in frames under the node's limit.
  uint64_t max_frame, max_batch;
  {
    std::lock_guard lock(c->mu);
    max_frame = c->hello.max_frame_bytes;
    max_batch = std::max<uint32_t>(1, c->hello.max_batch);
  }
  size_t off = 0;
  while (off < n) {
    size_t m = 0;
    uint64_t bytes = 4;
    while (off + m < n && m < max_batch) {
      uint64_t add = 24 + sizes[off + m];
      if (m > 0 && bytes + add > max_frame) break;
      bytes += add;
      ++m;
    }
    Status s = WithConnection(c, [&](Lease& lease, Clock::time_point deadline) -> Status {
      std::vector<protocol::SizedKey> items(m);
      for (size_t i = 0; i < m; ++i) items[i] = {KeyId{ids[off + i].hi, ids[off + i].lo}, sizes[off + i]};
      std::vector<uint8_t> head, reply;
      protocol::EncodeSizedKeys(items, &head);
      std::vector<iovec> iov;
      iov.push_back({head.data(), head.size()});
      for (size_t i = 0; i < m; ++i) iov.push_back({const_cast<void*>(values[off + i]), sizes[off + i]});
      KVPOOL_RETURN_IF_ERROR(lease.link()->Call(MessageType::kPut, iov, deadline, &reply));
      std::vector<int32_t> st;
      KVPOOL_RETURN_IF_ERROR(protocol::DecodeStatuses(reply, protocol::kMaxBatch, &st));
      if (st.size() != m) return Internal("reply item count does not match the request");
      for (size_t i = 0; i < m; ++i) statuses[off + i] = st[i];
      return Status::Ok();
    });
    if (!s.ok()) {
      for (size_t i = off; i < off + m; ++i) statuses[i] = static_cast<kvpool_status>(s.code());
      return Fail(s);
    }
    off += m;
  }
  return Overall(statuses, n, true);
}

kvpool_status kvpool_get(kvpool_client* c, const kvpool_key_id* ids, void* const* buffers,
                         const uint64_t* capacities, size_t n, uint64_t* sizes,
                         kvpool_status* statuses) {
  if (c == nullptr) return Fail(InvalidArgument("client is NULL"));
  if (c->remote) {
    Status s = c->remote->Get(AsKeys(ids, n), buffers, capacities, sizes, statuses);
    return s.ok() ? KVPOOL_OK : Fail(s);
  }
  if (!c->options.copy_mode) {
    // Acquire, copy out of the segment, release: one memcpy per value.
    std::vector<kvpool_region> regions(n);
    kvpool_status st = kvpool_acquire(c, ids, n, regions.data(), statuses);
    if (st != KVPOOL_OK) return st;
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
    if (!handles.empty()) kvpool_release(c, handles.data(), handles.size());
    return KVPOOL_OK;
  }
  uint64_t max_frame, max_batch, max_value;
  {
    std::lock_guard lock(c->mu);
    max_frame = c->hello.max_frame_bytes;
    max_batch = std::max<uint32_t>(1, c->hello.max_batch);
    max_value = c->hello.max_value_bytes;
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
    Status s = WithConnection(c, [&](Lease& lease, Clock::time_point deadline) -> Status {
      std::vector<protocol::SizedKey> items(m);
      for (size_t i = 0; i < m; ++i) items[i] = {KeyId{ids[off + i].hi, ids[off + i].lo}, capacities[off + i]};
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
        if (got[i].size > capacities[off + i]) return Internal("node returned more than the buffer holds");
        std::memcpy(buffers[off + i], data.data() + pos, got[i].size);
        pos += got[i].size;
      }
      return Status::Ok();
    });
    if (!s.ok()) return Fail(s);
    off += m;
  }
  return KVPOOL_OK;
}

kvpool_status kvpool_exists(kvpool_client* c, const kvpool_key_id* ids, size_t n, uint8_t* hits,
                            size_t* prefix_len) {
  if (c == nullptr) return Fail(InvalidArgument("client is NULL"));
  if (c->remote) {
    std::vector<uint8_t> h(n);
    Status s = c->remote->Exists(AsKeys(ids, n), h.data());
    if (!s.ok()) return Fail(s);
    if (hits != nullptr) std::memcpy(hits, h.data(), n);
    if (prefix_len != nullptr) {
      *prefix_len = static_cast<size_t>(std::find(h.begin(), h.end(), 0) - h.begin());
    }
    return KVPOOL_OK;
  }
  uint32_t max_batch = MaxBatch(c);
  size_t prefix = 0;
  bool in_prefix = true;
  for (size_t off = 0; off < n; off += max_batch) {
    size_t m = std::min<size_t>(max_batch, n - off);
    std::vector<uint8_t> body = EncodeIds(ids + off, m);
    protocol::ExistsReply rep;
    Status s = WithConnection(c, [&](Lease& lease, Clock::time_point deadline) -> Status {
      iovec iov{body.data(), body.size()};
      std::vector<uint8_t> reply;
      KVPOOL_RETURN_IF_ERROR(lease.link()->Call(MessageType::kExists, std::span(&iov, 1), deadline, &reply));
      KVPOOL_RETURN_IF_ERROR(protocol::DecodeExistsReply(reply, protocol::kMaxBatch, &rep));
      if (rep.hits.size() != m) return Internal("reply item count does not match the request");
      return Status::Ok();
    });
    if (!s.ok()) return Fail(s);
    if (hits != nullptr) std::memcpy(hits + off, rep.hits.data(), m);
    if (in_prefix) {
      prefix += rep.prefix_len;
      if (rep.prefix_len < m) in_prefix = false;
    }
  }
  if (prefix_len != nullptr) *prefix_len = prefix;
  return KVPOOL_OK;
}

kvpool_status kvpool_remove(kvpool_client* c, const kvpool_key_id* ids, size_t n,
                            kvpool_status* statuses) {
  if (c == nullptr) return Fail(InvalidArgument("client is NULL"));
  if (c->remote) return NotInRemoteMode("kvpool_remove");
  uint32_t max_batch = MaxBatch(c);
  for (size_t off = 0; off < n; off += max_batch) {
    size_t m = std::min<size_t>(max_batch, n - off);
    std::vector<uint8_t> body = EncodeIds(ids + off, m);
    Status s = WithConnection(c, [&](Lease& lease, Clock::time_point deadline) -> Status {
      iovec iov{body.data(), body.size()};
      std::vector<uint8_t> reply;
      KVPOOL_RETURN_IF_ERROR(lease.link()->Call(MessageType::kRemove, std::span(&iov, 1), deadline, &reply));
      std::vector<int32_t> st;
      KVPOOL_RETURN_IF_ERROR(protocol::DecodeStatuses(reply, protocol::kMaxBatch, &st));
      if (st.size() != m) return Internal("reply item count does not match the request");
      for (size_t i = 0; i < m; ++i) statuses[off + i] = st[i];
      return Status::Ok();
    });
    if (!s.ok()) return Fail(s);
  }
  return KVPOOL_OK;
}

kvpool_status kvpool_stats_json(kvpool_client* c, char* buf, size_t cap, size_t* len) {
  if (c == nullptr) return Fail(InvalidArgument("client is NULL"));
  if (c->remote) return NotInRemoteMode("kvpool_stats_json");
  std::string json;
  Status s = WithConnection(c, [&](Lease& lease, Clock::time_point deadline) -> Status {
    std::vector<uint8_t> reply;
    KVPOOL_RETURN_IF_ERROR(lease.link()->Call(MessageType::kStats, {}, deadline, &reply));
    return protocol::DecodeString(reply, &json);
  });
  if (!s.ok()) return Fail(s);
  if (len != nullptr) *len = json.size();
  if (buf == nullptr || cap < json.size() + 1) {
    return Fail(ResourceExhausted(fmt::format("stats need {} bytes", json.size() + 1)));
  }
  std::memcpy(buf, json.c_str(), json.size() + 1);
  return KVPOOL_OK;
}

kvpool_status kvpool_flush(kvpool_client* c) {
  if (c == nullptr) return Fail(InvalidArgument("client is NULL"));
  if (c->remote) return NotInRemoteMode("kvpool_flush");
  Status s = WithConnection(c, [&](Lease& lease, Clock::time_point deadline) -> Status {
    std::vector<uint8_t> reply;
    return lease.link()->Call(MessageType::kFlush, {}, deadline, &reply);
  });
  if (!s.ok()) return Fail(s);
  return KVPOOL_OK;
}

uint64_t kvpool_max_value_size(kvpool_client* c) {
  if (c == nullptr) return 0;
  if (c->remote) return client::RemoteClient::kMaxValueBytes;
  std::lock_guard lock(c->mu);
  return c->hello.max_value_bytes;
}

}  // extern "C"
