"""Stand-in of a built-in adapter (`blackhole://`): stores nothing, finds
nothing. Present so that built-in discovery has something to find."""
from typing import List, Optional

from lmcache.v1.storage_backend.connector import ConnectorAdapter, ConnectorContext
from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector


class BlackholeConnector(RemoteConnector):
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
        return BlackholeConnector()
