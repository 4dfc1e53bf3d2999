"""Stand-in of vllm/distributed/kv_events.py: the KV event model of ENGINES.md
§6.1, as plain dataclasses (upstream: msgspec structs, omit_defaults, tagged
by class name). Fields in upstream's declaration order.
"""

from dataclasses import dataclass, field
from typing import Any, Optional, Union

BlockHash = Union[int, bytes]

MEDIUM_GPU = "GPU"
MEDIUM_CPU = "CPU"
MEDIUM_STORAGE = "STORAGE"


@dataclass
class KVCacheEvent:
    """Base of the events (upstream: tag=True, key "type" = class name)."""


@dataclass
class BlockStored(KVCacheEvent):
    block_hashes: list[BlockHash] = field(default_factory=list)
    parent_block_hash: Optional[BlockHash] = None
    token_ids: list[int] = field(default_factory=list)
    block_size: int = 0
    lora_id: Optional[int] = None
    medium: Optional[str] = None
    lora_name: Optional[str] = None
    extra_keys: Optional[list] = None
    group_idx: Optional[int] = None
    kv_cache_spec_kind: Optional[str] = None
    kv_cache_spec_sliding_window: Optional[int] = None
    locality: Optional[str] = None
    ownership: Optional[str] = None


@dataclass
class BlockRemoved(KVCacheEvent):
    block_hashes: list[BlockHash] = field(default_factory=list)
    medium: Optional[str] = None
    group_idx: Optional[int] = None
    locality: Optional[str] = None
    ownership: Optional[str] = None


@dataclass
class AllBlocksCleared(KVCacheEvent):
    pass


@dataclass
class KVEventBatch:
    ts: float
    events: list[Any]
    data_parallel_rank: Optional[int] = None
