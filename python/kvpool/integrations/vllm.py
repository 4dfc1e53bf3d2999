"""kvpool as a vLLM KV connector (V1): a shared prefix cache for vLLM instances.

Enable with
  --kv-transfer-config '{"kv_connector": "KvpoolConnector",
                         "kv_connector_module_path": "kvpool.integrations.vllm",
                         "kv_role": "kv_both",
                         "kv_connector_extra_config": {"socket": "/run/kvpool/kvpool.sock"}}'
Hybrid models need no --disable-hybrid-kv-cache-manager: the connector
implements SupportsHMA. Settings in kv_connector_extra_config, the
connectors' shared names (kvpool.integrations._session): socket (default env
KVPOOL_SOCKET, else the library's default), remote (peer list: remote mode),
namespace (replaces the model name in the namespace), timeout_ms (default
2000), retry_interval_ms (how long to wait before reconnecting after the node
could not be reached; default 10000: the scheduler thread makes the
attempt). The kvpool_-prefixed names of older releases (kvpool_socket, ...,
kvpool_retry_interval_s) are aliases. This connector's own:
  layerwise              true: one page per layer and block, loaded and saved
                         layer by layer in the background (alias
                         use_layerwise; default false). vLLM must then run
                         CUDA graphs piecewise (requires_piecewise_for_cudagraph).
  load_async_min_tokens  a hit of at least this many tokens is loaded in the
                         background while the request waits outside the batch
                         (load_kv_async); 0 disables it (default 4096).
  kv_events              report KV events (default: vLLM's
                         kv_events_config.enable_kv_cache_events).
  event_medium           the medium of those events (default "CPU").
  block_descriptors      attach to each page put the descriptor of its block
                         as vLLM's own KV events name it, so the node's
                         events name it that way too (default true; every
                         connector's setting).

One class, two roles (ENGINES.md §2.2). The scheduler-side instance finds
the longest prefix of a request present in kvpool for every shard and every
KV-cache group, and tells the workers, through picklable metadata, which
blocks to load and which newly computed blocks to save. Each worker copies
blocks between the paged KV cache and kvpool (see _vllm_worker): by default
whole blocks of a group (one page holds every layer's block), loaded before
the forward pass and stored when it ends; layer-wise, one page per layer,
loads of later layers overlapping the attention of earlier ones.

Hybrid models (HMA, ENGINES.md §6.3). Keys are per (group, block hash), each
group with its own block ids, block size and page layout. What is stored
for each group type (kvpool.integrations._vllm_groups):
  full attention  every full block: a prefix hit needs all of them.
  sliding window  only the blocks inside the window before a boundary a
                  later lookup can hit; older blocks are never read again
                  (vLLM frees them) and would only cost kvpool space.
  Mamba           only the block holding the recurrent state at such a
                  boundary (mamba_cache_mode "align" or "all"); other slots
                  hold no state worth keeping.
A lookup is the hybrid longest hit: the longest prefix, a multiple of the
lcm of the groups' block sizes, for which every group has what it needs.
A model whose recurrent state cannot be restored (another Mamba cache mode)
or with a group kind kvpool does not store reports 0 external tokens and
saves nothing. Block 0 (vLLM's null block) is never saved or loaded.
requires_kv_delivery is False: kvpool is a best-effort cache, a miss is a
recompute.

Faults: a node that is down or goes away, a timeout, a page of another
geometry or a missing page are misses (scheduler) or load errors reported
block by block through get_block_ids_with_load_errors (worker), as in every
connector (the Session); no exception reaches vLLM and no foreign bytes
reach the KV cache. An asynchronous load is reported finished (and failed,
if a page failed) by get_finished / get_transfer_results in the step its
blocks are reported.

KV events (ENGINES.md §6.1, kvpool.integrations._vllm_events): BlockStored
for each block stored in or loaded from kvpool, from the workers
(get_kv_connector_kv_cache_events) to the scheduler side (take_events).

Block descriptors (docs/kv-events.md, ENGINES.md part 7): every page a
worker puts carries its block's descriptor, what vLLM's own BlockStored
says of that block, so the node's events about the page name the block the
way vLLM does and routers (vLLM's decoder, llm-d, Dynamo) can index it:
hash and parent = the engine block hashes exactly as this connector's own
events carry them (_vllm_events.block_info: ExternalBlockHash, an int of
the low 64 bits big-endian unless VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0,
then the bytes; the parent is the previous block of the same group, None
for the first), token_ids = the block's tokens, block_size = the group's,
group_idx = the group's index, lora_name = the request's LoRA, spec_kind =
the group's kind. The scheduler side computes them (only it has vLLM's
block hashes and the tokens) and ships them in the metadata with each save;
every page of a block (each rank, each layer-wise unit) carries the same.

vLLM calls each instance from one thread; the worker's background lanes are
internal.
"""

import logging
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from vllm.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorBase_V1,
                                                               KVConnectorMetadata,
                                                               KVConnectorRole)

from . import _vllm_keys as keys_mod
from ._hints import Applier
from ._session import Session, SessionSettings
from ._vllm_events import block_info, common_events
from ._vllm_groups import (FULL, NULL_BLOCK_ID, groups_of, is_hybrid, lcm_block_size,
                           longest_hit, reachable, restorable)
from ._vllm_worker import WorkerSide

try:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import SupportsHMA
except ImportError:  # vLLM before hybrid-model support
    SupportsHMA = None
try:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorTransferResults
except ImportError:  # vLLM before get_transfer_results
    @dataclass
    class KVConnectorTransferResults:
        finished_sending: Optional[set] = None
        finished_recving: Optional[set] = None
        failed_recving: set = field(default_factory=set)

logger = logging.getLogger(__name__)

# A connect attempt runs on the scheduler thread and, in remote mode, can take
# up to timeout_ms: without a node, try at most every 10 s.
_DEFAULT_RETRY_MS = 10000
_DEFAULT_ASYNC_MIN_TOKENS = 4096


@dataclass
class BlockTransfer:
    """Blocks of one request and group to move: block_ids[i] <-> the page of
    hashes[i]. load_async: a background load vLLM waits for across steps.
    events: per block (engine hash, parent hash, token ids) when KV events
    are on."""

    req_id: str
    block_ids: list[int]
    hashes: list[bytes]
    group: int = 0
    load_async: bool = False
    events: Optional[list] = None  # also what the saved pages' block descriptors say
    lora_name: Optional[str] = None


@dataclass
class KvpoolConnectorMetadata(KVConnectorMetadata):
    """One step's instructions for the workers (plain lists: picklable)."""

    loads: list[BlockTransfer] = field(default_factory=list)
    saves: list[BlockTransfer] = field(default_factory=list)


def _flag(value):
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


def _layerwise(extra):
    extra = extra or {}
    return _flag(extra.get("layerwise", extra.get("use_layerwise", False)))


class _Settings:
    def __init__(self, vllm_config, kv_cache_config=None):
        ktc = vllm_config.kv_transfer_config
        extra = dict(getattr(ktc, "kv_connector_extra_config", None) or {})
        self.session = SessionSettings(retry_interval_ms=_DEFAULT_RETRY_MS).update(extra)
        role = getattr(ktc, "kv_role", None) or "kv_both"
        self.load = role in ("kv_consumer", "kv_both")
        self.save = role in ("kv_producer", "kv_both")
        cc = vllm_config.cache_config
        self.block_size = int(cc.block_size)
        self.layerwise = _layerwise(extra)
        self.load_async_min_tokens = int(extra.get("load_async_min_tokens",
                                                   _DEFAULT_ASYNC_MIN_TOKENS))
        if self.load_async_min_tokens < 0:
            raise ValueError("kvpool: load_async_min_tokens must not be negative")
        events = extra.get("kv_events")
        if events is None:
            kec = getattr(vllm_config, "kv_events_config", None)
            events = bool(getattr(kec, "enable_kv_cache_events", False))
        self.events = _flag(events)
        self.event_medium = str(extra.get("event_medium") or "CPU")
        self.descriptors = self.session.block_descriptors
        self.locality = "REMOTE" if self.session.remote else "LOCAL"
        self.mamba_cache_mode = str(getattr(cc, "mamba_cache_mode", None) or "none")
        self.disabled_reason = None
        try:
            self.groups = groups_of(kv_cache_config, self.block_size)
        except ValueError as e:
            self.groups, self.disabled_reason = None, str(e)
        self.hybrid = self.groups is not None and is_hybrid(self.groups)
        self.usable = self.groups is not None and restorable(self.groups, self.mamba_cache_mode)
        if self.groups is not None and not self.usable:
            self.disabled_reason = ("Mamba state is not kept at block boundaries "
                                    "(mamba_cache_mode %r)" % self.mamba_cache_mode)
        desc = ",".join(g.describe() for g in self.groups) if self.hybrid else None
        self.namespace, self.use_mla = keys_mod.namespace(vllm_config, self.session.namespace,
                                                          desc)
        pc = vllm_config.parallel_config
        self.tp_size = int(getattr(pc, "tensor_parallel_size", 1))
        self.pp_size = int(getattr(pc, "pipeline_parallel_size", 1))


class _Tracker:
    """Scheduler-side state of one request between allocation and finish."""

    def __init__(self, request, groups):
        self.request = request
        self.hashers = {}  # block size -> BlockHasher
        self.block_ids = [[] for _ in groups]
        self.saved = [set() for _ in groups]  # block indices stored, planned or loaded
        self.frontier = [0] * len(groups)  # full attention: blocks below are decided
        self.pending = None  # (first tokens, hit tokens, async, block ids) of a planned load

    def hashes(self, block_size, n):
        h = self.hashers.get(block_size)
        if h is None:
            h = self.hashers[block_size] = keys_mod.BlockHasher(self.request, block_size)
        return h.upto(n)


def _lists(block_ids, n):
    out = [list(x) for x in (block_ids or ())][:n]
    return out + [[] for _ in range(n - len(out))]


class _SchedulerSide:
    def __init__(self, settings):
        self._s = settings
        self._session = Session(settings.session, settings.namespace, log=logger,
                                client_name="vllm scheduler")
        self._suffixes = keys_mod.all_rank_suffixes(settings.use_mla, settings.tp_size,
                                                    settings.pp_size)
        self._hints = Applier(self._session, logger, settings.session.hint_default_ttl_s)
        self._reqs = {}
        self._lookups = {}  # req id -> (first tokens, hit tokens) of the last lookup
        self._events = []
        if settings.groups is None or not settings.usable:
            logger.error("kvpool connector: no loads or saves: %s", settings.disabled_reason)

    def _lookup_key(self, group, h, sfx):
        tag = keys_mod.layer_tag(0) if self._s.layerwise else b""
        return h + keys_mod.group_tag(self._s.hybrid, group) + tag + sfx

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        s = self._s
        if not s.load or not s.usable:
            return 0, False
        # Leave at least one token to compute: vLLM needs logits for it.
        cap = request.num_tokens - 1
        if cap // lcm_block_size(s.groups) * lcm_block_size(s.groups) <= num_computed_tokens:
            return 0, False
        hashers = {}
        spans = []  # (group, first index, hashes from there)
        for g in s.groups:
            hasher = hashers.get(g.block_size)
            if hasher is None:
                hasher = hashers[g.block_size] = keys_mod.BlockHasher(request, g.block_size)
            first = num_computed_tokens // g.block_size
            spans.append((g, first, hasher.upto(cap // g.block_size)[first:]))
        batch = [self._lookup_key(g.index, h, sfx) for sfx in self._suffixes
                 for g, _, hs in spans for h in hs]
        hits = self._session.call(lambda c: c.exists(batch), None, "exists")
        if hits is None:
            return 0, False
        present = {}
        pos = 0
        for _ in self._suffixes:
            for g, first, hs in spans:
                for j in range(len(hs)):
                    key = (g.index, first + j)
                    present[key] = present.get(key, True) and hits[pos]
                    pos += 1
        t = longest_hit(s.groups, num_computed_tokens, cap,
                        lambda gi, i: present.get((gi, i), False))
        n = t - num_computed_tokens
        if n <= 0:
            return 0, False
        self._lookups[request.request_id] = (num_computed_tokens, t)
        return n, bool(s.load_async_min_tokens and n >= s.load_async_min_tokens)

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        s = self._s
        t = self._reqs.get(request.request_id)
        if t is None:
            t = self._reqs[request.request_id] = _Tracker(request, s.groups or [None])
        t.request = request
        lookup = self._lookups.pop(request.request_id, None)
        if not num_external_tokens or not s.load:
            return
        get = getattr(blocks, "get_block_ids", None)
        ids = _lists(get() if get is not None else (), len(s.groups))
        if lookup is None or lookup[1] - lookup[0] != num_external_tokens:
            first, hit = None, None  # worked out from the scheduler output (sync loads)
        else:
            first, hit = lookup
        load_async = bool(s.load_async_min_tokens
                          and num_external_tokens >= s.load_async_min_tokens)
        t.pending = (first, hit, load_async, ids, num_external_tokens)

    def build_connector_meta(self, scheduler_output):
        meta = KvpoolConnectorMetadata()
        n = len(self._s.groups or [None])
        # Background loads: the request waits outside the batch.
        for req_id, t in self._reqs.items():
            if t.pending is not None and t.pending[2]:
                first, hit, _, ids, ext = t.pending
                t.pending = None
                t.block_ids = ids
                if hit is None:  # no lookup to go by: the load fails, vLLM recomputes
                    logger.error("kvpool: request %s: no lookup for %d external tokens",
                                 req_id, ext)
                    meta.loads.append(BlockTransfer(req_id, [b for b in ids[0] if b], [], 0,
                                                    True))
                    continue
                self._plan_load(req_id, t, first, hit, True, meta)
        counts = scheduler_output.num_scheduled_tokens
        for nr in scheduler_output.scheduled_new_reqs:
            t = self._reqs.get(nr.req_id)
            if t is None:
                continue
            t.block_ids = _lists(nr.block_ids, n)
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
                t.block_ids = _lists(new_ids, n)
            elif new_ids:
                for g, extra in enumerate(_lists(new_ids, n)):
                    t.block_ids[g].extend(extra)
            self._plan(req_id, t, cached.num_computed_tokens[i], counts.get(req_id, 0), meta)
        return meta

    def _plan(self, req_id, t, num_computed, num_scheduled, meta):
        if not self._s.usable:
            return
        if t.pending is not None:
            _, _, _, _, ext = t.pending
            t.pending = None
            # num_computed = local hits + the external tokens promised for this request.
            self._plan_load(req_id, t, num_computed - ext, num_computed, False, meta)
        if self._s.save:
            # Blocks whose KV exists once this step has run (tokens known;
            # speculative tokens beyond num_tokens are not).
            end = min(num_computed + num_scheduled, t.request.num_tokens)
            self._plan_saves(req_id, t, num_computed, end, meta)

    def _event_info(self, t, g, indices, hashes, save=False):
        """Per block (engine hash, parent, tokens): for KV events, and for a
        save also for the pages' block descriptors."""
        if not (self._s.events or (save and self._s.descriptors)):
            return None
        return block_info(t.request, indices, g.block_size, self._s.block_size, hashes)

    def _lora(self, t):
        lora = getattr(t.request, "lora_request", None)
        return getattr(lora, "lora_name", None) if lora is not None else None

    def _plan_load(self, req_id, t, first, hit, load_async, meta):
        plans = []
        for g in self._s.groups:
            idx = [i for i in g.needed(hit) if i >= first // g.block_size]
            hashes = t.hashes(g.block_size, hit // g.block_size)
            ids = t.block_ids[g.index]
            if len(hashes) < hit // g.block_size or any(
                    i >= len(ids) or ids[i] == NULL_BLOCK_ID for i in idx):
                # vLLM allocated no block where a loaded one must go: not expected to happen
                logger.error("kvpool: request %s: cannot place %d external tokens in group %d",
                             req_id, hit - first, g.index)
                return
            plans.append((g, idx, hashes, ids))
        for g, idx, hashes, ids in plans:
            meta.loads.append(BlockTransfer(req_id, [ids[i] for i in idx],
                                            [hashes[i] for i in idx], g.index, load_async,
                                            self._event_info(t, g, idx, hashes), self._lora(t)))
            k = hit // g.block_size
            t.saved[g.index].update(range(k))
            t.frontier[g.index] = max(t.frontier[g.index], k)

    def _plan_saves(self, req_id, t, start, end, meta):
        s = self._s
        points = None
        for g in s.groups:
            ids = t.block_ids[g.index]
            k = min(end // g.block_size, len(ids))
            if g.kind == FULL:
                idx = range(t.frontier[g.index], k)
                t.frontier[g.index] = max(t.frontier[g.index], k)
            else:
                if points is None:
                    points = reachable(s.groups, s.mamba_cache_mode, start, end)
                idx = sorted({i for p in points for i in g.needed(p) if i < k})
            saved = t.saved[g.index]
            idx = [i for i in idx if i not in saved and ids[i] != NULL_BLOCK_ID]
            if not idx:
                continue
            saved.update(idx)
            hashes = t.hashes(g.block_size, idx[-1] + 1)
            meta.saves.append(BlockTransfer(req_id, [ids[i] for i in idx],
                                            [hashes[i] for i in idx], g.index, False,
                                            self._event_info(t, g, idx, hashes, save=True),
                                            self._lora(t)))

    def update_connector_output(self, connector_output):
        self._events.extend(common_events(getattr(connector_output, "kv_cache_events", None)))
        # Blocks that failed to load are recomputed from the first of them; save them again then.
        invalid = getattr(connector_output, "invalid_block_ids", None)
        if not invalid or self._s.groups is None:
            return
        for t in self._reqs.values():
            cut = None
            for g in self._s.groups:
                for i, b in enumerate(t.block_ids[g.index]):
                    if b in invalid:
                        pos = i * g.block_size
                        cut = pos if cut is None else min(cut, pos)
                        break
            if cut is None:
                continue
            for g in self._s.groups:
                t.saved[g.index] = {i for i in t.saved[g.index] if (i + 1) * g.block_size <= cut}
                t.frontier[g.index] = min(t.frontier[g.index], cut // g.block_size)

    def request_finished(self, request, block_ids):
        self._reqs.pop(request.request_id, None)
        self._lookups.pop(request.request_id, None)
        self._hint(request)
        return False, None

    def _hint(self, request):
        """The cache hints a request's kv_transfer_params carry under
        "kv_hints" (kvpool.integrations._hints), applied to the request's
        full blocks as this connector stores them, once it finishes: an
        orchestrator retains a session's context for the tool call that
        pauses it, or demotes a finished branch."""
        params = getattr(request, "kv_transfer_params", None)
        envelope = params.get("kv_hints") if isinstance(params, dict) else None
        if envelope is None or not self._s.usable:
            return
        if self._s.layerwise:
            # Each layer is its own key there; the scheduler does not know
            # the workers' layers.
            self._hints.skip()
            return
        keys = []
        for sfx in self._suffixes:
            for g in self._s.groups:
                hs = keys_mod.BlockHasher(request, g.block_size).upto(
                    request.num_tokens // g.block_size)
                keys.extend(self._lookup_key(g.index, h, sfx) for h in hs)
        self._hints.apply_envelope(envelope, keys)

    def take_events(self):
        events, self._events = self._events, []
        return events

    def close(self):
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


_BASES = (KVConnectorBase_V1,) + ((SupportsHMA,) if SupportsHMA is not None else ())


class KvpoolConnector(*_BASES):
    """vLLM KV connector (V1) over kvpool, hybrid-model aware (SupportsHMA).
    See the module docstring."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        _init_base(self, vllm_config, role, kv_cache_config)
        settings = _Settings(vllm_config, kv_cache_config)
        self._scheduler_side = None
        self._worker_side = None
        if _is_scheduler(role):
            self._scheduler_side = _SchedulerSide(settings)
        else:
            self._worker_side = WorkerSide(settings, vllm_config, kv_cache_config)

    # ---- worker side ----
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]):
        self._worker_side.register_kv_caches(kv_caches)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        self._worker_side.start_load_kv(self._connector_metadata)

    def wait_for_layer_load(self, layer_name: str) -> None:
        self._worker_side.wait_for_layer_load(layer_name)

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any,
                      **kwargs: Any) -> None:
        self._worker_side.save_kv_layer(self._connector_metadata, layer_name)

    def wait_for_save(self):
        self._worker_side.wait_for_save()

    def get_finished(self, finished_req_ids: set[str]) -> tuple[Optional[set[str]],
                                                                Optional[set[str]]]:
        # Saves finish inside the step; background loads when they are done.
        recving, _ = self._worker_side.transfer_results()
        return None, (recving or None)

    def get_transfer_results(self, finished_req_ids: set[str]):
        recving, failed = self._worker_side.transfer_results()
        return KVConnectorTransferResults(None, recving or None, failed)

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self._worker_side.take_load_errors()

    def get_kv_connector_kv_cache_events(self):
        return self._worker_side.take_events()

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

    def request_finished_all_groups(self, request: Any, block_ids: tuple[list[int], ...]
                                    ) -> tuple[bool, Optional[dict[str, Any]]]:
        return self._scheduler_side.request_finished(request, block_ids)

    def take_events(self):
        return self._scheduler_side.take_events() if self._scheduler_side else []

    @property
    def requires_kv_delivery(self) -> bool:
        # A best-effort cache: a request preempted mid-load is recomputed.
        return False

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict[str, Any]) -> bool:
        # Layer-wise hooks run between attention layers, outside CUDA graphs.
        return _layerwise(extra_config)

    # ---- both ----
    @property
    def worker_stats(self):
        """Worker-side counters (loaded, failed, saved, skipped pages); {} on the scheduler."""
        return dict(self._worker_side.stats) if self._worker_side else {}

    def shutdown(self):
        side = self._scheduler_side or self._worker_side
        side.close()
