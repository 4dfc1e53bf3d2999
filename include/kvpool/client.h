// kvpool/client.h: a C++ veneer over the C ABI in kvpool.h. Header-only, so
// the binary interface stays the C one. Same thread-safety and ownership
// rules as kvpool.h: a Client is thread-safe; regions stay valid until
// committed/aborted/released.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvpool/kvpool.h"

namespace kvpool {

using KeyIdC = kvpool_key_id;

class Client {
 public:
  struct Options {
    std::string socket_path = "/tmp/kvpool.sock";
    uint32_t timeout_ms = 5000;
    uint32_t max_connections = 8;
    bool reconnect = true;
    bool copy_mode = false;
  };

  // Returns nullptr and sets *status when the node cannot be reached.
  static std::unique_ptr<Client> Open(const Options& o, kvpool_status* status) {
    kvpool_options opts;
    kvpool_options_init(&opts);
    opts.socket_path = o.socket_path.c_str();
    opts.timeout_ms = o.timeout_ms;
    opts.max_connections = o.max_connections;
    opts.reconnect = o.reconnect ? 1 : 0;
    opts.copy_mode = o.copy_mode ? 1 : 0;
    kvpool_client* c = kvpool_open(&opts, status);
    if (c == nullptr) return nullptr;
    return std::unique_ptr<Client>(new Client(c));
  }
  ~Client() { kvpool_close(c_); }
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  static std::vector<KeyIdC> KeyIds(std::string_view ns, std::span<const std::string> keys) {
    std::vector<const void*> ptrs(keys.size());
    std::vector<size_t> lens(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      ptrs[i] = keys[i].data();
      lens[i] = keys[i].size();
    }
    std::vector<KeyIdC> ids(keys.size());
    kvpool_key_ids(ns.data(), ns.size(), ptrs.data(), lens.data(), keys.size(), ids.data());
    return ids;
  }
  static KeyIdC KeyId(std::string_view ns, std::string_view key) {
    const void* p = key.data();
    size_t len = key.size();
    KeyIdC id;
    kvpool_key_ids(ns.data(), ns.size(), &p, &len, 1, &id);
    return id;
  }

  kvpool_status Put(std::string_view ns, std::string_view key, std::span<const uint8_t> value) {
    KeyIdC id = KeyId(ns, key);
    const void* v = value.data();
    uint64_t size = value.size();
    kvpool_status st;
    return kvpool_put(c_, &id, &v, &size, 1, &st);
  }
  // Fills *out with the value; NOT_FOUND on a miss.
  kvpool_status Get(std::string_view ns, std::string_view key, std::vector<uint8_t>* out) {
    KeyIdC id = KeyId(ns, key);
    kvpool_region r;
    kvpool_status st;
    kvpool_status call = kvpool_acquire(c_, &id, 1, &r, &st);
    if (call == KVPOOL_FAILED_PRECONDITION) {  // copy mode: ask for the size first
      uint64_t cap = kvpool_max_value_size(c_), size = 0;
      out->resize(cap);
      void* buf = out->data();
      call = kvpool_get(c_, &id, &buf, &cap, 1, &size, &st);
      if (call != KVPOOL_OK) return call;
      out->resize(st == KVPOOL_OK ? size : 0);
      return st;
    }
    if (call != KVPOOL_OK) return call;
    if (st != KVPOOL_OK) return st;
    const auto* p = static_cast<const uint8_t*>(r.data);
    out->assign(p, p + r.size);
    kvpool_release(c_, &r.handle, 1);
    return KVPOOL_OK;
  }
  // hits[i] for each id; returns the hit-prefix length via *prefix.
  kvpool_status Exists(std::span<const KeyIdC> ids, std::vector<uint8_t>* hits, size_t* prefix) {
    hits->resize(ids.size());
    return kvpool_exists(c_, ids.data(), ids.size(), hits->data(), prefix);
  }

  kvpool_client* raw() const { return c_; }

 private:
  explicit Client(kvpool_client* c) : c_(c) {}
  kvpool_client* c_;
};

}  // namespace kvpool
