"""Stand-in of vllm/distributed/kv_events.py: the KV event model of ENGINES.md
§6.1, as plain dataclasses (upstream: msgspec structs, omit_defaults, tagged
by class name). Fields in upstream's declaration order.
"""

from abc import ABC, abstractmethod
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


class KVConnectorKVEvents(ABC):
    """A connector's KV events of one step (ENGINES.md 7.4): the workers'
    objects are merged by KVOutputAggregator (add_events, increment_workers)
    and reduced by aggregate() on the scheduler side."""

    @abstractmethod
    def add_events(self, events):
        ...

    @abstractmethod
    def aggregate(self):
        ...

    @abstractmethod
    def increment_workers(self, count=1):
        ...

    @abstractmethod
    def get_all_events(self):
        ...

    @abstractmethod
    def get_number_of_workers(self):
        ...

    @abstractmethod
    def clear_events(self):
        ...

    def merge(self, other):
        self.add_events(other.get_all_events())
        return self
