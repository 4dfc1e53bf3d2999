"""Stand-in of vllm.distributed.kv_transfer.kv_connector.v1.

The real __init__ imports every bundled connector; ENGINES.md §4.3 says to
stub it and load base.py directly. It re-exports the base names, as upstream
does, so `from ...v1 import KVConnectorRole` also works.
"""

from .base import (KVConnectorBase_V1, KVConnectorRole, KVConnectorTransferResults, SupportsHMA,
                   supports_hma)

__all__ = ["KVConnectorBase_V1", "KVConnectorRole", "KVConnectorTransferResults", "SupportsHMA",
           "supports_hma"]
