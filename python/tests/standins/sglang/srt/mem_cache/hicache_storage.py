"""Stand-in of sglang/srt/mem_cache/hicache_storage.py (ENGINES.md 1.2, 1.3, 1.5, 6.5).

The abstract storage interface of HiCache's L3 tier, its config dataclasses
and the page-hash function, with the signatures and default bodies the
engine has (2025-2026 shape: v1 and v2 defaults raise NotImplementedError),
and the v2 (pool-aware) types of hybrid models: PoolName, PoolHitPolicy,
PoolTransfer, SidecarPoolSpec, PoolTransferResult. The deepseek_v4_* pool
names are left out (ENGINES.md does not list them).
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from enum import Enum
from typing import Any, Dict, List, Optional

import torch

STORAGE_BATCH_SIZE = 128


def get_hash_str(token_ids: List, prior_hash: Optional[str] = None) -> str:
    """SHA-256 hex digest of one page of token ids, chained on the previous
    page's digest (raw 32 bytes first), tokens as 4-byte little-endian
    unsigned ints; tuple tokens (EAGLE bigram) feed each element."""
    hasher = hashlib.sha256()
    if prior_hash:
        hasher.update(bytes.fromhex(prior_hash))
    for t in token_ids:
        if isinstance(t, tuple):
            for e in t:
                hasher.update(int(e).to_bytes(4, byteorder="little", signed=False))
        else:
            hasher.update(int(t).to_bytes(4, byteorder="little", signed=False))
    return hasher.hexdigest()


@dataclass
class HiCacheStorageConfig:
    tp_rank: int
    tp_size: int
    pp_rank: int
    pp_size: int
    attn_cp_rank: int
    attn_cp_size: int
    is_mla_model: bool
    enable_storage_metrics: bool
    is_page_first_layout: bool
    model_name: Optional[str]
    dp_rank: int = 0
    dp_size: int = 1
    tp_lcm_size: Optional[int] = None
    should_split_heads: bool = False
    extra_config: Optional[dict] = None


@dataclass
class HiCacheStorageExtraInfo:
    prefix_keys: Optional[List[str]] = None
    extra_info: Optional[dict] = None


class PoolName(str, Enum):
    """The host pools of a hybrid model; str() is the value."""

    KV = "kv"
    MAMBA = "mamba"
    SWA = "swa"
    INDEXER = "indexer"
    DRAFT = "draft"
    DRAFT_INDEXER = "draft_indexer"
    DRAFT_SWA = "draft_swa"

    def __str__(self):
        return self.value


class PoolHitPolicy(str, Enum):
    """ALL_PAGES: every page of the KV prefix must exist in the pool.
    TRAILING_PAGES: only the last N pages before the stop point must exist
    (N = len(PoolTransfer.keys))."""

    ALL_PAGES = "all_pages"
    TRAILING_PAGES = "trailing_pages"


@dataclass
class PoolTransfer:
    """One pool's part of a v2 call. keys: that pool's page keys (for an
    existence query of a TRAILING_PAGES pool only their number matters);
    host_indices: slots in that pool; indices_from_pool: the pool whose
    indices a sidecar pool reuses."""

    name: PoolName
    host_indices: Optional[torch.Tensor] = None
    device_indices: Optional[torch.Tensor] = None
    keys: Optional[List[str]] = None
    hit_policy: PoolHitPolicy = PoolHitPolicy.ALL_PAGES
    nodes_to_load: Optional[List[Any]] = None
    indices_from_pool: Optional[PoolName] = None


@dataclass
class SidecarPoolSpec:
    """A pool that reuses another pool's indices (e.g. the KV pool's)."""

    pool_name: PoolName
    indices_from_pool: PoolName
    hit_policy: PoolHitPolicy = PoolHitPolicy.ALL_PAGES


@dataclass
class PoolTransferResult:
    """kv_hit_pages: the usable KV prefix; extra_pool_hit_pages: pages per
    extra pool (by pool name)."""

    kv_hit_pages: int
    extra_pool_hit_pages: Dict[str, int]


class HiCacheStorage(ABC):
    """HiCache L3 storage backend interface."""

    def register_mem_pool_host(self, mem_pool_host):
        self.mem_pool_host = mem_pool_host

    def register_mem_host_pool_v2(self, host_pool, host_pool_name):
        if getattr(self, "registered_pools", None) is None:
            self.registered_pools = {}
        self.registered_pools[host_pool_name] = host_pool

    def batch_exists_v2(
        self,
        keys: List[str],
        pool_transfers: Optional[List[PoolTransfer]] = None,
        extra_info: Optional[HiCacheStorageExtraInfo] = None,
    ) -> PoolTransferResult:
        raise NotImplementedError()

    def batch_get_v2(
        self,
        transfers: List[PoolTransfer],
        extra_info: Optional[HiCacheStorageExtraInfo] = None,
    ) -> Dict[str, List[bool]]:
        raise NotImplementedError()

    def batch_set_v2(
        self,
        transfers: List[PoolTransfer],
        extra_info: Optional[HiCacheStorageExtraInfo] = None,
    ) -> Dict[str, List[bool]]:
        raise NotImplementedError()

    def batch_get_v1(
        self,
        keys: List[str],
        host_indices: torch.Tensor,
        extra_info: Optional[HiCacheStorageExtraInfo] = None,
    ) -> List[bool]:
        raise NotImplementedError()

    def batch_set_v1(
        self,
        keys: List[str],
        host_indices: torch.Tensor,
        extra_info: Optional[HiCacheStorageExtraInfo] = None,
    ) -> List[bool]:
        raise NotImplementedError()

    @abstractmethod
    def get(
        self,
        key: str,
        target_location: Optional[Any] = None,
        target_sizes: Optional[Any] = None,
    ) -> torch.Tensor | None:
        pass

    # TODO: Deprecate
    @abstractmethod
    def batch_get(
        self,
        keys: List[str],
        target_locations: Optional[Any] = None,
        target_sizes: Optional[Any] = None,
    ) -> List[torch.Tensor | None] | int:
        pass

    @abstractmethod
    def set(
        self,
        key: str,
        value: Optional[Any] = None,
        target_location: Optional[Any] = None,
        target_sizes: Optional[Any] = None,
    ) -> bool:
        pass

    # TODO: Deprecate
    @abstractmethod
    def batch_set(
        self,
        keys: List[str],
        values: Optional[Any] = None,
        target_locations: Optional[Any] = None,
        target_sizes: Optional[Any] = None,
    ) -> bool:
        pass

    @abstractmethod
    def exists(self, key: str) -> bool:
        pass

    def batch_exists(
        self, keys: List[str], extra_info: Optional[HiCacheStorageExtraInfo] = None
    ) -> int:
        """Number of consecutive existing keys from the start."""
        for i in range(len(keys)):
            if not self.exists(keys[i]):
                return i
        return len(keys)

    def clear(self) -> None:
        pass

    def get_stats(self):
        return None
