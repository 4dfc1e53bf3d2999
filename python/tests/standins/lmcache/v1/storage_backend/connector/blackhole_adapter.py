"""Stand-in of a built-in adapter (`blackhole://`): stores nothing, finds
nothing. Present so that built-in discovery has something to find. Under the
2026 contract it runs the base constructor (config, metadata)."""
from typing import List

from lmcache._contract import IS_2026
from lmcache.v1.storage_backend.connector import ConnectorAdapter, ConnectorContext
from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector


class BlackholeConnector(RemoteConnector):
    def __init__(self, config=None, metadata=None):
        if IS_2026:
            super().__init__(config, metadata)

    async def exists(self, key) -> bool:
        return False

    def exists_sync(self, key) -> bool:
        return False

    async def get(self, key):
        return None

    async def put(self, key, memory_obj):
        pass

    async def list(self) -> List[str]:
        return []

    async def close(self):
        pass


class BlackholeConnectorAdapter(ConnectorAdapter):
    def __init__(self):
        super().__init__("blackhole://")

    def create_connector(self, context: ConnectorContext) -> RemoteConnector:
        return BlackholeConnector(context.config, context.metadata)
