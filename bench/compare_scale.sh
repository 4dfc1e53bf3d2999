#!/usr/bin/env bash
# bench/compare.sh scale: what a request costs as the cluster grows.
# kvpool-scale-sim (src/cluster/scale_sim.h) stands up N nodes' real cluster
# services in one process over the in-process transport, puts chains of
# 128 blocks (each from one node) and reads each from another node twice,
# cold: with lookups at every key's home ("home") and as a chain read (the
# first key's home, then its holder: "chain", what placements chain and
# local do). It counts the peer messages each request sends and replays
# each read's call graph over a link model (10 and 50 us links, seeded
# jitter, CPU costs measured from the real handlers) for get p50/p99.
# Prints a table for each N and `metric` lines:
#   scale_chain_read_messages_max           most lookup messages (home and holder lookups)
#                                           one chain read sent, any N
#   scale_chain_read_fetches_max            fetch calls of one chain read (one per block)
#   scale_home_read_messages_max            most lookup messages one read by keys' homes sent
#   scale_chain_put_messages_max            most publishes one chain put sent, any N
#   scale_directory_bytes_per_key_spread    max/min - 1 of directory bytes per key over N
#   scale_shards_moved_per_join_vs_ideal    worst over N and over a live join and a crash:
#                                           shards moved / (4096/(N+1))
#   scale_directory_whole_after_view_s_max  worst time from a view change (all nodes told)
#                                           until every key whose home moved is listed again
#   scale_membership_bytes_per_node_max     a node's view and shard map at the largest N
#   scale_get_p99_1024_vs_4                 chain reads' modelled get p99 at the largest N
#                                           over N = 4 (10 us links; "_50us": 50 us links)
#   scale_home_get_p99_1024_vs_4            the same for reads by keys' homes
#   scale_chain_read_misses                 blocks a read did not find (must be 0)
# and, from kvpool-etcd-load (N memberships on a real etcd, 10 s leases):
#   scale_etcd_requests_per_node_s          etcd requests per second per node, largest N
#   scale_etcd_crash_gone_vs_lease          worst time until every view drops a crashed
#                                           node, over the lease TTL
#
# Usage: bench/compare.sh scale [--nodes LIST] [--chains N] [--etcd LIST] [--keep]
#   --nodes   comma list of cluster sizes (default 4,16,64,256)
#   --chains  chains put and read per size (default 16)
#   --fill    keys every node puts first (default 1024; a busy node's
#             directory share; 16384 shows bytes per key at a real load)
#   --etcd    comma list of cluster sizes run on a real etcd (default 4,16,64;
#             "none": skip)
# Environment: BUILD_DIR.
set -euo pipefail

LOG_TAG=scale
# shellcheck source=bench/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

NODES="4,16,64,256"
CHAINS=16
ETCD="4,16,64"
FILL=1024
KEEP=0
parse_flags "--nodes --chains --etcd --fill --keep" "$@"

SIM="$(find_bin kvpool-scale-sim || true)"
[[ -n "$SIM" ]] || missing+=("kvpool-scale-sim under $BUILD_DIR")
LOAD="$(find_bin kvpool-etcd-load || true)"
[[ "$ETCD" == none || -n "$LOAD" ]] || missing+=("kvpool-etcd-load under $BUILD_DIR")
check_missing

TMP="$(mktemp -d /tmp/kvpool-scale.XXXXXX)"
trap 'keep_or_remove_tmp $?' EXIT

log "kvpool-scale-sim --nodes $NODES --chains $CHAINS --fill $FILL"
"$SIM" --nodes "$NODES" --chains "$CHAINS" --fill "$FILL" --blocks 128 > "$TMP/scale.jsonl"
: > "$TMP/etcd.jsonl"
if [[ "$ETCD" != none ]]; then
  log "kvpool-etcd-load --nodes $ETCD"
  "$LOAD" --nodes "$ETCD" --seconds 10 --lease-ttl 10 > "$TMP/etcd.jsonl" 2> "$TMP/etcd.log"
fi

"$PY" - "$TMP/scale.jsonl" "$TMP/etcd.jsonl" <<'PYEOF'
import json
import sys

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
etcd = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
cols = [("N", "%d", lambda r: r["nodes"]),
        ("home lookups max", "%d", lambda r: r["home_read"]["lookup_messages_max"]),
        ("chain lookups max", "%d", lambda r: r["chain_read"]["lookup_messages_max"]),
        ("fetches", "%d", lambda r: r["chain_read"]["fetches_max"]),
        ("put msgs max", "%d", lambda r: r["chain_put_messages_max"]),
        ("home p50/p99 us (10us)", "%s", lambda r: "%.0f / %.0f" % (
            r["home_read"]["get_us_10"]["p50"], r["home_read"]["get_us_10"]["p99"])),
        ("chain p50/p99 us (10us)", "%s", lambda r: "%.0f / %.0f" % (
            r["chain_read"]["get_us_10"]["p50"], r["chain_read"]["get_us_10"]["p99"])),
        ("chain p50/p99 us (50us)", "%s", lambda r: "%.0f / %.0f" % (
            r["chain_read"]["get_us_50"]["p50"], r["chain_read"]["get_us_50"]["p99"])),
        ("dir B/key", "%.0f", lambda r: r["directory_bytes_per_key"]),
        ("view B/node", "%d", lambda r: r["membership_bytes_per_node"]),
        ("peers max", "%d", lambda r: r["peers_called_max"]),
        ("join/ideal", "%.2f", lambda r: r["join"]["shards_moved_vs_ideal"]),
        ("leave/ideal", "%.2f", lambda r: r["leave"]["shards_moved_vs_ideal"]),
        ("join: keys moved, whole s", "%s", lambda r: "%d, %.2f" % (
            r["join"]["keys_moved"], r["join"]["whole_s"])),
        ("leave: keys moved, lost, whole s", "%s", lambda r: "%d, %d, %.2f" % (
            r["leave"]["keys_moved"], r["leave"]["keys_lost"], r["leave"]["whole_s"])),
        ("setup s", "%.1f", lambda r: r["setup_s"])]
print(" | ".join(h for h, _, _ in cols))
print(" | ".join("---" for _ in cols))
for r in rows:
    print(" | ".join(f % get(r) for _, f, get in cols))
per_key = [r["directory_bytes_per_key"] for r in rows if r["directory_bytes_per_key"] > 0]
small = min(rows, key=lambda r: r["nodes"])
large = max(rows, key=lambda r: r["nodes"])


def p99_ratio(kind, link):
    a = small[kind]["get_us_%d" % link]["p99"]
    b = large[kind]["get_us_%d" % link]["p99"]
    return "%.3f" % (b / a) if a > 0 else "n/a"


print("metric scale_chain_read_messages_max %d"
      % max(r["chain_read"]["lookup_messages_max"] for r in rows))
print("metric scale_chain_read_fetches_max %d" % max(r["chain_read"]["fetches_max"] for r in rows))
print("metric scale_home_read_messages_max %d"
      % max(r["home_read"]["lookup_messages_max"] for r in rows))
print("metric scale_chain_put_messages_max %d" % max(r["chain_put_messages_max"] for r in rows))
print("metric scale_directory_bytes_per_key_spread %.3f" % (max(per_key) / min(per_key) - 1))
print("metric scale_shards_moved_per_join_vs_ideal %.3f"
      % max(max(r["join"]["shards_moved_vs_ideal"], r["leave"]["shards_moved_vs_ideal"])
            for r in rows))
print("metric scale_directory_whole_after_view_s_max %.2f"
      % max(max(r["join"]["whole_s"], r["leave"]["whole_s"]) for r in rows))
print("metric scale_membership_bytes_per_node_max %d"
      % max(r["membership_bytes_per_node"] for r in rows))
# Named for the acceptance's sizes; it compares the largest N run with the smallest.
print("metric scale_get_p99_1024_vs_4 %s (N=%d over N=%d)"
      % (p99_ratio("chain_read", 10), large["nodes"], small["nodes"]))
print("metric scale_get_p99_1024_vs_4_50us %s" % p99_ratio("chain_read", 50))
print("metric scale_home_get_p99_1024_vs_4 %s" % p99_ratio("home_read", 10))
print("metric scale_chain_read_misses %d"
      % sum(r["chain_read"]["misses"] + r["home_read"]["misses"] for r in rows))
if etcd:
    print()
    print("N | etcd requests/s | keepalives/s | watch requests/s | join seen by all s"
          " | crash gone from all s")
    print("--- | --- | --- | --- | --- | ---")
    for e in etcd:
        m = e["by_method"]
        print("%d | %.1f | %.1f | %.1f | %.2f | %.2f" % (
            e["nodes"], e["requests_per_s"], m.get("LeaseKeepAlive", 0), m.get("Watch", 0),
            e["join_seen_by_all_s"], e["crash_gone_from_all_s"]))
    top = max(etcd, key=lambda e: e["nodes"])
    print("metric scale_etcd_requests_per_node_s %.2f" % (top["requests_per_s"] / top["nodes"]))
    print("metric scale_etcd_crash_gone_vs_lease %.2f"
          % max(e["crash_gone_from_all_s"] / e["lease_ttl_s"] for e in etcd))
PYEOF
