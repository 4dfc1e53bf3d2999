"""Stand-in of vllm/v1/kv_cache_interface.py: KV-cache specs and KVCacheConfig
(ENGINES.md §2.6, §6.3).

KVCacheConfig lists the engine's KV tensors (kv_cache_tensors: each shared by
one layer of every group, so all groups' pages have one size) and its groups
(kv_cache_groups: the layers that share a block table, with their spec). Block
b of group g is index b in every layer of g; block 0 is the null block.
"""

from dataclasses import dataclass, field
from typing import Any, Optional

import torch


@dataclass
class KVCacheSpec:
    block_size: int


@dataclass
class AttentionSpec(KVCacheSpec):
    num_kv_heads: int = 1
    head_size: int = 1
    dtype: torch.dtype = torch.float16

    @property
    def page_size_bytes(self) -> int:
        return 2 * self.block_size * self.num_kv_heads * self.head_size * _esize(self.dtype)


@dataclass
class FullAttentionSpec(AttentionSpec):
    sliding_window: Optional[int] = None


@dataclass
class MLAAttentionSpec(FullAttentionSpec):
    @property
    def page_size_bytes(self) -> int:
        return self.block_size * self.head_size * _esize(self.dtype)


@dataclass
class SlidingWindowSpec(AttentionSpec):
    sliding_window: int = 0


@dataclass
class MambaSpec(KVCacheSpec):
    # One state tensor per entry (conv state, SSM state), per block: (num_blocks, *shape).
    shapes: tuple = ()
    dtypes: tuple = ()
    mamba_type: str = "mamba2"

    @property
    def page_size_bytes(self) -> int:
        n = 0
        for shape, dtype in zip(self.shapes, self.dtypes):
            size = _esize(dtype)
            for d in shape:
                size *= d
            n += size
        return n


def _esize(dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


@dataclass
class KVCacheTensor:
    size: int  # bytes
    shared_by: list[str] = field(default_factory=list)
    offset: int = 0
    block_stride: Optional[int] = None


@dataclass
class KVCacheGroupSpec:
    layer_names: list[str]
    kv_cache_spec: Any = None
    is_eagle_group: bool = False


@dataclass
class KVCacheConfig:
    num_blocks: int
    kv_cache_tensors: list[KVCacheTensor] = field(default_factory=list)
    kv_cache_groups: list[KVCacheGroupSpec] = field(default_factory=list)
