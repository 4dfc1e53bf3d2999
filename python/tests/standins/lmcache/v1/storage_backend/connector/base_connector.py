"""Stand-in of `lmcache.v1.storage_backend.connector.base_connector`: the
`RemoteConnector` ABC (ENGINES.md §3.2). All abstract methods except
`exists_sync` are coroutines; `RemoteBackend` runs them on LMCache's event
loop thread."""
import abc
from typing import List, Optional

import torch

from lmcache.utils import CacheEngineKey
from lmcache.v1.memory_management import MemoryFormat, MemoryObj, dtype_size


class RemoteConnector(metaclass=abc.ABCMeta):
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

    def remove_sync(self, key: CacheEngineKey) -> bool:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<{self.__class__.__name__}>"
