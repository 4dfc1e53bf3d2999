#include "common/key_id.h"

#include <openssl/evp.h>

#include <string>

#include "common/check.h"

namespace kvpool {
namespace {

// One digest context per thread, reused: fetching the algorithm and
// allocating a context per key would cost more than hashing a short key.
struct DigestCtx {
  EVP_MD* md = EVP_MD_fetch(nullptr, "SHA256", nullptr);
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  ~DigestCtx() {
    EVP_MD_CTX_free(ctx);
    EVP_MD_free(md);
  }
};

void PutLe64(uint64_t v, unsigned char* out) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<unsigned char>(v >> (8 * i));
}

uint64_t GetBe64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

uint32_t NamespaceTag(std::string_view ns) {
  // Callers hash many keys of one namespace in a row: the last tag is kept.
  thread_local std::string last_ns;
  thread_local uint32_t last_tag = 0;
  thread_local bool have_last = false;
  if (have_last && ns == last_ns) return last_tag;
  thread_local DigestCtx d;
  KVPOOL_CHECK(d.md != nullptr && d.ctx != nullptr);
  static constexpr char kLabel[] = "kvpool-namespace";
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int out_len = 0;
  KVPOOL_CHECK(EVP_DigestInit_ex2(d.ctx, d.md, nullptr) == 1);
  EVP_DigestUpdate(d.ctx, kLabel, sizeof(kLabel));  // with its NUL
  EVP_DigestUpdate(d.ctx, ns.data(), ns.size());
  KVPOOL_CHECK(EVP_DigestFinal_ex(d.ctx, out, &out_len) == 1 && out_len == 32);
  last_ns.assign(ns);
  last_tag = static_cast<uint32_t>(GetBe64(out) >> 32);
  have_last = true;
  return last_tag;
}

KeyId MakeKeyId(std::string_view ns, std::string_view key) {
  const uint32_t tag = NamespaceTag(ns);
  thread_local DigestCtx d;
  KVPOOL_CHECK(d.md != nullptr && d.ctx != nullptr);
  unsigned char len[8];
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int out_len = 0;
  KVPOOL_CHECK(EVP_DigestInit_ex2(d.ctx, d.md, nullptr) == 1);
  PutLe64(ns.size(), len);
  EVP_DigestUpdate(d.ctx, len, sizeof(len));
  EVP_DigestUpdate(d.ctx, ns.data(), ns.size());
  PutLe64(key.size(), len);
  EVP_DigestUpdate(d.ctx, len, sizeof(len));
  EVP_DigestUpdate(d.ctx, key.data(), key.size());
  KVPOOL_CHECK(EVP_DigestFinal_ex(d.ctx, out, &out_len) == 1 && out_len == 32);
  return KeyId{GetBe64(out), (GetBe64(out + 8) & ~uint64_t{0xFFFFFFFF}) | tag};
}

std::string KeyId::ToHex() const {
  static const char kDigits[] = "0123456789abcdef";
  std::string s(32, '0');
  for (int i = 0; i < 16; ++i) {
    s[15 - i] = kDigits[(hi >> (4 * i)) & 0xf];
    s[31 - i] = kDigits[(lo >> (4 * i)) & 0xf];
  }
  return s;
}

bool KeyId::FromHex(std::string_view hex, KeyId* out) {
  if (hex.size() != 32) return false;
  uint64_t parts[2] = {0, 0};
  for (size_t i = 0; i < 32; ++i) {
    char c = hex[i];
    int v;
    if (c >= '0' && c <= '9') v = c - '0';
    else if (c >= 'a' && c <= 'f') v = c - 'a' + 10;
    else if (c >= 'A' && c <= 'F') v = c - 'A' + 10;
    else return false;
    parts[i / 16] = (parts[i / 16] << 4) | static_cast<uint64_t>(v);
  }
  *out = KeyId{parts[0], parts[1]};
  return true;
}

}  // namespace kvpool
