// Tenants: the parties that share a node, each with its own namespaces, its
// own DRAM segment and SSD space (its quotas), and the local users that
// belong to it.
//
// A tenants file (--tenants-file) has one line per tenant:
//
//   tenant NAME dram=SIZE [ssd=SIZE] [pins=SIZE] [uids=U,U...] [gids=G,G...]
//               [tokens=T,T...]
//
// (on one line). pins= is the tenant's pin budget for cache hints (values
// pins may hold in its DRAM at once; default --pin-max-bytes).
// NAME is 1-32 of [a-z0-9_-] and not "default"; SIZE uses the node's units
// ("8GiB"); a uid or gid is a number or a user or group name. A local
// client whose uid is listed belongs to that tenant, else one whose
// primary or supplementary group is listed; anyone else belongs to the
// default tenant, the node's own store (--dram-capacity, --ssd). A tenant
// defined on every node of a cluster under the same name is one tenant
// across them (its own directory, announcer and remote reads on each node;
// tenant-scoped peer messages, peer/peer_messages_format.h), with its
// quotas per node. A remote-mode client authenticated
// with a client token (--client-token-file) whose name is listed in
// tokens= belongs to that tenant: its keys are kept in the tenant's store
// on each key's home node. '#' starts a comment.
//
// Key ids are bound to their tenant: a client sends ids it derived from
// (namespace, key); the node stores a tenant's entry under
// SHA-256(SHA-256("kvpool-tenant" || name) || id), truncated to 128 bits,
// with the id's namespace tag (low 32 bits) kept. The default tenant's ids
// are used as sent. So the same (namespace, key) of two tenants is two
// different entries, and no id a client can send lands on another tenant's
// entry without a preimage of 96 bits of SHA-256 -- on top of each tenant
// having its own store.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/key_id.h"
#include "common/status.h"
#include "common/tenant_keys.h"

namespace kvpool {

struct TenantSpec {
  std::string name;
  uint64_t dram_bytes = 0;
  uint64_t ssd_bytes = 0;
  std::optional<uint64_t> pin_bytes;  // pins=; unset: --pin-max-bytes
  std::vector<uint32_t> uids;
  std::vector<uint32_t> gids;
  std::vector<std::string> tokens;  // client token names (remote-mode clients)
};

// Parses a tenants file's text; `where` names it in errors, which give the
// line number and what is wrong.
Result<std::vector<TenantSpec>> ParseTenants(std::string_view text, std::string_view where);

// Reads and parses a tenants file. It decides who reads whose data, so it
// must be a regular file owned by this process's user (or root) that group
// and others cannot write; otherwise FailedPrecondition with what to fix.
Result<std::vector<TenantSpec>> LoadTenantsFile(const std::string& path);

// The index in `tenants` of the tenant a local client with these
// credentials belongs to (its uid first, then its groups), or -1: the
// default tenant.
int TenantOfCredentials(const std::vector<TenantSpec>& tenants, uint32_t uid,
                        const std::vector<uint32_t>& gids);

}  // namespace kvpool
