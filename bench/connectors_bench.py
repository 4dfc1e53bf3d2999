#!/usr/bin/env python3
"""Engine connectors vs kvpool's raw client API on the same data, one run.

Run through `bench/compare.sh connectors` (bench/compare_connectors.sh starts
the node and sets the environment). Measures:
  SGLang   KvpoolHiCacheStorage.batch_set_v1 / batch_get_v1 of 128-page
           batches (MHA, page_first, bf16) over a host pool, as HiCache's
           backup and prefetch threads call them (page hashes in, pages out).
  client   kvpool.Client.put_ptrs / get_ptrs of the very same objects: the
           same namespace, object names, host-pool pointers and sizes, with
           the key strings and pointer lists prepared outside the timing.
  LMCache  bench_lmcache() below (the LMCache connector's own hook).
After an untimed warm-up rep, each rep times every side once (order
alternating between reps); stores
write fresh objects (removed, untimed, between sides). Reports medians of
>= 3 reps and ends with `metric NAME VALUE` lines:
  sglang_get_vs_client, sglang_set_vs_client (median GB/s ratios; 1.0 =
  the connector adds no cost over the raw client).
"""

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
for p in (os.path.join(REPO, "python"), os.path.join(REPO, "python", "tests", "standins")):
    if p not in sys.path:
        sys.path.insert(0, p)

import torch  # noqa: E402

import kvpool  # noqa: E402
from kvpool.integrations.sglang import KvpoolHiCacheStorage  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig, get_hash_str  # noqa: E402
from sglang.srt.mem_cache.memory_pool_host import MHATokenToKVPoolHost  # noqa: E402

BATCH = 128  # SGLang's STORAGE_BATCH_SIZE


def log(msg):
    print("[connectors %s] %s" % (time.strftime("%H:%M:%S"), msg), file=sys.stderr, flush=True)


def timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


class SglangSetup:
    """A host pool with random KV, the backend as SGLang's dynamic loader
    builds it, and the page hashes of `pages` pages per rep."""

    def __init__(self, args):
        self.args = args
        P = args.page_size
        self.pool = MHATokenToKVPoolHost(BATCH * P, P, torch.bfloat16, args.heads,
                                         args.head_dim, args.layers, layout="page_first")
        self.pool.kv_buffer.view(torch.int16).copy_(
            torch.randint(-32768, 32767, self.pool.kv_buffer.shape, dtype=torch.int16))
        self.host = self.pool.alloc(BATCH * P)
        cfg = HiCacheStorageConfig(
            tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
            is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
            model_name="bench/model",
            extra_config={"backend_name": "kvpool", "module_path": "kvpool.integrations.sglang",
                          "class_name": "KvpoolHiCacheStorage", "interface_v1": 1,
                          "socket": args.socket, "timeout_ms": 30000})
        self.backend = KvpoolHiCacheStorage(cfg, {})
        self.backend.register_mem_pool_host(self.pool)
        self.client = kvpool.Client(args.socket, namespace=self.backend.namespace,
                                    timeout_ms=30000)
        self.page_bytes = self.pool.get_size_per_token() * P
        # The raw client's inputs, prepared once: object names and pointers.
        self.ptrs, self.sizes = self.pool.get_page_buffer_meta(self.host)

    def hashes(self, rep, batch):
        prior, out = None, []
        base = ((rep + 1) * 1000 + batch) * BATCH * self.args.page_size
        for i in range(BATCH):
            toks = range(base + i * self.args.page_size, base + (i + 1) * self.args.page_size)
            prior = get_hash_str(list(toks), prior)
            out.append(prior)
        return out

    def object_keys(self, hashes):
        return [h + s for h in hashes for s in ("_0_1_k", "_0_1_v")]


def bench_sglang(args):
    s = SglangSetup(args)
    nb = args.batches
    batch_bytes = BATCH * s.page_bytes
    log("sglang: %d batches x %d pages x %.0f KiB per rep (%.0f MiB), %d reps" % (
        nb, BATCH, s.page_bytes / 1024, nb * batch_bytes / 2**20, args.reps))
    rates = {k: [] for k in ("sglang_set", "client_set", "sglang_get", "client_get")}
    # Rep -1 is a warm-up, not recorded: each client maps the node's segment
    # itself, and the first touch of every page of that mapping faults.
    for rep in range(-1, args.reps):
        hashes = [s.hashes(rep, b) for b in range(nb)]
        objs = [s.object_keys(h) for h in hashes]

        def sglang_set():
            for h in hashes:
                if not all(s.backend.batch_set_v1(h, s.host)):
                    raise SystemExit("sglang batch_set_v1 failed")

        def client_set():
            for o in objs:
                st = s.client.put_ptrs(o, s.ptrs, s.sizes)
                if any(x != kvpool.StatusCode.OK for x in st):
                    raise SystemExit("client put_ptrs failed: %s" % st[:4])

        def sglang_get():
            for h in hashes:
                if not all(s.backend.batch_get_v1(h, s.host)):
                    raise SystemExit("sglang batch_get_v1 missed")

        def client_get():
            for o in objs:
                st = s.client.get_ptrs(o, s.ptrs, s.sizes)
                if any(x != kvpool.StatusCode.OK for x in st):
                    raise SystemExit("client get_ptrs missed: %s" % st[:4])

        def drop():
            for o in objs:
                s.client.remove(o)

        order = ("sglang", "client") if rep % 2 == 0 else ("client", "sglang")
        sets = {"sglang": sglang_set, "client": client_set}
        gets = {"sglang": sglang_get, "client": client_get}
        for side in order:  # stores: each side writes the objects fresh
            drop()
            rates[side + "_set"].append(nb * batch_bytes / timed(sets[side]) / 1e9)
        for side in order:  # loads: both read what the last store left
            rates[side + "_get"].append(nb * batch_bytes / timed(gets[side]) / 1e9)
        drop()
        if rep < 0:
            for v in rates.values():
                v.pop()
            continue
        log("rep %d: set sglang %.2f client %.2f GB/s; get sglang %.2f client %.2f GB/s" % (
            rep + 1, rates["sglang_set"][-1], rates["client_set"][-1],
            rates["sglang_get"][-1], rates["client_get"][-1]))
    s.backend.close()
    s.client.close()
    med = {k: statistics.median(v) for k, v in rates.items()}
    print("%-28s %10s %10s" % ("sglang (128-page batches)", "set GB/s", "get GB/s"))
    print("%-28s %10.2f %10.2f" % ("  KvpoolHiCacheStorage v1", med["sglang_set"],
                                   med["sglang_get"]))
    print("%-28s %10.2f %10.2f" % ("  raw Client *_ptrs", med["client_set"], med["client_get"]))
    return {"sglang_get_vs_client": med["sglang_get"] / med["client_get"],
            "sglang_set_vs_client": med["sglang_set"] / med["client_set"]}


# ============================================================================
# HOOK: bench_lmcache -- filled in by the LMCache connector's author.
# Contract: measure the LMCache connector's batched get (and put) against the
# raw kvpool.Client on the same data, in this run, `args.reps` reps (median),
# against the node at `args.socket`; print a short table to stdout; return a
# dict {"lmcache_get_vs_client": ratio, ...} (ratios of median GB/s), or None
# when not measured. Every returned entry is printed as a `metric` line.
# ============================================================================
def bench_lmcache(args):
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--socket", required=True, help="the kvpool-node's socket")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--batches", type=int, default=8, help="128-page batches per rep")
    ap.add_argument("--page-size", type=int, default=32, help="tokens per page")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--heads", type=int, default=1, help="KV heads on this rank")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--only", default="sglang,lmcache")
    args = ap.parse_args()
    if args.reps < 3:
        ap.error("--reps must be >= 3 (medians)")
    only = set(args.only.split(","))
    metrics = {}
    if "sglang" in only:
        metrics.update(bench_sglang(args))
    if "lmcache" in only:
        got = bench_lmcache(args)
        if got is None:
            log("lmcache: not measured (bench_lmcache hook not filled in)")
        else:
            metrics.update(got)
    for name, value in metrics.items():
        print("metric %s %.3f" % (name, value))


if __name__ == "__main__":
    main()
