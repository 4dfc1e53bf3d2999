"""kvpool's SGLang HiCache backend driven as SGLang's controller drives it,
against a real kvpool-node (single process; multi-rank runs are in
test_sglang_ranks.py)."""

import signal
import time

import pytest
import torch

from kvpool import Client, StatusCode
from kvpool.integrations.sglang import KvpoolHiCacheStorage
from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, HiCacheStorageConfig, get_hash_str
from sglang.srt.mem_cache.storage import StorageBackendFactory
from sglang_util import (MODEL, PAGE, extra_config, fill_random, make_controller, make_pool,
                         same_pages, tokens, write_pages)

DTYPES = [torch.float16, torch.bfloat16]


def config(socket, **kw):
    base = dict(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
                is_mla_model=False, enable_storage_metrics=True, is_page_first_layout=True,
                model_name=MODEL, extra_config=extra_config(socket))
    base.update(kw)
    return HiCacheStorageConfig(**base)


def test_dynamic_loader_constructs_and_registers(kvpool_node):
    pool = make_pool()
    ctrl = make_controller(pool, kvpool_node.socket)
    backend = ctrl.storage_backend
    assert isinstance(backend, KvpoolHiCacheStorage) and isinstance(backend, HiCacheStorage)
    assert ctrl.use_v1 and not ctrl.backup_skip
    assert backend.mem_pool_host is pool
    # SGLang popped its own key; the loader's keys reach the backend.
    seen = backend.storage_config.extra_config
    assert "prefetch_threshold" not in seen and seen["module_path"] == "kvpool.integrations.sglang"
    assert backend.namespace == (
        "sglang||meta-llama-Llama-3.1-8B|mha|page_first|p4|float16|l2h2d8b128")
    # Constructor shapes the loader may use: (config, {}) and (config,).
    KvpoolHiCacheStorage(config(kvpool_node.socket), {}).close()
    KvpoolHiCacheStorage(config(kvpool_node.socket)).close()
    with pytest.raises(TypeError):
        StorageBackendFactory.create_backend(
            "dynamic", config(kvpool_node.socket, extra_config=dict(
                extra_config(kvpool_node.socket), module_path="kvpool.client",
                class_name="Client")),
            pool)
    ctrl.detach_storage_backend()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind,layout", [("mha", "page_first"), ("mha", "page_first_direct"),
                                         ("mha", "page_head"), ("mla", "page_first"),
                                         ("mla", "page_first_direct")])
def test_zero_copy_prefix_shared_between_instances(kvpool_node, kind, layout, dtype):
    """Instance A backs up 300 pages (3 batches of <=128); instance B, with its
    own host pool, finds and loads them byte-exact, and only them."""
    a = make_controller(make_pool(kind, layout, dtype, seed=1), kvpool_node.socket)
    b = make_controller(make_pool(kind, layout, dtype, seed=2), kvpool_node.socket)
    host_a, toks, op = write_pages(a, 300, seed=7)
    assert op.ok is True
    longer = toks + tokens(5, start=100000)  # B's request extends A's prefix by 5 pages
    got = b.prefetch(longer)
    assert got.storage_hit_pages == 300
    assert got.completed_pages == 300
    assert same_pages(a.mem_pool_host, host_a, b.mem_pool_host, got.host_indices, 300)
    stats = b.storage_backend.get_stats()
    assert stats.prefetch_pgs == [128, 128, 44] and stats.get_hit_pages == 300
    assert stats.exists_calls == 3  # 128 + 128 + a short batch of 49, then stop
    assert b.storage_backend.get_stats().prefetch_pgs == []  # drained
    assert a.storage_backend.get_stats().backup_pgs == [128, 128, 44]


@pytest.mark.parametrize("kind,layout", [("mha", "page_first"), ("mha", "layer_first"),
                                         ("mha", "page_first_direct"), ("mla", "layer_first"),
                                         ("mla", "page_first")])
def test_generic_copy_path_roundtrip(kvpool_node, kind, layout):
    a = make_controller(make_pool(kind, layout, torch.bfloat16, seed=3), kvpool_node.socket,
                        v1=False)
    b = make_controller(make_pool(kind, layout, torch.bfloat16, seed=4), kvpool_node.socket,
                        v1=False)
    assert not a.use_v1
    host_a, toks, op = write_pages(a, 140, seed=8)
    assert op.ok is True
    got = b.prefetch(toks)
    assert (got.storage_hit_pages, got.completed_pages) == (140, 140)
    assert same_pages(a.mem_pool_host, host_a, b.mem_pool_host, got.host_indices, 140)


@pytest.mark.parametrize("kind", ["mha", "mla"])
def test_zero_copy_and_generic_paths_share_pages(kvpool_node, kind):
    v1 = make_controller(make_pool(kind, "page_first", seed=5), kvpool_node.socket, v1=True)
    generic = make_controller(make_pool(kind, "page_first", seed=6), kvpool_node.socket, v1=False)
    host_1, toks_1, op = write_pages(v1, 20, seed=9)
    assert op.ok
    host_g, toks_g, op = write_pages(generic, 20, seed=10, start=50000)
    assert op.ok
    got = generic.prefetch(toks_1)
    assert got.completed_pages == 20
    assert same_pages(v1.mem_pool_host, host_1, generic.mem_pool_host, got.host_indices, 20)
    got = v1.prefetch(toks_g)
    assert got.completed_pages == 20
    assert same_pages(generic.mem_pool_host, host_g, v1.mem_pool_host, got.host_indices, 20)


def test_single_key_generic_methods(kvpool_node):
    ctrl = make_controller(make_pool("mha", "page_first"), kvpool_node.socket, v1=False)
    backend, pool = ctrl.storage_backend, ctrl.mem_pool_host
    host = pool.alloc(PAGE)
    page = pool.get_dummy_flat_data_page()
    page.view(torch.int16).copy_(torch.arange(page.numel(), dtype=torch.int16))
    assert backend.exists("h0") is False
    assert backend.get("h0") is None
    assert backend.set("h0", page) is True
    assert backend.set("h0", page) is True  # already there counts as stored
    assert backend.exists("h0") is True
    out = backend.get("h0", pool.get_dummy_flat_data_page())
    assert torch.equal(out.view(torch.int16), page.view(torch.int16))
    assert torch.equal(backend.get("h0").view(torch.int16), page.view(torch.int16))
    # A tensor that is not one page of this pool is refused, not stored or filled.
    assert backend.set("bad", page[:-1]) is False
    assert backend.set("bad", page.to(torch.float32)) is False
    assert backend.get("h0", torch.zeros(page.numel() * 2, dtype=page.dtype)) is None
    assert backend.batch_exists(["h0", "bad"]) == 1
    pool.free(host)


def test_key_namespacing(kvpool_node):
    """Pages are found only under the same model, layout, page size, dtype,
    geometry and (for MHA) TP rank and size; the stored object names follow
    the documented scheme."""
    sock = kvpool_node.socket
    writer = make_controller(make_pool("mha", "page_first"), sock)
    _, toks, op = write_pages(writer, 4, seed=11)
    assert op.ok
    hashes = writer.page_hashes(toks)
    assert hashes[1] == get_hash_str(toks[PAGE:2 * PAGE], get_hash_str(toks[:PAGE]))
    same = make_controller(make_pool("mha", "page_first", seed=9), sock)
    assert same.prefetch(toks).storage_hit_pages == 4
    others = [
        make_controller(make_pool("mha", "page_first"), sock, model="other/model"),
        make_controller(make_pool("mha", "page_first_direct"), sock),
        make_controller(make_pool("mha", "page_first", dtype=torch.bfloat16), sock),
        make_controller(make_pool("mha", "page_first", page_size=8), sock),
        make_controller(make_pool("mha", "page_first", heads=4), sock),
        make_controller(make_pool("mha", "page_first"), sock, tp_rank=0, tp_size=2),
        make_controller(make_pool("mha", "page_first"), sock, pp_rank=0, pp_size=2),
        make_controller(make_pool("mha", "page_first"), sock, extra={"namespace": "blue"}),
        make_controller(make_pool("mla", "page_first"), sock),
    ]
    for ctrl in others:
        op = ctrl.prefetch(toks[:4 * ctrl.page_size])
        assert (op.storage_hit_pages, op.completed_pages) == (0, 0), ctrl.storage_backend.namespace
    ns = writer.storage_backend.namespace
    with Client(sock, namespace=ns) as raw:
        assert raw.exists([hashes[0] + "_0_1_k", hashes[0] + "_0_1_v", hashes[0],
                           hashes[0] + "_k"]) == [True, True, False, False]
    # dp_rank is not part of a key: a DP replica shares the pages.
    dp = make_controller(make_pool("mha", "page_first"), sock, dp_rank=1, dp_size=2)
    assert dp.prefetch(toks).completed_pages == 4

    mla = make_controller(make_pool("mla", "page_first"), sock)
    _, mtoks, op = write_pages(mla, 2, seed=12, start=70000)
    assert op.ok
    mh = mla.page_hashes(mtoks)
    with Client(sock, namespace=mla.storage_backend.namespace) as raw:
        assert raw.exists([mh[0], mh[1], mh[0] + "_0_1"]) == [True, True, False]
    pp = make_controller(make_pool("mla", "page_first"), sock, pp_rank=1, pp_size=2,
                         attn_cp_rank=1, attn_cp_size=2)
    _, ptoks, op = write_pages(pp, 1, seed=13, start=80000)
    with Client(sock, namespace=pp.storage_backend.namespace) as raw:
        assert raw.exists([pp.page_hashes(ptoks)[0] + "_pp1_2_cp1_2"]) == [True]


def test_layer_first_has_no_zero_copy_path(kvpool_node):
    ctrl = make_controller(make_pool("mha", "layer_first"), kvpool_node.socket, v1=True)
    host, toks, op = write_pages(ctrl, 3, seed=14)
    assert op.ok is False
    assert ctrl.storage_backend.batch_get_v1(ctrl.page_hashes(toks), host) == [False] * 3
    assert ctrl.prefetch(toks).storage_hit_pages == 0


def test_mla_backend_skips_writes_on_nonzero_rank(kvpool_node):
    """Even when asked directly, an MLA backend on TP rank 1 stores nothing."""
    pool = make_pool("mla", "page_first")
    ctrl = make_controller(pool, kvpool_node.socket, tp_rank=1, tp_size=2)
    assert ctrl.backup_skip
    backend = ctrl.storage_backend
    host = pool.alloc(2 * PAGE)
    assert backend.batch_set_v1(["m0", "m1"], host) == [True, True]
    assert backend.batch_set(["m0"], [pool.get_data_page(int(host[0]))]) is True
    assert backend.batch_exists(["m0", "m1"]) == 0
    assert backend.get_stats().set_skipped_pages == 3


def test_node_down_at_start_then_up(kvpool_node):
    sock = kvpool_node.socket
    kvpool_node.stop()
    ctrl = make_controller(make_pool("mha", "page_first"), sock,
                           extra={"reconnect_interval_ms": 0})
    backend = ctrl.storage_backend
    assert backend.get_stats().connected is False
    host, toks, op = write_pages(ctrl, 5, seed=15)
    assert op.ok is False
    got = ctrl.prefetch(toks)
    assert (got.storage_hit_pages, got.completed_pages) == (0, 0)
    assert backend.batch_get_v1(ctrl.page_hashes(toks), host) == [False] * 5
    assert backend.get("x") is None and backend.exists("x") is False
    kvpool_node.start()  # the next call connects (reconnect_interval_ms 0)
    assert ctrl.write_storage(host, toks).ok is True
    assert backend.get_stats().connected is True
    assert ctrl.prefetch(toks).completed_pages == 5


def test_node_killed_mid_run(kvpool_node):
    a = make_controller(make_pool("mha", "page_first", seed=1), kvpool_node.socket)
    b = make_controller(make_pool("mha", "page_first", seed=2), kvpool_node.socket)
    host, toks, op = write_pages(a, 10, seed=16)
    assert op.ok
    assert b.prefetch(toks).completed_pages == 10
    kvpool_node.kill()
    got = b.prefetch(toks)
    assert (got.storage_hit_pages, got.completed_pages) == (0, 0)
    hashes = a.page_hashes(toks)
    assert a.storage_backend.batch_get_v1(hashes, host) == [False] * 10
    assert a.storage_backend.batch_set_v1(hashes, host) == [False] * 10
    assert a.storage_backend.batch_exists(hashes) == 0
    assert a.storage_backend.get_stats().errors >= 3
    kvpool_node.start()  # empty again: the client reconnects by itself
    assert b.prefetch(toks).storage_hit_pages == 0
    assert a.write_storage(host, toks).ok
    got = b.prefetch(toks)
    assert got.completed_pages == 10
    assert same_pages(a.mem_pool_host, host, b.mem_pool_host, got.host_indices, 10)


def test_controller_threads_run_concurrently(kvpool_node):
    """Backups and prefetches through the controller's three threads, several
    requests in flight at once on one backend."""
    a = make_controller(make_pool("mha", "page_first_direct", torch.bfloat16, seed=1),
                        kvpool_node.socket)
    b = make_controller(make_pool("mha", "page_first_direct", torch.bfloat16, seed=2),
                        kvpool_node.socket)
    written = [write_pages(a, 16, seed=100 + i, start=i * 10000) for i in range(6)]
    a.start_threads()
    b.start_threads()
    try:
        more = []
        for i in range(6, 12):  # new backups on A while B prefetches the first six
            host = a.mem_pool_host.alloc(16 * PAGE)
            fill_random(a.mem_pool_host, host, 100 + i)
            more.append((host, tokens(16, i * 10000), None))
        backups = [a.submit_backup(h, t) for h, t, _ in more]
        prefetches = [b.submit_prefetch(t) for _, t, _ in written]
        for op in backups + prefetches:
            assert op.done.wait(30)
        assert all(op.ok for op in backups)
        for (host, _, _), op in zip(written, prefetches):
            assert op.completed_pages == 16
            assert same_pages(a.mem_pool_host, host, b.mem_pool_host, op.host_indices, 16)
        prefetches = [b.submit_prefetch(t) for _, t, _ in more]
        for (host, _, _), op in zip(more, prefetches):
            assert op.done.wait(30) and op.completed_pages == 16
            assert same_pages(a.mem_pool_host, host, b.mem_pool_host, op.host_indices, 16)
    finally:
        a.stop_threads()
        b.stop_threads()


def test_close_is_idempotent_and_later_calls_miss(kvpool_node):
    ctrl = make_controller(make_pool("mha", "page_first"), kvpool_node.socket)
    host, toks, op = write_pages(ctrl, 2, seed=17)
    backend = ctrl.storage_backend
    ctrl.detach_storage_backend()  # calls close()
    backend.close()
    hashes = ctrl.page_hashes(toks)
    assert backend.batch_exists(hashes) == 0
    assert backend.batch_get_v1(hashes, host) == [False, False]
    assert backend.batch_set_v1(hashes, host) == [False, False]
    assert backend.get_stats().connected is False
    assert backend.clear() is None  # SGLang's contract; nothing raised


def test_short_value_is_a_miss_not_wrong_kv(kvpool_node):
    """An object of the right name but the wrong size (another writer's bug or
    a stale format) is a miss, and the page is not used."""
    ctrl = make_controller(make_pool("mha", "page_first"), kvpool_node.socket)
    backend = ctrl.storage_backend
    with Client(kvpool_node.socket, namespace=backend.namespace) as raw:
        assert raw.put(["bad_0_1_k", "bad_0_1_v"], [b"x" * 10, b"y" * 10]) == [StatusCode.OK] * 2
    host = ctrl.mem_pool_host.alloc(PAGE)
    assert backend.batch_exists(["bad"]) == 1
    assert backend.batch_get_v1(["bad"], host) == [False]
    assert backend.batch_get(["bad"]) == [None]


def test_malformed_calls_are_misses_not_exceptions(kvpool_node):
    ctrl = make_controller(make_pool("mha", "page_first"), kvpool_node.socket)
    backend, pool = ctrl.storage_backend, ctrl.mem_pool_host
    host = pool.alloc(2 * PAGE)
    ragged = host[:PAGE + 1]  # not whole pages: the pool's meta asserts
    assert backend.batch_get_v1(["a", "b"], ragged) == [False, False]
    assert backend.batch_set_v1(["a", "b"], ragged) == [False, False]
    assert backend.batch_set_v1(["a", "b"], host[:PAGE]) == [False, False]  # one page for two keys
    assert backend.batch_exists([None]) == 0
    assert backend.batch_get(["a"], ["not a tensor"]) == [None]
    assert backend.batch_set(["a"], [torch.zeros(3, 3).t()]) is False
    assert backend.batch_set(["a", "b"], [pool.get_dummy_flat_data_page()]) is False
    assert backend.get_stats().errors >= 3
    assert backend.batch_exists(["a", "b"]) == 0  # nothing was stored


def _wait_stopped(pid):
    """SIGSTOP is asynchronous: wait until /proc says the process is stopped."""
    for _ in range(1000):
        with open("/proc/%d/stat" % pid) as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "T":
                return
        time.sleep(0.005)
    raise AssertionError("node did not stop")


def test_hung_node_is_a_miss_within_the_deadline(kvpool_node):
    ctrl = make_controller(make_pool("mha", "page_first"), kvpool_node.socket,
                           extra={"timeout_ms": 300})
    backend = ctrl.storage_backend
    host, toks, op = write_pages(ctrl, 4, seed=18)
    assert op.ok
    hashes = ctrl.page_hashes(toks)
    kvpool_node.proc.send_signal(signal.SIGSTOP)
    try:
        _wait_stopped(kvpool_node.proc.pid)
        t0 = time.monotonic()
        assert backend.batch_exists(hashes) == 0
        assert backend.batch_get_v1(hashes, host) == [False] * 4
        assert backend.batch_set_v1(hashes, host) == [False] * 4
        assert time.monotonic() - t0 < 3 * 0.3 + 1.5
    finally:
        kvpool_node.proc.send_signal(signal.SIGCONT)
    assert backend.batch_exists(hashes) == 4
    assert backend.batch_get_v1(hashes, host) == [True] * 4
