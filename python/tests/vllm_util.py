"""Helpers of the vLLM connector tests (test_vllm_*.py): configs of plain and
hybrid models for the vLLM stand-ins, engines that are shut down after the
test, and the connector's page keys computed independently of a running
connector."""

import pytest
import torch

BS = 4
NUM_BLOCKS = 96
HYBRID_TYPES = ("full_attention", "sliding_attention", "mamba",
                "full_attention", "sliding_attention", "mamba")


def prompt(n, start=1000):
    return [start + 7 * i % 5003 for i in range(n)]


class Env:
    def __init__(self):
        from vllm.v1.request import Request

        self.engines = []
        self.Request = Request

    def config(self, socket=None, layer_types=HYBRID_TYPES, window=8, mamba_mode="align",
               mamba_block_size=None, role="kv_both", extra=None, connector=True,
               num_layers=None, max_tokens_per_step=2048, events=False, head_dim=8, tp=1):
        from vllm.config import (CacheConfig, KVEventsConfig, KVTransferConfig, ModelConfig,
                                 ParallelConfig, SchedulerConfig, VllmConfig)

        ktc = None
        if connector:
            ex = {"socket": socket, "retry_interval_ms": 0, "timeout_ms": 3000}
            ex.update(extra or {})
            ktc = KVTransferConfig(kv_connector="KvpoolConnector",
                                   kv_connector_module_path="kvpool.integrations.vllm",
                                   kv_role=role, kv_connector_extra_config=ex)
        n = num_layers or (len(layer_types) if layer_types else 4)
        return VllmConfig(
            model_config=ModelConfig(model="test/hybrid", dtype=torch.bfloat16,
                                     num_hidden_layers=n, num_key_value_heads=4,
                                     head_dim=head_dim, layer_types=layer_types,
                                     sliding_window=window if layer_types else None),
            cache_config=CacheConfig(block_size=BS, mamba_cache_mode=mamba_mode,
                                     mamba_block_size=mamba_block_size),
            parallel_config=ParallelConfig(tensor_parallel_size=tp),
            scheduler_config=SchedulerConfig(max_num_batched_tokens=max_tokens_per_step),
            kv_transfer_config=ktc,
            kv_events_config=KVEventsConfig(enable_kv_cache_events=events))

    def engine(self, cfg, layout="flash_attn", num_blocks=NUM_BLOCKS):
        from vllm.v1.engine.core import EngineCore

        e = EngineCore(cfg, num_blocks, layout)
        self.engines.append(e)
        return e

    def reference(self, cfg_kwargs, reqs):
        """Outputs of an engine without the connector."""
        e = self.engine(self.config(connector=False, **cfg_kwargs))
        return e.run([self.Request(r.request_id, r.prompt_token_ids, max_tokens=r.max_tokens)
                      for r in reqs])

    def close(self):
        for e in self.engines:
            e.shutdown()


@pytest.fixture
def env(standins_on_path):
    e = Env()
    yield e
    e.close()


def settings(engine):
    """The scheduler-side connector settings of an engine."""
    return engine.scheduler.connector._scheduler_side._s


def page_key(s, block_hash, group, layer=None, tp_rank=0):
    """The key of a page, built from the documented parts."""
    from kvpool.integrations import _vllm_keys as k

    tag = b"/g%d" % group if s.hybrid else b""
    if layer is not None:
        tag += b"/L%d" % layer
    return block_hash + tag + k.rank_suffix(s.use_mla, tp_rank, 0)


def hashes(tokens, n, block_size=BS):
    from vllm.v1.request import Request

    from kvpool.integrations import _vllm_keys as k

    return k.BlockHasher(Request("h", tokens), block_size).upto(n)


def client(node, namespace):
    import kvpool

    return kvpool.Client(node.socket, namespace=namespace)


def group_page(runner, group_layers, block_id):
    """The payload a whole-group page must hold: each layer's block in the
    group's layer order (all layers bf16, so no alignment padding)."""
    return b"".join(runner.layer_block_bytes(n, block_id) for n in group_layers)
