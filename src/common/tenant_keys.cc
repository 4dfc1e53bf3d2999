#include "common/tenant_keys.h"

#include <openssl/sha.h>

#include <cstring>
#include <string>

namespace kvpool {

TenantKeys::TenantKeys(std::string_view tenant) {
  if (tenant.empty() || tenant == kDefaultTenant) return;
  identity_ = false;
  std::string label = "kvpool-tenant";
  label.push_back('\0');
  label.append(tenant);
  SHA256(reinterpret_cast<const unsigned char*>(label.data()), label.size(), prefix_);
}

KeyId TenantKeys::Bind(const KeyId& id) const {
  if (identity_) return id;
  unsigned char in[48];
  std::memcpy(in, prefix_, 32);
  for (int i = 0; i < 8; ++i) {
    in[32 + i] = static_cast<unsigned char>(id.hi >> (56 - 8 * i));
    in[40 + i] = static_cast<unsigned char>(id.lo >> (56 - 8 * i));
  }
  unsigned char out[32];
  SHA256(in, sizeof(in), out);
  KeyId k;
  for (int i = 0; i < 8; ++i) {
    k.hi = (k.hi << 8) | out[i];
    k.lo = (k.lo << 8) | out[8 + i];
  }
  // The namespace tag stays: a clear of one namespace finds its keys in the
  // tenant's store as in the default one.
  k.lo = (k.lo & ~uint64_t{0xFFFFFFFF}) | NamespaceTagOf(id);
  return k;
}

}  // namespace kvpool
