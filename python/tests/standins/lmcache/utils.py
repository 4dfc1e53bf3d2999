"""Stand-in of `lmcache.utils`: `CacheEngineKey` in its v0.4+ shape (no `fmt`).

Key string: `model@world_size@worker_id@<chunk_hash hex>@<dtype str>[@tag%value...]`.
"""
from dataclasses import dataclass, field, replace
from typing import Dict, Optional

import torch

_DTYPE_NAMES = {
    torch.float16: "half",
    torch.bfloat16: "bfloat16",
    torch.float32: "float",
    torch.float64: "double",
    torch.uint8: "uint8",
    torch.int8: "int8",
}
_NAME_DTYPES = {v: k for k, v in _DTYPE_NAMES.items()}


@dataclass(frozen=True)
class CacheEngineKey:
    model_name: str
    world_size: int
    worker_id: int
    chunk_hash: int
    dtype: torch.dtype
    request_configs: Optional[Dict[str, str]] = field(default=None, compare=False)

    def _tags(self) -> str:
        if not self.request_configs:
            return ""
        return "".join(f"@{k}%{v}" for k, v in sorted(self.request_configs.items()))

    def to_string(self) -> str:
        return (f"{self.model_name}@{self.world_size}@{self.worker_id}"
                f"@{self.chunk_hash:x}@{_DTYPE_NAMES[self.dtype]}{self._tags()}")

    @staticmethod
    def from_string(s: str) -> "CacheEngineKey":
        parts = s.split("@")
        if len(parts) < 5:
            raise ValueError(f"invalid key string {s!r}")
        tags = dict(p.split("%", 1) for p in parts[5:]) or None
        return CacheEngineKey(parts[0], int(parts[1]), int(parts[2]), int(parts[3], 16),
                              _NAME_DTYPES[parts[4]], tags)

    def split_layers(self, num_layers: int):
        return [LayerCacheEngineKey(self.model_name, self.world_size, self.worker_id,
                                    self.chunk_hash, self.dtype, self.request_configs, i)
                for i in range(num_layers)]

    def with_new_worker_id(self, worker_id: int) -> "CacheEngineKey":
        return replace(self, worker_id=worker_id)


@dataclass(frozen=True)
class LayerCacheEngineKey(CacheEngineKey):
    layer_id: int = 0

    def to_string(self) -> str:
        return super().to_string() + f"@{self.layer_id}"
