#!/usr/bin/env bash
# bench/compare.sh scale: what a request costs as the cluster grows.
# kvpool-scale-sim (src/cluster/scale_sim.h) stands up N nodes' real cluster
# services in one process over the in-process transport, puts chains of
# 128 blocks (each from one node) and reads each from another node, and
# counts the peer messages each request sends. Prints a table for each N
# and `metric` lines:
#   scale_chain_read_messages_max           most messages one chain read sent, any N
#                                           (lookups at the keys' homes + one fetch a block)
#   scale_chain_read_lookups_max            most lookup messages one chain read sent
#   scale_chain_put_messages_max            most publishes one chain put sent, any N
#   scale_directory_bytes_per_key_spread    max/min - 1 of directory bytes per key over N
#   scale_shards_moved_per_join_vs_ideal    worst over N: shards a join moves / (4096/(N+1))
#   scale_membership_bytes_per_node_max     a node's view and shard map at the largest N
#   scale_get_p99_1024_vs_4                 not measured yet (no link-latency model): n/a
#   scale_chain_read_misses                 blocks a read did not find (must be 0)
#
# Usage: bench/compare.sh scale [--nodes LIST] [--chains N] [--keep]
#   --nodes   comma list of cluster sizes (default 4,16,64,256)
#   --chains  chains put and read per size (default 16)
# Environment: BUILD_DIR.
set -euo pipefail

LOG_TAG=scale
# shellcheck source=bench/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

NODES="4,16,64,256"
CHAINS=16
KEEP=0
parse_flags "--nodes --chains --keep" "$@"

SIM="$(find_bin kvpool-scale-sim || true)"
[[ -n "$SIM" ]] || missing+=("kvpool-scale-sim under $BUILD_DIR")
check_missing

TMP="$(mktemp -d /tmp/kvpool-scale.XXXXXX)"
trap 'keep_or_remove_tmp $?' EXIT

log "kvpool-scale-sim --nodes $NODES --chains $CHAINS"
"$SIM" --nodes "$NODES" --chains "$CHAINS" --blocks 128 > "$TMP/scale.jsonl"

"$PY" - "$TMP/scale.jsonl" <<'PYEOF'
import json
import sys

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
cols = [("nodes", "N", "%d"), ("chain_read_messages_max", "read msgs max", "%d"),
        ("chain_read_lookups_mean", "lookups mean", "%.1f"),
        ("chain_read_homes_max", "homes max", "%d"),
        ("chain_put_messages_max", "put msgs max", "%d"),
        ("directory_bytes_per_key", "dir B/key", "%.0f"),
        ("membership_bytes_per_node", "view B/node", "%d"),
        ("peers_called_max", "peers max", "%d"),
        ("shards_moved_join_vs_ideal", "join/ideal", "%.2f"),
        ("setup_s", "setup s", "%.1f")]
print(" | ".join(h for _, h, _ in cols))
print(" | ".join("---" for _ in cols))
for r in rows:
    print(" | ".join(f % r[k] for k, _, f in cols))
per_key = [r["directory_bytes_per_key"] for r in rows if r["directory_bytes_per_key"] > 0]
print("metric scale_chain_read_messages_max %d" % max(r["chain_read_messages_max"] for r in rows))
print("metric scale_chain_read_lookups_max %d" % max(r["chain_read_homes_max"] for r in rows))
print("metric scale_chain_put_messages_max %d" % max(r["chain_put_messages_max"] for r in rows))
print("metric scale_directory_bytes_per_key_spread %.3f" % (max(per_key) / min(per_key) - 1))
print("metric scale_shards_moved_per_join_vs_ideal %.3f"
      % max(r["shards_moved_join_vs_ideal"] for r in rows))
print("metric scale_membership_bytes_per_node_max %d"
      % max(r["membership_bytes_per_node"] for r in rows))
print("metric scale_get_p99_1024_vs_4 n/a")
print("metric scale_chain_read_misses %d" % sum(r["chain_read_misses"] for r in rows))
PYEOF
