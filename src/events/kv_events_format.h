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
// type name (encoding "array"). What the real decoders accept is in
// ../shared ENGINES.md part 7 (docs/kv-events.md): a msgspec field without
// a default is required even under omit_defaults, so a map carries every
// required field, at its default where the node has nothing to say:
//   BlockStored:  type, block_hashes, parent_block_hash (nil), token_ids
//                 ([]), block_size (0), lora_id (nil), medium, lora_name
//                 (nil), and the optional locality ("LOCAL")
//   BlockRemoved: type, block_hashes, medium, locality ("LOCAL")
//   AllBlocksCleared: type
// An array is positional, required fields only, in declaration order:
//   ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size,
//    lora_id, medium, lora_name]
//   ["BlockRemoved", block_hashes, medium]
//   ["AllBlocksCleared"]
// A block its writer described (EventRun) is named the engine's way: its
// hash (HashType), parent hash, token ids, block size and LoRA name in the
// required fields, and in maps group_idx and kv_cache_spec_kind when set;
// consecutive described blocks of one chain are one event, as an engine
// tells them (block_hashes in order, the first one's parent, token_ids
// concatenated). An undescribed key is named
// by its key id: HashType::kInt64 (the default, as vLLM's int mode and
// Dynamo's router need) writes the key id's high 64 bits as an unsigned
// msgpack int; kBytes writes the 16-byte key id (hi then lo, big-endian) as
// bin; parent nil, token_ids [], block_size 0. medium is "CPU" for the DRAM
// tier and "STORAGE" for the SSD tier, locality "LOCAL" (this node holds
// it). Consecutive undescribed events of one type and medium are merged
// into one event with several hashes, in order. Arrays stay positional
// (the required fields only), so group_idx is told in maps alone.
//
// Replay (ROUTER socket): a request's last frame is 8 bytes, the first seq
// wanted (big-endian); the answer is, for each batch still buffered with
// seq >= it, [topic, seq, payload] (ReplayFraming::kThreeFrames, today's
// vLLM subscriber) or [seq, payload] (kTwoFrames, older subscribers), then
// the end marker ["", -1 as 8 bytes, ""] or [-1 as 8 bytes, ""]. A router
// prefixes the requester's identity frame.
//
// The functions are thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/enum_names.h"
#include "common/key_id.h"
#include "protocol/descriptor_format.h"

namespace kvpool::events {

enum class Medium : uint8_t { kCpu = 0, kStorage = 1 };
enum class Encoding : uint8_t { kMap = 0, kArray = 1 };
inline constexpr EnumNames<Encoding, 2> kEncodingNames = {
    {{"map", Encoding::kMap}, {"array", Encoding::kArray}}};
// How a block's hash is written: kInt64 an int (a described block's bytes
// hash: its last 8 bytes, big-endian, as llm-d and vLLM's int mode read
// them), kBytes bin (an int hash as 8 bytes, big-endian), kAsWritten as the
// writer's descriptor has it (an undescribed key: as kInt64).
enum class HashType : uint8_t { kInt64 = 0, kBytes = 1, kAsWritten = 2 };
inline constexpr EnumNames<HashType, 3> kHashTypeNames = {{{"int64", HashType::kInt64},
                                                           {"bytes", HashType::kBytes},
                                                           {"as-written", HashType::kAsWritten}}};
// A replay answer: [topic, seq, payload] or [seq, payload].
enum class ReplayFraming : uint8_t { kThreeFrames = 0, kTwoFrames = 1 };
inline constexpr EnumNames<ReplayFraming, 2> kReplayFramingNames = {
    {{"3", ReplayFraming::kThreeFrames}, {"2", ReplayFraming::kTwoFrames}}};

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
std::string EncodeBatch(double ts, const std::vector<KvEvent>& events, Encoding encoding,
                        HashType hash_type = HashType::kInt64);

// One event of a batch as a run of a shared key array: keys [begin, end)
// (none for AllBlocksCleared). A described run's keys each have a block
// descriptor (protocol/descriptor_format.h) and are named the
// engine's way: their hashes, the first one's parent, every block's tokens
// in order, and the block size, LoRA, group and spec kind they share
// (ContinuesChain says which blocks may share a run).
struct EventRun {
  KvEvent::Type type = KvEvent::Type::kStored;
  Medium medium = Medium::kCpu;
  uint32_t begin = 0, end = 0;
  bool described = false;
};
// Whether block b may follow block a in one described event of `type`:
// stored blocks form a chain (b's parent is a's hash) of one block size,
// group, LoRA and spec kind, all with tokens or all without; removed ones
// share the group.
bool ContinuesChain(KvEvent::Type type, const protocol::DescriptorView& a,
                    const protocol::DescriptorView& b);

// Upper bounds of an encoded batch's bytes: its header, an event's fields
// besides its keys, a key (bin 8 header and 16 bytes, or a 64-bit int) and
// a token. EncodedBatchBound adds them up; the publisher sizes batches by
// them.
inline constexpr size_t kBatchHeaderBytes = 16;
inline constexpr size_t kEventFieldBytes = 160;
inline constexpr size_t kEventKeyBytes = 18;
inline constexpr size_t kEventTokenBytes = 5;

// The bytes EncodeBatchInto writes for these at most.
size_t EncodedBatchBound(std::span<const EventRun> runs, std::span<const KeyId> keys,
                         std::span<const protocol::DescriptorView> key_views = {});

// One EventBatch's msgpack bytes in *out, which is cleared first and whose
// capacity is reused: a publisher that encodes into the buffers it keeps
// allocates nothing per batch once they have grown. The same bytes as
// EncodeBatch.
// key_views (one per key; read in place with ParseDescriptor, and valid
// for the call): the described runs' descriptors. A described run whose
// keys lack them is told by its key ids.
void EncodeBatchInto(std::string* out, double ts, std::span<const EventRun> runs,
                     std::span<const KeyId> keys, Encoding encoding,
                     HashType hash_type = HashType::kInt64,
                     std::span<const protocol::DescriptorView> key_views = {});

// The hash a block is named by in events (HashType::kInt64).
inline uint64_t EventHashOf(const KeyId& key) { return key.hi; }

// Whether a topic is one a router can read: empty, any topic not starting
// "kv@", or exactly kv@<pod>@<model> with both parts non-empty and no
// further '@' (llm-d takes the pod and model from it).
bool ValidTopic(std::string_view topic);

// seq as 8 bytes, big-endian.
std::string SeqFrame(int64_t seq);

}  // namespace kvpool::events
