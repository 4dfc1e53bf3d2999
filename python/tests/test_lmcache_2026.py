"""kvpool.integrations.lmcache under both LMCache remote connector contracts
(ENGINES.md §3.2: 2025, §6.2: 2026): the shape of batched_contains, the
2026 base constructor, construction through both registries, list() and
clear(). Tests taking `lm` run once per contract (see test_lmcache.lm)."""

import asyncio

import pytest
import torch

import kvpool
from kvpool.integrations import _lmcache_format as fmt
from test_lmcache import (CHUNK, CONTRACTS, HEAD_SIZE, HEADS, LAYERS, TOKENS, closing_engines,
                          contains_answer, contract_modules, make_config, make_metadata,
                          new_engine)

FIVE = list(range(3000, 3000 + 5 * CHUNK))  # five full chunks
FULL_CHUNK_BYTES = 2 * LAYERS * CHUNK * HEADS * HEAD_SIZE * 2  # float16 KV_2LTD


@pytest.fixture(params=CONTRACTS)
def lm(request, standins_on_path, monkeypatch):
    yield from contract_modules(request.param, monkeypatch)


@pytest.fixture
def lm2026(standins_on_path, monkeypatch):
    yield from contract_modules("2026", monkeypatch)


@pytest.fixture
def engines():
    yield from closing_engines()


def run(e, coro, timeout=10):
    """Runs a connector coroutine on the engine's event loop, as LMCache does."""
    return asyncio.run_coroutine_threadsafe(coro, e.sm.loop).result(timeout)


def test_batched_contains_answers_in_the_base_class_shape(lm, kvpool_node, engines):
    e = new_engine(engines, lm, make_config(lm, kvpool_node.socket), make_metadata(lm))
    keys, expected = e.store(FIVE)
    assert e.connector.stats["stored"] == 5
    assert e.backend.remove(keys[2]) is True
    c, wrapped = e.connector, e.backend.connection
    assert c.support_batched_contains() is True
    assert wrapped.support_batched_contains() is True
    if lm.contract == "2026":
        assert c.CONTAINS_ANSWERS_COUNT is True
        # The base decides, not the arguments: a stop flag given anyway changes nothing.
        answers = [c.batched_contains(keys), c.batched_contains(iter(keys)),
                   c.batched_contains(keys, True), c.batched_contains(keys, False),
                   c.batched_contains(keys, stop_after_first_not_exits=False),
                   wrapped.batched_contains(keys)]
        assert [(type(a), a) for a in answers] == [(int, 2)] * 6
        assert c.batched_contains([]) == 0 and c.batched_contains(keys[3:]) == 2
    else:
        assert c.CONTAINS_ANSWERS_COUNT is False
        stopped, full = [True, True, False, False, False], [True, True, False, True, True]
        assert c.batched_contains(keys) == stopped
        assert c.batched_contains(keys, True) == stopped
        assert c.batched_contains(keys, stop_after_first_not_exits=True) == stopped
        assert c.batched_contains(keys, False) == full
        assert c.batched_contains(keys, stop_after_first_not_exits=False) == full
        assert wrapped.batched_contains(keys) == stopped
        assert c.batched_contains([]) == [] and c.batched_contains(keys[3:]) == [True, True]
    # LMCache's own callers: the same count under both.
    assert e.backend.batched_contains(keys) == 2
    assert e.backend.batched_contains(keys[3:]) == 2
    assert e.backend.batched_async_contains("l1", keys) == 2
    assert run(e, wrapped.batched_async_contains("l2", keys, True)) == 2
    # A prefetch answers the two leading chunks, byte-exact; the later hits
    # it read are released.
    got = e.backend.batched_get_non_blocking("l3", keys).result(10)
    assert len(got) == 2
    e.check_and_release(got, keys[:2], expected[:2])
    e.assert_no_leaks()
    got = e.backend.batched_get_blocking(keys)
    assert [g is not None for g in got] == [True, True, False, True, True]
    e.check_and_release(got[:2] + got[3:], keys[:2] + keys[3:], expected[:2] + expected[3:])
    e.assert_no_leaks()


def test_contract_is_read_from_the_base_signature(lm, dead_socket):
    answers_count = lm.kvlm.base_contains_answers_count

    class Old:
        def batched_contains(self, keys, stop_after_first_not_exits=True): ...

    class New:
        def batched_contains(self, keys): ...

    class Loose:
        def batched_contains(self, keys, *args, **kwargs): ...

    assert (answers_count(Old), answers_count(New), answers_count(Loose),
            answers_count(object)) == (False, True, True, None)
    assert answers_count(lm.base_connector.RemoteConnector) is (lm.contract == "2026")
    # A base without batched_contains (older LMCache): not advertised, and a
    # call still answers the count.
    older = type("Older", (lm.kvlm.KvpoolRemoteConnector,), {"CONTAINS_ANSWERS_COUNT": None})
    c = older(config=make_config(lm, dead_socket), metadata=make_metadata(lm))
    assert c.support_batched_contains() is False
    assert c.batched_contains([]) == 0
    c.close_sync()


def test_2026_base_constructor_sets_the_chunk_layout(lm2026, kvpool_node, engines):
    lm = lm2026
    base = lm.base_connector.RemoteConnector
    e = new_engine(engines, lm, make_config(lm, kvpool_node.socket), make_metadata(lm))
    c = e.connector
    assert (c.save_chunk_meta, c.meta_shapes, c.meta_dtypes, c.meta_fmt) == (
        True, [torch.Size([2, LAYERS, CHUNK, HEADS * HEAD_SIZE])], [torch.float16],
        lm.mm.MemoryFormat.KV_2LTD)
    assert (c.full_chunk_size_bytes, c.single_token_size, c.remote_metadata_bytes) == (
        FULL_CHUNK_BYTES, FULL_CHUNK_BYTES // CHUNK, 28)
    # save_chunk_meta false and MLA: the base's fields follow; kvpool keeps
    # its own header and still round-trips byte-exact, short last chunk too.
    cfg = make_config(lm, kvpool_node.socket, namespace="nometa")
    cfg.extra_config["save_chunk_meta"] = False
    m = new_engine(engines, lm, cfg, make_metadata(lm, torch.bfloat16, mla=True))
    mc = m.connector
    assert (mc.save_chunk_meta, mc.meta_shapes, mc.meta_dtypes, mc.meta_fmt) == (
        False, [torch.Size([1, LAYERS, CHUNK, HEAD_SIZE])], [torch.bfloat16],
        lm.mm.MemoryFormat.KV_MLA_FMT)
    assert mc.full_chunk_size_bytes == LAYERS * CHUNK * HEAD_SIZE * 2
    keys, expected = m.store(TOKENS, seed=4)
    assert m.backend.batched_contains(keys) == 4
    m.check_and_release(m.backend.batched_get_blocking(keys), keys, expected)
    m.assert_no_leaks()
    # The base refuses a connector without metadata: the class_name route
    # (no metadata) must not run it.
    with pytest.raises(AssertionError):
        base.__init__(object.__new__(lm.kvlm.KvpoolRemoteConnector), cfg, None)


def test_adapter_route_built_with_no_arguments(lm, kvpool_node, engines):
    adapter = lm.kvlm.KvpoolConnectorAdapter()
    assert isinstance(adapter, lm.connector.ConnectorAdapter) and adapter.schema == "kvpool://"
    assert [adapter.can_parse(u) for u in ("kvpool:///s.sock", "plugin://kvpool",
                                           "plugin://kvpool.b", "plugin://kvpoolx",
                                           "plugin://redis", "redis://h:1", "")] \
        == [True, True, True, False, False, False, False]

    class NoSchema(lm.connector.ConnectorAdapter):
        def create_connector(self, context):
            raise AssertionError("never chosen")

    # 2026 matches only with a schema; 2025 matched anything with an empty one.
    assert NoSchema().can_parse("kvpool://") is (lm.contract == "2025")
    # Through the plugin registry: the adapter is built with no arguments and
    # reads the metadata from the context.
    md = make_metadata(lm)
    e = new_engine(engines, lm, make_config(lm, kvpool_node.socket), md)
    assert type(e.connector).__name__ == "KvpoolRemoteConnector" and e.connector.metadata is md
    keys, expected = e.store(TOKENS, seed=6)
    e.check_and_release(e.backend.batched_get_blocking(keys), keys, expected)
    e.assert_no_leaks()


def test_class_name_route_takes_the_worker_backends_metadata(lm, kvpool_node, engines):
    cfg = make_config(lm, kvpool_node.socket, plugin="kvpool.w",
                      class_name="KvpoolRemoteConnector")
    md = make_metadata(lm)
    e = new_engine(engines, lm, cfg, md)
    c = e.connector
    assert type(c).__name__ == "KvpoolRemoteConnector" and c.metadata is md
    assert c.settings.socket == kvpool_node.socket
    if lm.contract == "2026":
        assert (c.meta_shapes, c.full_chunk_size_bytes) == (
            [torch.Size([2, LAYERS, CHUNK, HEADS * HEAD_SIZE])], FULL_CHUNK_BYTES)
    keys, expected = e.store(TOKENS, seed=7)
    assert e.backend.batched_contains(keys) == 4
    e.check_and_release(e.backend.batched_get_blocking(keys), keys, expected)
    # The engine's layout is known: chunks of another layer count are misses.
    other = new_engine(engines, lm, make_config(lm, kvpool_node.socket, plugin="kvpool.w",
                                                class_name="KvpoolRemoteConnector"),
                       make_metadata(lm, layers=LAYERS + 1))
    assert other.backend.batched_get_blocking(keys) == [None] * 4
    assert other.connector.stats["rejected_headers"] == 4
    e.assert_no_leaks()
    other.assert_no_leaks()


def test_class_name_route_in_the_scheduler_role(lm, kvpool_node, engines):
    writer = new_engine(engines, lm, make_config(lm, kvpool_node.socket), make_metadata(lm))
    keys, _ = writer.store(TOKENS)
    safe = lm.local_cpu.SafeLocalCPUBackend()
    assert not hasattr(safe, "metadata")
    cfg = make_config(lm, kvpool_node.socket, class_name="KvpoolRemoteConnector")
    s = new_engine(engines, lm, cfg, make_metadata(lm), local_cpu_backend=safe)
    c = s.connector
    assert type(c).__name__ == "KvpoolRemoteConnector" and c.metadata is None
    if lm.contract == "2026":  # the base was not run; its fields say "unknown layout"
        assert (c.save_chunk_meta, c.meta_shapes, c.full_chunk_size_bytes) == (True, [], None)
    assert s.backend.batched_async_contains("x", keys) == 4
    assert s.backend.batched_contains(keys) == 4
    assert c.batched_contains(keys[:2]) == contains_answer(lm, [True, True])
    assert s.backend.batched_get_blocking(keys) == [None] * 4  # cannot allocate here


def test_list_is_unsupported_the_base_way(lm, kvpool_node, engines):
    e = new_engine(engines, lm, make_config(lm, kvpool_node.socket), make_metadata(lm))
    keys, _ = e.store(TOKENS)
    with pytest.raises(NotImplementedError):
        run(e, e.backend.connection.list())
    # The base's own way for what a connector does not support.
    with pytest.raises(NotImplementedError):
        lm.base_connector.RemoteConnector.remove_sync(e.connector, keys[0])
    assert e.backend.batched_contains(keys) == 4  # nothing else changed


def test_clear_drops_this_namespace_only(lm, kvpool_node, engines):
    a = new_engine(engines, lm, make_config(lm, kvpool_node.socket), make_metadata(lm))
    shared = new_engine(engines, lm, make_config(lm, kvpool_node.socket), make_metadata(lm))
    b = new_engine(engines, lm, make_config(lm, kvpool_node.socket, namespace="other"),
                   make_metadata(lm))
    keys, _ = a.store(TOKENS, seed=1)
    b_keys, b_expected = b.store(TOKENS, seed=2)
    assert shared.backend.batched_contains(keys) == 4
    # 4 chunks, each a header and one payload entry.
    assert run(a, a.connector.clear()) == 8
    assert a.backend.batched_contains(keys) == 0
    assert [a.backend.contains(k) for k in keys] == [False] * 4
    assert a.connector.batched_contains(keys, False) == contains_answer(lm, [False] * 4, False)
    assert a.backend.batched_get_blocking(keys) == [None] * 4
    assert shared.backend.batched_async_contains("x", keys) == 0  # same namespace: gone too
    raw = kvpool.Client(kvpool_node.socket, namespace="lmcache")
    s = [k.to_string() for k in keys]
    h = fmt.layout((2, LAYERS, CHUNK, HEADS * HEAD_SIZE), "float16", "KV_2LTD",
                   FULL_CHUNK_BYTES, 1 << 20)
    assert raw.exists([fmt.meta_key(x) for x in s] + fmt.payload_keys(s[0], h)) == [False] * 5
    raw.close()
    # Another namespace keeps every chunk, byte-exact.
    assert b.backend.batched_contains(b_keys) == 4
    b.check_and_release(b.backend.batched_get_blocking(b_keys), b_keys, b_expected)
    assert a.connector.clear_sync() == 0  # nothing left
    keys, expected = a.store(TOKENS, seed=3)  # the namespace is usable again
    a.check_and_release(a.backend.batched_get_blocking(keys), keys, expected)
    for e in (a, shared, b):
        e.assert_no_leaks()


def test_clear_failures_are_reported_not_raised(lm, kvpool_node, dead_socket, engines):
    down = new_engine(engines, lm, make_config(lm, dead_socket), make_metadata(lm))
    assert down.connector.clear_sync() == 0
    assert run(down, down.connector.clear()) == 0
    e = new_engine(engines, lm, make_config(lm, kvpool_node.socket), make_metadata(lm))
    keys, _ = e.store(TOKENS)
    client = e.connector._client

    def failing_clear():
        raise kvpool.KvpoolError(kvpool.StatusCode.UNAVAILABLE, "node went away")

    client.clear = failing_clear
    try:
        errors = e.connector.stats["errors"]
        assert run(e, e.connector.clear()) == 0
        assert e.connector.stats["errors"] == errors + 1
    finally:
        del client.clear
    assert e.backend.batched_contains(keys) == 4  # nothing was dropped
