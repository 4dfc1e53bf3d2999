"""Stand-in of vllm/v1/request.py: the Request fields connectors read (ENGINES.md §2.4)."""

import enum
from typing import Any, Optional


class RequestStatus(enum.IntEnum):
    WAITING = enum.auto()
    WAITING_FOR_REMOTE_KVS = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()

    @staticmethod
    def is_finished(status: "RequestStatus") -> bool:
        return status > RequestStatus.PREEMPTED


class Request:
    def __init__(self, request_id: str, prompt_token_ids: list[int], sampling_params: Any = None,
                 lora_request: Any = None, cache_salt: Optional[str] = None,
                 mm_features: Optional[list] = None, max_tokens: int = 1):
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(self.prompt_token_ids)
        self._output_token_ids: list[int] = []
        self._all_token_ids: list[int] = list(self.prompt_token_ids)
        self.num_computed_tokens = 0
        self.status = RequestStatus.WAITING
        self.sampling_params = sampling_params
        self.lora_request = lora_request
        self.cache_salt = cache_salt
        self.mm_features = mm_features or []
        self.max_tokens = max_tokens
        self.kv_transfer_params = None
        if sampling_params is not None and getattr(sampling_params, "extra_args", None):
            self.kv_transfer_params = sampling_params.extra_args.get("kv_transfer_params")
        # vLLM's own chained prefix-cache hashes (one per full block); kvpool
        # does not depend on them (its keys are its own token-prefix hashes).
        self.block_hashes: list[bytes] = []

    @property
    def all_token_ids(self) -> list[int]:
        return self._all_token_ids

    @property
    def output_token_ids(self) -> list[int]:
        return self._output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self._all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self._output_token_ids)

    def append_output_token_ids(self, token_id: int) -> None:
        self._output_token_ids.append(token_id)
        self._all_token_ids.append(token_id)

    def is_finished(self) -> bool:
        return RequestStatus.is_finished(self.status)
