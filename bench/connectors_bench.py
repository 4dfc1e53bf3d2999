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
  vLLM     the worker side of KvpoolConnector (default mode: one page per
           block holding every layer) over a paged FlashAttention KV cache,
           one vLLM step per 64-block batch (bind the metadata,
           start_load_kv, per layer wait_for_layer_load / save_kv_layer,
           wait_for_save), against the same pages moved with get_ptrs /
           put_ptrs plus the same copies into and out of the KV cache
           tensors (bench_vllm below says why the copies count).
After an untimed warm-up rep, each rep runs every batch on both sides back
to back (order alternating), so background load hits both alike; stores
write fresh objects (removed, untimed, between sides). Reports medians of
>= 3 reps (default 5) and ends with `metric NAME VALUE` lines:
  sglang_get_vs_client, sglang_set_vs_client (median GB/s ratios; 1.0 =
  the connector adds no cost over the raw client), the LMCache hook's, and
  vllm_load_vs_client, vllm_save_vs_client.
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


class VllmSetup:
    """A vLLM worker-side KvpoolConnector (created by vLLM's connector
    factory, as the stand-in model runner does) over a paged KV cache in the
    FlashAttention layout, one (2, num_blocks, block_size, heads, head) bf16
    tensor per layer, filled with random bits; plus a raw client in the
    connector's namespace and the page format both sides write."""

    def __init__(self, args):
        from vllm.config import (CacheConfig, KVTransferConfig, ModelConfig, ParallelConfig,
                                 VllmConfig)
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
        from vllm.v1.engine.core import make_kv_cache_config

        from kvpool.integrations import _vllm_keys as vkeys
        from kvpool.integrations._vllm_layout import HEADER_BYTES, PageFormat, detect

        self.args = args
        self.n = args.vllm_blocks
        bs, heads, head = args.vllm_block_size, args.vllm_heads, args.head_dim
        # Room to pick each step's source and destination blocks at random;
        # block 0 is vLLM's null block, never saved or loaded.
        self.num_blocks = 4 * self.n + 1
        ktc = KVTransferConfig(kv_connector="KvpoolConnector",
                               kv_connector_module_path="kvpool.integrations.vllm",
                               kv_role="kv_both",
                               kv_connector_extra_config={"socket": args.socket,
                                                          "timeout_ms": 30000})
        self.cfg = VllmConfig(
            model_config=ModelConfig(model="bench/model", dtype=torch.bfloat16,
                                     num_hidden_layers=args.layers, num_key_value_heads=heads,
                                     head_dim=head),
            cache_config=CacheConfig(block_size=bs), parallel_config=ParallelConfig(),
            kv_transfer_config=ktc)
        kcc = make_kv_cache_config(self.cfg, self.num_blocks)
        self.names = list(kcc.kv_cache_groups[0].layer_names)
        self.caches = {}
        for name in self.names:
            t = torch.empty(2, self.num_blocks, bs, heads, head, dtype=torch.bfloat16)
            t.view(torch.int16).copy_(torch.randint(-32768, 32767, t.shape, dtype=torch.int16))
            self.caches[name] = t
        # The integer views the raw client copies through (same bytes).
        self.bits = [self.caches[n].view(torch.int16) for n in self.names]
        self.conn = KVConnectorFactory.create_connector(self.cfg, KVConnectorRole.WORKER, kcc)
        self.conn.register_kv_caches(self.caches)
        self.namespace, _ = vkeys.namespace(self.cfg)
        self.suffix = vkeys.rank_suffix(False, 0, 0)
        # The page: header, then each layer's block (K then V) in layer order.
        self.fmt = PageFormat([detect(n, self.caches[n], self.num_blocks, bs, False)
                               for n in self.names])
        self.header_bytes = HEADER_BYTES
        self.layer_bytes = 2 * bs * heads * head * self.bits[0].element_size()
        self.page_bytes = self.fmt.page_bytes
        self.client = kvpool.Client(args.socket, namespace=self.namespace, timeout_ms=30000)
        if self.page_bytes > self.client.max_value_size:
            raise SystemExit("vllm: %d-byte pages exceed the node's value limit"
                             % self.page_bytes)
        # The raw client's staging rows (one page each), reused like the connector's.
        self.load_rows = torch.zeros((self.n, self.page_bytes), dtype=torch.uint8)
        self.save_rows = torch.zeros((self.n, self.page_bytes), dtype=torch.uint8)
        self.load_ptrs = [self.load_rows.data_ptr() + i * self.page_bytes for i in range(self.n)]
        self.save_ptrs = [self.save_rows.data_ptr() + i * self.page_bytes for i in range(self.n)]
        self.sizes = [self.page_bytes] * self.n

    def layer_rows(self, rows, i):
        """Layer i's part of the staging rows as (2, n, block_size, heads, head)
        int16 (no copy), the order of a FlashAttention tensor's blocks."""
        a = self.fmt.offsets[self.names[i]]
        part = rows[:, a:a + self.layer_bytes].view(torch.int16)
        t = self.bits[i]
        return part.view((rows.shape[0], 2) + tuple(t.shape[2:])).transpose(0, 1)

    def batch(self, rep, b):
        """Block ids to save from and load into (distinct, scattered over the
        cache) and the block hashes of one request's prefix."""
        from vllm.v1.request import Request

        from kvpool.integrations import _vllm_keys as vkeys

        g = torch.Generator().manual_seed((rep + 2) * 1000 + b)
        perm = (torch.randperm(self.num_blocks - 1, generator=g) + 1).tolist()
        src, dst = perm[:self.n], perm[self.n:2 * self.n]
        base = ((rep + 2) * 1000 + b) * 100000
        toks = [base + i for i in range(self.n * self.args.vllm_block_size)]
        hashes = vkeys.BlockHasher(Request("bench-%d-%d" % (rep, b), toks),
                                   self.args.vllm_block_size).upto(self.n)
        return src, dst, hashes


def bench_vllm(args):
    """vLLM: one request's prefix of --vllm-blocks blocks per batch (default
    64 blocks of 16 tokens, 32 layers, 4 KV heads of 128, bf16: 1 MiB pages,
    a 1024-token hit of a Llama-3-8B-like model at TP 2 moving 64 MiB). Two
    sides, timed batch by batch in alternating order:
      connector  one vLLM step as the stand-in model runner drives the worker
                 side: bind_connector_metadata (a KvpoolConnectorMetadata
                 with one BlockTransfer), start_load_kv, per layer
                 wait_for_layer_load and save_kv_layer, wait_for_save,
                 get_block_ids_with_load_errors, clear_connector_metadata.
                 The metadata is what the scheduler side plans for a
                 1024-token hit (below load_async_min_tokens: a synchronous
                 load). A load step copies the pages out of kvpool into the
                 connector's staging rows, checks their headers and copies
                 every layer's blocks into the KV cache, all in
                 start_load_kv; a save step checks which pages kvpool has,
                 copies the blocks out of the KV cache on its save lane and
                 puts the pages.
      client     the same pages (same namespace, keys and bytes) moved by
                 hand: Client.get_ptrs into staging rows, then per layer one
                 copy of the blocks into the KV cache tensor (advanced-index
                 assignment); stores: per layer one torch.index_select of the
                 blocks straight into the staging rows, then put_ptrs. Those
                 are the fastest plain torch copies of scattered blocks
                 measured on this host (index_copy_ and per-block loops were
                 slower). Keys, pointers, block-id tensors and the page
                 headers are prepared outside the timing.
    The client side includes the copies into and out of the KV cache: an
    engine cannot use a page without them (each layer's K and V of a block
    are 64 separate places in the paged cache), so get_ptrs alone is not the
    same work; it is printed for reference. Every load is checked against
    the source blocks (untimed), and the connector must report no load
    errors; stores write fresh pages (removed, untimed, between sides) and
    the loads read what the last store left (the connector's pages in half
    the batches, the client's in the other half)."""
    s = VllmSetup(args)
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata

    from kvpool.integrations.vllm import BlockTransfer, KvpoolConnectorMetadata

    conn, client, n, nb = s.conn, s.client, s.n, args.batches
    batch_bytes = n * s.page_bytes
    log("vllm: %d batches x %d blocks x %.0f KiB pages per rep (%.0f MiB), %d layers, "
        "%d reps" % (nb, n, s.page_bytes / 1024, nb * batch_bytes / 2**20, len(s.names),
                     args.reps))

    def step(meta):
        """The connector calls of one forward pass (gpu_model_runner's order)."""
        ctx = ForwardContext(no_compile_layers={},
                             attn_metadata={name: AttentionMetadata() for name in s.names})
        conn.bind_connector_metadata(meta)
        conn.start_load_kv(ctx)
        for name in s.names:
            conn.wait_for_layer_load(name)
            conn.save_kv_layer(name, s.caches[name], ctx.attn_metadata[name])
        conn.wait_for_save()
        errors = conn.get_block_ids_with_load_errors()
        conn.clear_connector_metadata()
        return errors

    def all_ok(statuses):
        return all(x == kvpool.StatusCode.OK for x in statuses)

    sides = ("connector", "client")
    rates = {k: [] for k in ("connector_save", "client_save", "connector_load", "client_load",
                             "getptrs_load")}
    for rep in range(-1, args.reps):
        secs = dict.fromkeys(rates, 0.0)
        for b in range(nb):
            src, dst, hashes = s.batch(rep, b)
            keys = [h + s.suffix for h in hashes]
            src_t, dst_t = torch.tensor(src), torch.tensor(dst)
            save_meta = KvpoolConnectorMetadata(saves=[BlockTransfer("r%d" % b, src, hashes)])
            load_meta = KvpoolConnectorMetadata(loads=[BlockTransfer("r%d" % b, dst, hashes)])
            s.save_rows[:, :s.header_bytes] = s.fmt.header_rows(keys)

            def client_save():
                for i, t in enumerate(s.bits):
                    torch.index_select(t, 1, src_t, out=s.layer_rows(s.save_rows, i))
                if not all_ok(client.put_ptrs(keys, s.save_ptrs, s.sizes)):
                    raise SystemExit("vllm: client put_ptrs failed")

            def client_get():
                if not all_ok(client.get_ptrs(keys, s.load_ptrs, s.sizes)):
                    raise SystemExit("vllm: client get_ptrs missed")

            def client_load():
                client_get()
                for i, t in enumerate(s.bits):
                    t[:, dst_t] = s.layer_rows(s.load_rows, i)

            order = sides if (rep + b) % 2 == 0 else sides[::-1]
            for side in order:  # stores: each side writes the batch fresh
                client.remove(keys)
                saved = conn.worker_stats["saved_blocks"]
                if side == "connector":
                    secs["connector_save"] += timed(lambda: step(save_meta))
                    if conn.worker_stats["saved_blocks"] - saved != n:
                        raise SystemExit("vllm: the connector saved %d of %d blocks" % (
                            conn.worker_stats["saved_blocks"] - saved, n))
                else:
                    secs["client_save"] += timed(client_save)
                if not all(client.exists(keys)):
                    raise SystemExit("vllm: %s store left pages missing" % side)
            for side in order:  # loads: both read what the last store left
                for t in s.bits:
                    t[:, dst_t] = 0
                if side == "connector":
                    errors = []
                    secs["connector_load"] += timed(lambda: errors.append(step(load_meta)))
                    if errors[0]:
                        raise SystemExit("vllm: load errors in blocks %s" % sorted(errors[0]))
                else:
                    secs["client_load"] += timed(client_load)
                if not all(torch.equal(t[:, dst_t], t[:, src_t]) for t in s.bits):
                    raise SystemExit("vllm: %s load left other bytes in the KV cache" % side)
            secs["getptrs_load"] += timed(client_get)  # reference: no copy
            client.remove(keys)
        if rep < 0:
            continue
        for k, t in secs.items():
            rates[k].append(nb * batch_bytes / t / 1e9)
        log("rep %d GB/s: save connector %.2f client %.2f; load connector %.2f client %.2f "
            "(get_ptrs alone %.2f)" % (rep + 1, rates["connector_save"][-1],
                                       rates["client_save"][-1], rates["connector_load"][-1],
                                       rates["client_load"][-1], rates["getptrs_load"][-1]))
    conn.shutdown()
    client.close()
    med = {k: statistics.median(v) for k, v in rates.items()}
    print("%-28s %10s %10s" % ("vllm (%d-block steps)" % n, "save GB/s", "load GB/s"))
    print("%-28s %10.2f %10.2f" % ("  KvpoolConnector (worker)", med["connector_save"],
                                   med["connector_load"]))
    print("%-28s %10.2f %10.2f" % ("  raw Client + KV copy", med["client_save"],
                                   med["client_load"]))
    print("%-28s %10s %10.2f" % ("  (get_ptrs alone, no copy)", "", med["getptrs_load"]))
    for k in ("save", "load"):
        ratios = [c / r for c, r in zip(rates["connector_" + k], rates["client_" + k])]
        log("vllm %s: per-rep ratios %s" % (k, " ".join("%.3f" % x for x in ratios)))
    return {"vllm_load_vs_client": med["connector_load"] / med["client_load"],
            "vllm_save_vs_client": med["connector_save"] / med["client_save"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--socket", required=True, help="the kvpool-node's socket")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--batches", type=int, default=8, help="128-page batches per rep")
    ap.add_argument("--page-size", type=int, default=32, help="tokens per page")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--heads", type=int, default=1, help="KV heads on this rank")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--vllm-blocks", type=int, default=64, help="vLLM blocks per step")
    ap.add_argument("--vllm-block-size", type=int, default=16, help="vLLM tokens per block")
    ap.add_argument("--vllm-heads", type=int, default=4, help="vLLM KV heads on this rank")
    ap.add_argument("--only", default="sglang,lmcache,vllm")
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
    if "vllm" in only:
        metrics.update(bench_vllm(args))
    for name, value in metrics.items():
        print("metric %s %.3f" % (name, value))


if __name__ == "__main__":
    main()
