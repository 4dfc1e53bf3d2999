"""Stand-in of vllm/distributed/kv_transfer/kv_connector/factory.py.

Selection as in newer vLLM (ENGINES.md §2.2): kv_connector_module_path, when
set, takes priority (import_module(path), then getattr(module,
kv_connector)); otherwise the lazy registry. An external class whose
constructor lacks kv_cache_config is called the deprecated 2-argument way.
The factory refuses an HMA setup when the connector lacks SupportsHMA.
"""

import importlib
import inspect
from typing import Callable

from vllm.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorBase_V1,
                                                               KVConnectorRole, supports_hma)
from vllm.logger import init_logger

logger = init_logger(__name__)


class KVConnectorFactory:
    _registry: dict[str, Callable[[], type]] = {}

    @classmethod
    def register_connector(cls, name: str, module_path: str, class_name: str) -> None:
        if name in cls._registry:
            raise ValueError("Connector '%s' is already registered." % name)

        def loader() -> type:
            return getattr(importlib.import_module(module_path), class_name)

        cls._registry[name] = loader

    @classmethod
    def get_connector_class(cls, kv_transfer_config) -> type:
        name = kv_transfer_config.kv_connector
        if name is None:
            raise ValueError("Connector name is not set in KVTransferConfig")
        path = kv_transfer_config.kv_connector_module_path
        if path:
            connector_cls = getattr(importlib.import_module(path), name, None)
            if connector_cls is None:
                raise ValueError("Class %s not found in %s" % (name, path))
        elif name in cls._registry:
            connector_cls = cls._registry[name]()
        else:
            raise ValueError("Unsupported connector type: %s" % name)
        if not issubclass(connector_cls, KVConnectorBase_V1):
            raise TypeError("%s is not a KVConnectorBase_V1" % connector_cls)
        return connector_cls

    @classmethod
    def create_connector(cls, config, role: KVConnectorRole,
                         kv_cache_config=None, hybrid_kv_cache_manager: bool = False):
        kv_transfer_config = config.kv_transfer_config
        if kv_transfer_config is None:
            raise ValueError("kv_transfer_config must be set to create a connector")
        connector_cls = cls.get_connector_class(kv_transfer_config)
        if hybrid_kv_cache_manager and not supports_hma(connector_cls):
            raise ValueError("Connector %s does not support HMA but HMA is enabled. Please set "
                             "`--disable-hybrid-kv-cache-manager`." % connector_cls.__name__)
        params = inspect.signature(connector_cls.__init__).parameters
        if "kv_cache_config" in params:
            return connector_cls(config, role, kv_cache_config)
        logger.warning("Connector %s uses deprecated signature with 2 required arguments.",
                       connector_cls.__name__)
        return connector_cls(config, role)
