"""Stand-in of vllm/v1/core/sched/scheduler.py: the connector calls of schedule()
and update_from_output() in vLLM's order (ENGINES.md §2.3).

A small scheduler with a block pool and a local prefix cache: running
requests first (decode or the next prefill chunk), then waiting ones (local
prefix hit, get_num_new_matched_tokens, allocation, update_state_after_alloc),
then build_connector_meta. Loads are synchronous (load_async must be False).
On invalid_block_ids it applies the "recompute" policy: the step's result for
an affected request is dropped and its computed tokens are cut back to the
first failed block. No preemption: running out of blocks raises.
"""

import collections
import hashlib
from array import array

from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.v1.core.kv_cache_manager import KVCacheBlock, KVCacheBlocks
from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
from vllm.v1.request import RequestStatus


def _local_block_hashes(request, block_size, upto_tokens):
    """Prefix-cache hashes of the local cache (the stand-in's own chain)."""
    out, parent = [], b""
    toks = request.all_token_ids
    for i in range(upto_tokens // block_size):
        parent = hashlib.sha256(parent + array("q", toks[i * block_size:(i + 1) * block_size])
                                .tobytes()).digest()
        out.append(parent)
    return out


class Scheduler:
    def __init__(self, vllm_config, kv_cache_config):
        self.vllm_config = vllm_config
        self.block_size = vllm_config.cache_config.block_size
        self.enable_caching = vllm_config.cache_config.enable_prefix_caching
        self.max_tokens_per_step = vllm_config.scheduler_config.max_num_batched_tokens
        self.connector = None
        if vllm_config.kv_transfer_config is not None:
            self.connector = KVConnectorFactory.create_connector(
                vllm_config, KVConnectorRole.SCHEDULER, kv_cache_config)
        self.free = collections.deque(range(kv_cache_config.num_blocks))
        self.ref = collections.Counter()
        self.cached = {}  # local prefix hash -> block id
        self.block_hash = {}  # block id -> local prefix hash
        self.requests = {}
        self.waiting = collections.deque()
        self.running = []
        self.block_ids = {}  # req id -> list of block ids
        self.finished_req_ids = set()
        self.external_hits = collections.Counter()  # req id -> tokens loaded by the connector
        self.recomputed = collections.Counter()  # req id -> tokens cut back by load errors

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
        ids = self.block_ids[request.request_id]
        hashes = _local_block_hashes(request, self.block_size, request.num_computed_tokens)
        for h, bid in zip(hashes, ids):
            if h not in self.cached and bid not in self.block_hash:
                self.cached[h] = bid
                self.block_hash[bid] = h

    def _uncache(self, bid):
        h = self.block_hash.pop(bid, None)
        if h is not None:
            self.cached.pop(h, None)

    # ---- API ----
    def add_request(self, request):
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def has_unfinished_requests(self):
        return bool(self.waiting or self.running)

    def _grow(self, req_id, num_tokens):
        ids = self.block_ids[req_id]
        new = []
        while len(ids) * self.block_size < num_tokens:
            bid = self._take_free()
            ids.append(bid)
            new.append(bid)
        return new

    def schedule(self):
        budget = self.max_tokens_per_step
        num_scheduled = {}
        cached = CachedRequestData()
        for req in self.running:
            if budget <= 0:
                break
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            if n <= 0:
                continue
            new_ids = self._grow(req.request_id, req.num_computed_tokens + n)
            cached.req_ids.append(req.request_id)
            cached.resumed_from_preemption.append(False)
            cached.new_token_ids.append([])
            cached.all_token_ids[req.request_id] = list(req.all_token_ids)
            cached.new_block_ids.append((new_ids,) if new_ids else None)
            cached.num_computed_tokens.append(req.num_computed_tokens)
            num_scheduled[req.request_id] = n
            budget -= n
        new_reqs = []
        while self.waiting and budget > 0:
            req = self.waiting.popleft()
            local = self._local_hit(req)
            num_local = len(local) * self.block_size
            num_external, load_async = 0, False
            if self.connector is not None:
                num_external, load_async = self.connector.get_num_new_matched_tokens(req, num_local)
                if num_external is None:  # "ask again next step"
                    self._free_blocks(local)
                    self.waiting.appendleft(req)
                    break
                assert not load_async, "the stand-in scheduler only loads synchronously"
                assert num_local + num_external < req.num_tokens, "no token left to compute"
            num_computed = num_local + num_external
            n = min(req.num_tokens - num_computed, budget)
            self.block_ids[req.request_id] = list(local)
            new_ids = self._grow(req.request_id, num_computed + n)
            if self.connector is not None:
                blocks = KVCacheBlocks(([KVCacheBlock(b) for b in local + new_ids],))
                self.connector.update_state_after_alloc(req, blocks, num_external)
            req.num_computed_tokens = num_computed
            req.status = RequestStatus.RUNNING
            self.external_hits[req.request_id] += num_external
            self.running.append(req)
            new_reqs.append(NewRequestData(
                req_id=req.request_id, prompt_token_ids=list(req.prompt_token_ids),
                block_ids=(list(self.block_ids[req.request_id]),),
                num_computed_tokens=num_computed, sampling_params=req.sampling_params,
                lora_request=req.lora_request, mm_features=list(req.mm_features)))
            num_scheduled[req.request_id] = n
            budget -= n
        out = SchedulerOutput(scheduled_new_reqs=new_reqs, scheduled_cached_reqs=cached,
                              num_scheduled_tokens=num_scheduled,
                              total_num_scheduled_tokens=sum(num_scheduled.values()),
                              finished_req_ids=self.finished_req_ids)
        self.finished_req_ids = set()
        if self.connector is not None:
            out.kv_connector_metadata = self.connector.build_connector_meta(out)
        return out

    def update_from_output(self, scheduler_output, runner_output):
        kvo = runner_output.kv_connector_output
        invalid = set(kvo.invalid_block_ids) if kvo is not None else set()
        for bid in invalid:
            self._uncache(bid)
        if self.connector is not None and kvo is not None:
            self.connector.update_connector_output(kvo)
        finished = []
        for req_id, n in scheduler_output.num_scheduled_tokens.items():
            req = self.requests[req_id]
            ids = self.block_ids[req_id]
            bad = [i for i, b in enumerate(ids) if b in invalid]
            if bad:
                cut = min(bad[0] * self.block_size, req.num_computed_tokens)
                self.recomputed[req_id] += req.num_computed_tokens - cut
                req.num_computed_tokens = cut
                continue
            req.num_computed_tokens += n
            self._cache_full_blocks(req)
            if req.num_computed_tokens == req.num_tokens:
                req.append_output_token_ids(runner_output.sampled_token_ids[req_id])
                if req.num_output_tokens >= req.max_tokens:
                    finished.append(req)
        for req in finished:
            req.status = RequestStatus.FINISHED_LENGTH_CAPPED
            self.running.remove(req)
            ids = self.block_ids.pop(req.request_id)
            if self.connector is not None:
                delay, _ = self.connector.request_finished(req, ids)
                assert not delay, "the stand-in frees blocks at once"
            self._free_blocks(ids)
            self.finished_req_ids.add(req.request_id)
        return finished
