"""Helpers shared by the SGLang backend tests: host pools with random KV,
controllers attached to kvpool through the dynamic loader, page comparison;
hybrid models' side pools (Mamba, SWA, a DSA-indexer sidecar) and their
backups."""

import json

import torch

from sglang.srt.managers.cache_controller import HiCacheController
from sglang.srt.mem_cache.hicache_storage import PoolHitPolicy, PoolName, SidecarPoolSpec
from sglang.srt.mem_cache.memory_pool_host import (MambaPoolHost, MHATokenToKVPoolHost,
                                                   MLATokenToKVPoolHost, SWATokenToKVPoolHost)

PAGE = 4
MODEL = "meta-llama/Llama-3.1-8B"
HYBRID_MODEL = "Qwen/Qwen3-Next-80B-A3B-Instruct"
SWA_WINDOW = 3  # pages of the SWA pool's TRAILING_PAGES window


def make_pool(kind="mha", layout="page_first", dtype=torch.float16, pages=512, page_size=PAGE,
              seed=0, layers=2, heads=2, head_dim=8):
    if kind == "mha":
        return MHATokenToKVPoolHost(pages * page_size, page_size, dtype, heads, head_dim, layers,
                                    layout=layout, seed=seed)
    return MLATokenToKVPoolHost(pages * page_size, page_size, dtype, 12, 4, layers, layout=layout,
                                seed=seed)


def extra_config(socket, v1=True, **more):
    cfg = {"backend_name": "kvpool", "module_path": "kvpool.integrations.sglang",
           "class_name": "KvpoolHiCacheStorage", "socket": socket, "prefetch_threshold": PAGE,
           "reconnect_interval_ms": 50}
    if v1:
        cfg["interface_v1"] = 1
    cfg.update(more)
    return cfg


def make_controller(pool, socket, v1=True, model=MODEL, extra=None, **ranks):
    return HiCacheController(pool, storage_backend="dynamic", model_name=model,
                             storage_backend_extra_config=json.dumps(
                                 extra_config(socket, v1, **(extra or {}))), **ranks)


def tokens(n_pages, start=0, page_size=PAGE):
    return list(range(start, start + n_pages * page_size))


def fill_random(pool, host_indices, seed):
    """Random bit patterns (NaNs included: the tests compare bytes) in every
    page at host_indices."""
    g = torch.Generator().manual_seed(seed)
    for first in host_indices[::pool.page_size].tolist():
        page = pool.get_dummy_flat_data_page()
        bits = torch.randint(-32768, 32767, (page.numel(),), dtype=torch.int16, generator=g)
        pool.set_from_flat_data_page(first, bits.view(pool.dtype))


def page_bits(pool, host_indices):
    """Each page's content as int16 bit patterns (layout order)."""
    return [pool.get_data_page(first, flat=True).contiguous().view(torch.int16).clone()
            for first in host_indices[::pool.page_size].tolist()]


def same_pages(pool_a, idx_a, pool_b, idx_b, n_pages):
    a = page_bits(pool_a, idx_a[:n_pages * pool_a.page_size])
    b = page_bits(pool_b, idx_b[:n_pages * pool_b.page_size])
    return len(a) == len(b) == n_pages and all(torch.equal(x, y) for x, y in zip(a, b))


def write_pages(ctrl, n_pages, seed, start=0):
    """Allocates n_pages host pages, fills them, backs them up; returns
    (host_indices, token_ids, backup op)."""
    pool = ctrl.mem_pool_host
    host = pool.alloc(n_pages * pool.page_size)
    fill_random(pool, host, seed)
    toks = tokens(n_pages, start, pool.page_size)
    return host, toks, ctrl.write_storage(host, toks)


# ---- hybrid models ---------------------------------------------------------------
def make_hybrid_pools(seed=0, kv_layout="page_first", pages=512):
    """(KV pool, {PoolName: extra pool}): Mamba states (float32, one slot per
    state), SWA layers' K/V (bfloat16, own slots), and an indexer sidecar
    that shares the KV pool's slots (same size and page size)."""
    kv = make_pool("mha", kv_layout, torch.float16, pages=pages, seed=seed)
    mamba = MambaPoolHost(64, 2, (3, 4), (2, 4, 4), torch.float32, seed=seed)
    swa = SWATokenToKVPoolHost(64 * PAGE, PAGE, torch.bfloat16, 1, 8, 2, layout="page_first",
                               seed=seed)
    indexer = MLATokenToKVPoolHost(pages * PAGE, PAGE, torch.float16, 6, 2, 1, seed=seed)
    return kv, {PoolName.MAMBA: mamba, PoolName.SWA: swa, PoolName.INDEXER: indexer}


def make_hybrid_controller(socket, seed=0, v1=True, kv_layout="page_first", model=HYBRID_MODEL,
                           extra=None, **ranks):
    kv, pools = make_hybrid_pools(seed, kv_layout)
    return HiCacheController(
        kv, storage_backend="dynamic", model_name=model,
        storage_backend_extra_config=json.dumps(extra_config(socket, v1, **(extra or {}))),
        extra_pools=pools,
        sidecar_specs=[SidecarPoolSpec(PoolName.INDEXER, PoolName.KV, PoolHitPolicy.ALL_PAGES)],
        trailing_windows={PoolName.MAMBA: 1, PoolName.SWA: SWA_WINDOW}, **ranks)


def fill_random_bytes(pool, firsts, seed):
    """Random bytes (any dtype; NaN patterns included) in the pages whose
    first index is in firsts."""
    g = torch.Generator().manual_seed(seed)
    for first in firsts:
        page = pool.get_dummy_flat_data_page()
        nbytes = page.numel() * page.element_size()
        bits = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=g)
        pool.set_from_flat_data_page(first, bits.view(page.dtype))


def page_bytes(pool, firsts):
    """Each page's content as raw bytes (layout order)."""
    return [pool.get_data_page(first, flat=True).contiguous().view(torch.uint8).clone()
            for first in firsts]


def same_bytes(pool_a, firsts_a, pool_b, firsts_b):
    a, b = page_bytes(pool_a, firsts_a), page_bytes(pool_b, firsts_b)
    return len(a) == len(b) > 0 and all(torch.equal(x, y) for x, y in zip(a, b))


def firsts_of(pool, host_indices):
    return host_indices[::pool.page_size].tolist()


def write_hybrid(ctrl, n_pages, seed, start=0):
    """One backup of a hybrid model: n_pages KV pages and their indexer
    pages (same slots), the SWA pool's last SWA_WINDOW pages and the Mamba
    state after the last page, all random. Returns (KV host indices, token
    ids, {pool name: that pool's slots}, backup op)."""
    kv = ctrl.mem_pool_host
    pools = {str(p.name): p.host_pool for p in ctrl.extra_pools}
    host = kv.alloc(n_pages * PAGE)
    fill_random_bytes(kv, firsts_of(kv, host), seed)
    fill_random_bytes(pools["indexer"], firsts_of(pools["indexer"], host), seed + 1)
    swa_pages = min(SWA_WINDOW, n_pages)
    swa = pools["swa"].alloc(swa_pages * PAGE)
    fill_random_bytes(pools["swa"], firsts_of(pools["swa"], swa), seed + 2)
    mamba = pools["mamba"].alloc(1)
    fill_random_bytes(pools["mamba"], mamba.tolist(), seed + 3)
    toks = tokens(n_pages, start)
    slots = {"swa": swa, "mamba": mamba, "indexer": host}
    op = ctrl.write_storage(host, toks, {PoolName.SWA: swa, PoolName.MAMBA: mamba})
    return host, toks, slots, op
