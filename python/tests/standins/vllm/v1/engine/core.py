"""Stand-in of vllm/v1/engine/core.py: EngineCore.step() = schedule ->
execute_model on every worker -> update_from_output.

With one rank the model runner lives in this process (as vLLM's uniprocess
executor); with more, MultiprocExecutor runs one process per rank. The
outputs of the ranks are merged as vLLM merges KVConnectorOutput: the
invalid block ids of all ranks; a request finished receiving once every
rank reported it; the KV events through KVOutputAggregator; the sampled
tokens of rank 0.

The KVCacheConfig follows model_config.layer_types: one full-attention (or
MLA) group for a plain model; for a hybrid model one group per layer type
(full attention, sliding window, Mamba) sharing KV tensors of one page size,
as vLLM's hybrid KV-cache manager lays them out.
"""

import collections
import copy
import time

from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec,
                                        KVCacheTensor, MambaSpec, MLAAttentionSpec,
                                        SlidingWindowSpec)
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator
from vllm.v1.outputs import KVConnectorOutput


def make_kv_cache_config(vllm_config, num_blocks):
    mc, cc, pc = vllm_config.model_config, vllm_config.cache_config, vllm_config.parallel_config
    types = list(mc.layer_types or ["full_attention"] * mc.num_hidden_layers)
    bs, heads, head, dtype = cc.block_size, mc.get_num_kv_heads(pc), mc.get_head_size(), mc.dtype
    names = {t: [] for t in types}
    for i, t in enumerate(types):
        names[t].append(("model.layers.%d.mixer" if t == "mamba" else
                         "model.layers.%d.self_attn.attn") % i)
    if set(types) == {"full_attention"}:
        spec = (MLAAttentionSpec if mc.use_mla else FullAttentionSpec)(bs, heads, head, dtype)
        return KVCacheConfig(num_blocks=num_blocks, kv_cache_groups=[
            KVCacheGroupSpec(names["full_attention"], spec)])
    specs = {"full_attention": FullAttentionSpec(bs, heads, head, dtype),
             "sliding_attention": SlidingWindowSpec(bs, heads, head, dtype,
                                                    sliding_window=mc.sliding_window),
             "mamba": MambaSpec(cc.mamba_block_size or bs, shapes=tuple(mc.mamba_state_shapes),
                                dtypes=(dtype,) * len(mc.mamba_state_shapes))}
    groups = [KVCacheGroupSpec(names[t], specs[t]) for t in names]
    page = max(g.kv_cache_spec.page_size_bytes for g in groups)
    tensors = [KVCacheTensor(num_blocks * page, [g.layer_names[i] for g in groups
                                                 if i < len(g.layer_names)])
               for i in range(max(len(g.layer_names) for g in groups))]
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=tensors, kv_cache_groups=groups)


class EngineCore:
    def __init__(self, vllm_config, num_blocks, layout="flash_attn", processes=None):
        self.kv_cache_config = make_kv_cache_config(vllm_config, num_blocks)
        self.vllm_config = vllm_config
        world = vllm_config.parallel_config.world_size
        if processes is None:
            processes = world > 1
        if processes:
            from vllm.v1.executor.multiproc_executor import MultiprocExecutor

            self.executor = MultiprocExecutor(vllm_config, self.kv_cache_config, layout)
            self.runner = None
        else:
            from vllm.v1.worker.gpu_model_runner import GPUModelRunner

            assert world == 1
            cfg = copy.deepcopy(vllm_config)
            self.runner = GPUModelRunner(cfg, self.kv_cache_config, layout)
            self.executor = None
        self.scheduler = Scheduler(copy.deepcopy(vllm_config), self.kv_cache_config)
        self.wrong_kv_block_ids = set()
        self.invalid_block_ids = set()
        self._recv_counts = collections.Counter()

    def add_request(self, request):
        self.scheduler.add_request(request)

    def step(self):
        so = self.scheduler.schedule()
        if self.runner is not None:
            outs = [self.runner.execute_model(so)]
        else:
            outs = self.executor.execute_model(so)
        merged = outs[0]
        if merged.kv_connector_output is not None:
            invalid, recving = set(), set()
            # The workers' KV events merged as vLLM's KVOutputAggregator does.
            events = KVOutputAggregator.aggregate_events(
                [o.kv_connector_output.kv_cache_events for o in outs])
            for o in outs:
                kvo = o.kv_connector_output
                invalid |= kvo.invalid_block_ids
                for rid in kvo.finished_recving or ():
                    self._recv_counts[rid] += 1
                    if self._recv_counts[rid] == len(outs):
                        del self._recv_counts[rid]
                        recving.add(rid)
            merged.kv_connector_output = KVConnectorOutput(
                finished_sending=merged.kv_connector_output.finished_sending,
                finished_recving=recving or None, invalid_block_ids=invalid,
                kv_cache_events=events)
            self.invalid_block_ids |= invalid
        for o in outs:
            self.wrong_kv_block_ids |= o.wrong_kv_block_ids
        return so, merged, self.scheduler.update_from_output(so, merged)

    def run(self, requests, max_steps=1000):
        """Adds the requests, steps until all finish; {req id: output token ids}."""
        for r in requests:
            self.add_request(r)
        for _ in range(max_steps):
            if not self.scheduler.has_unfinished_requests():
                break
            so, _, _ = self.step()
            if not so.total_num_scheduled_tokens:
                # Only requests waiting for background loads: vLLM's loop blocks
                # on its queues here; a bare spin would starve those threads.
                time.sleep(0.001)
        else:
            raise RuntimeError("requests did not finish in %d steps" % max_steps)
        return {r.request_id: list(r.output_token_ids) for r in requests}

    def shutdown(self):
        if self.runner is not None:
            self.runner.shutdown()
        if self.executor is not None:
            self.executor.shutdown()
        if self.scheduler.connector is not None:
            self.scheduler.connector.shutdown()
