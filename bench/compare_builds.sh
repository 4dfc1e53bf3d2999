#!/usr/bin/env bash
# bench/compare.sh builds: two builds of kvpool side by side, for a change's
# "no metric worse than N %" line. Runs `bench/compare.sh MODE` with
# BUILD_DIR=A and BUILD_DIR=B in alternating rounds (A B, then B A, ...), so
# that a machine that speeds up or slows down during the run weighs on both
# builds alike, and prints for every metric A's and B's median over the rounds,
# B/A, the median of the per-round ratios, the rounds B did better in, and
# whether B is worse than A by more than --tolerance. Each build runs its own
# kvpool-node, kvpool-bench and libkvpool (LD_LIBRARY_PATH is set to the
# directory holding the build's libkvpool.so.0), since a bench of one build
# does not necessarily speak to a node of the other.
#
# Usage: bench/compare.sh builds --a DIR --b DIR [--mode MODE] [--rounds N]
#                                [--tolerance PCT] [--keep] [-- MODE_ARGS...]
#   --a, --b      the two build directories (A is the reference: "before")
#   --mode        local (default), remote, ssd, trace, events, security: the
#                 compare.sh mode each round runs
#   --rounds      rounds, each one run of each build (default 4)
#   --tolerance   percent by which B may be worse than A before the metric is
#                 flagged (default 5)
#   --keep        keep the temporary directory (every run's log and metrics)
#   MODE_ARGS     passed to every run (e.g. -- --only kvpool)
# A build of an older commit, for --a:
#   git worktree add /tmp/kvpool-base COMMIT
#   cmake -S /tmp/kvpool-base -B /tmp/kvpool-base/build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
#   ninja -C /tmp/kvpool-base/build kvpool-node kvpool-bench kvpool-memcpy-bench
# Exit status: 0 when every run succeeded and no metric is flagged, 1 when a
# metric is flagged, 3 when a run failed (its log is kept).
set -euo pipefail

LOG_TAG=builds
# shellcheck source=bench/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

A="" ; B=""
MODE=local
ROUNDS=4
TOLERANCE=5
KEEP=0
EXTRA=()
parse_flags "--a --b --mode --rounds --tolerance --keep --" "$@"
[[ -n "$A" && -n "$B" ]] || usage
[[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]] || die "--rounds wants a positive whole number, not '$ROUNDS'"
[[ "$TOLERANCE" =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "--tolerance wants a percentage, not '$TOLERANCE'"
case "$MODE" in
  local | remote | ssd | trace | events | security) ;;
  *) die "--mode $MODE: not a mode this script compares (local, remote, ssd, trace, events, security)" ;;
esac

libdir_of() {  # libdir_of BUILD: the directory of BUILD's libkvpool.so.0
  local p  # the build's own library, not the copy cpack stages under packages/
  p="$(find "$1" -path "$1/packages" -prune -o -name libkvpool.so.0 -print 2>/dev/null | sort | head -n 1)"
  [[ -n "$p" ]] && dirname "$p"
}
for d in "$A" "$B"; do
  [[ -d "$d" ]] || die "build directory $d does not exist"
  BUILD_DIR="$d" find_bin kvpool-node >/dev/null || die "no kvpool-node under $d"
  BUILD_DIR="$d" find_bin kvpool-bench >/dev/null || die "no kvpool-bench under $d"
done
LIB_A="$(libdir_of "$A")" || die "no libkvpool.so.0 under $A"
LIB_B="$(libdir_of "$B")" || die "no libkvpool.so.0 under $B"

TMP="$(mktemp -d -t kvpool-builds.XXXXXX)"
METRICS="$TMP/metrics.tsv"
: > "$METRICS"
cleanup() { keep_or_remove_tmp $?; }
trap cleanup EXIT
trap 'exit 130' INT TERM

FAILED=0
run_one() {  # run_one ROUND LABEL BUILD LIBDIR
  local round="$1" label="$2" build="$3" libdir="$4" out="$TMP/run-$1-$2" rc=0
  log "round $round/$ROUNDS: $label ($build): compare.sh $MODE ${EXTRA[*]}"
  LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" BUILD_DIR="$build" \
    "$HERE/compare.sh" "$MODE" ${EXTRA[@]+"${EXTRA[@]}"} > "$out.out" 2> "$out.log" || rc=$?
  awk -v r="$round" -v l="$label" '$1 == "metric" && NF == 3 {print r "\t" l "\t" $2 "\t" $3}' \
    "$out.out" >> "$METRICS"
  if [[ $rc -ne 0 ]]; then
    log "round $round: $label failed (exit $rc); its log: $out.log"
    FAILED=1
  fi
}

started=$SECONDS
for round in $(seq "$ROUNDS"); do
  if (( round % 2 )); then
    run_one "$round" A "$A" "$LIB_A"
    run_one "$round" B "$B" "$LIB_B"
  else
    run_one "$round" B "$B" "$LIB_B"
    run_one "$round" A "$A" "$LIB_A"
  fi
done
log "done in $((SECONDS - started)) s"

SUMMARY_RC=0
"$PY" "$HERE/compare_lib.py" builds-summarize "$METRICS" "$TOLERANCE" || SUMMARY_RC=$?
if [[ $FAILED -ne 0 ]]; then
  KEEP=1
  exit 3
fi
exit "$SUMMARY_RC"
