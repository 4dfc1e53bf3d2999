"""Pins kvpool's shared segment for CUDA copies, once per engine process.

A local kvpool client maps the node's DRAM segment (a memfd, read-only
unless the node runs with --writable-segment) and, per connection, a
writable staging area that kvpool_reserve hands out for writes. A copy
between GPU memory and such a mapping runs as DMA at full PCIe/C2C speed
only when the host range is page-locked and known to CUDA; otherwise CUDA
stages it through its own pinned buffers, several times slower. This module
registers the mappings with cudaHostRegister, looked up at run time (never a
build-time CUDA dependency), and gives the connectors a copy helper that is
asynchronous on the engine's current stream only where that is safe.

API
  register_segment(client, *, runtime=None, chunk_bytes=None,
                   include_staging=False, maps_path="/proc/self/maps")
      -> SegmentRegistration
    Registers every kvpool segment mapped in this process (found by name,
    "/memfd:kvpool-dram", in maps_path; a process normally has one client,
    hence one segment) and, with include_staging, the connections' staging
    areas mapped so far ("/memfd:kvpool-staging"; registering one makes all
    of its pages resident, 64 MiB each by default). Read-only mappings are
    registered with cudaHostRegisterReadOnly, all with Portable (every
    device). A range is registered whole; if that fails and it is larger
    than chunk_bytes (default env KVPOOL_CUDA_REGISTER_CHUNK, else 1 GiB; a
    multiple of the page size; best a multiple of the node's --slab-size, so
    that no value straddles two chunks), it is registered in chunks of
    chunk_bytes; a failed chunk unregisters the chunks before it. A bad
    chunk_bytes argument raises ValueError; a bad env value falls back.
    Idempotent per (process, range): a range registered already is shared,
    counted, and unregistered when its last registration closes; a range
    whose registration failed is not tried again. Never raises for a
    missing GPU or a failed registration: the result says why
    (.registered False, .reason), the process-wide stats() count it, and
    the first such outcome of the process is logged as ONE warning line
    (later ones at debug). Env KVPOOL_CUDA_REGISTER=0 turns it off.
  SegmentRegistration: .registered (bool), .reason ("" when registered),
    .bytes (bytes of the ranges it holds), .ranges ((address, nbytes) of
    each), .covers(address, nbytes) (True when the range lies inside one
    registered chunk: a DMA-able region), .close() (idempotent; also a
    context manager). Close it before closing the client.
  stats() -> dict: registered_bytes, registered_ranges, chunks (held
    cudaHostRegister registrations), failures (register_segment calls that
    fell back, any reason), reason (why the latest call fell back; "" when
    it registered). Process-wide; for the connectors' metrics.
  copy_into(dst, src, registered) -> event or None: dst.copy_(src). When
    `registered` (the host side is pinned: reg.covers(...) of a kvpool
    region, or a pinned tensor) and one side is on a GPU, the copy is
    non_blocking on the current stream and a CUDA event recorded after it
    is returned: wait(event) before releasing (kvpool_release) or
    committing (kvpool_commit) the host region. Otherwise a blocking copy,
    and None.
  wait(done): waits for an event from copy_into (None: nothing to wait for).
  host_view(address, nbytes) -> torch.uint8 tensor over host memory, no
    copy (e.g. an acquired or reserved kvpool region). Do not write to a
    view of the read-only segment.

The CUDA runtime is torch's binding (torch.cuda.cudart()), else libcudart
loaded with ctypes. Tests inject `runtime`: any object with
host_register(address, nbytes, flags) -> int, host_unregister(address) ->
int (0: success, else a cudaError code) and error_string(code) -> str.

When the library reconnects to a restarted node the segment is mapped anew
at another address: covers() is then False for its regions (copies stay
correct, blocking) until register_segment is called again. The old range
stays registered until its registrations close.
"""

import bisect
import ctypes
import logging
import mmap
import os
import threading
from dataclasses import dataclass
from typing import List, Optional, Tuple

logger = logging.getLogger("kvpool.integrations")

HOST_REGISTER_PORTABLE = 0x01  # cudaHostRegisterPortable
HOST_REGISTER_READ_ONLY = 0x08  # cudaHostRegisterReadOnly
ERROR_ALREADY_REGISTERED = 712  # cudaErrorHostMemoryAlreadyRegistered
DEFAULT_CHUNK_BYTES = 1 << 30
SEGMENT_NAME = "/memfd:kvpool-dram"
STAGING_NAME = "/memfd:kvpool-staging"
_CUDART_NAMES = ("libcudart.so", "libcudart.so.12", "libcudart.so.11.0")


# ---- runtimes -------------------------------------------------------------------------
class TorchRuntime:
    """cudaHostRegister/Unregister through torch.cuda.cudart()."""

    name = "torch.cuda.cudart"

    def __init__(self, cudart):
        self._rt = cudart

    def host_register(self, address, nbytes, flags):
        return int(self._rt.cudaHostRegister(address, nbytes, flags))

    def host_unregister(self, address):
        return int(self._rt.cudaHostUnregister(address))

    def error_string(self, code):
        fn = getattr(self._rt, "cudaGetErrorString", None)
        try:
            return str(fn(code)) if fn is not None else "cudaError %d" % code
        except Exception:
            return "cudaError %d" % code


class CtypesRuntime:
    """The same calls on libcudart loaded with ctypes."""

    name = "libcudart"

    def __init__(self, lib):
        self._lib = lib
        lib.cudaHostRegister.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
        lib.cudaHostRegister.restype = ctypes.c_int
        lib.cudaHostUnregister.argtypes = [ctypes.c_void_p]
        lib.cudaHostUnregister.restype = ctypes.c_int
        lib.cudaGetErrorString.argtypes = [ctypes.c_int]
        lib.cudaGetErrorString.restype = ctypes.c_char_p
        lib.cudaGetDeviceCount.argtypes = [ctypes.POINTER(ctypes.c_int)]
        lib.cudaGetDeviceCount.restype = ctypes.c_int

    @classmethod
    def load(cls, names=_CUDART_NAMES):
        """(runtime, "") or (None, why) when no library loads or no device is seen."""
        for name in names:
            try:
                lib = ctypes.CDLL(name)
            except OSError:
                continue
            rt = cls(lib)
            count = ctypes.c_int(0)
            rc = lib.cudaGetDeviceCount(ctypes.byref(count))
            if rc != 0 or count.value < 1:
                return None, "no CUDA device: cudaGetDeviceCount: %s" % (
                    rt.error_string(rc) if rc else "0 devices")
            return rt, ""
        return None, "no CUDA runtime: cannot load %s" % " or ".join(names)

    def host_register(self, address, nbytes, flags):
        return self._lib.cudaHostRegister(address, nbytes, flags)

    def host_unregister(self, address):
        return self._lib.cudaHostUnregister(address)

    def error_string(self, code):
        s = self._lib.cudaGetErrorString(code)
        return s.decode("utf-8", "replace") if s else "cudaError %d" % code


def default_runtime():
    """(runtime, "") for this process, or (None, why not)."""
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        if not torch.cuda.is_available():
            return None, "no CUDA device: torch.cuda.is_available() is False"
        cudart = torch.cuda.cudart()
        if hasattr(cudart, "cudaHostRegister") and hasattr(cudart, "cudaHostUnregister"):
            torch.cuda.init()
            return TorchRuntime(cudart), ""
    return CtypesRuntime.load()


# ---- mappings -------------------------------------------------------------------------
@dataclass(frozen=True)
class Mapping:
    """One kvpool mapping of this process: [start, start + nbytes)."""

    start: int
    nbytes: int
    writable: bool
    kind: str  # "segment" or "staging"
    inode: int = 0  # of the memfd: a node's new segment is a new inode


def kvpool_mappings(include_staging=False, maps_path="/proc/self/maps") -> List[Mapping]:
    """kvpool's segment mappings (and staging areas) listed in maps_path, in address order."""
    out = []
    with open(maps_path) as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) < 6:
                continue
            path = parts[5].rstrip("\n")
            if path.startswith(SEGMENT_NAME):
                kind = "segment"
            elif include_staging and path.startswith(STAGING_NAME):
                kind = "staging"
            else:
                continue
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            inode = int(parts[4]) if parts[4].isdigit() else 0
            out.append(Mapping(lo, hi - lo, parts[1][1:2] == "w", kind, inode))
    return out


# ---- process-wide registry ----------------------------------------------------------------
class _Range:
    __slots__ = ("chunks", "owned", "refs")

    def __init__(self, chunks, owned):
        self.chunks = chunks  # [(address, nbytes)]
        self.owned = owned  # False: registered by someone else, not unregistered here
        self.refs = 0


_lock = threading.Lock()
_ranges = {}  # (start, nbytes) -> _Range; protected by _lock
_failed = {}  # (start, nbytes) -> reason; protected by _lock
_runtimes = {}  # (start, nbytes) -> runtime that registered it; protected by _lock
_stats = {"registered_bytes": 0, "registered_ranges": 0, "chunks": 0, "failures": 0,
          "reason": ""}  # protected by _lock
_logged = set()  # outcomes logged at warning/info ("fallback", "registered"); _lock


def stats() -> dict:
    """Process-wide registration counters (a copy)."""
    with _lock:
        return dict(_stats)


def reset() -> None:
    """Forgets every registration, failure and logged outcome without calling
    CUDA (for tests that inject fake runtimes)."""
    with _lock:
        _ranges.clear()
        _failed.clear()
        _runtimes.clear()
        _logged.clear()
        _stats.update(registered_bytes=0, registered_ranges=0, chunks=0, failures=0, reason="")


def _chunk_bytes(chunk_bytes):
    if chunk_bytes is None:
        env = os.environ.get("KVPOOL_CUDA_REGISTER_CHUNK")
        chunk_bytes = int(env) if env else DEFAULT_CHUNK_BYTES
    chunk_bytes = int(chunk_bytes)
    if chunk_bytes <= 0 or chunk_bytes % mmap.PAGESIZE:
        raise ValueError("kvpool: chunk_bytes must be a positive multiple of %d, not %d"
                         % (mmap.PAGESIZE, chunk_bytes))
    return chunk_bytes


def _call(fn, *args):
    """(code, exception text): a runtime call that raised counts as a failure."""
    try:
        return fn(*args), ""
    except Exception as e:
        return -1, "%s: %s" % (type(e).__name__, e)


def _failure(runtime, code, text, address, nbytes):
    what = text or "%s (error %d)" % (runtime.error_string(code), code)
    return "cudaHostRegister failed: %s for %d bytes at 0x%x" % (what, nbytes, address)


def _register_range(runtime, m, chunk_bytes) -> Tuple[Optional[_Range], str]:
    flags = HOST_REGISTER_PORTABLE | (0 if m.writable else HOST_REGISTER_READ_ONLY)
    code, text = _call(runtime.host_register, m.start, m.nbytes, flags)
    if code == 0:
        return _Range([(m.start, m.nbytes)], True), ""
    if code == ERROR_ALREADY_REGISTERED:
        return _Range([(m.start, m.nbytes)], False), ""
    reason = _failure(runtime, code, text, m.start, m.nbytes)
    if m.nbytes <= chunk_bytes:
        return None, reason
    chunks = []
    for off in range(0, m.nbytes, chunk_bytes):
        addr, n = m.start + off, min(chunk_bytes, m.nbytes - off)
        code, text = _call(runtime.host_register, addr, n, flags)
        if code != 0:
            for a, _ in chunks:
                _call(runtime.host_unregister, a)
            return None, _failure(runtime, code, text, addr, n)
        chunks.append((addr, n))
    return _Range(chunks, True), ""


def _release(keys):
    """Drops one reference to each range; unregisters those left unused. REQUIRES: _lock."""
    for key in keys:
        r = _ranges[key]
        r.refs -= 1
        if r.refs:
            continue
        del _ranges[key]
        runtime = _runtimes.pop(key)
        if r.owned:
            for addr, _ in r.chunks:
                code, text = _call(runtime.host_unregister, addr)
                if code != 0:
                    logger.debug("kvpool: cudaHostUnregister(0x%x) failed: %s", addr,
                                 text or runtime.error_string(code))
        _stats["registered_bytes"] -= key[1]
        _stats["registered_ranges"] -= 1
        _stats["chunks"] -= len(r.chunks)


def _client_reason(client):
    if client is None:
        return ""
    if getattr(client, "closed", False):
        return "the client is closed"
    if getattr(client, "_remote", None):
        return "remote mode: the client maps no segment"
    if getattr(client, "_copy_mode", False):
        return "copy mode: the client maps no segment"
    return ""


class SegmentRegistration:
    """The outcome of register_segment (see the module docstring)."""

    def __init__(self, keys=(), chunks=(), reason=""):
        self._keys = list(keys)
        self._chunks = sorted(chunks)
        self._starts = [a for a, _ in self._chunks]
        self.reason = reason
        self.registered = bool(self._keys)
        self.ranges = tuple((a, n) for a, n, _ in self._keys)
        self.bytes = sum(n for _, n, _ in self._keys)

    def covers(self, address, nbytes) -> bool:
        """Whether [address, address + nbytes) lies inside one registered chunk."""
        i = bisect.bisect_right(self._starts, address) - 1
        if i < 0 or not self._keys:
            return False
        a, n = self._chunks[i]
        return address + nbytes <= a + n

    def current(self, maps_path="/proc/self/maps") -> bool:
        """Whether every registered range is still the mapping it was (a client
        whose node restarted maps the new segment, maybe at the same address:
        the old registration then names pages that are not the segment)."""
        if not self._keys:
            return True
        try:
            now = {(m.start, m.nbytes, m.inode) for m in kvpool_mappings(True, maps_path)}
        except OSError:
            return False
        return all(k in now for k in self._keys)

    def close(self) -> None:
        """Unregisters the ranges this registration alone still holds. Idempotent."""
        with _lock:
            keys, self._keys = self._keys, []
            if keys:
                _release(keys)
        self._chunks, self._starts = [], []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        if self.registered:
            return "SegmentRegistration(registered, %d bytes in %d ranges)" % (
                self.bytes, len(self.ranges))
        return "SegmentRegistration(not registered: %s)" % self.reason


def _outcome(reg):
    """Counts and logs (once per process and kind) a register_segment result."""
    with _lock:
        if not reg.registered:
            _stats["failures"] += 1
        _stats["reason"] = reg.reason
        kind = "registered" if reg.registered else "fallback"
        first = kind not in _logged
        _logged.add(kind)
    if reg.registered:
        (logger.info if first else logger.debug)(
            "kvpool: shared segment registered with CUDA (%d bytes in %d ranges)",
            reg.bytes, len(reg.ranges))
    else:
        (logger.warning if first else logger.debug)(
            "kvpool: shared segment not registered with CUDA (%s); copies between it and "
            "a GPU are staged, not DMA", reg.reason)
    return reg


def register_segment(client, *, runtime=None, chunk_bytes=None, include_staging=False,
                     maps_path="/proc/self/maps") -> SegmentRegistration:
    """Registers the kvpool mappings of this process with CUDA (see the module
    docstring). Never raises for a missing GPU or a failed registration;
    raises ValueError for a bad chunk_bytes argument (a bad
    KVPOOL_CUDA_REGISTER_CHUNK is a fallback, so that an engine still runs)."""
    if chunk_bytes is None and os.environ.get("KVPOOL_CUDA_REGISTER_CHUNK"):
        try:
            chunk_bytes = _chunk_bytes(None)
        except ValueError:
            return _outcome(SegmentRegistration(reason="bad KVPOOL_CUDA_REGISTER_CHUNK=%s"
                                                % os.environ["KVPOOL_CUDA_REGISTER_CHUNK"]))
    chunk_bytes = _chunk_bytes(chunk_bytes)
    if os.environ.get("KVPOOL_CUDA_REGISTER", "").strip().lower() in ("0", "false", "no", "off"):
        return _outcome(SegmentRegistration(reason="disabled by KVPOOL_CUDA_REGISTER=%s"
                                            % os.environ["KVPOOL_CUDA_REGISTER"]))
    reason = _client_reason(client)
    if reason:
        return _outcome(SegmentRegistration(reason=reason))
    if runtime is None:
        runtime, reason = default_runtime()
        if runtime is None:
            return _outcome(SegmentRegistration(reason=reason))
    try:
        maps = kvpool_mappings(include_staging, maps_path)
    except OSError as e:
        return _outcome(SegmentRegistration(reason="cannot read %s: %s" % (maps_path, e)))
    if not any(m.kind == "segment" for m in maps):
        return _outcome(SegmentRegistration(reason="no kvpool segment is mapped in this process"))
    held, chunks = [], []
    with _lock:
        for m in maps:
            key = (m.start, m.nbytes, m.inode)
            r = _ranges.get(key)
            if r is None:
                reason = _failed.get(key, "")
                if not reason:
                    r, reason = _register_range(runtime, m, chunk_bytes)
                if r is None:
                    _failed[key] = reason
                    _release(held)
                    break
                _ranges[key] = r
                _runtimes[key] = runtime
                _stats["registered_bytes"] += m.nbytes
                _stats["registered_ranges"] += 1
                _stats["chunks"] += len(r.chunks)
            r.refs += 1
            held.append(key)
            chunks += r.chunks
        else:
            reason = ""
    if reason:
        return _outcome(SegmentRegistration(reason=reason))
    return _outcome(SegmentRegistration(held, chunks))


# ---- copies ---------------------------------------------------------------------------------
def _record_event():
    """A CUDA event recorded on the current stream."""
    import torch

    event = torch.cuda.Event()
    event.record()
    return event


def copy_into(dst, src, registered):
    """dst.copy_(src): non_blocking on the current stream, returning an event to
    wait on, when `registered` and a GPU is involved; else blocking, None."""
    on_gpu = dst.device.type != "cpu" or src.device.type != "cpu"
    if registered and on_gpu:
        dst.copy_(src, non_blocking=True)
        return _record_event()
    dst.copy_(src)
    return None


def wait(done) -> None:
    """Blocks until the copy behind `done` (copy_into's result) finished."""
    if done is not None:
        done.synchronize()


def host_view(address, nbytes):
    """A torch.uint8 tensor over nbytes of host memory at address (no copy)."""
    import torch

    if nbytes == 0:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer((ctypes.c_char * nbytes).from_address(address), dtype=torch.uint8)
