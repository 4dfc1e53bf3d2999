"""kvpool's SGLang HiCache backend with hybrid models' side pools (the v2
pool API, ENGINES.md 6.5): Mamba states, SWA windows and an indexer sidecar
next to the KV pool, against a real kvpool-node."""

import pytest
import torch

from kvpool import Client, StatusCode
from kvpool.integrations.sglang import KvpoolHiCacheStorage
from sglang.srt.mem_cache.hicache_storage import (HiCacheStorageConfig, PoolHitPolicy, PoolName,
                                                  PoolTransfer, PoolTransferResult)
from sglang_util import (HYBRID_MODEL, PAGE, SWA_WINDOW, extra_config, fill_random_bytes,
                         firsts_of, make_controller, make_hybrid_controller, make_hybrid_pools,
                         make_pool, page_bytes, same_bytes, same_pages, tokens, write_hybrid,
                         write_pages)

ALL = PoolHitPolicy.ALL_PAGES
TRAILING = PoolHitPolicy.TRAILING_PAGES
MAMBA_TAG = ".mamba-float32-b352"  # (2 layers * (3*4 conv + 2*4*4 temporal)) * 4 bytes
SWA_TAG = ".swa-bfloat16-b256"  # 2 (K,V) * 2 layers * 4 tokens * 1 head * 8 dims * 2 bytes
INDEXER_TAG = ".indexer-float16-b64"  # 1 layer * 4 tokens * 8 dims * 2 bytes


def pools_of(ctrl):
    return {str(p.name): p.host_pool for p in ctrl.extra_pools}


@pytest.mark.parametrize("v1,kv_layout", [(True, "page_first"), (True, "page_first_direct"),
                                          (False, "page_first"), (False, "layer_first")])
def test_hybrid_pools_roundtrip_byte_exact(kvpool_node, v1, kv_layout):
    """A backs up 10 pages of a hybrid model (KV + indexer sidecar on every
    page, SWA's last 3 pages, the Mamba state after page 9); B, with fresh
    host pools, finds them with one batch_exists_v2 and loads every pool's
    pages byte-exact into its own slots."""
    sock = kvpool_node.socket
    a = make_hybrid_controller(sock, seed=1, v1=v1, kv_layout=kv_layout)
    b = make_hybrid_controller(sock, seed=2, v1=v1, kv_layout=kv_layout)
    assert a.use_v1 is v1
    host, toks, slots, op = write_hybrid(a, 10, seed=21)
    assert op.ok is True
    assert op.pool_ok == {"indexer": True, "swa": True, "mamba": True}
    got = b.prefetch(toks + tokens(2, start=90000))  # 2 more pages nobody stored
    assert (got.storage_hit_pages, got.completed_pages) == (10, 10)
    assert got.pool_hit_pages == {"mamba": 1, "swa": SWA_WINDOW, "indexer": 10}
    assert got.pool_loaded_pages == {"mamba": 1, "swa": SWA_WINDOW, "indexer": 10}
    hashes = a.page_hashes(toks)
    assert got.pool_keys == {"mamba": hashes[9:], "swa": hashes[7:], "indexer": hashes}
    assert same_pages(a.mem_pool_host, host, b.mem_pool_host, got.host_indices, 10)
    pa, pb = pools_of(a), pools_of(b)
    assert same_bytes(pa["indexer"], firsts_of(pa["indexer"], host),
                      pb["indexer"], firsts_of(pb["indexer"], got.host_indices))
    assert same_bytes(pa["swa"], firsts_of(pa["swa"], slots["swa"]),
                      pb["swa"], firsts_of(pb["swa"], got.pool_host_indices["swa"]))
    assert same_bytes(pa["mamba"], slots["mamba"].tolist(),
                      pb["mamba"], got.pool_host_indices["mamba"].tolist())
    stats = b.storage_backend.get_stats()
    assert (stats.exists_calls, stats.exists_hit_pages) == (1, 10)
    assert (stats.pool_get_pages, stats.pool_get_hit_pages) == (14, 14)
    stats = a.storage_backend.get_stats()
    assert (stats.pool_set_pages, stats.pool_set_ok_pages) == (14, 14)


def test_hybrid_object_names(kvpool_node):
    """KV pages keep their v1 names; a pool's page is "<hash>.<pool>-<dtype>-
    b<bytes per page><rank suffix>"; nothing else is stored."""
    sock = kvpool_node.socket
    a = make_hybrid_controller(sock, seed=1, tp_rank=1, tp_size=2)
    host, toks, slots, op = write_hybrid(a, 4, seed=22)
    assert op.ok
    h = a.page_hashes(toks)
    r = "_1_2"
    with Client(sock, namespace=a.storage_backend.namespace) as raw:
        assert raw.exists([h[0] + r + "_k", h[0] + r + "_v", h[0] + INDEXER_TAG + r,
                           h[3] + INDEXER_TAG + r, h[1] + SWA_TAG + r, h[3] + SWA_TAG + r,
                           h[3] + MAMBA_TAG + r]) == [True] * 7
        assert raw.exists([h[0] + SWA_TAG + r, h[2] + MAMBA_TAG + r, h[3] + ".mamba" + r,
                           h[3] + MAMBA_TAG]) == [False] * 4
        assert raw.stats()["dram"]["entries"] == 8 + 4 + 3 + 1


def test_missing_mamba_state_at_the_boundary_falls_back_to_the_previous_one(kvpool_node):
    """Two backups of one request: pages 0-3 (Mamba state after page 3),
    then pages 0-7 (state after page 7). Without the state after page 7 the
    hit is cut to the previous boundary, 4 pages, and what loads there is
    the first backup's state and SWA window, byte-exact."""
    sock = kvpool_node.socket
    a = make_hybrid_controller(sock, seed=1)
    b = make_hybrid_controller(sock, seed=2)
    pa = pools_of(a)
    toks = tokens(8)
    host = a.mem_pool_host.alloc(8 * PAGE)
    fill_random_bytes(a.mem_pool_host, firsts_of(a.mem_pool_host, host), 30)
    fill_random_bytes(pa["indexer"], firsts_of(pa["indexer"], host), 31)
    swa = [pa["swa"].alloc(SWA_WINDOW * PAGE) for _ in range(2)]
    mamba = [pa["mamba"].alloc(1) for _ in range(2)]
    for i in range(2):
        fill_random_bytes(pa["swa"], firsts_of(pa["swa"], swa[i]), 32 + i)
        fill_random_bytes(pa["mamba"], mamba[i].tolist(), 34 + i)
    n = 4 * PAGE
    assert a.write_storage(host[:n], toks[:n], {PoolName.SWA: swa[0],
                                                PoolName.MAMBA: mamba[0]}).ok
    assert a.write_storage(host, toks, {PoolName.SWA: swa[1], PoolName.MAMBA: mamba[1]}).ok

    got = b.prefetch(toks)
    assert (got.storage_hit_pages, got.completed_pages) == (8, 8)
    assert same_bytes(pa["mamba"], mamba[1].tolist(),
                      pools_of(b)["mamba"], got.pool_host_indices["mamba"].tolist())

    h = a.page_hashes(toks)
    with Client(sock, namespace=a.storage_backend.namespace) as raw:
        assert raw.remove([h[7] + MAMBA_TAG + "_0_1"]) == [StatusCode.OK]
    got = b.prefetch(toks)
    assert (got.storage_hit_pages, got.completed_pages) == (4, 4)
    assert got.pool_hit_pages == {"mamba": 1, "swa": 3, "indexer": 4}
    assert got.pool_loaded_pages == {"mamba": 1, "swa": 3, "indexer": 4}
    assert got.pool_keys["mamba"] == [h[3]] and got.pool_keys["swa"] == h[1:4]
    pb = pools_of(b)
    assert same_pages(a.mem_pool_host, host, b.mem_pool_host, got.host_indices, 4)
    assert same_bytes(pa["mamba"], mamba[0].tolist(),
                      pb["mamba"], got.pool_host_indices["mamba"].tolist())
    assert same_bytes(pa["swa"], firsts_of(pa["swa"], swa[0]),
                      pb["swa"], firsts_of(pb["swa"], got.pool_host_indices["swa"]))


@pytest.fixture
def planted(kvpool_node):
    """A hybrid backend with KV pages 0-11 of 12 keys stored, Mamba states
    after pages 3 and 7, SWA pages 0-11 but 2, indexer pages 0-11 but 5.
    Returns (backend, keys, raw client of its namespace)."""
    ctrl = make_hybrid_controller(kvpool_node.socket, seed=3)
    be, kv, pools = ctrl.storage_backend, ctrl.mem_pool_host, pools_of(ctrl)
    keys = ["page%02d" % i for i in range(12)]
    host = kv.alloc(12 * PAGE)
    assert be.batch_set_v1(keys, host) == [True] * 12

    def put(name, idx):
        pool = pools[name]
        slots = pool.alloc(len(idx) * pool.page_size)
        res = be.batch_set_v2([PoolTransfer(PoolName(name), host_indices=slots,
                                            keys=[keys[i] for i in idx])])
        assert res == {name: [True] * len(idx)}

    put("mamba", [3, 7])
    put("swa", [i for i in range(12) if i != 2])
    put("indexer", [i for i in range(12) if i != 5])
    raw = Client(kvpool_node.socket, namespace=be.namespace)
    yield be, keys, raw
    raw.close()


def exists_v2(be, keys, *pools):
    """batch_exists_v2 with (name, policy[, window]) per pool; returns
    (kv_hit_pages, extra_pool_hit_pages)."""
    transfers = [PoolTransfer(name, keys=[None] * (w[0] if w else 1) if pol == TRAILING else None,
                              hit_policy=pol) for name, pol, *w in pools]
    r = be.batch_exists_v2(keys, transfers)
    assert isinstance(r, PoolTransferResult)
    return r.kv_hit_pages, r.extra_pool_hit_pages


def test_hit_policies_exact_prefix(planted):
    be, keys, raw = planted
    assert exists_v2(be, keys) == (12, {})
    assert be.batch_exists(keys) == 12
    # Mamba (the state after the prefix's last page): no state after page 11,
    # the previous one is after page 7.
    assert exists_v2(be, keys, (PoolName.MAMBA, TRAILING)) == (8, {"mamba": 1})
    assert exists_v2(be, keys[:7], (PoolName.MAMBA, TRAILING)) == (4, {"mamba": 1})
    assert exists_v2(be, keys[:3], (PoolName.MAMBA, TRAILING)) == (0, {"mamba": 0})
    # SWA, window 3: the missing page 2 is outside the last window.
    assert exists_v2(be, keys, (PoolName.SWA, TRAILING, 3)) == (12, {"swa": 3})
    assert exists_v2(be, keys[:6], (PoolName.SWA, TRAILING, 3)) == (6, {"swa": 3})
    # ... until the window reaches it; a prefix shorter than the window needs
    # only its own pages.
    assert exists_v2(be, keys[:5], (PoolName.SWA, TRAILING, 3)) == (2, {"swa": 2})
    assert exists_v2(be, keys[:2], (PoolName.SWA, TRAILING, 5)) == (2, {"swa": 2})
    # Indexer, every page: the first missing page (5) ends the prefix.
    assert exists_v2(be, keys, (PoolName.INDEXER, ALL)) == (5, {"indexer": 5})
    # Together: the largest prefix every pool allows.
    assert exists_v2(be, keys, (PoolName.MAMBA, TRAILING), (PoolName.SWA, TRAILING, 3)) == (
        8, {"mamba": 1, "swa": 3})
    # With the indexer (<= 5), Mamba leaves 4, whose SWA window (pages 1-3)
    # lacks page 2; no shorter prefix has a Mamba state: nothing is usable.
    assert exists_v2(be, keys, (PoolName.MAMBA, TRAILING), (PoolName.SWA, TRAILING, 3),
                     (PoolName.INDEXER, ALL)) == (0, {"mamba": 0, "swa": 0, "indexer": 0})
    # A KV transfer among the pools changes nothing (the KV pool always counts).
    assert exists_v2(be, keys, (PoolName.KV, ALL), (PoolName.MAMBA, TRAILING)) == (
        8, {"mamba": 1})

    # An SWA page inside the last window goes: the window moves back.
    assert raw.remove(["page10" + SWA_TAG + "_0_1"]) == [StatusCode.OK]
    assert exists_v2(be, keys, (PoolName.SWA, TRAILING, 3)) == (10, {"swa": 3})
    assert exists_v2(be, keys, (PoolName.SWA, TRAILING, 1)) == (12, {"swa": 1})
    # A KV page goes: no pool can extend the prefix past it.
    assert raw.remove(["page06_0_1_v"]) == [StatusCode.OK]
    assert exists_v2(be, keys) == (6, {})
    assert exists_v2(be, keys, (PoolName.MAMBA, TRAILING)) == (4, {"mamba": 1})
    assert exists_v2(be, keys, (PoolName.SWA, TRAILING, 3)) == (6, {"swa": 3})


def test_pool_without_registration_has_no_pages(planted):
    be, keys, _ = planted
    assert exists_v2(be, keys, (PoolName.DRAFT, ALL)) == (0, {"draft": 0})
    assert exists_v2(be, keys, (PoolName.DRAFT_SWA, TRAILING, 2)) == (0, {"draft_swa": 0})
    t = PoolTransfer(PoolName.DRAFT, host_indices=torch.arange(2 * PAGE), keys=keys[:2])
    assert be.batch_set_v2([t]) == {"draft": [False, False]}
    assert be.batch_get_v2([t]) == {"draft": [False, False]}


def test_get_v2_reports_each_page_and_fills_only_hits(planted):
    """Per key one bool; a page that misses leaves its slot as it was."""
    be, keys, _ = planted
    pool = be.registered_pools["indexer"]
    slots = pool.alloc(3 * PAGE)
    fill_random_bytes(pool, firsts_of(pool, slots), 40)
    before = page_bytes(pool, firsts_of(pool, slots))
    res = be.batch_get_v2([PoolTransfer(PoolName.INDEXER, host_indices=slots,
                                        keys=[keys[4], keys[5], keys[6]])])
    assert res == {"indexer": [True, False, True]}
    after = page_bytes(pool, firsts_of(pool, slots))
    assert torch.equal(after[1], before[1])
    assert not torch.equal(after[0], before[0]) and not torch.equal(after[2], before[2])


@pytest.mark.parametrize("kv_layout", ["page_first", "layer_first"])
def test_sidecar_resolves_keys_and_indices_from_its_pool(kvpool_node, kv_layout):
    """A sidecar transfer without keys or indices takes those of the pool it
    names (here the KV pool's, in the same v2 call); KV named in a v2 call
    uses the same objects as v1 (zero-copy, page_first) or the generic path
    (layer_first)."""
    sock = kvpool_node.socket
    a = make_hybrid_controller(sock, seed=4, kv_layout=kv_layout)
    b = make_hybrid_controller(sock, seed=5, kv_layout=kv_layout)
    keys = ["side%d" % i for i in range(5)]
    ha = a.mem_pool_host.alloc(5 * PAGE)
    fill_random_bytes(a.mem_pool_host, firsts_of(a.mem_pool_host, ha), 41)
    fill_random_bytes(pools_of(a)["indexer"], firsts_of(a.mem_pool_host, ha), 42)

    def transfers(host):
        return [PoolTransfer(PoolName.KV, host_indices=host, keys=keys),
                PoolTransfer(PoolName.INDEXER, indices_from_pool=PoolName.KV)]

    both = {"kv": [True] * 5, "indexer": [True] * 5}
    assert a.storage_backend.batch_set_v2(transfers(ha)) == both
    assert b.storage_backend.batch_exists(keys) == 5
    hb = b.mem_pool_host.alloc(5 * PAGE)
    assert b.storage_backend.batch_get_v2(transfers(hb)) == both
    assert same_pages(a.mem_pool_host, ha, b.mem_pool_host, hb, 5)
    assert same_bytes(pools_of(a)["indexer"], firsts_of(a.mem_pool_host, ha),
                      pools_of(b)["indexer"], firsts_of(b.mem_pool_host, hb))
    # A sidecar naming a pool that is not in the call has nothing to move.
    lone = PoolTransfer(PoolName.INDEXER, indices_from_pool=PoolName.KV)
    assert b.storage_backend.batch_get_v2([lone]) == {"indexer": []}


def test_register_v2_skips_the_kv_pool_registered_through_v1(kvpool_node):
    sock = kvpool_node.socket
    ctrl = make_hybrid_controller(sock, seed=6)
    be = ctrl.storage_backend
    assert be.registered_pools["kv"] is ctrl.mem_pool_host
    assert set(be.registered_pools) == {"kv", "mamba", "swa", "indexer"}
    ns = be.namespace
    other_kv, _ = make_hybrid_pools(seed=7, kv_layout="page_first_direct")
    be.register_mem_host_pool_v2(other_kv, PoolName.KV)
    assert be.mem_pool_host is ctrl.mem_pool_host and be.namespace == ns
    assert be.registered_pools["kv"] is ctrl.mem_pool_host
    # A backend offered the KV pool only through v2 registers it as v1 would.
    cfg = HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0,
                               attn_cp_size=1, is_mla_model=False, enable_storage_metrics=False,
                               is_page_first_layout=True, model_name=HYBRID_MODEL,
                               extra_config=extra_config(sock))
    fresh = KvpoolHiCacheStorage(cfg, {})
    fresh.register_mem_host_pool_v2(ctrl.mem_pool_host, PoolName.KV)
    assert fresh.mem_pool_host is ctrl.mem_pool_host and fresh.namespace == ns
    fresh.close()


def test_mla_hybrid_rank1_stores_no_pool_pages(kvpool_node):
    sock = kvpool_node.socket
    cfg = HiCacheStorageConfig(tp_rank=1, tp_size=2, pp_rank=0, pp_size=1, attn_cp_rank=0,
                               attn_cp_size=1, is_mla_model=True, enable_storage_metrics=False,
                               is_page_first_layout=True, model_name=HYBRID_MODEL,
                               extra_config=extra_config(sock))
    be = KvpoolHiCacheStorage(cfg, {})
    _, pools = make_hybrid_pools(seed=8)
    be.register_mem_host_pool_v2(pools[PoolName.MAMBA], PoolName.MAMBA)
    slots = pools[PoolName.MAMBA].alloc(2)
    t = PoolTransfer(PoolName.MAMBA, host_indices=slots, keys=["m0", "m1"], hit_policy=TRAILING)
    assert be.batch_set_v2([t]) == {"mamba": [True, True]}
    assert be.get_stats().set_skipped_pages == 2
    with Client(sock) as raw:
        assert raw.stats()["dram"]["entries"] == 0
    be.close()


def test_malformed_v2_calls_are_misses_not_exceptions(planted):
    be, keys, raw = planted
    pool = be.registered_pools["swa"]
    slots = pool.alloc(2 * PAGE)
    short = PoolTransfer(PoolName.SWA, host_indices=slots[:PAGE + 1], keys=keys[:2])
    assert be.batch_get_v2([short]) == {"swa": [False, False]}
    assert be.batch_set_v2([short]) == {"swa": [False, False]}
    errors = be.get_stats().errors
    bad = torch.zeros(2 * PAGE, 2, dtype=torch.int64)  # one row per index: not indices
    assert be.batch_get_v2([PoolTransfer(PoolName.SWA, host_indices=bad, keys=keys[:2])]) == {
        "swa": [False, False]}
    assert be.batch_exists_v2(keys, [object()]).kv_hit_pages == 0
    assert be.get_stats().errors == errors + 2
    # A stored object of the right name and the wrong size is a miss.
    assert raw.put(["odd" + SWA_TAG + "_0_1"], [b"x" * 10]) == [StatusCode.OK]
    assert be.batch_get_v2([PoolTransfer(PoolName.SWA, host_indices=slots[:PAGE],
                                         keys=["odd"])]) == {"swa": [False]}


def test_node_down_v2_calls_miss(kvpool_node):
    ctrl = make_hybrid_controller(kvpool_node.socket, seed=9)
    host, toks, slots, op = write_hybrid(ctrl, 3, seed=43)
    assert op.ok
    be = ctrl.storage_backend
    hashes = ctrl.page_hashes(toks)
    kvpool_node.kill()
    r = be.batch_exists_v2(hashes, [PoolTransfer(PoolName.MAMBA, keys=[None],
                                                 hit_policy=TRAILING)])
    assert (r.kv_hit_pages, r.extra_pool_hit_pages) == (0, {"mamba": 0})
    t = PoolTransfer(PoolName.MAMBA, host_indices=slots["mamba"], keys=hashes[2:])
    assert be.batch_get_v2([t]) == {"mamba": [False]}
    assert be.batch_set_v2([t]) == {"mamba": [False]}
    got = ctrl.prefetch(toks)
    assert (got.storage_hit_pages, got.completed_pages, got.pool_loaded_pages) == (0, 0, {})
    kvpool_node.start()
    assert be.batch_set_v2([t]) == {"mamba": [True]}


def spy(backend, calls):
    """Records the storage calls the controller makes (method, pool names)."""
    names = ("register_mem_host_pool_v2", "batch_exists", "batch_exists_v2", "batch_get_v1",
             "batch_set_v1", "batch_get", "batch_set", "batch_get_v2", "batch_set_v2")
    for name in names:
        fn = getattr(backend, name)

        def recorded(*args, _fn=fn, _name=name, **kwargs):
            pools = None
            if _name in ("batch_get_v2", "batch_set_v2"):
                pools = [str(t.name) for t in args[0]]
            elif _name == "batch_exists_v2":
                pools = [str(t.name) for t in args[1]]
            elif _name == "register_mem_host_pool_v2":
                pools = [str(args[1])]
            calls.append((_name, pools))
            return _fn(*args, **kwargs)

        setattr(backend, name, recorded)


def test_controller_calls_v1_for_kv_and_v2_for_extra_pools(kvpool_node, monkeypatch):
    """The stand-in controller's calls: every pool registered through v2 (KV
    first), KV pages through batch_*_v1, extra pools through batch_*_v2, and
    batch_exists_v2 only when extra pools exist."""
    from sglang.srt.mem_cache.storage import StorageBackendFactory

    calls = []
    create = StorageBackendFactory.create_backend

    def create_spied(*args, **kwargs):
        backend = create(*args, **kwargs)
        spy(backend, calls)
        return backend

    monkeypatch.setattr(StorageBackendFactory, "create_backend", create_spied)
    sock = kvpool_node.socket
    a = make_hybrid_controller(sock, seed=10)
    assert calls == [("register_mem_host_pool_v2", ["kv"]),
                     ("register_mem_host_pool_v2", ["mamba"]),
                     ("register_mem_host_pool_v2", ["swa"]),
                     ("register_mem_host_pool_v2", ["indexer"])]
    del calls[:]
    _, toks, _, op = write_hybrid(a, 5, seed=44)
    assert op.ok
    assert calls == [("batch_set_v1", None), ("batch_set_v2", ["mamba", "swa", "indexer"])]
    del calls[:]
    a.prefetch(toks)
    assert calls == [("batch_exists_v2", ["mamba", "swa", "indexer"]), ("batch_get_v1", None),
                     ("batch_get_v2", ["mamba", "swa", "indexer"])]
    del calls[:]
    plain = make_controller(make_pool("mha", "page_first", seed=11), sock)
    _, toks, op = write_pages(plain, 5, seed=45)
    plain.prefetch(toks)
    assert calls == [("batch_set_v1", None), ("batch_exists", None), ("batch_get_v1", None)]
