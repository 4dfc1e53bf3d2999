#include "events/kv_events_format.h"

#define MSGPACK_NO_BOOST
#include <msgpack.hpp>

namespace kvpool::events {
namespace {

// Appends what msgpack writes to a string.
struct StringSink {
  std::string* out;
  void write(const char* data, size_t n) { out->append(data, n); }
};

using Packer = msgpack::packer<StringSink>;

void PackStr(Packer& p, std::string_view s) {
  p.pack_str(static_cast<uint32_t>(s.size()));
  p.pack_str_body(s.data(), static_cast<uint32_t>(s.size()));
}

void PackHashes(Packer& p, std::span<const KeyId> keys, HashType type) {
  p.pack_array(static_cast<uint32_t>(keys.size()));
  for (const KeyId& k : keys) {
    if (type == HashType::kInt64) {
      p.pack_uint64(EventHashOf(k));
      continue;
    }
    char b[16];
    for (int i = 0; i < 8; ++i) {
      b[i] = static_cast<char>(k.hi >> (56 - 8 * i));
      b[8 + i] = static_cast<char>(k.lo >> (56 - 8 * i));
    }
    p.pack_bin(16);
    p.pack_bin_body(b, 16);
  }
}

const char* TypeName(KvEvent::Type t) {
  switch (t) {
    case KvEvent::Type::kStored:
      return "BlockStored";
    case KvEvent::Type::kRemoved:
      return "BlockRemoved";
    case KvEvent::Type::kAllCleared:
      return "AllBlocksCleared";
  }
  return "?";
}

void PackEvent(Packer& p, const EventRun& e, std::span<const KeyId> all, Encoding enc,
               HashType hash_type) {
  const char* medium = MediumName(e.medium);
  const std::span<const KeyId> keys = all.subspan(e.begin, e.end - e.begin);
  if (enc == Encoding::kArray) {
    switch (e.type) {
      case KvEvent::Type::kStored:
        // [tag, block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
        //  lora_name]
        p.pack_array(8);
        PackStr(p, TypeName(e.type));
        PackHashes(p, keys, hash_type);
        p.pack_nil();
        p.pack_array(0);
        p.pack_uint64(0);
        p.pack_nil();
        PackStr(p, medium);
        p.pack_nil();
        return;
      case KvEvent::Type::kRemoved:
        p.pack_array(3);
        PackStr(p, TypeName(e.type));
        PackHashes(p, keys, hash_type);
        PackStr(p, medium);
        return;
      case KvEvent::Type::kAllCleared:
        p.pack_array(1);
        PackStr(p, TypeName(e.type));
        return;
    }
  }
  // A map with every field vLLM's decoder requires (a missing one fails
  // the whole batch there), at its default where the node has no value.
  switch (e.type) {
    case KvEvent::Type::kStored:
      p.pack_map(9);
      PackStr(p, "type");
      PackStr(p, TypeName(e.type));
      PackStr(p, "block_hashes");
      PackHashes(p, keys, hash_type);
      PackStr(p, "parent_block_hash");
      p.pack_nil();
      PackStr(p, "token_ids");
      p.pack_array(0);
      PackStr(p, "block_size");
      p.pack_uint64(0);
      PackStr(p, "lora_id");
      p.pack_nil();
      PackStr(p, "medium");
      PackStr(p, medium);
      PackStr(p, "lora_name");
      p.pack_nil();
      PackStr(p, "locality");
      PackStr(p, "LOCAL");
      return;
    case KvEvent::Type::kRemoved:
      p.pack_map(4);
      PackStr(p, "type");
      PackStr(p, TypeName(e.type));
      PackStr(p, "block_hashes");
      PackHashes(p, keys, hash_type);
      PackStr(p, "medium");
      PackStr(p, medium);
      PackStr(p, "locality");
      PackStr(p, "LOCAL");
      return;
    case KvEvent::Type::kAllCleared:
      p.pack_map(1);
      PackStr(p, "type");
      PackStr(p, TypeName(e.type));
      return;
  }
}

}  // namespace

const char* MediumName(Medium m) { return m == Medium::kCpu ? "CPU" : "STORAGE"; }

void AppendEvent(std::vector<KvEvent>* events, KvEvent::Type type, Medium medium,
                 const KeyId& key) {
  if (events->empty() || events->back().type != type || events->back().medium != medium) {
    events->push_back(KvEvent{type, medium, {}});
  }
  events->back().keys.push_back(key);
}

bool ValidTopic(std::string_view topic) {
  if (!topic.starts_with("kv@")) return true;
  const std::string_view rest = topic.substr(3);
  const size_t at = rest.find('@');
  return at != std::string_view::npos && at > 0 && at + 1 < rest.size() &&
         rest.find('@', at + 1) == std::string_view::npos;
}

void EncodeBatchInto(std::string* out, double ts, std::span<const EventRun> runs,
                     std::span<const KeyId> keys, Encoding encoding, HashType hash_type) {
  out->clear();
  // At most 160 bytes an event besides its keys and 18 a key (bin 8 header
  // and 16 bytes): one allocation for a new buffer, none for a reused one.
  out->reserve(16 + 160 * runs.size() + 18 * keys.size());
  StringSink sink{out};
  Packer p(sink);
  p.pack_array(3);
  p.pack_double(ts);
  p.pack_array(static_cast<uint32_t>(runs.size()));
  for (const EventRun& e : runs) PackEvent(p, e, keys, encoding, hash_type);
  p.pack_nil();
}

std::string EncodeBatch(double ts, const std::vector<KvEvent>& events, Encoding encoding,
                        HashType hash_type) {
  std::vector<EventRun> runs;
  std::vector<KeyId> keys;
  for (const KvEvent& e : events) {
    const auto begin = static_cast<uint32_t>(keys.size());
    keys.insert(keys.end(), e.keys.begin(), e.keys.end());
    runs.push_back(EventRun{e.type, e.medium, begin, static_cast<uint32_t>(keys.size())});
  }
  std::string out;
  EncodeBatchInto(&out, ts, runs, keys, encoding, hash_type);
  return out;
}

std::string SeqFrame(int64_t seq) {
  std::string s(8, '\0');
  const uint64_t v = static_cast<uint64_t>(seq);
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(v >> (56 - 8 * i));
  return s;
}

}  // namespace kvpool::events
