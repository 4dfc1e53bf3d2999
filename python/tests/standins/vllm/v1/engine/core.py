"""Stand-in of vllm/v1/engine/core.py: EngineCore.step() = schedule ->
execute_model on every worker -> update_from_output.

With one rank the model runner lives in this process (as vLLM's uniprocess
executor); with more, MultiprocExecutor runs one process per rank. The
outputs of the ranks are merged as vLLM merges KVConnectorOutput: the
invalid block ids of all ranks, the sampled tokens of rank 0.
"""

import copy

from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import KVConnectorOutput


class EngineCore:
    def __init__(self, vllm_config, num_blocks, layout="flash_attn", processes=None):
        mc = vllm_config.model_config
        names = ["model.layers.%d.self_attn.attn" % i for i in range(mc.num_hidden_layers)]
        self.kv_cache_config = KVCacheConfig(
            num_blocks=num_blocks,
            kv_cache_groups=[KVCacheGroupSpec(names, vllm_config.cache_config.block_size)])
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
            invalid = set()
            for o in outs:
                invalid |= o.kv_connector_output.invalid_block_ids
            merged.kv_connector_output = KVConnectorOutput(
                finished_sending=merged.kv_connector_output.finished_sending,
                finished_recving=merged.kv_connector_output.finished_recving,
                invalid_block_ids=invalid)
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
            self.step()
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
