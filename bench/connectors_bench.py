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
After an untimed warm-up rep, each rep runs every batch on both sides back
to back (order alternating), so background load hits both alike; stores
write fresh objects (removed, untimed, between sides). Reports medians of
>= 3 reps (default 5) and ends with `metric NAME VALUE` lines:
  sglang_get_vs_client, sglang_set_vs_client (median GB/s ratios; 1.0 =
  the connector adds no cost over the raw client), and the LMCache hook's.
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

    def check(ok, what):
        if not ok:
            raise SystemExit("sglang bench: %s" % what)

    def all_ok(statuses):
        return all(x == kvpool.StatusCode.OK for x in statuses)

    # One 128-page batch per call; side -> (store, load).
    calls = {
        "sglang": (lambda h, o: check(all(s.backend.batch_set_v1(h, s.host)), "batch_set_v1"),
                   lambda h, o: check(all(s.backend.batch_get_v1(h, s.host)), "batch_get_v1")),
        "client": (lambda h, o: check(all_ok(s.client.put_ptrs(o, s.ptrs, s.sizes)), "put_ptrs"),
                   lambda h, o: check(all_ok(s.client.get_ptrs(o, s.ptrs, s.sizes)), "get_ptrs")),
    }
    rates = {k: [] for k in ("sglang_set", "client_set", "sglang_get", "client_get")}
    # Rep -1 is a warm-up, not recorded: each client maps the node's segment
    # itself, and the first touch of every page of that mapping faults.
    for rep in range(-1, args.reps):
        secs = dict.fromkeys(rates, 0.0)
        for b in range(nb):
            # Side by side per batch, order alternating, so both sides see the
            # same background load; stores write fresh objects each time.
            h = s.hashes(rep, b)
            o = s.object_keys(h)
            order = ("sglang", "client") if (rep + b) % 2 == 0 else ("client", "sglang")
            for side in order:
                s.client.remove(o)
                secs[side + "_set"] += timed(lambda: calls[side][0](h, o))
            for side in order:
                secs[side + "_get"] += timed(lambda: calls[side][1](h, o))
            s.client.remove(o)
        if rep < 0:
            continue
        for k, t in secs.items():
            rates[k].append(nb * batch_bytes / t / 1e9)
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
    """LMCache: chunks of 256 tokens ([2, layers, 256, heads*head_dim] bf16,
    KV_2LTD) in batches of 16 (a 4096-token prompt), three sides timed batch
    by batch in alternating order, so all see the same background load:
      connector  KvpoolRemoteConnector.batched_put / batched_get (inside
                 LMCache's instrumented wrapper) awaited on an event loop in
                 this thread: the connector's whole cost, including its hop
                 to its I/O threads and, for gets, LocalCPUBackend.allocate
                 (the stand-in allocator reuses freed buffers, like LMCache's
                 arena);
      client     Client.put_ptrs / get_ptrs of the same payload keys (same
                 namespace and names) from and into memory objects' buffers;
      engine     (shown, not a metric) the same connector driven as LMCache
                 drives it: RemoteBackend on LMCache's event-loop thread, so
                 two more thread hops per call.
    Every chunk read is compared with what was written (untimed). Warm-up
    rep, then `args.reps` reps; metrics are ratios of median GB/s, connector
    over client."""
    import asyncio

    from lmcache.utils import CacheEngineKey
    from lmcache.v1.config import LMCacheEngineConfig
    from lmcache.v1.memory_management import MemoryFormat, TensorMemoryAllocator
    from lmcache.v1.metadata import LMCacheMetadata
    from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
    from lmcache.v1.storage_backend.storage_manager import StorageManager
    from kvpool.integrations import _lmcache_format as lmfmt

    chunk, per_batch, nb = 256, 16, args.batches
    shape = torch.Size([2, args.layers, chunk, args.heads * args.head_dim])
    md = LMCacheMetadata("bench/model", 1, 0, "vllm", torch.bfloat16,
                         (args.layers, 2, chunk, args.heads, args.head_dim))
    plugin = "remote_storage_plugin.kvpool."
    cfg = LMCacheEngineConfig(chunk_size=chunk, remote_storage_plugins=["kvpool"],
                              blocking_timeout_secs=60, extra_config={
                                  plugin + "module_path": "kvpool.integrations.lmcache",
                                  plugin + "class_name": "KvpoolConnectorAdapter",
                                  plugin + "socket": args.socket,
                                  plugin + "timeout_ms": 30000})
    chunk_bytes = shape.numel() * 2
    batch_bytes = per_batch * chunk_bytes
    alloc = TensorMemoryAllocator(4 * batch_bytes)
    sm = StorageManager(cfg, md, LocalCPUBackend(cfg, alloc))
    backend = sm.remote_backends["kvpool"]
    wrapped = backend.connection  # InstrumentedRemoteConnector(KvpoolRemoteConnector)
    connector = wrapped.getWrappedConnector()
    loop = asyncio.new_event_loop()
    client = kvpool.Client(args.socket, namespace=connector.settings.namespace, timeout_ms=30000)
    # Source objects (random KV) and the raw client's destination objects.
    src = [sm.allocate(shape, torch.bfloat16, MemoryFormat.KV_2LTD) for _ in range(per_batch)]
    for o in src:
        o.tensor.view(torch.int16).copy_(torch.randint(-32768, 32767, shape, dtype=torch.int16))
    dst = [sm.allocate(shape, torch.bfloat16, MemoryFormat.KV_2LTD) for _ in range(per_batch)]
    src_ptrs = [kvpool.buffer_address(o.byte_array)[0] for o in src]
    dst_ptrs = [kvpool.buffer_address(o.byte_array)[0] for o in dst]
    sizes = [chunk_bytes] * per_batch
    header = lmfmt.layout(shape, "bfloat16", "KV_2LTD", chunk_bytes, client.max_value_size)
    log("lmcache: %d batches x %d chunks x %.1f MiB per rep (%.0f MiB), %d reps" % (
        nb, per_batch, chunk_bytes / 2**20, nb * batch_bytes / 2**20, args.reps))

    def same(objs):
        return all(o is not None and torch.equal(o.tensor.view(torch.int16),
                                                 w.tensor.view(torch.int16))
                   for o, w in zip(objs, src))

    sides = ("connector", "client", "engine")
    rates = {s + op: [] for s in sides for op in ("_set", "_get")}
    for rep in range(-1, args.reps):
        keys = [[CacheEngineKey("bench/model", 1, 0, ((rep + 2) * 1000 + b) * 100 + i,
                                torch.bfloat16) for i in range(per_batch)] for b in range(nb)]
        names = [[k.to_string() for k in ks] for ks in keys]
        payloads = [[n for s in ns for n in lmfmt.payload_keys(s, header)] for ns in names]
        if any(len(p) != per_batch for p in payloads):
            raise SystemExit("lmcache: chunks over the node's value limit")
        secs = dict.fromkeys(rates, 0.0)
        loaded = []  # checked and released after the timing

        def put(side, b):
            if side == "connector":
                for o in src:
                    o.ref_count_up()  # the serializer's reference; the wrapper drops it
                loop.run_until_complete(wrapped.batched_put(keys[b], src))
            elif side == "engine":
                backend.batched_submit_put_task(keys[b], src)
                backend.wait_for_puts()
            elif any(x != kvpool.StatusCode.OK for x in client.put_ptrs(payloads[b], src_ptrs,
                                                                         sizes)):
                raise SystemExit("client put_ptrs failed")

        def get(side, b):
            if side == "connector":
                loaded.append(loop.run_until_complete(wrapped.batched_get(keys[b])))
            elif side == "engine":
                loaded.append(backend.batched_get_blocking(keys[b]))
            elif any(x != kvpool.StatusCode.OK for x in client.get_ptrs(payloads[b], dst_ptrs,
                                                                         sizes)):
                raise SystemExit("client get_ptrs missed")

        def drop(b):
            client.remove([lmfmt.meta_key(n) for n in names[b]] + payloads[b])

        for b in range(nb):
            order = sides[(rep + b) % 3:] + sides[:(rep + b) % 3]
            if (rep + b) % 2:
                order = order[::-1]
            for side in order:  # stores: each side writes the batch fresh
                drop(b)
                stored = connector.stats["stored"]
                secs[side + "_set"] += timed(lambda: put(side, b))
                if side != "client" and connector.stats["stored"] - stored != per_batch:
                    raise SystemExit("lmcache batched_put stored %d of %d" % (
                        connector.stats["stored"] - stored, per_batch))
            for side in order:  # loads: all read what the last store left
                secs[side + "_get"] += timed(lambda: get(side, b))
            ok = all(same(objs) for objs in loaded) and same(dst)
            for o in (o for objs in loaded for o in objs if o is not None):
                o.ref_count_down()
            loaded.clear()
            if not ok:
                raise SystemExit("lmcache: a get missed or returned other bytes")
            for d in dst:
                d.tensor.zero_()
            drop(b)
        if rep < 0:
            continue
        for k in rates:
            rates[k].append(nb * batch_bytes / secs[k] / 1e9)
        log("rep %d GB/s: set connector %.2f client %.2f engine %.2f; "
            "get connector %.2f client %.2f engine %.2f" % (
                rep + 1, *(rates[s + "_set"][-1] for s in sides),
                *(rates[s + "_get"][-1] for s in sides)))
    client.close()
    for o in src + dst:
        o.ref_count_down()
    sm.close()
    loop.close()
    if alloc.live_count() != 0:
        raise SystemExit("lmcache: %d memory objects leaked" % alloc.live_count())
    med = {k: statistics.median(v) for k, v in rates.items()}
    print("%-28s %10s %10s" % ("lmcache (16-chunk batches)", "set GB/s", "get GB/s"))
    print("%-28s %10.2f %10.2f" % ("  KvpoolRemoteConnector", med["connector_set"],
                                   med["connector_get"]))
    print("%-28s %10.2f %10.2f" % ("  raw Client *_ptrs", med["client_set"], med["client_get"]))
    print("%-28s %10.2f %10.2f" % ("  (via LMCache's loop thread)", med["engine_set"],
                                   med["engine_get"]))
    return {"lmcache_get_vs_client": med["connector_get"] / med["client_get"],
            "lmcache_set_vs_client": med["connector_set"] / med["client_set"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--socket", required=True, help="the kvpool-node's socket")
    ap.add_argument("--reps", type=int, default=5)
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
