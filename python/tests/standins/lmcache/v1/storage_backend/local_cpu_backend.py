"""Stand-in of `lmcache.v1.storage_backend.local_cpu_backend`.

`LocalCPUBackend.allocate(shape, dtype, fmt)` hands out a `MemoryObj` (ref
count 1) or None when the CPU budget is used up; `.metadata` is the engine
metadata it was built with. In the scheduler role the connector context
carries a `SafeLocalCPUBackend`, whose `allocate` raises and which has no
`.metadata` (ENGINES.md §6.2). Thread-safe.
"""
from typing import Optional

import torch

from lmcache.v1.memory_management import MemoryFormat, MemoryObj, TensorMemoryAllocator


class LocalCPUBackend:
    def __init__(self, config=None, memory_allocator: Optional[TensorMemoryAllocator] = None,
                 capacity_bytes: int = 1 << 30, metadata=None):
        self.config = config
        self.metadata = metadata
        self.memory_allocator = memory_allocator or TensorMemoryAllocator(capacity_bytes)
        self.allocate_calls = 0

    def allocate(self, shape, dtype: torch.dtype, fmt: MemoryFormat = MemoryFormat.KV_2LTD,
                 eviction: bool = True, busy_loop: bool = True) -> Optional[MemoryObj]:
        self.allocate_calls += 1
        return self.memory_allocator.allocate(shape, dtype, fmt)


class SafeLocalCPUBackend:
    """What a scheduler-role connector gets: no CPU memory to allocate from."""

    def allocate(self, *args, **kwargs):
        raise RuntimeError("allocate is not available in the scheduler role")
