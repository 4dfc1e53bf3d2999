"""Emulation of SGLang's HiCacheController storage side (ENGINES.md 1.4, 4.2).

Not the engine's controller (that one needs CUDA streams, gloo groups and
the scheduler): it reproduces exactly what a storage backend sees from it.
- attach: extra config parsed (JSON string or dict), SGLang's own keys
  popped, HiCacheStorageConfig built, backup_skip = MLA and tp_rank != 0,
  backend made by StorageBackendFactory.create_backend, then
  register_mem_pool_host; zero-copy v1 IO when the backend is `dynamic`
  with a truthy extra_config["interface_v1"], else the generic copy path.
- prefetch: page hashes chained with get_hash_str; batch_exists per 128
  pages, stopping at the first batch not fully hit; the prefetch threshold;
  host slots allocated; batch_get_v1/batch_get per 128 pages, counting
  leading successes and stopping at the first short batch.
- backup: batch_set_v1/batch_set per 128 pages, stopping at the first
  failing batch; nothing written when backup_skip is set.
- threads: prefetch_thread (batch_exists), prefetch_io_aux_thread (loads)
  and backup_thread (stores) run concurrently when start_threads() is used.
- detach: threads stopped, backend.close() called if it exists.
- flush: flush_storage() calls backend.clear().
- hybrid models (ENGINES.md 6.5), when extra host pools are given: every
  pool registered through register_mem_host_pool_v2 (the KV pool too, after
  register_mem_pool_host); the KV pool's pages still go through
  batch_*_v1 (or the generic path), the extra pools' through batch_*_v2.
  Lookup calls batch_exists_v2 (once, over all pages) only when extra pools
  exist, batch_exists otherwise. A sidecar pool (SidecarPoolSpec) reuses
  the KV pool's host indices and keys; any other extra pool has its own
  slots and a TRAILING_PAGES window (Mamba: the state after the last page
  of a backup; SWA: the last window of pages). After a hit, the trailing
  pools' keys are re-aligned to the pages just before the hit's end and
  loaded into freshly allocated slots.
Rank agreement (the all-reduce MIN over TP) is left to multi-rank tests.
"""

import json
import queue
import threading
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch

from sglang.srt.mem_cache.hicache_storage import (
    STORAGE_BATCH_SIZE,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
    get_hash_str,
)
from sglang.srt.mem_cache.memory_pool_host import MLATokenToKVPoolHost
from sglang.srt.mem_cache.storage import StorageBackendFactory

_SGLANG_KEYS = ("prefetch_threshold", "prefetch_timeout_base", "prefetch_timeout_per_ki_token",
                "hicache_storage_pass_prefix_keys", "tp_lcm_size")


@dataclass
class PrefetchOperation:
    token_ids: List[int]
    hashes: List[str] = field(default_factory=list)
    storage_hit_pages: int = 0
    host_indices: Optional[torch.Tensor] = None
    completed_pages: int = 0
    # Hybrid models: batch_exists_v2's extra_pool_hit_pages, then per extra
    # pool the keys loaded, the slots they went to and the leading successes.
    pool_hit_pages: Dict[str, int] = field(default_factory=dict)
    pool_keys: Dict[str, List[str]] = field(default_factory=dict)
    pool_host_indices: Dict[str, torch.Tensor] = field(default_factory=dict)
    pool_loaded_pages: Dict[str, int] = field(default_factory=dict)
    done: threading.Event = field(default_factory=threading.Event)


@dataclass
class BackupOperation:
    host_indices: torch.Tensor
    token_ids: List[int]
    # Hybrid models: per own-slot extra pool, the slots of its trailing pages.
    pool_host_indices: Dict[str, torch.Tensor] = field(default_factory=dict)
    hashes: List[str] = field(default_factory=list)
    ok: Optional[bool] = None
    pool_ok: Dict[str, bool] = field(default_factory=dict)
    done: threading.Event = field(default_factory=threading.Event)


@dataclass
class ExtraPool:
    """An extra host pool of a hybrid model. sidecar: a SidecarPoolSpec when
    the pool reuses another pool's indices; window: the TRAILING_PAGES
    window (pages) of a trailing pool."""

    name: PoolName
    host_pool: object
    hit_policy: PoolHitPolicy = PoolHitPolicy.TRAILING_PAGES
    window: int = 1
    sidecar: Optional[object] = None


class HiCacheController:
    def __init__(self, mem_pool_host, *, tp_rank=0, tp_size=1, pp_rank=0, pp_size=1,
                 attn_cp_rank=0, attn_cp_size=1, dp_rank=0, dp_size=1, model_name=None,
                 enable_storage_metrics=False, storage_backend=None,
                 storage_backend_extra_config=None, extra_pools=None, sidecar_specs=None,
                 trailing_windows=None):
        """extra_pools: {PoolName: host pool} of a hybrid model; sidecar_specs:
        SidecarPoolSpecs of those that reuse another pool's indices;
        trailing_windows: {PoolName: pages} of the others (default 1)."""
        self.mem_pool_host = mem_pool_host
        self.extra_pools = self._extra_pools(extra_pools, sidecar_specs, trailing_windows)
        self.page_size = mem_pool_host.page_size
        self.tp_rank, self.tp_size = tp_rank, tp_size
        self.pp_rank, self.pp_size = pp_rank, pp_size
        self.attn_cp_rank, self.attn_cp_size = attn_cp_rank, attn_cp_size
        self.dp_rank, self.dp_size = dp_rank, dp_size
        self.model_name = model_name
        self.enable_storage_metrics = enable_storage_metrics
        self.storage_backend = None
        self.backup_skip = False
        self.use_v1 = False
        self.prefetch_threshold = max(256, self.page_size)
        self.pass_prefix_keys = False
        self._threads = []
        self._stop = threading.Event()
        if storage_backend is not None:
            self.attach_storage_backend(storage_backend, storage_backend_extra_config)

    @staticmethod
    def _extra_pools(pools, sidecar_specs, windows):
        specs = {spec.pool_name: spec for spec in sidecar_specs or []}
        out = []
        for name, pool in (pools or {}).items():
            spec = specs.get(name)
            policy = spec.hit_policy if spec is not None else PoolHitPolicy.TRAILING_PAGES
            out.append(ExtraPool(name, pool, policy, (windows or {}).get(name, 1), spec))
        return out

    # ---- attach / detach -----------------------------------------------------
    def _parse_extra_config(self, extra):
        if extra is None:
            return None
        if isinstance(extra, str):
            extra = json.loads(extra)
        extra = dict(extra)
        popped = {k: extra.pop(k) for k in _SGLANG_KEYS if k in extra}
        if "prefetch_threshold" in popped:
            self.prefetch_threshold = max(int(popped["prefetch_threshold"]), self.page_size)
        self.pass_prefix_keys = bool(popped.get("hicache_storage_pass_prefix_keys", False))
        self.tp_lcm_size = popped.get("tp_lcm_size")
        return extra

    def _generate_storage_config(self, extra_config):
        is_mla = isinstance(self.mem_pool_host, MLATokenToKVPoolHost)
        return HiCacheStorageConfig(
            tp_rank=self.tp_rank, tp_size=self.tp_size, pp_rank=self.pp_rank,
            pp_size=self.pp_size, attn_cp_rank=self.attn_cp_rank,
            attn_cp_size=self.attn_cp_size, is_mla_model=is_mla,
            enable_storage_metrics=self.enable_storage_metrics,
            is_page_first_layout=self.mem_pool_host.layout == "page_first",
            model_name=self.model_name, dp_rank=self.dp_rank, dp_size=self.dp_size,
            tp_lcm_size=getattr(self, "tp_lcm_size", None), should_split_heads=False,
            extra_config=extra_config)

    def attach_storage_backend(self, storage_backend, extra_config=None):
        extra = self._parse_extra_config(extra_config)
        self.storage_config = self._generate_storage_config(extra)
        self.backup_skip = self.storage_config.is_mla_model and self.tp_rank != 0
        backend = StorageBackendFactory.create_backend(storage_backend, self.storage_config,
                                                       self.mem_pool_host)
        backend.register_mem_pool_host(self.mem_pool_host)
        if self.extra_pools:
            backend.register_mem_host_pool_v2(self.mem_pool_host, PoolName.KV)
            for pool in self.extra_pools:
                backend.register_mem_host_pool_v2(pool.host_pool, pool.name)
        self.use_v1 = storage_backend == "dynamic" and bool((extra or {}).get("interface_v1"))
        self.storage_backend = backend
        return backend

    def flush_storage(self):
        """What a flush of the HiCache storage does to the backend."""
        if self.storage_backend is not None and hasattr(self.storage_backend, "clear"):
            return self.storage_backend.clear()
        return None

    def detach_storage_backend(self):
        self.stop_threads()
        backend, self.storage_backend = self.storage_backend, None
        if backend is not None and hasattr(backend, "close"):
            backend.close()

    # ---- hashing ---------------------------------------------------------------
    def page_hashes(self, token_ids, prior_hash=None):
        out = []
        P = self.page_size
        for i in range(0, len(token_ids) - P + 1, P):
            prior_hash = get_hash_str(token_ids[i:i + P], prior_hash)
            out.append(prior_hash)
        return out

    def _extra_info(self, hashes, start):
        if not self.pass_prefix_keys:
            return None
        return HiCacheStorageExtraInfo(prefix_keys=list(hashes[:start]))

    # ---- page IO ---------------------------------------------------------------
    def _page_get(self, hashes, host_indices, extra_info):
        if self.use_v1:
            results = self.storage_backend.batch_get_v1(hashes, host_indices, extra_info)
            n = 0
            for ok in results:
                if not ok:
                    break
                n += 1
            return n
        P = self.page_size
        dummy = [self.mem_pool_host.get_dummy_flat_data_page() for _ in hashes]
        pages = self.storage_backend.batch_get(hashes, dummy)
        if pages is None:
            return 0
        n = 0
        expected = dummy[0].numel() if dummy else 0
        for i, page in enumerate(pages):
            if page is None or page.numel() != expected:
                break
            self.mem_pool_host.set_from_flat_data_page(int(host_indices[i * P]), page)
            n += 1
        return n

    def _page_set(self, hashes, host_indices, extra_info):
        if self.use_v1:
            return all(self.storage_backend.batch_set_v1(hashes, host_indices, extra_info))
        P = self.page_size
        data = [self.mem_pool_host.get_data_page(int(host_indices[i * P]), flat=True)
                for i in range(len(hashes))]
        return bool(self.storage_backend.batch_set(hashes, data))

    # ---- prefetch ----------------------------------------------------------------
    def _exists_transfers(self):
        out = []
        for pool in self.extra_pools:
            keys = None
            if pool.hit_policy == PoolHitPolicy.TRAILING_PAGES:
                keys = [None] * pool.window  # only the window's length matters
            source = pool.sidecar.indices_from_pool if pool.sidecar is not None else None
            out.append(PoolTransfer(name=pool.name, keys=keys, hit_policy=pool.hit_policy,
                                    indices_from_pool=source))
        return out

    def storage_hit_query(self, op: PrefetchOperation):
        op.hashes = self.page_hashes(op.token_ids)
        if self.extra_pools:
            result = self.storage_backend.batch_exists_v2(op.hashes, self._exists_transfers(),
                                                          self._extra_info(op.hashes, 0))
            op.storage_hit_pages = result.kv_hit_pages
            op.pool_hit_pages = dict(result.extra_pool_hit_pages)
            return op.storage_hit_pages
        hit = 0
        for start in range(0, len(op.hashes), STORAGE_BATCH_SIZE):
            batch = op.hashes[start:start + STORAGE_BATCH_SIZE]
            n = self.storage_backend.batch_exists(batch, self._extra_info(op.hashes, start))
            hit += n
            if n < len(batch):
                break
        op.storage_hit_pages = hit
        return hit

    def prefetch_io(self, op: PrefetchOperation):
        P = self.page_size
        if op.storage_hit_pages * P < self.prefetch_threshold:
            return 0
        op.host_indices = self.mem_pool_host.alloc(op.storage_hit_pages * P)
        if op.host_indices is None:
            return 0
        done = 0
        for start in range(0, op.storage_hit_pages, STORAGE_BATCH_SIZE):
            end = min(start + STORAGE_BATCH_SIZE, op.storage_hit_pages)
            n = self._page_get(op.hashes[start:end], op.host_indices[start * P:end * P],
                               self._extra_info(op.hashes, start))
            done += n
            if n < end - start:
                break
        op.completed_pages = done
        if self.extra_pools and done == op.storage_hit_pages:
            self._prefetch_extra_pools(op)
        return done

    def _prefetch_extra_pools(self, op: PrefetchOperation):
        """The extra pools' pages of the hit: sidecars over the KV slots, the
        trailing pools' keys re-aligned to the pages just before the hit's end."""
        hit, P = op.storage_hit_pages, self.page_size
        transfers = []
        for pool in self.extra_pools:
            n = min(op.pool_hit_pages.get(str(pool.name), 0), hit)
            keys = op.hashes[hit - n:hit]
            if pool.sidecar is not None:
                indices = op.host_indices[(hit - n) * P:hit * P]
            else:
                indices = pool.host_pool.alloc(n * pool.host_pool.page_size)
                if indices is None:
                    indices, keys = torch.empty(0, dtype=torch.int64), []
            op.pool_keys[str(pool.name)] = keys
            op.pool_host_indices[str(pool.name)] = indices
            source = pool.sidecar.indices_from_pool if pool.sidecar is not None else None
            transfers.append(PoolTransfer(name=pool.name, host_indices=indices, keys=keys,
                                          hit_policy=pool.hit_policy, indices_from_pool=source))
        results = self.storage_backend.batch_get_v2(transfers, self._extra_info(op.hashes, 0))
        for t in transfers:
            n = 0
            for ok in results.get(str(t.name), []):
                if not ok:
                    break
                n += 1
            op.pool_loaded_pages[str(t.name)] = n

    def prefetch(self, token_ids) -> PrefetchOperation:
        """Lookup and load, synchronously (prefetch policy wait_complete)."""
        op = PrefetchOperation(list(token_ids))
        self.storage_hit_query(op)
        self.prefetch_io(op)
        op.done.set()
        return op

    # ---- backup ------------------------------------------------------------------
    def write_storage(self, host_indices, token_ids, pool_host_indices=None) -> BackupOperation:
        """pool_host_indices: {PoolName: slots} of each own-slot extra pool's
        trailing pages (the last `window` pages of this backup)."""
        op = BackupOperation(host_indices, list(token_ids),
                             {str(k): v for k, v in (pool_host_indices or {}).items()})
        self.backup(op)
        op.done.set()
        return op

    def backup(self, op: BackupOperation):
        op.hashes = self.page_hashes(op.token_ids)
        if self.backup_skip:
            op.ok = True
            return True
        P = self.page_size
        n_pages = len(op.hashes)
        for start in range(0, n_pages, STORAGE_BATCH_SIZE):
            end = min(start + STORAGE_BATCH_SIZE, n_pages)
            if not self._page_set(op.hashes[start:end], op.host_indices[start * P:end * P],
                                  self._extra_info(op.hashes, start)):
                op.ok = False
                return False
            if self.extra_pools and not self._backup_extra_pools(op, start, end):
                op.ok = False
                return False
        op.ok = True
        return True

    def _backup_extra_pools(self, op: BackupOperation, start, end):
        """batch_set_v2 for one batch of pages: the sidecars' slice of it; the
        trailing pools with the batch that ends the backup."""
        P, last = self.page_size, end == len(op.hashes)
        transfers = []
        for pool in self.extra_pools:
            if pool.sidecar is not None:
                transfers.append(PoolTransfer(
                    name=pool.name, host_indices=op.host_indices[start * P:end * P],
                    keys=op.hashes[start:end], hit_policy=pool.hit_policy,
                    indices_from_pool=pool.sidecar.indices_from_pool))
            elif last and str(pool.name) in op.pool_host_indices:
                indices = op.pool_host_indices[str(pool.name)]
                n = len(indices) // pool.host_pool.page_size
                transfers.append(PoolTransfer(name=pool.name, host_indices=indices,
                                              keys=op.hashes[len(op.hashes) - n:],
                                              hit_policy=pool.hit_policy))
        if not transfers:
            return True
        results = self.storage_backend.batch_set_v2(transfers, self._extra_info(op.hashes, start))
        ok = True
        for t in transfers:
            t_ok = all(results.get(str(t.name), [False]))
            op.pool_ok[str(t.name)] = op.pool_ok.get(str(t.name), True) and t_ok
            ok = ok and t_ok
        return ok

    # ---- threads -----------------------------------------------------------------
    def start_threads(self):
        """prefetch_thread -> prefetch_io_aux_thread, and backup_thread, as
        daemon threads fed by submit_prefetch/submit_backup."""
        self._stop.clear()
        self.prefetch_queue = queue.Queue()
        self.prefetch_io_queue = queue.Queue()
        self.backup_queue = queue.Queue()
        targets = {"prefetch_thread": self._prefetch_loop,
                   "prefetch_io_aux_thread": self._prefetch_io_loop,
                   "backup_thread": self._backup_loop}
        self._threads = [threading.Thread(target=t, name=n, daemon=True)
                         for n, t in targets.items()]
        for t in self._threads:
            t.start()

    def stop_threads(self):
        if not self._threads:
            return
        self._stop.set()
        for q in (self.prefetch_queue, self.prefetch_io_queue, self.backup_queue):
            q.put(None)
        for t in self._threads:
            t.join(timeout=30)
        self._threads = []

    def submit_prefetch(self, token_ids) -> PrefetchOperation:
        op = PrefetchOperation(list(token_ids))
        self.prefetch_queue.put(op)
        return op

    def submit_backup(self, host_indices, token_ids) -> BackupOperation:
        op = BackupOperation(host_indices, list(token_ids))
        self.backup_queue.put(op)
        return op

    def _prefetch_loop(self):
        while True:
            op = self.prefetch_queue.get()
            if op is None:
                return
            self.storage_hit_query(op)
            self.prefetch_io_queue.put(op)

    def _prefetch_io_loop(self):
        while True:
            op = self.prefetch_io_queue.get()
            if op is None:
                return
            self.prefetch_io(op)
            op.done.set()

    def _backup_loop(self):
        while True:
            op = self.backup_queue.get()
            if op is None:
                return
            self.backup(op)
            op.done.set()
