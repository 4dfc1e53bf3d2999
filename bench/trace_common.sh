# shellcheck shell=bash
# Helpers of the trace benches (bench/compare_trace.sh, bench/compare_shapes.sh):
# sourced after common.sh, with NODE, BENCH and VALUE_SIZE set.
# TRACE is the trace replay() replays; set_trace sets it and `distinct`.
REPLAY_ARGS=()

value_bytes="$("$PY" -c '
import re, sys
m = re.fullmatch(r"(\d+)\s*([KMG]i?B?)?", sys.argv[1].strip(), re.I)
unit = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[(m.group(2) or "")[:1].lower()]
print(int(m.group(1)) * unit)' "$VALUE_SIZE")"

trace_tmp() {  # trace_tmp NAME: TMP (removed at exit unless --keep), RESULTS, PIDS
  TMP="$(mktemp -d "/tmp/kvpool-$1.XXXXXX")"
  PIDS=()
  trap trace_cleanup EXIT
  RESULTS="$TMP/results.jsonl"
  : > "$RESULTS"
}
trace_cleanup() {
  local rc=$? p
  for p in "${PIDS[@]}"; do stop_pid "$p" kvpool-node KILL; done
  keep_or_remove_tmp "$rc"
}

set_trace() {  # set_trace FILE: TRACE and its count of distinct blocks
  TRACE="$1"
  distinct="$("$PY" -c '
import json, sys
s = set()
for line in open(sys.argv[1]):
    if line.strip():
        s.update(json.loads(line)["hash_ids"])
print(len(s))' "$TRACE")"
}

# fit_value_size BYTES: VALUE_SIZE and value_bytes for the trace: BYTES, or
# the smallest power of two times it that gives the smallest of FRACTIONS
# the node's minimum of 16 MiB (only entry counts decide hit ratios).
fit_value_size() {
  VALUE_SIZE="$("$PY" -c '
import sys
d, pct, v = int(sys.argv[1]), min(map(float, sys.argv[2].split())), int(sys.argv[3])
while d * pct / 100 * v < 16 << 20:
    v *= 2
print(v)' "$distinct" "${FRACTIONS[*]}" "$1")"
  value_bytes="$VALUE_SIZE"
}

# capacity_mib PERCENT [PARTS]: a node's DRAM for PERCENT of the distinct
# blocks, split over PARTS nodes, in whole 1 MiB slabs.
capacity_mib() {
  "$PY" -c '
import math, sys
d, pct, vb, parts = map(int, sys.argv[1:])
print(max(1, math.ceil(d * pct / 100 / parts * vb / (1 << 20))))' "$distinct" "$1" "$value_bytes" "${2:-1}"
}

freeport() { "$PY" "$HERE/compare_lib.py" freeport; }

# start NAME MIB EXTRA...: a node on $TMP/NAME.sock.
start() {
  local name="$1" mib="$2" rc=0
  shift 2
  "$NODE" --socket "$TMP/$name.sock" --dram-capacity "${mib}MiB" --slab-size 1MiB \
    --admin-port "${ADMIN_PORT:-0}" "$@" > "$TMP/$name.log" 2>&1 &
  PIDS+=($!)
  wait_node_ready "$!" "$TMP/$name.log" "$TMP/$name.sock" || rc=$?
  [[ $rc -eq 0 ]] || die "kvpool-node $name did not start (see $TMP/$name.log)"
}
stop_all() {
  local p
  for p in "${PIDS[@]}"; do stop_pid "$p" kvpool-node KILL; done
  PIDS=()
}

# replay LABEL SOCKETS: one replay (with REPLAY_ARGS, when set); appends its
# JSON (with the label) to RESULTS.
replay() {
  local label="$1" sockets="$2" out rc=0
  out="$("$BENCH" --trace "$TRACE" --sockets "$sockets" --value-size "$VALUE_SIZE" --json \
    "${REPLAY_ARGS[@]}")" || rc=$?
  [[ $rc -eq 0 || $rc -eq 3 ]] || die "replay $label failed (exit $rc)"
  # The first line only, without `head`: head exits after one line, and
  # printf, still writing the metric lines after it, would die of SIGPIPE
  # (a failed pipeline under pipefail, though the result was kept).
  printf '%s\n' "${out%%$'\n'*}" | "$PY" -c '
import json, sys
line = sys.stdin.readline()
try:
    j = json.loads(line)
except ValueError:
    sys.exit("kvpool-bench printed no JSON result: %r" % line[:200])
j["label"] = sys.argv[1]
print(json.dumps(j))' "$label" >> "$RESULTS" || die "replay $label: no result (kvpool-bench exit $rc)"
}

# policy_sweep PREFIX SUFFIX: at each of FRACTIONS, a replay on a fresh node
# per policy of POLICY_LIST, labelled PREFIX<policy>/<percent>SUFFIX.
policy_sweep() {
  local pct mib policy
  for pct in "${FRACTIONS[@]}"; do
    mib="$(capacity_mib "$pct")"
    for policy in "${POLICY_LIST[@]}"; do
      start one "$mib" --eviction "$policy"
      replay "$1$policy/$pct$2" "$TMP/one.sock"
      stop_all
    done
    log "$1$pct %: done ($mib MiB)"
  done
}
