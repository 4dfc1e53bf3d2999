"""Stand-in of `lmcache.config` (older home of the engine metadata)."""
from dataclasses import dataclass
from typing import Tuple

import torch


@dataclass
class LMCacheEngineMetadata:
    model_name: str
    world_size: int
    worker_id: int
    fmt: str
    kv_dtype: torch.dtype
    # (num_layers, 2 or 1 (MLA), chunk_size, num_kv_heads, head_size)
    kv_shape: Tuple[int, int, int, int, int]
    use_mla: bool = False
