"""Stand-in: pool_host/base.py."""

from sglang.srt.mem_cache.memory_pool_host import HostKVCache  # noqa: F401
