"""KV events of the vLLM connector (ENGINES.md §6.1): BlockStored for each
block a worker stored in kvpool or loaded from it, from
get_kv_connector_kv_cache_events through KVConnectorOutput to the
scheduler side's take_events (collected per step by the stand-in scheduler
in kv_event_batches)."""

import pytest

from vllm_util import BS, env, prompt  # noqa: F401

PLAIN = dict(layer_types=None)


def _hash(h):
    return int.from_bytes(h[-8:], "big")


def _stored(req, i, group=0, kind="full_attention", window=None, medium="CPU",
            locality="LOCAL", block_size=BS):
    from vllm.distributed.kv_events import BlockStored

    hs = req.block_hashes
    return BlockStored(block_hashes=[_hash(hs[i])],
                       parent_block_hash=_hash(hs[i - 1]) if i else None,
                       token_ids=list(req.all_token_ids[i * block_size:(i + 1) * block_size]),
                       block_size=block_size, lora_id=None, medium=medium, lora_name=None,
                       extra_keys=None, group_idx=group, kv_cache_spec_kind=kind,
                       kv_cache_spec_sliding_window=window, locality=locality, ownership=None)


def test_events_of_saves_and_loads(env, kvpool_node):
    toks = prompt(13)
    a = env.engine(env.config(kvpool_node.socket, events=True, **PLAIN))
    ra = env.Request("a", toks, max_tokens=2)
    a.run([ra])
    # Step 1 stored blocks 0-2 (12 of the 13 prompt tokens); step 2 (token 13)
    # completed no block.
    assert a.scheduler.kv_event_batches == [[_stored(ra, i) for i in range(3)]]
    b = env.engine(env.config(kvpool_node.socket, events=True, **PLAIN))
    rb = env.Request("b", toks + [5, 6, 7, 8], max_tokens=1)
    b.run([rb])
    # B loaded blocks 0-2, then stored block 3 (tokens 12-15) and nothing else.
    assert b.scheduler.external_hits["b"] == 12
    assert b.scheduler.kv_event_batches == [[_stored(rb, i) for i in range(4)]]
    assert [e.token_ids for e in b.scheduler.kv_event_batches[0]] == \
        [toks[0:4], toks[4:8], toks[8:12], toks[12:13] + [5, 6, 7]]
    # A failed load reports no event; a block to save that kvpool already has does.
    c = env.engine(env.config(kvpool_node.socket, events=True, **PLAIN))
    import kvpool
    from vllm_util import hashes, page_key, settings

    s = settings(c)
    with kvpool.Client(kvpool_node.socket, namespace=s.namespace) as cl:
        assert cl.remove([page_key(s, hashes(toks, 3)[1], 0)]) == [0]
    rc = env.Request("c", toks, max_tokens=1)
    c.run([rc])
    assert c.scheduler.external_hits["c"] == 4
    assert c.scheduler.kv_event_batches == [[_stored(rc, 0), _stored(rc, 1), _stored(rc, 2)]]


def test_hybrid_events_carry_group_and_spec(env, kvpool_node):
    toks = prompt(49)
    a = env.engine(env.config(kvpool_node.socket, events=True))
    ra = env.Request("a", toks, max_tokens=1)
    a.run([ra])
    # Step 1 computed tokens 0-48: full blocks 0-11, the window (2 blocks)
    # before boundary 12 and the Mamba state block of that boundary.
    want = ([_stored(ra, i) for i in range(12)]
            + [_stored(ra, i, 1, "sliding_window", 8) for i in (10, 11)]
            + [_stored(ra, 11, 2, "mamba")])
    assert a.scheduler.kv_event_batches == [want]
    b = env.engine(env.config(kvpool_node.socket, events=True))
    rb = env.Request("b", toks, max_tokens=1)
    b.run([rb])
    assert b.scheduler.external_hits["b"] == 48
    assert b.scheduler.kv_event_batches == [
        [_stored(rb, i) for i in range(12)]
        + [_stored(rb, i, 1, "sliding_window", 8) for i in (10, 11)]
        + [_stored(rb, 11, 2, "mamba")]]


def test_event_settings_and_off_by_default(env, kvpool_node):
    toks = prompt(9)
    off = env.engine(env.config(kvpool_node.socket, **PLAIN))
    off.run([env.Request("o", toks)])
    assert off.scheduler.kv_event_batches == []
    assert off.runner.connector.get_kv_connector_kv_cache_events() is None
    # A node whose pages live on SSD: the medium is a setting.
    e = env.engine(env.config(kvpool_node.socket, extra={"event_medium": "STORAGE",
                                                         "kv_events": True}, **PLAIN))
    r = env.Request("s", toks)
    e.run([r])
    assert e.scheduler.kv_event_batches == [[_stored(r, i, medium="STORAGE")
                                             for i in range(2)]]


def test_remote_mode_locality_and_byte_hashes(env, monkeypatch):
    from kvpool.integrations import _vllm_events as ev
    from kvpool.integrations.vllm import _Settings

    s = _Settings(env.config(None, extra={"remote": "127.0.0.1:1"}, **PLAIN))
    assert s.locality == "REMOTE" and _Settings(env.config(None, **PLAIN)).locality == "LOCAL"
    h = bytes(range(32))
    assert ev.event_hash(h) == int.from_bytes(bytes(range(24, 32)), "big")
    assert ev.event_hash((1 << 70) + 5) == 5
    monkeypatch.setenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "0")
    assert ev.event_hash(h) == h


def test_layerwise_async_load_events(env, kvpool_node):
    toks = prompt(21)
    kw = dict(extra={"layerwise": True, "load_async_min_tokens": 8}, events=True, **PLAIN)
    a = env.engine(env.config(kvpool_node.socket, **kw))
    a.run([env.Request("a", toks, max_tokens=1)])
    b = env.engine(env.config(kvpool_node.socket, **kw))
    rb = env.Request("b", toks + [9, 9, 9, 9], max_tokens=1)
    b.run([rb])
    assert b.scheduler.async_loads == {"b"} and b.scheduler.external_hits["b"] == 20
    # Once per block, not per layer page: the 5 loaded in the background, then block 5 saved.
    flat = [e for batch in b.scheduler.kv_event_batches for e in batch]
    assert flat == [_stored(rb, i) for i in range(6)]


def test_tp2_events_are_those_every_rank_stored(env, kvpool_node):
    toks = prompt(13)
    a = env.engine(env.config(kvpool_node.socket, events=True, tp=2, **PLAIN))
    ra = env.Request("a", toks, max_tokens=1)
    a.run([ra])
    # Each rank stored its shard of blocks 0-2: one event per block, not two.
    assert a.scheduler.kv_event_batches == [[_stored(ra, i) for i in range(3)]]


@pytest.mark.parametrize("tp", [2, 4])
def test_tp_events_through_vllms_aggregator_are_each_yielded_once(env, kvpool_node, tp):
    # The stand-in engine merges the workers' containers as vLLM's
    # KVOutputAggregator does (add_events, increment_workers): no
    # AttributeError, and each block every rank stored is told once.
    toks = prompt(13)
    a = env.engine(env.config(kvpool_node.socket, events=True, tp=tp, **PLAIN))
    ra = env.Request("a", toks, max_tokens=1)
    a.run([ra])
    assert a.scheduler.kv_event_batches == [[_stored(ra, i) for i in range(3)]]


def test_the_container_is_vllms_kind_and_follows_its_aggregator(env):
    from vllm.distributed.kv_events import KVConnectorKVEvents
    from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator
    from kvpool.integrations._vllm_events import KvpoolKVEvents, common_events

    assert issubclass(KvpoolKVEvents, KVConnectorKVEvents)
    x, y, z = ("e1",), ("e2",), ("e3",)
    workers = [KvpoolKVEvents([("save", x), ("save", y), ("load", z)]),
               KvpoolKVEvents([("save", x), ("load", z)]),
               KvpoolKVEvents([("save", x), ("save", y), ("load", z)])]
    combined = KVOutputAggregator.aggregate_events(workers)
    assert combined is workers[0] and combined.get_number_of_workers() == 3
    assert common_events(combined) == [x, z]  # y: one rank did not store it
    assert combined.get_number_of_workers() == 1  # aggregate() reset it
    # MLA: only rank 0 writes; its stores count, loads need every rank.
    mla = [KvpoolKVEvents([("save", x), ("load", z)]),
           KvpoolKVEvents([("load", z)], writer=False),
           KvpoolKVEvents([("load", z)], writer=False)]
    assert common_events(KVOutputAggregator.aggregate_events(mla)) == [x, z]
    # A negative control: without the ABC's methods the aggregator fails.
    class Bare:
        def get_all_events(self):
            return []
    with pytest.raises(AttributeError):
        KVOutputAggregator.aggregate_events([Bare(), Bare()])


def test_aggregate_keeps_events_every_worker_reported():
    from kvpool.integrations._vllm_events import KvpoolKVEvents

    x, y, z = ("e1",), ("e2",), ("e3",)
    r0 = KvpoolKVEvents([("save", x), ("save", y), ("load", z)])
    r1 = KvpoolKVEvents([("save", x), ("load", z)])
    assert r0.aggregate(r1).get_common_events() == [x, z]
    # MLA: only rank 0 writes; its saves count, loads need every rank.
    m0 = KvpoolKVEvents([("save", x), ("load", z)])
    m1 = KvpoolKVEvents([], writer=False)
    assert m0.aggregate(m1).get_common_events() == [x]
    assert m0.get_all_events() == [x, z]
