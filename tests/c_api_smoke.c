/* A plain C program using libkvpool: proves the ABI works from C.
 * usage: c_api_smoke SOCKET  -> exit 0 and "ok" when put/get/exists round-trip. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvpool/kvpool.h"

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  kvpool_options opts;
  kvpool_options_init(&opts);
  opts.socket_path = argv[1];
  kvpool_status st;
  kvpool_client* c = kvpool_open(&opts, &st);
  if (c == NULL) {
    fprintf(stderr, "open: %s %s\n", kvpool_status_name(st), kvpool_last_error());
    return 1;
  }
  const char* ns = "c-smoke";
  const char* keys[2] = {"alpha", "beta"};
  size_t lens[2] = {5, 4};
  kvpool_key_id ids[2];
  kvpool_key_ids(ns, strlen(ns), (const void* const*)keys, lens, 2, ids);

  char value[1000];
  for (int i = 0; i < 1000; ++i) value[i] = (char)(i * 7);
  const void* values[1] = {value};
  uint64_t sizes[1] = {sizeof(value)};
  kvpool_status item[2];
  if (kvpool_put(c, ids, values, sizes, 1, item) != KVPOOL_OK) return 1;

  char out[2000];
  void* bufs[1] = {out};
  uint64_t caps[1] = {sizeof(out)};
  uint64_t got[1] = {0};
  if (kvpool_get(c, ids, bufs, caps, 1, got, item) != KVPOOL_OK || item[0] != KVPOOL_OK) return 1;
  if (got[0] != sizeof(value) || memcmp(out, value, sizeof(value)) != 0) return 1;

  uint8_t hits[2];
  size_t prefix = 9;
  if (kvpool_exists(c, ids, 2, hits, &prefix) != KVPOOL_OK) return 1;
  if (hits[0] != 1 || hits[1] != 0 || prefix != 1) return 1;

  /* Zero-copy: reserve, write in place, commit; acquire, read in place, release. */
  kvpool_region r;
  uint64_t size = 64;
  if (kvpool_reserve(c, &ids[1], &size, 1, &r, item) != KVPOOL_OK) return 1;
  memset(r.data, 0x5a, 64);
  if (kvpool_commit(c, &r.handle, 1, item) != KVPOOL_OK) return 1;
  if (kvpool_acquire(c, &ids[1], 1, &r, item) != KVPOOL_OK || item[0] != KVPOOL_OK) return 1;
  if (r.size != 64 || ((unsigned char*)r.data)[63] != 0x5a) return 1;
  kvpool_release(c, &r.handle, 1);
  kvpool_close(c);
  printf("ok %s\n", kvpool_version());
  return 0;
}
