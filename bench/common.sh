# Shared set-up of the bench/compare*.sh scripts; sourced, not run.
# Expects REPO and LOG_TAG; sets BUILD_DIR, PY, missing=() (with python3 and
# curl checked), and defines log, die, find_bin, check_missing and stop_pid.

BUILD_DIR="${BUILD_DIR:-build}"
[[ "$BUILD_DIR" = /* ]] || BUILD_DIR="$REPO/$BUILD_DIR"

log() { printf '[%s %s] %s\n' "$LOG_TAG" "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

find_bin() {  # find_bin NAME: first executable NAME under the build directory
  local p
  p="$(find "$BUILD_DIR" -type f -name "$1" -perm -u+x 2>/dev/null | sort | head -n 1)"
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
