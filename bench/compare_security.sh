#!/usr/bin/env bash
# bench/compare.sh security: what an intruder gets from a kvpool cluster, and
# what authentication costs, from real nodes.
#
# 1. Runs tests/cluster_auth_test from the build: nodes on hosts of their own
#    (network namespaces joined by veth pairs, so it needs root and `ip`),
#    an intruder without the cluster key (another key, then none) and a
#    recorded handshake replayed to the nodes. The test asserts each outcome
#    and prints the counts as `metric` lines, collected here:
#      unauthenticated_peer_values_read, unauthenticated_peer_writes_accepted,
#      wrong_key_joins_refused (connections the nodes refused),
#      wrong_key_joins_accepted, replayed_handshakes_accepted.
# 2. auth_cost_remote_get: a remote get (node B reads 1 MiB values held on
#    node A, batch 16, one client thread) in a two-node static cluster with
#    a cluster key, over the same without one; the two run in turn (which
#    goes first alternates), a fresh cluster each time, and the metric is
#    the median of the per-pair ratios (authentication happens once per
#    connection, so about 1.0).
#    encryption_cost_remote_get: the same remote get with the key and
#    --peer-encryption, over the key alone, run in the same rounds (the
#    three modes in a rotating order), median of the per-round ratios.
#    cluster_auth_test also prints peer_frames_with_value_bytes_encrypted
#    (frames between two hosts of an encrypted cluster holding value bytes:
#    0) and _plain (the same without encryption: more than 0).
#
#    ucx_port_intruder_write_node_survived: the same intruder speaking UCX's
#    own TCP protocol to UCX's data port (below; 0 today: see
#    docs/cluster.md, "UCX's own port").
#
# 3. Runs tests/tenant_test from the build: one node with two tenants whose
#    clients run as two other uids (needs root), attacking each other. It
#    asserts each outcome and prints, collected here:
#      cross_tenant_values_read (by key, by the node's bound key ids, by
#      scanning mappings and the node's fds; also each of the three alone),
#      cross_tenant_poisoned_keys, committed_values_modified_by_clients,
#      removed_values_readable_in_mapping, cross_tenant_evictions (under a
#      flood of three times a tenant's quotas), quota_overrun_bytes.
#
# Usage: bench/compare.sh security [--reps N] [--duration DURATION] [--keep]
#   --reps      rounds of remote-get runs (default 8)
#   --duration  each remote-get run (default 2s)
# Environment: BUILD_DIR (default build), UCX_TLS (default tcp),
#   UCX_NET_DEVICES (default lo), A_DRAM (default 4GiB).
set -euo pipefail

LOG_TAG=security
# shellcheck source=bench/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

REPS=8
DURATION=2s
KEEP=0
parse_flags "--reps --duration --keep" "$@"
export UCX_TLS="${UCX_TLS:-tcp}" UCX_NET_DEVICES="${UCX_NET_DEVICES:-lo}"
A_DRAM="${A_DRAM:-4GiB}"
KEYS=3072

NODE="$(find_bin kvpool-node || true)"
BENCH="$(find_bin kvpool-bench || true)"
AUTH_TEST="$(find_bin cluster_auth_test || true)"
TENANT_TEST="$(find_bin tenant_test || true)"
[[ -n "$NODE" ]] || missing+=("kvpool-node under $BUILD_DIR")
[[ -n "$BENCH" ]] || missing+=("kvpool-bench under $BUILD_DIR")
[[ -n "$AUTH_TEST" ]] || missing+=("cluster_auth_test under $BUILD_DIR (ninja -C $BUILD_DIR cluster_auth_test)")
[[ -n "$TENANT_TEST" ]] || missing+=("tenant_test under $BUILD_DIR (ninja -C $BUILD_DIR tenant_test)")
command -v openssl >/dev/null || missing+=("openssl")
check_missing

TMP="$(mktemp -d /tmp/kvpool-security.XXXXXX)"
A_PID=""; B_PID=""
cleanup() {
  local rc=$?
  stop_pid "$B_PID" kvpool-node-b KILL
  stop_pid "$A_PID" kvpool-node-a KILL
  keep_or_remove_tmp "$rc"
}
trap cleanup EXIT

freeport() { "$PY" "$HERE/compare_lib.py" freeport; }

log "intruder, replay and token tests: $AUTH_TEST"
rc=0
"$AUTH_TEST" > "$TMP/auth_test.out" 2>&1 || rc=$?
grep '^metric ' "$TMP/auth_test.out" > "$TMP/metrics" || true
if [[ $rc -ne 0 ]]; then
  grep -E '^\[  FAILED|Failure' "$TMP/auth_test.out" >&2 || true
  die "cluster_auth_test failed (exit $rc); its output is in $TMP/auth_test.out"
fi
grep -q unauthenticated_peer_values_read "$TMP/metrics" \
  || die "cluster_auth_test printed no intruder metrics (skipped? it needs root and ip): $TMP/auth_test.out"

log "tenant isolation and quota tests: $TENANT_TEST"
rc=0
"$TENANT_TEST" > "$TMP/tenant_test.out" 2>&1 || rc=$?
grep '^metric ' "$TMP/tenant_test.out" >> "$TMP/metrics" || true
if [[ $rc -ne 0 ]]; then
  grep -E '^\[  FAILED|Failure' "$TMP/tenant_test.out" >&2 || true
  die "tenant_test failed (exit $rc); its output is in $TMP/tenant_test.out"
fi
grep -q cross_tenant_values_read "$TMP/metrics" \
  || die "tenant_test printed no tenant metrics (skipped? it needs root): $TMP/tenant_test.out"

openssl rand -hex 32 > "$TMP/cluster.key"
chmod 600 "$TMP/cluster.key"

# UCX's own listener (the data port UCX opens beside the peer port; pinned
# here with UCX_TCP_PORT_RANGE) authenticates nothing: with UCX_TLS=tcp, one
# message in UCX's TCP wire format (its magic number, then a PUT request
# header naming address 0x10 and 8 bytes) makes the node write those bytes
# there. Reports whether a keyed node was still running a second later
# (ucx_port_intruder_write_node_survived: 1 yes, 0 no).
ucx_probe() {
  local pa pu
  pa="$(freeport)"; pu="$(freeport)"
  UCX_TCP_PORT_RANGE="$pu-$pu" "$NODE" --node-id a --peers "a=127.0.0.1:$pa,b=127.0.0.1:$(freeport)" \
    --peer-port "$pa" --socket "$TMP/a.sock" --dram-capacity 128MiB --slab-size 1MiB --admin-port 0 \
    --cluster-key-file "$TMP/cluster.key" > "$TMP/probe.log" 2>&1 &
  A_PID=$!
  wait_node_ready "$A_PID" "$TMP/probe.log" "$TMP/a.sock" || die "node a (probe) did not start"
  "$PY" - "$pu" <<'PYEOF' || die "could not reach UCX's port"
import socket, struct, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
put_req_am_id = 33  # UCT_AM_ID_MAX (32) + 1 in UCX 1.13
s.sendall(struct.pack("<Q", 0xCAFEBABE12345678) + struct.pack("<BI", put_req_am_id, 20)
          + struct.pack("<QQI", 0x10, 8, 1) + b"A" * 8)
time.sleep(1)
PYEOF
  if kill -0 "$A_PID" 2>/dev/null; then
    echo "metric ucx_port_intruder_write_node_survived 1" >> "$TMP/metrics"
    stop_pid "$A_PID" kvpool-node-a KILL
  else
    echo "metric ucx_port_intruder_write_node_survived 0" >> "$TMP/metrics"
    log "the node died: $(grep -m1 -o 'Caught signal.*' "$TMP/probe.log" || tail -1 "$TMP/probe.log")"
    wait "$A_PID" 2>/dev/null || true
  fi
  A_PID=""
}
log "an intruder without the key on UCX's own port (UCX_TLS=$UCX_TLS)"
[[ "$UCX_TLS" == tcp ]] && ucx_probe

# remote_get MODE: one run in a fresh cluster (MODE plain, keyed or
# encrypted); prints GB/s.
remote_get() {
  local auth=() pa pb peers out
  auth=(--insecure)  # plain: loopback without the key needs --insecure
  [[ $1 != plain ]] && auth=(--cluster-key-file "$TMP/cluster.key")
  [[ $1 == encrypted ]] && auth+=(--peer-encryption)
  pa="$(freeport)"; pb="$(freeport)"
  peers="a=127.0.0.1:$pa,b=127.0.0.1:$pb"
  "$NODE" --node-id a --peers "$peers" --peer-port "$pa" --socket "$TMP/a.sock" \
    --dram-capacity "$A_DRAM" --slab-size 1MiB --admin-port 0 "${auth[@]}" > "$TMP/a.log" 2>&1 &
  A_PID=$!
  "$NODE" --node-id b --peers "$peers" --peer-port "$pb" --socket "$TMP/b.sock" \
    --dram-capacity 128MiB --slab-size 1MiB --admin-port 0 "${auth[@]}" > "$TMP/b.log" 2>&1 &
  B_PID=$!
  wait_node_ready "$A_PID" "$TMP/a.log" "$TMP/a.sock" || die "node a ($1) did not start"
  wait_node_ready "$B_PID" "$TMP/b.log" "$TMP/b.sock" || die "node b ($1) did not start"
  "$BENCH" --socket "$TMP/a.sock" --op exists --populate --namespace sec --keys "$KEYS" \
    --value-size 1MiB --batch 64 --duration 50ms --warmup 0ms > /dev/null 2> "$TMP/populate.err" \
    || { cat "$TMP/populate.err" >&2; die "populate ($1) failed"; }
  sleep 1  # the publishes reach the keys' homes
  out="$("$BENCH" --socket "$TMP/b.sock" --op get --namespace sec --keys "$KEYS" --value-size 1MiB \
    --batch 16 --threads 1 --duration "$DURATION" --warmup 0ms --buffer-size 256MiB --json)" \
    || die "remote get ($1) failed"
  stop_pid "$B_PID" kvpool-node-b KILL; B_PID=""
  stop_pid "$A_PID" kvpool-node-a KILL; A_PID=""
  printf '%s\n' "$out" | "$PY" -c '
import json, sys
r = [json.loads(l) for l in sys.stdin if l.strip()][-1]
if r.get("errors") or r.get("misses"):
    sys.exit("remote get: %s errors, %s misses" % (r.get("errors"), r.get("misses")))
print("%.3f" % r["gbps"])'
}

log "remote get without a cluster key, with one, and encrypted: $REPS rounds of $DURATION"
modes=(plain keyed encrypted)
for rep in $(seq 1 "$REPS"); do
  # The order rotates, so no mode gains from the machine's drift.
  declare -A got=()
  for i in 0 1 2; do
    m="${modes[$(( (i + rep) % 3 ))]}"
    got[$m]="$(remote_get "$m")"
  done
  log "round $rep: without a key ${got[plain]} GB/s, with ${got[keyed]}, encrypted ${got[encrypted]}"
  printf '%s %s %s\n' "${got[plain]}" "${got[keyed]}" "${got[encrypted]}" >> "$TMP/pairs"
  unset got
done
"$PY" - "$TMP/pairs" >> "$TMP/metrics" <<'PYEOF'
import statistics, sys
rounds = [tuple(map(float, l.split())) for l in open(sys.argv[1]) if l.strip()]
print("metric remote_get_1m_gbps_plain %.3f" % statistics.median(r[0] for r in rounds))
print("metric remote_get_1m_gbps_keyed %.3f" % statistics.median(r[1] for r in rounds))
print("metric remote_get_1m_gbps_encrypted %.3f" % statistics.median(r[2] for r in rounds))
print("metric auth_cost_remote_get %.3f" % statistics.median(r[1] / r[0] for r in rounds))
print("metric encryption_cost_remote_get %.3f" % statistics.median(r[2] / r[1] for r in rounds))
PYEOF
cat "$TMP/metrics"
