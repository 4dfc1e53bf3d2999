"""Stand-in of `lmcache.v1.storage_backend.storage_manager`: owns LMCache's
event loop (a daemon thread running `loop.run_forever()`), the local CPU
backend and the remote backends: one per name in
`config.remote_storage_plugins` (URL `plugin://<name>`), else one from the
deprecated `config.remote_url`."""
import asyncio
import threading
from typing import Dict, List, Optional

from lmcache.v1.memory_management import MemoryObj
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
from lmcache.v1.storage_backend.remote_backend import RemoteBackend


class StorageManager:
    def __init__(self, config, metadata, local_cpu_backend: Optional[LocalCPUBackend] = None):
        self.config = config
        self.metadata = metadata
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True,
                                       name="lmcache-event-loop")
        self.thread.start()
        self.local_cpu_backend = local_cpu_backend or LocalCPUBackend(config,
                                                                         metadata=metadata)
        self.remote_backends: Dict[str, RemoteBackend] = {}
        try:
            for name in config.remote_storage_plugins or []:
                self.remote_backends[name] = RemoteBackend(
                    config, metadata, self.loop, self.local_cpu_backend, plugin_name=name)
            if not self.remote_backends and config.remote_url:
                self.remote_backends["RemoteBackend"] = RemoteBackend(
                    config, metadata, self.loop, self.local_cpu_backend)
        except BaseException:
            self._stop_loop()
            raise

    def allocate(self, shape, dtype, fmt) -> Optional[MemoryObj]:
        return self.local_cpu_backend.allocate(shape, dtype, fmt)

    def batched_put(self, keys, memory_objs: List[MemoryObj]) -> None:
        """Hands the objects to every remote backend, then drops the caller's
        reference (the backends hold their own until their puts finish)."""
        for backend in self.remote_backends.values():
            backend.batched_submit_put_task(keys, memory_objs)
        for obj in memory_objs:
            obj.ref_count_down()

    def _stop_loop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)

    def close(self) -> None:
        for backend in self.remote_backends.values():
            backend.close()
        self._stop_loop()
        self.loop.close()
