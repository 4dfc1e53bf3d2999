"""Stand-in of `lmcache.v1.storage_backend.connector`: the adapter registry
(ENGINES.md §3.4).

`CreateConnector(url, ...)` collects adapters (built-ins: every `*_adapter`
module of this package, every `ConnectorAdapter` subclass in it built with no
arguments; then one per name in `config.remote_storage_plugins`, from
`extra_config["remote_storage_plugin.<name>.module_path"/".class_name"]`: a
`ConnectorAdapter` subclass is built with no arguments, a `RemoteConnector`
subclass is wrapped in `DynamicConnectorAdapter` with schema
`plugin://<type>`), picks the first whose `can_parse(url)` is true, calls
`create_connector(ConnectorContext)` and wraps the result in
`InstrumentedRemoteConnector`.

2026 (`lmcache._contract`, ENGINES.md §6.2): an adapter matches only with a
non-empty schema (`schema != "" and url.startswith(schema)`), and
`DynamicConnectorAdapter` matches `plugin://<type>` and
`plugin://<type>.<instance>`, not `plugin://<type>x`. Both releases build
a `RemoteConnector` subclass as `cls(loop=, local_cpu_backend=, config=)`,
without the metadata.
"""
import abc
import asyncio
import importlib
import inspect
import pkgutil
from dataclasses import dataclass
from typing import Any, List, Optional
from urllib.parse import parse_qs, urlparse

from lmcache._contract import IS_2026
from lmcache.logging import init_logger
from lmcache.v1.memory_management import dtype_size
from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector
from lmcache.v1.storage_backend.connector.instrumented_connector import (
    InstrumentedRemoteConnector)

logger = init_logger(__name__)


@dataclass
class ConnectorContext:
    url: str
    loop: asyncio.AbstractEventLoop
    local_cpu_backend: Any
    config: Any = None
    metadata: Any = None
    plugin_name: Optional[str] = None

    def get_full_chunk_size_bytes(self) -> int:
        layers, kv, tokens, heads, head_size = self.metadata.kv_shape
        return layers * kv * tokens * heads * head_size * dtype_size(self.metadata.kv_dtype)


class ConnectorAdapter(abc.ABC):
    def __init__(self, schema: str = ""):
        self.schema = schema

    def can_parse(self, url: str) -> bool:
        if IS_2026:
            return self.schema != "" and url.startswith(self.schema)
        return url.startswith(self.schema)

    @abc.abstractmethod
    def create_connector(self, context: ConnectorContext) -> RemoteConnector: ...


@dataclass
class ParsedRemoteURL:
    host: str
    port: int
    path: str
    username: Optional[str] = None
    password: Optional[str] = None
    query_params: Optional[dict] = None


def parse_remote_url(url: str) -> ParsedRemoteURL:
    parsed = urlparse(url)
    assert parsed.hostname, f"no host in {url!r}"
    assert parsed.port, f"no port in {url!r}"
    return ParsedRemoteURL(parsed.hostname, parsed.port, parsed.path, parsed.username,
                           parsed.password, parse_qs(parsed.query))


def extract_plugin_type(name: str) -> str:
    """`kvpool.primary` -> `kvpool`."""
    return name.split(".", 1)[0]


class DynamicConnectorAdapter(ConnectorAdapter):
    """Wraps a plugin that names a `RemoteConnector` subclass directly."""

    def __init__(self, plugin_type: str, connector_cls):
        super().__init__(f"plugin://{plugin_type}")
        self.connector_cls = connector_cls

    def can_parse(self, url: str) -> bool:
        if IS_2026:
            return url == self.schema or url.startswith(self.schema + ".")
        return super().can_parse(url)

    def create_connector(self, context: ConnectorContext) -> RemoteConnector:
        return self.connector_cls(loop=context.loop, local_cpu_backend=context.local_cpu_backend,
                                  config=context.config)


class ConnectorManager:
    def __init__(self, url: str, loop, local_cpu_backend, config=None, metadata=None,
                 plugin_name: Optional[str] = None):
        self.context = ConnectorContext(url, loop, local_cpu_backend, config, metadata,
                                        plugin_name)
        self.adapters: List[ConnectorAdapter] = []
        self._discover_builtins()
        self._load_plugins(config)

    def _discover_builtins(self) -> None:
        for info in pkgutil.iter_modules(__path__):
            if not info.name.endswith("_adapter") or info.name.startswith("_"):
                continue
            module = importlib.import_module(f"{__name__}.{info.name}")
            for _, cls in inspect.getmembers(module, inspect.isclass):
                if (issubclass(cls, ConnectorAdapter) and cls.__module__ == module.__name__
                        and not inspect.isabstract(cls)):
                    self.adapters.append(cls())

    def _load_plugins(self, config) -> None:
        if config is None or not config.remote_storage_plugins:
            return
        extra = config.extra_config or {}
        for name in config.remote_storage_plugins:
            module_path = extra.get(f"remote_storage_plugin.{name}.module_path")
            class_name = extra.get(f"remote_storage_plugin.{name}.class_name")
            if not module_path or not class_name:
                raise ValueError(f"remote storage plugin {name!r} lacks module_path/class_name")
            cls = getattr(importlib.import_module(module_path), class_name)
            if issubclass(cls, ConnectorAdapter):
                self.adapters.append(cls())
            elif issubclass(cls, RemoteConnector):
                self.adapters.append(DynamicConnectorAdapter(extract_plugin_type(name), cls))
            else:
                raise TypeError(f"{module_path}.{class_name} is neither an adapter nor a connector")

    def create_connector(self) -> RemoteConnector:
        for adapter in self.adapters:
            if adapter.can_parse(self.context.url):
                return adapter.create_connector(self.context)
        raise ValueError(f"no connector adapter accepts {self.context.url!r}")


def CreateConnector(url: str, loop, local_cpu_backend, config=None, metadata=None,
                    plugin_name: Optional[str] = None) -> InstrumentedRemoteConnector:
    if "://" not in url:
        raise ValueError(f"invalid remote url {url!r}: no scheme")
    manager = ConnectorManager(url, loop, local_cpu_backend, config, metadata, plugin_name)
    connector = manager.create_connector()
    connector.post_init()
    return InstrumentedRemoteConnector(connector)
