"""Stand-in of vllm/distributed/kv_transfer/kv_connector/v1/base.py.

The shape of v0.11 to v0.2x (ENGINES.md §2.2, §2.3, §2.7): the constructor
takes an optional kv_cache_config, get_num_new_matched_tokens may return
None, get_block_ids_with_load_errors and SupportsHMA exist; with the 2026
additions of ENGINES.md §6.3/§6.4: get_transfer_results returning
KVConnectorTransferResults (by default from get_finished), and the
requires_kv_delivery property (default: is_kv_producer). Abstract methods
are exactly the upstream ones, so a connector that misses one fails to
instantiate here as it would in vLLM.
"""

import enum
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Literal, Optional

import torch

from vllm.logger import init_logger
from vllm.v1.attention.backend import AttentionBackend, AttentionMetadata  # noqa: F401
from vllm.v1.core.sched.output import SchedulerOutput  # noqa: F401
from vllm.v1.outputs import KVConnectorOutput  # noqa: F401

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

CopyBlocksOp = Callable[[dict[str, torch.Tensor], dict[str, torch.Tensor], list[int], list[int],
                         Literal["h2d", "d2h"]], None]

logger = init_logger(__name__)


class KVConnectorRole(enum.Enum):
    SCHEDULER = 0
    WORKER = 1


class KVConnectorMetadata(ABC):  # noqa: B024
    """Per-step data from the scheduler-side connector to the workers."""


@dataclass
class KVConnectorTransferResults:
    """What a worker reports after each step (ENGINES.md §6.4): requests whose
    saves and loads finished; a failed load is in both finished_recving and
    failed_recving."""

    finished_sending: Optional[set[str]] = None
    finished_recving: Optional[set[str]] = None
    failed_recving: set[str] = field(default_factory=set)


class SupportsHMA(ABC):
    @abstractmethod
    def request_finished_all_groups(self, request: "Request",
                                    block_ids: tuple[list[int], ...]) -> tuple[bool, Optional[dict]]:
        raise NotImplementedError


def supports_hma(connector: Any) -> bool:
    if isinstance(connector, type):
        return issubclass(connector, SupportsHMA)
    return isinstance(connector, SupportsHMA)


class KVConnectorBase_V1(ABC):
    def __init__(self, vllm_config: "VllmConfig", role: KVConnectorRole,
                 kv_cache_config: Optional["KVCacheConfig"] = None):
        logger.warning("Initializing KVConnectorBase_V1. This API is experimental and "
                       "subject to change in the future as we iterate the design.")
        self._connector_metadata: Optional[KVConnectorMetadata] = None
        self._vllm_config = vllm_config
        if vllm_config.kv_transfer_config is None:
            raise ValueError("kv_transfer_config must be set for KVConnectorBase_V1")
        self._kv_transfer_config = vllm_config.kv_transfer_config
        self._kv_cache_config = kv_cache_config
        self._role = role

    @property
    def role(self) -> KVConnectorRole:
        return self._role

    # ---- worker side ----
    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        self._connector_metadata = connector_metadata

    def clear_connector_metadata(self) -> None:
        self._connector_metadata = None

    def _get_connector_metadata(self) -> KVConnectorMetadata:
        assert self._connector_metadata is not None
        return self._connector_metadata

    def has_connector_metadata(self) -> bool:
        return self._connector_metadata is not None

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]):
        return

    def register_cross_layers_kv_cache(self, kv_cache: torch.Tensor, attn_backend: type):
        return

    def set_host_xfer_buffer_ops(self, copy_operation: CopyBlocksOp):
        return

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata):
        return

    @abstractmethod
    def start_load_kv(self, forward_context: "ForwardContext", **kwargs: Any) -> None:
        pass

    @abstractmethod
    def wait_for_layer_load(self, layer_name: str) -> None:
        pass

    @abstractmethod
    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor,
                      attn_metadata: "AttentionMetadata", **kwargs: Any) -> None:
        pass

    @abstractmethod
    def wait_for_save(self):
        pass

    def get_finished(self, finished_req_ids: set[str]) -> tuple[Optional[set[str]], Optional[set[str]]]:
        return None, None

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        sending, recving = self.get_finished(finished_req_ids)
        return KVConnectorTransferResults(sending, recving, set())

    def get_block_ids_with_load_errors(self) -> set[int]:
        return set()

    def shutdown(self):
        return None

    def get_kv_connector_stats(self):
        return None

    def get_kv_connector_kv_cache_events(self):
        return None

    def get_handshake_metadata(self):
        return None

    # ---- scheduler side ----
    @abstractmethod
    def get_num_new_matched_tokens(self, request: "Request",
                                   num_computed_tokens: int) -> tuple[Optional[int], bool]:
        pass

    @abstractmethod
    def update_state_after_alloc(self, request: "Request", blocks: "KVCacheBlocks",
                                 num_external_tokens: int):
        pass

    @abstractmethod
    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        pass

    def update_connector_output(self, connector_output: KVConnectorOutput):
        return

    def request_finished(self, request: "Request",
                         block_ids: list[int]) -> tuple[bool, Optional[dict[str, Any]]]:
        return False, None

    def take_events(self) -> Iterable[Any]:
        return ()

    def get_finished_count(self) -> Optional[int]:
        return None

    def reset_cache(self) -> Optional[bool]:
        return None

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: "VllmConfig") -> Optional[str]:
        return None

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict[str, Any]) -> bool:
        return False

    @property
    def prefer_cross_layer_blocks(self) -> bool:
        return False

    @property
    def requires_kv_delivery(self) -> bool:
        return self._kv_transfer_config.is_kv_producer
