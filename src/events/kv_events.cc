#include "events/kv_events.h"

#include <fmt/format.h>
#include <pthread.h>
#include <zmq.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <fstream>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/log.h"
#include "common/populate.h"

namespace kvpool::events {

Status KvEventsOptions::Validate() const {
  if (!enabled()) return Status::Ok();
  if (batch_interval.count() < 1 || batch_interval.count() > 10000) {
    return InvalidArgument("kv events: the batch interval must be 1 ms to 10 s");
  }
  if (max_queued_events < 1) return InvalidArgument("kv events: the queue must hold an event");
  if (max_batch_keys < 1) return InvalidArgument("kv events: a batch must hold a block");
  if (max_batch_bytes < 4096) return InvalidArgument("kv events: a batch must hold 4 KiB");
  if (send_hwm < 1) return InvalidArgument("kv events: the send high-water mark must be >= 1");
  if (!ValidTopic(topic)) {
    return InvalidArgument(fmt::format(
        "kv events topic '{}': a kv@ topic names the pod and the model, kv@<pod>@<model>", topic));
  }
  for (const auto& [tag, t] : namespace_topics) {
    if (!ValidTopic(t)) {
      return InvalidArgument(fmt::format(
          "kv events topic '{}': a kv@ topic names the pod and the model, kv@<pod>@<model>", t));
    }
  }
  if (!replay_endpoint.empty() && replay_endpoint == endpoint && !endpoint.ends_with(":0")) {
    return InvalidArgument("kv events: the replay endpoint must differ from the endpoint");
  }
  return Status::Ok();
}

namespace {

Status ZmqError(std::string_view what) {
  return Unavailable(fmt::format("kv events: {}: {}", what, zmq_strerror(zmq_errno())));
}

std::string LastEndpoint(void* socket) {
  char buf[256];
  size_t len = sizeof(buf);
  if (socket == nullptr || zmq_getsockopt(socket, ZMQ_LAST_ENDPOINT, buf, &len) != 0) return "";
  return std::string(buf, len > 0 && buf[len - 1] == '\0' ? len - 1 : len);
}

// A batch's bytes are shared between the replay buffer and the PUB socket,
// which sends them without a copy and lets go of them once every
// subscriber's queue has (ReleasePayload, on a ZMQ thread).
using Payload = std::shared_ptr<std::string>;

struct Batch {
  int64_t seq;
  Payload payload;
  size_t topic;  // into Impl::topics
};

void ReleasePayload(void* /*data*/, void* hint) { delete static_cast<Payload*>(hint); }

// One holdings change as queued by the store's threads: a fixed-size record,
// so queueing allocates nothing once the queue's vectors have grown.
struct Told {
  KeyId key;
  KvEvent::Type type;
  Medium medium;
  blocks::Descriptor descriptor;  // none: named by its key id
  int topic = -1;  // into Impl::topics; -1: the key's namespace's
};

}  // namespace

struct KvEventsPublisher::Impl {
  KvEventsOptions opts;
  void* ctx = nullptr;
  void* pub = nullptr;
  void* replay = nullptr;
  std::string bound, bound_replay;  // set before the thread starts
  std::thread thread;
  // [0] the default topic, then the namespace topics; by tag, the index.
  std::vector<std::string> topics;
  std::unordered_map<uint32_t, size_t> topic_of_tag;

  Counter* events_sent;
  Counter* batches_sent;
  Counter* dropped;
  Counter* subscriber_dropped;
  Counter* subscriber_stalls;
  Counter* replays;

  std::mutex mu;
  std::condition_variable cv;
  bool stopping = false;      // protected by mu
  std::function<void()> before_batch;  // protected by mu; called without it
  std::vector<Told> pending;  // protected by mu
  uint64_t pending_keys = 0;  // protected by mu

  // The batching thread's own, kept for their capacity: the queue it last
  // took, and the batch being built (events as runs of one key array).
  std::vector<Told> taken;
  std::vector<EventRun> runs;
  std::vector<KeyId> keys;
  // Per key of the batch, its descriptor read in place (into `taken`'s
  // descriptors; kind kNone: none).
  std::vector<protocol::DescriptorView> key_views;

  // The batching thread's own.
  int64_t next_seq = 0;
  std::deque<Batch> kept;
  uint64_t kept_bytes = 0;   // kept's payloads
  uint64_t batch_bytes = 0;  // the batch being built, as estimated
  Payload spare;  // the last batch's bytes when none are kept for replay

  ~Impl() {
    if (pub != nullptr) zmq_close(pub);
    if (replay != nullptr) zmq_close(replay);
    if (ctx != nullptr) zmq_ctx_term(ctx);
  }

  // wait: a full queue is waited out (the start-up listing) instead of
  // dropping the event.
  void Queue(KvEvent::Type type, Medium medium, const KeyId& key,
             const blocks::Descriptor& descriptor, bool wait = false) {
    std::unique_lock lock(mu);
    while (wait && pending_keys >= opts.max_queued_events && !stopping) {
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      lock.lock();
    }
    if (pending_keys >= opts.max_queued_events) {
      dropped->Inc();
      return;
    }
    pending.push_back(Told{key, type, medium, descriptor, -1});
    ++pending_keys;
  }

  void SetNoDrop(bool on) {
    const int v = on ? 1 : 0;
    zmq_setsockopt(pub, ZMQ_XPUB_NODROP, &v, sizeof(v));
  }

  bool SendFrames(void* socket, const std::vector<std::string_view>& frames) {
    for (size_t i = 0; i < frames.size(); ++i) {
      const int flags = ZMQ_DONTWAIT | (i + 1 < frames.size() ? ZMQ_SNDMORE : 0);
      if (zmq_send(socket, frames[i].data(), frames[i].size(), flags) < 0) return false;
    }
    return true;
  }

  size_t TopicOf(const Told& t) const {
    if (t.topic >= 0) return static_cast<size_t>(t.topic);
    if (topic_of_tag.empty()) return 0;
    auto it = topic_of_tag.find(NamespaceTagOf(t.key));
    return it == topic_of_tag.end() ? 0 : it->second;
  }

  // [topic, seq, payload] on the PUB socket, the payload without a copy.
  bool SendBatch(const std::string& topic, const std::string& seq, const Payload& payload) {
    if (zmq_send(pub, topic.data(), topic.size(), ZMQ_DONTWAIT | ZMQ_SNDMORE) < 0 ||
        zmq_send(pub, seq.data(), seq.size(), ZMQ_DONTWAIT | ZMQ_SNDMORE) < 0) {
      return false;
    }
    zmq_msg_t m;
    zmq_msg_init_data(&m, payload->data(), payload->size(), ReleasePayload, new Payload(payload));
    if (zmq_msg_send(&m, pub, ZMQ_DONTWAIT) >= 0) return true;
    const int err = zmq_errno();  // the caller reads it (EAGAIN: a subscriber is full)
    zmq_msg_close(&m);            // releases the payload
    errno = err;
    return false;
  }

  // A buffer to encode the next batch (at most `bound` bytes) into: the
  // last one to leave the replay buffer (or the last batch, when none are
  // kept) once the socket has let go of it, else a new one. A new one's
  // pages are made in one call: until the replay buffer is full every
  // batch is new memory, and a page fault per page of it cost a node on a
  // VM up to a tenth of its put rate.
  Payload TakeBuffer(size_t bound) {
    Payload b = std::move(spare);
    if (b != nullptr && b.use_count() == 1) return b;
    b = std::make_shared<std::string>();
    b->reserve(bound);
    PopulateForWrite(b->data(), bound);
    return b;
  }

  // Sends what is queued, in batches of at most max_batch_keys blocks.
  void Flush() {
    std::function<void()> before;
    {
      std::lock_guard lock(mu);
      before = before_batch;
    }
    if (before) before();
    taken.clear();
    {
      std::lock_guard lock(mu);
      taken.swap(pending);
      pending_keys = 0;
    }
    Reset();
    size_t topic = 0;
    for (const Told& t : taken) {
      // A batch is one topic's: another topic's event sends what is built.
      if (const size_t tt = TopicOf(t); tt != topic) {
        if (!runs.empty()) Send(topic);
        Reset();
        topic = tt;
      }
      const auto at = static_cast<uint32_t>(keys.size());
      if (t.type == KvEvent::Type::kAllCleared) {
        runs.push_back(EventRun{t.type, t.medium, at, at, false});
        continue;
      }
      keys.push_back(t.key);
      // Undescribed keys of one type and medium merge; so do described
      // blocks of one chain (ContinuesChain), as an engine tells them.
      protocol::DescriptorView view;
      const bool described =
          t.descriptor && protocol::ParseDescriptor(t.descriptor.bytes(), &view).ok();
      key_views.push_back(described ? view : protocol::DescriptorView{});
      const bool joins = !runs.empty() && runs.back().type == t.type &&
                         runs.back().medium == t.medium && runs.back().end == at &&
                         runs.back().described == described &&
                         (!described || ContinuesChain(t.type, key_views[at - 1], view));
      if (!joins) runs.push_back(EventRun{t.type, t.medium, at, at, described});
      runs.back().end = at + 1;
      batch_bytes += (joins ? 0 : kEventFieldBytes) + kEventKeyBytes +
                     (described ? kEventTokenBytes * view.n_tokens : 0);
      if (keys.size() == opts.max_batch_keys || batch_bytes >= opts.max_batch_bytes) {
        Send(topic);
        Reset();
      }
    }
    if (!runs.empty()) Send(topic);
  }

  void Reset() {
    batch_bytes = 0;
    runs.clear();
    keys.clear();
    key_views.clear();
  }

  // Sends the batch in runs and keys on topics[topic].
  void Send(size_t topic) {
    const double ts =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    const int64_t n = next_seq++;
    Payload payload = TakeBuffer(EncodedBatchBound(runs, keys, key_views));
    EncodeBatchInto(payload.get(), ts, runs, keys, opts.encoding, opts.hash_type, key_views);
    const std::string seq = SeqFrame(n);
    // The PUB socket refuses a batch while any subscriber is at its
    // high-water mark (ZMQ_XPUB_NODROP): then it is sent again lossy, which
    // drops it for the full subscribers alone (the others get it), and the
    // stall is counted. ZMQ then leaves that subscriber out of every batch
    // until it has read its backlog, which the node cannot see: it sees the
    // gap in sequence numbers and replays. A send that fails even so is
    // lost to every subscriber, and counted.
    const uint64_t n_keys = keys.size();
    bool sent = SendBatch(topics[topic], seq, payload);
    if (!sent && zmq_errno() == EAGAIN) {
      SetNoDrop(false);
      sent = SendBatch(topics[topic], seq, payload);
      SetNoDrop(true);
      if (sent) {
        subscriber_stalls->Inc();
        subscriber_dropped->Inc(n_keys);
      }
    }
    if (sent) {
      batches_sent->Inc();
      events_sent->Inc(n_keys);
    } else {
      dropped->Inc(n_keys);
    }
    if (opts.replay_batches > 0) {
      kept_bytes += payload->size();
      kept.push_back(Batch{n, std::move(payload), topic});
      // Past replay_batches or replay_bytes, the oldest batches go (the
      // newest stays).
      while (kept.size() > opts.replay_batches ||
             (kept.size() > 1 && kept_bytes > opts.replay_bytes)) {
        kept_bytes -= kept.front().payload->size();
        spare = std::move(kept.front().payload);
        kept.pop_front();
      }
    } else {
      spare = std::move(payload);
    }
  }

  // One replay request: [identity, ..., start seq (8 bytes)].
  void ServeReplay() {
    std::vector<std::string> frames;
    for (;;) {  // every frame is read; at most 4 are kept
      zmq_msg_t m;
      zmq_msg_init(&m);
      if (zmq_msg_recv(&m, replay, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&m);
        return;
      }
      if (frames.size() < 4) {
        frames.emplace_back(static_cast<const char*>(zmq_msg_data(&m)), zmq_msg_size(&m));
      }
      const bool more = zmq_msg_more(&m) != 0;
      zmq_msg_close(&m);
      if (!more) break;
    }
    replays->Inc();
    if (frames.size() < 2 || frames.back().size() != 8) return;  // not a request: ignored
    int64_t start = 0;
    for (unsigned char c : frames.back()) start = (start << 8) | c;
    const std::string& who = frames.front();
    const bool delimited = frames.size() >= 3 && frames[frames.size() - 2].empty();
    // [topic, seq, payload], or [seq, payload] for the older subscribers.
    const bool two = opts.replay_framing == ReplayFraming::kTwoFrames;
    auto reply = [&](std::string_view a, std::string_view b, std::string_view c) {
      std::vector<std::string_view> out = {who};
      if (delimited) out.push_back("");
      if (!two) out.push_back(a);
      out.insert(out.end(), {b, c});
      return SendFrames(replay, out);
    };
    for (const Batch& b : kept) {
      if (b.seq < start) continue;
      if (!reply(topics[b.topic], SeqFrame(b.seq), *b.payload)) return;
    }
    reply("", SeqFrame(-1), "");
  }

  void Run() {
    pthread_setname_np(pthread_self(), "kvpool-events");
    auto next = std::chrono::steady_clock::now() + opts.batch_interval;
    for (;;) {
      {
        std::unique_lock lock(mu);
        if (stopping) break;
      }
      const auto now = std::chrono::steady_clock::now();
      if (now >= next) {
        Flush();
        next = now + opts.batch_interval;
      }
      const long wait_ms = std::max<long>(
          1, std::chrono::duration_cast<std::chrono::milliseconds>(next - now).count());
      if (replay != nullptr) {
        zmq_pollitem_t item{replay, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&item, 1, wait_ms) > 0) ServeReplay();
      } else {
        std::unique_lock lock(mu);
        cv.wait_for(lock, std::chrono::milliseconds(wait_ms), [&] { return stopping; });
      }
    }
    Flush();
  }
};

Result<std::unique_ptr<KvEventsPublisher>> KvEventsPublisher::Start(const KvEventsOptions& options,
                                                                    MetricsRegistry* metrics) {
  KVPOOL_RETURN_IF_ERROR(options.Validate());
  auto impl = std::make_unique<Impl>();
  impl->opts = options;
  impl->events_sent =
      metrics->GetCounter("kvpool_kv_events_total", "Blocks told in KV events sent to routers");
  impl->batches_sent =
      metrics->GetCounter("kvpool_kv_events_batches_total", "KV event batches sent");
  impl->dropped = metrics->GetCounter(
      "kvpool_kv_events_dropped_total",
      "Blocks whose KV events were dropped (queue full, or a subscriber over its high-water "
      "mark)");
  impl->subscriber_dropped = metrics->GetCounter(
      "kvpool_kv_events_subscriber_dropped_total",
      "Blocks in the KV event batches that found a subscriber at its high-water mark (sent to "
      "the others); that subscriber then misses every batch until it has read its backlog");
  impl->subscriber_stalls = metrics->GetCounter(
      "kvpool_kv_events_subscriber_stalls_total",
      "Times a KV events subscriber was found at its high-water mark and left behind");
  impl->replays =
      metrics->GetCounter("kvpool_kv_events_replays_total", "KV event replay requests served");
  impl->ctx = zmq_ctx_new();
  if (impl->ctx == nullptr) return ZmqError("context");
  impl->pub = zmq_socket(impl->ctx, ZMQ_PUB);
  if (impl->pub == nullptr) return ZmqError("PUB socket");
  const int zero = 0;
  zmq_setsockopt(impl->pub, ZMQ_SNDHWM, &options.send_hwm, sizeof(int));
  zmq_setsockopt(impl->pub, ZMQ_LINGER, &zero, sizeof(zero));
  impl->SetNoDrop(true);  // so a subscriber at its high-water mark is noticed
  if (zmq_bind(impl->pub, options.endpoint.c_str()) != 0) {
    return ZmqError(fmt::format("bind {}", options.endpoint));
  }
  if (!options.replay_endpoint.empty()) {
    impl->replay = zmq_socket(impl->ctx, ZMQ_ROUTER);
    if (impl->replay == nullptr) return ZmqError("ROUTER socket");
    zmq_setsockopt(impl->replay, ZMQ_LINGER, &zero, sizeof(zero));
    // A request is a few small frames: anything larger is refused by ZMQ
    // before it is read (the peer is dropped).
    const int64_t max_msg = 256;
    zmq_setsockopt(impl->replay, ZMQ_MAXMSGSIZE, &max_msg, sizeof(max_msg));
    if (zmq_bind(impl->replay, options.replay_endpoint.c_str()) != 0) {
      return ZmqError(fmt::format("bind {}", options.replay_endpoint));
    }
  }
  impl->bound = LastEndpoint(impl->pub);
  impl->bound_replay = LastEndpoint(impl->replay);
  LogInfo("kv events: publishing on {}{}", impl->bound,
          impl->replay ? fmt::format(", replay on {}", impl->bound_replay) : "");
  impl->topics.push_back(options.topic);
  for (const auto& [tag, topic] : options.namespace_topics) {
    impl->topic_of_tag[tag] = impl->topics.size();
    impl->topics.push_back(topic);
  }
  for (size_t t = 0; t < impl->topics.size(); ++t) {
    impl->pending.push_back(Told{KeyId{}, KvEvent::Type::kAllCleared, Medium::kCpu,
                                 blocks::Descriptor(), static_cast<int>(t)});
  }
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->Run(); });
  return std::unique_ptr<KvEventsPublisher>(new KvEventsPublisher(std::move(impl)));
}

KvEventsPublisher::KvEventsPublisher(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

KvEventsPublisher::~KvEventsPublisher() {
  {
    std::lock_guard lock(impl_->mu);
    impl_->stopping = true;
  }
  impl_->cv.notify_all();
  if (impl_->thread.joinable()) impl_->thread.join();
}

void KvEventsPublisher::OnBlockEvent(const HoldingsEvent& e, const blocks::Descriptor& descriptor) {
  const Medium tier = e.tier == HoldingTier::kDram ? Medium::kCpu : Medium::kStorage;
  if (e.kind == HoldingsEvent::Kind::kStored) {
    impl_->Queue(KvEvent::Type::kStored, Medium::kCpu, e.key, descriptor);
    return;
  }
  impl_->Queue(KvEvent::Type::kRemoved, tier, e.key, descriptor);
  if (e.why == HoldingsEvent::Why::kMovedToSsd) {
    impl_->Queue(KvEvent::Type::kStored, Medium::kStorage, e.key, descriptor);
  }
}

void KvEventsPublisher::Recovered(const KeyId& key) {
  impl_->Queue(KvEvent::Type::kStored, Medium::kStorage, key, blocks::Descriptor(), /*wait=*/true);
}

void KvEventsPublisher::SetBeforeBatch(std::function<void()> fn) {
  std::lock_guard lock(impl_->mu);
  impl_->before_batch = std::move(fn);
}

std::string KvEventsPublisher::bound_endpoint() const { return impl_->bound; }
std::string KvEventsPublisher::bound_replay_endpoint() const { return impl_->bound_replay; }

Result<std::map<uint32_t, std::string>> ReadNamespaceTopics(const std::string& path) {
  std::ifstream in(path);
  if (!in) return IOError(fmt::format("kv events topics file {}: cannot read it", path));
  std::map<uint32_t, std::string> out;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line[0] == '#') continue;
    const size_t eq = line.rfind('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == line.size()) {
      return InvalidArgument(fmt::format(
          "kv events topics file {} line {}: want NAMESPACE=TOPIC, got '{}'", path, n, line));
    }
    const std::string topic = line.substr(eq + 1);
    if (!ValidTopic(topic)) {
      return InvalidArgument(fmt::format(
          "kv events topics file {} line {}: topic '{}': a kv@ topic is kv@<pod>@<model>", path, n,
          topic));
    }
    out[NamespaceTag(line.substr(0, eq))] = topic;
  }
  return out;
}

}  // namespace kvpool::events
