"""Multi-rank SGLang runs: one process per TP rank, as SGLang runs them,
sharing one kvpool-node. Ranks agree on hit counts the way SGLang's
all-reduce MIN would; here each rank reports and the test compares."""

import multiprocessing as mp
import traceback

from kvpool import Client

N_PAGES = 40


def _rank_main(scenario, rank, socket, barrier, results):
    try:
        import torch

        from sglang_util import fill_random, make_controller, make_pool, same_pages, tokens

        kind = "mla" if scenario == "mla" else "mha"
        dtype = torch.bfloat16 if kind == "mha" else torch.float16
        writer = make_controller(make_pool(kind, "page_first", dtype, seed=rank), socket,
                                 tp_rank=rank, tp_size=2)
        reader = make_controller(make_pool(kind, "page_first", dtype, seed=10 + rank), socket,
                                 tp_rank=rank, tp_size=2)
        pool = writer.mem_pool_host
        host = pool.alloc(N_PAGES * pool.page_size)
        # MHA: each rank holds its own heads (different bytes per rank).
        # MLA: the latent is replicated, identical on every rank.
        fill_random(pool, host, seed=1000 + (rank if kind == "mha" else 0))
        toks = tokens(N_PAGES)
        out = {"rank": rank, "backup_skip": writer.backup_skip}
        if scenario == "clear":
            # Both ranks store, then both clear at once (SGLang flushes every
            # rank): each object is dropped by exactly one of the two calls.
            out["write_ok"] = writer.write_storage(host, toks).ok
            barrier.wait(60)
            out["hits_before_clear"] = reader.storage_backend.batch_exists(
                reader.page_hashes(toks))
            barrier.wait(60)
            out["clear"] = writer.storage_backend.clear()
            barrier.wait(60)
            out["hits_after_clear"] = reader.storage_backend.batch_exists(
                reader.page_hashes(toks))
            out["cleared_entries"] = writer.storage_backend.get_stats().cleared_entries
            writer.detach_storage_backend()
            reader.detach_storage_backend()
            results.put(out)
            return
        if kind == "mha":
            out["write_ok"] = writer.write_storage(host, toks).ok
            barrier.wait(60)
        else:
            if rank == 1:
                out["write_ok"] = writer.write_storage(host, toks).ok  # skipped
            barrier.wait(60)
            out["hits_before_rank0"] = reader.storage_backend.batch_exists(
                reader.page_hashes(toks))
            barrier.wait(60)
            if rank == 0:
                out["write_ok"] = writer.write_storage(host, toks).ok
            barrier.wait(60)
        got = reader.prefetch(toks)
        out["hit_pages"] = got.storage_hit_pages
        out["loaded_pages"] = got.completed_pages
        out["exact"] = same_pages(pool, host, reader.mem_pool_host, got.host_indices, N_PAGES)
        out["hashes"] = writer.page_hashes(toks)[:2]
        out["namespace"] = writer.storage_backend.namespace
        stats = writer.storage_backend.get_stats()
        out["set_ok_pages"], out["set_skipped_pages"] = stats.set_ok_pages, stats.set_skipped_pages
        writer.detach_storage_backend()
        reader.detach_storage_backend()
        results.put(out)
    except BaseException:
        results.put({"rank": rank, "error": traceback.format_exc()})


def run_ranks(scenario, socket):
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(2)
    results = ctx.Queue()
    procs = [ctx.Process(target=_rank_main, args=(scenario, r, socket, barrier, results))
             for r in range(2)]
    for p in procs:
        p.start()
    out = {}
    try:
        for _ in procs:
            r = results.get(timeout=120)
            out[r["rank"]] = r
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    for r in out.values():
        assert "error" not in r, r["error"]
    return out[0], out[1]


def test_tp2_mha_two_processes(kvpool_node):
    r0, r1 = run_ranks("tp2_mha", kvpool_node.socket)
    for r in (r0, r1):
        assert r["backup_skip"] is False and r["write_ok"] is True
        assert (r["hit_pages"], r["loaded_pages"], r["exact"]) == (N_PAGES, N_PAGES, True)
        assert r["set_ok_pages"] == N_PAGES
    assert min(r0["hit_pages"], r1["hit_pages"]) == N_PAGES  # the all-reduce MIN agrees
    assert r0["namespace"] == r1["namespace"]
    h = r0["hashes"][0]
    with Client(kvpool_node.socket, namespace=r0["namespace"]) as raw:
        k0, v0, k1, v1 = raw.get([h + "_0_2_k", h + "_0_2_v", h + "_1_2_k", h + "_1_2_v"])
        assert None not in (k0, v0, k1, v1)
        assert k0 != k1 and v0 != v1  # each rank stored its own heads
        assert raw.exists([h + "_0_1_k"]) == [False]


def test_mla_rank0_writes_every_rank_reads(kvpool_node):
    r0, r1 = run_ranks("mla", kvpool_node.socket)
    assert (r0["backup_skip"], r1["backup_skip"]) == (False, True)
    assert r1["write_ok"] is True and r1["set_skipped_pages"] == 0  # the controller skipped it
    assert r0["hits_before_rank0"] == 0 and r1["hits_before_rank0"] == 0
    assert r0["write_ok"] is True and r0["set_ok_pages"] == N_PAGES
    for r in (r0, r1):
        assert (r["hit_pages"], r["loaded_pages"], r["exact"]) == (N_PAGES, N_PAGES, True)
    h = r0["hashes"][0]
    with Client(kvpool_node.socket, namespace=r0["namespace"]) as raw:
        assert raw.exists([h, h + "_0_2", h + "_1_2"]) == [True, False, False]


def test_every_rank_clears_the_shared_namespace(kvpool_node):
    r0, r1 = run_ranks("clear", kvpool_node.socket)
    for r in (r0, r1):
        assert r["write_ok"] is True and r["clear"] is None
        assert (r["hits_before_clear"], r["hits_after_clear"]) == (N_PAGES, 0)
    assert r0["cleared_entries"] + r1["cleared_entries"] == 2 * 2 * N_PAGES  # K,V per rank
    with Client(kvpool_node.socket) as raw:
        assert raw.stats()["dram"]["entries"] == 0
