"""Stand-in of sglang/srt/mem_cache/storage/__init__.py: re-exports the factory."""

from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

__all__ = ["StorageBackendFactory"]
