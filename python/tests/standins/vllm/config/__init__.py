"""Stand-in of vllm.config: the pieces of VllmConfig a KV connector reads.

Field names follow vLLM (model_config.model/dtype/use_mla,
cache_config.block_size/cache_dtype/num_gpu_blocks, parallel_config
tensor/pipeline sizes and the worker's rank). The model geometry that real
vLLM reads from the HF config is given directly here.
"""

from dataclasses import dataclass, field
from typing import Optional

import torch

from .kv_transfer import KVTransferConfig


@dataclass
class ParallelConfig:
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    # Global rank of this worker (set by the worker process; 0 in the scheduler).
    rank: int = 0

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size


@dataclass
class ModelConfig:
    model: str = "facebook/opt-125m"
    revision: Optional[str] = None
    dtype: torch.dtype = torch.float16
    use_mla: bool = False
    # Geometry (upstream: from the HF config).
    num_hidden_layers: int = 4
    num_attention_heads: int = 8
    num_key_value_heads: int = 4
    head_dim: int = 64
    kv_lora_rank: int = 512
    qk_rope_head_dim: int = 64
    # Hybrid models (stand-in geometry): one entry per layer, "full_attention",
    # "sliding_attention" or "mamba"; None: every layer is full attention.
    layer_types: Optional[tuple] = None
    sliding_window: Optional[int] = None
    # Shapes of a Mamba layer's state tensors (conv state, SSM state) per block.
    mamba_state_shapes: tuple = ((3, 16), (4, 8))

    def get_head_size(self) -> int:
        if self.use_mla:
            return self.kv_lora_rank + self.qk_rope_head_dim
        return self.head_dim

    def get_num_kv_heads(self, parallel_config: ParallelConfig) -> int:
        if self.use_mla:
            return 1
        return max(1, self.num_key_value_heads // parallel_config.tensor_parallel_size)

    def get_num_layers(self, parallel_config: ParallelConfig) -> int:
        return self.num_hidden_layers // parallel_config.pipeline_parallel_size


@dataclass
class CacheConfig:
    block_size: int = 16
    cache_dtype: str = "auto"
    enable_prefix_caching: bool = True
    num_gpu_blocks: Optional[int] = None
    # Hybrid models: "none" (no prefix caching of Mamba state), "align" (the
    # state at the end of each scheduled chunk, cut at a block boundary, is
    # kept in that block) or "all".
    mamba_cache_mode: str = "none"
    mamba_block_size: Optional[int] = None


@dataclass
class SchedulerConfig:
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256


@dataclass
class KVEventsConfig:
    """vllm/config/kv_events.py (ENGINES.md §6.1)."""

    enable_kv_cache_events: bool = False
    publisher: Optional[str] = None
    endpoint: str = "tcp://*:5557"
    replay_endpoint: Optional[str] = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""


@dataclass
class VllmConfig:
    model_config: ModelConfig = field(default_factory=ModelConfig)
    cache_config: CacheConfig = field(default_factory=CacheConfig)
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)
    scheduler_config: SchedulerConfig = field(default_factory=SchedulerConfig)
    kv_transfer_config: Optional[KVTransferConfig] = None
    kv_events_config: Optional[KVEventsConfig] = None


__all__ = ["CacheConfig", "KVEventsConfig", "KVTransferConfig", "ModelConfig", "ParallelConfig",
           "SchedulerConfig", "VllmConfig"]
