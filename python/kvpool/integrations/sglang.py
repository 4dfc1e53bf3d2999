"""SGLang HiCache L3 storage backend on kvpool (ENGINES.md section 1).

Enable with
    --enable-hierarchical-cache --hicache-mem-layout page_first
    --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "kvpool",
        "module_path": "kvpool.integrations.sglang",
        "class_name": "KvpoolHiCacheStorage", "interface_v1": 1}'

Our own extra-config keys (all optional; the connectors' shared settings,
kvpool.integrations._session):
    socket             the node's Unix socket (default: env KVPOOL_SOCKET,
                       else the node's default socket)
    remote             "host:port,..." peers: remote mode (no local node;
                       generic copy path only)
    namespace          a tag separating deployments that share a node
    timeout_ms         deadline of each kvpool call (default 2000)
    retry_interval_ms  how often a backend without a node retries (1000;
                       alias reconnect_interval_ms)

Objects. Each page is stored as the pieces get_page_buffer_meta gives for it:
MHA pages as two objects, K ("<key>_k") and V ("<key>_v"); MLA pages as one
("<key>"). The generic copy path splits a flat page into the same pieces, so
the zero-copy and generic paths read each other's pages.

Keys (section 1.5). The namespace holds what must match for two instances to
share pages: model, layout, page size, dtype and per-token geometry. The key
adds the page hash, then "_<tp_rank>_<tp_size>" for MHA (each rank holds
1/tp_size of the heads; MLA keys have no TP rank because only rank 0 writes),
"_pp<rank>_<size>" when pp_size > 1 and "_cp<rank>_<size>" when
attn_cp_size > 1. dp_rank is never part of a key.

Faults. No exception leaves this class: a node that is down, gone or late
turns into misses (batch_exists 0, batch_get_v1 False, get None) and failed
stores (False), as in every connector (the Session); the client reconnects
when the node comes back.
Thread-safe: the controller's prefetch, IO and backup threads call it
concurrently; the kvpool client is thread-safe and releases the GIL.
"""

import functools
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, List, Optional

import torch

from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, HiCacheStorageExtraInfo

from kvpool.client import Client, StatusCode

from ._dtypes import dtype_name
from ._session import Session, SessionSettings

logger = logging.getLogger(__name__)

_ZERO_COPY_LAYOUTS = ("page_first", "page_first_direct", "page_head")


def _never_raises(default):
    """Turns any exception of an engine-facing method into default(keys): the
    engine sees a miss or a failed store, never an exception it did not ask
    for (a malformed host_indices, a pool that is not what it claims, ...)."""

    def wrap(fn):
        @functools.wraps(fn)
        def guarded(self, keys, *args, **kwargs):
            try:
                return fn(self, keys, *args, **kwargs)
            except Exception as e:  # noqa: BLE001 - the engine must not see it
                self._session.failed(fn.__name__, e)
                return default(keys)

        return guarded

    return wrap


_ZERO = lambda keys: 0  # noqa: E731
_FALSE = lambda keys: False  # noqa: E731
_NONE = lambda keys: None  # noqa: E731
_ALL_FALSE = lambda keys: [False] * len(keys)  # noqa: E731
_ALL_NONE = lambda keys: [None] * len(keys)  # noqa: E731


@dataclass
class KvpoolStorageStats:
    """What get_stats() returns. The four lists follow SGLang's StorageMetrics
    (one entry per call since the last get_stats, drained on each call); the
    counters are totals since construction."""

    prefetch_pgs: List[int] = field(default_factory=list)
    backup_pgs: List[int] = field(default_factory=list)
    prefetch_bandwidth: List[float] = field(default_factory=list)  # GB/s per batch_get
    backup_bandwidth: List[float] = field(default_factory=list)  # GB/s per batch_set
    exists_calls: int = 0
    exists_hit_pages: int = 0
    get_pages: int = 0
    get_hit_pages: int = 0
    set_pages: int = 0
    set_ok_pages: int = 0
    set_skipped_pages: int = 0  # MLA on TP rank != 0: acknowledged, not written
    errors: int = 0  # calls that failed as a whole (node down, timeout, malformed)
    connected: bool = False
    namespace: str = ""


class KvpoolHiCacheStorage(HiCacheStorage):
    """HiCacheStorage over a kvpool node. Constructed by SGLang's dynamic loader
    as cls(storage_config, kwargs); the host pool arrives afterwards through
    register_mem_pool_host."""

    def __init__(self, storage_config, kwargs=None):
        extra = dict(getattr(storage_config, "extra_config", None) or {})
        self.storage_config = storage_config
        self.tp_rank = int(getattr(storage_config, "tp_rank", 0) or 0)
        self.tp_size = int(getattr(storage_config, "tp_size", 1) or 1)
        self.pp_rank = int(getattr(storage_config, "pp_rank", 0) or 0)
        self.pp_size = int(getattr(storage_config, "pp_size", 1) or 1)
        self.cp_rank = int(getattr(storage_config, "attn_cp_rank", 0) or 0)
        self.cp_size = int(getattr(storage_config, "attn_cp_size", 1) or 1)
        self.is_mla = bool(getattr(storage_config, "is_mla_model", False))
        self.model_name = (getattr(storage_config, "model_name", None) or "").replace("/", "-")
        # Same rule as the controller's backup_skip; kept here too so a rank
        # that is asked to store anyway still writes nothing.
        self.backup_skip = self.is_mla and self.tp_rank != 0
        self.settings = SessionSettings(namespace="").update(extra)
        self._tag = self.settings.namespace
        if getattr(storage_config, "should_split_heads", False):
            logger.warning("kvpool: page_head head splitting (tp_lcm_size) is not supported; "
                           "pages are keyed by this rank's TP rank and size")

        self.mem_pool_host = None
        self._page_size = None
        self._pieces = 1 if self.is_mla else 2
        self._suffixes = ("",) if self.is_mla else ("_k", "_v")
        self._zero_copy = False
        self._key_suffix = self._rank_suffix()
        self.namespace = self._make_namespace()

        self._lock = threading.Lock()  # guards the stats
        self._stats = KvpoolStorageStats(namespace=self.namespace)
        # No connection yet: the namespace depends on the host pool, which
        # register_mem_pool_host brings (it connects; so does a first call).
        self._session = Session(self.settings, self.namespace, log=logger)

    # ---- naming ----------------------------------------------------------------
    def _rank_suffix(self):
        s = "" if self.is_mla else "_%d_%d" % (self.tp_rank, self.tp_size)
        if self.pp_size > 1:
            s += "_pp%d_%d" % (self.pp_rank, self.pp_size)
        if self.cp_size > 1:
            s += "_cp%d_%d" % (self.cp_rank, self.cp_size)
        return s

    def _make_namespace(self):
        """sglang|<tag>|<model>|<mla|mha>|<layout>|p<page>|<dtype>|<geometry>"""
        pool = self.mem_pool_host
        if pool is None:
            layout = "page_first" if getattr(self.storage_config, "is_page_first_layout",
                                             False) else "unknown"
            return "sglang|%s|%s|%s|%s" % (self._tag, self.model_name,
                                           "mla" if self.is_mla else "mha", layout)
        dtype = dtype_name(pool.dtype)
        if self.is_mla:
            geometry = "l%dc%d" % (getattr(pool, "layer_num", 0), getattr(pool, "kv_cache_dim", 0))
        else:
            geometry = "l%dh%dd%d" % (getattr(pool, "layer_num", 0), getattr(pool, "head_num", 0),
                                      getattr(pool, "head_dim", 0))
        geometry += "b%d" % pool.get_size_per_token()
        return "sglang|%s|%s|%s|%s|p%d|%s|%s" % (
            self._tag, self.model_name, "mla" if self.is_mla else "mha", pool.layout,
            pool.page_size, dtype, geometry)

    def _object_keys(self, keys):
        """Per page, its pieces' keys, in get_page_buffer_meta order."""
        out = []
        sfx = self._key_suffix
        for k in keys:
            base = k + sfx
            out.extend(base + p for p in self._suffixes)
        return out

    # ---- registration --------------------------------------------------------
    def register_mem_pool_host(self, mem_pool_host):
        super().register_mem_pool_host(mem_pool_host)
        self._page_size = mem_pool_host.page_size
        self._zero_copy = mem_pool_host.layout in _ZERO_COPY_LAYOUTS
        if not self._zero_copy:
            logger.warning("kvpool: layout %s has no zero-copy path (use page_first or "
                           "page_first_direct); batch_get_v1/batch_set_v1 will miss",
                           mem_pool_host.layout)
        namespace = self._make_namespace()
        with self._lock:
            self.namespace = namespace
            self._stats.namespace = namespace
        self._session.reopen(namespace)  # a client opened under the provisional one is closed

    def _page_meta(self, host_indices, n_pages):
        """(ptrs, sizes) of n_pages pages at host_indices, or None when they do
        not have this backend's shape."""
        if not self._zero_copy or self.mem_pool_host is None:
            return None
        ptrs, sizes = self.mem_pool_host.get_page_buffer_meta(host_indices)
        if len(ptrs) != n_pages * self._pieces or len(sizes) != len(ptrs):
            return None
        return ptrs, sizes

    # ---- zero-copy path --------------------------------------------------------
    @_never_raises(_ZERO)
    def batch_exists(self, keys: List[str],
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> int:
        if not keys:
            return 0
        objects = self._object_keys(keys)
        hit = self._session.call(lambda c: c.hit_prefix(objects), 0, "exists") // self._pieces
        with self._lock:
            self._stats.exists_calls += 1
            self._stats.exists_hit_pages += hit
        return hit

    def _per_page(self, statuses, n):
        """One bool per page: all of its pieces OK."""
        if self._pieces == 1:
            return [s == StatusCode.OK for s in statuses]
        if self._pieces == 2:
            return [k == StatusCode.OK and v == StatusCode.OK
                    for k, v in zip(statuses[0::2], statuses[1::2])]
        p = self._pieces
        return [all(s == StatusCode.OK for s in statuses[i * p:(i + 1) * p]) for i in range(n)]

    def _zero_copy_io(self, keys, host_indices, call):
        """call(client, object keys, ptrs, sizes) over the pages' host memory.
        Returns (one bool per page, bytes moved per call)."""
        n = len(keys)
        meta = self._page_meta(host_indices, n)
        if meta is None:
            return [False] * n, 0
        ptrs, sizes = meta
        objects = self._object_keys(keys)
        st = self._session.call(lambda c: call(c, objects, ptrs, sizes), None, call.__name__)
        if st is None:
            return [False] * n, 0
        return self._per_page(st, n), sum(sizes)

    @_never_raises(_ALL_FALSE)
    def batch_get_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        if not keys:
            return []
        t0 = time.perf_counter()
        out, nbytes = self._zero_copy_io(keys, host_indices, Client.get_ptrs)
        self._count_get(len(keys), out, nbytes, t0)
        return out

    @_never_raises(_ALL_FALSE)
    def batch_set_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        if not keys:
            return []
        if self.backup_skip:
            with self._lock:
                self._stats.set_skipped_pages += len(keys)
            return [True] * len(keys)
        t0 = time.perf_counter()
        out, nbytes = self._zero_copy_io(keys, host_indices, Client.put_ptrs)
        self._count_set(len(keys), out, nbytes, t0)
        return out

    # ---- generic (copy) path: flat page tensors --------------------------------
    def _flat_pieces(self, tensor):
        """(ptrs, sizes) of a flat page tensor cut into this backend's pieces,
        or None when it is not a whole page of the registered pool."""
        if not isinstance(tensor, torch.Tensor) or not tensor.is_contiguous():
            return None
        if tensor.device.type != "cpu":
            return None
        nbytes = tensor.numel() * tensor.element_size()
        pool = self.mem_pool_host
        if pool is not None:
            if tensor.dtype != pool.dtype or nbytes != pool.get_size_per_token() * pool.page_size:
                return None
        if nbytes == 0 or nbytes % self._pieces:
            return None
        piece = nbytes // self._pieces
        base = tensor.data_ptr()
        return [base + i * piece for i in range(self._pieces)], [piece] * self._pieces

    def _dummy_page(self):
        if self.mem_pool_host is None:
            return None
        return self.mem_pool_host.get_dummy_flat_data_page()

    @_never_raises(_ALL_NONE)
    def batch_get(self, keys: List[str], target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> List[Optional[torch.Tensor]]:
        n = len(keys)
        if n == 0:
            return []
        t0 = time.perf_counter()
        if target_locations is None:
            target_locations = [self._dummy_page() for _ in keys]
        ptrs, sizes, usable = [], [], []
        for t in target_locations:
            pieces = None if t is None else self._flat_pieces(t)
            usable.append(pieces is not None)
            if pieces is not None:
                ptrs += pieces[0]
                sizes += pieces[1]
        objects = []
        for k, ok in zip(keys, usable):
            if ok:
                objects += self._object_keys([k])
        st = self._session.call(lambda c: c.get_ptrs(objects, ptrs, sizes), None,
                                "get") if objects else []
        if st is None:
            return [None] * n
        out, j, p = [], 0, self._pieces
        for t, ok in zip(target_locations, usable):
            if not ok:
                out.append(None)
                continue
            hit = all(s == StatusCode.OK for s in st[j:j + p])
            j += p
            out.append(t if hit else None)
        self._count_get(n, [o is not None for o in out], sum(sizes), t0)
        return out

    @_never_raises(_NONE)
    def get(self, key: str, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> Optional[torch.Tensor]:
        return self.batch_get([key], None if target_location is None else [target_location])[0]

    @_never_raises(_FALSE)
    def batch_set(self, keys: List[str], values: Optional[Any] = None,
                  target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> bool:
        n = len(keys)
        if n == 0:
            return True
        if self.backup_skip:
            with self._lock:
                self._stats.set_skipped_pages += n
            return True
        if values is None or len(values) != n:
            return False
        t0 = time.perf_counter()
        ptrs, sizes = [], []
        for v in values:
            pieces = self._flat_pieces(v)
            if pieces is None:
                return False
            ptrs += pieces[0]
            sizes += pieces[1]
        objects = self._object_keys(keys)
        st = self._session.call(lambda c: c.put_ptrs(objects, ptrs, sizes), None, "set")
        if st is None:
            return False
        out = self._per_page(st, n)
        self._count_set(n, out, sum(sizes), t0)
        return all(out)

    @_never_raises(_FALSE)
    def set(self, key: str, value: Optional[Any] = None, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> bool:
        return self.batch_set([key], [value])

    @_never_raises(_FALSE)
    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    # ---- housekeeping ----------------------------------------------------------
    def _count_get(self, n, hits, nbytes, t0):
        got = 0
        for h in hits:
            if not h:
                break
            got += 1
        dt = time.perf_counter() - t0
        with self._lock:
            s = self._stats
            s.get_pages += n
            s.get_hit_pages += sum(1 for h in hits if h)
            s.prefetch_pgs.append(got)
            s.prefetch_bandwidth.append(nbytes * got / max(n, 1) / dt / 1e9 if dt > 0 else 0.0)

    def _count_set(self, n, oks, nbytes, t0):
        ok = sum(1 for o in oks if o)
        dt = time.perf_counter() - t0
        with self._lock:
            s = self._stats
            s.set_pages += n
            s.set_ok_pages += ok
            s.backup_pgs.append(ok)
            s.backup_bandwidth.append(nbytes * ok / max(n, 1) / dt / 1e9 if dt > 0 else 0.0)

    def get_stats(self):
        """A KvpoolStorageStats; its per-call lists are drained by each call."""
        with self._lock:
            s = self._stats
            snapshot = KvpoolStorageStats(**{k: getattr(s, k) for k in s.__dataclass_fields__})
            s.prefetch_pgs, s.backup_pgs = [], []
            s.prefetch_bandwidth, s.backup_bandwidth = [], []
        snapshot.connected = self._session.connected
        snapshot.errors = self._session.errors
        return snapshot

    def clear(self) -> bool:
        """kvpool has no bulk delete by namespace: entries leave by eviction.
        Logs and returns False."""
        logger.warning("kvpool: clear() is not supported; entries leave the cache by eviction")
        return False

    def close(self):
        """Disconnects; later calls miss. Idempotent."""
        self._session.close()
