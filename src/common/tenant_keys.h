// TenantKeys: binds the key ids a client sends to the client's tenant
// (node/tenants.h has the tenants themselves). A tenant's entry is stored
// under SHA-256(SHA-256("kvpool-tenant\0" || name) || id), truncated to 128
// bits, with the id's namespace tag (its low 32 bits) kept; the default
// tenant's ids are used as sent.
#pragma once

#include <string_view>

#include "common/key_id.h"

namespace kvpool {

inline constexpr char kDefaultTenant[] = "default";

// Binds client key ids to one tenant. Thread-safe (immutable).
class TenantKeys {
 public:
  // An empty name or "default": ids are used as sent.
  explicit TenantKeys(std::string_view tenant);
  bool identity() const { return identity_; }
  KeyId Bind(const KeyId& id) const;

 private:
  bool identity_ = true;
  unsigned char prefix_[32] = {};
};

}  // namespace kvpool
