#!/usr/bin/env bash
# bench/compare.sh hints: what cache hints are worth on agentic traffic.
# The agentic shape of bench/workloads.py (sessions that pause for tool
# calls, some for minutes) at DRAM capacities of 5, 10 and 20 % of its
# distinct blocks, a fresh kvpool-node per run, replayed without hints and
# with them: kvpool-bench --hints acts as an orchestrator that retains a
# paused session's blocks until the session resumes (POST /api/v1/hints,
# docs/hints.md).
#
# Prints a table and `metric` lines, per capacity N:
#   hints_hit_off_{N}pct, hints_hit_on_{N}pct   block hit ratios
#   hints_gain_{N}pct                           on / off
#   hints_resume_hit_{off,on}_{N}pct            the hit ratio of resumed steps
#   hints_other_hit_{off,on}_{N}pct             the hit ratio of the other
#                                               requests (what the hints cost them)
#   hints_wrong_bytes                           over every run (must be 0)
#
# Usage: bench/compare.sh hints [--seed N] [--scale X] [--keep]
# Environment: BUILD_DIR, EVICTION (default prefix), FRACTIONS (default
#   "5 10 20"), VALUE_SIZE (as bench/compare.sh trace --shapes), NODE_ARGS
#   (more kvpool-node flags, e.g. "--retain-max-percent 80").
set -euo pipefail

LOG_TAG=hints
# shellcheck source=bench/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

SEED=1
SCALE=1
KEEP=0
parse_flags "--seed --scale --keep" "$@"
VALUE_SIZE="${VALUE_SIZE:-16KiB}"
EVICTION="${EVICTION:-prefix}"
read -r -a FRACTIONS <<< "${FRACTIONS:-5 10 20}"

NODE="$(find_bin kvpool-node || true)"
BENCH="$(find_bin kvpool-bench || true)"
[[ -n "$NODE" ]] || missing+=("kvpool-node under $BUILD_DIR")
[[ -n "$BENCH" ]] || missing+=("kvpool-bench under $BUILD_DIR")
check_missing

# shellcheck source=bench/trace_common.sh
source "$HERE/trace_common.sh"
trace_tmp hints

"$PY" "$HERE/workloads.py" agentic --seed "$SEED" --scale "$SCALE" > "$TMP/agentic.jsonl" \
  || die "bench/workloads.py agentic failed"
set_trace "$TMP/agentic.jsonl"
fit_value_size "$value_bytes"
log "agentic: $distinct distinct blocks of $((VALUE_SIZE >> 10)) KiB, --eviction $EVICTION"

for pct in "${FRACTIONS[@]}"; do
  mib="$(capacity_mib "$pct")"
  for mode in off on; do
    admin="$(freeport)"
    # shellcheck disable=SC2086
    ADMIN_PORT="$admin" start one "$mib" --eviction "$EVICTION" ${NODE_ARGS:-}
    REPLAY_ARGS=()
    [[ $mode == on ]] && REPLAY_ARGS=(--hints "127.0.0.1:$admin")
    replay "$mode/$pct" "$TMP/one.sock"
    stop_all
  done
  log "$pct %: done ($mib MiB)"
done

"$PY" - "$RESULTS" <<'PY'
import json, sys
runs = {}
for line in open(sys.argv[1]):
    j = json.loads(line)
    mode, pct = j["label"].split("/")
    runs[(mode, int(pct))] = j
pcts = sorted({p for _, p in runs})
print("| capacity | hits, no hints | with hints | gain | resumed steps: no hints | with | others: no hints | with | hints sent |")
print("|---|---|---|---|---|---|---|---|---|")
wrong = 0
for p in pcts:
    off, on = runs[("off", p)], runs[("on", p)]
    gain = on["block_hit_ratio"] / off["block_hit_ratio"] if off["block_hit_ratio"] else float("nan")
    print("| %d %% | %.4f | %.4f | %.3f | %.4f | %.4f | %.4f | %.4f | %d |" % (
        p, off["block_hit_ratio"], on["block_hit_ratio"], gain,
        off["resume_block_hit_ratio"], on["resume_block_hit_ratio"],
        off["other_block_hit_ratio"], on["other_block_hit_ratio"], on.get("hints_sent", 0)))
    for mode, j in (("off", off), ("on", on)):
        print("metric hints_hit_%s_%dpct %.4f" % (mode, p, j["block_hit_ratio"]))
        print("metric hints_resume_hit_%s_%dpct %.4f" % (mode, p, j["resume_block_hit_ratio"]))
        print("metric hints_other_hit_%s_%dpct %.4f" % (mode, p, j["other_block_hit_ratio"]))
        wrong += j["wrong_bytes"]
    print("metric hints_gain_%dpct %.3f" % (p, gain))
    if on.get("hints_refused", 0):
        print("(%d hints refused at %d %%)" % (on["hints_refused"], p))
print("metric hints_wrong_bytes %d" % wrong)
PY
