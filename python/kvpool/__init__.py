"""kvpool: Python client of the kvpool KV cache, plus engine connectors.

Pure Python over libkvpool.so (ctypes). See kvpool.client for the API and
kvpool.integrations for the SGLang, vLLM and LMCache connectors.
"""

from .client import Client, KeyIds, KvpoolError, StatusCode, buffer_address, version
from .descriptor import BlockDescriptor

__all__ = ["BlockDescriptor", "Client", "KeyIds", "KvpoolError", "StatusCode", "buffer_address",
           "version"]
from ._package_version import package_version as _package_version

__version__ = _package_version()
