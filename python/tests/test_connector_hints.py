"""Cache hints through the three connectors (kvpool.integrations._hints;
docs/connectors.md, "Cache hints"), each driven by its stand-in engine as
ENGINES.md says the engine calls it, against a real kvpool-node:

- vLLM: a request whose kv_transfer_params carry a kv_hints envelope has
  its stored blocks retained when it finishes; a request without it has
  none (the negative control).
- SGLang HiCache: a backup whose extra_info carries kv_hints retains (or
  pins) exactly the pages it stored; a prefetch action rides on the exists
  check.
- LMCache: a lookup with pin=True retains the hit chunks' objects; one
  without pin retains nothing.

The node's own figures (/api/v1/status dram.hints, /metrics) say what was
hinted; each case counts exactly the entries its keys name."""

import json
import re
import types
import urllib.request

import pytest
import torch

import kvpool
from kvpool.integrations import _hints
from kvpool.integrations import _lmcache_format as fmt
from test_lmcache import TOKENS, Engine, lm, make_config, make_metadata  # noqa: F401 (lm: fixture)
from test_vllm import BS, page_keys, prompt

RETAIN = {"protocol_version": "0.1", "message_id": "m-1",
          "actions": [{"action_id": "a-1", "action_type": "retain", "action_version": "1",
                       "payload": {"ttl_s": 600, "priority": 7}},
                      {"action_id": "a-2", "action_type": "share", "action_version": "1",
                       "payload": {}}]}


def status(node):
    url = "http://127.0.0.1:%d/api/v1/status" % node.admin_port
    return json.loads(urllib.request.urlopen(url, timeout=10).read())


def hints(node):
    return status(node)["dram"]["hints"]


def metric(node, name):
    text = urllib.request.urlopen(
        "http://127.0.0.1:%d/metrics" % node.admin_port, timeout=10).read().decode()
    m = re.search(r"^%s (\S+)$" % re.escape(name), text, re.M)
    return float(m.group(1)) if m else 0.0


# ---- the envelope ------------------------------------------------------------
def test_envelope_parsing_takes_kvpools_hints_and_skips_the_rest():
    acts, skipped = _hints.parse(RETAIN)
    assert acts == [_hints.Action("retain", 600.0, 7)] and skipped == 1
    acts, skipped = _hints.parse({"actions": [
        {"action_type": "PIN", "payload": {"ttl_ms": 1500}},
        {"action_type": "retain", "payload": {}},  # no TTL: the default
        {"action_type": "demote"},
        {"action_type": "retain", "payload": {"priority": 256}},  # malformed
        {"action_type": "retain", "payload": {"ttl_s": "soon"}},  # malformed
        "retain"]}, default_ttl_s=42)
    assert acts == [_hints.Action("pin", 1.5, 0), _hints.Action("retain", 42, 0),
                    _hints.Action("demote", 0.0, 0)]
    assert skipped == 3
    assert _hints.parse({"op": "prefetch"}) == ([_hints.Action("prefetch", 0.0, 0)], 0)
    assert _hints.parse({"actions": "retain"}) == ([], 1)
    assert _hints.parse(None) == ([], 0)


# ---- vLLM --------------------------------------------------------------------
def test_vllm_request_hints_retain_its_blocks_when_it_finishes(standins_on_path, kvpool_node):
    from vllm.config import (CacheConfig, KVTransferConfig, ModelConfig, ParallelConfig,
                             SchedulerConfig, VllmConfig)
    from vllm.v1.engine.core import EngineCore
    from vllm.v1.request import Request

    cfg = VllmConfig(
        model_config=ModelConfig(model="test/model", dtype=torch.bfloat16, num_hidden_layers=4,
                                 num_key_value_heads=4, head_dim=8),
        cache_config=CacheConfig(block_size=BS),
        parallel_config=ParallelConfig(tensor_parallel_size=1),
        scheduler_config=SchedulerConfig(max_num_batched_tokens=2048),
        kv_transfer_config=KVTransferConfig(
            kv_connector="KvpoolConnector", kv_connector_module_path="kvpool.integrations.vllm",
            kv_role="kv_both",
            kv_connector_extra_config={"socket": kvpool_node.socket, "retry_interval_ms": 0}))
    engine = EngineCore(cfg, 64, "flash_attn")
    try:
        plain = Request("plain", prompt(30, start=5000), max_tokens=2)
        engine.run([plain])
        assert hints(kvpool_node)["retained_entries"] == 0  # negative control
        params = types.SimpleNamespace(extra_args={"kv_transfer_params": {"kv_hints": RETAIN}})
        req = Request("hinted", prompt(50), sampling_params=params, max_tokens=3)
        engine.run([req])
        tokens = req.prompt_token_ids + list(req.output_token_ids)
        ns, keys = page_keys(cfg, tokens, len(tokens) // BS)
        with kvpool.Client(kvpool_node.socket, namespace=ns) as c:
            stored = sum(c.exists(keys))
        assert stored >= 12  # the prompt's full blocks at least
        h = hints(kvpool_node)
        assert h["retained_entries"] == stored
        assert metric(kvpool_node, 'kvpool_hints_total{op="retain"}') == 1
    finally:
        engine.shutdown()


# ---- SGLang ------------------------------------------------------------------
def test_sglang_backup_hints_apply_to_the_pages_it_stores(kvpool_node):
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageExtraInfo
    from sglang_util import fill_random, make_controller, make_pool

    ctrl = make_controller(make_pool(seed=11), kvpool_node.socket)
    backend = ctrl.storage_backend
    pool = ctrl.mem_pool_host
    try:
        def backup(n, tag, info):
            host = pool.alloc(n * pool.page_size)
            fill_random(pool, host, seed=len(tag))
            keys = ["%s-%d" % (tag, i) for i in range(n)]
            assert backend.batch_set_v1(keys, host, info) == [True] * n
            return keys

        backup(6, "plain", HiCacheStorageExtraInfo(prefix_keys=None))  # negative control
        assert hints(kvpool_node)["retained_entries"] == 0
        keys = backup(5, "hinted", HiCacheStorageExtraInfo(
            prefix_keys=None, extra_info={"kv_hints": RETAIN}))
        pieces = len(backend._object_keys(keys[:1]))
        assert hints(kvpool_node)["retained_entries"] == 5 * pieces
        # A prefetch action at the exists check; retains there are ignored.
        before = metric(kvpool_node, 'kvpool_hints_total{op="prefetch"}')
        info = HiCacheStorageExtraInfo(prefix_keys=None, extra_info={"kv_hints": {
            "actions": [{"action_type": "prefetch", "payload": {}}] + RETAIN["actions"]}})
        assert backend.batch_exists(keys, info) == 5
        assert metric(kvpool_node, 'kvpool_hints_total{op="prefetch"}') == before + 1
        assert metric(kvpool_node, 'kvpool_hints_total{op="retain"}') == 1
    finally:
        ctrl.detach_storage_backend()


# ---- LMCache -----------------------------------------------------------------
def test_lmcache_lookup_pin_retains_the_hit_chunks(lm, kvpool_node):
    e = Engine(lm, make_config(lm, kvpool_node.socket), make_metadata(lm))
    try:
        keys, _ = e.store(TOKENS)
        assert e.backend.batched_async_contains("l1", keys) == 4
        assert hints(kvpool_node)["retained_entries"] == 0  # no pin: nothing retained
        assert e.backend.batched_async_contains("l2", keys[:3], pin=True) == 3
        # Three full chunks: each its header and its payload key(s).
        full = e.connector._full_chunk_layout()
        per_chunk = 1 + (len(fmt.payload_keys("k", full)) if full is not None else 0)
        assert hints(kvpool_node)["retained_entries"] == 3 * per_chunk
        assert metric(kvpool_node, 'kvpool_hints_total{op="retain"}') == 1
    finally:
        e.close()
