"""Stand-in of vllm/v1/outputs.py: KVConnectorOutput and ModelRunnerOutput."""

from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class KVConnectorOutput:
    finished_sending: Optional[set[str]] = None
    finished_recving: Optional[set[str]] = None
    kv_connector_stats: Any = None
    kv_cache_events: Any = None
    invalid_block_ids: set[int] = field(default_factory=set)
    expected_finished_count: int = 0

    def is_empty(self) -> bool:
        return (not self.finished_sending and not self.finished_recving
                and not self.kv_connector_stats and not self.kv_cache_events
                and not self.invalid_block_ids)


@dataclass
class ModelRunnerOutput:
    req_ids: list[str] = field(default_factory=list)
    # One sampled token per request that completed its prompt this step.
    sampled_token_ids: dict[str, int] = field(default_factory=dict)
    kv_connector_output: Optional[KVConnectorOutput] = None
    # Stand-in only: blocks whose KV the attention read differed from the
    # KV the prefix must have (see gpu_model_runner).
    wrong_kv_block_ids: set[int] = field(default_factory=set)
