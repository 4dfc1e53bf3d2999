"""The vLLM connector with hybrid models (HMA, ENGINES.md §6.3), driven by the
vLLM stand-ins: one full-attention group, one sliding-window group (window 8
tokens = 2 blocks of 4) and one Mamba group ("align" mode), whose layers
share the KV tensors. No --disable-hybrid-kv-cache-manager: the stand-in
factory refuses a connector without SupportsHMA, as vLLM does.
"""

from vllm_util import (BS, client, env, group_page, hashes, page_key, prompt,  # noqa: F401
                       settings)

FULL, SWA, MAMBA = 0, 1, 2


def _groups(engine):
    return [list(g.layer_names) for g in engine.kv_cache_config.kv_cache_groups]


def test_hybrid_round_trip_byte_exact(env, kvpool_node):
    toks = prompt(50)
    a = env.engine(env.config(kvpool_node.socket))
    assert a.scheduler.hybrid and len(a.kv_cache_config.kv_cache_groups) == 3
    out_a = a.run([env.Request("a", toks, max_tokens=3)])
    s = settings(a)
    assert s.hybrid and "groups=full/4,swa8/4,mamba/4" in s.namespace
    # A computed 0-48 (a chunk cut at the last boundary: "align"), 48-50, then
    # decoded to 52: boundaries 12 and 13 (tokens 48 and 52) have Mamba states.
    h = hashes(a.scheduler.requests["a"].all_token_ids, 13)
    with client(kvpool_node, s.namespace) as c:
        stored = {g: [i for i in range(13) if c.exists([page_key(s, h[i], g)])[0]]
                  for g in (FULL, SWA, MAMBA)}
    assert stored == {FULL: list(range(13)),
                      SWA: [10, 11, 12],  # the 2-block window before 12 and before 13
                      MAMBA: [11, 12]}  # the state block of each boundary
    # A fresh instance loads the 48-token prefix: every group's part of it.
    b = env.engine(env.config(kvpool_node.socket))
    req = env.Request("b", toks, max_tokens=3)
    b.add_request(req)
    so, out, _ = b.step()
    assert b.scheduler.external_hits["b"] == 48
    tables = so.scheduled_new_reqs[0].block_ids
    loads = {t.group: t for t in so.kv_connector_metadata.loads}
    assert sorted(loads) == [FULL, SWA, MAMBA]
    assert loads[FULL].block_ids == tables[FULL][:12]
    assert loads[SWA].block_ids == tables[SWA][10:12]
    assert loads[MAMBA].block_ids == [tables[MAMBA][11]]
    # The sliding window's older slots and Mamba's skipped ones are the null block.
    assert tables[SWA][:10] == [0] * 10 and tables[MAMBA][:11] == [0] * 11
    assert all(0 not in t.block_ids for t in so.kv_connector_metadata.loads)
    assert out.kv_connector_output.invalid_block_ids == set()
    with client(kvpool_node, s.namespace) as c:
        for g, idx in ((FULL, range(12)), (SWA, (10, 11)), (MAMBA, (11,))):
            pages = c.get([page_key(s, h[i], g) for i in idx])
            for i, page in zip(idx, pages):
                payload = group_page(b.runner, _groups(b)[g], tables[g][i])
                assert page[32:32 + len(payload)] == payload  # byte-exact
    while b.scheduler.has_unfinished_requests():
        b.step()
    assert b.wrong_kv_block_ids == set() and a.wrong_kv_block_ids == set()
    assert list(req.output_token_ids) == out_a["a"]
    assert env.reference({}, [req])["b"] == out_a["a"]
    assert b.runner.connector.worker_stats["loaded_blocks"] == 15


def test_hybrid_longest_hit_needs_every_group(env, kvpool_node):
    toks = prompt(41)
    eng = env.engine(env.config(kvpool_node.socket))
    s = settings(eng)
    conn = eng.scheduler.connector
    h = hashes(toks, 10)

    def put(group, idx):
        with client(kvpool_node, s.namespace) as c:
            assert c.put([page_key(s, h[i], group) for i in idx], [b"x"] * len(idx)) == \
                [0] * len(idx)

    def hit():
        return conn.get_num_new_matched_tokens(env.Request("q", toks), 0)

    put(FULL, range(10))
    assert hit() == (0, False)  # no Mamba state anywhere: nothing restorable
    put(MAMBA, [9])
    assert hit() == (0, False)  # boundary 10 needs the window blocks 8, 9
    put(SWA, [9])
    assert hit() == (0, False)
    put(SWA, [8])
    assert hit() == (40, False)
    put(MAMBA, [5])
    put(SWA, [4, 5])
    assert hit() == (40, False)  # the longest wins
    with client(kvpool_node, s.namespace) as c:
        c.remove([page_key(s, h[8], SWA)])
    assert hit() == (24, False)  # boundary 6: state block 5, window 4-5
    # Local hits count as present: from 24 tokens on, boundary 10 still lacks block 8.
    assert conn.get_num_new_matched_tokens(env.Request("q", toks), 24) == (0, False)
    with client(kvpool_node, s.namespace) as c:
        c.remove([page_key(s, h[3], FULL)])
    assert hit() == (0, False)  # full attention needs every block


def test_hybrid_lcm_block_size(env, kvpool_node):
    # Mamba blocks of 8 tokens, attention blocks of 4: hits are multiples of 8.
    toks = prompt(47)
    a = env.engine(env.config(kvpool_node.socket, mamba_block_size=8))
    out_a = a.run([env.Request("a", toks, max_tokens=2)])
    s = settings(a)
    assert "mamba/8" in s.namespace
    with client(kvpool_node, s.namespace) as c:
        h8 = hashes(toks, 5, 8)
        assert c.exists([page_key(s, x, MAMBA) for x in h8]) == [False] * 4 + [True]
    b = env.engine(env.config(kvpool_node.socket, mamba_block_size=8))
    req = env.Request("b", toks, max_tokens=2)
    b.add_request(req)
    so, _, _ = b.step()
    assert b.scheduler.external_hits["b"] == 40
    loads = {t.group: t for t in so.kv_connector_metadata.loads}
    tables = so.scheduled_new_reqs[0].block_ids
    assert loads[MAMBA].block_ids == [tables[MAMBA][4]]
    assert loads[FULL].block_ids == tables[FULL][:10]
    while b.scheduler.has_unfinished_requests():
        b.step()
    assert b.wrong_kv_block_ids == set() and list(req.output_token_ids) == out_a["a"]


def test_full_and_sliding_window_only(env, kvpool_node):
    # Without a Mamba group every boundary is reachable: all window blocks are kept.
    types = ("full_attention", "sliding_attention", "sliding_attention", "full_attention")
    kw = dict(layer_types=types, window=6)
    toks = prompt(30)
    a = env.engine(env.config(kvpool_node.socket, **kw))
    out_a = a.run([env.Request("a", toks, max_tokens=2)])
    s = settings(a)
    h = hashes(toks, 7)
    with client(kvpool_node, s.namespace) as c:
        assert c.exists([page_key(s, x, 1) for x in h]) == [True] * 7
    b = env.engine(env.config(kvpool_node.socket, **kw))
    req = env.Request("b", toks, max_tokens=2)
    b.add_request(req)
    so, _, _ = b.step()
    assert b.scheduler.external_hits["b"] == 28
    swa = [t for t in so.kv_connector_metadata.loads if t.group == 1][0]
    # Window 6 -> ceil(5 / 4) = 2 blocks before token 28.
    assert swa.block_ids == so.scheduled_new_reqs[0].block_ids[1][5:7]
    while b.scheduler.has_unfinished_requests():
        b.step()
    assert b.wrong_kv_block_ids == set() and list(req.output_token_ids) == out_a["a"]


def test_mamba_state_not_restorable_reports_nothing(env, kvpool_node):
    toks = prompt(33)
    a = env.engine(env.config(kvpool_node.socket, mamba_mode="none"))
    out = a.run([env.Request("a", toks, max_tokens=2)])
    assert a.runner.connector.worker_stats["saved_blocks"] == 0
    assert a.scheduler.external_hits["a"] == 0
    # Pages stored by an "align" instance do not make a "none" instance load.
    b = env.engine(env.config(kvpool_node.socket))
    b.run([env.Request("b", toks, max_tokens=2)])
    c = env.engine(env.config(kvpool_node.socket, mamba_mode="none"))
    assert c.run([env.Request("c", toks, max_tokens=2)])["c"] == out["a"]
    assert c.scheduler.external_hits["c"] == 0


def test_hybrid_load_failure_fails_the_whole_request(env, kvpool_node):
    toks = prompt(50)
    a = env.engine(env.config(kvpool_node.socket))
    ref = a.run([env.Request("a", toks, max_tokens=2)])["a"]
    s = settings(a)
    b = env.engine(env.config(kvpool_node.socket))
    req = env.Request("b", toks, max_tokens=2)
    b.add_request(req)
    so = b.scheduler.schedule()
    loads = so.kv_connector_metadata.loads
    every = {bid for t in loads for bid in t.block_ids}
    assert len(every) == 15
    h = hashes(toks, 12)
    with client(kvpool_node, s.namespace) as c:  # one window page evicted after the lookup
        assert c.remove([page_key(s, h[11], SWA)]) == [0]
    out = b.runner.execute_model(so)
    # The window before the hit is incomplete, so no block of the load can be
    # trusted to recompute from: all of them are reported.
    assert out.kv_connector_output.invalid_block_ids == every
    b.scheduler.update_from_output(so, out)
    assert req.num_computed_tokens == 0
    while b.scheduler.has_unfinished_requests():
        b.step()
    assert list(req.output_token_ids) == ref
    assert b.wrong_kv_block_ids <= every
    with client(kvpool_node, s.namespace) as c:  # recomputed and saved again
        assert c.exists([page_key(s, h[11], SWA)]) == [True]


def test_unknown_group_kind_disables_the_connector(env, kvpool_node):
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig,
                                            KVCacheGroupSpec)

    from kvpool.integrations.vllm import KvpoolConnector

    class ChunkedLocalAttentionSpec(FullAttentionSpec):
        pass

    kcc = KVCacheConfig(num_blocks=8, kv_cache_groups=[
        KVCacheGroupSpec(["a"], FullAttentionSpec(BS, 4, 8)),
        KVCacheGroupSpec(["b"], ChunkedLocalAttentionSpec(BS, 4, 8))])
    cfg = env.config(kvpool_node.socket)
    conn = KvpoolConnector(cfg, KVConnectorRole.SCHEDULER, kcc)
    assert conn.get_num_new_matched_tokens(env.Request("q", prompt(40)), 0) == (0, False)
    conn.shutdown()
