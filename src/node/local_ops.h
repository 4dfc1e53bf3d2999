// LocalOps: the local protocol's operations (hello, reserve, commit, abort,
// acquire, release, exists, put, get, remove, stats, flush) over the store,
// apart from the event loop that reads and writes the frames
// (local_server.cc). A connection's operation state is a LocalSession;
// replies are queued on it for the loop to write. Reads whose keys must
// wait (an SSD promotion, the cluster) are parked with their decoded keys
// (ParkedReads) and answered by Resume from the pins their wait took.
//
// Not thread-safe; owned by the local server's loop thread (parked work
// completes on other threads and wakes the loop through wake_fd).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "blocks/descriptor.h"
#include "cluster/remote_source.h"
#include "common/executor.h"
#include "common/metrics.h"
#include "common/recent_ratio.h"
#include "common/status.h"
#include "node/local_server.h"
#include "node/parked_reads.h"
#include "node/staging.h"
#include "protocol/codec.h"
#include "protocol/message_format.h"
#include "store/tiered_store.h"

namespace kvpool {

// What the operations keep per connection. The loop's connection extends it.
struct LocalSession {
  int fd = -1;
  uint64_t id = 0;  // unique per connection (fds are reused)
  // What /api/v1/clients shows of it (set by the loop at the accept).
  std::shared_ptr<ClientRecord> record;
  // The peer's credentials (SO_PEERCRED) and the tenant they map to:
  // 0 is the default tenant, i > 0 the (i-1)th of LocalServer::Open's.
  int32_t peer_pid = 0;
  uint32_t peer_uid = 0;
  uint32_t peer_gid = 0;
  int tenant = 0;          // a tenant token in the hello may change it
  int counted_tenant = 0;  // the tenant its connection is counted under
  bool handshaked = false;
  bool closing = false;                  // close once the output is flushed
  bool pending = false;                  // a request is parked; later frames wait
  std::deque<std::vector<uint8_t>> out;  // reply frames not yet written
  size_t out_offset = 0;                 // into out.front()
  uint64_t out_bytes = 0;
  // Passed with the first byte of out.front() (the hello reply): the
  // segment's fd and, with staging, the staging area's. Not owned.
  int pass_fds[2] = {-1, -1};
  uint64_t next_handle = 1;
  // A reservation, and where its client writes it: a range of the staging
  // area (StagingArea::kNone: in place, the segment is writable).
  struct Reserved {
    TieredStore::Reservation slot;  // empty when forwarded
    uint64_t staging_offset = StagingArea::kNone;
    uint64_t batch = 0;  // the reserve request it came from
    // Placement chain: a value for another node has no slot here; it is
    // written to staging and sent from there at its commit.
    KeyId forward_key;
    uint64_t forward_size = 0;
    // The writer's block descriptor (protocol/descriptor_format.h, checked),
    // staged at the commit; none: none.
    blocks::Descriptor descriptor;
    uint64_t size() const { return slot.valid() ? slot.size() : forward_size; }
  };
  std::unordered_map<uint64_t, Reserved> reservations;
  // The reserve batch whose items were committed last, and its last entry:
  // a batch is a block chain in order (DramStore::Commit's chain).
  uint64_t chain_batch = 0;
  TieredStore::Chain chain;
  // The leading run of this session's last read, as the eviction policy
  // judged it: the next write batch is taken as the rest of that chain
  // (Chain::run), once; an exists call (the next request's lookup) clears
  // it.
  uint8_t read_run = UINT8_MAX;
  // In a cluster, the last exists call that stopped at a miss: the key it
  // stopped at and the keys it hit, in order. A put or reserve batch
  // starting with that key writes the rest of the chain after the last hit
  // (RemotePlacement::NoteChain); one starting at a hit another node dropped
  // before the read (its lookup was a cached answer) follows the hit before.
  bool chain_open = false;
  KeyId chain_next;
  std::vector<KeyId> chain_hits;
  // The staging area of a client that maps the segment read-only (shared
  // with the copies of a commit in flight: CommitCopies).
  std::shared_ptr<StagingArea> staging;
  std::unordered_map<uint64_t, TieredStore::Pin> pins;
};

// A commit batch taken off its session: per handle, the reservation (none:
// an unknown handle, whose status is preset) and the staging area it was
// written to. With a copy executor its staging → slot copies run there and
// the loop commits once they are done; the request that waits for them
// keeps this alive (ParkedReads::Request::commit), so a client that leaves
// meanwhile frees nothing a copy still reads or writes.
struct CommitCopies {
  std::vector<std::optional<LocalSession::Reserved>> items;
  std::vector<int32_t> statuses;
  std::shared_ptr<StagingArea> staging;
  std::atomic<size_t> jobs_left{0};
  void Clear() {
    items.clear();
    statuses.clear();
    staging.reset();
  }
};

class LocalOps {
 public:
  // All pointers must outlive the object; cluster's faces are null when
  // standalone. store and cluster serve the default tenant; each of tenants
  // is served from its own store and its own cluster (LocalTenant::cluster).
  LocalOps(const LocalServerOptions& options, TieredStore* store, ClusterFaces cluster, int wake_fd,
           MetricsRegistry* metrics, std::function<std::string()> stats_json,
           const std::vector<LocalTenant>& tenants = {});
  ~LocalOps();
  LocalOps(const LocalOps&) = delete;
  LocalOps& operator=(const LocalOps&) = delete;

  // Handles one request frame: its reply is queued on s, or it is parked
  // (s.pending) and answered later by Resume.
  void Handle(LocalSession& s, const protocol::FrameHeader& h, std::span<const uint8_t> body);
  // Parked requests whose waits all finished (their connection may be gone).
  std::vector<ParkedReads::Request> TakeReady();
  // Has the cluster publish, once, what the puts and commits handled since
  // the last call stored (RemotePlacement::PublishNow): the server calls it
  // after the frames of one read, before their replies are written, so a
  // request another node gets after a put's answer finds its values, and a
  // client's pipelined commits cost one publish.
  void PublishStored();
  // The tenant (LocalSession::tenant) of a peer with these credentials.
  int TenantOf(uint32_t uid, const std::vector<uint32_t>& gids) const;
  // Asked when a hello's tenant token moves a connection to another tenant:
  // a refusal (that tenant's connection cap) fails the hello with it.
  void set_admit_tenant(std::function<Status(int tenant)> admit) { admit_tenant_ = std::move(admit); }
  // Runs commits' staging → slot copies on `copy` (threads: its threads),
  // so the loop moves no bytes of a large commit; null (the default): the
  // loop copies. Call before the first request; `copy` must be drained
  // (ThreadPool::Stop) before this object is destroyed.
  void set_copy_executor(Executor* copy, int threads) {
    copy_ = copy;
    copy_threads_ = threads < 1 ? 1 : threads;
  }
  // Commits copying fewer bytes than this are copied by the loop: a hand-off
  // costs more than the copy.
  static constexpr uint64_t kInlineCopyBytes = 64 << 10;
  // A copy job moves at least this much (a value larger than a job's share
  // is split across jobs).
  static constexpr uint64_t kMinCopyJobBytes = 64 << 10;
  // Whether any tenant besides the default one is served.
  bool has_tenants() const { return tenants_.size() > 1; }
  size_t num_tenants() const { return tenants_.size(); }
  // Answers a ready parked request of s.
  void Resume(LocalSession& s, ParkedReads::Request& request);

  void QueueError(LocalSession& s, uint64_t request_id, const Status& status);
  // Counts a malformed or refused request, by reason.
  void ProtocolError(const char* reason);

 private:
  // A tenant's store, cluster, parked reads, key binding and counters.
  struct Tenant {
    std::string name;
    TieredStore* store = nullptr;
    RemoteReads* remote = nullptr;         // null: this node's store alone
    RemotePlacement* placement = nullptr;  // null when remote is
    std::unique_ptr<ParkedReads> parked;
    TenantKeys keys{""};
    Counter* hits = nullptr;
    Counter* misses = nullptr;
    Counter* rejected = nullptr;
    Counter* bytes_written = nullptr;
    Counter* bytes_read = nullptr;
  };
  Tenant& T(const LocalSession& c) { return tenants_[static_cast<size_t>(c.tenant)]; }
  // Binds decoded key ids to the connection's tenant (node/tenants.h).
  void Bind(const LocalSession& c, std::vector<KeyId>* keys);
  void Bind(const LocalSession& c, std::vector<protocol::SizedKey>* keys);
  bool ReadOrPark(LocalSession& c, const protocol::FrameHeader& h);
  bool ExistsOrPark(LocalSession& c, const protocol::FrameHeader& h);
  static ParkedReads::Request RequestOf(const LocalSession& c, const protocol::FrameHeader& h);
  void CountOp(uint16_t type, std::chrono::steady_clock::time_point start);
  // Bytes a connection wrote or read: the node's, its tenant's and its own counts.
  void Wrote(LocalSession& c, Tenant& t, uint64_t bytes);
  void Read(LocalSession& c, uint64_t bytes);
  void Queue(LocalSession& c, protocol::MessageType type, uint64_t request_id, Status status,
             const std::vector<uint8_t>& body);
  // Queues a frame whose body follows kHeaderBytes left for its header.
  void QueueFrame(LocalSession& c, protocol::MessageType type, uint64_t request_id, Status status,
                  std::vector<uint8_t> frame);

  Status OnHello(LocalSession& c, const protocol::FrameHeader& h, std::span<const uint8_t> body);
  Status DecodeSized(const protocol::FrameHeader& h, std::span<const uint8_t> body,
                     std::vector<protocol::SizedKey>* sized, std::span<const uint8_t>* rest);
  // Item i's descriptor, taken (none: it has none).
  blocks::Descriptor TakeDescriptor(size_t i);
  // Stages a descriptor (none: none) for a commit of key; 0 when nothing
  // was staged. Unstage undoes it when the commit fails.
  uint64_t Stage(const LocalSession& c, const KeyId& key, blocks::Descriptor descriptor);
  void Unstage(const KeyId& key, uint64_t token);
  Status OnReserve(LocalSession& c, const protocol::FrameHeader& h, std::span<const uint8_t> body);
  Status OnCommit(LocalSession& c, const protocol::FrameHeader& h, std::span<const uint8_t> body);
  // Moves the reservations of handles_ out of the session into *cc.
  void TakeReservations(LocalSession& c, CommitCopies* cc);
  // Whether a commit item is copied from the staging area into its slot
  // (not unknown, not forwarded, not written in place).
  static bool FromStaging(const std::optional<LocalSession::Reserved>& item) {
    return item && item->slot.valid() && item->staging_offset != StagingArea::kNone;
  }
  // Bytes cc's staged items copy into their slots.
  static uint64_t StagedBytes(const CommitCopies& cc);
  // Starts cc's copies on the copy executor in up to copy_threads_ jobs of
  // about equal bytes; done() runs after the last one.
  void StartCopies(CommitCopies* cc, std::function<void(Status, std::string)> done);
  // Commits cc's items (their bytes in their slots), frees their staging
  // and queues the reply.
  void FinishCommit(LocalSession& c, const protocol::FrameHeader& h, CommitCopies& cc);
  Status OnAbort(LocalSession& c, std::span<const uint8_t> body);
  Status OnAcquire(LocalSession& c, const protocol::FrameHeader& h, std::span<const uint8_t> body);
  void AnswerAcquire(LocalSession& c, const protocol::FrameHeader& h,
                     const std::vector<KeyId>& keys, std::vector<TieredStore::Pin>& pins);
  Status OnRelease(LocalSession& c, std::span<const uint8_t> body);
  Status OnExists(LocalSession& c, const protocol::FrameHeader& h, std::span<const uint8_t> body);
  // A put or reserve batch of keys that continues the session's last
  // exists chain: tells the cluster (placement chain).
  void NoteChain(LocalSession& c, const std::vector<protocol::SizedKey>& keys);
  Status CommitForwarded(LocalSession& c, const LocalSession::Reserved& res);
  // Whether a lookup found key dropped lately by its holder (the cluster's
  // ghost): its commit is a block coming back.
  static bool Returning(const Tenant& t, const KeyId& key) {
    return t.remote != nullptr && t.remote->EvictedLately(key);
  }
  void AnswerExists(LocalSession& c, const protocol::FrameHeader& h, const std::vector<KeyId>& keys,
                    const std::set<KeyId>* remote_hits);
  Status OnPut(LocalSession& c, const protocol::FrameHeader& h, std::span<const uint8_t> body);
  Status OnGet(LocalSession& c, const protocol::FrameHeader& h, std::span<const uint8_t> body);
  void AnswerGet(LocalSession& c, const protocol::FrameHeader& h,
                 const std::vector<protocol::SizedKey>& sized, std::vector<TieredStore::Pin>& pins);
  Status OnRemove(LocalSession& c, const protocol::FrameHeader& h, std::span<const uint8_t> body);
  Status OnStats(LocalSession& c, const protocol::FrameHeader& h, std::span<const uint8_t> body);
  Status OnFlush(LocalSession& c, const protocol::FrameHeader& h, std::span<const uint8_t> body);
  Status OnLookupPrefix(LocalSession& c, const protocol::FrameHeader& h,
                        std::span<const uint8_t> body);
  Status OnClear(LocalSession& c, const protocol::FrameHeader& h, std::span<const uint8_t> body);
  Status OnHint(LocalSession& c, const protocol::FrameHeader& h, std::span<const uint8_t> body);

  const LocalServerOptions opts_;
  std::vector<Tenant> tenants_;  // [0]: the default tenant
  std::vector<TenantSpec> specs_;  // tenants_[1..]'s, for TenantOf
  // Tenant tokens a hello may present: name -> secret and tenant index.
  struct TokenTenant {
    std::array<uint8_t, 32> secret{};
    int tenant = 0;
  };
  std::unordered_map<std::string, TokenTenant> token_tenants_;
  bool parked_now_ = false;  // the request being handled was parked
  std::function<Status(int tenant)> admit_tenant_;
  MetricsRegistry* const metrics_;
  const std::function<std::string()> stats_json_;
  // Scratch vectors reused to avoid allocating per request.
  std::vector<protocol::SizedKey> sized_;
  std::vector<KeyId> keys_;
  std::vector<TieredStore::Pin> pins_;
  std::vector<KeyId> chain_keys_;
  std::vector<uint64_t> handles_;
  CommitCopies inline_commit_;  // the loop's own, for commits it copies
  Executor* copy_ = nullptr;    // null: the loop copies
  int copy_threads_ = 1;
  std::vector<int32_t> statuses_;
  RemotePlacement* publish_due_ = nullptr;  // PublishStored: a put or commit stored values
  std::vector<protocol::RegionItem> regions_;
  std::vector<uint8_t> out_;
  // The request being handled: its descriptors (views into its body) and
  // which items' descriptors decoded (empty: no descriptors).
  std::vector<std::span<const uint8_t>> descriptors_;
  std::vector<blocks::Descriptor> described_;  // per item of the request
  std::vector<bool> descriptor_ok_;

  static constexpr int kNumOps = 18;  // MessageType values 1..17
  Counter* ops_[kNumOps] = {};
  Histogram* latency_[kNumOps] = {};
  std::unordered_map<std::string, Counter*> protocol_errors_;
  Counter* items_;
  Counter* clears_;   // namespace clears
  Counter* cleared_;  // entries they dropped
  Counter* hits_;
  Counter* misses_;
  Counter* exists_hits_;
  Counter* exists_misses_;
  Counter* exists_prefix_hits_;
  // Acquire and get items (hits over items), and exists items in the leading
  // run of hits (over items): the ratios of the last minutes, as gauges.
  RecentRatio recent_hits_;
  RecentRatio recent_prefix_;
  Counter* bytes_read_;
  Counter* bytes_written_;
  Counter* put_failures_;
  Counter* copied_off_loop_;
  Counter* descriptors_invalid_;
};

}  // namespace kvpool
