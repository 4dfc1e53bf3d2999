// The KV event wire format: what a node's event publisher sends to
// cache-aware routers, in the framing vLLM's ZMQ publisher uses, so a router
// that listens to engines listens to kvpool nodes the same way.
//
// A PUB message is three frames: [topic, seq, payload]
//   topic    the configured topic (may be empty)
//   seq      8 bytes, big-endian, from 0, one per batch, no gaps
//   payload  msgpack EventBatch
//
// EventBatch, an array: [ts, events, data_parallel_rank]
//   ts                    float64, seconds since the epoch when sent
//   events                array of events, oldest first
//   data_parallel_rank    nil (a node is not a DP rank)
//
// An event is a map (encoding "map") or an array whose first item is the
// type name (encoding "array"), fields in this order, default-valued fields
// left out of a map:
//   BlockStored:  block_hashes, parent_block_hash, token_ids, block_size,
//                 lora_id, medium, lora_name
//   BlockRemoved: block_hashes, medium
//   AllBlocksCleared: (no fields)
// block_hashes holds one hash per block: the 16-byte key id (big-endian hi
// then lo) as msgpack bin, since a node knows keys, not tokens; token_ids
// is empty and block_size 0. medium is "CPU" for the DRAM tier and
// "STORAGE" for the SSD tier. Consecutive events of one type and medium are
// merged into one event with several hashes, in order.
//
// Replay (ROUTER socket): a request is one frame of 8 bytes, the first seq
// wanted (big-endian); the answer is [topic, seq, payload] for each batch
// still buffered with seq >= it, then the end marker ["", -1 as 8 bytes,
// ""]. A router prefixes the requester's identity frame.
//
// The functions are thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/key_id.h"

namespace kvpool::events {

enum class Medium : uint8_t { kCpu = 0, kStorage = 1 };
enum class Encoding : uint8_t { kMap = 0, kArray = 1 };

struct KvEvent {
  enum class Type : uint8_t { kStored, kRemoved, kAllCleared };
  Type type = Type::kStored;
  Medium medium = Medium::kCpu;
  std::vector<KeyId> keys;  // in order
};

const char* MediumName(Medium m);

// Appends `key` to the last event when it has the same type and medium,
// else starts a new event.
void AppendEvent(std::vector<KvEvent>* events, KvEvent::Type type, Medium medium, const KeyId& key);

// One EventBatch's msgpack bytes.
std::string EncodeBatch(double ts, const std::vector<KvEvent>& events, Encoding encoding);

// One event of a batch as a run of a shared key array: keys [begin, end)
// (none for AllBlocksCleared).
struct EventRun {
  KvEvent::Type type = KvEvent::Type::kStored;
  Medium medium = Medium::kCpu;
  uint32_t begin = 0, end = 0;
};

// One EventBatch's msgpack bytes in *out, which is cleared first and whose
// capacity is reused: a publisher that encodes into the buffers it keeps
// allocates nothing per batch once they have grown. The same bytes as
// EncodeBatch.
void EncodeBatchInto(std::string* out, double ts, std::span<const EventRun> runs,
                     std::span<const KeyId> keys, Encoding encoding);

// seq as 8 bytes, big-endian.
std::string SeqFrame(int64_t seq);

}  // namespace kvpool::events
