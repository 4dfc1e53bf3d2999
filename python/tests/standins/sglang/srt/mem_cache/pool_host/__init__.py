"""Stand-in of sglang/srt/mem_cache/pool_host/ (the 2026 home of the host
pools); the classes are those of memory_pool_host.py."""
