"""Stand-in of `lmcache.v1.storage_backend.connector.base_connector`: the
`RemoteConnector` ABC. All abstract methods except `exists_sync` are
coroutines; `RemoteBackend` runs them on LMCache's event loop thread.

Two releases (`lmcache._contract`):
- 2025 (ENGINES.md §3.2): no constructor; `init_chunk_meta(config,
  metadata)`; every optional method unsupported (`support_*` False, the
  method raises NotImplementedError); `batched_contains(keys,
  stop_after_first_not_exits=True) -> List[bool]`.
- 2026 (ENGINES.md §6.2): `__init__(config, metadata)` asserts the metadata
  and sets the chunk layout fields; `batched_async_contains` and
  `batched_get_non_blocking` have working defaults (supported);
  `batched_contains(keys) -> int`, the count of leading hits, no stop flag,
  still unsupported by default.
"""
import abc
import asyncio
from typing import List, Optional

import torch

from lmcache._contract import IS_2026
from lmcache.utils import CacheEngineKey
from lmcache.v1.memory_management import MemoryFormat, MemoryObj, dtype_size

# Bytes of one `RemoteMetadata` header (ENGINES.md §3.3): length, 4 dims,
# dtype and format, 4 bytes each.
REMOTE_METADATA_BYTES = 28


class _RemoteConnectorAbstract(metaclass=abc.ABCMeta):
    """The abstract methods and the optional methods both releases share."""

    def post_init(self):
        pass

    @abc.abstractmethod
    async def exists(self, key: CacheEngineKey) -> bool: ...

    @abc.abstractmethod
    def exists_sync(self, key: CacheEngineKey) -> bool: ...

    @abc.abstractmethod
    async def get(self, key: CacheEngineKey) -> Optional[MemoryObj]: ...

    @abc.abstractmethod
    async def put(self, key: CacheEngineKey, memory_obj: MemoryObj): ...

    @abc.abstractmethod
    async def list(self) -> List[str]: ...

    @abc.abstractmethod
    async def close(self): ...

    def support_ping(self) -> bool:
        return False

    async def ping(self) -> int:
        raise NotImplementedError

    def support_batched_get(self) -> bool:
        return False

    async def batched_get(self, keys: List[CacheEngineKey]) -> List[Optional[MemoryObj]]:
        raise NotImplementedError

    def support_batched_put(self) -> bool:
        return False

    async def batched_put(self, keys: List[CacheEngineKey], memory_objs: List[MemoryObj]):
        raise NotImplementedError

    def remove_sync(self, key: CacheEngineKey) -> bool:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<{self.__class__.__name__}>"


if not IS_2026:

    class RemoteConnector(_RemoteConnectorAbstract):
        save_chunk_meta: bool = True
        meta_shape: Optional[torch.Size] = None
        meta_dtype: Optional[torch.dtype] = None
        meta_fmt: Optional[MemoryFormat] = None
        full_chunk_size: Optional[int] = None
        single_token_size: Optional[int] = None

        def init_chunk_meta(self, config, metadata) -> None:
            """Only when extra_config.save_chunk_meta is false: precompute the full
            chunk's shape/dtype/fmt so no per-object header is needed."""
            if (config is None or metadata is None or config.extra_config is None
                    or config.extra_config.get("save_chunk_meta", True) or config.use_layerwise):
                return
            layers, kv, tokens, heads, head_size = metadata.kv_shape
            self.save_chunk_meta = False
            self.meta_shape = torch.Size([kv, layers, tokens, heads * head_size])
            self.meta_dtype = metadata.kv_dtype
            self.meta_fmt = MemoryFormat.KV_MLA_FMT if metadata.use_mla else MemoryFormat.KV_2LTD
            self.full_chunk_size = self.meta_shape.numel() * dtype_size(metadata.kv_dtype)
            self.single_token_size = self.full_chunk_size // tokens

        def support_batched_async_contains(self) -> bool:
            return False

        async def batched_async_contains(self, lookup_id: str, keys: List[CacheEngineKey],
                                         pin: bool = False) -> int:
            raise NotImplementedError

        def support_batched_get_non_blocking(self) -> bool:
            return False

        async def batched_get_non_blocking(self, lookup_id: str,
                                           keys: List[CacheEngineKey]) -> List[MemoryObj]:
            raise NotImplementedError

        def support_batched_contains(self) -> bool:
            return False

        def batched_contains(self, keys: List[CacheEngineKey],
                             stop_after_first_not_exits: bool = True) -> List[bool]:
            raise NotImplementedError

else:

    class RemoteConnector(_RemoteConnectorAbstract):
        def __init__(self, config, metadata):
            assert metadata is not None, "RemoteConnector needs the engine metadata"
            extra = getattr(config, "extra_config", None) or {}
            layerwise = bool(getattr(config, "use_layerwise", False))
            self.save_chunk_meta = bool(extra.get("save_chunk_meta", True)) or layerwise
            layers, kv, tokens, heads, head_size = metadata.kv_shape
            # One group: the engine's single KV layout.
            self.meta_shapes = [torch.Size([kv, layers, tokens, heads * head_size])]
            self.meta_dtypes = [metadata.kv_dtype]
            self.meta_fmt = MemoryFormat.KV_MLA_FMT if metadata.use_mla else MemoryFormat.KV_2LTD
            self.full_chunk_size_bytes = sum(s.numel() * dtype_size(d)
                                             for s, d in zip(self.meta_shapes, self.meta_dtypes))
            self.single_token_size = self.full_chunk_size_bytes // tokens
            self.remote_metadata_bytes = REMOTE_METADATA_BYTES * len(self.meta_shapes)

        def support_batched_async_contains(self) -> bool:
            return True

        async def batched_async_contains(self, lookup_id: str, keys: List[CacheEngineKey],
                                         pin: bool = False) -> int:
            found = await asyncio.gather(*(self.exists(k) for k in keys))
            n = 0
            while n < len(found) and found[n]:
                n += 1
            return n

        def support_batched_get_non_blocking(self) -> bool:
            return True

        async def batched_get_non_blocking(self, lookup_id: str,
                                           keys: List[CacheEngineKey]) -> List[MemoryObj]:
            objs = await asyncio.gather(*(self.get(k) for k in keys))
            n = 0
            while n < len(objs) and objs[n] is not None:
                n += 1
            for obj in objs[n:]:
                if obj is not None:
                    obj.ref_count_down()
            return list(objs[:n])

        def support_batched_contains(self) -> bool:
            return False

        def batched_contains(self, keys: List[CacheEngineKey]) -> int:
            n = 0
            for key in keys:
                if not self.exists_sync(key):
                    break
                n += 1
            return n
