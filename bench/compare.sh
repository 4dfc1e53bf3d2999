#!/usr/bin/env bash
# bench/compare.sh local: kvpool's local (shared-memory) path side by side
# with a plain memcpy (the physical limit) and Redis on this host.
#
# Starts its own redis-server and kvpool-node (a fresh node for each value
# size) in a temporary directory and stops them on exit. Measures, for 64 KiB, 1 MiB and 4 MiB values:
#   memcpy   kvpool-memcpy-bench (random blocks between two 1 GiB regions)
#   redis    redis-benchmark SET and GET over a 1 GiB key space, in several
#            client configurations; the table reports Redis's best
#   kvpool   kvpool-bench get, zc-get and put (one thread, batch 16)
# and kvpool exists (batch 128, 4 KiB values, 256Ki keys). Each is repeated
# (default 3) and the median reported. Ends with `metric NAME VALUE` lines;
# see bench/README.md for what each means.
#
# Usage: bench/compare.sh local [--reps N] [--duration DURATION] [--only PARTS] [--keep]
#        bench/compare.sh ssd [--reps N] [--duration DURATION] [--gib N] [--keep]
#          (the SSD tier vs fio; bench/compare_ssd.sh, see bench/README.md)
#        bench/compare.sh remote [--reps N] [--duration DURATION] [--keep]
#          (two nodes over UCX vs iperf3 and Redis; bench/compare_remote.sh)
#        bench/compare.sh security [--reps N] [--duration DURATION] [--keep]
#          (an intruder without the cluster key, a replayed handshake, and
#          the cost of authentication; bench/compare_security.sh)
#        bench/compare.sh trace [--trace FILE] [--reps N] [--keep]
#          (cache quality on an LLM request trace: the eviction policies vs
#          offline LRU and Belady, and a pool of three nodes;
#          bench/compare_trace.sh)
#        bench/compare.sh trace --shapes all|LIST [--trace FILE] [--seed N] [--keep]
#          (the policies over the given trace and generated traffic shapes at
#          2-40 % capacity, against LRU and the best; bench/compare_shapes.sh)
#        bench/compare.sh hints [--seed N] [--scale X] [--keep]
#          (the agentic shape at 5-20 % capacity without and with cache hints
#          retaining paused sessions; bench/compare_hints.sh)
#        bench/compare.sh scale [--nodes LIST] [--chains N] [--keep]
#          (what a chain's read and put cost at N simulated nodes;
#          bench/compare_scale.sh)
#        bench/compare.sh events [--reps N] [--duration DURATION] [--put-value-size SIZE] [--keep]
#          (KV events with a subscriber that stopped reading vs one that
#          reads and vs none;
#          bench/compare_kv_events.sh)
#        bench/compare.sh builds --a DIR --b DIR [--mode MODE] [--rounds N] [--tolerance PCT] [--keep] [-- MODE_ARGS]
#          (two builds side by side in alternating rounds of one mode, e.g.
#          a change against the commit before it; bench/compare_builds.sh)
#        bench/compare.sh connectors [--reps N] [--cpu N|all] [--keep] [-- BENCH_ARGS]
#          (SGLang/LMCache/vLLM connectors vs the raw Python client;
#          bench/compare_connectors.sh)
#   --only   comma list of memcpy,redis,kvpool (default all three)
#   --keep   keep the temporary directory (logs, raw results)
# Environment: BUILD_DIR (default build, relative to the repository root);
# NODE_ARGS: extra kvpool-node flags for the local part (e.g.
# --writable-segment, to compare with clients writing the segment in place).
set -euo pipefail

LOG_TAG=compare
# shellcheck source=bench/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

# Every mode but local is its own script: bench/compare_<mode>.sh (events:
# compare_kv_events.sh).
case "${1:-}" in
  remote | builds | connectors | security | trace | hints | scale | ssd)
    mode="$1"
    shift
    exec "$HERE/compare_$mode.sh" "$@"
    ;;
  events)
    shift
    exec "$HERE/compare_kv_events.sh" "$@"
    ;;
esac
[[ "${1:-}" == "local" ]] || usage
shift
REPS=3
DURATION=2s         # per kvpool-bench run (as kvpool-bench reads it: 2s, 500ms; a bare number is ms)
MEMCPY_DURATION=1s  # per memcpy run
REDIS_SECONDS=1     # target seconds per redis-benchmark run
ONLY="memcpy,redis,kvpool"
KEEP=0
parse_flags "--reps --duration --only --keep" "$@"
want() { [[ ",$ONLY," == *",$1,"* ]]; }

SIZES=(65536 1048576 4194304)
BATCH=16              # kvpool get/put/zc-get: keys per call (see README)
EXISTS_BATCH=128
EXISTS_VALUE=4096
EXISTS_KEYS=262144
NODE_DRAM=3GiB
REDIS_CONFIGS=("-c 1" "-c 4" "-c 4 -P 4")
WORKING_SET=$((1 << 30))

# ---- prerequisites ---------------------------------------------------------
if want redis; then
  for t in redis-server redis-benchmark redis-cli; do
    command -v "$t" >/dev/null || missing+=("$t (apt-get install redis-server redis-tools)")
  done
fi
MEMCPY_BENCH="" ; KVPOOL_BENCH="" ; NODE=""
if want memcpy; then
  MEMCPY_BENCH="$(find_bin kvpool-memcpy-bench || true)"
  [[ -n "$MEMCPY_BENCH" ]] || missing+=("kvpool-memcpy-bench under $BUILD_DIR (cmake -B build -G Ninja && ninja -C build)")
fi
if want kvpool; then
  KVPOOL_BENCH="$(find_bin kvpool-bench || true)"
  NODE="$(find_bin kvpool-node || true)"
  [[ -n "$KVPOOL_BENCH" ]] || missing+=("kvpool-bench under $BUILD_DIR (cmake -B build -G Ninja && ninja -C build)")
  [[ -n "$NODE" ]] || missing+=("kvpool-node under $BUILD_DIR (cmake -B build -G Ninja && ninja -C build)")
fi
check_missing
avail_kib="$(awk '/^MemAvailable:/ {print $2}' /proc/meminfo)"
if [[ "$avail_kib" -lt $((8 * 1024 * 1024)) ]]; then
  log "warning: only $((avail_kib / 1024)) MiB available; this run wants ~8 GiB (node 3 GiB, redis ~1.3 GiB, benches 2 GiB)"
fi

# ---- lifecycle ---------------------------------------------------------------
TMP="$(mktemp -d -t kvpool-compare.XXXXXX)"
RESULTS="$TMP/results.jsonl"
: > "$RESULTS"
NODE_PID="" ; REDIS_PID=""
cleanup() {
  local rc=$?
  [[ -n "$NODE_PID" ]] && stop_pid "$NODE_PID" kvpool-node
  [[ -n "$REDIS_PID" ]] && stop_pid "$REDIS_PID" redis-server
  keep_or_remove_tmp "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

NODE_RUN=0
start_node() {
  local sock="$TMP/kvpool.sock" rc=0
  NODE_RUN=$((NODE_RUN + 1))
  NODE_LOG="$TMP/node-$NODE_RUN.log"
  log "starting kvpool-node ($NODE) with $NODE_DRAM of DRAM"
  # shellcheck disable=SC2086  # NODE_ARGS is a list of flags
  "$NODE" --socket "$sock" --dram-capacity "$NODE_DRAM" --admin-port 0 ${NODE_ARGS:-} > "$NODE_LOG" 2>&1 &
  NODE_PID=$!
  wait_node_ready "$NODE_PID" "$NODE_LOG" "$sock" || rc=$?
  if [[ $rc -eq 1 ]]; then NODE_PID=""; die "kvpool-node exited during startup"; fi
  if [[ $rc -ne 0 ]]; then
    tail -n 20 "$NODE_LOG" >&2
    die "kvpool-node not ready after 120 s (want socket $sock and an 'admin http://...' log line)"
  fi
  ADMIN_URL="$READY_URL"
  SOCK="$sock"
  log "kvpool-node ready: socket $SOCK, admin $ADMIN_URL ($(grep -o 'pre-faulted.*' "$NODE_LOG" || echo 'no pre-fault line'))"
}
stop_node() {
  stop_pid "$NODE_PID" kvpool-node
  NODE_PID=""
}

start_redis() {
  local attempt _
  for attempt in 1 2 3; do
    REDIS_PORT="$("$PY" "$HERE/compare_lib.py" freeport)"
    redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --protected-mode yes --save '' --appendonly no \
      --maxmemory 0 --dir "$TMP" --logfile "$TMP/redis.log" --daemonize no &
    REDIS_PID=$!
    for _ in $(seq 100); do
      kill -0 "$REDIS_PID" 2>/dev/null || break
      if [[ "$(redis-cli -p "$REDIS_PORT" ping 2>/dev/null)" == PONG ]]; then
        log "redis-server $(redis-server --version | grep -o 'v=[0-9.]*') ready on 127.0.0.1:$REDIS_PORT"
        return 0
      fi
      sleep 0.1
    done
    stop_pid "$REDIS_PID" redis-server
    REDIS_PID=""
    log "redis-server did not start on port $REDIS_PORT (attempt $attempt)"
  done
  tail -n 20 "$TMP/redis.log" >&2 || true
  die "could not start redis-server"
}

# ---- measurements --------------------------------------------------------------
run_memcpy() {
  log "memcpy baseline: blocks 64KiB,1MiB,4MiB, $REPS x ${MEMCPY_DURATION} each"
  "$MEMCPY_BENCH" --block-size 64KiB,1MiB,4MiB --working-set 1GiB --duration "$MEMCPY_DURATION" \
    --repeat "$REPS" --json | "$PY" -c '
import json, sys
for l in sys.stdin:
    r = json.loads(l); r["system"] = "memcpy"; print(json.dumps(r))' >> "$RESULTS"
}

run_redis() {
  local size keys cfg op rep n rps tags out misses
  for size in "${SIZES[@]}"; do
    keys=$((WORKING_SET / size))
    log "redis: filling $keys keys of $size bytes"
    redis-cli -p "$REDIS_PORT" flushall >/dev/null
    "$PY" "$HERE/compare_lib.py" redis-fill "$size" "$keys" | redis-cli -p "$REDIS_PORT" --pipe > "$TMP/redis-fill.log"
    [[ "$(redis-cli -p "$REDIS_PORT" dbsize)" == "$keys" ]] || die "redis fill: expected $keys keys, have $(redis-cli -p "$REDIS_PORT" dbsize)"
    redis-cli -p "$REDIS_PORT" config resetstat >/dev/null
    for op in set get; do
      for cfg in "${REDIS_CONFIGS[@]}"; do
        # First run sized for ~2 GB/s, later runs from the measured rate.
        n=$(( 2000000000 * REDIS_SECONDS / size )); (( n >= 200 )) || n=200
        for rep in $(seq 0 $((REPS - 1))); do
          # shellcheck disable=SC2086  # cfg is a list of flags
          out="$(redis-benchmark -p "$REDIS_PORT" -t "$op" -d "$size" -r "$keys" -n "$n" $cfg --csv)" \
            || die "redis-benchmark $op $cfg failed"
          tags="{\"system\":\"redis\",\"value_size\":$size,\"config\":\"${cfg}\",\"rep\":$rep}"
          printf '%s\n' "$out" | "$PY" "$HERE/compare_lib.py" redis-csv "$tags" | tee -a "$RESULTS" > "$TMP/last.json"
          rps="$("$PY" "$HERE/compare_lib.py" json-get ops_per_s < "$TMP/last.json")"
          log "redis $op $size $cfg rep $rep: $(printf '%.0f' "$rps") req/s"
          n="$("$PY" "$HERE/compare_lib.py" redis-next-n "$rps" "$REDIS_SECONDS" 200)"
        done
      done
    done
    # Every GET must have hit the filled key space, or GET rates mean nothing.
    misses="$(redis-cli -p "$REDIS_PORT" info stats | tr -d '\r' | awk -F: '/^keyspace_misses:/ {print $2}')"
    [[ "$misses" == 0 ]] || die "redis: $misses GETs of $size-byte values missed (key names differ from redis-benchmark's?)"
  done
  redis-cli -p "$REDIS_PORT" flushall >/dev/null
}

KVPOOL_RC=0
kvpool_bench() {  # kvpool_bench ARGS... [--phase NAME]: one kvpool-bench run, results appended
  local rc=0 phase="" args=()
  while [[ $# -gt 0 ]]; do
    if [[ "$1" == --phase ]]; then phase="$2"; shift 2; else args+=("$1"); shift; fi
  done
  "$KVPOOL_BENCH" --socket "$SOCK" --json "${args[@]}" > "$TMP/kvpool-bench.out" 2> "$TMP/kvpool-bench.err" || rc=$?
  cat "$TMP/kvpool-bench.err" >&2
  if [[ $rc -ne 0 && $rc -ne 3 ]]; then
    die "kvpool-bench $* failed (exit $rc)"
  fi
  [[ $rc -eq 3 ]] && { log "kvpool-bench reported errors (see above)"; KVPOOL_RC=1; }
  PHASE="$phase" "$PY" -c '
import json, os, sys
for l in sys.stdin:
    r = json.loads(l); r["system"] = "kvpool"; r["config"] = "batch %d" % r["batch"]
    if os.environ["PHASE"]:
        r["phase"] = os.environ["PHASE"]
    print(json.dumps(r))' < "$TMP/kvpool-bench.out" >> "$RESULTS"
  "$PY" -c '
import json, sys
for l in sys.stdin:
    r = json.loads(l)
    print("  %-6s %8d B: %6.2f GB/s %10.0f items/s  p50 %8.1fus p99 %8.1fus  errors %d misses %d" % (
        r["op"], r["value_size"], r["gbps"], r["ops_per_s"], r["p50_us"], r["p99_us"], r["errors"], r["misses"]))' \
    < "$TMP/kvpool-bench.out" >&2
}

# Writes the fresh node's whole DRAM capacity once, untimed for the table:
# on a virtual machine the host backs guest memory lazily (and takes back
# zero pages left idle), so the first write of each page runs at a fraction
# of memcpy's rate however the node pre-faulted it. Without this the first
# put run measures the host, not kvpool (puts of 0.5 GB/s, then 7). The
# fill's own rate is kept as the first-fill figure.
fill_node() {  # fill_node VALUE_SIZE
  local size="$1" keys t0 t1
  keys=$(( $("$PY" "$HERE/compare_lib.py" size-bytes "$NODE_DRAM") / size ))
  t0=$(date +%s.%N)
  "$KVPOOL_BENCH" --socket "$SOCK" --op exists --populate --namespace "compare-$$-fill-$size" \
    --keys "$keys" --value-size "$size" --batch 16 --duration 50ms --warmup 0ms > /dev/null \
    2> "$TMP/fill.err" || { cat "$TMP/fill.err" >&2; die "filling the node with $size-byte values failed"; }
  t1=$(date +%s.%N)
  printf '{"system":"kvpool","phase":"first-fill","op":"put","value_size":%d,"batch":16,"gbps":%s}\n' \
    "$size" "$("$PY" -c "print($keys * $size / ($t1 - $t0) / 1e9)")" >> "$RESULTS"
  log "filled $NODE_DRAM with $keys values of $size bytes in $("$PY" -c "print('%.1f' % ($t1 - $t0))") s (first writes of the node's memory)"
}

# The loop's responsiveness, on a fresh node: 4 KiB gets (batch 1) from one
# client alone, then while another client puts 4 MiB values as fast as it
# can (REPS pairs, alternating); then one put stream alone with the node's
# CPU time per thread sampled around it (/proc/PID/task), for CPU seconds
# per GiB put by thread.
run_responsiveness() {
  local rep put_pid rc
  start_node
  fill_node 4194304
  log "kvpool: 4 KiB get latency alone and under a 4 MiB put stream, $REPS x ${DURATION} each"
  kvpool_bench --op exists --value-size 4KiB --keys 4096 --batch 64 --threads 1 --duration 50ms \
    --warmup 0ms --populate --namespace "compare-$$-resp" --phase populate
  for rep in $(seq 0 $((REPS - 1))); do
    kvpool_bench --op get --value-size 4KiB --keys 4096 --batch 1 --threads 1 --duration "$DURATION" \
      --namespace "compare-$$-resp" --seed $((rep + 1)) --phase get-alone
    # The put stream starts first and outlasts the gets by a second each side.
    "$KVPOOL_BENCH" --socket "$SOCK" --json --op put --value-size 4MiB --batch 4 --threads 1 \
      --duration "$(( $("$PY" "$HERE/compare_lib.py" duration-ms "$DURATION") + 2000 ))ms" \
      --warmup 0ms --namespace "compare-$$-stream-$rep" > "$TMP/put-stream.out" 2>&1 &
    put_pid=$!
    sleep 1
    kvpool_bench --op get --value-size 4KiB --keys 4096 --batch 1 --threads 1 --duration "$DURATION" \
      --namespace "compare-$$-resp" --seed $((rep + 1)) --phase get-under-put
    rc=0; wait "$put_pid" || rc=$?
    [[ $rc -eq 0 || $rc -eq 3 ]] || { cat "$TMP/put-stream.out" >&2; die "the put stream failed (exit $rc)"; }
  done
  "$PY" "$HERE/compare_lib.py" thread-cpu "$NODE_PID" > "$TMP/cpu-before.json"
  kvpool_bench --op put --value-size 4MiB --batch 4 --threads 1 --duration "$DURATION" \
    --namespace "compare-$$-cpu" --phase put-cpu
  "$PY" "$HERE/compare_lib.py" thread-cpu "$NODE_PID" > "$TMP/cpu-after.json"
  "$PY" "$HERE/compare_lib.py" cpu-per-gib "$TMP/cpu-before.json" "$TMP/cpu-after.json" \
    "$TMP/kvpool-bench.out" >> "$RESULTS"
  stop_node
}

# Each value size runs on a fresh node: a node filled by the previous size's
# put flood would evict part of the next working set while it is populated
# (its slab rebalancing keeps recently written classes), and gets would then
# measure misses.
run_kvpool() {
  local size ops
  for size in "${SIZES[@]}"; do
    start_node
    fill_node "$size"
    log "kvpool: get, zc-get, put of ${size}-byte values, batch $BATCH, $REPS x ${DURATION} each"
    # Reads first, get and zc-get alternating so drift hits both alike; then
    # the puts, which write fresh keys and evict the working set.
    ops=""
    for _ in $(seq "$REPS"); do ops+="get,zc-get,"; done
    for _ in $(seq "$REPS"); do ops+="put,"; done
    kvpool_bench --op "${ops%,}" --value-size "$size" --batch "$BATCH" --threads 1 \
      --duration "$DURATION" --populate --namespace "compare-$$-$size"
    stop_node
  done
  run_responsiveness
  start_node
  log "kvpool: exists, batch $EXISTS_BATCH over $EXISTS_KEYS keys of $EXISTS_VALUE bytes"
  kvpool_bench --op exists --value-size "$EXISTS_VALUE" --keys "$EXISTS_KEYS" --batch "$EXISTS_BATCH" \
    --threads 1 --duration "$DURATION" --repeat "$REPS" --populate --namespace "compare-$$-exists"
  local status ibpe
  status="$(curl -fsS -m 5 "$ADMIN_URL/api/v1/status")" || die "GET $ADMIN_URL/api/v1/status failed"
  printf '%s\n' "$status" > "$TMP/node-status.json"
  ibpe="$(printf '%s' "$status" | "$PY" "$HERE/compare_lib.py" json-get dram.index_bytes_per_entry)" \
    || die "node status has no dram.index_bytes_per_entry: $status"
  printf '{"system":"node","index_bytes_per_entry":%s}\n' "$ibpe" >> "$RESULTS"
  stop_node
}

started=$SECONDS
want redis && start_redis
want memcpy && run_memcpy
want redis && run_redis
if want redis; then stop_pid "$REDIS_PID" redis-server; REDIS_PID=""; fi
want kvpool && run_kvpool

log "done in $((SECONDS - started)) s"
SUMMARY_RC=0
"$PY" "$HERE/compare_lib.py" summarize "$RESULTS" || SUMMARY_RC=$?
if [[ $KVPOOL_RC -ne 0 || $SUMMARY_RC -ne 0 ]]; then
  log "kvpool reported errors (failed items or wrong bytes); failing"
  exit 1
fi
