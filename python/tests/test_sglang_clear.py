"""clear() of kvpool's SGLang HiCache backend (a flush of the HiCache
storage): every object of the backend's namespace dropped on the node in
one call, other namespaces untouched, the node's DRAM given back."""

from kvpool import Client, StatusCode
from sglang_util import (PAGE, make_controller, make_hybrid_controller, make_pool, same_pages,
                         write_hybrid, write_pages)


def dram(sock):
    with Client(sock) as c:
        d = c.stats()["dram"]
    return d["entries"], d["used_bytes"]


def test_clear_drops_the_namespace_at_once(kvpool_node):
    sock = kvpool_node.socket
    a = make_hybrid_controller(sock, seed=1)
    ns = a.storage_backend.namespace
    # Other namespaces: another deployment's tag, names that extend or cut
    # A's namespace, and the empty one.
    blue = make_controller(make_pool("mha", "page_first", seed=2), sock,
                           extra={"namespace": "blue"})
    b_host, b_toks, op = write_pages(blue, 6, seed=50)
    assert op.ok
    raws = {n: Client(sock, namespace=n) for n in (ns + "x", ns[:-1], "")}
    try:
        for n, raw in raws.items():
            assert raw.put(["k1", "k2"], [b"v" * 100, b"w" * 300]) == [StatusCode.OK] * 2
        others = dram(sock)
        assert others[0] == 12 + 6

        host, toks, slots, op = write_hybrid(a, 10, seed=51)
        assert op.ok
        entries, used = dram(sock)
        assert entries == others[0] + 20 + 10 + 3 + 1  # KV K+V, indexer, SWA window, Mamba
        assert used > others[1]
        hashes = a.page_hashes(toks)
        with Client(sock, namespace=ns) as raw_a:
            objects = [h + "_0_1_k" for h in hashes] + [h + "_0_1_v" for h in hashes]
            assert raw_a.exists(objects) == [True] * 20

            assert a.flush_storage() is None  # the controller's flush calls clear()

            assert raw_a.exists(objects) == [False] * 20
        assert dram(sock) == others  # every object of A's namespace and its bytes are gone
        stats = a.storage_backend.get_stats()
        assert (stats.clears, stats.cleared_entries) == (1, 34)
        assert a.storage_backend.batch_exists(hashes) == 0
        fresh = make_hybrid_controller(sock, seed=3)
        got = fresh.prefetch(toks)
        assert (got.storage_hit_pages, got.completed_pages) == (0, 0)

        # The other namespaces kept everything.
        for n, raw in raws.items():
            assert raw.get(["k1", "k2"]) == [b"v" * 100, b"w" * 300], n
        reader = make_controller(make_pool("mha", "page_first", seed=4), sock,
                                 extra={"namespace": "blue"})
        got = reader.prefetch(b_toks)
        assert got.completed_pages == 6
        assert same_pages(blue.mem_pool_host, b_host, reader.mem_pool_host, got.host_indices, 6)

        # The backend goes on: what it stores after the clear is found.
        assert a.write_storage(host, toks, {"swa": slots["swa"], "mamba": slots["mamba"]}).ok
        got = fresh.prefetch(toks)
        assert (got.storage_hit_pages, got.pool_loaded_pages) == (
            10, {"mamba": 1, "swa": 3, "indexer": 10})
        assert a.storage_backend.clear() is None
        assert dram(sock) == others
        assert a.storage_backend.get_stats().cleared_entries == 34 + 34
    finally:
        for raw in raws.values():
            raw.close()


def test_one_rank_clears_every_ranks_pages(kvpool_node):
    """TP ranks share one namespace: the first rank's clear drops every
    rank's pages; the next rank's clear finds nothing left to drop."""
    sock = kvpool_node.socket
    ranks = [make_controller(make_pool("mha", "page_first", seed=r), sock, tp_rank=r, tp_size=2)
             for r in range(2)]
    assert ranks[0].storage_backend.namespace == ranks[1].storage_backend.namespace
    written = [write_pages(c, 5, seed=60 + r) for r, c in enumerate(ranks)]
    assert all(op.ok for _, _, op in written)
    toks = written[0][1]
    assert [c.prefetch(toks).completed_pages for c in ranks] == [5, 5]
    assert ranks[1].storage_backend.clear() is None
    assert [c.prefetch(toks).storage_hit_pages for c in ranks] == [0, 0]
    assert dram(sock) == (0, 0)
    assert ranks[0].storage_backend.clear() is None
    cleared = [c.storage_backend.get_stats().cleared_entries for c in ranks]
    assert cleared == [0, 20]  # 5 pages x K,V x 2 ranks, dropped once


def test_clear_with_the_node_gone_is_logged_not_raised(kvpool_node):
    sock = kvpool_node.socket
    ctrl = make_controller(make_pool("mha", "page_first"), sock)
    be = ctrl.storage_backend
    host, toks, op = write_pages(ctrl, 3, seed=70)
    assert op.ok
    errors = be.get_stats().errors
    kvpool_node.kill()
    assert be.clear() is None
    stats = be.get_stats()
    assert (stats.clears, stats.cleared_entries, stats.errors) == (0, 0, errors + 1)
    kvpool_node.start()  # empty again
    assert ctrl.write_storage(host, toks).ok
    assert be.clear() is None
    stats = be.get_stats()
    assert (stats.clears, stats.cleared_entries) == (1, 6)
    assert be.batch_exists(ctrl.page_hashes(toks)) == 0
    be.close()
    assert be.clear() is None  # closed: nothing to clear, nothing raised
    assert be.get_stats().clears == 1


def test_clear_keeps_pages_of_another_page_size(kvpool_node):
    """Instances that differ in what the namespace holds (page size here) are
    not cleared by each other."""
    sock = kvpool_node.socket
    a = make_controller(make_pool("mha", "page_first"), sock)
    b = make_controller(make_pool("mha", "page_first", page_size=2 * PAGE), sock)
    _, ta, op = write_pages(a, 4, seed=71)
    assert op.ok
    _, tb, op = write_pages(b, 4, seed=72)
    assert op.ok
    assert a.storage_backend.clear() is None
    assert a.prefetch(ta).storage_hit_pages == 0
    assert b.prefetch(tb).completed_pages == 4
    assert dram(sock)[0] == 8
