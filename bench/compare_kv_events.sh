#!/usr/bin/env bash
# bench/compare.sh events: what publishing KV events costs a node, whether
# a subscriber that stopped reading slows it, and what block descriptors
# cost. Alternating runs of a fresh 64 MiB node in four modes: without
# events ("off"), with --kv-events-endpoint and a subscriber that connects
# and never reads ("stalled"), with one that reads every message and
# discards it ("reading"; python3-zmq, no decoding), and "described": the
# reading subscriber, and every put describes its key as an engine block
# of 16 tokens (kvpool-bench --describe 16: hash, parent, 16 token ids, as
# a connector attaches), so every event names the block the engine's way. Each run: kvpool-bench put of
# 4 KiB values over 100,000 keys (every put past the first 16,000 evicts:
# two events a put), then get of a populated 8,000-key working set; batch
# 16. The high-water mark is made small (--kv-events-hwm 64) so the node
# reaches the point where it drops batches for the stalled subscriber
# within the run.
# Prints per run the ops/s and the node's dropped count, then the medians
# of the per-repetition ratios:
#   kv_events_put_vs_off    put ops/s with events and a stalled subscriber,
#                           over put ops/s without events
#   kv_events_get_vs_off    the same for get
#   kv_events_put_stalled_vs_reading
#                           put ops/s with the stalled subscriber over put
#                           ops/s with the reading one: what a subscriber
#                           that stops reading costs the node
#   kv_events_get_stalled_vs_reading  the same for get
#   kv_events_put_reading_vs_off      what publishing costs when read
#   kv_events_dropped       blocks in the batches that found the subscriber
#                           full (kvpool_kv_events_subscriber_dropped_total,
#                           median): a lower bound of what it missed
#   kv_events_stalls        times the node found it full
#                           (kvpool_kv_events_subscriber_stalls_total, median)
#   kv_events_put_described_vs_reading
#                           put ops/s with descriptors over put ops/s
#                           without them, both with events read: what
#                           descriptors cost (goal >= 0.95)
#   kv_events_put_described_node_cpu_vs_reading
#                           the node's CPU time per put (all its threads,
#                           over the whole put run, its warm-up included)
#                           with descriptors over without them: the cost in
#                           work, steadier than throughput on a machine
#                           whose cores the bench, the node's threads and
#                           the subscriber share
#   node_cpu_us_per_put_reading, node_cpu_us_per_put_described
#                           those CPU times (µs, median)
#   descriptor_bytes_per_entry
#                           kvpool_descriptor_bytes / kvpool_descriptors at
#                           the end of a described run (median): what a
#                           described entry costs the node in memory
# --put-value-size SIZE (default 4KiB) sets the put runs' value size: KV
# pages of real engines are 64 KiB to a few MiB, where a descriptor's cost
# is a smaller share of a put than at 4 KiB.
# Usage: bench/compare.sh events [--reps N] [--duration DURATION] [--put-value-size SIZE] [--keep]
set -euo pipefail

LOG_TAG=events
# shellcheck source=bench/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

REPS=5
DURATION=3s
PUT_VALUE_SIZE=4KiB
KEEP=0
parse_flags "--reps --duration --put-value-size --keep" "$@"

NODE="$(find_bin kvpool-node || true)"
BENCH="$(find_bin kvpool-bench || true)"
[[ -n "$NODE" ]] || missing+=("kvpool-node under $BUILD_DIR")
[[ -n "$BENCH" ]] || missing+=("kvpool-bench under $BUILD_DIR")
"$PY" -c 'import zmq' 2>/dev/null || missing+=("python3-zmq (scripts/install-deps.sh)")
check_missing

TMP="$(mktemp -d /tmp/kvpool-events.XXXXXX)"
PIDS=()
cleanup() {
  local rc=$? p
  for p in "${PIDS[@]}"; do stop_pid "$p" process KILL; done
  keep_or_remove_tmp "$rc"
}
trap cleanup EXIT
RESULTS="$TMP/results.jsonl"
: > "$RESULTS"

freeport() { "$PY" "$HERE/compare_lib.py" freeport; }

# The CPU time a process has used, all its threads, in clock ticks.
node_cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# run MODE REP: one node (events off, stalled or reading), its bench runs,
# appended to RESULTS.
run() {
  local mode="$1" rep="$2" port extra=() rc=0 dropped=0 stalls=0 dbytes=0 dentries=0 describe=0
  rm -f "$TMP/n.sock"
  if [[ "$mode" != off ]]; then
    port="$(freeport)"
    extra=(--kv-events-endpoint "tcp://127.0.0.1:$port" --kv-events-hwm 64)
  fi
  "$NODE" --socket "$TMP/n.sock" --dram-capacity 64MiB --slab-size 1MiB --admin-port 0 \
    "${extra[@]}" > "$TMP/node-$mode-$rep.log" 2>&1 &
  PIDS+=($!)
  local node_pid=$!
  wait_node_ready "$node_pid" "$TMP/node-$mode-$rep.log" "$TMP/n.sock" || rc=$?
  [[ $rc -eq 0 ]] || die "kvpool-node did not start (see $TMP/node-$mode-$rep.log)"
  local sub_pid=""
  [[ "$mode" == described ]] && describe=16
  if [[ "$mode" == reading || "$mode" == described ]]; then
    # Connects, subscribes to everything, and reads every message.
    "$PY" -c '
import sys, zmq
s = zmq.Context().socket(zmq.SUB)
s.setsockopt(zmq.SUBSCRIBE, b"")
s.connect(sys.argv[1])
while True:
    s.recv_multipart(copy=False)' "tcp://127.0.0.1:$port" &
    sub_pid=$!
    PIDS+=("$sub_pid")
    sleep 0.5
  elif [[ "$mode" == stalled ]]; then
    # Connects, subscribes to everything, and never reads.
    "$PY" -c '
import sys, time, zmq
s = zmq.Context().socket(zmq.SUB)
s.setsockopt(zmq.RCVHWM, 1)
s.setsockopt(zmq.SUBSCRIBE, b"")
s.connect(sys.argv[1])
time.sleep(3600)' "tcp://127.0.0.1:$port" &
    sub_pid=$!
    PIDS+=("$sub_pid")
    sleep 0.5
  fi
  local cpu0 cpu1
  cpu0="$(node_cpu_ticks "$node_pid")"
  "$BENCH" --socket "$TMP/n.sock" --op put --value-size "$PUT_VALUE_SIZE" --batch 16 --keys 100000 \
    --describe "$describe" --duration "$DURATION" --json > "$TMP/put.json"
  cpu1="$(node_cpu_ticks "$node_pid")"
  "$BENCH" --socket "$TMP/n.sock" --op get --value-size 4KiB --batch 16 --keys 8000 \
    --populate --duration "$DURATION" --json > "$TMP/get.json"
  if [[ "$mode" != off ]]; then
    curl -fsS "$READY_URL/metrics" > "$TMP/metrics"
    dropped="$(awk '$1 == "kvpool_kv_events_subscriber_dropped_total" {print $2}' "$TMP/metrics")"
    stalls="$(awk '$1 == "kvpool_kv_events_subscriber_stalls_total" {print $2}' "$TMP/metrics")"
    dbytes="$(awk '$1 == "kvpool_descriptor_bytes" {print $2}' "$TMP/metrics")"
    dentries="$(awk '$1 == "kvpool_descriptors" {print $2}' "$TMP/metrics")"
  fi
  "$PY" -c '
import json, sys
mode, rep = sys.argv[1], int(sys.argv[2])
dropped, stalls = float(sys.argv[3] or 0), float(sys.argv[4] or 0)
dbytes, dentries = float(sys.argv[7] or 0), float(sys.argv[8] or 0)
cpu_s = (int(sys.argv[10]) - int(sys.argv[9])) / int(sys.argv[11])
put = json.loads(open(sys.argv[5]).readline())
get = json.loads(open(sys.argv[6]).readline())
print(json.dumps({"mode": mode, "rep": rep, "put": put["ops_per_s"], "get": get["ops_per_s"],
                  "get_misses": get["misses"], "put_errors": put["errors"], "dropped": dropped,
                  "stalls": stalls,
                  "descriptor_bytes_per_entry": dbytes / dentries if dentries else 0,
                  "node_cpu_us_per_put": cpu_s * 1e6 / put["ops"] if put["ops"] else 0}))' \
    "$mode" "$rep" "$dropped" "$stalls" "$TMP/put.json" "$TMP/get.json" "$dbytes" "$dentries" \
    "$cpu0" "$cpu1" "$(getconf CLK_TCK)" |
    tee -a "$RESULTS" >&2
  stop_pid "$sub_pid" subscriber KILL
  stop_pid "$node_pid" kvpool-node KILL
  PIDS=()
}

MODES=(off stalled reading described)
for rep in $(seq 1 "$REPS"); do
  # Which goes first rotates, so drift falls on all alike.
  for k in 0 1 2 3; do run "${MODES[$(((rep + k) % 4))]}" "$rep"; done
done

"$PY" - "$RESULTS" <<'PYEOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = {(r["mode"], r["rep"]): r for r in rows}
reps = sorted({r["rep"] for r in rows})
def ratio(op, a, b, name):
    ratios = [by[(a, k)][op] / by[(b, k)][op] for k in reps]
    print("%s: %s / %s per repetition %s" % (op, a, b, " ".join("%.3f" % x for x in ratios)))
    print("metric %s %.3f" % (name, statistics.median(ratios)))
for op in ("put", "get"):
    ratio(op, "stalled", "off", "kv_events_%s_vs_off" % op)
    ratio(op, "stalled", "reading", "kv_events_%s_stalled_vs_reading" % op)
ratio("put", "reading", "off", "kv_events_put_reading_vs_off")
ratio("put", "described", "reading", "kv_events_put_described_vs_reading")
ratio("node_cpu_us_per_put", "described", "reading", "kv_events_put_described_node_cpu_vs_reading")
for m in ("reading", "described"):
    print("metric node_cpu_us_per_put_%s %.2f" % (m, statistics.median(
        by[(m, k)]["node_cpu_us_per_put"] for k in reps)))
for m in ("dropped", "stalls"):
    print("metric kv_events_%s %d" % (m, statistics.median(by[("stalled", k)][m] for k in reps)))
print("metric descriptor_bytes_per_entry %.1f" % statistics.median(
    by[("described", k)]["descriptor_bytes_per_entry"] for k in reps))
if any(by[("described", k)]["put_errors"] for k in reps):
    print("described puts failed: see the runs above")
    sys.exit(1)
PYEOF
