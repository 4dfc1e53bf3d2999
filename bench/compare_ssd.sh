#!/usr/bin/env bash
# bench/compare.sh ssd: kvpool's SSD tier side by side with fio on the same
# directory (run through bench/compare.sh ssd; see bench/README.md).
#
# In one run, on one directory on the real disk (default: a temporary
# directory under $KVPOOL_BENCH_DIR or /var/tmp; tmpfs is refused):
#   fio      O_DIRECT sequential write, then read, of a 2 GiB file, 1 MiB
#            blocks, ioengine=io_uring, at the queue depths kvpool issues
#            (write: flush threads x one region each = region/1MiB x threads;
#            read: one 1 MiB value per promotion thread = --io-threads).
#            Buffers on transparent huge pages, as kvpool's (see fio_thp).
#            Each write rep creates the file anew and writes it twice: first
#            onto fresh blocks ("first fill"), then over its own bytes
#            ("overwrite", the figure compared with kvpool's writes).
#   kvpool   a node with a small DRAM tier (128 MiB) over an SSD tier (5 GiB):
#            put 3 GiB of 1 MiB values (DRAM full after the first 128 MiB, so
#            every put demotes), SSD write GB/s from kvpool_ssd_write_bytes_total
#            sampled over time, twice on one data file: first onto the freshly
#            preallocated file ("first fill"); then the node is killed, the
#            superblock zeroed (the next start is cold and writes from region 0
#            again) and the same amount put again over the bytes the first fill
#            wrote ("overwrite"). Both fio and kvpool thus compare like with
#            like: on ext4 and most filesystems the first write into fresh or
#            fallocated blocks costs more (unwritten-extent conversion) than an
#            overwrite, and a cache's log overwrites its file in steady state.
#            After the overwrite phase: flush; crash (SIGKILL) and restart 3
#            times (region scan), clean stop (SIGTERM) and restart 3 times (checkpoint): time
#            until the node serves again per GiB on SSD; then cold reads with
#            kvpool-bench get (1 and 2 threads, batch 16) of keys that are only
#            on SSD (the restarted node's DRAM is empty), each run paired with
#            a fio read of kvpool's own data file just before it (the read ratio is the median of the
#            per-pair ratios: virtual disks change speed from minute to minute)
# Each measurement is repeated (default 3) and the median reported. Ends with
# `metric NAME VALUE` lines. About 2-3 minutes on a 1-2 GB/s disk.
#
# Usage: bench/compare.sh ssd [--reps N] [--duration DURATION] [--gib N] [--keep]
#   --gib     GiB of 1 MiB values kvpool puts (default 3; the SSD tier gets N+2)
#   --keep    keep the temporary directory (logs, raw results)
# Environment: BUILD_DIR (default build), KVPOOL_BENCH_DIR (default /var/tmp),
#   SSD_REGION (default 16MiB), IO_THREADS (default 4), FLUSH_THREADS (default 4),
#   NODE_DRAM (default 128MiB),
#   NODE_ARGS (more kvpool-node flags, e.g. "--ssd-buffers 8").
set -euo pipefail

LOG_TAG=compare-ssd
# shellcheck source=bench/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

REPS=3
DURATION=3s  # per kvpool-bench get run (3s, 500ms; a bare number is milliseconds)
GIB=3
KEEP=0
parse_flags "--reps --duration --gib --keep" "$@"

NODE_DRAM="${NODE_DRAM:-128MiB}"
SSD_REGION="${SSD_REGION:-16MiB}"
IO_THREADS="${IO_THREADS:-4}"
FLUSH_THREADS="${FLUSH_THREADS:-4}"   # the node's --ssd-flush-threads (passed below)
VALUE=1048576
BATCH=16
FIO_SIZE=2G
KEYS=$((GIB * 1024))
SSD_CAPACITY="$((GIB + 2))GiB"
# kvpool issues region writes of SSD_REGION from FLUSH_THREADS threads at
# once, each submitted whole (in 2 MiB pieces) through io_uring: that many
# bytes in flight is fio at 1 MiB blocks and this depth.
region_mib="$(printf '%s' "$SSD_REGION" | sed -n 's/^\([0-9]*\)MiB$/\1/p')"
[[ -n "$region_mib" ]] || { echo "SSD_REGION must be N MiB" >&2; exit 2; }
WRITE_QD=$((region_mib * FLUSH_THREADS))
# Each promotion thread reads one value (1 MiB, one request) at a time.
READ_QD=$IO_THREADS

command -v fio >/dev/null || missing+=("fio (apt-get install fio)")
KVPOOL_BENCH="$(find_bin kvpool-bench || true)"
NODE="$(find_bin kvpool-node || true)"
CTL="$(find_bin kvpoolctl || true)"
[[ -n "$KVPOOL_BENCH" ]] || missing+=("kvpool-bench under $BUILD_DIR (cmake -B build -G Ninja && ninja -C build)")
[[ -n "$NODE" ]] || missing+=("kvpool-node under $BUILD_DIR")
[[ -n "$CTL" ]] || missing+=("kvpoolctl under $BUILD_DIR")
check_missing

BASE="${KVPOOL_BENCH_DIR:-/var/tmp}"
[[ -d "$BASE" ]] || die "$BASE is not a directory"
fstype="$(stat -f -c %T "$BASE")"
[[ "$fstype" != tmpfs && "$fstype" != ramfs ]] || die "$BASE is on $fstype: point KVPOOL_BENCH_DIR at a directory on the SSD"
need_kib=$(( (GIB + 2) * 1024 * 1024 + 2 * 1024 * 1024 + 512 * 1024 ))
avail_kib="$(df -Pk "$BASE" | awk 'NR==2 {print $4}')"
[[ "$avail_kib" -ge "$need_kib" ]] || die "$BASE has $((avail_kib / 1024)) MiB free; this run wants $((need_kib / 1024)) MiB"

# ---- lifecycle ---------------------------------------------------------------
TMP="$(mktemp -d "$BASE/kvpool-ssd-bench.XXXXXX")"
RESULTS="$TMP/results.jsonl"
: > "$RESULTS"
NODE_PID="" ; SAMPLER_PID=""
STOP_WAIT_S=60  # a clean stop flushes and writes the checkpoint
cleanup() {
  local rc=$?
  [[ -n "$SAMPLER_PID" ]] && stop_pid "$SAMPLER_PID" sampler
  [[ -n "$NODE_PID" ]] && stop_pid "$NODE_PID" kvpool-node KILL
  if [[ $KEEP -eq 1 || $rc -ne 0 ]]; then
    rm -f "$TMP/fio.dat" "$TMP"/ssd/kvpool-ssd.data
    log "logs and raw results kept in $TMP (data files removed)"
  else
    rm -rf "$TMP"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

now() { date +%s.%N; }
elapsed() { "$PY" -c 'import sys; print("%.3f" % (float(sys.argv[2]) - float(sys.argv[1])))' "$1" "$2"; }

SOCK="$TMP/kvpool.sock"
ADMIN_PORT="$("$PY" "$HERE/compare_lib.py" freeport)"
ADMIN_URL="http://127.0.0.1:$ADMIN_PORT"
NODE_RUN=0
# start_node: starts the node and waits until it serves; sets READY_S (seconds
# from the exec to the first OK /readyz with the socket present).
start_node() {
  local t0 t1 _
  NODE_RUN=$((NODE_RUN + 1))
  NODE_LOG="$TMP/node-$NODE_RUN.log"
  t0="$(now)"
  # shellcheck disable=SC2086  # NODE_ARGS is a list of flags
  "$NODE" --socket "$SOCK" --dram-capacity "$NODE_DRAM" --admin-port "$ADMIN_PORT" \
    --ssd "$TMP/ssd" --ssd-capacity "$SSD_CAPACITY" --ssd-region-size "$SSD_REGION" \
    --io-threads "$IO_THREADS" --ssd-flush-threads "$FLUSH_THREADS" ${NODE_ARGS:-} > "$NODE_LOG" 2>&1 &
  NODE_PID=$!
  for _ in $(seq 12000); do
    kill -0 "$NODE_PID" 2>/dev/null || { tail -n 20 "$NODE_LOG" >&2; NODE_PID=""; die "kvpool-node exited during startup"; }
    if [[ -S "$SOCK" ]] && curl -fsS -m 2 "$ADMIN_URL/readyz" >/dev/null 2>&1; then
      t1="$(now)"
      READY_S="$(elapsed "$t0" "$t1")"
      return 0
    fi
    sleep 0.01
  done
  tail -n 20 "$NODE_LOG" >&2
  die "kvpool-node not ready after 120 s"
}
status_json() { curl -fsS -m 10 "$ADMIN_URL/api/v1/status"; }
jget() { "$PY" "$HERE/compare_lib.py" json-get "$1"; }
record() { printf '%s\n' "$1" >> "$RESULTS"; }

# ---- fio ------------------------------------------------------------------------
# fio's I/O buffers on transparent huge pages, like kvpool's region and read
# buffers (AllocIoBuffer): glibc then advises its large allocations onto
# THP (ignored where glibc or the kernel lacks it; then neither gets them
# unless THP is "always"). On a virtual disk this roughly doubles both fio's
# and kvpool's rates (fewer segments per request); comparing fio on 4 KiB
# pages with kvpool on 2 MiB pages would flatter kvpool.
fio_thp() { GLIBC_TUNABLES=glibc.malloc.hugetlb=1 fio "$@"; }
run_fio() {
  local rw qd rep out gbps pass op
  for rw in write read; do
    qd=$WRITE_QD; [[ $rw == read ]] && qd=$READ_QD
    for rep in $(seq 0 $((REPS - 1))); do
      # Writes: a new file each rep, written twice (fresh blocks, then over
      # its own bytes); reads: the file the last write left.
      [[ $rw == write ]] && rm -f "$TMP/fio.dat"
      for pass in fresh over; do
        [[ $rw == read && $pass == fresh ]] && continue
        op=$rw; [[ $pass == fresh ]] && op=write-fresh
        out="$TMP/fio-$op-$rep.json"
        # end_fsync: the write is done when it is on the device (kvpool's
        # region writes are O_DIRECT and complete on the device, too).
        fio_thp --name="seq$rw" --filename="$TMP/fio.dat" --rw="$rw" --bs=1M --size="$FIO_SIZE" \
          --direct=1 --ioengine=io_uring --iodepth="$qd" --end_fsync=1 --output-format=json \
          > "$out" 2> "$TMP/fio.err" || { cat "$TMP/fio.err" >&2; die "fio $rw failed"; }
        gbps="$("$PY" "$HERE/compare_lib.py" fio-gbps "$rw" < "$out")"
        log "fio $op 1MiB qd $qd rep $rep: $gbps GB/s"
        record "{\"system\":\"fio\",\"op\":\"$op\",\"qd\":$qd,\"rep\":$rep,\"gbps\":$gbps}"
      done
    done
  done
  # For reference (not a target): reads at the write depth show how much the
  # device gives when more reads are in flight than kvpool's promotion threads.
  fio_thp --name=seqread32 --filename="$TMP/fio.dat" --rw=read --bs=1M --size="$FIO_SIZE" --direct=1 \
    --ioengine=io_uring --iodepth=32 --output-format=json > "$TMP/fio-read-qd32.json" 2> "$TMP/fio.err" \
    || { cat "$TMP/fio.err" >&2; die "fio read qd 32 failed"; }
  gbps="$("$PY" "$HERE/compare_lib.py" fio-gbps read < "$TMP/fio-read-qd32.json")"
  log "fio read 1MiB qd 32 (reference): $gbps GB/s"
  record "{\"system\":\"fio\",\"op\":\"read-qd32\",\"qd\":32,\"rep\":0,\"gbps\":$gbps}"
  # fio.dat stays for the paired reads next to kvpool's cold gets.
}

# fio_paired_read THREADS REP: one fio read right before a kvpool cold-get
# run. Virtual disks change speed by 2x within minutes (host cache, burst
# credits): the read ratio is taken per pair, then the median. fio reads
# kvpool's own data file (read-only, its first $FIO_SIZE, which the
# overwrite phase just wrote), not fio.dat: a file written minutes earlier
# may have left the host's cache while kvpool's just-written one has not,
# which would flatter kvpool's reads.
fio_paired_read() {
  local gbps
  fio_thp --name=seqread --filename="$TMP/ssd/kvpool-ssd.data" --readonly --rw=read --bs=1M \
    --size="$FIO_SIZE" --direct=1 \
    --ioengine=io_uring --iodepth="$READ_QD" --output-format=json > "$TMP/fio-paired.json" 2> "$TMP/fio.err" \
    || { cat "$TMP/fio.err" >&2; die "fio paired read failed"; }
  gbps="$("$PY" "$HERE/compare_lib.py" fio-gbps read < "$TMP/fio-paired.json")"
  record "{\"system\":\"fio\",\"op\":\"read-paired\",\"qd\":$READ_QD,\"threads\":$1,\"rep\":$2,\"gbps\":$gbps}"
  printf '  fio read qd %d before it: %s GB/s\n' "$READ_QD" "$gbps" >&2
}

# ---- kvpool ---------------------------------------------------------------------
# put_phase NAMESPACE TAG: populates KEYS values of 1 MiB (untimed by
# kvpool-bench), sampling the node's counters every 50 ms for the write rate;
# flushes. The rates are recorded as write-rates prints them (TAG "over"), or
# with "-fresh" appended to their op and system (TAG "fresh"): the summary's
# ssd_write_vs_fio uses the overwrite phase, the first fill is reported apart.
put_phase() {
  local ns="$1" tag="$2" t0 t1 series samples="$TMP/samples-$2.jsonl"
  series="kvpool_ssd_write_bytes_total kvpool_bytes_written_total kvpool_tier_demotions_total kvpool_tier_demotions_dropped_total kvpool_ssd_write_latency_seconds_sum kvpool_ssd_write_latency_seconds_count"
  # shellcheck disable=SC2086  # series is a list
  "$PY" "$HERE/compare_lib.py" sample "$ADMIN_URL/metrics" 0.05 "$samples" $series &
  SAMPLER_PID=$!
  sleep 0.5
  log "kvpool ($tag): putting $KEYS values of 1 MiB (batch $BATCH, 1 thread): DRAM fills, then every put demotes"
  t0="$(now)"
  "$KVPOOL_BENCH" --socket "$SOCK" --op exists --populate --keys "$KEYS" --value-size "$VALUE" \
    --batch "$BATCH" --threads 1 --duration 100ms --warmup 1ms --buffer-size 256MiB \
    --namespace "$ns" --json > "$TMP/populate-$tag.out" 2> "$TMP/populate.err" \
    || { cat "$TMP/populate.err" >&2; die "kvpool-bench populate failed"; }
  t1="$(now)"
  "$CTL" --socket "$SOCK" flush || die "kvpoolctl flush failed"
  sleep 0.5
  stop_pid "$SAMPLER_PID" sampler
  SAMPLER_PID=""
  log "kvpool ($tag): populate + flush took $(elapsed "$t0" "$t1") s"
  "$PY" "$HERE/compare_lib.py" write-rates "$samples" "$REPS" "$FLUSH_THREADS" > "$TMP/rates-$tag.jsonl" \
    || die "could not derive write rates from $samples"
  if [[ $tag == fresh ]]; then
    sed -e 's/"op": "\([a-z-]*\)"/"op": "\1-fresh"/' -e 's/"system": "node"/"system": "node-fresh"/' \
      "$TMP/rates-$tag.jsonl" >> "$RESULTS"
  else
    cat "$TMP/rates-$tag.jsonl" >> "$RESULTS"
  fi
  log "kvpool ($tag): SSD write GB/s per window: $(sed -n 's/.*"op": "ssd-write".*"gbps": \([0-9.]*\).*/\1/p' "$TMP/rates-$tag.jsonl" | tr '\n' ' ')"
}

run_kvpool() {
  local st used entries ibpe rep t0 t1 ctl_rc threads
  mkdir -p "$TMP/ssd"
  start_node
  log "kvpool-node ready in ${READY_S}s: DRAM $NODE_DRAM, SSD $SSD_CAPACITY in $TMP/ssd (region $SSD_REGION, io-threads $IO_THREADS, flush threads $FLUSH_THREADS)"
  # First fill: the data file was just preallocated, never written.
  put_phase ssd-bench-fill fresh
  # Kill, zero the superblock: the next start finds no valid superblock,
  # starts cold and fills the regions from the first one again, over the
  # bytes just written (as fio's measured passes overwrite its file).
  stop_pid "$NODE_PID" kvpool-node KILL
  dd if=/dev/zero of="$TMP/ssd/kvpool-ssd.data" bs=4096 count=1 conv=notrunc,fsync status=none \
    || die "could not zero the superblock"
  start_node
  st="$(status_json)"
  log "kvpool-node restarted in ${READY_S}s: recovery $(printf '%s' "$st" | jget ssd.recovery), $(printf '%s' "$st" | jget ssd.entries) entries"
  # The node's CPU by thread over the overwrite phase, per GiB put: where
  # a demotion's bytes are handled (the local loop, the flush threads).
  "$PY" "$HERE/compare_lib.py" thread-cpu "$NODE_PID" > "$TMP/cpu-before.json"
  put_phase ssd-bench over
  "$PY" "$HERE/compare_lib.py" thread-cpu "$NODE_PID" > "$TMP/cpu-after.json"
  # How the overwrite phase's demotions went (the counters start at the
  # restart): lent and copied by a flush thread, lent and written from the
  # slot (gather: a segment of 2 MiB pages, for up to half of what may be
  # lent; docs/operations.md, "Huge pages"), or neither, copied under the
  # DRAM lock.
  local copy gather demoted
  copy="$("$PY" "$HERE/compare_lib.py" metric "$ADMIN_URL/metrics" 'kvpool_ssd_lent_records_total{mode="copy"}')"
  gather="$("$PY" "$HERE/compare_lib.py" metric "$ADMIN_URL/metrics" 'kvpool_ssd_lent_records_total{mode="gather"}')"
  demoted="$("$PY" "$HERE/compare_lib.py" metric "$ADMIN_URL/metrics" kvpool_tier_demotions_total)"
  record "{\"system\":\"node\",\"demotions\":$demoted,\"lent_copy\":$copy,\"lent_gather\":$gather}"
  log "kvpool: of $demoted demotions, $copy lent to a flush thread's copy, $gather gathered from their slots, $((demoted - copy - gather)) copied under the DRAM lock"

  st="$(status_json)"; printf '%s\n' "$st" > "$TMP/status-after-put.json"
  used="$(printf '%s' "$st" | jget ssd.used_bytes)"
  entries="$(printf '%s' "$st" | jget ssd.entries)"
  ibpe="$(printf '%s' "$st" | jget ssd.index_bytes_per_entry)"
  log "kvpool: SSD holds $entries entries, $((used >> 20)) MiB; dropped demotions: $(printf '%s' "$st" | jget ssd.inserts_dropped)"
  record "{\"system\":\"node\",\"ssd_entries\":$entries,\"ssd_used_bytes\":$used,\"index_bytes_per_entry\":$ibpe}"

  # Recovery after a crash: SIGKILL, restart, time until it serves (scan).
  for rep in $(seq 0 $((REPS - 1))); do
    stop_pid "$NODE_PID" kvpool-node KILL
    start_node
    st="$(status_json)"
    record "{\"system\":\"kvpool\",\"op\":\"recovery-scan\",\"rep\":$rep,\"seconds\":$READY_S,\"used_bytes\":$used,\"recovery\":\"$(printf '%s' "$st" | jget ssd.recovery)\",\"entries\":$(printf '%s' "$st" | jget ssd.entries),\"log_seconds\":$("$PY" "$HERE/compare_lib.py" log-recovery-s < "$NODE_LOG")}"
    log "kvpool: restart after SIGKILL served in ${READY_S}s (recovery $(printf '%s' "$st" | jget ssd.recovery), $(printf '%s' "$st" | jget ssd.entries) entries)"
  done
  # Clean restart: SIGTERM (flush + checkpoint), restart, time until it serves.
  for rep in $(seq 0 $((REPS - 1))); do
    t0="$(now)"
    stop_pid "$NODE_PID" kvpool-node TERM
    t1="$(now)"
    start_node
    st="$(status_json)"
    record "{\"system\":\"kvpool\",\"op\":\"recovery-checkpoint\",\"rep\":$rep,\"seconds\":$READY_S,\"stop_seconds\":$(elapsed "$t0" "$t1"),\"used_bytes\":$used,\"recovery\":\"$(printf '%s' "$st" | jget ssd.recovery)\",\"entries\":$(printf '%s' "$st" | jget ssd.entries),\"log_seconds\":$("$PY" "$HERE/compare_lib.py" log-recovery-s < "$NODE_LOG")}"
    log "kvpool: clean stop took $(elapsed "$t0" "$t1")s; restart served in ${READY_S}s (recovery $(printf '%s' "$st" | jget ssd.recovery))"
  done

  # Cold reads. The node was just restarted: DRAM is empty and every key is
  # only on SSD. The last keys put were in DRAM at the first crash and are
  # gone; read only keys below that tail. Promotions vs items read tell how
  # many gets hit DRAM instead (keys promoted earlier in the run).
  local read_keys=$((KEYS - 512)) p0 p1 i0 i1 rc
  for threads in 1 2; do
    for rep in $(seq 0 $((REPS - 1))); do
      fio_paired_read "$threads" "$rep"
      p0="$("$PY" "$HERE/compare_lib.py" metric "$ADMIN_URL/metrics" kvpool_tier_promotions_total)"
      i0="$("$PY" "$HERE/compare_lib.py" metric "$ADMIN_URL/metrics" kvpool_hits_total)"
      "$KVPOOL_BENCH" --socket "$SOCK" --op get --keys "$read_keys" --value-size "$VALUE" --batch "$BATCH" \
        --threads "$threads" --duration "$DURATION" --buffer-size 512MiB --seed $((rep * 2 + threads)) \
        --namespace ssd-bench --json > "$TMP/get.out" 2> "$TMP/get.err" || {
        rc=$?; cat "$TMP/get.err" >&2; die "kvpool-bench get failed (exit $rc)"; }
      p1="$("$PY" "$HERE/compare_lib.py" metric "$ADMIN_URL/metrics" kvpool_tier_promotions_total)"
      i1="$("$PY" "$HERE/compare_lib.py" metric "$ADMIN_URL/metrics" kvpool_hits_total)"
      "$PY" "$HERE/compare_lib.py" tag-get "$threads" "$rep" "$p0" "$p1" "$i0" "$i1" < "$TMP/get.out" \
        | tee -a "$RESULTS" | "$PY" "$HERE/compare_lib.py" show-get >&2
    done
  done
  st="$(status_json)"; printf '%s\n' "$st" > "$TMP/status-end.json"
  stop_pid "$NODE_PID" kvpool-node TERM
  NODE_PID=""
  rm -f "$TMP/fio.dat"
}

started=$SECONDS
log "directory $TMP ($fstype); fio write qd $WRITE_QD (= $FLUSH_THREADS flush threads x $SSD_REGION / 1 MiB), read qd $READ_QD (= --io-threads); transparent huge pages: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null || echo unknown)"
run_fio
run_kvpool
log "done in $((SECONDS - started)) s"
"$PY" "$HERE/compare_lib.py" ssd-summarize "$RESULTS"
# The first-fill figures (fresh blocks for both), beside the summary's.
"$PY" - "$RESULTS" <<'PYEOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def med(system, op):
    v = [r["gbps"] for r in rows if r.get("system") == system and r.get("op") == op and r["gbps"] == r["gbps"]]
    return statistics.median(v) if v else float("nan")
fio_f, kv_f = med("fio", "write-fresh"), med("kvpool", "ssd-write-fresh")
node = {}
for r in rows:
    if r.get("system") == "node-fresh":
        node.update(r)
print("first fill (fresh blocks): fio write %.3f GB/s, kvpool SSD write %.3f GB/s; region writes %.1f ms, "
      "flush threads busy %.0f%%" % (fio_f, kv_f, node.get("region_write_ms", float("nan")),
                                      100 * node.get("flush_busy", float("nan"))))
print("metric ssd_first_fill_write_vs_fio %.3f" % (kv_f / fio_f if fio_f else float("nan")))
print("metric ssd_first_fill_write_gbps %.3f" % kv_f)
print("metric fio_first_fill_write_gbps %.3f" % fio_f)
PYEOF
# CPU seconds per GiB put in the overwrite phase, by the node's threads.
"$PY" - "$TMP/cpu-before.json" "$TMP/cpu-after.json" "$GIB" <<'PYEOF'
import json, sys
before, after = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
gib = float(sys.argv[3])
def used(name):  # a pool's threads are named name-0, name-1, ...
    def of(d):
        return sum(v for k, v in d.items() if k == name or k.startswith(name + "-"))
    return of(after) - of(before)
for name in ("kvpool-local", "kvpool-flush"):
    print("metric ssd_put_cpu_%s_s_per_gib %.3f" % (name.replace("kvpool-", ""), used(name) / gib))
total = sum(after.values()) - sum(before.get(k, 0.0) for k in after)
print("metric ssd_put_cpu_node_s_per_gib %.3f" % (total / gib))
PYEOF
