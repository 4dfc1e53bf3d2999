"""Stand-in of `lmcache.v1.config`: the engine configuration fields the remote
path reads."""
from dataclasses import dataclass
from typing import List, Optional


@dataclass
class LMCacheEngineConfig:
    chunk_size: int = 256
    local_cpu: bool = True
    max_local_cpu_size: float = 5.0  # GB
    remote_url: Optional[str] = None  # deprecated in favour of remote_storage_plugins
    remote_serde: Optional[str] = "naive"
    remote_storage_plugins: Optional[List[str]] = None
    storage_plugins: Optional[List[str]] = None
    # Flat keys, e.g. "remote_storage_plugin.kvpool.module_path".
    extra_config: Optional[dict] = None
    blocking_timeout_secs: float = 10
    use_layerwise: bool = False
    save_unfull_chunk: bool = True

    @staticmethod
    def from_defaults(**kwargs) -> "LMCacheEngineConfig":
        return LMCacheEngineConfig(**kwargs)
