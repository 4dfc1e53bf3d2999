"""kvpool as a vLLM KV connector (V1): a shared prefix cache for vLLM instances.

Enable with
  --kv-transfer-config '{"kv_connector": "KvpoolConnector",
                         "kv_connector_module_path": "kvpool.integrations.vllm",
                         "kv_role": "kv_both",
                         "kv_connector_extra_config": {"socket": "/run/kvpool/kvpool.sock"}}'
(and --disable-hybrid-kv-cache-manager where vLLM asks for it). Settings in
kv_connector_extra_config, the connectors' shared names
(kvpool.integrations._session): socket (default env KVPOOL_SOCKET, else the
library's default), remote (peer list: remote mode), namespace (replaces the
model name in the namespace), timeout_ms (default 2000), retry_interval_ms
(how long to wait before reconnecting after the node could not be reached;
default 10000: the scheduler thread makes the attempt). The kvpool_-prefixed
names of older releases (kvpool_socket, ..., kvpool_retry_interval_s) are
aliases.

One class, two roles (ENGINES.md §2.2). The scheduler-side instance finds
the longest prefix of a request's full blocks present in kvpool for every
shard, and tells the workers, through picklable metadata, which blocks to
load and which newly computed blocks to save. Each worker copies whole
blocks (all of its layers in one page per block) between the paged KV cache
and kvpool: loads before the forward pass, saves layer by layer as the
attention layers finish, stored when the forward pass ends. Loads and saves
complete within the step, so get_finished reports nothing and blocks are
never held after a request finishes.

Faults: a node that is down or goes away, a timeout, a page of another
geometry or a missing page are misses (scheduler) or load errors reported
block by block through get_block_ids_with_load_errors (worker), as in every
connector (the Session); no exception reaches vLLM and no foreign bytes
reach the KV cache.

Not thread-safe: vLLM calls each instance from one thread.
"""

import logging
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from vllm.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorBase_V1,
                                                               KVConnectorMetadata,
                                                               KVConnectorRole)

from . import _vllm_keys as keys_mod
from ._session import Session, SessionSettings
from ._vllm_layout import HEADER_BYTES, PageFormat, detect, infer_num_blocks

logger = logging.getLogger(__name__)

# A connect attempt runs on the scheduler thread and, in remote mode, can take
# up to timeout_ms: without a node, try at most every 10 s.
_DEFAULT_RETRY_MS = 10000


@dataclass
class BlockTransfer:
    """Blocks of one request to move: block_ids[i] <-> the page of hashes[i]."""

    req_id: str
    block_ids: list[int]
    hashes: list[bytes]


@dataclass
class KvpoolConnectorMetadata(KVConnectorMetadata):
    """One step's instructions for the workers (plain lists: picklable)."""

    loads: list[BlockTransfer] = field(default_factory=list)
    saves: list[BlockTransfer] = field(default_factory=list)


class _Settings:
    def __init__(self, vllm_config):
        ktc = vllm_config.kv_transfer_config
        extra = dict(getattr(ktc, "kv_connector_extra_config", None) or {})
        self.session = SessionSettings(retry_interval_ms=_DEFAULT_RETRY_MS).update(extra)
        role = getattr(ktc, "kv_role", None) or "kv_both"
        self.load = role in ("kv_consumer", "kv_both")
        self.save = role in ("kv_producer", "kv_both")
        self.block_size = int(vllm_config.cache_config.block_size)
        self.namespace, self.use_mla = keys_mod.namespace(vllm_config, self.session.namespace)
        pc = vllm_config.parallel_config
        self.tp_size = int(getattr(pc, "tensor_parallel_size", 1))
        self.pp_size = int(getattr(pc, "pipeline_parallel_size", 1))


class _Tracker:
    """Scheduler-side state of one request between allocation and finish."""

    def __init__(self, request, block_size):
        self.request = request
        self.hasher = keys_mod.BlockHasher(request, block_size)
        self.block_ids = []
        self.pending_load_tokens = 0
        self.saved_blocks = 0  # blocks [0, saved_blocks) are stored or planned


class _SchedulerSide:
    def __init__(self, settings):
        self._s = settings
        self._session = Session(settings.session, settings.namespace, log=logger)
        self._suffixes = keys_mod.all_rank_suffixes(settings.use_mla, settings.tp_size,
                                                    settings.pp_size)
        self._reqs = {}

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        s = self._s
        if not s.load:
            return 0, False
        bs = s.block_size
        # Leave at least one token to compute: vLLM needs logits for it.
        max_blocks = (request.num_tokens - 1) // bs
        first = num_computed_tokens // bs
        if max_blocks <= first:
            return 0, False
        hashes = keys_mod.BlockHasher(request, bs).upto(max_blocks)[first:]
        batch = [h + sfx for sfx in self._suffixes for h in hashes]
        hits = self._session.call(lambda c: c.exists(batch), None, "exists")
        if hits is None:
            return 0, False
        n = len(hashes)
        found = n
        for r in range(len(self._suffixes)):
            row = hits[r * n:(r + 1) * n]
            found = min(found, row.index(False) if False in row else n)
        return found * bs, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        t = self._reqs.get(request.request_id)
        if t is None:
            t = self._reqs[request.request_id] = _Tracker(request, self._s.block_size)
        t.request = request
        t.pending_load_tokens = num_external_tokens if self._s.load else 0

    def build_connector_meta(self, scheduler_output):
        meta = KvpoolConnectorMetadata()
        counts = scheduler_output.num_scheduled_tokens
        for nr in scheduler_output.scheduled_new_reqs:
            t = self._reqs.get(nr.req_id)
            if t is None:
                continue
            t.block_ids = list(nr.block_ids[0]) if nr.block_ids else []
            self._plan(nr.req_id, t, nr.num_computed_tokens, counts.get(nr.req_id, 0), meta)
        cached = scheduler_output.scheduled_cached_reqs
        resumed_flags = getattr(cached, "resumed_from_preemption", None) or ()
        resumed_ids = getattr(cached, "resumed_req_ids", None) or ()
        for i, req_id in enumerate(cached.req_ids):
            t = self._reqs.get(req_id)
            if t is None:
                continue
            resumed = req_id in resumed_ids or (i < len(resumed_flags) and resumed_flags[i])
            new_ids = cached.new_block_ids[i] if i < len(cached.new_block_ids) else None
            if resumed:
                t.block_ids = list(new_ids[0]) if new_ids else []
            elif new_ids:
                t.block_ids.extend(new_ids[0])
            self._plan(req_id, t, cached.num_computed_tokens[i], counts.get(req_id, 0), meta)
        return meta

    def _plan(self, req_id, t, num_computed, num_scheduled, meta):
        bs = self._s.block_size
        if t.pending_load_tokens:
            # num_computed = local hits + the external tokens promised for this request.
            end = num_computed // bs
            start = (num_computed - t.pending_load_tokens) // bs
            hashes = t.hasher.upto(end)
            if len(hashes) == end and end <= len(t.block_ids):
                meta.loads.append(BlockTransfer(req_id, t.block_ids[start:end], hashes[start:end]))
                t.saved_blocks = max(t.saved_blocks, end)
            else:  # vLLM allocated fewer blocks than it computes: not expected to happen
                logger.error("kvpool: request %s: cannot place %d external tokens in %d blocks",
                             req_id, t.pending_load_tokens, len(t.block_ids))
            t.pending_load_tokens = 0
        if self._s.save:
            # Full blocks whose KV exists once this step has run (tokens known;
            # speculative tokens beyond num_tokens are not).
            done = min(num_computed + num_scheduled, t.request.num_tokens) // bs
            done = min(done, len(t.block_ids))
            if done > t.saved_blocks:
                hashes = t.hasher.upto(done)
                first = t.saved_blocks
                meta.saves.append(BlockTransfer(req_id, t.block_ids[first:done], hashes[first:done]))
                t.saved_blocks = done

    def update_connector_output(self, connector_output):
        # Blocks that failed to load are recomputed; save them again then.
        invalid = getattr(connector_output, "invalid_block_ids", None)
        if not invalid:
            return
        for t in self._reqs.values():
            for i, b in enumerate(t.block_ids[:t.saved_blocks]):
                if b in invalid:
                    t.saved_blocks = i
                    break

    def request_finished(self, request, block_ids):
        self._reqs.pop(request.request_id, None)
        return False, None

    def close(self):
        self._session.close()


def _worker_ranks(settings, parallel_config):
    try:
        from vllm.distributed.parallel_state import get_pp_group, get_tensor_model_parallel_rank

        return int(get_tensor_model_parallel_rank()), int(get_pp_group().rank_in_group)
    except Exception:  # not importable or not initialized: the worker's rank in the config
        rank = int(getattr(parallel_config, "rank", 0))
        return rank % settings.tp_size, (rank // settings.tp_size) % settings.pp_size


class _WorkerSide:
    def __init__(self, settings, vllm_config, kv_cache_config):
        self._s = settings
        self._session = Session(settings.session, settings.namespace, log=logger)
        self.tp_rank, self.pp_rank = _worker_ranks(settings, vllm_config.parallel_config)
        self._suffix = keys_mod.rank_suffix(settings.use_mla, self.tp_rank, self.pp_rank)
        # MLA latents are identical on every TP rank: rank 0 writes them.
        self._writes = settings.save and not (settings.use_mla and self.tp_rank != 0)
        num_blocks = getattr(kv_cache_config, "num_blocks", None)
        if num_blocks is None:
            num_blocks = getattr(vllm_config.cache_config, "num_gpu_blocks", None)
        self._num_blocks = num_blocks
        self._format = None
        self._layers = {}
        self._load_errors = set()
        # This step's (metadata, block ids, keys, staging, layers still to copy).
        self._save = None
        self._buffers = {}  # "load"/"save" -> staging tensor
        self.stats = {"loaded_blocks": 0, "load_errors": 0, "saved_blocks": 0,
                      "skipped_saves": 0, "failed_saves": 0}

    def register_kv_caches(self, kv_caches):
        bs = self._s.block_size
        num_blocks = self._num_blocks or infer_num_blocks(kv_caches.values(), bs)
        try:
            layers = [detect(name, t, num_blocks, bs, self._s.use_mla)
                      for name, t in kv_caches.items()]
        except ValueError as e:
            logger.error("kvpool connector disabled: %s", e)
            return
        if not layers:
            return
        self._layers = {layer.name: layer for layer in layers}
        self._format = PageFormat(layers)
        logger.info("kvpool connector: rank tp%d/pp%d, %s, namespace %s", self.tp_rank,
                    self.pp_rank, self._format.describe(), self._s.namespace)

    def _keys(self, hashes):
        return [h + self._suffix for h in hashes]

    def _staging(self, purpose, n):
        """(n, page_bytes) host rows, reused across steps (fresh memory would
        cost a page fault per 4 KiB on every step). Puts and gets are
        synchronous, so a buffer is free again when its call returns."""
        buf = self._buffers.get(purpose)
        if buf is None or buf.shape[0] < n:
            buf = torch.empty((max(n, 16), self._format.page_bytes), dtype=torch.uint8)
            self._buffers[purpose] = buf
        return buf[:n]

    def start_load_kv(self, meta):
        # vLLM's dummy runs bind a bare KVConnectorMetadata.
        transfers = getattr(meta, "loads", None) or ()
        block_ids = [b for tr in transfers for b in tr.block_ids]
        if not block_ids:
            return
        if self._format is None:
            self._fail_loads(block_ids)
            return
        keys = self._keys([h for tr in transfers for h in tr.hashes])
        fmt = self._format
        staging = self._staging("load", len(keys))
        base, row = staging.data_ptr(), fmt.page_bytes
        ptrs = [base + i * row for i in range(len(keys))]
        statuses = self._session.call(lambda c: c.get_ptrs(keys, ptrs, [row] * len(keys)), None,
                                      "load")
        if statuses is None:
            self._fail_loads(block_ids)
            return
        expected = fmt.header_rows(keys)
        header_ok = (staging[:, :HEADER_BYTES] == expected).all(dim=1).tolist()
        good = [i for i, st in enumerate(statuses) if st == 0 and header_ok[i]]
        good_set = set(good)
        self._fail_loads([b for i, b in enumerate(block_ids) if i not in good_set])
        if not good:
            return
        sel = torch.tensor(good, dtype=torch.long)
        rows = staging.index_select(0, sel) if len(good) < len(keys) else staging
        for layer in fmt.layers:
            ids = torch.tensor([block_ids[i] for i in good], dtype=torch.long,
                               device=layer.device)
            layer.scatter(ids, fmt.layer_view(rows, layer).to(layer.device))
        self.stats["loaded_blocks"] += len(good)

    def _fail_loads(self, block_ids):
        if block_ids:
            self._load_errors.update(block_ids)
            self.stats["load_errors"] += len(block_ids)

    def save_kv_layer(self, meta, layer_name, kv_layer):
        if not self._writes or self._format is None or not getattr(meta, "saves", None):
            return
        if self._save is None or self._save[0] is not meta:  # first layer of this step
            self._save = (meta,) + self._begin_save(meta)
        _, block_ids, _, staging, pending = self._save
        layer = self._layers.get(layer_name)
        if not block_ids or layer is None or layer_name not in pending:
            return
        ids = torch.tensor(block_ids, dtype=torch.long, device=layer.device)
        self._format.layer_view(staging, layer).copy_(layer.gather(ids))
        pending.discard(layer_name)

    def _begin_save(self, meta):
        block_ids = [b for tr in meta.saves for b in tr.block_ids]
        keys = self._keys([h for tr in meta.saves for h in tr.hashes])
        present = self._session.call(lambda c: c.exists(keys), None, "exists")
        if present is None:  # kvpool down: nothing to save into
            self.stats["failed_saves"] += len(keys)
            return [], [], None, set()
        todo = [i for i, p in enumerate(present) if not p]
        self.stats["skipped_saves"] += len(keys) - len(todo)
        block_ids = [block_ids[i] for i in todo]
        keys = [keys[i] for i in todo]
        staging = self._staging("save", len(keys))
        if keys:
            staging[:, :HEADER_BYTES] = self._format.header_rows(keys)
        return block_ids, keys, staging, set(self._layers)

    def wait_for_save(self):
        save, self._save = self._save, None
        if save is None:
            return
        _, block_ids, keys, staging, pending = save
        if not keys:
            return
        if pending:
            # A page missing a layer would be wrong KV for whoever loads it.
            logger.warning("kvpool: %d layers were not saved this step; dropping %d pages",
                           len(pending), len(keys))
            self.stats["failed_saves"] += len(keys)
            return
        row = self._format.page_bytes
        base = staging.data_ptr()
        ptrs = [base + i * row for i in range(len(keys))]
        statuses = self._session.call(lambda c: c.put_ptrs(keys, ptrs, [row] * len(keys)), None,
                                      "save")
        ok = sum(1 for st in statuses or () if st == 0)
        self.stats["saved_blocks"] += ok
        self.stats["failed_saves"] += len(keys) - ok

    def take_load_errors(self):
        errors, self._load_errors = self._load_errors, set()
        return errors

    def close(self):
        self._save = None
        self._buffers = {}
        self._session.close()


def _init_base(connector, vllm_config, role, kv_cache_config):
    """Calls the base constructor with kv_cache_config only where the base
    takes it (vLLM <= 0.10 has the 2-argument form)."""
    import inspect

    params = inspect.signature(KVConnectorBase_V1.__init__).parameters
    if "kv_cache_config" in params:
        KVConnectorBase_V1.__init__(connector, vllm_config=vllm_config, role=role,
                                    kv_cache_config=kv_cache_config)
    else:
        KVConnectorBase_V1.__init__(connector, vllm_config=vllm_config, role=role)


def _is_scheduler(role):
    return role == KVConnectorRole.SCHEDULER or getattr(role, "name", None) == "SCHEDULER"


class KvpoolConnector(KVConnectorBase_V1):
    """vLLM KV connector (V1) over kvpool. See the module docstring."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        _init_base(self, vllm_config, role, kv_cache_config)
        settings = _Settings(vllm_config)
        self._scheduler_side = None
        self._worker_side = None
        if _is_scheduler(role):
            self._scheduler_side = _SchedulerSide(settings)
        else:
            self._worker_side = _WorkerSide(settings, vllm_config, kv_cache_config)

    # ---- worker side ----
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]):
        self._worker_side.register_kv_caches(kv_caches)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        self._worker_side.start_load_kv(self._connector_metadata)

    def wait_for_layer_load(self, layer_name: str) -> None:
        # start_load_kv has copied every layer already.
        return

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any,
                      **kwargs: Any) -> None:
        self._worker_side.save_kv_layer(self._connector_metadata, layer_name, kv_layer)

    def wait_for_save(self):
        self._worker_side.wait_for_save()

    def get_finished(self, finished_req_ids: set[str]) -> tuple[Optional[set[str]],
                                                                Optional[set[str]]]:
        # Loads and saves finish inside the step that issues them.
        return None, None

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self._worker_side.take_load_errors()

    # ---- scheduler side ----
    def get_num_new_matched_tokens(self, request: Any,
                                   num_computed_tokens: int) -> tuple[Optional[int], bool]:
        return self._scheduler_side.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int):
        self._scheduler_side.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        return self._scheduler_side.build_connector_meta(scheduler_output)

    def update_connector_output(self, connector_output: Any):
        self._scheduler_side.update_connector_output(connector_output)

    def request_finished(self, request: Any,
                         block_ids: list[int]) -> tuple[bool, Optional[dict[str, Any]]]:
        return self._scheduler_side.request_finished(request, block_ids)

    # ---- both ----
    @property
    def worker_stats(self):
        """Worker-side counters (loaded, failed, saved, skipped pages); {} on the scheduler."""
        return dict(self._worker_side.stats) if self._worker_side else {}

    def shutdown(self):
        side = self._scheduler_side or self._worker_side
        side.close()
