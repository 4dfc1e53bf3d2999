"""kvpool.Client: batch put/get/exists over libkvpool's C ABI.

Thread-safe: one Client may be shared by many threads (the C client keeps a
pool of connections to the node, and ctypes releases the GIL during each
native call). Every batch call takes a list of keys and returns one entry
per key; a per-key miss or failure is a status in the result, never an
exception. A call-level failure (the node is gone, the deadline passed, the
client is closed) raises KvpoolError.
"""

import contextlib
import ctypes
import enum
import json
import os
import threading
import weakref

from . import _native
from . import descriptor as _descriptor
from ._native import KeyId, Region

_vp = ctypes.c_void_p


class StatusCode(enum.IntEnum):
    """The C ABI's status codes (kvpool.h), by the same names."""

    OK = 0
    NOT_FOUND = 1
    ALREADY_EXISTS = 2
    INVALID_ARGUMENT = 3
    UNAVAILABLE = 4
    RESOURCE_EXHAUSTED = 5
    FAILED_PRECONDITION = 6
    ABORTED = 7
    DEADLINE_EXCEEDED = 8
    CORRUPTION = 9
    IO_ERROR = 10
    INTERNAL = 11
    PERMISSION_DENIED = 12


# Codes a batch call can return for individual items; any other code returned
# for the whole call with every item carrying it is the call's own failure.
_ITEM_CODES = frozenset(
    (StatusCode.NOT_FOUND, StatusCode.ALREADY_EXISTS, StatusCode.INVALID_ARGUMENT,
     StatusCode.RESOURCE_EXHAUSTED))


_CODES = tuple(StatusCode)  # index = code value, for fast conversion of batch results
_OK = StatusCode.OK


def _code(value):
    """StatusCode of a C status; an unknown value is INTERNAL."""
    return _CODES[value] if 0 <= value < len(_CODES) else StatusCode.INTERNAL


class KvpoolError(Exception):
    """A call-level failure. `code` is a StatusCode, `message` the library's text."""

    def __init__(self, code, message=""):
        self.code = _code(code)
        self.message = message
        super().__init__("%s: %s" % (self.code.name, message) if message else self.code.name)


def _last_error():
    msg = _native.lib().kvpool_last_error()
    return msg.decode("utf-8", "replace") if msg else ""


def version():
    """libkvpool's version string, e.g. "0.1.0"."""
    return _native.lib().kvpool_version().decode()


def buffer_address(obj):
    """(address, nbytes) of a contiguous buffer: a torch tensor, a numpy array,
    bytes, bytearray or memoryview. The address stays valid while `obj` lives
    (and, for a bytearray, is not resized). Raises TypeError/ValueError for
    other objects or non-contiguous ones."""
    if isinstance(obj, bytes):
        if not obj:
            return 0, 0
        return ctypes.cast(ctypes.c_char_p(obj), _vp).value, len(obj)
    if isinstance(obj, bytearray):
        if not obj:
            return 0, 0
        return ctypes.addressof((ctypes.c_char * len(obj)).from_buffer(obj)), len(obj)
    if hasattr(obj, "data_ptr") and hasattr(obj, "element_size"):  # torch.Tensor
        if not obj.is_contiguous():
            raise ValueError("tensor is not contiguous")
        if getattr(obj, "device", None) is not None and obj.device.type != "cpu":
            raise ValueError("tensor is not in host memory: %s" % obj.device)
        return obj.data_ptr(), obj.numel() * obj.element_size()
    if hasattr(obj, "__array_interface__") and hasattr(obj, "ctypes"):  # numpy.ndarray
        if not obj.flags["C_CONTIGUOUS"]:
            raise ValueError("array is not C-contiguous")
        return obj.ctypes.data, obj.nbytes
    if isinstance(obj, memoryview):
        if not obj.contiguous:
            raise ValueError("memoryview is not contiguous")
        if obj.nbytes == 0:
            return 0, 0
        if not obj.readonly:
            return ctypes.addressof((ctypes.c_char * obj.nbytes).from_buffer(obj)), obj.nbytes
        import numpy  # read-only buffers: numpy exposes their address without copying

        return numpy.frombuffer(obj, dtype=numpy.uint8).ctypes.data, obj.nbytes
    raise TypeError("not a buffer kvpool can address: %r" % type(obj).__name__)


class KeyIds:
    """Keys hashed once (kvpool_key_ids) for reuse across calls of one Client.
    Accepted by every batch call in place of a key list."""

    __slots__ = ("ids", "n", "namespace")

    def __init__(self, ids, n, namespace):
        self.ids = ids
        self.n = n
        self.namespace = namespace

    def __len__(self):
        return self.n


def _as_bytes(key):
    if isinstance(key, str):
        return key.encode("utf-8")
    return bytes(key)


# Clients of this process, reset in a forked child (their locks and in-flight
# counts are the parent's); the library itself gives the child connections
# of its own (kvpool.h, "Fork").
_clients = weakref.WeakSet()


def _descriptor_list(keys, descriptors):
    """Each key's descriptor bytes (b"": none), or None when there are none."""
    if descriptors is None:
        return None
    if isinstance(keys, KeyIds):
        if hasattr(descriptors, "keys"):
            raise ValueError("descriptors by key need the keys, not KeyIds")
    if hasattr(descriptors, "keys"):  # a mapping key -> descriptor
        position = {}
        for i, k in enumerate(keys):
            position.setdefault(_as_bytes(k), i)
        out = [b""] * len(keys)
        for k, d in descriptors.items():
            at = position.get(_as_bytes(k))
            if at is None:
                raise ValueError("a descriptor for key %r, which is not in the put" % (k,))
            out[at] = _descriptor.as_bytes(d)
    else:
        out = [_descriptor.as_bytes(d) for d in descriptors]
        if len(out) != len(keys):
            raise ValueError("%d keys but %d descriptors" % (len(keys), len(out)))
    return out if any(out) else None


def _track_for_fork(client):
    _clients.add(client)


def _reset_clients_in_child():
    for c in list(_clients):
        c._after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_clients_in_child)


class Client:
    """A connection to the local kvpool-node (or, with `remote`, to a cluster).

    socket: the node's Unix socket; default env KVPOOL_SOCKET, else the C
      ABI's default, the node's own: /run/kvpool/kvpool.sock, else
      $XDG_RUNTIME_DIR/kvpool/kvpool.sock, else /tmp/kvpool-<uid>/kvpool.sock.
    namespace: prefix of every key's identity (str or bytes); clients with
      different namespaces never see each other's keys.
    timeout_ms: deadline of each call.
    remote: "host:port[,host:port]" peer addresses selects remote mode.
    remote_token_file: remote mode, a client token file ("NAME HEX64", mode
      0600) for clusters that authenticate their peers.
    tenant_token_file: local mode, a tenant token file ("NAME HEX64", mode
      0600): the node serves this client as the token's tenant.
    client_name: local mode, the name the node shows for this client
      (`kvpoolctl clients`); default the program's name.
    after_fork: what the client does in a child of os.fork() (multiprocessing
      with the fork start method, worker pools): "reconnect" (default) opens
      the child's own connections at its first call, so parent and child
      never share one; "fail" makes every call in the child raise
      KvpoolError (FAILED_PRECONDITION).
    Raises KvpoolError when the node cannot be reached.
    """

    def __init__(self, socket=None, *, namespace="", timeout_ms=5000, remote=None,
                 max_connections=None, copy_mode=False, remote_token_file=None,
                 tenant_token_file=None, client_name=None, after_fork="reconnect"):
        if after_fork not in ("reconnect", "fail"):
            raise ValueError('after_fork must be "reconnect" or "fail"')
        self._lib = _native.lib()
        self._ns = _as_bytes(namespace)
        self._remote = remote
        self._copy_mode = bool(copy_mode)
        self._cv = threading.Condition(threading.Lock())
        self._inflight = 0
        self._handle = None
        if socket is None:
            socket = os.environ.get("KVPOOL_SOCKET") or None
        self.socket = socket
        opts = _native.Options()
        self._lib.kvpool_options_init(ctypes.byref(opts))
        self._socket_b = socket.encode() if socket else None
        self._remote_b = remote.encode() if remote else None
        self._token_b = os.fsencode(remote_token_file) if remote_token_file else None
        self._tenant_token_b = os.fsencode(tenant_token_file) if tenant_token_file else None
        self._client_name_b = client_name.encode() if client_name else None
        opts.socket_path = self._socket_b
        opts.timeout_ms = int(timeout_ms)
        opts.copy_mode = 1 if copy_mode else 0
        if max_connections is not None:
            opts.max_connections = int(max_connections)
        opts.remote_peers = self._remote_b
        opts.remote_token_file = self._token_b
        opts.tenant_token_file = self._tenant_token_b
        opts.client_name = self._client_name_b
        opts.after_fork = 1 if after_fork == "fail" else 0
        status = _native.c_status(0)
        handle = self._lib.kvpool_open(ctypes.byref(opts), ctypes.byref(status))
        if not handle:
            raise KvpoolError(status.value or StatusCode.UNAVAILABLE, _last_error())
        self._handle = handle
        _track_for_fork(self)

    def _after_fork_in_child(self):
        # Only this thread exists in the child: calls other threads had in
        # progress at the fork never return here, and their lock may be held.
        self._cv = threading.Condition(threading.Lock())
        self._inflight = 0

    # ---- lifecycle -----------------------------------------------------------
    def close(self):
        """Waits for calls in progress, then disconnects. Idempotent."""
        with self._cv:
            handle, self._handle = self._handle, None
            while self._inflight:
                self._cv.wait()
        if handle:
            self._lib.kvpool_close(handle)

    @property
    def closed(self):
        return self._handle is None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def _enter(self):
        with self._cv:
            if self._handle is None:
                raise KvpoolError(StatusCode.FAILED_PRECONDITION, "client is closed")
            self._inflight += 1
            return self._handle

    def _leave(self):
        with self._cv:
            self._inflight -= 1
            if not self._inflight:
                self._cv.notify_all()

    def _native_call(self, fn, *args):
        """fn(handle, *args) while the client is held open."""
        h = self._enter()
        try:
            return fn(h, *args)
        finally:
            self._leave()

    # ---- keys ----------------------------------------------------------------
    def key_ids(self, keys):
        """Hashes keys (str or bytes) once; the result can replace the key list
        in any batch call of this client."""
        if isinstance(keys, KeyIds):
            if keys.namespace != self._ns:
                raise ValueError("KeyIds made for another namespace")
            return keys
        n = len(keys)
        bk = [k.encode("utf-8") if type(k) is str else _as_bytes(k) for k in keys]
        karr = (ctypes.c_char_p * n)(*bk)
        larr = (ctypes.c_size_t * n)(*[len(k) for k in bk])
        ids = (KeyId * n)()
        self._lib.kvpool_key_ids(self._ns, len(self._ns), ctypes.cast(karr, ctypes.POINTER(_vp)),
                                 larr, n, ids)
        return KeyIds(ids, n, self._ns)

    def _check_call(self, rc, statuses, n):
        """Raises when a batch call failed as a whole (every item carries the
        call's code, or none was filled)."""
        if rc == 0 or rc in _ITEM_CODES:
            return
        if all(s == rc or s == -1 for s in statuses[:n]):
            raise KvpoolError(rc, _last_error())

    # ---- copy calls ----------------------------------------------------------
    def put(self, keys, values, descriptors=None):
        """Stores values (bytes-like). Returns one StatusCode per key; OK also
        for a key that already existed (the first value is kept).
        descriptors (optional): block descriptors for the node's KV events
        (kvpool.descriptor.BlockDescriptor or its bytes), a sequence parallel
        to keys (None: that key has none) or a mapping key -> descriptor; a
        mapping naming a key that is not in the put raises ValueError and
        nothing is stored. An item whose descriptor the node finds malformed
        is INVALID_ARGUMENT and not stored."""
        n = len(keys)
        if len(values) != n:
            raise ValueError("%d keys but %d values" % (n, len(values)))
        if n == 0:
            return []
        ptrs, sizes = [], []
        for v in values:
            p, nb = buffer_address(v)
            ptrs.append(p)
            sizes.append(nb)
        return self.put_ptrs(keys, ptrs, sizes, descriptors)

    def get(self, keys):
        """Values as bytes, None for a key that misses (or fails)."""
        ids = self.key_ids(keys)
        n = ids.n
        if n == 0:
            return []
        if self._remote is None and not self._copy_mode:
            return self._get_pinned(ids, n)
        return self._get_copied(ids, n)

    @property
    def maps_segment(self):
        """True when values can be read in place (local mode, not copy mode)."""
        return self._remote is None and not self._copy_mode

    @contextlib.contextmanager
    def acquire(self, keys):
        """Pins the values of `keys` in the node's segment for reading in place
        (kvpool_acquire): yields one (address, size) per key, None for a miss,
        valid until the block ends, when they are released. The memory is
        read-only. Local mode only (maps_segment)."""
        ids = self.key_ids(keys)
        n = ids.n
        if n == 0:
            yield []
            return
        if not self.maps_segment:
            raise KvpoolError(StatusCode.FAILED_PRECONDITION,
                              "acquire: the client does not map the segment")
        regions = (Region * n)()
        st = (_native.c_status * n)(*([-1] * n))
        h = self._enter()
        try:
            rc = self._lib.kvpool_acquire(h, ids.ids, n, regions, st)
            if rc != 0:
                raise KvpoolError(rc, _last_error())
            handles = [regions[i].handle for i in range(n) if st[i] == 0]
            try:
                yield [(regions[i].data, regions[i].size) if st[i] == 0 else None
                       for i in range(n)]
            finally:
                if handles:
                    self._lib.kvpool_release(h, (ctypes.c_uint64 * len(handles))(*handles),
                                             len(handles))
        finally:
            self._leave()

    def _get_pinned(self, ids, n):
        with self.acquire(ids) as regions:
            return [None if r is None else ctypes.string_at(*r) for r in regions]

    def _get_copied(self, ids, n, first_capacity=1 << 20):
        out = [None] * n
        caps = [first_capacity] * n
        pending = list(range(n))
        for _ in range(2):  # a second round for values larger than the guess
            m = len(pending)
            bufs = [ctypes.create_string_buffer(caps[i]) for i in pending]
            sub = (KeyId * m)(*[ids.ids[i] for i in pending])
            ptrs = (_vp * m)(*[ctypes.addressof(b) for b in bufs])
            cap_arr = (ctypes.c_uint64 * m)(*[caps[i] for i in pending])
            sizes = (ctypes.c_uint64 * m)()
            st = (_native.c_status * m)(*([-1] * m))
            rc = self._native_call(self._lib.kvpool_get, sub, ptrs, cap_arr, m, sizes, st)
            if rc != 0:
                raise KvpoolError(rc, _last_error())
            again = []
            for j, i in enumerate(pending):
                if st[j] == 0:
                    out[i] = bufs[j].raw[: sizes[j]]
                elif st[j] == StatusCode.RESOURCE_EXHAUSTED and sizes[j] > caps[i]:
                    caps[i] = sizes[j]
                    again.append(i)
            pending = again
            if not pending:
                break
        return out

    def exists(self, keys):
        """One bool per key."""
        ids = self.key_ids(keys)
        n = ids.n
        if n == 0:
            return []
        hits = (ctypes.c_uint8 * n)()
        rc = self._native_call(self._lib.kvpool_exists, ids.ids, n, hits, None)
        if rc != 0:
            raise KvpoolError(rc, _last_error())
        return [bool(x) for x in hits]

    def hit_prefix(self, keys):
        """Number of leading keys present."""
        ids = self.key_ids(keys)
        n = ids.n
        if n == 0:
            return 0
        prefix = ctypes.c_size_t(0)
        rc = self._native_call(self._lib.kvpool_exists, ids.ids, n, None, ctypes.byref(prefix))
        if rc != 0:
            raise KvpoolError(rc, _last_error())
        return prefix.value

    def remove(self, keys):
        """Drops keys; one StatusCode (OK or NOT_FOUND) per key."""
        ids = self.key_ids(keys)
        n = ids.n
        if n == 0:
            return []
        st = (_native.c_status * n)(*([-1] * n))
        rc = self._native_call(self._lib.kvpool_remove, ids.ids, n, st)
        self._check_call(rc, st, n)
        return [_code(s) for s in st[:n]]

    # ---- caller-memory calls -------------------------------------------------
    def _ptr_batch(self, keys, ptrs, sizes):
        """(key ids, pointer array, size array, status array) of one call."""
        ids = self.key_ids(keys)
        n = ids.n
        if len(ptrs) != n or len(sizes) != n:
            raise ValueError("keys, ptrs and sizes differ in length")
        return (ids, (_vp * n)(*ptrs), (ctypes.c_uint64 * n)(*sizes),
                (_native.c_status * n)(*([-1] * n)))

    def put_ptrs(self, keys, ptrs, sizes, descriptors=None):
        """Stores sizes[i] bytes read from address ptrs[i] (ints). One
        StatusCode per key; ALREADY_EXISTS is reported as OK. descriptors:
        as put's."""
        descs = _descriptor_list(keys, descriptors)
        ids, parr, sarr, st = self._ptr_batch(keys, ptrs, sizes)
        n = ids.n
        if n == 0:
            return []
        if descs is not None:
            darr = (_native.Descriptor * n)()
            for i, b in enumerate(descs):
                if b:
                    darr[i].data = ctypes.cast(ctypes.c_char_p(b), _vp)
                    darr[i].size = len(b)
            # descs keeps the bytes alive for the call
            rc = self._native_call(self._lib.kvpool_put_described, ids.ids, parr, sarr, darr, n,
                                   st)
        else:
            rc = self._native_call(self._lib.kvpool_put, ids.ids, parr, sarr, n, st)
        self._check_call(rc, st, n)
        return [_OK if s == 2 else _code(s) for s in st[:n]]

    def get_ptrs(self, keys, ptrs, sizes):
        """Copies each value into sizes[i] bytes at address ptrs[i]. OK only
        when the stored value is exactly sizes[i] bytes; otherwise NOT_FOUND,
        RESOURCE_EXHAUSTED (stored value larger), FAILED_PRECONDITION (smaller)
        or another failure, and the destination's bytes are not to be trusted."""
        ids, parr, carr, st = self._ptr_batch(keys, ptrs, sizes)
        n = ids.n
        if n == 0:
            return []
        got = (ctypes.c_uint64 * n)()
        rc = self._native_call(self._lib.kvpool_get, ids.ids, parr, carr, n, got, st)
        if rc != 0:
            raise KvpoolError(rc, _last_error())
        out = [_code(s) for s in st[:n]]
        for i, (g, c) in enumerate(zip(got[:n], carr[:n])):
            if g != c and out[i] == _OK:
                out[i] = StatusCode.FAILED_PRECONDITION
        return out

    # ---- introspection -------------------------------------------------------
    def stats(self):
        """The node's statistics (a dict parsed from kvpool_stats_json)."""
        cap = 1 << 16
        for _ in range(3):
            buf = ctypes.create_string_buffer(cap)
            n = ctypes.c_size_t(0)
            rc = self._native_call(self._lib.kvpool_stats_json, buf, cap, ctypes.byref(n))
            if rc == StatusCode.RESOURCE_EXHAUSTED:
                cap = n.value + 1
                continue
            if rc != 0:
                raise KvpoolError(rc, _last_error())
            return json.loads(buf.value.decode())
        raise KvpoolError(StatusCode.RESOURCE_EXHAUSTED, "stats kept growing")

    def lookup_prefix(self, hashes, timeout_ms=0):
        """A router's prefix lookup: which nodes hold the longest leading run
        of the engine block hashes (ints, in request order), as a dict:
        {"blocks", "longest", "holders": [{"node", "address", "blocks",
        "dram", "ssd", "tiers"}], "homes", "homes_failed"}. timeout_ms 0:
        the node's --lookup-timeout. Raises KvpoolError (INVALID_ARGUMENT for
        too many hashes, UNAVAILABLE while the node is out of its cluster)."""
        n = len(hashes)
        arr = (ctypes.c_uint64 * max(n, 1))(*[int(h) & ((1 << 64) - 1) for h in hashes])
        cap = 4096 + 64 * n
        for _ in range(3):
            buf = ctypes.create_string_buffer(cap)
            ln = ctypes.c_size_t(0)
            rc = self._native_call(self._lib.kvpool_lookup_prefix, arr, n, int(timeout_ms), buf,
                                   cap, ctypes.byref(ln))
            if rc == 0:
                return json.loads(buf.value.decode("utf-8"))
            if rc == StatusCode.RESOURCE_EXHAUSTED and ln.value + 1 > cap:
                cap = ln.value + 1
                continue
            raise KvpoolError(rc, _last_error())
        raise KvpoolError(StatusCode.INTERNAL, "the lookup's answer kept growing")

    HINT_OPS = {"retain": 1, "pin": 2, "prefetch": 3, "demote": 4, "release": 5}

    def hint(self, op, keys, ttl_s=0.0, priority=0):
        """A cache hint on keys of this client's namespace (kvpool_hint,
        docs/hints.md): "retain" (ttl_s, priority 0..255: kept last in DRAM's
        eviction order), "pin" (ttl_s: not evicted, within the pin budget),
        "prefetch" (SSD -> DRAM, returns once there), "demote" (DRAM -> SSD)
        or "release". Returns {"applied", "unknown", "clipped", "moved"}.
        Raises KvpoolError: INVALID_ARGUMENT for a bad op, TTL, priority or
        more than 8,192 keys; RESOURCE_EXHAUSTED past the pin budget."""
        if op not in self.HINT_OPS:
            raise KvpoolError(StatusCode.INVALID_ARGUMENT,
                              "op must be one of " + ", ".join(self.HINT_OPS))
        ids = self.key_ids(keys)
        result = _native.HintResult()
        ttl_ms = int(round(float(ttl_s) * 1000))
        if ttl_ms < 0:
            raise KvpoolError(StatusCode.INVALID_ARGUMENT, "ttl_s must not be negative")
        rc = self._native_call(self._lib.kvpool_hint, self.HINT_OPS[op], ids.ids, ids.n, ttl_ms,
                               int(priority) & 0xFFFFFFFF, ctypes.byref(result))
        if rc != 0:
            raise KvpoolError(rc, _last_error())
        return {"applied": result.applied, "unknown": result.unknown,
                "clipped": result.clipped, "moved": result.moved}

    def flush(self):
        """Durability barrier for the node's SSD tier (kvpool_flush)."""
        rc = self._native_call(self._lib.kvpool_flush)
        if rc != 0:
            raise KvpoolError(rc, _last_error())

    def clear(self, namespace=None):
        """Drops every key of this client's namespace (or of `namespace`) from
        the node at once, both tiers; other namespaces are untouched. Returns
        the number of entries dropped (kvpool_clear_namespace). Local mode
        only; the node pauses its other local requests while it runs."""
        ns = self._ns if namespace is None else _as_bytes(namespace)
        dropped = ctypes.c_uint64(0)
        rc = self._native_call(self._lib.kvpool_clear_namespace, ns, len(ns),
                               ctypes.byref(dropped))
        if rc != 0:
            raise KvpoolError(rc, _last_error())
        return int(dropped.value)

    @property
    def max_value_size(self):
        """Largest value the node accepts, in bytes."""
        return int(self._native_call(self._lib.kvpool_max_value_size))

    @property
    def namespace(self):
        return self._ns
