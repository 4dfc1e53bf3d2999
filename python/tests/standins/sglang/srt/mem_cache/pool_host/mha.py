"""Stand-in: pool_host/mha.py."""

from sglang.srt.mem_cache.memory_pool_host import MHATokenToKVPoolHost  # noqa: F401
