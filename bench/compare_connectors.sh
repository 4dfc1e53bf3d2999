#!/usr/bin/env bash
# bench/compare.sh connectors: the engine connectors against kvpool's raw
# Python client API on the same data, in one run (about 1 minute).
#
# Starts its own kvpool-node (temporary directory, free admin port, DRAM
# $NODE_DRAM) and runs bench/connectors_bench.py against it with
# /usr/bin/python3 and this build's libkvpool.so:
#   sglang   KvpoolHiCacheStorage batch_set_v1/batch_get_v1 of 128-page
#            batches vs Client.put_ptrs/get_ptrs of the same objects
#   lmcache  the LMCache connector's batched get/put (its bench_lmcache hook)
#   vllm     KvpoolConnector's worker side, one vLLM step per 64-block batch
#            (bind metadata, start_load_kv, wait_for_layer_load and
#            save_kv_layer per layer, wait_for_save) over a paged
#            FlashAttention KV cache, vs get_ptrs/put_ptrs of the same pages
#            plus the same block copies into and out of the KV cache
# The bench process runs on one CPU (--cpu N, default the highest the
# process may use; --cpu all: unpinned), so the connector's worker threads
# and the raw client's calling thread run on the same core: on a shared VM
# the vCPUs' copy bandwidths can differ (by a quarter on the 2-core
# development VM), and unpinned the scheduler tends to keep the calling
# thread on one vCPU and the connector's threads on another, which
# measures the vCPUs, not the connector. The node is not pinned.
# Medians of --reps (>= 3, default 5) reps. Ends with `metric` lines:
# sglang_get_vs_client, sglang_set_vs_client, lmcache_get_vs_client and
# lmcache_set_vs_client (when the LMCache hook measures them),
# vllm_load_vs_client, vllm_save_vs_client.
#
# Usage: bench/compare.sh connectors [--reps N] [--cpu N|all] [--keep] [-- BENCH_ARGS...]
#   BENCH_ARGS go to connectors_bench.py (--batches, --page-size, --layers,
#   --heads, --head-dim, --vllm-blocks, --vllm-block-size, --vllm-heads,
#   --only sglang,lmcache,vllm)
# Environment: BUILD_DIR (default build), NODE_DRAM (default 2GiB).
set -euo pipefail

LOG_TAG=connectors
# shellcheck source=bench/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

REPS=5
KEEP=0
EXTRA=()
CPU=""
parse_flags "--reps --cpu --keep --" "$@"
NODE_DRAM="${NODE_DRAM:-2GiB}"

NODE="$(find_bin kvpool-node || true)"
LIB="$BUILD_DIR/src/client/libkvpool.so"
[[ -n "$NODE" ]] || missing+=("kvpool-node under $BUILD_DIR (ninja -C $BUILD_DIR kvpool-node)")
[[ -f "$LIB" ]] || missing+=("$LIB (ninja -C $BUILD_DIR kvpool_client)")
if [[ -n "$PY" ]] && ! "$PY" -c 'import torch' 2>/dev/null; then
  missing+=("torch for $PY (apt-get install python3-torch)")
fi
command -v taskset >/dev/null || missing+=("taskset (apt-get install util-linux)")
check_missing
[[ -n "$CPU" ]] || CPU="$("$PY" -c 'import os; print(max(os.sched_getaffinity(0)))')"
PIN=()
if [[ "$CPU" != all ]]; then
  "$PY" -c 'import os, sys; sys.exit(sys.argv[1] not in map(str, os.sched_getaffinity(0)))' \
    "$CPU" || die "--cpu takes all or a CPU this process may run on, not '$CPU'"
  PIN=(taskset -c "$CPU")
fi

WORK="$(mktemp -d /tmp/kvpool-connectors-XXXXXX)"
NODE_PID=""
cleanup() {
  if [[ -n "$NODE_PID" ]]; then
    kill "$NODE_PID" 2>/dev/null || true
    wait "$NODE_PID" 2>/dev/null || true
  fi
  if [[ "$KEEP" == 1 ]]; then log "kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

SOCK="$WORK/node.sock"
"$NODE" --socket "$SOCK" --dram-capacity "$NODE_DRAM" --admin-port 0 --node-id bench-connectors \
  >"$WORK/node.log" 2>&1 &
NODE_PID=$!
for _ in $(seq 1 1200); do
  grep -q 'admin http://' "$WORK/node.log" 2>/dev/null && break
  kill -0 "$NODE_PID" 2>/dev/null || { tail -n 20 "$WORK/node.log" >&2; die "kvpool-node exited"; }
  sleep 0.1
done
grep -q 'admin http://' "$WORK/node.log" || die "kvpool-node not ready after 120 s"
log "kvpool-node $NODE_DRAM on $SOCK; bench on CPU $CPU"

KVPOOL_LIBRARY="$LIB" PYTHONDONTWRITEBYTECODE=1 "${PIN[@]}" \
  "$PY" "$HERE/connectors_bench.py" --socket "$SOCK" --reps "$REPS" "${EXTRA[@]}"
