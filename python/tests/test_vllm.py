"""The vLLM connector (kvpool.integrations.vllm) driven by the vLLM stand-ins.

Each "instance" is a stand-in EngineCore (scheduler + model runner(s)) whose
connector is selected as in vLLM: kv_connector + kv_connector_module_path.
Instances share one real kvpool-node. The model runner checks, byte for
byte, the KV every attention layer reads (wrong_kv_block_ids), and the
sampled tokens hash the KV, so wrong KV would also change the outputs.
"""

import pickle

import pytest
import torch

BS = 4
NUM_BLOCKS = 64


@pytest.fixture
def vllm_env(standins_on_path):
    from vllm.config import (CacheConfig, KVTransferConfig, ModelConfig, ParallelConfig,
                             SchedulerConfig, VllmConfig)
    from vllm.v1.engine.core import EngineCore
    from vllm.v1.request import Request as RequestClass

    class Env:
        engines = []

        @staticmethod
        def config(socket=None, dtype=torch.bfloat16, mla=False, tp=1, role="kv_both",
                   max_tokens_per_step=2048, head_dim=8, connector=True):
            ktc = None
            if connector:
                ktc = KVTransferConfig(
                    kv_connector="KvpoolConnector",
                    kv_connector_module_path="kvpool.integrations.vllm", kv_role=role,
                    kv_connector_extra_config={"kvpool_socket": socket,
                                               "kvpool_retry_interval_s": 0,
                                               "kvpool_timeout_ms": 3000})
            return VllmConfig(
                model_config=ModelConfig(model="test/model", dtype=dtype, use_mla=mla,
                                         num_hidden_layers=4, num_key_value_heads=4,
                                         head_dim=head_dim, kv_lora_rank=24, qk_rope_head_dim=8),
                cache_config=CacheConfig(block_size=BS),
                parallel_config=ParallelConfig(tensor_parallel_size=tp),
                scheduler_config=SchedulerConfig(max_num_batched_tokens=max_tokens_per_step),
                kv_transfer_config=ktc)

        @classmethod
        def engine(cls, cfg, layout="flash_attn"):
            e = EngineCore(cfg, NUM_BLOCKS, layout)
            cls.engines.append(e)
            return e

        Request = RequestClass

    yield Env
    for e in Env.engines:
        e.shutdown()


def prompt(n, start=1000):
    return [start + 7 * i % 5003 for i in range(n)]


def reference_outputs(env, reqs, mla=False, layout="flash_attn", dtype=torch.bfloat16, tp=1):
    e = env.engine(env.config(connector=False, mla=mla, dtype=dtype, tp=tp), layout)
    return e.run([env.Request(r.request_id, r.prompt_token_ids, max_tokens=r.max_tokens)
                  for r in reqs])


def page_keys(cfg, tokens, nblocks, tp_rank=0):
    from kvpool.integrations import _vllm_keys as k

    ns, mla = k.namespace(cfg)
    from vllm.v1.request import Request

    hashes = k.BlockHasher(Request("k", tokens), BS).upto(nblocks)
    return ns, [h + k.rank_suffix(mla, tp_rank, 0) for h in hashes]


def client(node, ns):
    import kvpool

    return kvpool.Client(node.socket, namespace=ns)


LAYOUTS_MHA = ["flash_attn", "flash_attn_block_major", "flashinfer_nhd", "flashinfer_hnd",
               "standard_blhnc"]
LAYOUTS_MLA = ["mla", "standard_mla"]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("layout", LAYOUTS_MHA + LAYOUTS_MLA)
def test_round_trip_byte_exact(vllm_env, kvpool_node, dtype, layout):
    mla = layout in LAYOUTS_MLA
    cfg = vllm_env.config(kvpool_node.socket, dtype=dtype, mla=mla)
    toks = prompt(50)
    a = vllm_env.engine(cfg, layout)
    out_a = a.run([vllm_env.Request("a", toks, max_tokens=3)])
    # A fresh engine B loads A's pages; B's loaded blocks must be the stored bytes.
    b = vllm_env.engine(vllm_env.config(kvpool_node.socket, dtype=dtype, mla=mla), layout)
    req = vllm_env.Request("b", toks, max_tokens=3)
    b.add_request(req)
    so, out, _ = b.step()
    # 50 prompt tokens: 12 full blocks loadable (the 13th would leave nothing to compute).
    assert b.scheduler.external_hits["b"] == 48
    loads = so.kv_connector_metadata.loads
    assert [len(t.block_ids) for t in loads] == [12]
    assert out.kv_connector_output.invalid_block_ids == set()
    ns, keys = page_keys(cfg, toks, 12)
    with client(kvpool_node, ns) as c:
        pages = c.get(keys)
    for bid, page in zip(loads[0].block_ids, pages):
        assert page is not None
        payload = b.runner.block_bytes(bid)
        assert page[32:32 + len(payload)] == payload  # byte-exact: kvpool page == B's block
    while b.scheduler.has_unfinished_requests():
        b.step()
    assert b.wrong_kv_block_ids == set() and a.wrong_kv_block_ids == set()
    assert {"b": out_a["a"]} == {"b": list(req.output_token_ids)}
    assert reference_outputs(vllm_env, [req], mla=mla, layout=layout, dtype=dtype)["b"] == out_a["a"]
    assert b.runner.connector.worker_stats["loaded_blocks"] == 12


def test_pages_shared_across_backend_layouts(vllm_env, kvpool_node):
    toks = prompt(41)
    a = vllm_env.engine(vllm_env.config(kvpool_node.socket), "flash_attn")
    out_a = a.run([vllm_env.Request("a", toks, max_tokens=2)])
    b = vllm_env.engine(vllm_env.config(kvpool_node.socket), "flashinfer_hnd")
    out_b = b.run([vllm_env.Request("b", toks, max_tokens=2)])
    assert b.scheduler.external_hits["b"] == 40
    assert b.wrong_kv_block_ids == set() and out_b["b"] == out_a["a"]
    # The standardized views are their own page family: another family's page
    # is a load error (recomputed), never KV.
    c = vllm_env.engine(vllm_env.config(kvpool_node.socket), "standard_blhnc")
    req = vllm_env.Request("c", toks, max_tokens=2)
    c.add_request(req)
    so, out, _ = c.step()
    assert out.kv_connector_output.invalid_block_ids == set(so.kv_connector_metadata.loads[0].block_ids)
    while c.scheduler.has_unfinished_requests():
        c.step()
    assert list(req.output_token_ids) == out_a["a"]


def test_two_instances_share_prefix(vllm_env, kvpool_node):
    prefix = prompt(32)
    # A prefills in 12-token chunks, so its pages are saved over several steps.
    a = vllm_env.engine(vllm_env.config(kvpool_node.socket, max_tokens_per_step=12))
    a.run([vllm_env.Request("a", prefix + prompt(9, 7), max_tokens=2)])
    assert a.runner.connector.worker_stats["saved_blocks"] == 10  # 41 + 1 decoded -> 10 full
    b = vllm_env.engine(vllm_env.config(kvpool_node.socket))
    # B first caches 3 blocks locally, then asks for the shared prefix plus its own suffix:
    # kvpool supplies exactly the 5 blocks past B's local hit.
    b.run([vllm_env.Request("b0", prefix[:13], max_tokens=1)])
    assert b.scheduler.external_hits["b0"] == 12
    req = vllm_env.Request("b1", prefix + prompt(11, 9), max_tokens=3)
    b.add_request(req)
    so, out, _ = b.step()
    assert so.scheduled_new_reqs[0].num_computed_tokens == 32
    assert b.scheduler.external_hits["b1"] == 32 - 12
    assert [len(t.block_ids) for t in so.kv_connector_metadata.loads] == [5]
    assert so.kv_connector_metadata.loads[0].block_ids == so.scheduled_new_reqs[0].block_ids[0][3:8]
    while b.scheduler.has_unfinished_requests():
        b.step()
    assert b.wrong_kv_block_ids == set()
    assert list(req.output_token_ids) == reference_outputs(vllm_env, [req])["b1"]


def test_scheduler_side_effect_free_capped_and_picklable(vllm_env, kvpool_node):
    from vllm.v1.core.sched.output import CachedRequestData, SchedulerOutput

    toks = prompt(48)  # a whole number of blocks
    a = vllm_env.engine(vllm_env.config(kvpool_node.socket))
    a.run([vllm_env.Request("a", toks, max_tokens=2)])
    b = vllm_env.engine(vllm_env.config(kvpool_node.socket))
    conn = b.scheduler.connector
    req = vllm_env.Request("b", toks, max_tokens=1)
    # All 12 blocks are stored, but one token must stay to compute: 11 blocks.
    assert conn.get_num_new_matched_tokens(req, 0) == (44, False)
    assert conn.get_num_new_matched_tokens(req, 0) == (44, False)
    assert conn.get_num_new_matched_tokens(req, 8) == (36, False)
    assert conn.get_num_new_matched_tokens(req, 44) == (0, False)
    empty = SchedulerOutput([], CachedRequestData(), {}, 0, set())
    meta = conn.build_connector_meta(empty)
    assert meta.loads == [] and meta.saves == []  # the queries left no state behind
    b.add_request(req)
    so, _, _ = b.step()
    meta = so.kv_connector_metadata
    copy = pickle.loads(pickle.dumps(meta))
    assert copy == meta and len(copy.loads[0].block_ids) == 11
    # The last prompt block is computed this step, so it is planned for saving
    # (the worker skips pages kvpool already has).
    assert [t.block_ids for t in copy.saves] == [[so.scheduled_new_reqs[0].block_ids[0][11]]]
    assert conn.request_finished(req, []) == (False, None)


def test_role_producer_saves_consumer_loads(vllm_env, kvpool_node):
    toks = prompt(30)
    c = vllm_env.engine(vllm_env.config(kvpool_node.socket, role="kv_consumer"))
    c.run([vllm_env.Request("c", toks, max_tokens=1)])
    assert c.runner.connector.worker_stats["saved_blocks"] == 0
    p = vllm_env.engine(vllm_env.config(kvpool_node.socket, role="kv_producer"))
    p.run([vllm_env.Request("p", toks, max_tokens=1)])
    assert p.scheduler.external_hits["p"] == 0
    assert p.runner.connector.worker_stats["saved_blocks"] == 7
    c2 = vllm_env.engine(vllm_env.config(kvpool_node.socket, role="kv_consumer"))
    c2.run([vllm_env.Request("c2", toks, max_tokens=1)])
    assert c2.scheduler.external_hits["c2"] == 28 and c2.wrong_kv_block_ids == set()


def test_node_down_at_start(vllm_env, dead_socket):
    toks = prompt(37)
    e = vllm_env.engine(vllm_env.config(dead_socket))
    out = e.run([vllm_env.Request("x", toks, max_tokens=3), vllm_env.Request("y", toks, max_tokens=2)])
    assert e.scheduler.external_hits == {"x": 0, "y": 0}
    assert e.invalid_block_ids == set() and e.wrong_kv_block_ids == set()
    ref = reference_outputs(vllm_env, [vllm_env.Request("x", toks, max_tokens=3),
                                      vllm_env.Request("y", toks, max_tokens=2)])
    assert out == ref
    stats = e.runner.connector.worker_stats
    assert stats["saved_blocks"] == 0 and stats["failed_saves"] > 0


def test_node_killed_mid_run(vllm_env, kvpool_node):
    toks = prompt(45)
    a = vllm_env.engine(vllm_env.config(kvpool_node.socket))
    ref = a.run([vllm_env.Request("a", toks, max_tokens=2)])["a"]
    b = vllm_env.engine(vllm_env.config(kvpool_node.socket))
    req = vllm_env.Request("b", toks, max_tokens=2)
    b.add_request(req)
    so = b.scheduler.schedule()  # hits counted while the node was up
    planned = set(so.kv_connector_metadata.loads[0].block_ids)
    assert len(planned) == 11
    kvpool_node.kill()
    out = b.runner.execute_model(so)
    # Every planned load failed, and exactly those blocks are reported.
    assert out.kv_connector_output.invalid_block_ids == planned
    assert out.wrong_kv_block_ids <= planned
    b.scheduler.update_from_output(so, out)
    while b.scheduler.has_unfinished_requests():
        b.step()
    assert list(req.output_token_ids) == ref
    # A new request while the node is down: zero hits, no exception.
    assert b.run([vllm_env.Request("c", toks, max_tokens=1)])["c"] == ref[:1]
    assert b.scheduler.external_hits["c"] == 0
    # The node comes back (empty): the connector reconnects and stores again.
    kvpool_node.start()
    b.run([vllm_env.Request("d", toks, max_tokens=1)])
    assert b.runner.connector.worker_stats["saved_blocks"] == 11


@pytest.mark.parametrize("one_page_chunks", [False, True])
def test_partial_miss_reports_exactly_the_failed_blocks(vllm_env, kvpool_node, monkeypatch,
                                                        one_page_chunks):
    if one_page_chunks:  # a load staged one page at a time
        from kvpool.integrations import _vllm_worker
        monkeypatch.setattr(_vllm_worker, "_LOAD_CHUNK_BYTES", 1)
    toks = prompt(45)
    cfg = vllm_env.config(kvpool_node.socket)
    a = vllm_env.engine(cfg)
    ref = a.run([vllm_env.Request("a", toks, max_tokens=2)])["a"]
    b = vllm_env.engine(vllm_env.config(kvpool_node.socket))
    req = vllm_env.Request("b", toks, max_tokens=2)
    b.add_request(req)
    so = b.scheduler.schedule()
    ids = so.kv_connector_metadata.loads[0].block_ids
    ns, keys = page_keys(cfg, toks, 11)
    with client(kvpool_node, ns) as c:  # evicted between the lookup and the load
        assert c.remove([keys[3], keys[7]]) == [0, 0]
    out = b.runner.execute_model(so)
    assert out.kv_connector_output.invalid_block_ids == {ids[3], ids[7]}
    assert out.wrong_kv_block_ids <= {ids[3], ids[7]}
    b.scheduler.update_from_output(so, out)
    assert req.num_computed_tokens == 3 * BS  # recompute from the first failed block
    while b.scheduler.has_unfinished_requests():
        b.step()
    assert list(req.output_token_ids) == ref and b.wrong_kv_block_ids <= {ids[3], ids[7]}
    with client(kvpool_node, ns) as c:  # the recomputed blocks were saved again
        assert c.exists(keys) == [True] * 11


def test_foreign_pages_are_load_errors_never_kv(vllm_env, kvpool_node):
    from kvpool.integrations._vllm_layout import MAGIC

    toks = prompt(45)
    cfg = vllm_env.config(kvpool_node.socket)
    a = vllm_env.engine(cfg)
    ref = a.run([vllm_env.Request("a", toks, max_tokens=1)])["a"]
    ns, keys = page_keys(cfg, toks, 11)
    with client(kvpool_node, ns) as c:
        good = c.get(keys)
        size = len(good[0])
        # 2: same size, another geometry; 4: the page of another key;
        # 6: a shorter page; 8: a longer one.
        forged = {2: MAGIC + b"\x01" * 16 + good[2][24:32] + good[2][32:],
                  4: good[5], 6: good[6][:size - 64], 8: good[8] + b"\0" * 64}
        assert c.remove([keys[i] for i in forged]) == [0] * 4
        assert c.put([keys[i] for i in forged], list(forged.values())) == [0] * 4
    b = vllm_env.engine(vllm_env.config(kvpool_node.socket))
    req = vllm_env.Request("b", toks, max_tokens=1)
    b.add_request(req)
    so = b.scheduler.schedule()
    ids = so.kv_connector_metadata.loads[0].block_ids
    bad = {ids[i] for i in forged}
    before = {bid: b.runner.block_bytes(bid) for bid in bad}
    b.runner.connector.bind_connector_metadata(so.kv_connector_metadata)
    b.runner.connector.start_load_kv(None)
    assert b.runner.connector.get_block_ids_with_load_errors() == bad
    assert {bid: b.runner.block_bytes(bid) for bid in bad} == before  # not a byte written
    b.runner.connector.clear_connector_metadata()
    # The full step as vLLM runs it: the same blocks reported, the output unaffected.
    out = b.runner.execute_model(so)
    assert out.kv_connector_output.invalid_block_ids == bad
    b.scheduler.update_from_output(so, out)
    while b.scheduler.has_unfinished_requests():
        b.step()
    assert list(req.output_token_ids) == ref
    assert b.wrong_kv_block_ids <= bad


def test_other_geometry_is_another_namespace(vllm_env, kvpool_node):
    toks = prompt(33)
    vllm_env.engine(vllm_env.config(kvpool_node.socket)).run([vllm_env.Request("a", toks)])
    for cfg in (vllm_env.config(kvpool_node.socket, head_dim=16),
                vllm_env.config(kvpool_node.socket, dtype=torch.float16),
                vllm_env.config(kvpool_node.socket, mla=True)):
        e = vllm_env.engine(cfg, "mla" if cfg.model_config.use_mla else "flash_attn")
        e.run([vllm_env.Request("x", toks)])
        assert e.scheduler.external_hits["x"] == 0 and e.invalid_block_ids == set()


def test_tp2_mha_two_processes(vllm_env, kvpool_node):
    toks = prompt(42)
    cfg = vllm_env.config(kvpool_node.socket, tp=2)
    a = vllm_env.engine(cfg)
    out_a = a.run([vllm_env.Request("a", toks, max_tokens=2)])
    ns, k0 = page_keys(cfg, toks, 10, tp_rank=0)
    _, k1 = page_keys(cfg, toks, 10, tp_rank=1)
    with client(kvpool_node, ns) as c:
        p0, p1 = c.get(k0), c.get(k1)
    assert None not in p0 and None not in p1
    assert all(x[32:] != y[32:] for x, y in zip(p0, p1))  # each rank stored its own heads
    b = vllm_env.engine(vllm_env.config(kvpool_node.socket, tp=2))
    out_b = b.run([vllm_env.Request("a", toks, max_tokens=2)])
    assert b.scheduler.external_hits["a"] == 40
    assert b.wrong_kv_block_ids == set() and b.invalid_block_ids == set()
    assert out_b == out_a
    # A block missing on one rank only is no hit: the prefix stops there.
    with client(kvpool_node, ns) as c:
        assert c.remove([k1[4]]) == [0]
    e = vllm_env.engine(vllm_env.config(kvpool_node.socket, tp=2))
    e.run([vllm_env.Request("e", toks, max_tokens=1)])
    assert e.scheduler.external_hits["e"] == 16 and e.wrong_kv_block_ids == set()


def test_tp2_mla_rank0_writes_all_ranks_load(vllm_env, kvpool_node):
    toks = prompt(26)
    cfg = vllm_env.config(kvpool_node.socket, tp=2, mla=True)
    a = vllm_env.engine(cfg, "mla")
    out_a = a.run([vllm_env.Request("a", toks, max_tokens=1)])
    ns, keys = page_keys(cfg, toks, 6)
    assert keys[0].endswith(b"/p0")  # MLA keys carry no TP rank
    with client(kvpool_node, ns) as c:
        assert c.exists(keys) == [True] * 6
    b = vllm_env.engine(vllm_env.config(kvpool_node.socket, tp=2, mla=True), "mla")
    out_b = b.run([vllm_env.Request("a", toks, max_tokens=1)])
    assert b.scheduler.external_hits["a"] == 24 and b.wrong_kv_block_ids == set()
    assert out_b == out_a


def test_factory_constructor_forms(vllm_env, kvpool_node):
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorBase_V1,
                                                                   KVConnectorRole)
    from vllm.v1.kv_cache_interface import KVCacheConfig

    from kvpool.integrations.vllm import KvpoolConnector

    cfg = vllm_env.config(kvpool_node.socket)
    for role in (KVConnectorRole.SCHEDULER, KVConnectorRole.WORKER):
        c = KVConnectorFactory.create_connector(cfg, role, KVCacheConfig(num_blocks=8))
        assert isinstance(c, KvpoolConnector) and isinstance(c, KVConnectorBase_V1)
        assert c.role == role
        c.shutdown()
        c.shutdown()
    # The 2-argument call of vLLM <= 0.10 also works.
    KvpoolConnector(cfg, KVConnectorRole.SCHEDULER).shutdown()
    # The hybrid KV-cache manager needs SupportsHMA, which the connector implements.
    from vllm.distributed.kv_transfer.kv_connector.v1.base import SupportsHMA, supports_hma

    assert supports_hma(KvpoolConnector)
    c = KVConnectorFactory.create_connector(cfg, KVConnectorRole.WORKER, None,
                                            hybrid_kv_cache_manager=True)
    assert isinstance(c, SupportsHMA) and c.requires_kv_delivery is False
    c.shutdown()


def test_stopped_node_is_a_miss_within_the_timeout(vllm_env, kvpool_node):
    import os
    import signal
    import time

    toks = prompt(33)
    a = vllm_env.engine(vllm_env.config(kvpool_node.socket))
    ref = a.run([vllm_env.Request("a", toks, max_tokens=1)])["a"]
    cfg = vllm_env.config(kvpool_node.socket)
    cfg.kv_transfer_config.kv_connector_extra_config["kvpool_timeout_ms"] = 300
    b = vllm_env.engine(cfg)
    b.add_request(vllm_env.Request("b", toks, max_tokens=1))
    so = b.scheduler.schedule()
    planned = set(so.kv_connector_metadata.loads[0].block_ids)
    os.kill(kvpool_node.proc.pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        out = b.runner.execute_model(so)
        assert out.kv_connector_output.invalid_block_ids == planned
        req = vllm_env.Request("c", toks, max_tokens=1)
        assert b.scheduler.connector.get_num_new_matched_tokens(req, 0) == (0, False)
        assert time.monotonic() - t0 < 5.0
    finally:
        os.kill(kvpool_node.proc.pid, signal.SIGCONT)
    b.scheduler.update_from_output(so, out)
    while b.scheduler.has_unfinished_requests():
        b.step()
    assert b.scheduler.requests["b"].output_token_ids == ref


def test_salt_lora_and_multimodal_inputs_separate_keys(vllm_env, kvpool_node):
    from types import SimpleNamespace as NS

    toks = prompt(24)
    cfg = vllm_env.config(kvpool_node.socket)
    a = vllm_env.engine(cfg)
    image = [NS(identifier="img-1", mm_position=NS(offset=9, length=4))]
    a.run([vllm_env.Request("plain", toks), vllm_env.Request("salted", toks, cache_salt="s1")])
    a.run([vllm_env.Request("lora", toks, lora_request=NS(lora_name="adapter-a", lora_int_id=1))])
    a.run([vllm_env.Request("mm", toks, mm_features=image)])
    conn = vllm_env.engine(cfg).scheduler.connector

    def hits(**kw):
        return conn.get_num_new_matched_tokens(vllm_env.Request("q", toks, **kw), 0)[0]

    assert hits() == 20
    assert hits(cache_salt="s1") == 20 and hits(cache_salt="s2") == 0
    assert hits(lora_request=NS(lora_name="adapter-a", lora_int_id=7)) == 20
    assert hits(lora_request=NS(lora_name="adapter-b", lora_int_id=1)) == 0
    assert hits(mm_features=image) == 20
    # Another image at the same place: blocks before it still hit, not the ones it overlaps.
    other = [NS(identifier="img-2", mm_position=NS(offset=9, length=4))]
    assert hits(mm_features=other) == 8


def test_resumed_request_loads_into_its_new_blocks(vllm_env, kvpool_node):
    from vllm.v1.core.kv_cache_manager import KVCacheBlock, KVCacheBlocks
    from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput

    toks = prompt(30)
    vllm_env.engine(vllm_env.config(kvpool_node.socket)).run([vllm_env.Request("a", toks)])
    conn = vllm_env.engine(vllm_env.config(kvpool_node.socket)).scheduler.connector
    req = vllm_env.Request("r", toks, max_tokens=4)
    n, _ = conn.get_num_new_matched_tokens(req, 0)
    assert n == 28
    ids = list(range(1, 9))  # block 0 is vLLM's null block
    conn.update_state_after_alloc(req, KVCacheBlocks(([KVCacheBlock(i) for i in ids],)), n)
    step1 = SchedulerOutput([NewRequestData("r", toks, (ids,), n)],
                            CachedRequestData(), {"r": 2}, 2, set())
    meta = conn.build_connector_meta(step1)
    assert [t.block_ids for t in meta.loads] == [ids[:7]]
    first_hashes = meta.loads[0].hashes
    # Preempted, then resumed with other blocks: vLLM asks again and allocates anew.
    req.num_computed_tokens = 0
    n, _ = conn.get_num_new_matched_tokens(req, 0)
    new_ids = list(range(20, 28))
    conn.update_state_after_alloc(req, KVCacheBlocks(([KVCacheBlock(i) for i in new_ids],)), n)
    for cached in (CachedRequestData(req_ids=["r"], resumed_from_preemption=[True],
                                     new_block_ids=[(new_ids,)], num_computed_tokens=[28]),
                   CachedRequestData(req_ids=["r"], resumed_req_ids={"r"},
                                     new_block_ids=[(new_ids,)], num_computed_tokens=[28])):
        conn.update_state_after_alloc(req, KVCacheBlocks(([KVCacheBlock(i) for i in new_ids],)), n)
        meta = conn.build_connector_meta(SchedulerOutput([], cached, {"r": 2}, 2, set()))
        assert [t.block_ids for t in meta.loads] == [new_ids[:7]]
        assert meta.loads[0].hashes == first_hashes
    assert conn.request_finished(req, new_ids) == (False, None)


def test_dummy_runs_and_unknown_layouts_raise_nothing(vllm_env, kvpool_node):
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorMetadata,
                                                                   KVConnectorRole)
    from vllm.v1.kv_cache_interface import KVCacheConfig

    from kvpool.integrations.vllm import BlockTransfer, KvpoolConnectorMetadata

    cfg = vllm_env.config(kvpool_node.socket)
    w = KVConnectorFactory.create_connector(cfg, KVConnectorRole.WORKER, KVCacheConfig(num_blocks=8))
    kv = torch.zeros(2, 8, BS, 2, 8, dtype=torch.bfloat16)
    w.register_kv_caches({"l0": kv})
    for meta in (KVConnectorMetadata(), KvpoolConnectorMetadata()):  # profiling / dummy runs
        w.bind_connector_metadata(meta)
        w.start_load_kv(None)
        w.wait_for_layer_load("l0")
        w.save_kv_layer("l0", kv, None)
        w.wait_for_save()
        assert w.get_finished({"x"}) == (None, None)
        assert w.get_block_ids_with_load_errors() == set()
        w.clear_connector_metadata()
    w.shutdown()
    # A layout the connector does not know: it disables itself; loads are errors.
    w = KVConnectorFactory.create_connector(cfg, KVConnectorRole.WORKER, KVCacheConfig(num_blocks=8))
    odd = torch.zeros(8, BS * 2 * 2 * 8, dtype=torch.bfloat16)
    w.register_kv_caches({"l0": odd})
    w.bind_connector_metadata(KvpoolConnectorMetadata(
        loads=[BlockTransfer("r", [3, 4], [b"\1" * 32, b"\2" * 32])],
        saves=[BlockTransfer("r", [5], [b"\3" * 32])]))
    w.start_load_kv(None)
    w.save_kv_layer("l0", odd, None)
    w.wait_for_save()
    assert w.get_block_ids_with_load_errors() == {3, 4}
    assert w.get_block_ids_with_load_errors() == set()  # reported once
    assert odd.count_nonzero() == 0
    w.shutdown()


def test_pipeline_stages_all_needed_for_a_hit(vllm_env, kvpool_node):
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    from kvpool.integrations import _vllm_keys as k

    toks = prompt(21)
    cfg = vllm_env.config(kvpool_node.socket, tp=2)
    cfg.parallel_config.pipeline_parallel_size = 2
    ns, _ = k.namespace(cfg)
    assert "tp=2" in ns and "pp=2" in ns
    sched = KVConnectorFactory.create_connector(cfg, KVConnectorRole.SCHEDULER)
    hashes = k.BlockHasher(vllm_env.Request("h", toks), BS).upto(5)
    shards = [k.rank_suffix(False, t, p) for p in range(2) for t in range(2)]
    assert len(set(shards)) == 4
    with client(kvpool_node, ns) as c:
        for sfx in shards[:3]:  # stage 1, TP rank 1 has nothing yet
            assert c.put([h + sfx for h in hashes], [b"x" * 64] * 5) == [0] * 5
        assert sched.get_num_new_matched_tokens(vllm_env.Request("q", toks), 0) == (0, False)
        assert c.put([h + shards[3] for h in hashes[:2]], [b"x" * 64] * 2) == [0] * 2
        assert sched.get_num_new_matched_tokens(vllm_env.Request("q", toks), 0) == (8, False)
    sched.shutdown()


def test_base_class_without_kv_cache_config(vllm_env, kvpool_node, monkeypatch):
    from vllm.distributed.kv_transfer.kv_connector.v1 import base

    from kvpool.integrations.vllm import KvpoolConnector

    def old_init(self, vllm_config, role):  # vLLM <= 0.10
        self._connector_metadata = None
        self._vllm_config = vllm_config
        self._role = role

    monkeypatch.setattr(base.KVConnectorBase_V1, "__init__", old_init)
    cfg = vllm_env.config(kvpool_node.socket)
    c = KvpoolConnector(cfg, base.KVConnectorRole.SCHEDULER, None)
    assert c.role == base.KVConnectorRole.SCHEDULER
    assert c.get_num_new_matched_tokens(vllm_env.Request("q", prompt(9)), 0) == (0, False)
    c.shutdown()


def test_batched_requests_with_chunked_prefill(vllm_env, kvpool_node):
    shared = prompt(40, 3)
    reqs = lambda: [vllm_env.Request("r1", shared + prompt(6, 11), max_tokens=3),  # noqa: E731
                    vllm_env.Request("r2", shared + prompt(9, 12), max_tokens=2),
                    vllm_env.Request("r3", prompt(27, 13), max_tokens=4)]
    a = vllm_env.engine(vllm_env.config(kvpool_node.socket, max_tokens_per_step=24))
    out_a = a.run(reqs())
    b = vllm_env.engine(vllm_env.config(kvpool_node.socket, max_tokens_per_step=24))
    out_b = b.run(reqs())
    assert out_b == out_a == reference_outputs(vllm_env, reqs())
    # Each loads all but its last prompt block's worth: (tokens - 1) // 4 blocks.
    assert b.scheduler.external_hits == {"r1": 44, "r2": 48, "r3": 24}
    assert a.wrong_kv_block_ids == set() and b.wrong_kv_block_ids == set()
    assert b.invalid_block_ids == set()
