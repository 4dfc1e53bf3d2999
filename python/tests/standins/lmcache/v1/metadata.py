"""Stand-in of `lmcache.v1.metadata`, the newer home of the engine metadata:
the older `lmcache.config.LMCacheEngineMetadata` fields plus the local
worker coordinates and the engine id."""
from dataclasses import dataclass
from typing import Optional

from lmcache.config import LMCacheEngineMetadata


@dataclass
class LMCacheMetadata(LMCacheEngineMetadata):
    local_world_size: int = 1
    local_worker_id: int = 0
    engine_id: Optional[str] = None
