#include "blocks/descriptor.h"

#include <cstring>

namespace kvpool::blocks {
namespace {

uint64_t LastEightBytes(std::string_view b) {
  uint64_t v = 0;
  const size_t from = b.size() > 8 ? b.size() - 8 : 0;
  for (size_t i = from; i < b.size(); ++i) v = (v << 8) | static_cast<uint8_t>(b[i]);
  return v;
}

}  // namespace

uint64_t EngineHash64(const protocol::EngineHash& h) {
  return h.kind == protocol::EngineHash::Kind::kBytes ? LastEightBytes(h.bytes) : h.value;
}

uint64_t EngineHash64(const protocol::EngineHashView& h) {
  return h.kind == protocol::EngineHash::Kind::kBytes ? LastEightBytes(h.bytes) : h.value;
}

Descriptor Descriptor::Make(std::span<const uint8_t> bytes, const protocol::DescriptorView& view) {
  auto rep = std::make_shared_for_overwrite<uint8_t[]>(sizeof(Header) + bytes.size());
  const Header h{EngineHash64(view.hash), bytes.size()};
  std::memcpy(rep.get(), &h, sizeof(h));
  if (!bytes.empty()) std::memcpy(rep.get() + sizeof(h), bytes.data(), bytes.size());
  Descriptor d;
  d.rep_ = std::move(rep);
  return d;
}

Descriptor Descriptor::Parse(std::span<const uint8_t> bytes) {
  protocol::DescriptorView v;
  if (!protocol::ParseDescriptor(bytes, &v).ok()) return {};
  return Make(bytes, v);
}

std::span<const uint8_t> Descriptor::bytes() const {
  if (rep_ == nullptr) return {};
  Header h;
  std::memcpy(&h, rep_.get(), sizeof(h));
  return {rep_.get() + sizeof(Header), static_cast<size_t>(h.size)};
}

std::string_view Descriptor::str() const {
  const auto b = bytes();
  return {reinterpret_cast<const char*>(b.data()), b.size()};
}

uint64_t Descriptor::hash64() const {
  if (rep_ == nullptr) return 0;
  Header h;
  std::memcpy(&h, rep_.get(), sizeof(h));
  return h.hash64;
}

}  // namespace kvpool::blocks
