#!/usr/bin/env bash
# bench/compare.sh trace --shapes LIST: cache quality across traffic shapes.
# For the given trace and each generated shape (bench/workloads.py: chat,
# shared, rag, agentic, scan, loop), replays the trace against a fresh
# kvpool-node per run at DRAM capacities of 2, 5, 15 and 40 % of its
# distinct blocks, once per eviction policy (POLICIES, default
# "prefix lru s3fifo prefix-fixed tinylfu": prefix-fixed is the prefix
# policy at its fixed share of 70 %, as it was before it adapted, tinylfu
# W-TinyLFU; the first is the one judged), and compares every
# point with the node's own lru run (which equals the offline LRU exactly)
# and with the best of the policies.
#
# Prints a table per trace and `metric` lines:
#   shapes_hit_vs_lru_min    the judged policy's block hit ratio / LRU's, the
#                            smallest over every trace and capacity (and where)
#   shapes_hit_vs_lru_mean   the mean of those ratios
#   shapes_hit_vs_best_min   the judged policy / the best policy's, smallest
#   shapes_points_below_best points where the judged policy keeps less than
#                            the best policy's hit ratio, less 2 %
#   shapes_hit_{TRACE}_{POLICY}_{N}pct  each run's block hit ratio
#   shapes_hit_{TRACE}_belady_{N}pct    Belady's (offline, at the entries the
#                            judged policy's node reached; the table also
#                            shows the offline LRU there)
#   shapes_wrong_bytes       over every run (must be 0)
#
# Usage: bench/compare.sh trace --shapes LIST [--trace FILE] [--seed N]
#                                 [--scale X] [--keep]
#   --shapes  "all", or shape names separated by commas (bench/workloads.py
#             --list); "given" alone runs only the given trace
#   --trace   the given trace (default ../shared/traces/synthetic_trace.jsonl)
#   --seed    the generator's seed (default 1); --scale its request count
#             relative to its default (default 1)
# Environment: BUILD_DIR, POLICIES, FRACTIONS (default "2 5 15 40"),
#   VALUE_SIZE (default 16KiB: a trace's blocks are this size, or the
#   smallest power of two above it that gives its smallest capacity the
#   node's minimum of 16 MiB; only entry counts decide its hit ratios).
set -euo pipefail

LOG_TAG=shapes
# shellcheck source=bench/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

GIVEN="$REPO/../shared/traces/synthetic_trace.jsonl"
TRACE="$GIVEN"
SHAPES=all
SEED=1
SCALE=1
KEEP=0
parse_flags "--trace --shapes --seed --scale --keep" "$@"
GIVEN="$TRACE"
VALUE_SIZE="${VALUE_SIZE:-16KiB}"
read -r -a POLICY_LIST <<< "${POLICIES:-prefix lru s3fifo prefix-fixed tinylfu}"
read -r -a FRACTIONS <<< "${FRACTIONS:-2 5 15 40}"
[[ " ${POLICY_LIST[*]} " == *" lru "* ]] || die "POLICIES must include lru (the reference)"

NODE="$(find_bin kvpool-node || true)"
BENCH="$(find_bin kvpool-bench || true)"
[[ -n "$NODE" ]] || missing+=("kvpool-node under $BUILD_DIR")
[[ -n "$BENCH" ]] || missing+=("kvpool-bench under $BUILD_DIR")
[[ -r "$GIVEN" ]] || missing+=("the trace $GIVEN (--trace FILE)")
check_missing

if [[ "$SHAPES" == all ]]; then
  SHAPES="$("$PY" "$HERE/workloads.py" --list | paste -sd, -)"
fi
NAMES=(given)
[[ "$SHAPES" == given ]] || IFS=, read -r -a more <<< "$SHAPES"
NAMES+=("${more[@]}")

# shellcheck source=bench/trace_common.sh
source "$HERE/trace_common.sh"
trace_tmp shapes
BASE_VALUE_BYTES="$value_bytes"

started=$SECONDS
for name in "${NAMES[@]}"; do
  if [[ "$name" == given ]]; then
    file="$GIVEN"
  else
    file="$TMP/$name.jsonl"
    "$PY" "$HERE/workloads.py" "$name" --seed "$SEED" --scale "$SCALE" > "$file" \
      || die "bench/workloads.py $name failed"
  fi
  set_trace "$file"
  fit_value_size "$BASE_VALUE_BYTES"
  log "$name: $distinct distinct blocks of $((VALUE_SIZE >> 10)) KiB"
  policy_sweep "$name/" ""
done
log "done in $((SECONDS - started)) s"
"$PY" "$HERE/compare_lib.py" shapes-summarize "$RESULTS" "${POLICY_LIST[0]}"
