# Shared set-up of the bench/compare*.sh scripts; sourced, not run.
# Expects REPO and LOG_TAG; sets BUILD_DIR, PY, missing=() (with python3 and
# curl checked), and defines log, die, find_bin and check_missing.

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
