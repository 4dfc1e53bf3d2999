"""Stand-in of sglang/srt/mem_cache/storage/backend_factory.py (ENGINES.md 1.6).

Registry of storage backends plus the `dynamic` loader: import
extra_config["module_path"], take extra_config["class_name"], require a
HiCacheStorage subclass, construct it as cls(storage_config, kwargs).
"""

import importlib
import logging
from typing import Any, Dict

from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, HiCacheStorageConfig

logger = logging.getLogger(__name__)


class StorageBackendFactory:
    _registry: Dict[str, Dict[str, Any]] = {}

    @staticmethod
    def _load_backend_class(module_path: str, class_name: str, backend_name: str):
        try:
            module = importlib.import_module(module_path)
            backend_class = getattr(module, class_name)
        except (ImportError, AttributeError) as e:
            raise ImportError(
                f"Failed to import backend '{backend_name}' from '{module_path}': {e}"
            ) from e
        if not issubclass(backend_class, HiCacheStorage):
            raise TypeError(f"{backend_class} is not a subclass of HiCacheStorage")
        return backend_class

    @classmethod
    def register_backend(cls, name: str, module_path: str, class_name: str) -> None:
        if name in cls._registry:
            logger.warning("Backend %s is already registered, overwriting", name)

        def loader():
            return cls._load_backend_class(module_path, class_name, name)

        cls._registry[name] = {"loader": loader, "module_path": module_path,
                               "class_name": class_name}

    @classmethod
    def create_backend(cls, backend_name: str, storage_config: HiCacheStorageConfig,
                       mem_pool_host: Any, **kwargs) -> HiCacheStorage:
        if backend_name in cls._registry:
            backend_class = cls._registry[backend_name]["loader"]()
            return backend_class(storage_config)
        if backend_name == "dynamic" and storage_config.extra_config is not None:
            extra = storage_config.extra_config
            name = extra.get("backend_name")
            backend_class = cls._load_backend_class(extra["module_path"], extra["class_name"], name)
            logger.info("Creating dynamic backend %s from %s.%s", name, extra["module_path"],
                        extra["class_name"])
            return backend_class(storage_config, kwargs)
        raise ValueError(f"Unknown storage backend '{backend_name}'. "
                         f"Registered backends: {list(cls._registry.keys())}. ")
