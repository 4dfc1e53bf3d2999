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
    block_descriptors  attach to each KV page put the block descriptor
                       SGLang's own KV events would carry (default true)

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

Hybrid models (ENGINES.md 6.5). The extra host pools (Mamba, SWA, DSA
indexer, ...) arrive through register_mem_host_pool_v2 (the KV pool, if
offered there after register_mem_pool_host, is skipped) and move through
batch_exists_v2 / batch_get_v2 / batch_set_v2 as flat pages copied with
the pool's get_data_page / set_from_flat_data_page. A pool's page is one
object "<key>.<pool>-<dtype>-b<bytes per page><rank suffix>", so pools
never share objects, and a pool whose dtype or page size differs between
two instances is a miss rather than wrong state. batch_exists_v2 answers
the largest prefix every pool's hit policy allows: ALL_PAGES, each page of
the prefix exists in the pool; TRAILING_PAGES with window N = len(keys),
the last min(N, prefix) pages before the prefix's end exist in it. A pool
that was not registered has no pages.

clear(). Drops every object of this backend's namespace on the node at
once, DRAM and SSD (Client.clear): all pages of every TP/PP/CP rank of
every instance that shares the namespace, extra pools included; other
namespaces keep theirs. The node holds its other local requests while it
runs, so it suits a flush, not routine use; remote mode has no clear (the
call fails and is logged). SGLang flushes every rank, so every rank calls
it: the first call drops the pages and later ones drop whatever was
written in between (they report 0 when nothing was). No rank is special,
because ranks on other hosts talk to other nodes, each of which must be
cleared by a rank of its own. Returns None (SGLang's contract); the number
dropped is logged and counted in get_stats().cleared_entries.

Block descriptors (docs/kv-events.md; docs/connectors.md "Block
descriptors"). Every KV page object put (both pieces of an MHA page, the
one object of an MLA page) carries a descriptor saying what SGLang's own
KV events say of that page, so the node's events about it name the page
SGLang's way:
  hash        the page hash SGLang hands us (the key: the SHA-256 hex of the
              page's tokens chained on the previous page's hash, ENGINES.md
              1.5) as SGLang's radix-cache events write it: the signed
              64-bit int of the digest's first 8 bytes, big-endian. ENGINES.md
              does not say how SGLang's events write a page hash (6.1 only
              says they are positional, up to extra_keys); this is read from
              SGLang's public source (its events hash a page with the same
              get_hash_str as HiCache, truncated to int64), and it is why the
              hash goes as an int, not the digest's bytes: the node's int64
              mode would take the *last* 8 bytes of a bytes hash (vLLM's and
              llm-d's rule), not SGLang's first 8.
  parent      the previous page's hash: the previous key of the batch (the
              controller hands one backup's pages in order, in batches of
              128, each page's hash chained on the one before, ENGINES.md 1.4
              and 1.5); for a batch's first page the last of
              extra_info.prefix_keys when SGLang passes them
              (hicache_storage_pass_prefix_keys: true), else None.
  token_ids   empty: batch_set_v1/batch_set hand over hashes and host slots
              only (ENGINES.md 1.3; extra_info carries prefix keys and a
              free-form dict, no tokens).
  block_size  the host pool's page size.
A key that is not such a hash (a caller's own key) gets no descriptor.
Extra pools' pages (v2) get none: SGLang's events are about KV pages.

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
from typing import Any, Dict, List, Optional

import torch

from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, HiCacheStorageExtraInfo

from kvpool.client import Client, StatusCode

from ._descriptors import Describer, sha256_hex_to_int64
from ._dtypes import dtype_name
from ._hints import OPS as HINT_OPS, Applier
from ._session import Session, SessionSettings

try:  # SGLang 2026: the v2 (pool-aware) interface
    from sglang.srt.mem_cache.hicache_storage import PoolTransferResult
except ImportError:  # older SGLang has no hybrid pools; the v2 methods are then unused

    @dataclass
    class PoolTransferResult:
        kv_hit_pages: int
        extra_pool_hit_pages: Dict[str, int]


logger = logging.getLogger(__name__)

_ZERO_COPY_LAYOUTS = ("page_first", "page_first_direct", "page_head")


def _never_raises(default):
    """Turns any exception of an engine-facing method into default(keys, ...)
    (called with the method's arguments): the engine sees a miss or a failed
    store, never an exception it did not ask for (a malformed host_indices,
    a pool that is not what it claims, ...)."""

    def wrap(fn):
        @functools.wraps(fn)
        def guarded(self, keys, *args, **kwargs):
            try:
                return fn(self, keys, *args, **kwargs)
            except Exception as e:  # noqa: BLE001 - the engine must not see it
                self._session.failed(fn.__name__, e)
                return default(keys, *args, **kwargs)

        return guarded

    return wrap


_ZERO = lambda keys, *a, **k: 0  # noqa: E731
_FALSE = lambda keys, *a, **k: False  # noqa: E731
_NONE = lambda keys, *a, **k: None  # noqa: E731
_ALL_FALSE = lambda keys, *a, **k: [False] * len(keys)  # noqa: E731
_ALL_NONE = lambda keys, *a, **k: [None] * len(keys)  # noqa: E731


def _no_pool_hits(keys, pool_transfers=None, *args, **kwargs):
    """batch_exists_v2's answer when nothing can be used."""
    try:
        names = [_pool_name(t.name) for t in pool_transfers or []]
    except Exception:  # noqa: BLE001 - malformed transfers: no pools to name
        names = []
    return PoolTransferResult(kv_hit_pages=0,
                              extra_pool_hit_pages={n: 0 for n in names if n != _KV})


def _pool_results_false(transfers, *args, **kwargs):
    """batch_get_v2/batch_set_v2's answer when the call failed as a whole."""
    out = {}
    try:
        for t in transfers or []:
            out[_pool_name(t.name)] = [False] * len(t.keys or [])
    except Exception:  # noqa: BLE001 - malformed transfers
        pass
    return out


_KV = "kv"
_TRAILING = "trailing_pages"


def _pool_name(name) -> str:
    """A PoolName or its value, as the value ("mamba")."""
    return str(getattr(name, "value", name))


def _leading(flags) -> int:
    n = 0
    for f in flags:
        if not f:
            break
        n += 1
    return n


def _largest_prefix(limit, present, policies):
    """Largest s <= limit such that, for each pool, present[pool][i] holds for
    every page i in [0, s) (ALL_PAGES) or in [s - min(window, s), s)
    (TRAILING_PAGES). policies: {pool: (policy, window)}."""
    runs = {}  # pool -> length of the run of present pages ending at each page
    for pool, (policy, _) in policies.items():
        if policy == _TRAILING:
            run, acc = [], 0
            for ok in present[pool]:
                acc = acc + 1 if ok else 0
                run.append(acc)
            runs[pool] = run
        else:
            limit = min(limit, _leading(present[pool]))
    for s in range(limit, 0, -1):
        if all(runs[p][s - 1] >= min(w, s) for p, (pol, w) in policies.items()
               if pol == _TRAILING):
            return s
    return 0


# The hints applied when pages are backed up (batch_set_*): a prefetch
# applies at the exists check instead.
_STORE_HINTS = tuple(op for op in HINT_OPS if op != "prefetch")


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
    pool_get_pages: int = 0  # extra-pool (v2) pages asked for, and found
    pool_get_hit_pages: int = 0
    pool_set_pages: int = 0  # extra-pool (v2) pages offered, and stored
    pool_set_ok_pages: int = 0
    clears: int = 0  # clear() calls that reached the node
    cleared_entries: int = 0  # objects they dropped
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
        self.registered_pools = {}  # pool name -> host pool (v2; the KV pool under "kv")
        self._pool_tags = {}  # extra pool name -> ".<pool>-<dtype>-b<page bytes>"
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
        self._session = Session(self.settings, self.namespace, log=logger,
                                client_name="sglang hicache tp%d" % self.tp_rank)
        self._describer = Describer(self.settings.block_descriptors, logger)
        self._hints = Applier(self._session, logger, self.settings.hint_default_ttl_s)

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

    def _page_descriptors(self, keys, first_parent=None):
        """Per page, the block descriptor SGLang's own KV events would carry
        (see the module docstring), or None; `first_parent` is the page hash
        before keys[0] (None: not known)."""
        if not self._describer.enabled or not self._page_size:
            return [None] * len(keys)
        out = []
        parent = sha256_hex_to_int64(first_parent)
        for k in keys:
            h = sha256_hex_to_int64(k)
            out.append(None if h is None else
                       self._describer.make(h, self._page_size, (), parent))
            parent = h
        return out

    @staticmethod
    def _parent_of_batch(extra_info):
        """The page hash before a batch: the last of extra_info.prefix_keys."""
        prefix = getattr(extra_info, "prefix_keys", None)
        if isinstance(prefix, (list, tuple)) and prefix and prefix[-1] is not None:
            return prefix[-1]
        return None

    def _object_descriptors(self, keys, first_parent=None):
        """_page_descriptors per object (each piece of a page carries its
        page's), or None when no page has one."""
        pages = self._page_descriptors(keys, first_parent)
        if all(d is None for d in pages):
            return None
        return [d for d in pages for _ in self._suffixes]

    def _put(self, client, objects, ptrs, sizes, descs):
        return self._describer.put_ptrs(client, objects, ptrs, sizes, descs)

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

    def register_mem_host_pool_v2(self, host_pool, host_pool_name):
        """An extra host pool of a hybrid model, by PoolName. The KV pool is
        skipped when register_mem_pool_host already registered it (and
        registered through it otherwise)."""
        name = _pool_name(host_pool_name)
        if name == _KV:
            if self.mem_pool_host is None:
                self.register_mem_pool_host(host_pool)
            elif host_pool is not self.mem_pool_host:
                logger.warning("kvpool: a second KV host pool offered through v2 is ignored")
            self.registered_pools[_KV] = self.mem_pool_host
            return
        page = host_pool.get_dummy_flat_data_page()
        nbytes = page.numel() * page.element_size()
        self._pool_tags[name] = ".%s-%s-b%d" % (name, dtype_name(page.dtype), nbytes)
        self.registered_pools[name] = host_pool

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
        # A prefetch hint rides on the check that comes before a prefetch.
        self._apply_hints(extra_info, objects, ("prefetch",))
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

    def _zero_copy_io(self, keys, host_indices, call, what, descs=None):
        """call(client, object keys, ptrs, sizes, descs) over the pages' host
        memory. Returns (one bool per page, bytes moved per call)."""
        n = len(keys)
        meta = self._page_meta(host_indices, n)
        if meta is None:
            return [False] * n, 0
        ptrs, sizes = meta
        objects = self._object_keys(keys)
        st = self._session.call(lambda c: call(c, objects, ptrs, sizes, descs), None, what)
        if st is None:
            return [False] * n, 0
        return self._per_page(st, n), sum(sizes)

    @_never_raises(_ALL_FALSE)
    def batch_get_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        if not keys:
            return []
        t0 = time.perf_counter()
        out, nbytes = self._zero_copy_io(keys, host_indices,
                                         lambda c, o, p, s, _d: c.get_ptrs(o, p, s), "get_ptrs")
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
        descs = self._object_descriptors(keys, self._parent_of_batch(extra_info))
        out, nbytes = self._zero_copy_io(keys, host_indices, self._put, "put_ptrs", descs)
        self._count_set(len(keys), out, nbytes, t0)
        self._apply_hints(extra_info, self._object_keys(keys), _STORE_HINTS)
        return out

    def _apply_hints(self, extra_info, objects, ops):
        """The kv_hints envelope a call's extra_info carries (its free-form
        extra_info dict, "kv_hints"; kvpool.integrations._hints): its
        actions among ops, on the call's pages."""
        info = getattr(extra_info, "extra_info", None)
        envelope = info.get("kv_hints") if isinstance(info, dict) else None
        if envelope is not None:
            self._hints.apply_envelope(envelope, objects, ops)

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
        if any(self._flat_pieces(v) is None for v in values):
            return False
        # SGLang's generic batch_set has no extra_info: a batch's first page
        # has no known parent.
        return all(self._store_flat(keys, values, None))

    def _store_flat(self, keys, values, first_parent):
        """Stores flat page tensors in one call, each with its page's block
        descriptor (first_parent: the page hash before keys[0], if known).
        One bool per page; a tensor that is not a page of the pool is False
        and not sent."""
        t0 = time.perf_counter()
        page_descs = self._page_descriptors(keys, first_parent)
        objects, ptrs, sizes, descs, sent = [], [], [], [], []
        for k, v, d in zip(keys, values, page_descs):
            pieces = self._flat_pieces(v)
            sent.append(pieces is not None)
            if pieces is None:
                continue
            objects += self._object_keys([k])
            ptrs += pieces[0]
            sizes += pieces[1]
            descs += [d] * self._pieces
        out = [False] * len(keys)
        if objects:
            st = self._session.call(lambda c: self._put(c, objects, ptrs, sizes, descs), None,
                                    "set")
            if st is not None:
                stored = iter(self._per_page(st, len(objects) // self._pieces))
                out = [next(stored) if ok else False for ok in sent]
        self._count_set(len(keys), out, sum(sizes), t0)
        return out

    @_never_raises(_FALSE)
    def set(self, key: str, value: Optional[Any] = None, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> bool:
        return self.batch_set([key], [value])

    @_never_raises(_FALSE)
    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    # ---- hybrid pools (v2) -------------------------------------------------------
    def _pool_keys(self, name, keys):
        """Object keys of an extra pool's pages (None when not registered)."""
        tag = self._pool_tags.get(name)
        if tag is None:
            return None
        sfx = tag + self._key_suffix
        return [k + sfx for k in keys]

    @_never_raises(_no_pool_hits)
    def batch_exists_v2(self, keys: List[str], pool_transfers=None,
                        extra_info: Optional[HiCacheStorageExtraInfo] = None):
        """PoolTransferResult: kv_hit_pages, the largest prefix of keys whose
        KV pages exist and which every extra pool's hit policy allows;
        extra_pool_hit_pages, per extra pool the pages of that prefix it
        must supply (ALL_PAGES: the prefix; TRAILING_PAGES: its last
        min(window, prefix) pages). One existence query for all pools."""
        policies, queried = {}, {}
        for t in pool_transfers or []:
            name = _pool_name(t.name)
            if name == _KV:
                continue
            trailing = _pool_name(t.hit_policy) == _TRAILING
            policies[name] = (_TRAILING if trailing else "all_pages",
                              max(1, len(t.keys or [])) if trailing else 0)
            objects = self._pool_keys(name, keys)
            if objects is not None:
                queried[name] = objects
        if not keys:
            return _no_pool_hits(keys, pool_transfers)
        kv_objects = self._object_keys(keys)
        objects = kv_objects + [o for objs in queried.values() for o in objs]
        found = self._session.call(lambda c: c.exists(objects), None, "exists")
        if found is None:
            return _no_pool_hits(keys, pool_transfers)
        p = self._pieces
        kv_hit = _leading(all(found[i * p:(i + 1) * p]) for i in range(len(keys)))
        present, at = {}, len(kv_objects)
        for name in policies:
            if name in queried:
                present[name] = found[at:at + len(keys)]
                at += len(keys)
            else:
                present[name] = [False] * len(keys)  # a pool we cannot load has no pages
        hit = _largest_prefix(kv_hit, present, policies)
        extra = {name: (min(w, hit) if pol == _TRAILING else hit)
                 for name, (pol, w) in policies.items()}
        with self._lock:
            self._stats.exists_calls += 1
            self._stats.exists_hit_pages += hit
        return PoolTransferResult(kv_hit_pages=hit, extra_pool_hit_pages=extra)

    def _resolve(self, transfers):
        """Each transfer as (name, keys, host_indices, host pool); a sidecar
        without keys or indices takes those of the transfer it names in
        indices_from_pool."""
        by_name = {_pool_name(t.name): t for t in transfers}
        out = []
        for t in transfers:
            name = _pool_name(t.name)
            keys, indices = t.keys, t.host_indices
            src = by_name.get(_pool_name(t.indices_from_pool)) if t.indices_from_pool else None
            if src is not None and src is not t:
                keys = src.keys if keys is None else keys
                indices = src.host_indices if indices is None else indices
            pool = self.mem_pool_host if name == _KV else self.registered_pools.get(name)
            out.append((name, list(keys or []), indices, pool))
        return out

    @staticmethod
    def _firsts(pool, host_indices, n):
        """The index of each of n pages (host_indices holds page_size indices
        per page), or None when it does not."""
        if pool is None or host_indices is None:
            return None
        step = int(getattr(pool, "page_size", 1) or 1)
        if len(host_indices) != n * step:
            return None
        return [int(i) for i in host_indices[::step].tolist()]

    def _pool_io(self, transfers, store, extra_info=None):
        """Extra-pool pages of all transfers in one kvpool call (KV transfers
        through the v1/generic KV path). Returns {pool name: bools}."""
        out, pending = {}, []  # pending: (name, keys, firsts, pool, tensors)
        objects, ptrs, sizes = [], [], []
        for name, keys, indices, pool in self._resolve(transfers):
            if not keys:
                out[name] = []
                continue
            if name == _KV:
                out[name] = self._kv_io(keys, indices, store, extra_info)
                continue
            firsts = self._firsts(pool, indices, len(keys))
            obj = self._pool_keys(name, keys)
            if firsts is None or obj is None:
                out[name] = [False] * len(keys)
                continue
            dummy = pool.get_dummy_flat_data_page()
            expect = dummy.numel() * dummy.element_size()
            if store:
                tensors = [pool.get_data_page(f, flat=True).contiguous() for f in firsts]
            else:
                tensors = [dummy] + [pool.get_dummy_flat_data_page() for _ in firsts[1:]]
            if any(t.device.type != "cpu" or t.numel() * t.element_size() != expect
                   for t in tensors):
                out[name] = [False] * len(keys)
                continue
            pending.append((name, keys, firsts, pool, tensors))
            objects += obj
            ptrs += [t.data_ptr() for t in tensors]
            sizes += [expect] * len(tensors)
        if not pending:
            return out
        fn = Client.put_ptrs if store else Client.get_ptrs
        st = self._session.call(lambda c: fn(c, objects, ptrs, sizes), None,
                                "set_v2" if store else "get_v2")
        at = 0
        for name, keys, firsts, pool, tensors in pending:
            oks = [False] * len(keys) if st is None else \
                [s == StatusCode.OK for s in st[at:at + len(keys)]]
            at += len(keys)
            if not store:
                for ok, f, t in zip(oks, firsts, tensors):
                    if ok:
                        pool.set_from_flat_data_page(f, t)
            out[name] = oks
        return out

    def _kv_io(self, keys, host_indices, store, extra_info=None):
        """KV pages named in a v2 call: the same objects (and descriptors)
        as batch_*_v1 and the generic path."""
        if self._zero_copy:
            return (self.batch_set_v1 if store else self.batch_get_v1)(keys, host_indices,
                                                                       extra_info)
        pool = self.mem_pool_host
        firsts = self._firsts(pool, host_indices, len(keys))
        if firsts is None:
            return [False] * len(keys)
        if store:
            pages = [pool.get_data_page(f, flat=True).contiguous() for f in firsts]
            out = self._store_flat(keys, pages, self._parent_of_batch(extra_info))
            self._apply_hints(extra_info, self._object_keys(keys), _STORE_HINTS)
            return out
        got = self.batch_get(keys)
        for f, page in zip(firsts, got):
            if page is not None:
                pool.set_from_flat_data_page(f, page)
        return [page is not None for page in got]

    def _count_pools(self, results, store):
        n = sum(len(v) for k, v in results.items() if k != _KV)
        ok = sum(sum(1 for x in v if x) for k, v in results.items() if k != _KV)
        with self._lock:
            if store:
                self._stats.pool_set_pages += n
                self._stats.pool_set_ok_pages += ok
            else:
                self._stats.pool_get_pages += n
                self._stats.pool_get_hit_pages += ok

    @_never_raises(_pool_results_false)
    def batch_get_v2(self, transfers, extra_info: Optional[HiCacheStorageExtraInfo] = None):
        """Loads each transfer's pages into its pool at host_indices. Returns
        {pool name: one bool per key}."""
        out = self._pool_io(transfers or [], store=False, extra_info=extra_info)
        self._count_pools(out, store=False)
        return out

    @_never_raises(_pool_results_false)
    def batch_set_v2(self, transfers, extra_info: Optional[HiCacheStorageExtraInfo] = None):
        """Stores each transfer's pages read from its pool at host_indices.
        Returns {pool name: one bool per key}; an MLA backend on a TP rank
        other than 0 stores nothing and answers True."""
        transfers = transfers or []
        if self.backup_skip:
            out = {name: [True] * len(keys) for name, keys, _, _ in self._resolve(transfers)}
            with self._lock:
                self._stats.set_skipped_pages += sum(len(v) for v in out.values())
            return out
        out = self._pool_io(transfers, store=True, extra_info=extra_info)
        self._count_pools(out, store=True)
        return out

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

    def clear(self) -> None:
        """Drops every object of this backend's namespace on the node at once
        (every rank's and every pool's pages; other namespaces keep theirs).
        Returns None; a failure is logged and counted, never raised."""
        dropped = self._session.call(lambda c: c.clear(), None, "clear")
        if dropped is None:
            logger.warning("kvpool: clear of namespace %s did not reach the node",
                           self._session.namespace)
            return None
        with self._lock:
            self._stats.clears += 1
            self._stats.cleared_entries += int(dropped)
        logger.info("kvpool: cleared namespace %s (%d objects dropped)",
                    self._session.namespace, int(dropped))
        return None

    def close(self):
        """Disconnects; later calls miss. Idempotent."""
        self._session.close()
