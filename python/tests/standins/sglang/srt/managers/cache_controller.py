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
Rank agreement (the all-reduce MIN over TP) is left to multi-rank tests.
"""

import json
import queue
import threading
from dataclasses import dataclass, field
from typing import List, Optional

import torch

from sglang.srt.mem_cache.hicache_storage import (
    STORAGE_BATCH_SIZE,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
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
    done: threading.Event = field(default_factory=threading.Event)


@dataclass
class BackupOperation:
    host_indices: torch.Tensor
    token_ids: List[int]
    hashes: List[str] = field(default_factory=list)
    ok: Optional[bool] = None
    done: threading.Event = field(default_factory=threading.Event)


class HiCacheController:
    def __init__(self, mem_pool_host, *, tp_rank=0, tp_size=1, pp_rank=0, pp_size=1,
                 attn_cp_rank=0, attn_cp_size=1, dp_rank=0, dp_size=1, model_name=None,
                 enable_storage_metrics=False, storage_backend=None,
                 storage_backend_extra_config=None):
        self.mem_pool_host = mem_pool_host
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
        self.use_v1 = storage_backend == "dynamic" and bool((extra or {}).get("interface_v1"))
        self.storage_backend = backend
        return backend

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
    def storage_hit_query(self, op: PrefetchOperation):
        op.hashes = self.page_hashes(op.token_ids)
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
        return done

    def prefetch(self, token_ids) -> PrefetchOperation:
        """Lookup and load, synchronously (prefetch policy wait_complete)."""
        op = PrefetchOperation(list(token_ids))
        self.storage_hit_query(op)
        self.prefetch_io(op)
        op.done.set()
        return op

    # ---- backup ------------------------------------------------------------------
    def write_storage(self, host_indices, token_ids) -> BackupOperation:
        op = BackupOperation(host_indices, list(token_ids))
        self.backup(op)
        op.done.set()
        return op

    def backup(self, op: BackupOperation):
        op.hashes = self.page_hashes(op.token_ids)
        if self.backup_skip:
            op.ok = True
            return True
        P = self.page_size
        for start in range(0, len(op.hashes), STORAGE_BATCH_SIZE):
            end = min(start + STORAGE_BATCH_SIZE, len(op.hashes))
            if not self._page_set(op.hashes[start:end], op.host_indices[start * P:end * P],
                                  self._extra_info(op.hashes, start)):
                op.ok = False
                return False
        op.ok = True
        return True

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
