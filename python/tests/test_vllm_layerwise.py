"""Layer-wise loads and saves and asynchronous external loads of the vLLM
connector (ENGINES.md §6.4), driven by the vLLM stand-ins.

Layer-wise (extra config layerwise=true): one page per (group, block, layer);
start_load_kv queues the loads of every layer and returns,
wait_for_layer_load(name) waits for that layer only, save_kv_layer queues
the layer's save, wait_for_save waits for all of it. Orderings are checked
by holding chosen kvpool calls on a gate.
"""

import threading
import time

from vllm_util import BS, client, env, hashes, page_key, prompt, settings  # noqa: F401

LW = {"layerwise": True}
PLAIN = dict(layer_types=None)


def _engine_with_pages(env, node, toks, **kw):
    """An engine that stored toks' pages, and a fresh engine B."""
    a = env.engine(env.config(node.socket, **kw))
    ref = a.run([env.Request("a", toks, max_tokens=2)])["a"]
    b = env.engine(env.config(node.socket, **kw))
    return a, ref, b


def test_layerwise_pages_round_trip(env, kvpool_node):
    toks = prompt(42)
    a, ref, b = _engine_with_pages(env, kvpool_node, toks, extra=LW, **PLAIN)
    s = settings(a)
    h = hashes(toks, 10)
    names = list(a.kv_cache_config.kv_cache_groups[0].layer_names)
    req = env.Request("b", toks, max_tokens=2)
    b.add_request(req)
    so, out, _ = b.step()
    assert b.scheduler.external_hits["b"] == 40
    ids = so.kv_connector_metadata.loads[0].block_ids
    with client(kvpool_node, s.namespace) as c:
        # One page per layer; the whole-block key does not exist in this mode.
        assert c.exists([page_key(s, h[0], 0)]) == [False]
        for li, name in enumerate(names):
            pages = c.get([page_key(s, x, 0, layer=li) for x in h])
            for bid, page in zip(ids, pages):
                payload = b.runner.layer_block_bytes(name, bid)
                assert page[32:32 + len(payload)] == payload
    while b.scheduler.has_unfinished_requests():
        b.step()
    assert b.wrong_kv_block_ids == set() and list(req.output_token_ids) == ref
    # Whole-block instances and layer-wise ones do not share pages.
    c2 = env.engine(env.config(kvpool_node.socket, **PLAIN))
    c2.run([env.Request("c", toks)])
    assert c2.scheduler.external_hits["c"] == 0


def test_layerwise_hybrid_round_trip(env, kvpool_node):
    toks = prompt(50)
    a, ref, b = _engine_with_pages(env, kvpool_node, toks, extra=LW)
    req = env.Request("b", toks, max_tokens=2)
    b.add_request(req)
    while b.scheduler.has_unfinished_requests():
        b.step()
    assert b.scheduler.external_hits["b"] == 48
    assert b.wrong_kv_block_ids == set() and b.invalid_block_ids == set()
    assert list(req.output_token_ids) == ref


class _Gate:
    """Holds a method of the worker side for chosen arguments until opened,
    and logs when each call finishes."""

    def __init__(self, worker, method, held):
        self.log = []
        self.open = threading.Event()
        self._held = held
        orig = getattr(worker, method)

        def wrapped(*args):
            unit = args[1]
            if self._held(unit):
                assert self.open.wait(10)
            r = orig(*args)
            self.log.append((method, unit.label))
            return r

        setattr(worker, method, wrapped)


def _layer_loaded(runner, name, ids, pages):
    return all(runner.layer_block_bytes(name, bid) == p[32:32 + len(
        runner.layer_block_bytes(name, bid))] for bid, p in zip(ids, pages))


def test_wait_for_layer_load_waits_for_that_layer_only(env, kvpool_node):
    toks = prompt(42)
    a, ref, b = _engine_with_pages(env, kvpool_node, toks, extra=LW, **PLAIN)
    s = settings(a)
    names = list(b.kv_cache_config.kv_cache_groups[0].layer_names)
    with client(kvpool_node, s.namespace) as c:
        pages = [c.get([page_key(s, x, 0, layer=li) for x in hashes(toks, 10)])
                 for li in range(4)]
    b.add_request(env.Request("b", toks, max_tokens=2))
    so = b.scheduler.schedule()
    ids = so.kv_connector_metadata.loads[0].block_ids
    conn = b.runner.connector
    w = conn._worker_side
    gate = _Gate(w, "_read", lambda unit: unit.tag in (b"/L2", b"/L3"))
    conn.bind_connector_metadata(so.kv_connector_metadata)
    t0 = time.monotonic()
    conn.start_load_kv(None)
    assert time.monotonic() - t0 < 1.0  # returned while layers 2 and 3 are held
    conn.wait_for_layer_load(names[0])
    conn.wait_for_layer_load(names[1])
    assert gate.log == [("_read", "g0/L0"), ("_read", "g0/L1")]
    assert _layer_loaded(b.runner, names[0], ids, pages[0])
    assert _layer_loaded(b.runner, names[1], ids, pages[1])
    assert not _layer_loaded(b.runner, names[2], ids, pages[2])
    done = threading.Event()
    waiter = threading.Thread(target=lambda: (conn.wait_for_layer_load(names[2]), done.set()))
    waiter.start()
    assert not done.wait(0.3)  # layer 2 is not loaded yet
    gate.open.set()
    assert done.wait(10)
    waiter.join()
    assert _layer_loaded(b.runner, names[2], ids, pages[2])
    conn.wait_for_layer_load(names[3])
    assert gate.log == [("_read", "g0/L%d" % i) for i in range(4)]
    assert conn.get_block_ids_with_load_errors() == set()
    conn.clear_connector_metadata()


def test_saves_are_queued_and_complete_by_wait_for_save(env, kvpool_node):
    toks = prompt(26)
    e = env.engine(env.config(kvpool_node.socket, extra=LW, **PLAIN))
    s = settings(e)
    names = list(e.kv_cache_config.kv_cache_groups[0].layer_names)
    e.add_request(env.Request("r", toks, max_tokens=1))
    so = e.scheduler.schedule()
    assert [len(t.block_ids) for t in so.kv_connector_metadata.saves] == [6]
    conn = e.runner.connector
    gate = _Gate(conn._worker_side, "_put_unit", lambda unit: True)
    # The runner's per-layer hooks, with every put held: each save_kv_layer returns at once.
    e.runner.record_hooks = True
    finished = threading.Event()
    result = {}

    def run():
        result["out"] = e.runner.execute_model(so)
        finished.set()

    t = threading.Thread(target=run)
    t.start()
    deadline = time.monotonic() + 10
    while len(e.runner.hook_log) < 8 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert e.runner.hook_log == [(k, n) for n in names for k in ("wait", "save")]
    assert not finished.wait(0.3)  # wait_for_save waits for the held puts
    h = hashes(toks, 6)
    with client(kvpool_node, s.namespace) as c:
        assert c.exists([page_key(s, x, 0, layer=li) for li in range(4) for x in h]) == \
            [False] * 24
    gate.open.set()
    assert finished.wait(10)
    t.join()
    # Layers 1-3 as they came, the "/L0" pages (that lookups check) last.
    assert gate.log == [("_put_unit", "g0/L%d" % i) for i in (1, 2, 3, 0)]
    with client(kvpool_node, s.namespace) as c:
        assert c.exists([page_key(s, x, 0, layer=li) for li in range(4) for x in h]) == \
            [True] * 24
    e.scheduler.update_from_output(so, result["out"])
    assert conn.worker_stats["saved_blocks"] == 6


def test_layerwise_errors_as_whole_block_mode(env, kvpool_node):
    toks = prompt(45)
    a, ref, b = _engine_with_pages(env, kvpool_node, toks, extra=LW, **PLAIN)
    s = settings(a)
    h = hashes(toks, 11)
    req = env.Request("b", toks, max_tokens=2)
    b.add_request(req)
    so = b.scheduler.schedule()
    ids = so.kv_connector_metadata.loads[0].block_ids
    with client(kvpool_node, s.namespace) as c:  # one layer of block 3, another of block 7
        assert c.remove([page_key(s, h[3], 0, layer=2), page_key(s, h[7], 0, layer=1)]) == [0, 0]
        # A page of another key in place of block 5's layer 3.
        other = c.get([page_key(s, h[6], 0, layer=3)])[0]
        c.remove([page_key(s, h[5], 0, layer=3)])
        assert c.put([page_key(s, h[5], 0, layer=3)], [other]) == [0]
    out = b.runner.execute_model(so)
    assert out.kv_connector_output.invalid_block_ids == {ids[3], ids[5], ids[7]}
    b.scheduler.update_from_output(so, out)
    while b.scheduler.has_unfinished_requests():
        b.step()
    assert list(req.output_token_ids) == ref
    assert b.wrong_kv_block_ids <= {ids[3], ids[5], ids[7]}
    # The node killed between lookup and load: every planned block is an error.
    c2 = env.engine(env.config(kvpool_node.socket, extra=LW, **PLAIN))
    c2.add_request(env.Request("c", toks, max_tokens=1))
    so = c2.scheduler.schedule()
    planned = {bid for t in so.kv_connector_metadata.loads for bid in t.block_ids}
    assert len(planned) == 11
    kvpool_node.kill()
    out = c2.runner.execute_model(so)
    assert out.kv_connector_output.invalid_block_ids == planned


def test_requires_piecewise_for_cudagraph():
    from kvpool.integrations.vllm import KvpoolConnector

    assert KvpoolConnector.requires_piecewise_for_cudagraph({"layerwise": True}) is True
    assert KvpoolConnector.requires_piecewise_for_cudagraph({"use_layerwise": "true"}) is True
    assert KvpoolConnector.requires_piecewise_for_cudagraph({}) is False


def test_async_external_load(env, kvpool_node):
    toks = prompt(42)
    kw = dict(extra={"load_async_min_tokens": 20}, **PLAIN)
    a, ref, b = _engine_with_pages(env, kvpool_node, toks, **kw)
    conn = b.scheduler.connector
    assert conn.get_num_new_matched_tokens(env.Request("q", toks), 0) == (40, True)
    assert conn.get_num_new_matched_tokens(env.Request("q", toks[:21]), 0) == (20, True)
    assert conn.get_num_new_matched_tokens(env.Request("q", toks[:20]), 0) == (16, False)
    w = b.runner.connector._worker_side
    gate = _Gate(w, "_read", lambda unit: True)
    req = env.Request("b", toks, max_tokens=2)
    b.add_request(req)
    so, out, _ = b.step()
    # Parked: nothing scheduled; the load runs in the background.
    assert so.num_scheduled_tokens == {} and "b" in b.scheduler.waiting_for_remote
    (load,) = so.kv_connector_metadata.loads
    assert load.load_async and len(load.block_ids) == 10
    assert out.kv_connector_output.finished_recving is None
    so, out, _ = b.step()
    assert so.num_scheduled_tokens == {} and out.kv_connector_output.finished_recving is None
    gate.open.set()
    deadline = time.monotonic() + 10
    while not gate.log and time.monotonic() < deadline:
        time.sleep(0.01)
    res = b.runner.connector.get_transfer_results(set())
    assert (res.finished_sending, res.finished_recving, res.failed_recving) == \
        (None, {"b"}, set())
    # What vLLM's next step would have received:
    b.scheduler.finished_recving.add("b")
    so, out, _ = b.step()
    assert so.scheduled_new_reqs[0].num_computed_tokens == 40
    while b.scheduler.has_unfinished_requests():
        b.step()
    assert b.wrong_kv_block_ids == set() and list(req.output_token_ids) == ref
    assert b.scheduler.external_hits["b"] == 40 and b.scheduler.async_loads == {"b"}


def test_async_load_failure_is_finished_and_failed(env, kvpool_node):
    toks = prompt(42)
    kw = dict(extra={"load_async_min_tokens": 20, "layerwise": True}, **PLAIN)
    a, ref, b = _engine_with_pages(env, kvpool_node, toks, **kw)
    s = settings(a)
    h = hashes(toks, 10)
    req = env.Request("b", toks, max_tokens=2)
    b.add_request(req)
    so = b.scheduler.schedule()
    ids = so.kv_connector_metadata.loads[0].block_ids
    with client(kvpool_node, s.namespace) as c:
        assert c.remove([page_key(s, h[6], 0, layer=1)]) == [0]
    conn = b.runner.connector
    conn.bind_connector_metadata(so.kv_connector_metadata)
    conn.start_load_kv(None)
    conn.wait_for_save()
    deadline = time.monotonic() + 10
    results = []
    while time.monotonic() < deadline:
        res = conn.get_transfer_results(set())
        if res.finished_recving:
            results.append(res)
            break
        assert conn.get_block_ids_with_load_errors() == set()  # not before the request
        time.sleep(0.01)
    (res,) = results
    assert (res.finished_recving, res.failed_recving) == ({"b"}, {"b"})
    assert conn.get_block_ids_with_load_errors() == {ids[6]}
    conn.clear_connector_metadata()
    # Through the engine: the failed load is cut back to block 6 and recomputed.
    b2 = env.engine(env.config(kvpool_node.socket, **kw))
    req2 = env.Request("b2", toks, max_tokens=2)
    b2.add_request(req2)
    for _ in range(50):
        b2.step()
        if req2.num_computed_tokens and "b2" not in b2.scheduler.waiting_for_remote:
            break
        time.sleep(0.02)
    assert b2.scheduler.recomputed["b2"] == 40 - 6 * BS
    while b2.scheduler.has_unfinished_requests():
        b2.step()
    assert list(req2.output_token_ids) == ref
