"""kvpool as an LMCache remote storage backend.

Enable it with LMCache's remote storage plugins (config YAML):

    remote_storage_plugins: ["kvpool"]
    extra_config:
      remote_storage_plugin.kvpool.module_path: kvpool.integrations.lmcache
      remote_storage_plugin.kvpool.class_name: KvpoolConnectorAdapter
      remote_storage_plugin.kvpool.socket: /run/kvpool/kvpool.sock    # optional

or, with older LMCache, the same plugin entries plus `remote_url: kvpool://`.
`KvpoolConnectorAdapter` accepts `kvpool://...` and `plugin://kvpool[.name]`
URLs; `class_name: KvpoolRemoteConnector` also works (LMCache then builds
the connector itself, without the engine metadata: the connector takes the
metadata of the CPU backend it is given when that has one (the worker
role); without it (the scheduler role) stored headers are only checked for
self-consistency). Settings, URL query over plugin
settings over defaults, the connectors' shared names
(kvpool.integrations._session) plus `io_threads`: `socket` (else env
KVPOOL_SOCKET, else the library's default), `remote` (peer list: remote
mode), `namespace` (default `lmcache`), `timeout_ms` (5000), `io_threads`
(4), `retry_interval_ms` (1000; alias `retry_interval_s`, in seconds).
`kvpool://host:port[,host:port]` selects remote mode, `kvpool:///path/to.sock`
a socket.

Each chunk is stored under `key.to_string()` as a small header (shape,
dtype, format) plus the raw bytes (see `_lmcache_format`). Every native call
runs on the connector's own thread pool, never on LMCache's event loop. A
node that is down, goes away or times out makes gets and lookups misses and
puts no-ops, as in every connector (the Session: while no node was reached,
a connect is tried every `retry_interval_ms`); no exception reaches LMCache.
A header whose layout does not match the engine's (`metadata.kv_shape`,
`kv_dtype`, MLA or not) is a miss. Thread-safe.

Both LMCache remote connector contracts (ENGINES.md §3.2 and §6.2) are
served, chosen by the `RemoteConnector` base class this module is loaded
under, never by the arguments of a call:
- 2025: no base constructor; `batched_contains(keys,
  stop_after_first_not_exits=True) -> List[bool]`.
- 2026: the base constructor `__init__(config, metadata)` (run when there is
  metadata; it sets `save_chunk_meta`, `meta_shapes`, ...; kvpool writes its
  own small header whatever `save_chunk_meta` says);
  `batched_contains(keys) -> int`, the count of leading hits.
`batched_async_contains` (a count) and `batched_get_non_blocking` (the
leading hits) are the same under both.

Block descriptors (docs/kv-events.md; docs/connectors.md "Block
descriptors"; setting `block_descriptors`, default true). Every entry of a
chunk put (its payload parts and its header) carries the chunk's
descriptor, so the node's events about it name the chunk as LMCache does:
the hash is `key.chunk_hash` (an int as is, or its low 64 bits if wider; a
hex string of an older LMCache as its bytes), block_size the tokens the
chunk holds (its shape's token axis: `chunk_size` for every chunk but a
short last one), token_ids empty and the parent None: the RemoteConnector
interface hands a chunk's key and its KV bytes, never its tokens, and
nothing in it says which chunk came before (ENGINES.md 3.2, 3.3, 6.2: a
batched_put's keys are not promised to be one prefix chain in order).

`list()` is unsupported (a node cannot list one namespace's keys) and
raises NotImplementedError, the base class's way. `clear()`/`clear_sync()`
drop every entry of the connector's namespace on the node (every LMCache
instance sharing that namespace loses its chunks; other namespaces keep
theirs).
"""

import asyncio
import concurrent.futures
import inspect
import logging
import threading
from dataclasses import dataclass
from typing import List, Optional, Sequence
from urllib.parse import parse_qs, unquote, urlparse

import torch
from lmcache.v1.memory_management import MemoryFormat, MemoryObj
from lmcache.v1.storage_backend.connector import ConnectorAdapter
from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector

import kvpool
from kvpool.integrations import _lmcache_format as fmt
from kvpool.integrations._descriptors import Describer, int_hash
from kvpool.integrations._dtypes import dtype_name, element_size
from kvpool.integrations._hints import Action, Applier
from kvpool.integrations._session import Session, SessionSettings

logger = logging.getLogger(__name__)

SCHEME = "kvpool://"
PLUGIN_TYPE = "kvpool"


@dataclass
class KvpoolSettings(SessionSettings):
    """The shared settings, LMCache's defaults, and io_threads."""

    namespace: Optional[str] = "lmcache"
    # Calls run on the connector's threads, not LMCache's event loop, and a
    # batched call moves many chunks: a longer deadline than the others'.
    timeout_ms: int = 5000
    # The connector's own threads for kvpool calls.
    io_threads: int = 4

    PARSERS = {**SessionSettings.PARSERS, "io_threads": int}


def base_contains_answers_count(base) -> Optional[bool]:
    """How `base.batched_contains` answers (ENGINES.md §6.2): False when it
    takes `stop_after_first_not_exits` and answers one bool per key (LMCache
    2025), True when it answers the count of leading hits (2026), None when
    the base has no batched_contains (older LMCache: nobody calls it)."""
    fn = getattr(base, "batched_contains", None)
    if fn is None:
        return None
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # no signature to read: the newer shape
        return True
    return "stop_after_first_not_exits" not in params


def plugin_name_of(url: Optional[str]) -> Optional[str]:
    """`plugin://kvpool.primary` -> `kvpool.primary`; None for other URLs."""
    if url and url.startswith("plugin://"):
        return url[len("plugin://"):].split("/", 1)[0] or None
    return None


def _plugin_settings(config, name: str) -> dict:
    extra = getattr(config, "extra_config", None) or {}
    prefix = "remote_storage_plugin.%s." % name
    out = {k[len(prefix):]: v for k, v in extra.items() if k.startswith(prefix)}
    nested = extra.get("remote_storage_plugin")  # the same settings as nested mappings
    nested = nested.get(name) if isinstance(nested, dict) else None
    if isinstance(nested, dict):
        out = {**nested, **out}
    return out


def _url_settings(url: Optional[str]) -> dict:
    if not url or not url.startswith(SCHEME):
        return {}
    parsed = urlparse(url)
    out = {k: v[-1] for k, v in parse_qs(parsed.query).items()}
    if parsed.netloc:
        out.setdefault("remote", unquote(parsed.netloc))
    if parsed.path not in ("", "/"):
        out.setdefault("socket", unquote(parsed.path))
    return out


def resolve_settings(url: Optional[str], plugin_name: Optional[str], config) -> KvpoolSettings:
    """Defaults, then the plugin's extra_config entries, then the URL query."""
    name = plugin_name or plugin_name_of(url)
    if name is None:  # built by LMCache from the class alone: the first kvpool plugin
        name = next((n for n in (getattr(config, "remote_storage_plugins", None) or [])
                     if n.split(".", 1)[0] == PLUGIN_TYPE), PLUGIN_TYPE)
    settings = KvpoolSettings()
    settings.update(_plugin_settings(config, name))
    settings.update(_url_settings(url))
    return settings


class KvpoolConnectorAdapter(ConnectorAdapter):
    """Accepts `kvpool://...` and `plugin://kvpool[.name]`."""

    def __init__(self):
        super().__init__(SCHEME)

    def can_parse(self, url: str) -> bool:
        name = plugin_name_of(url)
        if name is not None:
            return name.split(".", 1)[0] == PLUGIN_TYPE
        return url.startswith(SCHEME)

    def create_connector(self, context) -> RemoteConnector:
        return KvpoolRemoteConnector(loop=context.loop,
                                     local_cpu_backend=context.local_cpu_backend,
                                     config=context.config,
                                     metadata=getattr(context, "metadata", None),
                                     url=context.url,
                                     plugin_name=getattr(context, "plugin_name", None))


# Where each chunk format keeps its tokens (ENGINES.md 3.3).
_TOKEN_AXIS = {"KV_2LTD": 2, "KV_MLA_FMT": 2, "KV_T2D": 0, "KV_2TD": 1}


def chunk_event_hash(chunk_hash):
    """A CacheEngineKey's chunk_hash as a descriptor's hash (None: none)."""
    if isinstance(chunk_hash, bool) or chunk_hash is None:
        return None
    if isinstance(chunk_hash, int):
        return int_hash(chunk_hash)
    if isinstance(chunk_hash, (bytes, bytearray)):
        raw = bytes(chunk_hash)
    elif isinstance(chunk_hash, str):  # LMCache <= 0.3: a hex string
        try:
            raw = bytes.fromhex(chunk_hash)
        except ValueError:
            return None
    else:
        return None
    return raw if 1 <= len(raw) <= 32 else None


def chunk_tokens(obj: MemoryObj, default: Optional[int]) -> Optional[int]:
    """The tokens a chunk object holds, from its shape's token axis; `default`
    for a format without one (or no shape)."""
    try:
        axis = _TOKEN_AXIS.get(obj.get_memory_format().name)
        shape = tuple(obj.get_shape())
        if axis is not None and axis < len(shape) and shape[axis] > 0:
            return int(shape[axis])
    except Exception:  # noqa: BLE001 - an object without shape or format
        pass
    return default


def _object_buffer(obj: MemoryObj):
    """(address, nbytes, keepalive) of a memory object's raw bytes: its flat
    uint8 `raw_data` tensor when it has one (LMCache's TensorMemoryObj; the
    cheapest), else `byte_array`, else `tensor`."""
    raw = getattr(obj, "raw_data", None)
    if isinstance(raw, torch.Tensor) and raw.dtype == torch.uint8 and raw.device.type == "cpu" \
            and raw.is_contiguous() and raw.numel() >= obj.get_size():
        return raw.data_ptr(), obj.get_size(), raw
    try:
        view = obj.byte_array
        addr, nbytes = kvpool.buffer_address(view)
    except (TypeError, ValueError, AttributeError):
        view = obj.tensor
        addr, nbytes = kvpool.buffer_address(view)
    return addr, nbytes, view


class KvpoolRemoteConnector(RemoteConnector):
    """LMCache `RemoteConnector` over a kvpool node (or cluster).

    `metadata` None (LMCache built the connector from its class alone) takes
    `local_cpu_backend.metadata` when the backend has one."""

    # The base's batched_contains shape (see base_contains_answers_count).
    CONTAINS_ANSWERS_COUNT = base_contains_answers_count(RemoteConnector)

    def __init__(self, loop=None, local_cpu_backend=None, config=None, metadata=None, *,
                 url: Optional[str] = None, plugin_name: Optional[str] = None,
                 settings: Optional[KvpoolSettings] = None):
        if metadata is None:
            metadata = getattr(local_cpu_backend, "metadata", None)
        self._init_base(config, metadata)
        self.loop = loop
        self.local_cpu_backend = local_cpu_backend
        self.config = config
        self.metadata = metadata
        self.url = url
        self.settings = settings or resolve_settings(url, plugin_name, config)
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=max(1, self.settings.io_threads), thread_name_prefix="kvpool-lmcache")
        self._lock = threading.Lock()  # guards _counts and _closed
        self._part_limit = 0
        self._full_layout = None  # (part limit, header of a full chunk or None)
        self._closed = False
        self._counts = {"hits": 0, "misses": 0, "rejected_headers": 0, "stored": 0,
                        "store_failures": 0}
        self._session = Session(self.settings, on_open=self._opened, log=logger,
                                client_name="lmcache")
        self._describer = Describer(self.settings.block_descriptors, logger)
        self._hints = Applier(self._session, logger, self.settings.hint_default_ttl_s)
        chunk = getattr(config, "chunk_size", None)
        kv_shape = tuple(getattr(metadata, "kv_shape", ()) or ())
        if not chunk and len(kv_shape) == 5:
            chunk = kv_shape[2]
        self._chunk_size = int(chunk) if chunk else None
        self._session.client()  # connect now: the log says at once whether a node answers

    def _init_base(self, config, metadata) -> None:
        """LMCache 2026's base constructor `(config, metadata)` asserts the
        metadata and sets the chunk layout fields; LMCache 2025's base has
        none. Without metadata the base is not run and the fields say
        "headers saved, layout unknown"."""
        if RemoteConnector.__init__ is object.__init__:
            return
        if metadata is not None:
            try:
                RemoteConnector.__init__(self, config, metadata)
                return
            except Exception as e:
                logger.warning("kvpool: RemoteConnector base init failed (%s)", e)
        self.save_chunk_meta = True
        self.meta_shapes, self.meta_dtypes = [], []
        self.meta_fmt = self.full_chunk_size_bytes = self.single_token_size = None
        self.remote_metadata_bytes = None

    # ---- connection ----------------------------------------------------------
    def _opened(self, client: kvpool.Client) -> None:
        # Remote mode cannot ask a node; 64 MiB is the node's default limit.
        self._part_limit = client.max_value_size if self.settings.remote is None else 64 << 20

    @property
    def _client(self) -> Optional[kvpool.Client]:
        """The session's client, opened if due; None while no node answers."""
        return self._session.client()

    @property
    def stats(self) -> dict:
        """Totals since construction: hits, misses, rejected_headers, stored,
        store_failures, and errors (calls that failed as a whole)."""
        with self._lock:
            out = dict(self._counts)
        out["errors"] = self._session.errors
        return out

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counts[name] += n

    # ---- off the event loop --------------------------------------------------
    async def _offload(self, fn, *args, on_cancel=None):
        """Runs fn(*args) on the connector's threads. If the awaiting task is
        cancelled while fn runs, on_cancel(future) decides what to do with its
        eventual result."""
        try:
            cf = self._executor.submit(fn, *args)
        except RuntimeError:  # executor shut down: closed
            return None
        try:
            return await asyncio.wrap_future(cf)
        except asyncio.CancelledError:
            if on_cancel is not None and not cf.cancelled():
                on_cancel(cf)
            raise

    @staticmethod
    def _release_results_when_done(cf: concurrent.futures.Future) -> None:
        def release(f):
            if not f.cancelled() and f.exception() is None:
                for obj in f.result() or []:
                    if obj is not None:
                        obj.ref_count_down()
        cf.add_done_callback(release)

    @staticmethod
    def _hold_until_done(objs: Sequence[MemoryObj]):
        """LMCache drops its reference once put returns, even when cancelled; the
        copy still running must keep the objects alive."""
        def on_cancel(cf):
            for obj in objs:
                obj.ref_count_up()
            cf.add_done_callback(lambda _f: [obj.ref_count_down() for obj in objs])
        return on_cancel

    # ---- layout checks -------------------------------------------------------
    def _expected_fmt(self) -> Optional[MemoryFormat]:
        if self.metadata is None:
            return None
        return MemoryFormat.KV_MLA_FMT if getattr(self.metadata, "use_mla", False) \
            else MemoryFormat.KV_2LTD

    def _usable(self, h: fmt.Header) -> bool:
        """The header describes a chunk this engine can load: a dtype and format
        both sides know, a self-consistent size, and (with the engine's
        metadata) its dtype, layer count, head geometry, MLA or not, and at
        most chunk_size tokens."""
        dtype = getattr(torch, h.dtype_name, None)
        mfmt = MemoryFormat.__members__.get(h.fmt_name)
        if not isinstance(dtype, torch.dtype) or mfmt is None:
            return False
        numel = 1
        for d in h.shape:
            numel *= d
        if numel == 0 or numel * element_size(dtype) != h.payload_bytes:
            return False
        if h.part_bytes and h.part_bytes >= h.payload_bytes:
            return False
        md = self.metadata
        if md is None:
            return True
        if getattr(md, "kv_dtype", dtype) != dtype:
            return False
        kv_shape = tuple(getattr(md, "kv_shape", ()) or ())
        if mfmt in (MemoryFormat.KV_2LTD, MemoryFormat.KV_MLA_FMT) and len(kv_shape) == 5:
            layers, kv, tokens, heads, head_size = kv_shape
            return (mfmt == self._expected_fmt() and len(h.shape) == 4
                    and (h.shape[0], h.shape[1], h.shape[3]) == (kv, layers, heads * head_size)
                    and 1 <= h.shape[2] <= tokens)
        return True

    # ---- blocking bodies (connector threads) ---------------------------------
    def _get_many(self, keys: Sequence) -> List[Optional[MemoryObj]]:
        """Full chunks are read straight from their payload key (the key names
        the layout, so no header is needed); the others (the short last chunk,
        misses) by their header's layout."""
        n = len(keys)
        out: List[Optional[MemoryObj]] = [None] * n
        if n and self._client is not None:
            strs = [k.to_string() for k in keys]
            full = self._full_chunk_layout()
            todo = list(range(n))
            if full is not None and self._load(strs, [(i, full) for i in todo], out):
                todo = [i for i in todo if out[i] is None]
            elif full is not None:
                todo = []  # the node failed: misses
            if todo:
                metas = [fmt.meta_key(strs[i]) for i in todo]
                raws = self._session.call(lambda c: c.get(metas), [None] * len(todo), "get")
                plan = []
                for i, raw in zip(todo, raws):
                    h = fmt.decode(raw)
                    if h is None or not self._usable(h):
                        if raw is not None:
                            self._count("rejected_headers")
                    elif h != full:  # a full chunk's layout was tried above
                        plan.append((i, h))
                self._load(strs, plan, out)
        hits = sum(o is not None for o in out)
        self._count("hits", hits)
        self._count("misses", n - hits)
        return out

    def _load(self, strs: Sequence[str], plan, out: List[Optional[MemoryObj]]) -> bool:
        """For each (index, header) of plan, allocates the object and reads its
        payload into it; out[index] is the object, or stays None on any
        failure. False when the call failed as a whole."""
        part_keys, ptrs, sizes, owner, keep = [], [], [], [], []
        resolved = {}  # header -> (shape, dtype, format), resolved once per call
        for i, h in plan:
            if h not in resolved:
                resolved[h] = (torch.Size(h.shape), getattr(torch, h.dtype_name),
                               MemoryFormat[h.fmt_name])
            try:
                obj = self.local_cpu_backend.allocate(*resolved[h])
            except Exception as e:  # e.g. the scheduler role's backend cannot allocate
                logger.debug("kvpool: allocate failed: %s", e)
                obj = None
            if obj is None:
                continue
            try:
                base, nbytes, view = _object_buffer(obj)
            except (TypeError, ValueError, AttributeError) as e:
                logger.warning("kvpool: cannot address the allocated object: %s", e)
                nbytes = -1
            if nbytes != h.payload_bytes:
                obj.ref_count_down()
                continue
            out[i] = obj
            keep.append(view)
            for key, (off, size) in zip(fmt.payload_keys(strs[i], h), fmt.part_spans(h)):
                part_keys.append(key)
                ptrs.append(base + off)
                sizes.append(size)
                owner.append(i)
        statuses = self._session.call(lambda c: c.get_ptrs(part_keys, ptrs, sizes), None,
                                      "get") if part_keys else []
        ok = statuses is not None
        if not ok:
            statuses = [kvpool.StatusCode.UNAVAILABLE] * len(part_keys)
        for i, st in zip(owner, statuses):
            if st != kvpool.StatusCode.OK and out[i] is not None:
                out[i].ref_count_down()
                out[i] = None
        return ok

    def _put_many(self, keys: Sequence, objs: Sequence[MemoryObj]) -> int:
        """Headers and payload parts in one call. A header stored without its
        payload is harmless: readers and lookups check the payload parts."""
        if not keys or self._client is None:
            return 0
        put_keys, ptrs, sizes, owner, keep, headers, descs = [], [], [], [], [], [], []
        layouts = {}  # (shape, dtype, format, bytes) -> (header, its bytes, address), per call
        count = 0
        for key, obj in zip(keys, objs):
            try:
                dtype = obj.get_dtype()
                if dtype is None:
                    raise ValueError("object has no dtype (format %s)" % obj.get_memory_format())
                base, nbytes, view = _object_buffer(obj)
                if nbytes != obj.get_size() or nbytes == 0:
                    raise ValueError("object is %d bytes, its buffer %d" % (obj.get_size(), nbytes))
                what = (tuple(obj.get_shape()), dtype, obj.get_memory_format(), nbytes)
                if what not in layouts:
                    h = fmt.layout(what[0], dtype_name(dtype), what[2].name, nbytes,
                                   self._part_limit)
                    header = fmt.encode(h)
                    layouts[what] = (h, header, kvpool.buffer_address(header)[0])
                h, header, header_addr = layouts[what]
            except (TypeError, ValueError, AttributeError) as e:
                logger.warning("kvpool: cannot store %s: %s", key, e)
                self._count("store_failures")
                continue
            s = key.to_string()
            d = self._chunk_descriptor(key, obj)
            keep.append(view)
            put_keys += fmt.payload_keys(s, h)
            for off, size in fmt.part_spans(h):
                ptrs.append(base + off)
                sizes.append(size)
                owner.append(count)
                descs.append(d)
            headers.append((fmt.meta_key(s), header_addr, len(header), count, d))
            count += 1
        if not count:
            return 0
        # The headers after every payload: a batch of payloads that fills the
        # connection's staging area exactly is not cut in two for them.
        for meta_key, addr, size, j, d in headers:
            put_keys.append(meta_key)
            ptrs.append(addr)
            sizes.append(size)
            owner.append(j)
            descs.append(d)
        put = self._describer.put_ptrs
        statuses = self._session.call(lambda c: put(c, put_keys, ptrs, sizes, descs), None, "put")
        if statuses is None:
            self._count("store_failures", count)
            return 0
        complete = [True] * count
        for j, st in zip(owner, statuses):
            if st != kvpool.StatusCode.OK:
                complete[j] = False
        stored = sum(complete)
        self._count("stored", stored)
        self._count("store_failures", count - stored)
        return stored

    def _full_chunk_layout(self) -> Optional[fmt.Header]:
        """The layout of a full chunk of this engine, when the metadata tells it."""
        cached = self._full_layout
        if cached is None or cached[0] != self._part_limit:
            cached = self._full_layout = (self._part_limit, self._compute_full_layout())
        return cached[1]

    def _compute_full_layout(self) -> Optional[fmt.Header]:
        md = self.metadata
        kv_shape = tuple(getattr(md, "kv_shape", ()) or ())
        dtype = getattr(md, "kv_dtype", None)
        if len(kv_shape) != 5 or not isinstance(dtype, torch.dtype) or not self._part_limit:
            return None
        layers, kv, tokens, heads, head_size = kv_shape
        shape = (kv, layers, tokens, heads * head_size)
        nbytes = kv * layers * tokens * heads * head_size * element_size(dtype)
        return fmt.layout(shape, dtype_name(dtype), self._expected_fmt().name, nbytes,
                          self._part_limit)

    def _present(self, keys: Sequence, prefix_only: bool) -> List[bool]:
        """Per key: a usable header and every payload part are stored. One
        exists call for headers plus full-chunk payloads; headers of other
        chunks (the short last one, or a foreign layout) are read and their
        payloads checked in two more calls."""
        n = len(keys)
        if n == 0:
            return []
        return self._session.call(lambda c: self._present_on(c, keys, prefix_only), [False] * n,
                                  "exists")

    def _chunk_descriptor(self, key, obj: MemoryObj):
        """What LMCache's events would say of the chunk (see the module
        docstring), or None."""
        if not self._describer.enabled:
            return None
        h = chunk_event_hash(getattr(key, "chunk_hash", None))
        tokens = chunk_tokens(obj, self._chunk_size)
        if h is None or not tokens:
            return None
        return self._describer.make(h, tokens)

    def _present_on(self, client: kvpool.Client, keys: Sequence, prefix_only: bool) -> List[bool]:
        n = len(keys)
        out = [False] * n
        strs = [k.to_string() for k in keys]
        full = self._full_chunk_layout()
        probe = [fmt.meta_key(s) for s in strs]
        spans = []
        if full is not None:
            for s in strs:
                parts = fmt.payload_keys(s, full)
                spans.append((len(probe), len(probe) + len(parts)))
                probe.extend(parts)
        hits = client.exists(probe)
        unsure = []
        for i in range(n):
            if not hits[i]:
                if prefix_only:
                    break
                continue
            if full is not None and all(hits[spans[i][0]:spans[i][1]]):
                out[i] = True
            else:
                unsure.append(i)
        if unsure:
            check, owner = [], []
            for i, raw in zip(unsure, client.get([probe[i] for i in unsure])):
                h = fmt.decode(raw)
                if h is not None and self._usable(h):
                    parts = fmt.payload_keys(strs[i], h)
                    check.extend(parts)
                    owner.extend([i] * len(parts))
            complete = dict.fromkeys(owner, True)
            for i, hit in zip(owner, client.exists(check) if check else []):
                complete[i] = complete[i] and hit
            for i, ok in complete.items():
                out[i] = ok
        return out

    def _prefix(self, keys: Sequence) -> int:
        present = self._present(keys, prefix_only=True)
        return present.index(False) if False in present else len(present)

    def _exists_many(self, keys: Sequence) -> List[bool]:
        return self._present(keys, prefix_only=False)

    def _remove(self, key) -> bool:
        return self._session.call(lambda c: self._remove_on(c, key.to_string()), False, "remove")

    @staticmethod
    def _remove_on(client: kvpool.Client, s: str) -> bool:
        h = fmt.decode(client.get([fmt.meta_key(s)])[0])
        st = client.remove([fmt.meta_key(s)])[0]
        if h is not None:
            client.remove(fmt.payload_keys(s, h))
        return st == kvpool.StatusCode.OK

    def _ping(self) -> int:
        """0 while the node answers, else the failed call's status code."""
        def ping(client):
            client.exists(["#ping"])
            return 0

        unavailable = int(kvpool.StatusCode.UNAVAILABLE)
        return self._session.call(ping, unavailable, "ping",
                                  on_error=lambda e: int(getattr(e, "code", 0)) or unavailable)

    # ---- RemoteConnector -----------------------------------------------------
    async def exists(self, key) -> bool:
        result = await self._offload(self._exists_many, [key])
        return bool(result and result[0])

    def exists_sync(self, key) -> bool:
        return self._exists_many([key])[0]

    async def get(self, key) -> Optional[MemoryObj]:
        result = await self._offload(self._get_many, [key],
                                     on_cancel=self._release_results_when_done)
        return result[0] if result else None

    async def put(self, key, memory_obj: MemoryObj):
        """Stores the object; LMCache releases it after this returns."""
        await self._offload(self._put_many, [key], [memory_obj],
                            on_cancel=self._hold_until_done([memory_obj]))

    async def list(self) -> List[str]:
        """Unsupported: a kvpool node cannot list the keys of one namespace.
        Raises NotImplementedError, as the base class does for what a
        connector does not support."""
        raise NotImplementedError("kvpool cannot list the keys of a namespace")

    def clear_sync(self) -> int:
        """Drops every entry of the connector's namespace on the node (each
        chunk is a header plus one or more payload entries) with one call;
        every LMCache instance sharing the namespace loses its chunks, other
        namespaces keep theirs. Answers the number of entries dropped; 0 when
        no node answered or the call failed (logged and counted in
        stats["errors"]), e.g. in remote mode, where kvpool cannot clear a
        namespace."""
        return self._session.call(lambda c: int(c.clear()), 0, "clear")

    async def clear(self) -> int:
        """clear_sync on the connector's threads."""
        result = await self._offload(self.clear_sync)
        return result or 0

    async def close(self):
        await asyncio.get_running_loop().run_in_executor(None, self.close_sync)

    def close_sync(self) -> None:
        """Waits for calls in flight, then disconnects. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._executor.shutdown(wait=True)
        self._session.close()

    def support_ping(self) -> bool:
        return True

    async def ping(self) -> int:
        result = await self._offload(self._ping)
        return int(kvpool.StatusCode.UNAVAILABLE) if result is None else result

    def support_batched_get(self) -> bool:
        return True

    async def batched_get(self, keys) -> List[Optional[MemoryObj]]:
        result = await self._offload(self._get_many, list(keys),
                                     on_cancel=self._release_results_when_done)
        return result if result is not None else [None] * len(keys)

    def support_batched_put(self) -> bool:
        return True

    async def batched_put(self, keys, memory_objs):
        objs = list(memory_objs)
        await self._offload(self._put_many, list(keys), objs,
                            on_cancel=self._hold_until_done(objs))

    def support_batched_async_contains(self) -> bool:
        return True

    async def batched_async_contains(self, lookup_id: str, keys, pin: bool = False) -> int:
        keys = list(keys)
        result = await self._offload(self._prefix, keys)
        if pin and result:
            await self._offload(self._pin_found, keys[:result])
        return result or 0

    def _pin_found(self, keys: Sequence) -> None:
        """LMCache's pin of a lookup's hits (kept until the retrieval that
        follows): a retention of their objects at the highest priority for
        hint_default_ttl_s. (A kvpool pin would need the node's pin budget;
        a retention has none.) A partial last chunk's payload keys are not
        known here: its header is retained."""
        full = self._full_chunk_layout()
        names = []
        for k in keys:
            s = k.to_string()
            names.append(fmt.meta_key(s))
            if full is not None:
                names.extend(fmt.payload_keys(s, full))
        self._hints.apply(Action("retain", self.settings.hint_default_ttl_s, 255), names)

    def support_batched_get_non_blocking(self) -> bool:
        return True

    async def batched_get_non_blocking(self, lookup_id: str, keys) -> List[MemoryObj]:
        """The leading objects found; the ones after the first miss are released."""
        objs = await self.batched_get(keys)
        n = 0
        while n < len(objs) and objs[n] is not None:
            n += 1
        for obj in objs[n:]:
            if obj is not None:
                obj.ref_count_down()
        return objs[:n]

    def support_batched_contains(self) -> bool:
        """True wherever the base class has a batched_contains to answer."""
        return self.CONTAINS_ANSWERS_COUNT is not None

    def batched_contains(self, keys, *args, **kwargs):
        """Synchronous batch lookup, in the base class's shape:
        - LMCache 2026 (and a base without batched_contains): the number of
          leading keys stored (int); other arguments are ignored.
        - LMCache 2025: one bool per key; with `stop_after_first_not_exits`
          (the default, positional or keyword) every key after the first
          miss answers False."""
        keys = list(keys)
        if self.CONTAINS_ANSWERS_COUNT is not False:
            return self._prefix(keys)
        stop = kwargs.get("stop_after_first_not_exits", args[0] if args else True)
        if stop:
            n = self._prefix(keys)
            return [True] * n + [False] * (len(keys) - n)
        return self._exists_many(keys)

    def remove_sync(self, key) -> bool:
        return self._remove(key)

    def __repr__(self) -> str:
        s = self.settings
        return "<KvpoolRemoteConnector %s ns=%r>" % (s.remote or s.socket or "default-socket",
                                                    s.namespace)
