"""Stand-in of `lmcache.observability`: the stats monitor the instrumented
connector reports to (a singleton in LMCache)."""
import threading


class LMCStatsMonitor:
    _instance = None
    _lock = threading.Lock()

    def __init__(self):
        self.remote_read_requests = 0
        self.remote_read_bytes = 0
        self.remote_write_requests = 0
        self.remote_write_bytes = 0

    @classmethod
    def GetOrCreate(cls) -> "LMCStatsMonitor":
        with cls._lock:
            if cls._instance is None:
                cls._instance = cls()
            return cls._instance

    def update_interval_remote_read_metrics(self, nbytes: int) -> None:
        with self._lock:
            self.remote_read_requests += 1
            self.remote_read_bytes += nbytes

    def update_interval_remote_write_metrics(self, nbytes: int) -> None:
        with self._lock:
            self.remote_write_requests += 1
            self.remote_write_bytes += nbytes
