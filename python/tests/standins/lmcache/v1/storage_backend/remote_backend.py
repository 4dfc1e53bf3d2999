"""Stand-in of `lmcache.v1.storage_backend.remote_backend.RemoteBackend`: the
caller of a remote connector (ENGINES.md §3.2).

Every connector coroutine runs on LMCache's event loop (its own thread) via
`asyncio.run_coroutine_threadsafe`. Puts are fire-and-forget: the naive serde
takes one reference (ref_count_up) and the instrumented wrapper drops it
after the connector's put. Blocking gets wait `blocking_timeout_secs` and
cancel the coroutine on timeout. With MLA and world_size > 1
(`extra_config.remote_enable_mla_worker_id_as0`, default `metadata.use_mla`)
ranks other than 0 skip puts and read worker 0's keys.

`batched_contains(keys, pin) -> int` (ENGINES.md §6.2) asks the connector
only when it supports batched contains: in 2026 it takes the count the
connector answers; in 2025 (`lmcache._contract`) it counts the leading True
of the list the connector answers. Otherwise it loops over `contains`. An
exception counts as 0.
"""
import asyncio
import concurrent.futures
from typing import List, Optional

from lmcache._contract import IS_2026
from lmcache.logging import init_logger
from lmcache.utils import CacheEngineKey
from lmcache.v1.memory_management import MemoryObj
from lmcache.v1.storage_backend.connector import CreateConnector

logger = init_logger(__name__)


class RemoteBackend:
    def __init__(self, config, metadata, loop: asyncio.AbstractEventLoop, local_cpu_backend,
                 dst_device: str = "cpu", plugin_name: Optional[str] = None):
        self.config = config
        self.metadata = metadata
        self.loop = loop
        self.local_cpu_backend = local_cpu_backend
        self.blocking_timeout_secs = config.blocking_timeout_secs
        extra = config.extra_config or {}
        self.use_exists_sync = bool(extra.get("use_exists_sync", False))
        mla_as0 = extra.get("remote_enable_mla_worker_id_as0",
                            bool(metadata is not None and metadata.use_mla))
        self.mla_worker_id_as0 = bool(mla_as0 and metadata is not None
                                      and metadata.world_size > 1)
        self.worker_id = metadata.worker_id if metadata is not None else 0
        url = f"plugin://{plugin_name}" if plugin_name else config.remote_url
        self.connection = CreateConnector(url, loop, local_cpu_backend, config, metadata,
                                          plugin_name)
        self.put_futures: List[concurrent.futures.Future] = []
        self.timeouts = 0

    def _run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def _read_key(self, key: CacheEngineKey) -> CacheEngineKey:
        return key.with_new_worker_id(0) if self.mla_worker_id_as0 else key

    def _skip_put(self) -> bool:
        return self.mla_worker_id_as0 and self.worker_id != 0

    def contains(self, key: CacheEngineKey, pin: bool = False) -> bool:
        key = self._read_key(key)
        if self.use_exists_sync:
            return self.connection.exists_sync(key)
        return self._run(self.connection.exists(key)).result()

    def batched_async_contains(self, lookup_id: str, keys: List[CacheEngineKey],
                               pin: bool = False) -> int:
        keys = [self._read_key(k) for k in keys]
        if self.connection.support_batched_async_contains():
            return self._run(self.connection.batched_async_contains(lookup_id, keys, pin)).result()
        n = 0
        for key in keys:
            if not self._run(self.connection.exists(key)).result():
                break
            n += 1
        return n

    def batched_contains(self, keys: List[CacheEngineKey], pin: bool = False) -> int:
        try:
            if not self.connection.support_batched_contains():
                n = 0
                for key in keys:
                    if not self.contains(key, pin):
                        break
                    n += 1
                return n
            keys = [self._read_key(k) for k in keys]
            if IS_2026:
                return self.connection.batched_contains(keys)
            found = self.connection.batched_contains(keys)
            n = 0
            while n < len(found) and found[n]:
                n += 1
            return n
        except Exception as e:
            logger.warning("batched_contains failed: %s", e)
            return 0

    def submit_put_task(self, key: CacheEngineKey, memory_obj: MemoryObj):
        if self._skip_put():
            return None
        memory_obj.ref_count_up()  # naive serde
        future = self._run(self.connection.put(key, memory_obj))
        self.put_futures.append(future)
        return future

    def batched_submit_put_task(self, keys: List[CacheEngineKey], memory_objs: List[MemoryObj]):
        if self._skip_put():
            return None
        if not self.connection.support_batched_put():
            return [self.submit_put_task(k, o) for k, o in zip(keys, memory_objs)]
        for obj in memory_objs:
            obj.ref_count_up()
        future = self._run(self.connection.batched_put(keys, memory_objs))
        self.put_futures.append(future)
        return future

    def wait_for_puts(self, timeout: float = 30) -> None:
        """Test helper: wait for the fire-and-forget puts submitted so far."""
        futures, self.put_futures = self.put_futures, []
        concurrent.futures.wait(futures, timeout=timeout)

    def _blocking(self, coro):
        future = self._run(coro)
        try:
            return future.result(timeout=self.blocking_timeout_secs)
        except concurrent.futures.TimeoutError:
            self.timeouts += 1
            future.cancel()
            return None

    def get_blocking(self, key: CacheEngineKey) -> Optional[MemoryObj]:
        return self._blocking(self.connection.get(self._read_key(key)))

    def batched_get_blocking(self, keys: List[CacheEngineKey]) -> List[Optional[MemoryObj]]:
        keys = [self._read_key(k) for k in keys]
        if self.connection.support_batched_get():
            result = self._blocking(self.connection.batched_get(keys))
            return result if result is not None else [None] * len(keys)
        return [self._blocking(self.connection.get(k)) for k in keys]

    def batched_get_non_blocking(self, lookup_id: str, keys: List[CacheEngineKey]):
        keys = [self._read_key(k) for k in keys]
        return self._run(self.connection.batched_get_non_blocking(lookup_id, keys))

    def remove(self, key: CacheEngineKey) -> bool:
        return self.connection.remove_sync(key)

    def close(self) -> None:
        self.wait_for_puts()
        self._run(self.connection.close()).result(timeout=30)
