#!/usr/bin/env bash
# bench/compare.sh trace: cache quality on a real LLM request trace. Replays
# the trace (kvpool-bench --trace: per request a hit-prefix, checked reads of
# the hit blocks, writes of the rest; 16 KiB per 512-token block) against a
# fresh kvpool-node per run, at DRAM capacities of 5, 10, 20 and 40 % of the
# trace's distinct blocks, with the default eviction policy and with --eviction
# lru and s3fifo, and compares each with the offline LRU and Belady caches of
# the same capacity (the entries the node reached; a node with --eviction lru
# agrees with the offline LRU exactly).
#
# Then three nodes of a third of the 10 % capacity each, a static cluster,
# requests sent round-robin: what they keep together against the one node,
# with the default placement (local) and with --placement chain; and, for
# scale, three nodes with --eviction lru against the one lru node (what the
# pool's machinery costs a plain LRU cache).
#
# Then the SSD tier's admission: DRAM of 5 % and SSD of 40 % of the distinct
# blocks, the default policy, for each admission setting (SSD_ADMISSIONS):
# the combined hit ratio, the share of hits DRAM served (hits that needed no
# promotion), and SSD bytes written per byte of hits read.
#
# Prints a table and `metric` lines:
#   trace_hit_vs_lru_{5,10,20,40}pct  default policy's block hit ratio / offline LRU's
#   trace_hit_vs_lru_min              the smallest of the four
#   trace_hit_vs_lru_10pct, trace_hit_vs_belady_10pct
#   trace_hit_{POLICY}_{N}pct          each run's block hit ratio
#   pool_hit_vs_single                 3 nodes of C/3 vs 1 node of C, round-robin, 10 %
#                                      (median of POOL_REPS pools)
#   pool_hit_vs_single_chain           the same with --placement chain
#   pool_hit_vs_single_lru             the same, placement local, every node --eviction lru,
#                                      against the one lru node (when POLICIES has lru
#                                      after the judged policy)
#   trace_wrong_bytes                  over every run (must be 0)
#   trace_requests_per_s, trace_requests_per_s_s3fifo
#                                      replay speed at 10 %, median of --reps runs
#   trace_requests_per_s_vs_s3fifo     median over the runs of the judged policy's
#                                      speed over s3fifo's run beside it
#   trace_ssd_hit_{NAME}, trace_ssd_dram_share_{NAME},
#   trace_ssd_write_per_hit_byte_{NAME}  per admission setting
#
# Usage: bench/compare.sh trace [--trace FILE] [--reps N] [--keep]
#        bench/compare.sh trace --shapes LIST ...  (bench/compare_shapes.sh: the
#            given trace and generated traffic shapes at 2-40 % capacity)
#   --trace  a Mooncake JSONL trace (default ../shared/traces/synthetic_trace.jsonl
#            beside the repository)
#   --reps   runs of the 10 % replays, for requests/s (default 5)
# Environment: BUILD_DIR (default build), VALUE_SIZE (default 16KiB),
#   POOL_REPS (pools per placement, default 3; the pool metrics are medians),
#   POLICIES (default "prefix lru s3fifo"; the first is the one judged),
#   SSD_ADMISSIONS (default "none all reads1 reads2 reinsert1": no SSD tier,
#   every eviction written (the default), only entries read at least 1 or 2
#   times, every eviction plus reclaim keeping entries read once).
set -euo pipefail

LOG_TAG=trace
# shellcheck source=bench/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

TRACE="$REPO/../shared/traces/synthetic_trace.jsonl"
REPS=5
KEEP=0
# --shapes: the sweep over traffic shapes instead (bench/compare_shapes.sh).
for arg in "$@"; do
  [[ "$arg" == --shapes ]] && exec "$HERE/compare_shapes.sh" "$@"
done
parse_flags "--trace --reps --keep" "$@"
VALUE_SIZE="${VALUE_SIZE:-16KiB}"
POOL_REPS="${POOL_REPS:-3}"
[[ "$POOL_REPS" =~ ^[1-9][0-9]*$ ]] || die "POOL_REPS must be a positive integer (got '$POOL_REPS')"
read -r -a POLICY_LIST <<< "${POLICIES:-prefix lru s3fifo}"
FRACTIONS=(5 10 20 40)

NODE="$(find_bin kvpool-node || true)"
BENCH="$(find_bin kvpool-bench || true)"
[[ -n "$NODE" ]] || missing+=("kvpool-node under $BUILD_DIR")
[[ -n "$BENCH" ]] || missing+=("kvpool-bench under $BUILD_DIR")
[[ -r "$TRACE" ]] || missing+=("the trace $TRACE (--trace FILE)")
check_missing

# shellcheck source=bench/trace_common.sh
source "$HERE/trace_common.sh"
trace_tmp trace
: > "$TMP/ssd_metrics"

set_trace "$TRACE"
log "trace $TRACE: $distinct distinct blocks, $VALUE_SIZE per block"

policy_sweep "" "/1"
# Replay speed: the judged policy and s3fifo in alternating runs at 10 %, so
# the machine's drift falls on both alike; the figure is the median of the
# pairs' ratios.
mib="$(capacity_mib 10)"
for rep in $(seq 2 "$REPS"); do
  for policy in "${POLICY_LIST[0]}" s3fifo; do
    start one "$mib" --eviction "$policy"
    replay "$policy/10/$rep" "$TMP/one.sock"
    stop_all
  done
done
log "replay speed: $REPS alternating runs each"

# Three nodes of a third each, one static cluster, round-robin; per placement,
# POOL_REPS fresh pools in alternation (the nodes work concurrently, so a
# pool's replay is not deterministic: the figure is the median).
mib="$(capacity_mib 10 3)"
pools=(local chain)
[[ " ${POLICY_LIST[*]} " == *" lru "* && ${POLICY_LIST[0]} != lru ]] && pools+=(lru)
for rep in $(seq 1 "$POOL_REPS"); do
  for pool in "${pools[@]}"; do
    placement="$pool" eviction="${POLICY_LIST[0]}"
    [[ $pool == lru ]] && placement=local eviction=lru
    ports=("$(freeport)" "$(freeport)" "$(freeport)")
    peers="n0=127.0.0.1:${ports[0]},n1=127.0.0.1:${ports[1]},n2=127.0.0.1:${ports[2]}"
    for i in 0 1 2; do
      start "n$i" "$mib" --eviction "$eviction" --node-id "n$i" --peers "$peers" \
        --peer-port "${ports[$i]}" --placement "$placement" --insecure
    done
    replay "pool-$pool/10/$rep" "$TMP/n0.sock,$TMP/n1.sock,$TMP/n2.sock"
    stop_all
    log "pool of three, placement $placement, --eviction $eviction, run $rep of $POOL_REPS, done ($mib MiB each)"
  done
done

# The SSD tier under a DRAM of 5 %: one node per admission setting.
read -r -a ADMISSIONS <<< "${SSD_ADMISSIONS:-none all reads1 reads2 reinsert1}"
dram_mib="$(capacity_mib 5)"
ssd_mib="$(capacity_mib 40)"
for adm in "${ADMISSIONS[@]}"; do
  case "$adm" in
    none) flags=() ;;
    all) flags=(--ssd-admit-reads 0) ;;
    reads[0-9]*) flags=(--ssd-admit-reads "${adm#reads}") ;;
    reinsert[0-9]*) flags=(--ssd-admit-reads 0 --ssd-reinsert-reads "${adm#reinsert}") ;;
    *) die "SSD_ADMISSIONS: unknown setting $adm" ;;
  esac
  [[ $adm == none ]] || flags+=(--ssd "$TMP/ssd-$adm" --ssd-capacity "${ssd_mib}MiB"
                                --ssd-region-size 4MiB)
  mkdir -p "$TMP/ssd-$adm"
  admin="$(freeport)"
  ADMIN_PORT="$admin" start one "$dram_mib" "${flags[@]}"
  replay "ssd-$adm/5/1" "$TMP/one.sock"
  for series in kvpool_tier_promotions_total kvpool_ssd_write_bytes_total; do
    printf '%s %s %s\n' "$adm" "$series" \
      "$("$PY" "$HERE/compare_lib.py" metric "http://127.0.0.1:$admin/metrics" "$series")" \
      >> "$TMP/ssd_metrics"
  done
  stop_all
  rm -rf "$TMP/ssd-$adm"
  log "ssd $adm done (DRAM $dram_mib MiB, SSD $ssd_mib MiB)"
done

"$PY" - "$RESULTS" "${POLICY_LIST[0]}" "$TMP/ssd_metrics" <<'PYEOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
judged = sys.argv[2]
node_metrics = {}
for line in open(sys.argv[3]):
    adm, series, value = line.split()
    node_metrics[(adm, series)] = float(value)
by = {}
for r in rows:
    policy, pct, _ = r["label"].split("/")
    by.setdefault((policy, int(pct)), []).append(r)
policies = []
for r in rows:
    p = r["label"].split("/")[0]
    if not p.startswith(("pool-", "ssd-")) and p not in policies:
        policies.append(p)
print("| capacity | entries | " + " | ".join(policies) + " | offline LRU | Belady |")
print("|---|---|" + "---|" * len(policies) + "---|---|")
ratios = {}
for pct in (5, 10, 20, 40):
    first = by[(judged, pct)][0]
    cells = ["%.4f" % by[(p, pct)][0]["block_hit_ratio"] for p in policies]
    print("| %d %% | %d | %s | %.4f | %.4f |" % (pct, first["capacity_entries"], " | ".join(cells),
          first["offline_lru_block_hit_ratio"], first["offline_belady_block_hit_ratio"]))
    for p in policies:
        print("metric trace_hit_%s_%dpct %.4f" % (p, pct, by[(p, pct)][0]["block_hit_ratio"]))
    ratios[pct] = first["block_hit_ratio"] / first["offline_lru_block_hit_ratio"]
    print("metric trace_hit_vs_lru_%dpct %.3f" % (pct, ratios[pct]))
print("metric trace_hit_vs_lru_min %.3f" % min(ratios.values()))
ten = by[(judged, 10)][0]
print("metric trace_hit_vs_belady_10pct %.3f" % (ten["block_hit_ratio"] / ten["offline_belady_block_hit_ratio"]))
for pool, name, single in (("local", "pool_hit_vs_single", judged),
                           ("chain", "pool_hit_vs_single_chain", judged),
                           ("lru", "pool_hit_vs_single_lru", "lru")):
    if ("pool-" + pool, 10) not in by:
        continue
    runs = [r["block_hit_ratio"] for r in by[("pool-" + pool, 10)]]
    print("pool of three, placement %s: %s" % (pool if pool != "lru" else "local, --eviction lru",
                                               ", ".join("%.4f" % h for h in runs)))
    one = by[(single, 10)][0]["block_hit_ratio"]
    print("metric %s %.3f" % (name, statistics.median(runs) / one))
print("metric trace_wrong_bytes %d" % sum(r["wrong_bytes"] for r in rows))
print("metric trace_failed_items %d" % sum(r["failed_items"] for r in rows))
print("metric trace_requests_per_s %.1f" % statistics.median(r["requests_per_s"] for r in by[(judged, 10)]))
if ("s3fifo", 10) in by:
    print("metric trace_requests_per_s_s3fifo %.1f" %
          statistics.median(r["requests_per_s"] for r in by[("s3fifo", 10)]))
    pairs = zip(by[(judged, 10)], by[("s3fifo", 10)])
    print("metric trace_requests_per_s_vs_s3fifo %.3f" %
          statistics.median(a["requests_per_s"] / b["requests_per_s"] for a, b in pairs))
print()
print("| SSD admission (DRAM 5 %, SSD 40 %) | hit ratio | DRAM share of hits "
      "| SSD bytes written per hit byte | requests/s |")
print("|---|---|---|---|---|")
for label in [r["label"] for r in rows if r["label"].startswith("ssd-")]:
    adm = label.split("/")[0][4:]
    r = by[("ssd-" + adm, 5)][0]
    hits = r["block_hit_ratio"] * r["block_refs"]
    promoted = node_metrics[(adm, "kvpool_tier_promotions_total")]
    share = 1 - promoted / hits if hits else float("nan")
    per_byte = node_metrics[(adm, "kvpool_ssd_write_bytes_total")] / max(1, r["bytes_read"])
    print("| %s | %.4f | %.3f | %.3f | %.0f |" % (adm, r["block_hit_ratio"], share, per_byte,
                                                   r["requests_per_s"]))
    print("metric trace_ssd_hit_%s %.4f" % (adm, r["block_hit_ratio"]))
    print("metric trace_ssd_dram_share_%s %.3f" % (adm, share))
    print("metric trace_ssd_write_per_hit_byte_%s %.3f" % (adm, per_byte))
PYEOF
