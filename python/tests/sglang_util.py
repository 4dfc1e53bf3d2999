"""Helpers shared by the SGLang backend tests: host pools with random KV,
controllers attached to kvpool through the dynamic loader, page comparison."""

import json

import torch

from sglang.srt.managers.cache_controller import HiCacheController
from sglang.srt.mem_cache.memory_pool_host import MHATokenToKVPoolHost, MLATokenToKVPoolHost

PAGE = 4
MODEL = "meta-llama/Llama-3.1-8B"


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
