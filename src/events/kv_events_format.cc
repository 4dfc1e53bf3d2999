#include "events/kv_events_format.h"

#include <cstring>

#define MSGPACK_NO_BOOST
#include <msgpack.hpp>

#include "protocol/descriptor_format.h"

namespace kvpool::events {
namespace {

// Appends what msgpack writes to a string, through a buffer of its own:
// msgpack writes a few bytes at a time (a token is 5), and a string's
// append per write costs more than the bytes. Writes of up to 16 bytes
// (every msgpack item head and number) copy with two fixed-size, possibly
// overlapping, moves: a memcpy call per write cost more than the write.
// Flush() before the string is read.
class StringSink {
 public:
  explicit StringSink(std::string* out) : out_(out) {}
  void write(const char* data, size_t n) {
    if (n > sizeof(buf_) - used_) {
      Flush();
      if (n > sizeof(buf_)) {
        out_->append(data, n);
        return;
      }
    }
    char* to = buf_ + used_;
    if (n >= 8 && n <= 16) {
      Copy<8>(to, data, n);
    } else if (n >= 4 && n < 8) {
      Copy<4>(to, data, n);
    } else if (n > 0 && n < 4) {
      to[0] = data[0];
      to[n / 2] = data[n / 2];
      to[n - 1] = data[n - 1];
    } else {
      std::memcpy(to, data, n);
    }
    used_ += n;
  }
  void Flush() {
    out_->append(buf_, used_);
    used_ = 0;
  }

 private:
  // n bytes, W <= n <= 2W: the first W and the last W.
  template <size_t W>
  static void Copy(char* to, const char* from, size_t n) {
    char head[W], tail[W];
    std::memcpy(head, from, W);
    std::memcpy(tail, from + n - W, W);
    std::memcpy(to, head, W);
    std::memcpy(to + n - W, tail, W);
  }

  std::string* out_;
  size_t used_ = 0;
  char buf_[4096];
};

using Packer = msgpack::packer<StringSink>;

void PackStr(Packer& p, std::string_view s) {
  p.pack_str(static_cast<uint32_t>(s.size()));
  p.pack_str_body(s.data(), static_cast<uint32_t>(s.size()));
}

void PackKeyHash(Packer& p, const KeyId& k, HashType type) {
  if (type != HashType::kBytes) {
    p.pack_uint64(EventHashOf(k));
    return;
  }
  char b[16];
  for (int i = 0; i < 8; ++i) {
    b[i] = static_cast<char>(k.hi >> (56 - 8 * i));
    b[8 + i] = static_cast<char>(k.lo >> (56 - 8 * i));
  }
  p.pack_bin(16);
  p.pack_bin_body(b, 16);
}

// An engine's hash as `type` asks: ints as they were written or from a bytes
// hash's last 8 bytes (big-endian), bytes as written or from an int's 8
// bytes (big-endian).
void PackEngineHash(Packer& p, const protocol::EngineHashView& h, HashType type) {
  using K = protocol::EngineHash::Kind;
  if (h.kind == K::kNone) {
    p.pack_nil();
    return;
  }
  const bool as_int =
      type == HashType::kInt64 || (type == HashType::kAsWritten && h.kind != K::kBytes);
  if (as_int) {
    if (h.kind == K::kInt64) {
      p.pack_int64(static_cast<int64_t>(h.value));
      return;
    }
    uint64_t v = h.value;
    if (h.kind == K::kBytes) {
      v = 0;
      const size_t from = h.bytes.size() > 8 ? h.bytes.size() - 8 : 0;
      for (size_t i = from; i < h.bytes.size(); ++i)
        v = (v << 8) | static_cast<uint8_t>(h.bytes[i]);
    }
    p.pack_uint64(v);
    return;
  }
  if (h.kind == K::kBytes) {
    p.pack_bin(static_cast<uint32_t>(h.bytes.size()));
    p.pack_bin_body(h.bytes.data(), static_cast<uint32_t>(h.bytes.size()));
    return;
  }
  char b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<char>(h.value >> (56 - 8 * i));
  p.pack_bin(8);
  p.pack_bin_body(b, 8);
}

void PackHashes(Packer& p, std::span<const KeyId> keys, HashType type) {
  p.pack_array(static_cast<uint32_t>(keys.size()));
  for (const KeyId& k : keys) PackKeyHash(p, k, type);
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

void PackStrOrNil(Packer& p, std::string_view s) {
  if (s.empty()) {
    p.pack_nil();
  } else {
    PackStr(p, s);
  }
}

void PackBlockHashes(Packer& p, std::span<const KeyId> keys,
                     std::span<const protocol::DescriptorView> views, HashType hash_type) {
  if (views.empty()) {
    PackHashes(p, keys, hash_type);
    return;
  }
  p.pack_array(static_cast<uint32_t>(views.size()));
  for (const auto& v : views) PackEngineHash(p, v.hash, hash_type);
}

void PackParent(Packer& p, std::span<const protocol::DescriptorView> views, HashType hash_type) {
  if (views.empty()) {
    p.pack_nil();
  } else {
    PackEngineHash(p, views.front().parent, hash_type);
  }
}

// A token as msgpack's pack_uint32 writes it (the smallest form) at `to`;
// returns the bytes written (1, 2, 3 or 5).
size_t PutToken(char* to, uint32_t t) {
  if (t < 0x80) {
    to[0] = static_cast<char>(t);
    return 1;
  }
  if (t < 0x100) {
    to[0] = static_cast<char>(0xcc);
    to[1] = static_cast<char>(t);
    return 2;
  }
  if (t < 0x10000) {
    to[0] = static_cast<char>(0xcd);
    to[1] = static_cast<char>(t >> 8);
    to[2] = static_cast<char>(t);
    return 3;
  }
  to[0] = static_cast<char>(0xce);
  for (int i = 0; i < 4; ++i) to[1 + i] = static_cast<char>(t >> (24 - 8 * i));
  return 5;
}

// The tokens' array: its items encoded here, 64 at a time, and written as
// one run of bytes each (pack_bin_body writes bytes as they are), not a
// write per token (kv_events_format_bench: 86-92 ns an event of 16 tokens
// against 94-99 with pack_uint32 per token).
void PackTokens(Packer& p, std::span<const protocol::DescriptorView> views) {
  uint32_t n = 0;
  for (const auto& v : views) n += v.n_tokens;
  p.pack_array(n);
  char buf[64 * 5];
  size_t used = 0;
  for (const auto& v : views) {
    for (uint32_t i = 0; i < v.n_tokens; ++i) {
      if (used + 5 > sizeof(buf)) {
        p.pack_bin_body(buf, static_cast<uint32_t>(used));
        used = 0;
      }
      used += PutToken(buf + used, v.token(i));
    }
  }
  if (used > 0) p.pack_bin_body(buf, static_cast<uint32_t>(used));
}

// views: the run's blocks' descriptors, or empty for a run named by key ids.
void PackEvent(Packer& p, const EventRun& e, std::span<const KeyId> all,
               std::span<const protocol::DescriptorView> views, Encoding enc, HashType hash_type) {
  const char* medium = MediumName(e.medium);
  const std::span<const KeyId> keys = all.subspan(e.begin, e.end - e.begin);
  const protocol::DescriptorView* d = views.empty() ? nullptr : &views.front();
  const uint32_t block_size = d == nullptr ? 0 : d->block_size;
  auto lora = [&] {
    if (d == nullptr) {
      p.pack_nil();
    } else {
      PackStrOrNil(p, d->lora_name);
    }
  };
  if (enc == Encoding::kArray) {
    switch (e.type) {
      case KvEvent::Type::kStored:
        // [tag, block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
        //  lora_name]
        p.pack_array(8);
        PackStr(p, TypeName(e.type));
        PackBlockHashes(p, keys, views, hash_type);
        PackParent(p, views, hash_type);
        PackTokens(p, views);
        p.pack_uint64(block_size);
        p.pack_nil();
        PackStr(p, medium);
        lora();
        return;
      case KvEvent::Type::kRemoved:
        p.pack_array(3);
        PackStr(p, TypeName(e.type));
        PackBlockHashes(p, keys, views, hash_type);
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
  const bool group = d != nullptr && d->group_idx >= 0;
  const bool spec = d != nullptr && !d->spec_kind.empty();
  switch (e.type) {
    case KvEvent::Type::kStored:
      p.pack_map(9 + (group ? 1 : 0) + (spec ? 1 : 0));
      PackStr(p, "type");
      PackStr(p, TypeName(e.type));
      PackStr(p, "block_hashes");
      PackBlockHashes(p, keys, views, hash_type);
      PackStr(p, "parent_block_hash");
      PackParent(p, views, hash_type);
      PackStr(p, "token_ids");
      PackTokens(p, views);
      PackStr(p, "block_size");
      p.pack_uint64(block_size);
      PackStr(p, "lora_id");
      p.pack_nil();
      PackStr(p, "medium");
      PackStr(p, medium);
      PackStr(p, "lora_name");
      lora();
      if (group) {
        PackStr(p, "group_idx");
        p.pack_int32(d->group_idx);
      }
      if (spec) {
        PackStr(p, "kv_cache_spec_kind");
        PackStr(p, d->spec_kind);
      }
      PackStr(p, "locality");
      PackStr(p, "LOCAL");
      return;
    case KvEvent::Type::kRemoved:
      p.pack_map(4 + (group ? 1 : 0));
      PackStr(p, "type");
      PackStr(p, TypeName(e.type));
      PackStr(p, "block_hashes");
      PackBlockHashes(p, keys, views, hash_type);
      PackStr(p, "medium");
      PackStr(p, medium);
      if (group) {
        PackStr(p, "group_idx");
        p.pack_int32(d->group_idx);
      }
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

bool SameHash(const protocol::EngineHashView& a, const protocol::EngineHashView& b) {
  if (a.kind != b.kind) return false;
  return a.kind == protocol::EngineHash::Kind::kBytes ? a.bytes == b.bytes : a.value == b.value;
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

bool ContinuesChain(KvEvent::Type type, const protocol::DescriptorView& a,
                    const protocol::DescriptorView& b) {
  if (a.group_idx != b.group_idx) return false;
  if (type != KvEvent::Type::kStored) return true;
  return SameHash(b.parent, a.hash) && a.block_size == b.block_size &&
         (a.n_tokens == 0) == (b.n_tokens == 0) && a.lora_name == b.lora_name &&
         a.spec_kind == b.spec_kind;
}

size_t EncodedBatchBound(std::span<const EventRun> runs, std::span<const KeyId> keys,
                         std::span<const protocol::DescriptorView> key_views) {
  size_t tokens = 0;
  for (const auto& v : key_views) tokens += v.n_tokens;
  return kBatchHeaderBytes + kEventFieldBytes * runs.size() + kEventKeyBytes * keys.size() +
         kEventTokenBytes * tokens;
}

void EncodeBatchInto(std::string* out, double ts, std::span<const EventRun> runs,
                     std::span<const KeyId> keys, Encoding encoding, HashType hash_type,
                     std::span<const protocol::DescriptorView> key_views) {
  out->clear();
  // The bound: one allocation for a new buffer, none for a reused one.
  out->reserve(EncodedBatchBound(runs, keys, key_views));
  StringSink sink(out);
  Packer p(sink);
  p.pack_array(3);
  p.pack_double(ts);
  p.pack_array(static_cast<uint32_t>(runs.size()));
  for (const EventRun& e : runs) {
    std::span<const protocol::DescriptorView> views;
    if (e.described && e.end <= key_views.size()) {
      views = key_views.subspan(e.begin, e.end - e.begin);
      for (const auto& v : views) {
        if (v.hash.kind == protocol::EngineHash::Kind::kNone) views = {};  // by key ids
      }
    }
    PackEvent(p, e, keys, views, encoding, hash_type);
  }
  p.pack_nil();
  sink.Flush();
}

std::string EncodeBatch(double ts, const std::vector<KvEvent>& events, Encoding encoding,
                        HashType hash_type) {
  std::vector<EventRun> runs;
  std::vector<KeyId> keys;
  for (const KvEvent& e : events) {
    const auto begin = static_cast<uint32_t>(keys.size());
    keys.insert(keys.end(), e.keys.begin(), e.keys.end());
    runs.push_back(EventRun{e.type, e.medium, begin, static_cast<uint32_t>(keys.size()), false});
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
