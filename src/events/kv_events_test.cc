// The KV event format (decoded back with msgpack) and the publisher's
// sequence numbers, batching, replay and bounded queue over real ZMQ sockets.
#include "events/kv_events.h"

#include <gtest/gtest.h>
#include <zmq.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#define MSGPACK_NO_BOOST
#include <msgpack.hpp>

#include "events/kv_events_format.h"
#include "protocol/descriptor_format.h"
#include "testing/wait_for.h"

namespace kvpool::events {
namespace {

using testing::WaitFor;

KeyId K(int i) { return MakeKeyId("ev", std::to_string(i)); }

std::string Hash(const KeyId& k) {
  std::string b(16, '\0');
  for (int i = 0; i < 8; ++i) {
    b[i] = static_cast<char>(k.hi >> (56 - 8 * i));
    b[8 + i] = static_cast<char>(k.lo >> (56 - 8 * i));
  }
  return b;
}

TEST(KvEventsFormat, ConsecutiveEventsOfOneTypeAndMediumMerge) {
  std::vector<KvEvent> ev;
  AppendEvent(&ev, KvEvent::Type::kStored, Medium::kCpu, K(1));
  AppendEvent(&ev, KvEvent::Type::kStored, Medium::kCpu, K(2));
  AppendEvent(&ev, KvEvent::Type::kRemoved, Medium::kCpu, K(1));
  AppendEvent(&ev, KvEvent::Type::kStored, Medium::kStorage, K(1));
  ASSERT_EQ(ev.size(), 3u);
  EXPECT_EQ(ev[0].keys, (std::vector<KeyId>{K(1), K(2)}));
  EXPECT_EQ(ev[2].medium, Medium::kStorage);
  EXPECT_EQ(SeqFrame(258), std::string("\0\0\0\0\0\0\x01\x02", 8));
  EXPECT_EQ(SeqFrame(-1), std::string(8, '\xff'));
}

// Every field vLLM's decoder requires is present in a map (a missing one
// fails the whole batch there, ENGINES.md 7.1), arrays are positional, and
// hashes are ints by default or the 16-byte key ids.
TEST(KvEventsFormat, BatchesDecodeInBothEncodings) {
  std::vector<KvEvent> ev;
  AppendEvent(&ev, KvEvent::Type::kStored, Medium::kCpu, K(1));
  AppendEvent(&ev, KvEvent::Type::kRemoved, Medium::kStorage, K(2));
  ev.push_back(KvEvent{KvEvent::Type::kAllCleared, Medium::kCpu, {}});
  for (HashType ht : {HashType::kInt64, HashType::kBytes}) {
    auto hash_is = [&](const msgpack::object& h, const KeyId& k) {
      if (ht == HashType::kInt64) {
        return h.type == msgpack::type::POSITIVE_INTEGER && h.as<uint64_t>() == k.hi;
      }
      return h.type == msgpack::type::BIN && std::string(h.via.bin.ptr, h.via.bin.size) == Hash(k);
    };
    for (Encoding enc : {Encoding::kMap, Encoding::kArray}) {
      const std::string bytes = EncodeBatch(12.5, ev, enc, ht);
      msgpack::object_handle oh = msgpack::unpack(bytes.data(), bytes.size());
      const msgpack::object& batch = oh.get();
      ASSERT_EQ(batch.type, msgpack::type::ARRAY);
      ASSERT_EQ(batch.via.array.size, 3u);
      EXPECT_EQ(batch.via.array.ptr[0].as<double>(), 12.5);
      EXPECT_TRUE(batch.via.array.ptr[2].is_nil());
      const msgpack::object& events = batch.via.array.ptr[1];
      ASSERT_EQ(events.via.array.size, 3u);
      if (enc == Encoding::kMap) {
        auto stored = events.via.array.ptr[0].as<std::map<std::string, msgpack::object>>();
        EXPECT_EQ(stored.size(), 9u);
        for (const char* f : {"type", "block_hashes", "parent_block_hash", "token_ids",
                              "block_size", "lora_id", "medium", "lora_name", "locality"}) {
          EXPECT_EQ(stored.count(f), 1u) << f;
        }
        EXPECT_EQ(stored["type"].as<std::string>(), "BlockStored");
        EXPECT_EQ(stored["medium"].as<std::string>(), "CPU");
        EXPECT_EQ(stored["locality"].as<std::string>(), "LOCAL");
        EXPECT_TRUE(stored["parent_block_hash"].is_nil());
        EXPECT_TRUE(stored["lora_id"].is_nil());
        EXPECT_TRUE(stored["lora_name"].is_nil());
        EXPECT_EQ(stored["token_ids"].via.array.size, 0u);
        EXPECT_EQ(stored["block_size"].as<uint64_t>(), 0u);
        ASSERT_EQ(stored["block_hashes"].via.array.size, 1u);
        EXPECT_TRUE(hash_is(stored["block_hashes"].via.array.ptr[0], K(1)));
        auto removed = events.via.array.ptr[1].as<std::map<std::string, msgpack::object>>();
        EXPECT_EQ(removed.size(), 4u);
        EXPECT_EQ(removed["medium"].as<std::string>(), "STORAGE");
        EXPECT_EQ(removed["locality"].as<std::string>(), "LOCAL");
        EXPECT_TRUE(hash_is(removed["block_hashes"].via.array.ptr[0], K(2)));
        auto cleared = events.via.array.ptr[2].as<std::map<std::string, msgpack::object>>();
        EXPECT_EQ(cleared.size(), 1u);
        EXPECT_EQ(cleared["type"].as<std::string>(), "AllBlocksCleared");
      } else {
        const msgpack::object& stored = events.via.array.ptr[0];
        ASSERT_EQ(stored.via.array.size, 8u);  // tag + BlockStored's 7 required fields
        EXPECT_EQ(stored.via.array.ptr[0].as<std::string>(), "BlockStored");
        EXPECT_TRUE(hash_is(stored.via.array.ptr[1].via.array.ptr[0], K(1)));
        EXPECT_TRUE(stored.via.array.ptr[2].is_nil());               // parent_block_hash
        EXPECT_EQ(stored.via.array.ptr[3].via.array.size, 0u);       // token_ids
        EXPECT_EQ(stored.via.array.ptr[4].as<uint64_t>(), 0u);       // block_size
        EXPECT_EQ(stored.via.array.ptr[6].as<std::string>(), "CPU");  // medium
        const msgpack::object& removed = events.via.array.ptr[1];
        ASSERT_EQ(removed.via.array.size, 3u);
        EXPECT_EQ(removed.via.array.ptr[2].as<std::string>(), "STORAGE");
        EXPECT_EQ(events.via.array.ptr[2].via.array.size, 1u);
      }
    }
  }
}

protocol::BlockDescriptor Described(uint64_t hash, std::optional<uint64_t> parent,
                                    uint32_t first_token) {
  protocol::BlockDescriptor d;
  d.hash = {protocol::EngineHash::Kind::kUint64, hash, ""};
  if (parent) d.parent = {protocol::EngineHash::Kind::kUint64, *parent, ""};
  d.block_size = 4;
  for (uint32_t t = 0; t < 4; ++t) d.token_ids.push_back(first_token + t);
  d.group_idx = 1;
  d.lora_name = "sql-lora";
  d.spec_kind = "full";
  return d;
}

std::string Bytes(const protocol::BlockDescriptor& d) {
  auto b = protocol::EncodeDescriptor(d);
  EXPECT_TRUE(b.ok()) << b.status().ToString();
  return b.ok() ? *b : std::string();
}

using Fields = std::map<std::string, msgpack::object>;

// A descriptor's bytes read in place (they must outlive the view).
protocol::DescriptorView View(const std::string& b) {
  protocol::DescriptorView v;
  EXPECT_TRUE(
      protocol::ParseDescriptor({reinterpret_cast<const uint8_t*>(b.data()), b.size()}, &v).ok());
  return v;
}

// Described blocks are named by the writer's hash, parent, tokens, block
// size and LoRA name; a chain's blocks are one event (hashes in order, the
// first one's parent, the tokens concatenated); group_idx and the spec kind
// are told in maps only (arrays stay at the required fields).
TEST(KvEventsFormat, DescribedBlocksAreNamedTheEnginesWay) {
  const std::string d1 = Bytes(Described(0x1111, std::nullopt, 100));
  const std::string d2 = Bytes(Described(0x2222, 0x1111, 104));
  const std::vector<KeyId> keys = {K(1), K(2), K(3), K(4), K(1)};
  const std::vector<protocol::DescriptorView> refs = {View(d1), View(d2), {}, {}, View(d1)};
  // K(1), K(2): one chain; K(3), K(4) undescribed (one merged event); then
  // K(1) removed.
  const std::vector<EventRun> runs = {{KvEvent::Type::kStored, Medium::kCpu, 0, 2, true},
                                      {KvEvent::Type::kStored, Medium::kCpu, 2, 4, false},
                                      {KvEvent::Type::kRemoved, Medium::kStorage, 4, 5, true}};
  std::string out;
  EncodeBatchInto(&out, 1.0, runs, keys, Encoding::kMap, HashType::kInt64, refs);
  msgpack::object_handle oh = msgpack::unpack(out.data(), out.size());
  const msgpack::object& events = oh.get().via.array.ptr[1];
  ASSERT_EQ(events.via.array.size, 3u);
  auto chain = events.via.array.ptr[0].as<Fields>();
  EXPECT_EQ(chain["block_hashes"].as<std::vector<uint64_t>>(), (std::vector<uint64_t>{0x1111, 0x2222}));
  EXPECT_TRUE(chain["parent_block_hash"].is_nil());
  EXPECT_EQ(chain["token_ids"].as<std::vector<uint32_t>>(),
            (std::vector<uint32_t>{100, 101, 102, 103, 104, 105, 106, 107}));
  EXPECT_EQ(chain["block_size"].as<uint32_t>(), 4u);
  EXPECT_EQ(chain["lora_name"].as<std::string>(), "sql-lora");
  EXPECT_EQ(chain["group_idx"].as<int>(), 1);
  EXPECT_EQ(chain["kv_cache_spec_kind"].as<std::string>(), "full");
  EXPECT_EQ(chain["medium"].as<std::string>(), "CPU");
  auto plain = events.via.array.ptr[1].as<Fields>();
  EXPECT_EQ(plain["block_hashes"].as<std::vector<uint64_t>>(), (std::vector<uint64_t>{K(3).hi, K(4).hi}));
  EXPECT_EQ(plain["block_size"].as<uint32_t>(), 0u);
  EXPECT_EQ(plain.count("group_idx"), 0u);
  auto removed = events.via.array.ptr[2].as<Fields>();
  EXPECT_EQ(removed["block_hashes"].as<std::vector<uint64_t>>(), std::vector<uint64_t>{0x1111});
  EXPECT_EQ(removed["group_idx"].as<int>(), 1);
  EXPECT_EQ(removed["medium"].as<std::string>(), "STORAGE");

  EncodeBatchInto(&out, 1.0, runs, keys, Encoding::kArray, HashType::kInt64, refs);
  oh = msgpack::unpack(out.data(), out.size());
  const msgpack::object& arr = oh.get().via.array.ptr[1].via.array.ptr[0];
  ASSERT_EQ(arr.via.array.size, 8u);
  EXPECT_EQ(arr.via.array.ptr[1].as<std::vector<uint64_t>>(), (std::vector<uint64_t>{0x1111, 0x2222}));
  EXPECT_TRUE(arr.via.array.ptr[2].is_nil());
  EXPECT_EQ(arr.via.array.ptr[3].via.array.size, 8u);
  EXPECT_EQ(arr.via.array.ptr[4].as<uint32_t>(), 4u);
  EXPECT_EQ(arr.via.array.ptr[7].as<std::string>(), "sql-lora");
}

// Token ids at each width msgpack has for them (fixint, uint8, uint16,
// uint32) decode to what was put, and their bytes are msgpack's own: the
// token array packed here with msgpack's packer is found in the batch as is.
TEST(KvEventsFormat, TokensOfEveryWidthAreMsgpacksSmallestForm) {
  const std::vector<uint32_t> tokens = {0,     1,     127,   128,        255,        256,
                                        65535, 65536, 70000, 0x7fffffff, 0xffffffff, 5};
  protocol::BlockDescriptor d;
  d.hash = {protocol::EngineHash::Kind::kUint64, 0x77, ""};
  d.block_size = static_cast<uint32_t>(tokens.size());
  d.token_ids = tokens;
  const std::string b = Bytes(d);
  const std::vector<KeyId> keys = {K(1)};
  const std::vector<protocol::DescriptorView> views = {View(b)};
  const std::vector<EventRun> runs = {{KvEvent::Type::kStored, Medium::kCpu, 0, 1, true}};
  msgpack::sbuffer want;
  msgpack::pack(want, tokens);
  for (Encoding enc : {Encoding::kMap, Encoding::kArray}) {
    std::string out;
    EncodeBatchInto(&out, 1.0, runs, keys, enc, HashType::kInt64, views);
    EXPECT_NE(out.find(std::string(want.data(), want.size())), std::string::npos);
    msgpack::object_handle oh = msgpack::unpack(out.data(), out.size());
    const msgpack::object& ev = oh.get().via.array.ptr[1].via.array.ptr[0];
    const msgpack::object got =
        enc == Encoding::kMap ? ev.as<Fields>()["token_ids"] : ev.via.array.ptr[3];
    EXPECT_EQ(got.as<std::vector<uint32_t>>(), tokens);
  }
  // More tokens than one run of the encoder's buffer (64): 4,096 of them.
  protocol::BlockDescriptor big = d;
  big.token_ids.clear();
  for (uint32_t t = 0; t < 4096; ++t) big.token_ids.push_back(t * 1049u);
  big.block_size = 4096;
  const std::string bb = Bytes(big);
  const std::vector<protocol::DescriptorView> big_views = {View(bb)};
  std::string out;
  EncodeBatchInto(&out, 1.0, runs, keys, Encoding::kMap, HashType::kInt64, big_views);
  msgpack::object_handle oh = msgpack::unpack(out.data(), out.size());
  EXPECT_EQ(oh.get()
                .via.array.ptr[1]
                .via.array.ptr[0]
                .as<Fields>()["token_ids"]
                .as<std::vector<uint32_t>>(),
            big.token_ids);
}

// Which blocks may share an event: a chain of one block size, group, LoRA
// and spec kind.
TEST(KvEventsFormat, OnlyAChainOfLikeBlocksSharesAnEvent) {
  auto view = [](const std::string& b) { return View(b); };
  const std::string a = Bytes(Described(1, std::nullopt, 0));
  const std::string b = Bytes(Described(2, 1, 4));
  const std::string not_child = Bytes(Described(3, 7, 8));
  auto other_group = Described(2, 1, 4);
  other_group.group_idx = 2;
  const std::string g = Bytes(other_group);
  const auto S = KvEvent::Type::kStored, R = KvEvent::Type::kRemoved;
  EXPECT_TRUE(ContinuesChain(S, view(a), view(b)));
  EXPECT_FALSE(ContinuesChain(S, view(a), view(not_child)));
  EXPECT_FALSE(ContinuesChain(S, view(a), view(g)));
  EXPECT_TRUE(ContinuesChain(R, view(a), view(not_child)));
  EXPECT_FALSE(ContinuesChain(R, view(a), view(g)));
}

// int64 writes a bytes hash as its last 8 bytes (big-endian); bytes writes an
// int as 8 bytes (big-endian); as-written keeps each as the writer gave it.
TEST(KvEventsFormat, HashTypesConvertTheEnginesHash) {
  protocol::BlockDescriptor b;
  b.hash = {protocol::EngineHash::Kind::kBytes, 0,
            std::string("\xaa\x01\x02\x03\x04\x05\x06\x07\x08", 9)};
  b.parent = {protocol::EngineHash::Kind::kInt64, static_cast<uint64_t>(int64_t{-2}), ""};
  b.block_size = 1;
  const std::string d = Bytes(b);
  const std::vector<KeyId> keys = {K(1)};
  const std::vector<EventRun> runs = {{KvEvent::Type::kStored, Medium::kCpu, 0, 1, true}};
  const std::vector<protocol::DescriptorView> refs = {View(d)};
  auto fields = [&](HashType ht) {
    std::string out;
    EncodeBatchInto(&out, 1.0, runs, keys, Encoding::kMap, ht, refs);
    msgpack::object_handle oh = msgpack::unpack(out.data(), out.size());
    Fields f = oh.get().via.array.ptr[1].via.array.ptr[0].as<Fields>();
    auto z = std::make_shared<msgpack::zone>();
    Fields copy;
    for (auto& [k, v] : f) copy[k] = msgpack::object(v, *z);
    return std::make_pair(copy, z);
  };
  auto [i64, z1] = fields(HashType::kInt64);
  EXPECT_EQ(i64["block_hashes"].via.array.ptr[0].as<uint64_t>(), 0x0102030405060708u);
  EXPECT_EQ(i64["parent_block_hash"].as<int64_t>(), -2);
  auto [by, z2] = fields(HashType::kBytes);
  const msgpack::object& h = by["block_hashes"].via.array.ptr[0];
  ASSERT_EQ(h.type, msgpack::type::BIN);
  EXPECT_EQ(std::string(h.via.bin.ptr, h.via.bin.size), b.hash.bytes);
  const msgpack::object& p = by["parent_block_hash"];
  ASSERT_EQ(p.type, msgpack::type::BIN);
  EXPECT_EQ(std::string(p.via.bin.ptr, p.via.bin.size), std::string(7, '\xff') + "\xfe");
  auto [aw, z3] = fields(HashType::kAsWritten);
  EXPECT_EQ(aw["block_hashes"].via.array.ptr[0].type, msgpack::type::BIN);
  EXPECT_EQ(aw["parent_block_hash"].as<int64_t>(), -2);
}

TEST(KvEventsFormat, KvTopicsNameThePodAndTheModel) {
  for (const char* ok : {"", "kvpool", "kv@node-7@llama-3-70b"}) EXPECT_TRUE(ValidTopic(ok)) << ok;
  for (const char* bad : {"kv@", "kv@pod", "kv@pod@", "kv@@model", "kv@a@b@c"}) {
    EXPECT_FALSE(ValidTopic(bad)) << bad;
  }
  KvEventsOptions o;
  o.endpoint = "tcp://127.0.0.1:0";
  o.topic = "kv@pod";
  EXPECT_EQ(o.Validate().code(), StatusCode::kInvalidArgument);
}

// The frames of the next message on `socket`; false after timeout_ms without one.
bool RecvMessage(void* socket, int timeout_ms, std::vector<std::string>* frames) {
  frames->clear();
  int more = 1;
  while (more) {
    zmq_pollitem_t item{socket, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&item, 1, timeout_ms) <= 0) return false;
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, socket, 0) < 0) {
      zmq_msg_close(&m);
      return false;
    }
    frames->emplace_back(static_cast<const char*>(zmq_msg_data(&m)), zmq_msg_size(&m));
    more = zmq_msg_more(&m);
    zmq_msg_close(&m);
  }
  return true;
}

// Receives every message the replay socket answers for `start`.
std::vector<std::vector<std::string>> Replay(void* ctx, const std::string& endpoint,
                                             int64_t start) {
  void* d = zmq_socket(ctx, ZMQ_DEALER);
  EXPECT_EQ(zmq_connect(d, endpoint.c_str()), 0);
  const std::string s = SeqFrame(start);
  zmq_send(d, "", 0, ZMQ_SNDMORE);
  zmq_send(d, s.data(), s.size(), 0);
  std::vector<std::vector<std::string>> out;
  for (;;) {
    std::vector<std::string> frames;
    if (!RecvMessage(d, 5000, &frames)) {
      ADD_FAILURE() << "replay answered no end marker";
      break;
    }
    if (frames.size() == 4 && frames[2] == SeqFrame(-1)) break;
    out.push_back(frames);
  }
  zmq_close(d);
  return out;
}

// A publisher on free loopback ports, both sockets, batching every 1 ms.
KvEventsOptions LoopbackOptions() {
  KvEventsOptions o;
  o.endpoint = "tcp://127.0.0.1:0";
  o.replay_endpoint = "tcp://127.0.0.1:0";
  o.batch_interval = std::chrono::milliseconds(1);
  return o;
}

// Older subscribers unpack two frames a reply: [seq, payload], and the end
// marker [-1, ""].
TEST(KvEventsPublisher, ReplayInTwoFramesForOlderSubscribers) {
  MetricsRegistry metrics;
  KvEventsOptions o = LoopbackOptions();
  o.topic = "kv@node-a@model-x";
  o.replay_framing = ReplayFraming::kTwoFrames;
  auto p = KvEventsPublisher::Start(o, &metrics);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  HoldingsEvent e;
  e.key = K(7);
  (*p)->OnBlockEvent(e, blocks::Descriptor());
  WaitFor([&] { return metrics.ValueOf("kvpool_kv_events_total") >= 1; },
          std::chrono::milliseconds(1000));
  void* ctx = zmq_ctx_new();
  void* d = zmq_socket(ctx, ZMQ_DEALER);
  ASSERT_EQ(zmq_connect(d, (*p)->bound_replay_endpoint().c_str()), 0);
  const std::string s = SeqFrame(0);
  zmq_send(d, "", 0, ZMQ_SNDMORE);
  zmq_send(d, s.data(), s.size(), 0);
  std::vector<std::string> frames;
  int64_t seq = 0;
  for (;;) {
    ASSERT_TRUE(RecvMessage(d, 5000, &frames));
    ASSERT_EQ(frames.size(), 3u);  // delimiter, seq, payload: no topic
    EXPECT_EQ(frames[0], "");
    if (frames[1] == SeqFrame(-1)) {
      EXPECT_EQ(frames[2], "");
      break;
    }
    EXPECT_EQ(frames[1], SeqFrame(seq++));
    EXPECT_FALSE(frames[2].empty());
  }
  EXPECT_GE(seq, 1);
  zmq_close(d);
  p->reset();
  zmq_ctx_term(ctx);
}

// (type, medium, block hash) of each block the replay socket returns, in
// order (the start's AllBlocksCleared left out).
using ToldBlock = std::tuple<std::string, std::string, uint64_t>;
std::vector<ToldBlock> ReplayedBlocks(void* ctx, const std::string& endpoint) {
  std::vector<ToldBlock> told;
  for (const auto& frames : Replay(ctx, endpoint, 0)) {
    const std::string& payload = frames.back();
    msgpack::object_handle oh = msgpack::unpack(payload.data(), payload.size());
    const msgpack::object& events = oh.get().via.array.ptr[1];
    for (uint32_t i = 0; i < events.via.array.size; ++i) {
      Fields f = events.via.array.ptr[i].as<Fields>();
      if (f["type"].as<std::string>() == "AllBlocksCleared") continue;
      for (uint64_t h : f["block_hashes"].as<std::vector<uint64_t>>()) {
        told.emplace_back(f["type"].as<std::string>(), f["medium"].as<std::string>(), h);
      }
    }
  }
  return told;
}

// Through the block descriptors, the publisher names a staged key's block
// by its descriptor from its write to its last event; a stage whose commit
// failed is forgotten, and a stage past the budget leaves the key named by
// its key id.
TEST(KvEventsPublisher, DescribedKeysAreNamedFromTheirWriteToTheirLastEvent) {
  MetricsRegistry metrics;
  KvEventsOptions o = LoopbackOptions();
  const std::string d1 = Bytes(Described(0xa1, std::nullopt, 1));
  const std::string d2 = Bytes(Described(0xa2, 0xa1, 5));
  blocks::DescriptorTable table(
      2 * blocks::DescriptorTable::kEntryOverheadBytes + d1.size() + d2.size(), &metrics);
  auto p = KvEventsPublisher::Start(o, &metrics);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  table.SetListeners(p->get(), nullptr);
  auto span = [](const std::string& s) { return blocks::Descriptor::Parse(s); };
  EXPECT_NE(table.Stage(K(1), span(d1)), 0u);
  const uint64_t failed = table.Stage(K(2), span(d2));
  ASSERT_NE(failed, 0u);
  EXPECT_EQ(table.Stage(K(3), span(d2)), 0u);  // over the budget: told by its key id
  EXPECT_EQ(metrics.ValueOf("kvpool_descriptors_refused_total"), 1);
  table.Unstage(K(2), failed);  // K(2)'s commit failed
  EXPECT_EQ(table.entries(), 1u);

  HoldingsEvent e;
  e.key = K(1);
  table.OnHoldings(e);  // written
  e.key = K(2);
  table.OnHoldings(e);  // written without a descriptor (its stage was undone)
  e.kind = HoldingsEvent::Kind::kDropped;
  e.key = K(1);
  e.why = HoldingsEvent::Why::kMovedToSsd;
  e.still_held = true;
  table.OnHoldings(e);  // CPU -> STORAGE
  e.why = HoldingsEvent::Why::kRemoved;
  e.tier = HoldingTier::kSsd;
  e.still_held = false;
  table.OnHoldings(e);  // gone
  WaitFor([&] { return metrics.ValueOf("kvpool_kv_events_total") >= 5; },
          std::chrono::milliseconds(2000));
  ASSERT_EQ(metrics.ValueOf("kvpool_kv_events_total"), 5);
  EXPECT_EQ(table.entries(), 0u);
  EXPECT_EQ(table.bytes(), 0u);
  void* ctx = zmq_ctx_new();
  const std::vector<ToldBlock> told = ReplayedBlocks(ctx, (*p)->bound_replay_endpoint());
  const std::vector<ToldBlock> want = {{"BlockStored", "CPU", 0xa1},
                                       {"BlockStored", "CPU", K(2).hi},
                                       {"BlockRemoved", "CPU", 0xa1},
                                       {"BlockStored", "STORAGE", 0xa1},
                                       {"BlockRemoved", "STORAGE", 0xa1}};
  EXPECT_EQ(told, want);
  table.SetListeners(nullptr, nullptr);
  p->reset();
  zmq_ctx_term(ctx);
}

// A table made without a thread of its own (apply interval 0) is applied by
// the publisher's batch rounds through SetBeforeBatch, as the node wires it:
// its events go out with no read of the table. Without the hook nothing
// applies it, and nothing is sent (the control).
TEST(KvEventsPublisher, ABatchRoundAppliesATableThatHasNoThread) {
  const std::string d1 = Bytes(Described(0xa1, std::nullopt, 1));
  auto stored = [](blocks::DescriptorTable& table, const KeyId& key, const std::string& d) {
    EXPECT_NE(table.Stage(key, blocks::Descriptor::Parse(d)), 0u);
    HoldingsEvent e;
    e.key = key;
    table.OnHoldings(e);
  };
  {  // the control: no hook
    MetricsRegistry metrics;
    blocks::DescriptorTable table(1 << 20, &metrics, std::chrono::microseconds(0));
    auto p = KvEventsPublisher::Start(LoopbackOptions(), &metrics);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    table.SetListeners(p->get(), nullptr);
    stored(table, K(1), d1);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // 200 batch rounds
    EXPECT_EQ(metrics.ValueOf("kvpool_kv_events_total"), 0);
    EXPECT_EQ(metrics.ValueOf("kvpool_descriptors"), 0);  // staged, not applied
    table.SetListeners(nullptr, nullptr);
  }
  MetricsRegistry metrics;
  blocks::DescriptorTable table(1 << 20, &metrics, std::chrono::microseconds(0));
  auto p = KvEventsPublisher::Start(LoopbackOptions(), &metrics);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  table.SetListeners(p->get(), nullptr);
  (*p)->SetBeforeBatch([&table] { table.Sync(); });
  stored(table, K(1), d1);
  WaitFor([&] { return metrics.ValueOf("kvpool_kv_events_total") >= 1; },
          std::chrono::milliseconds(2000));
  EXPECT_EQ(metrics.ValueOf("kvpool_kv_events_total"), 1);
  EXPECT_EQ(metrics.ValueOf("kvpool_descriptors"), 1);
  void* ctx = zmq_ctx_new();
  const std::vector<ToldBlock> want = {{"BlockStored", "CPU", 0xa1}};  // named by its descriptor
  EXPECT_EQ(ReplayedBlocks(ctx, (*p)->bound_replay_endpoint()), want);
  (*p)->SetBeforeBatch(nullptr);
  table.SetListeners(nullptr, nullptr);
  p->reset();
  zmq_ctx_term(ctx);
}

TEST(KvEventsPublisher, SequenceBatchesReplayAndAFullQueueDropsCounted) {
  MetricsRegistry metrics;
  KvEventsOptions o;
  o.hash_type = HashType::kBytes;  // the 16-byte key ids these tests read back
  o.endpoint = "tcp://127.0.0.1:0";
  o.batch_interval = std::chrono::milliseconds(10000);  // nothing is sent by time
  o.max_queued_events = 5;
  o.max_batch_keys = 2;
  auto p = KvEventsPublisher::Start(o, &metrics);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  HoldingsEvent e;
  e.kind = HoldingsEvent::Kind::kStored;
  for (int i = 0; i < 3; ++i) {
    e.key = K(i);
    (*p)->OnBlockEvent(e, blocks::Descriptor());  // 3 stored
  }
  e.kind = HoldingsEvent::Kind::kDropped;
  e.why = HoldingsEvent::Why::kMovedToSsd;
  e.key = K(0);
  (*p)->OnBlockEvent(e,
                     blocks::Descriptor());  // removed on CPU + stored on STORAGE: 5 queued in all
  e.why = HoldingsEvent::Why::kEvicted;
  e.key = K(1);
  (*p)->OnBlockEvent(e, blocks::Descriptor());  // over the queue: dropped
  EXPECT_EQ(metrics.ValueOf("kvpool_kv_events_dropped_total"), 1);
  p->reset();  // sends what is queued: AllBlocksCleared + 5 blocks, 2 a batch
  EXPECT_EQ(metrics.ValueOf("kvpool_kv_events_total"), 5);
  EXPECT_EQ(metrics.ValueOf("kvpool_kv_events_batches_total"), 3);
}

TEST(KvEventsPublisher, ReplayAnswersTheBatchesFromAStartSeq) {
  MetricsRegistry metrics;
  KvEventsOptions o = LoopbackOptions();
  o.hash_type = HashType::kBytes;  // the 16-byte key ids these tests read back
  o.max_batch_keys = 1;
  auto p = KvEventsPublisher::Start(o, &metrics);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  HoldingsEvent e;
  for (int i = 0; i < 4; ++i) {
    e.key = K(i);
    (*p)->OnBlockEvent(e, blocks::Descriptor());
  }
  WaitFor([&] { return metrics.ValueOf("kvpool_kv_events_total") >= 4; },
          std::chrono::milliseconds(1000));
  ASSERT_EQ(metrics.ValueOf("kvpool_kv_events_total"), 4);
  void* ctx = zmq_ctx_new();
  auto all = Replay(ctx, (*p)->bound_replay_endpoint(), 0);
  // One block a batch; the first also holds AllBlocksCleared, or holds it
  // alone when the 1 ms timer fired before the first block was told.
  const auto batches = static_cast<int64_t>(metrics.ValueOf("kvpool_kv_events_batches_total"));
  ASSERT_TRUE(batches == 4 || batches == 5) << batches;
  ASSERT_EQ(all.size(), static_cast<size_t>(batches));
  for (size_t i = 0; i < all.size(); ++i) {
    ASSERT_EQ(all[i].size(), 4u);  // delimiter, topic, seq, payload
    EXPECT_EQ(all[i][0], "");
    EXPECT_EQ(all[i][2], SeqFrame(static_cast<int64_t>(i)));
  }
  auto tail = Replay(ctx, (*p)->bound_replay_endpoint(), batches - 2);
  ASSERT_EQ(tail.size(), 2u);
  EXPECT_EQ(tail[0], all[batches - 2]);
  EXPECT_EQ(tail[1], all[batches - 1]);
  // A request that is not an 8-byte seq gets nothing and the socket serves on.
  void* d = zmq_socket(ctx, ZMQ_DEALER);
  ASSERT_EQ(zmq_connect(d, (*p)->bound_replay_endpoint().c_str()), 0);
  zmq_send(d, "bad", 3, 0);
  EXPECT_EQ(Replay(ctx, (*p)->bound_replay_endpoint(), batches - 1).size(), 1u);
  zmq_close(d);
  p->reset();
  zmq_ctx_term(ctx);
}

// Batches are bounded in bytes as well as in blocks, and so is the replay
// buffer: described blocks of 4096 tokens (about 20 KB an event) make
// batches of a few blocks each, and replay keeps only the newest batches
// that fit its bytes, in order, ending at the last one sent.
TEST(KvEventsPublisher, BatchesAndTheReplayBufferAreBoundedInBytes) {
  MetricsRegistry metrics;
  KvEventsOptions o = LoopbackOptions();
  o.max_batch_bytes = 64 << 10;
  o.replay_bytes = 256 << 10;
  auto p = KvEventsPublisher::Start(o, &metrics);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  constexpr int kBlocks = 64;
  std::vector<blocks::Descriptor> ds;
  for (int i = 0; i < kBlocks; ++i) {
    protocol::BlockDescriptor d;
    d.hash = {protocol::EngineHash::Kind::kUint64, 1000u + i, ""};  // no chain: an event each
    d.block_size = 4096;
    for (uint32_t t = 0; t < 4096; ++t) d.token_ids.push_back(100000 + t);
    ds.push_back(blocks::Descriptor::Parse(Bytes(d)));
    ASSERT_TRUE(ds.back());
  }
  HoldingsEvent e;
  for (int i = 0; i < kBlocks; ++i) {
    e.key = K(i);
    (*p)->OnBlockEvent(e, ds[i]);
  }
  WaitFor([&] { return metrics.ValueOf("kvpool_kv_events_total") >= kBlocks; },
          std::chrono::milliseconds(2000));
  ASSERT_EQ(metrics.ValueOf("kvpool_kv_events_total"), kBlocks);
  const auto batches = static_cast<int64_t>(metrics.ValueOf("kvpool_kv_events_batches_total"));
  void* ctx = zmq_ctx_new();
  auto kept = Replay(ctx, (*p)->bound_replay_endpoint(), 0);
  size_t bytes = 0;
  for (const auto& f : kept) {
    ASSERT_EQ(f.size(), 4u);
    // Under the bound plus one block's event (the one that crossed it).
    EXPECT_LE(f[3].size(), (64u << 10) + 24u * 1024u);
    bytes += f[3].size();
  }
  // 64 events of ~20 KB in batches of ~64 KB: more than a dozen batches,
  // of which replay keeps the newest within 256 KiB, contiguous up to the
  // last.
  EXPECT_GE(batches, 12);
  ASSERT_FALSE(kept.empty());
  EXPECT_LT(kept.size(), static_cast<size_t>(batches));
  EXPECT_LE(bytes, 256u << 10);
  EXPECT_EQ(kept.back()[2], SeqFrame(batches - 1));
  for (size_t i = 0; i < kept.size(); ++i) {
    EXPECT_EQ(kept[i][2], SeqFrame(batches - static_cast<int64_t>(kept.size() - i)));
  }
  p->reset();
  zmq_ctx_term(ctx);
}

// The stored blocks' hashes a batch's payload tells, in order.
std::vector<std::string> StoredHashes(const std::string& payload) {
  msgpack::object_handle h = msgpack::unpack(payload.data(), payload.size());
  std::vector<std::string> out;
  const msgpack::object& events = h.get().via.array.ptr[1];
  for (uint32_t i = 0; i < events.via.array.size; ++i) {
    auto ev = events.via.array.ptr[i].as<std::map<std::string, msgpack::object>>();
    if (ev["type"].as<std::string>() != "BlockStored") continue;
    for (const auto& b : ev["block_hashes"].as<std::vector<std::vector<char>>>()) {
      out.emplace_back(b.begin(), b.end());
    }
  }
  return out;
}

// The PUB socket sends a batch's bytes without copying them, from the
// buffers the replay socket keeps, and those buffers are reused once the
// replay buffer is full: a batch a slow subscriber has not read yet must
// still arrive as it was sent, however many batches came after it.
TEST(KvEventsPublisher, BatchesQueuedForASlowSubscriberKeepTheirBytesAfterTheReplayBufferWraps) {
  MetricsRegistry metrics;
  KvEventsOptions o = LoopbackOptions();
  o.hash_type = HashType::kBytes;  // the 16-byte key ids these tests read back
  o.max_batch_keys = 512;
  o.max_queued_events = 1 << 20;
  o.replay_batches = 2;  // wraps every two batches
  o.send_hwm = 100000;   // the slow subscriber is never dropped
  auto p = KvEventsPublisher::Start(o, &metrics);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  void* ctx = zmq_ctx_new();
  void* slow = zmq_socket(ctx, ZMQ_SUB);
  const int small = 4096;
  zmq_setsockopt(slow, ZMQ_RCVBUF, &small, sizeof(small));
  zmq_setsockopt(slow, ZMQ_SUBSCRIBE, "", 0);
  ASSERT_EQ(zmq_connect(slow, (*p)->bound_endpoint().c_str()), 0);
  // Sleeps: real ZMQ sockets: the subscription reaches the publisher, and
  // ZMQ tells no one when.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  // About 19 MB of batches, unread until all are sent: more than the
  // kernel's socket buffers take, so most wait in the socket's queue.
  constexpr int kKeys = 2000 * 512;
  HoldingsEvent e;
  for (int i = 0; i < kKeys; ++i) {
    e.key = K(i);
    (*p)->OnBlockEvent(e, blocks::Descriptor());
    // Sleeps: real ZMQ sockets: the slow subscriber falls behind.
    if (i % 512 == 511) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  WaitFor([&] { return metrics.ValueOf("kvpool_kv_events_total") >= kKeys; },
          std::chrono::milliseconds(2000));
  ASSERT_EQ(metrics.ValueOf("kvpool_kv_events_total"), kKeys);
  const auto batches = static_cast<int64_t>(metrics.ValueOf("kvpool_kv_events_batches_total"));
  ASSERT_GE(batches, kKeys / 512);
  // Now the subscriber reads: every batch since it subscribed (the first,
  // AllBlocksCleared, may have gone before), in order, each with its own
  // blocks.
  std::vector<std::string> live(batches), hashes;
  std::vector<std::string> frames;
  int64_t expect = -1;
  while (expect < batches) {
    ASSERT_TRUE(RecvMessage(slow, 5000, &frames)) << "after batch " << expect - 1;
    ASSERT_EQ(frames.size(), 3u);
    if (expect < 0) {
      ASSERT_TRUE(frames[1] == SeqFrame(0) || frames[1] == SeqFrame(1));
      expect = frames[1] == SeqFrame(0) ? 0 : 1;
    }
    ASSERT_EQ(frames[1], SeqFrame(expect));
    for (auto& h : StoredHashes(frames[2])) hashes.push_back(std::move(h));
    live[expect++] = frames[2];
  }
  ASSERT_EQ(hashes.size(), static_cast<size_t>(kKeys));
  for (int i = 0; i < kKeys; ++i) ASSERT_EQ(hashes[i], Hash(K(i))) << "block " << i;
  EXPECT_EQ(metrics.ValueOf("kvpool_kv_events_subscriber_dropped_total"), 0);
  // The replay socket answers the last two, the same bytes.
  auto tail = Replay(ctx, (*p)->bound_replay_endpoint(), 0);
  ASSERT_EQ(tail.size(), 2u);
  EXPECT_EQ(tail[0][2], SeqFrame(batches - 2));
  EXPECT_EQ(tail[0][3], live[batches - 2]);
  EXPECT_EQ(tail[1][3], live[batches - 1]);
  zmq_close(slow);
  p->reset();
  zmq_ctx_term(ctx);
}

TEST(KvEventsPublisher, AStalledSubscriberMissesBatchesTheOthersGetCounted) {
  MetricsRegistry metrics;
  KvEventsOptions o;
  o.hash_type = HashType::kBytes;  // the 16-byte key ids these tests read back
  o.endpoint = "tcp://127.0.0.1:0";
  o.batch_interval = std::chrono::milliseconds(1);
  o.max_batch_keys = 1024;
  o.max_queued_events = 1 << 20;
  o.send_hwm = 8;  // per subscriber: the reader may lag a few batches
  auto p = KvEventsPublisher::Start(o, &metrics);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  void* ctx = zmq_ctx_new();
  void* stalled = zmq_socket(ctx, ZMQ_SUB);  // never reads
  const int one = 1, small = 4096;
  zmq_setsockopt(stalled, ZMQ_RCVHWM, &one, sizeof(one));
  zmq_setsockopt(stalled, ZMQ_RCVBUF, &small, sizeof(small));
  zmq_setsockopt(stalled, ZMQ_SUBSCRIBE, "", 0);
  ASSERT_EQ(zmq_connect(stalled, (*p)->bound_endpoint().c_str()), 0);
  void* reader = zmq_socket(ctx, ZMQ_SUB);
  zmq_setsockopt(reader, ZMQ_SUBSCRIBE, "", 0);
  ASSERT_EQ(zmq_connect(reader, (*p)->bound_endpoint().c_str()), 0);
  // Sleeps: real ZMQ sockets: both subscriptions reach the publisher.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  std::atomic<int64_t> last_seq{-1};
  std::atomic<int> batches{0};
  std::thread reading([&] {
    std::vector<std::string> frames;
    while (RecvMessage(reader, 2000, &frames)) {
      int64_t seq = 0;
      for (unsigned char c : frames[1]) seq = (seq << 8) | c;
      last_seq = seq;
      ++batches;
    }
  });
  const int kBatches = 200;
  HoldingsEvent e;
  for (int b = 0; b < kBatches; ++b) {
    for (int i = 0; i < 1024; ++i) {
      e.key = K(b * 1024 + i);
      (*p)->OnBlockEvent(e, blocks::Descriptor());
    }
    // Sleeps: real ZMQ sockets: batches go out one by one.
    std::this_thread::sleep_for(std::chrono::milliseconds(3));
  }
  reading.join();  // ends 2 s after the last batch
  // The reader got (nearly) every batch though the stalled subscriber is
  // full -- were batches refused for all while one subscriber is full, it
  // would get a handful -- and the node counted the stalled one's stall.
  // (A reader that lags 8 batches on a busy machine misses some too.)
  EXPECT_LE(batches.load(), last_seq.load() + 1);
  EXPECT_GE(batches.load(), kBatches * 9 / 10);
  EXPECT_EQ(metrics.ValueOf("kvpool_kv_events_total"), kBatches * 1024);
  EXPECT_EQ(metrics.ValueOf("kvpool_kv_events_dropped_total"), 0);
  // Each stall counts the blocks of the batch that found the subscriber
  // full: a burst of 1024, or part of one when the batch timer cut it.
  const double stalls = metrics.ValueOf("kvpool_kv_events_subscriber_stalls_total");
  const double dropped = metrics.ValueOf("kvpool_kv_events_subscriber_dropped_total");
  EXPECT_GE(stalls, 1);
  EXPECT_GE(dropped, stalls);
  EXPECT_LE(dropped, kBatches * 1024.0);
  zmq_close(stalled);
  zmq_close(reader);
  p->reset();
  zmq_ctx_term(ctx);
}

}  // namespace
}  // namespace kvpool::events
