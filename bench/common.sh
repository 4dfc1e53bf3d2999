# Shared set-up of the bench/compare*.sh scripts; sourced, not run, right
# after `set -euo pipefail`. Expects LOG_TAG (read when logging); sets REPO,
# HERE (bench/), BUILD_DIR, PY, missing=() (with python3 and curl checked),
# and defines usage, parse_flags, log, die, find_bin, check_missing,
# stop_pid, wait_node_ready and keep_or_remove_tmp.

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
HERE="$REPO/bench"

usage() {  # prints the running script's header comment (up to set -euo), exits 2
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
}

# parse_flags "FLAG..." "$@": reads the command line, taking only the FLAGs
# named in the first argument (anything else prints the usage). --keep sets
# KEEP=1; "--" ends the flags, what follows going to EXTRA; every other flag
# takes a value, stored in the variable of its name in upper case
# (--reps 5: REPS=5, --gib 2: GIB=2).
parse_flags() {
  local known=" $1 "
  shift
  while [[ $# -gt 0 ]]; do
    [[ "$known" == *" $1 "* ]] || usage
    case "$1" in
      --keep) KEEP=1; shift ;;
      --) shift; EXTRA=("$@"); break ;;
      *)
        [[ $# -ge 2 ]] || usage
        local name="${1#--}"
        name="${name//-/_}"  # --put-value-size sets PUT_VALUE_SIZE
        printf -v "${name^^}" '%s' "$2"
        shift 2
        ;;
    esac
  done
}

BUILD_DIR="${BUILD_DIR:-build}"
[[ "$BUILD_DIR" = /* ]] || BUILD_DIR="$REPO/$BUILD_DIR"

log() { printf '[%s %s] %s\n' "$LOG_TAG" "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

find_bin() {  # find_bin NAME: first executable NAME under the build directory
  local p
  # Not the copies cpack stages under packages/ (linked for the installed layout).
  p="$(find "$BUILD_DIR" -path "$BUILD_DIR/packages" -prune -o -type f -name "$1" -perm -u+x \
    -print 2>/dev/null | sort | head -n 1)"
  [[ -n "$p" ]] && printf '%s\n' "$p"
}

missing=()
PY=/usr/bin/python3
[[ -x "$PY" ]] || PY="$(command -v python3 || true)"
[[ -n "$PY" ]] || missing+=("python3 (apt-get install python3)")
command -v curl >/dev/null || missing+=("curl (apt-get install curl)")

check_missing() {  # exits 2 naming every missing prerequisite
  if [[ ${#missing[@]} -gt 0 ]]; then
    log "missing prerequisites:"
    for m in "${missing[@]}"; do log "  - $m"; done
    exit 2
  fi
}

# stop_pid PID NAME [SIGNAL]: SIGNAL (default TERM), wait up to STOP_WAIT_S
# (default 10) seconds, then KILL; reaps it. An empty or finished PID is fine.
# SIGNAL KILL kills and reaps at once (quietly).
stop_pid() {
  local pid="$1" sig="${3:-TERM}" wait_s="${STOP_WAIT_S:-10}" _
  [[ -n "$pid" ]] || return 0
  kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null || true; return 0; }
  if [[ "$sig" == KILL ]]; then
    # Reap at once: bash would otherwise report the killed job on stderr.
    { kill -KILL "$pid"; wait "$pid"; } 2>/dev/null || true
    return 0
  fi
  kill "-$sig" "$pid" 2>/dev/null || true
  for _ in $(seq $((wait_s * 10))); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then
    log "$2 (pid $pid) did not exit $wait_s s after SIG$sig; killing it"
    kill -KILL "$pid" 2>/dev/null || true
  fi
  wait "$pid" 2>/dev/null || true
}

# keep_or_remove_tmp RC: from a script's EXIT trap; keeps $TMP (logs, raw
# results) with --keep or after a failure (RC non-zero), else removes it.
keep_or_remove_tmp() {
  if [[ $KEEP -eq 1 || $1 -ne 0 ]]; then
    log "logs and raw results kept in $TMP"
  else
    rm -rf "$TMP"
  fi
}

# wait_node_ready PID LOG SOCK: waits until the kvpool-node PID (started with
# --admin-port 0, logging to LOG) has its socket SOCK and answers /readyz on
# the admin URL it logged; sets READY_URL. Up to 120 s: the node pre-faults
# its segment at start, seconds per GiB on some VMs. Returns 1 (after showing
# LOG's tail) if the node exited, 2 if it is not ready in time.
wait_node_ready() {
  local pid="$1" logf="$2" sock="$3" _
  READY_URL=""
  for _ in $(seq 1200); do
    kill -0 "$pid" 2>/dev/null || { tail -n 20 "$logf" >&2; return 1; }
    READY_URL="$(grep -o 'admin http://[0-9.]*:[0-9]*' "$logf" | head -n 1 | awk '{print $2}' || true)"
    if [[ -S "$sock" && -n "$READY_URL" ]] && curl -fsS -m 2 "$READY_URL/readyz" >/dev/null 2>&1; then
      return 0
    fi
    sleep 0.1
  done
  return 2
}
