"""Stand-in of vllm/v1/kv_cache_interface.py: KVCacheConfig (one full-attention group)."""

from dataclasses import dataclass, field


@dataclass
class KVCacheGroupSpec:
    layer_names: list[str]
    block_size: int = 16


@dataclass
class KVCacheConfig:
    num_blocks: int
    kv_cache_groups: list[KVCacheGroupSpec] = field(default_factory=list)
