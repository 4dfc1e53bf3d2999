"""Stand-in: pool_host/mla.py."""

from sglang.srt.mem_cache.memory_pool_host import MLATokenToKVPoolHost  # noqa: F401
