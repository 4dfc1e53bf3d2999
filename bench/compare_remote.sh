#!/usr/bin/env bash
# bench/compare.sh remote: kvpool's remote path (two nodes on this host,
# UCX over loopback TCP) side by side with iperf3 and Redis (run through
# bench/compare.sh remote; see bench/README.md).
#
# In one run (about 2 minutes), everything on 127.0.0.1, free ports, a
# temporary directory:
#   iperf3   one TCP stream, 1 MiB writes, 3 s (the loopback wire's limit)
#   redis    redis-benchmark GET of 1 MiB values from another process, every
#            GET a hit; best of -c 1 / -c 4 / -c 4 -P 4, plus -c N -P 16 when
#            kvpool's remote get runs N = GET_THREADS > 1 client threads
#            (N connections x batch 16 in flight, as kvpool has)
#   kvpool   nodes A (large DRAM) and B (small DRAM, so the replicas it
#            keeps of values fetched again are evicted and reads stay
#            remote) in a static --peers cluster, UCX_TLS=tcp
#            UCX_NET_DEVICES=lo. Keys are put through A's socket;
#            B then reads them: get (1 MiB, batch 16, GET_THREADS client
#            threads, each with its own connection), zero-copy get (acquire
#            into B's segment, read in place), exists (batch 128),
#            exists vs get at batch 64 (the lookups' share of a batch get),
#            put through B with --placement home when the node supports it.
#            Node counters around each run give the share of B's hits that
#            were remote fetches, and /proc the CPU time of A, B and client.
# Each measurement is repeated (default 3) and the median reported; iperf3,
# Redis, the get and the zero-copy get run back to back in each repetition,
# and a ratio is the median of the per-repetition ratios. Ends with
# `metric NAME VALUE` lines.
#
# Usage: bench/compare.sh remote [--reps N] [--duration DURATION] [--keep]
# Environment: BUILD_DIR (default build), UCX_TLS (default tcp),
#   UCX_NET_DEVICES (default lo), A_DRAM (default 5GiB), B_DRAM (default 128MiB),
#   GET_KEYS (default 3072 1 MiB keys on A), IPERF_SECONDS (default 3),
#   GET_THREADS (default 1: kvpool-bench threads of the remote get, each
#   with its own connection to B; one thread leaves the wire idle while it
#   copies a batch out, more overlap that copy with the next batch's
#   fetches; the other runs always use one), PEER_SECURITY (default none;
#   keyed: the nodes hold a cluster key; encrypted: and --peer-encryption;
#   run the script once per mode to compare them, or see compare.sh
#   security for the side-by-side ratio).
set -euo pipefail

LOG_TAG=remote
# shellcheck source=bench/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

REPS=3
DURATION=2s  # per kvpool-bench run (2s, 500ms; a bare number is milliseconds)
KEEP=0
parse_flags "--reps --duration --keep" "$@"

export UCX_TLS="${UCX_TLS:-tcp}"
export UCX_NET_DEVICES="${UCX_NET_DEVICES:-lo}"
A_DRAM="${A_DRAM:-5GiB}"
B_DRAM="${B_DRAM:-128MiB}"
GET_KEYS="${GET_KEYS:-3072}"          # 1 MiB values: 3 GiB on A, 24x B's DRAM
GET_THREADS="${GET_THREADS:-1}"
EXISTS_KEYS=65536                     # 4 KiB values
LS_KEYS=16384                         # 64 KiB values (1 GiB) for the lookup share
IPERF_SECONDS="${IPERF_SECONDS:-3}"
REDIS_CONFIGS=("-c 1" "-c 4" "-c 4 -P 4")
# Redis gets at least kvpool's concurrency: GET_THREADS connections x 16 in flight.
[[ "$GET_THREADS" -gt 1 ]] && REDIS_CONFIGS+=("-c $GET_THREADS -P 16")
REDIS_KEYS=1024                       # 1 GiB of 1 MiB values
REDIS_N=()                            # requests per redis-benchmark run, by config
MB=1048576

command -v iperf3 >/dev/null || missing+=("iperf3 (apt-get install iperf3)")
for t in redis-server redis-benchmark redis-cli; do
  command -v "$t" >/dev/null || missing+=("$t (apt-get install redis-server redis-tools)")
done
NODE="$(find_bin kvpool-node || true)"
BENCH="$(find_bin kvpool-bench || true)"
[[ -n "$NODE" ]] || missing+=("kvpool-node under $BUILD_DIR (cmake -B build -G Ninja && ninja -C build)")
[[ -n "$BENCH" ]] || missing+=("kvpool-bench under $BUILD_DIR (cmake -B build -G Ninja && ninja -C build)")
check_missing
# (The help is read whole: grep -q closing the pipe early would fail the
# pipeline under pipefail.)
if [[ -n "$NODE" ]] && [[ "$("$NODE" --help 2>&1 || true)" != *--peers* ]]; then
  die "$NODE has no --peers (a build from before clustering? rebuild: ninja -C $BUILD_DIR)"
fi

TMP="$(mktemp -d -t kvpool-remote.XXXXXX)"
PEER_SECURITY="${PEER_SECURITY:-none}"
PEER_ARGS=()
case "$PEER_SECURITY" in
  none) PEER_ARGS=(--insecure) ;;  # loopback without the key needs --insecure
  keyed | encrypted)
    openssl rand -hex 32 > "$TMP/cluster.key"
    chmod 600 "$TMP/cluster.key"
    PEER_ARGS=(--cluster-key-file "$TMP/cluster.key")
    [[ "$PEER_SECURITY" == encrypted ]] && PEER_ARGS+=(--peer-encryption)
    ;;
  *) die "PEER_SECURITY must be none, keyed or encrypted (not $PEER_SECURITY)" ;;
esac
RESULTS="$TMP/results.jsonl"
: > "$RESULTS"
A_PID="" ; B_PID="" ; REDIS_PID="" ; IPERF_PID=""
cleanup() {
  local rc=$?
  stop_pid "$B_PID" kvpool-node-b
  stop_pid "$A_PID" kvpool-node-a
  stop_pid "$REDIS_PID" redis-server
  stop_pid "$IPERF_PID" iperf3-server
  keep_or_remove_tmp "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

freeport() { "$PY" "$HERE/compare_lib.py" freeport; }

# ---- iperf3 ----------------------------------------------------------------------
iperf_rep() {  # iperf_rep REP: one ${IPERF_SECONDS}s run
  local rep="$1" port _
  port="$(freeport)"
  iperf3 -s -1 -p "$port" > "$TMP/iperf-server-$rep.log" 2>&1 &
  IPERF_PID=$!
  # Wait for the listener without connecting (-1 serves one client only).
  for _ in $(seq 50); do
    ss -ltnH "sport = :$port" 2>/dev/null | grep -q . && break
    sleep 0.1
  done
  iperf3 -c 127.0.0.1 -p "$port" -l 1M -t "$IPERF_SECONDS" -J > "$TMP/iperf-$rep.json" \
    || die "iperf3 client failed (see $TMP/iperf-$rep.json)"
  "$PY" "$HERE/compare_lib.py" iperf-json "$rep" < "$TMP/iperf-$rep.json" | tee -a "$RESULTS" > "$TMP/last.json"
  log "iperf3 rep $rep: $("$PY" "$HERE/compare_lib.py" json-get gbps < "$TMP/last.json") GB/s"
  stop_pid "$IPERF_PID" iperf3-server
  IPERF_PID=""
}

# ---- redis -------------------------------------------------------------------------
redis_start() {
  local attempt _
  for attempt in 1 2 3; do
    REDIS_PORT="$(freeport)"
    redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --protected-mode yes --save '' --appendonly no \
      --maxmemory 0 --dir "$TMP" --logfile "$TMP/redis.log" --daemonize no &
    REDIS_PID=$!
    for _ in $(seq 100); do
      kill -0 "$REDIS_PID" 2>/dev/null || break
      [[ "$(redis-cli -p "$REDIS_PORT" ping 2>/dev/null)" == PONG ]] && break 2
      sleep 0.1
    done
    stop_pid "$REDIS_PID" redis-server
    REDIS_PID=""
  done
  [[ -n "$REDIS_PID" ]] || die "could not start redis-server"
  log "redis: filling $REDIS_KEYS keys of 1 MiB"
  "$PY" "$HERE/compare_lib.py" redis-fill "$MB" "$REDIS_KEYS" | redis-cli -p "$REDIS_PORT" --pipe > "$TMP/redis-fill.log"
  [[ "$(redis-cli -p "$REDIS_PORT" dbsize)" == "$REDIS_KEYS" ]] || die "redis fill failed"
  redis-cli -p "$REDIS_PORT" config resetstat >/dev/null
  local i
  for i in "${!REDIS_CONFIGS[@]}"; do REDIS_N[$i]=2000; done
}

redis_rep() {  # redis_rep REP: each configuration for about 1 s
  local rep="$1" i cfg out rps tags
  for i in "${!REDIS_CONFIGS[@]}"; do
    cfg="${REDIS_CONFIGS[$i]}"
    # shellcheck disable=SC2086
    out="$(redis-benchmark -p "$REDIS_PORT" -t get -d "$MB" -r "$REDIS_KEYS" -n "${REDIS_N[$i]}" $cfg --csv)" \
      || die "redis-benchmark get $cfg failed"
    tags="{\"system\":\"redis\",\"value_size\":$MB,\"config\":\"${cfg}\",\"rep\":$rep}"
    printf '%s\n' "$out" | "$PY" "$HERE/compare_lib.py" redis-csv "$tags" | tee -a "$RESULTS" > "$TMP/last.json"
    rps="$("$PY" "$HERE/compare_lib.py" json-get ops_per_s < "$TMP/last.json")"
    log "redis get 1MiB $cfg rep $rep: $(printf '%.0f' "$rps") req/s ($("$PY" "$HERE/compare_lib.py" json-get gbps < "$TMP/last.json") GB/s)"
    REDIS_N[$i]="$("$PY" "$HERE/compare_lib.py" redis-next-n "$rps" 1 200)"
  done
}

redis_stop() {
  local misses
  misses="$(redis-cli -p "$REDIS_PORT" info stats | tr -d '\r' | awk -F: '/^keyspace_misses:/ {print $2}')"
  [[ "$misses" == 0 ]] || die "redis: $misses GETs missed"
  stop_pid "$REDIS_PID" redis-server
  REDIS_PID=""
}

# ---- kvpool cluster ----------------------------------------------------------------
PLACEMENT_HOME=0
probe_placement() {
  local port out
  port="$(freeport)"
  out="$(timeout 5 "$NODE" --node-id probe --peers "probe=127.0.0.1:$port" --peer-port "$port" \
    --peer-address 127.0.0.1 --placement home --dram-capacity 16MiB --slab-size 1MiB --admin=false \
    --socket "$TMP/probe.sock" "${PEER_ARGS[@]}" 2>&1 || true)"
  if grep -q 'serving' <<< "$out"; then
    PLACEMENT_HOME=1
  else
    PUT_NOTE="$(grep -o -- "--placement home.*" <<< "$out" | head -n 1 || true)"
    [[ -n "$PUT_NOTE" ]] || PUT_NOTE="node did not start with --placement home"
  fi
}

start_node() {  # start_node ID DRAM EXTRA...: sets NODE_STARTED_PID, NODE_URL
  local id="$1" dram="$2" logf="$TMP/node-$1.log" sock="$TMP/$1.sock" rc=0
  shift 2
  "$NODE" --node-id "$id" --peers "$PEERS" --peer-address 127.0.0.1 --socket "$sock" \
    --dram-capacity "$dram" --slab-size 1MiB --admin-port 0 "${PEER_ARGS[@]}" "$@" > "$logf" 2>&1 &
  NODE_STARTED_PID=$!
  wait_node_ready "$NODE_STARTED_PID" "$logf" "$sock" || rc=$?
  [[ $rc -ne 1 ]] || die "kvpool-node $id exited during startup"
  [[ $rc -eq 0 ]] || die "kvpool-node $id not ready after 120 s"
  NODE_URL="$READY_URL"
  log "node $id ready (pid $NODE_STARTED_PID, $dram, peers: $PEER_SECURITY, admin $NODE_URL; $(grep -o 'pre-faulted.*' "$logf" || true))"
}

metric_of() {  # metric_of URL NAME
  "$PY" "$HERE/compare_lib.py" metric "$1/metrics" "$2"
}

populate_a() {  # populate_a NAMESPACE KEYS VALUE_SIZE: put through A's socket, untimed
  local ns="$1" keys="$2" size="$3" want have _
  "$BENCH" --socket "$TMP/a.sock" --op exists --populate --namespace "$ns" --keys "$keys" \
    --value-size "$size" --batch 64 --duration 50ms --warmup 0ms --json > /dev/null 2> "$TMP/populate.err" \
    || { cat "$TMP/populate.err" >&2; die "populate $ns on A failed"; }
  grep -q " $keys stored" "$TMP/populate.err" || { cat "$TMP/populate.err" >&2; die "populate $ns: not all $keys keys stored on A"; }
  log "A: $(grep -o 'populated.*' "$TMP/populate.err")"
  # Wait until the homes' directories know every key (each put's are sent before
  # its answer, and arrive on the peer thread).
  want=$((DIR_ENTRIES + keys))
  for _ in $(seq 100); do
    have=$(( $(metric_of "$A_URL" kvpool_directory_entries) + $(metric_of "$B_URL" kvpool_directory_entries) ))
    [[ $have -ge $want ]] && break
    sleep 0.05
  done
  [[ $have -ge $want ]] || die "directories hold $have entries, want $want"
  DIR_ENTRIES=$have
}

b_run() {  # b_run PHASE REP SOCKET-ID ARGS...: one kvpool-bench run, tagged with node counters
  # (one client thread unless B_THREADS says otherwise)
  local phase="$1" rep="$2" sid="$3" rc=0
  shift 3
  "$PY" "$HERE/compare_lib.py" remote-run "$phase" "$rep" "$A_URL" "$B_URL" "$A_PID" "$B_PID" -- \
    "$BENCH" --socket "$TMP/$sid.sock" --json --threads "${B_THREADS:-1}" --seed $((rep + 1)) "$@" \
    >> "$RESULTS" || rc=$?
  [[ $rc -eq 0 ]] || die "kvpool-bench ($phase rep $rep) failed"
}

run_kvpool() {
  local pa pb rep b_extra=()
  probe_placement
  pa="$(freeport)"; pb="$(freeport)"
  PEERS="a=127.0.0.1:$pa,b=127.0.0.1:$pb"
  log "kvpool: UCX_TLS=$UCX_TLS UCX_NET_DEVICES=$UCX_NET_DEVICES, static cluster $PEERS"
  start_node a "$A_DRAM" --peer-port "$pa"
  A_PID=$NODE_STARTED_PID; A_URL=$NODE_URL
  [[ $PLACEMENT_HOME -eq 1 ]] && b_extra=(--placement home)
  start_node b "$B_DRAM" --peer-port "$pb" "${b_extra[@]}"
  B_PID=$NODE_STARTED_PID; B_URL=$NODE_URL
  DIR_ENTRIES=0

  populate_a get1m "$GET_KEYS" 1MiB
  redis_start
  # Each repetition measures the wire, Redis and kvpool back to back, so a
  # ratio compares figures taken within seconds of each other on this
  # shared machine.
  log "paired repetitions: iperf3 (${IPERF_SECONDS}s), redis GET (each config), kvpool remote get" \
    "(B reads 1 MiB values held on A, batch 16, $GET_THREADS client threads, ${DURATION}) and" \
    "zero-copy get (acquire into B's segment, read in place); $REPS x"
  for rep in $(seq 0 $((REPS - 1))); do
    iperf_rep "$rep"
    redis_rep "$rep"
    B_THREADS=$GET_THREADS b_run get "$rep" b --op get --namespace get1m --keys "$GET_KEYS" \
      --value-size 1MiB --batch 16 --duration "$DURATION" --warmup 0ms --buffer-size 256MiB
    b_run zc-get "$rep" b --op zc-get --zc-read touch --namespace get1m --keys "$GET_KEYS" \
      --value-size 1MiB --batch 16 --duration "$DURATION" --warmup 0ms
  done
  redis_stop
  log "reference: local get of the same keys on A"
  for rep in $(seq 0 $((REPS - 1))); do
    b_run local-get "$rep" a --op get --namespace get1m --keys "$GET_KEYS" --value-size 1MiB --batch 16 \
      --duration 1s --warmup 0ms --buffer-size 256MiB
  done

  populate_a exists "$EXISTS_KEYS" 4KiB
  log "remote exists: batch 128 through B, keys only on A, $REPS x ${DURATION}"
  for rep in $(seq 0 $((REPS - 1))); do
    b_run exists "$rep" b --op exists --namespace exists --keys "$EXISTS_KEYS" --value-size 4KiB --batch 128 \
      --duration "$DURATION"
  done

  populate_a ls64k "$LS_KEYS" 64KiB
  log "lookup share: exists vs get, batch 64, 64 KiB and 1 MiB values, $REPS x"
  for rep in $(seq 0 $((REPS - 1))); do
    b_run ls-exists "$rep" b --op exists --namespace ls64k --keys "$LS_KEYS" --value-size 64KiB --batch 64 \
      --duration 1s
    b_run ls-get "$rep" b --op get --namespace ls64k --keys "$LS_KEYS" --value-size 64KiB --batch 64 \
      --duration "$DURATION" --warmup 0ms --buffer-size 256MiB
    b_run ls-exists "$rep" b --op exists --namespace get1m --keys "$GET_KEYS" --value-size 1MiB --batch 64 \
      --duration 1s
    b_run ls-get "$rep" b --op get --namespace get1m --keys "$GET_KEYS" --value-size 1MiB --batch 64 \
      --duration "$DURATION" --warmup 0ms
  done

  local dbytes=$(( $(metric_of "$A_URL" kvpool_directory_bytes) + $(metric_of "$B_URL" kvpool_directory_bytes) ))
  local dent=$(( $(metric_of "$A_URL" kvpool_directory_entries) + $(metric_of "$B_URL" kvpool_directory_entries) ))
  local gbytes=$(( $(metric_of "$A_URL" kvpool_directory_ghost_bytes) + $(metric_of "$B_URL" kvpool_directory_ghost_bytes) ))
  "$PY" -c 'import json,sys; b,e,g=int(sys.argv[1]),int(sys.argv[2]),int(sys.argv[5]); print(json.dumps({"system":"node",
    "directory_bytes":b,"directory_entries":e,"directory_bytes_per_entry":b/e if e else float("nan"),
    "directory_ghost_bytes_per_entry":g/e if e else float("nan"),
    "cpus":int(sys.argv[3]),"put_note":sys.argv[4]}))' "$dbytes" "$dent" "$(nproc)" "${PUT_NOTE:-}" "$gbytes" >> "$RESULTS"
  log "directories: $dbytes bytes for $dent entries"

  if [[ $PLACEMENT_HOME -eq 1 ]]; then
    log "remote put: B with --placement home, 1 MiB, batch 16, $REPS x ${DURATION}"
    for rep in $(seq 0 $((REPS - 1))); do
      b_run put "$rep" b --op put --namespace "put-$rep" --keys 16 --value-size 1MiB --batch 16 \
        --duration "$DURATION" --buffer-size 256MiB
    done
  else
    log "remote put: skipped: ${PUT_NOTE}"
  fi
  stop_pid "$B_PID" kvpool-node-b; B_PID=""
  stop_pid "$A_PID" kvpool-node-a; A_PID=""
}

started=$SECONDS
run_kvpool
log "done in $((SECONDS - started)) s"
"$PY" "$HERE/compare_lib.py" remote-summarize "$RESULTS"
