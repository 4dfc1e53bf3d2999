"""Stand-in of vllm/distributed/kv_transfer/kv_connector/base.py (aliases)."""

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1

KVConnectorBase = KVConnectorBase_V1
KVConnectorBaseType = KVConnectorBase_V1

__all__ = ["KVConnectorBase", "KVConnectorBaseType"]
