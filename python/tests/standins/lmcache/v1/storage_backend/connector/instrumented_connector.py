"""Stand-in of `connector/instrumented_connector.py`: the wrapper LMCache puts
around every connector. It adds metrics and, after `put`/`batched_put`
returns (or raises), drops the reference the serializer took: connectors do
not release put objects themselves. `batched_contains` passes the call on in
the shape of the release imitated (`lmcache._contract`): with the stop flag
(2025), without it (2026)."""
from typing import List, Optional

from lmcache._contract import IS_2026
from lmcache.observability import LMCStatsMonitor
from lmcache.utils import CacheEngineKey
from lmcache.v1.memory_management import MemoryObj
from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector


class InstrumentedRemoteConnector(RemoteConnector):
    def __init__(self, connector: RemoteConnector):
        self._connector = connector
        self._stats_monitor = LMCStatsMonitor.GetOrCreate()

    def getWrappedConnector(self) -> RemoteConnector:
        return self._connector

    def post_init(self):
        self._connector.post_init()

    async def exists(self, key: CacheEngineKey) -> bool:
        return await self._connector.exists(key)

    def exists_sync(self, key: CacheEngineKey) -> bool:
        return self._connector.exists_sync(key)

    async def get(self, key: CacheEngineKey) -> Optional[MemoryObj]:
        obj = await self._connector.get(key)
        if obj is not None:
            self._stats_monitor.update_interval_remote_read_metrics(obj.get_size())
        return obj

    async def put(self, key: CacheEngineKey, memory_obj: MemoryObj):
        try:
            await self._connector.put(key, memory_obj)
            self._stats_monitor.update_interval_remote_write_metrics(memory_obj.get_size())
        finally:
            memory_obj.ref_count_down()

    async def list(self) -> List[str]:
        return await self._connector.list()

    async def close(self):
        await self._connector.close()

    def support_ping(self) -> bool:
        return self._connector.support_ping()

    async def ping(self) -> int:
        return await self._connector.ping()

    def support_batched_get(self) -> bool:
        return self._connector.support_batched_get()

    async def batched_get(self, keys):
        objs = await self._connector.batched_get(keys)
        for obj in objs:
            if obj is not None:
                self._stats_monitor.update_interval_remote_read_metrics(obj.get_size())
        return objs

    def support_batched_put(self) -> bool:
        return self._connector.support_batched_put()

    async def batched_put(self, keys, memory_objs):
        try:
            await self._connector.batched_put(keys, memory_objs)
        finally:
            for obj in memory_objs:
                obj.ref_count_down()

    def support_batched_async_contains(self) -> bool:
        return self._connector.support_batched_async_contains()

    async def batched_async_contains(self, lookup_id, keys, pin=False) -> int:
        return await self._connector.batched_async_contains(lookup_id, keys, pin)

    def support_batched_get_non_blocking(self) -> bool:
        return self._connector.support_batched_get_non_blocking()

    async def batched_get_non_blocking(self, lookup_id, keys):
        return await self._connector.batched_get_non_blocking(lookup_id, keys)

    def support_batched_contains(self) -> bool:
        return self._connector.support_batched_contains()

    if IS_2026:
        def batched_contains(self, keys) -> int:
            return self._connector.batched_contains(keys)
    else:
        def batched_contains(self, keys, stop_after_first_not_exits=True) -> List[bool]:
            return self._connector.batched_contains(keys, stop_after_first_not_exits)

    def remove_sync(self, key) -> bool:
        return self._connector.remove_sync(key)

    def __repr__(self) -> str:
        return f"InstrumentedRemoteConnector({self._connector!r})"
