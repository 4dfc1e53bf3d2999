"""Stand-in of `lmcache.v1.memory_management`: memory formats, memory objects
and a CPU allocator (ENGINES.md §3.3).

Differences from LMCache, on purpose: each object is its own torch tensor (no
pinned arena; torch 1.13 CPU cannot pin), followed by a guard band that
`free` checks, so a connector writing past an object's end is caught. Ref
counts are checked: dropping below zero raises (a connector releasing an
object it does not own).
"""
import abc
import threading
from dataclasses import dataclass, field
from enum import Enum
from typing import List, Optional

import torch


class MemoryFormat(Enum):
    UNDEFINED = 0
    KV_2LTD = 1  # [2, num_layers, num_tokens, num_kv_heads * head_size]
    KV_T2D = 2  # layer-wise [num_tokens, 2, hidden]
    BINARY = 3
    BINARY_BUFFER = 4
    KV_MLA_FMT = 5  # [1, num_layers, num_tokens, head_size]
    KV_2TD = 6  # layer-wise [2, num_tokens, hidden]

    def token_dim(self) -> int:
        return {MemoryFormat.KV_2LTD: 2, MemoryFormat.KV_MLA_FMT: 2,
                MemoryFormat.KV_T2D: 0, MemoryFormat.KV_2TD: 1}.get(self, 0)


def dtype_size(dtype: torch.dtype) -> int:
    # torch 1.13 has no dtype.itemsize.
    return torch.empty((), dtype=dtype).element_size()


@dataclass
class MemoryObjMetadata:
    shape: torch.Size
    dtype: Optional[torch.dtype]
    address: int
    phy_size: int
    ref_count: int
    pin_count: int = 0
    fmt: MemoryFormat = MemoryFormat.UNDEFINED
    cached_positions: Optional[torch.Tensor] = None

    def get_size(self) -> int:
        if self.dtype is None:
            return self.phy_size
        return self.shape.numel() * dtype_size(self.dtype)


class MemoryObj(metaclass=abc.ABCMeta):
    @abc.abstractmethod
    def invalidate(self): ...

    @abc.abstractmethod
    def is_valid(self) -> bool: ...

    @abc.abstractmethod
    def get_size(self) -> int: ...

    @abc.abstractmethod
    def get_shape(self) -> torch.Size: ...

    @abc.abstractmethod
    def get_dtype(self) -> Optional[torch.dtype]: ...

    @abc.abstractmethod
    def get_memory_format(self) -> MemoryFormat: ...

    @abc.abstractmethod
    def get_physical_size(self) -> int: ...

    @abc.abstractmethod
    def pin(self) -> bool: ...

    @abc.abstractmethod
    def unpin(self) -> bool: ...

    @abc.abstractmethod
    def ref_count_up(self): ...

    @abc.abstractmethod
    def ref_count_down(self): ...

    @abc.abstractmethod
    def get_ref_count(self) -> int: ...

    @property
    @abc.abstractmethod
    def metadata(self) -> MemoryObjMetadata: ...

    @property
    @abc.abstractmethod
    def tensor(self) -> Optional[torch.Tensor]: ...

    @property
    @abc.abstractmethod
    def byte_array(self) -> memoryview: ...

    @property
    @abc.abstractmethod
    def is_pinned(self) -> bool: ...


class TensorMemoryObj(MemoryObj):
    """A flat uint8 tensor (`raw_data`) plus metadata, owned by an allocator."""

    def __init__(self, raw_data: torch.Tensor, metadata: MemoryObjMetadata, parent_allocator=None):
        self.raw_data = raw_data
        self.meta = metadata
        self.parent_allocator = parent_allocator
        self.valid = True
        self._lock = threading.Lock()

    def invalidate(self):
        self.valid = False

    def is_valid(self) -> bool:
        return self.valid

    def get_size(self) -> int:
        return self.meta.get_size()

    def get_shape(self) -> torch.Size:
        return self.meta.shape

    def get_dtype(self) -> Optional[torch.dtype]:
        return self.meta.dtype

    def get_memory_format(self) -> MemoryFormat:
        return self.meta.fmt

    def get_physical_size(self) -> int:
        return self.meta.phy_size

    def pin(self) -> bool:
        with self._lock:
            self.meta.pin_count += 1
        return True

    def unpin(self) -> bool:
        with self._lock:
            self.meta.pin_count -= 1
        return True

    def ref_count_up(self):
        with self._lock:
            if self.meta.ref_count <= 0:
                raise RuntimeError("ref_count_up on a freed memory object")
            self.meta.ref_count += 1

    def ref_count_down(self):
        with self._lock:
            if self.meta.ref_count <= 0:
                raise RuntimeError("ref_count_down below zero: released by a non-owner")
            self.meta.ref_count -= 1
            freed = self.meta.ref_count == 0
        if freed and self.parent_allocator is not None:
            self.parent_allocator.free(self)

    def get_ref_count(self) -> int:
        return self.meta.ref_count

    @property
    def metadata(self) -> MemoryObjMetadata:
        return self.meta

    @property
    def tensor(self) -> Optional[torch.Tensor]:
        if self.meta.dtype is None:
            return None
        return self.raw_data[: self.get_size()].view(self.meta.dtype).view(self.meta.shape)

    @property
    def byte_array(self) -> memoryview:
        # Writable, over the object's own bytes (not the guard band).
        return memoryview(self.raw_data[: self.get_size()].numpy())

    @property
    def is_pinned(self) -> bool:
        return self.meta.pin_count > 0


class TensorMemoryAllocator:
    """CPU allocator with a byte budget. Thread-safe. Freed buffers are kept
    for reuse by the next object of the same size (like LMCache's arena, whose
    memory is allocated and touched once). Counts live objects and bytes so
    tests can check that every object was released exactly once."""

    GUARD_BYTES = 64
    GUARD_VALUE = 0xA5

    def __init__(self, capacity_bytes: int):
        self.capacity_bytes = capacity_bytes
        self._lock = threading.Lock()
        self.used_bytes = 0
        self.live: dict = {}
        self.allocations = 0
        self.frees = 0
        self.guard_violations: List[str] = []
        self._spare: dict = {}  # size -> freed raw buffers

    def allocate(self, shape, dtype: Optional[torch.dtype],
                 fmt: MemoryFormat = MemoryFormat.KV_2LTD) -> Optional[TensorMemoryObj]:
        shape = torch.Size(shape)
        size = shape.numel() * (dtype_size(dtype) if dtype is not None else 1)
        with self._lock:
            if self.used_bytes + size > self.capacity_bytes:
                return None
            self.used_bytes += size
            self.allocations += 1
            spare = self._spare.get(size)
            raw = spare.pop() if spare else None
        if raw is None:
            raw = torch.empty(size + self.GUARD_BYTES, dtype=torch.uint8)
        raw[size:] = self.GUARD_VALUE
        meta = MemoryObjMetadata(shape=shape, dtype=dtype, address=raw.data_ptr(),
                                 phy_size=size, ref_count=1, fmt=fmt)
        obj = TensorMemoryObj(raw, meta, self)
        with self._lock:
            self.live[id(obj)] = obj
        return obj

    def free(self, obj: TensorMemoryObj) -> None:
        size = obj.meta.phy_size
        if not bool((obj.raw_data[size:] == self.GUARD_VALUE).all()):
            self.guard_violations.append(f"write past the end of a {size}-byte object")
        obj.invalidate()
        with self._lock:
            if self.live.pop(id(obj), None) is None:
                raise RuntimeError("double free")
            self.used_bytes -= size
            self.frees += 1
            self._spare.setdefault(size, []).append(obj.raw_data)

    def live_count(self) -> int:
        with self._lock:
            return len(self.live)
