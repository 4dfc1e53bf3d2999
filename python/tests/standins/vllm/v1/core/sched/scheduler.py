"""Stand-in of vllm/v1/core/sched/scheduler.py: the connector calls of schedule()
and update_from_output() in vLLM's order (ENGINES.md §2.3, §6.3, §6.4).

A small scheduler with a block pool (block 0 is the null block, never
handed out) and one block table per KV-cache group:
  full attention   a block per block_size tokens;
  sliding window   blocks that fall out of the window before the computed
                   tokens are freed and replaced by the null block;
  Mamba            only the block of the current state and the block the
                   step's final state goes to are real, the rest null
                   ("align" mode: a prefill chunk that crosses a boundary is
                   cut at the last boundary it crosses, so each chunk's
                   final state lands at a boundary).
A local prefix cache serves models with one full-attention group (hybrid
models get no local hits here).

Per step: running requests first (decode or the next prefill chunk), then
waiting ones (local prefix hit, get_num_new_matched_tokens, allocation,
update_state_after_alloc), then build_connector_meta. A load_async answer
parks the request (WAITING_FOR_REMOTE_KVS) with blocks for the external
tokens until a worker reports it in finished_recving. On invalid_block_ids
it applies the "recompute" policy: a request's computed tokens are cut back
to its first failed block (a running request also drops the step's
result). Requests finish through request_finished_all_groups when the
connector supports HMA, else request_finished. The connector's events
(take_events) are collected per step in kv_event_batches. No preemption:
running out of blocks raises.
"""

import collections
import hashlib
import math
from array import array

from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole, supports_hma
from vllm.v1.core.kv_cache_manager import KVCacheBlock, KVCacheBlocks
from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
from vllm.v1.request import RequestStatus

NULL_BLOCK_ID = 0


def _local_block_hashes(request, block_size, upto_tokens, start=0, parent=b""):
    """Prefix-cache hashes of the local cache (the stand-in's own chain)."""
    out = []
    toks = request.all_token_ids
    for i in range(start, upto_tokens // block_size):
        parent = hashlib.sha256(parent + array("q", toks[i * block_size:(i + 1) * block_size])
                                .tobytes()).digest()
        out.append(parent)
    return out


class _GroupInfo:
    def __init__(self, index, spec, default_block_size):
        name = type(spec).__name__ if spec is not None else "FullAttentionSpec"
        self.index = index
        self.block_size = getattr(spec, "block_size", None) or default_block_size
        if "Mamba" in name:
            self.kind = "mamba"
        elif getattr(spec, "sliding_window", None):
            self.kind = "sliding_window"
        else:
            self.kind = "full_attention"
        self.window = getattr(spec, "sliding_window", None) or 0


class Scheduler:
    def __init__(self, vllm_config, kv_cache_config):
        self.vllm_config = vllm_config
        self.block_size = vllm_config.cache_config.block_size
        specs = kv_cache_config.kv_cache_groups or [None]
        self.groups = [_GroupInfo(i, getattr(g, "kv_cache_spec", None), self.block_size)
                       for i, g in enumerate(specs)]
        self.hybrid = len(self.groups) > 1 or self.groups[0].kind != "full_attention"
        self.mamba_mode = vllm_config.cache_config.mamba_cache_mode
        self.unit = 1
        for g in self.groups:
            self.unit = self.unit * g.block_size // math.gcd(self.unit, g.block_size)
        self.enable_caching = vllm_config.cache_config.enable_prefix_caching and not self.hybrid
        self.max_tokens_per_step = vllm_config.scheduler_config.max_num_batched_tokens
        self.connector = None
        if vllm_config.kv_transfer_config is not None:
            self.connector = KVConnectorFactory.create_connector(
                vllm_config, KVConnectorRole.SCHEDULER, kv_cache_config,
                hybrid_kv_cache_manager=self.hybrid)
        self.free = collections.deque(range(1, kv_cache_config.num_blocks))
        self.ref = collections.Counter()
        self.cached = {}  # local prefix hash -> block id
        self.block_hash = {}  # block id -> local prefix hash
        self.requests = {}
        self.waiting = collections.deque()
        self.running = []
        self.waiting_for_remote = {}  # req id -> request (load_async)
        self.finished_recving = set()
        self._loaded = set()  # parked requests whose background load finished
        self.block_ids = {}  # req id -> one list of block ids per group
        self.finished_req_ids = set()
        self.external_hits = collections.Counter()  # req id -> tokens loaded by the connector
        self.async_loads = set()  # req ids loaded with load_async
        self.recomputed = collections.Counter()  # req id -> tokens cut back by load errors
        self.kv_event_batches = []  # one list per step with connector events

    # ---- block pool ----
    def _take_free(self):
        if not self.free:
            raise RuntimeError("out of KV blocks (the stand-in scheduler does not preempt)")
        bid = self.free.popleft()
        h = self.block_hash.pop(bid, None)
        if h is not None:
            self.cached.pop(h, None)
        self.ref[bid] += 1
        return bid

    def _free_blocks(self, ids):
        for bid in ids:
            if bid == NULL_BLOCK_ID:
                continue
            self.ref[bid] -= 1
            if self.ref[bid] == 0:
                del self.ref[bid]
                self.free.append(bid)

    def _local_hit(self, request):
        if not self.enable_caching:
            return []
        hit = []
        # vLLM leaves at least one prompt token to compute.
        for h in _local_block_hashes(request, self.block_size, request.num_tokens - 1):
            bid = self.cached.get(h)
            if bid is None:
                break
            hit.append(bid)
        for bid in hit:
            if self.ref[bid] == 0:
                self.free.remove(bid)
            self.ref[bid] += 1
        return hit

    def _cache_full_blocks(self, request):
        if not self.enable_caching:
            return
        ids = self.block_ids[request.request_id][0]
        hashes = _local_block_hashes(request, self.block_size, request.num_computed_tokens)
        for h, bid in zip(hashes, ids):
            if h not in self.cached and bid not in self.block_hash:
                self.cached[h] = bid
                self.block_hash[bid] = h

    def _uncache(self, bid):
        h = self.block_hash.pop(bid, None)
        if h is not None:
            self.cached.pop(h, None)

    def _needed(self, g, slot, start, end):
        """Whether slot `slot` of group g holds a real block while tokens
        [start, end) are computed."""
        bs = g.block_size
        if g.kind == "sliding_window":
            skipped = max(0, start - g.window + 1)
            return (slot + 1) * bs > skipped
        if g.kind == "mamba":
            return slot in ((start - 1) // bs, (end - 1) // bs)
        return True

    def _grow(self, req_id, start, end):
        """Frees the slots no longer needed and adds slots up to `end`
        tokens; the new block ids per group."""
        tables = self.block_ids[req_id]
        new = []
        for g in self.groups:
            ids = tables[g.index]
            for i, bid in enumerate(ids):
                needed = self._needed(g, i, start, end)
                if bid != NULL_BLOCK_ID and not needed:
                    self._free_blocks([bid])
                    ids[i] = NULL_BLOCK_ID
                elif bid == NULL_BLOCK_ID and needed:  # recomputing from before a load
                    ids[i] = self._take_free()
            added = []
            while len(ids) * g.block_size < end:
                i = len(ids)
                ids.append(self._take_free() if self._needed(g, i, start, end) else NULL_BLOCK_ID)
                added.append(ids[-1])
            new.append(added)
        return new

    def _chunk(self, start, n):
        """n, cut at the last boundary crossed in Mamba "align" mode."""
        if self.mamba_mode != "align" or not any(g.kind == "mamba" for g in self.groups):
            return n
        end = start + n
        aligned = end // self.unit * self.unit
        return aligned - start if aligned > start and aligned != end else n

    def _update_hashes(self, request):
        known = request.block_hashes
        parent = known[-1] if known else b""
        known.extend(_local_block_hashes(request, self.block_size, request.num_tokens,
                                         len(known), parent))

    # ---- API ----
    def add_request(self, request):
        self.requests[request.request_id] = request
        self._update_hashes(request)
        self.waiting.append(request)

    def has_unfinished_requests(self):
        return bool(self.waiting or self.running or self.waiting_for_remote)

    def schedule(self):
        budget = self.max_tokens_per_step
        num_scheduled = {}
        cached = CachedRequestData()
        for rid in [r for r in self.waiting_for_remote if r in self.finished_recving]:
            req = self.waiting_for_remote.pop(rid)
            self.finished_recving.discard(rid)
            req.status = RequestStatus.WAITING
            self._loaded.add(rid)
            self.waiting.appendleft(req)
        for req in self.running:
            if budget <= 0:
                break
            n = self._chunk(req.num_computed_tokens,
                            min(req.num_tokens - req.num_computed_tokens, budget))
            if n <= 0:
                continue
            new_ids = self._grow(req.request_id, req.num_computed_tokens,
                                 req.num_computed_tokens + n)
            cached.req_ids.append(req.request_id)
            cached.resumed_from_preemption.append(False)
            cached.new_token_ids.append([])
            cached.all_token_ids[req.request_id] = list(req.all_token_ids)
            cached.new_block_ids.append(tuple(new_ids) if any(new_ids) else None)
            cached.num_computed_tokens.append(req.num_computed_tokens)
            num_scheduled[req.request_id] = n
            budget -= n
        new_reqs = []
        while self.waiting and budget > 0:
            req = self.waiting.popleft()
            rid = req.request_id
            num_external = 0
            if rid in self._loaded:  # its background load finished
                self._loaded.discard(rid)
                num_computed = req.num_computed_tokens
            else:
                local = self._local_hit(req)
                num_local = len(local) * self.block_size
                load_async = False
                if self.connector is not None:
                    num_external, load_async = self.connector.get_num_new_matched_tokens(
                        req, num_local)
                    if num_external is None:  # "ask again next step"
                        self._free_blocks(local)
                        self.waiting.appendleft(req)
                        break
                    assert not (load_async and not num_external), "load_async with 0 tokens"
                    assert num_local + num_external < req.num_tokens, "no token left to compute"
                num_computed = num_local + num_external
                self.block_ids[rid] = [list(local)] + [[] for _ in self.groups[1:]]
                self.external_hits[rid] += num_external
                if load_async:
                    self._grow(rid, num_computed, num_computed)
                    blocks = KVCacheBlocks(tuple([KVCacheBlock(b) for b in ids]
                                                 for ids in self.block_ids[rid]))
                    self.connector.update_state_after_alloc(req, blocks, num_external)
                    req.num_computed_tokens = num_computed
                    req.status = RequestStatus.WAITING_FOR_REMOTE_KVS
                    self.waiting_for_remote[rid] = req
                    self.async_loads.add(rid)
                    continue
            n = self._chunk(num_computed, min(req.num_tokens - num_computed, budget))
            self._grow(rid, num_computed, num_computed + n)
            if self.connector is not None:  # the request's blocks: local hits + new ones
                groups = [[KVCacheBlock(b) for b in ids] for ids in self.block_ids[rid]]
                self.connector.update_state_after_alloc(req, KVCacheBlocks(tuple(groups)),
                                                        num_external)
            req.num_computed_tokens = num_computed
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            new_reqs.append(NewRequestData(
                req_id=rid, prompt_token_ids=list(req.prompt_token_ids),
                block_ids=tuple(list(ids) for ids in self.block_ids[rid]),
                num_computed_tokens=num_computed, sampling_params=req.sampling_params,
                lora_request=req.lora_request, mm_features=list(req.mm_features)))
            num_scheduled[rid] = n
            budget -= n
        out = SchedulerOutput(scheduled_new_reqs=new_reqs, scheduled_cached_reqs=cached,
                              num_scheduled_tokens=num_scheduled,
                              total_num_scheduled_tokens=sum(num_scheduled.values()),
                              finished_req_ids=self.finished_req_ids)
        self.finished_req_ids = set()
        if self.connector is not None:
            out.kv_connector_metadata = self.connector.build_connector_meta(out)
        return out

    def _first_invalid(self, req_id, invalid):
        """The token position of the request's first failed block, or None."""
        cut = None
        for g in self.groups:
            for i, b in enumerate(self.block_ids[req_id][g.index]):
                if b in invalid:
                    pos = i * g.block_size
                    cut = pos if cut is None else min(cut, pos)
                    break
        return cut

    def update_from_output(self, scheduler_output, runner_output):
        kvo = runner_output.kv_connector_output
        invalid = set(kvo.invalid_block_ids) if kvo is not None else set()
        for bid in invalid:
            self._uncache(bid)
        if invalid:
            for rid, req in self.waiting_for_remote.items():
                cut = self._first_invalid(rid, invalid)
                if cut is not None:
                    self.recomputed[rid] += req.num_computed_tokens - cut
                    req.num_computed_tokens = cut
        if kvo is not None and kvo.finished_recving:
            self.finished_recving |= set(kvo.finished_recving)
        if self.connector is not None and kvo is not None:
            self.connector.update_connector_output(kvo)
        finished = []
        for req_id, n in scheduler_output.num_scheduled_tokens.items():
            req = self.requests[req_id]
            cut = self._first_invalid(req_id, invalid) if invalid else None
            if cut is not None:
                cut = min(cut, req.num_computed_tokens)
                self.recomputed[req_id] += req.num_computed_tokens - cut
                req.num_computed_tokens = cut
                continue
            req.num_computed_tokens += n
            self._cache_full_blocks(req)
            if req.num_computed_tokens == req.num_tokens:
                req.append_output_token_ids(runner_output.sampled_token_ids[req_id])
                self._update_hashes(req)
                if req.num_output_tokens >= req.max_tokens:
                    finished.append(req)
        for req in finished:
            req.status = RequestStatus.FINISHED_LENGTH_CAPPED
            self.running.remove(req)
            tables = self.block_ids.pop(req.request_id)
            if self.connector is not None:
                if supports_hma(self.connector):
                    delay, _ = self.connector.request_finished_all_groups(
                        req, tuple(list(ids) for ids in tables))
                else:
                    delay, _ = self.connector.request_finished(req, list(tables[0]))
                assert not delay, "the stand-in frees blocks at once"
            for ids in tables:
                self._free_blocks(ids)
            self.finished_req_ids.add(req.request_id)
        if self.connector is not None:
            events = list(self.connector.take_events())
            if events:
                self.kv_event_batches.append(events)
        return finished
