"""Loads libkvpool.so and declares the C ABI (include/kvpool/kvpool.h).

The library is looked up, in order: env KVPOOL_LIBRARY (a path), the build
tree of the source checkout this package sits in (<repo>/build/src/client),
then the system loader (libkvpool.so.0, libkvpool.so). Loaded once, on first
use; ctypes releases the GIL around every call.
"""

import ctypes
import ctypes.util
import os
import threading

c_status = ctypes.c_int32


class KeyId(ctypes.Structure):
    _fields_ = [("hi", ctypes.c_uint64), ("lo", ctypes.c_uint64)]


class Region(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("size", ctypes.c_uint64), ("handle", ctypes.c_uint64)]


class Descriptor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("size", ctypes.c_uint64)]


class HintResult(ctypes.Structure):
    _fields_ = [("applied", ctypes.c_uint64), ("unknown", ctypes.c_uint64),
                ("clipped", ctypes.c_uint64), ("moved", ctypes.c_uint64)]


class Options(ctypes.Structure):
    # Field order and types mirror struct kvpool_options; struct_size tells
    # the library which fields this binding knows.
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("socket_path", ctypes.c_char_p),
        ("timeout_ms", ctypes.c_uint32),
        ("max_connections", ctypes.c_uint32),
        ("reconnect", ctypes.c_uint32),
        ("copy_mode", ctypes.c_uint32),
        ("spin_us", ctypes.c_uint32),
        ("remote_peers", ctypes.c_char_p),
        ("remote_refresh_ms", ctypes.c_uint32),
        ("expected_server_uid", ctypes.c_int64),
        ("remote_token_file", ctypes.c_char_p),
        ("tenant_token_file", ctypes.c_char_p),
        ("client_name", ctypes.c_char_p),
        ("after_fork", ctypes.c_uint32),
    ]


_P = ctypes.POINTER
_vp = ctypes.c_void_p
_sz = ctypes.c_size_t
_u64p = _P(ctypes.c_uint64)
_stp = _P(c_status)

# name: (restype, argtypes)
_SIGNATURES = {
    "kvpool_status_name": (ctypes.c_char_p, [c_status]),
    "kvpool_version": (ctypes.c_char_p, []),
    "kvpool_last_error": (ctypes.c_char_p, []),
    "kvpool_options_init": (None, [_P(Options)]),
    "kvpool_open": (_vp, [_P(Options), _stp]),
    "kvpool_close": (None, [_vp]),
    "kvpool_key_ids": (None, [_vp, _sz, _P(_vp), _P(_sz), _sz, _P(KeyId)]),
    "kvpool_put": (c_status, [_vp, _P(KeyId), _P(_vp), _u64p, _sz, _stp]),
    "kvpool_get": (c_status, [_vp, _P(KeyId), _P(_vp), _u64p, _sz, _u64p, _stp]),
    "kvpool_exists": (c_status, [_vp, _P(KeyId), _sz, _P(ctypes.c_uint8), _P(_sz)]),
    "kvpool_remove": (c_status, [_vp, _P(KeyId), _sz, _stp]),
    "kvpool_reserve": (c_status, [_vp, _P(KeyId), _u64p, _sz, _P(Region), _stp]),
    "kvpool_commit": (c_status, [_vp, _u64p, _sz, _stp]),
    "kvpool_abort": (c_status, [_vp, _u64p, _sz]),
    "kvpool_acquire": (c_status, [_vp, _P(KeyId), _sz, _P(Region), _stp]),
    "kvpool_release": (c_status, [_vp, _u64p, _sz]),
    "kvpool_stats_json": (c_status, [_vp, ctypes.c_char_p, _sz, _P(_sz)]),
    "kvpool_flush": (c_status, [_vp]),
    "kvpool_clear_namespace": (c_status, [_vp, _vp, _sz, _u64p]),
    "kvpool_max_value_size": (ctypes.c_uint64, [_vp]),
    "kvpool_put_described": (c_status, [_vp, _P(KeyId), _P(_vp), _u64p, _P(Descriptor), _sz,
                                        _stp]),
    "kvpool_reserve_described": (c_status, [_vp, _P(KeyId), _u64p, _P(Descriptor), _sz,
                                            _P(Region), _stp]),
    "kvpool_lookup_prefix": (c_status, [_vp, _u64p, _sz, ctypes.c_uint32, ctypes.c_char_p, _sz,
                                        _P(_sz)]),
    "kvpool_hint": (c_status, [_vp, ctypes.c_int, _P(KeyId), _sz, ctypes.c_uint64, ctypes.c_uint32,
                               _P(HintResult)]),
}

_lock = threading.Lock()
_lib = None


def candidates():
    """Paths tried, in order (the last entries are loader names)."""
    out = []
    env = os.environ.get("KVPOOL_LIBRARY")
    if env:
        out.append(env)
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(os.path.dirname(here))
    if os.path.isfile(os.path.join(repo, "include", "kvpool", "kvpool.h")):
        out.append(os.path.join(repo, "build", "src", "client", "libkvpool.so"))
    found = ctypes.util.find_library("kvpool")
    out += [n for n in (found, "libkvpool.so.0", "libkvpool.so") if n]
    return out


def lib():
    """The loaded library; raises OSError naming every place tried."""
    global _lib
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        tried = []
        for path in candidates():
            if os.sep in path and not os.path.exists(path):
                tried.append(path + " (missing)")
                continue
            try:
                handle = ctypes.CDLL(path)
            except OSError as e:
                tried.append("%s (%s)" % (path, e))
                continue
            for name, (res, args) in _SIGNATURES.items():
                fn = getattr(handle, name, None)
                if fn is None:  # an older library: its callers say so when used
                    continue
                fn.restype = res
                fn.argtypes = args
            _lib = handle
            return _lib
        raise OSError("libkvpool.so not found; set KVPOOL_LIBRARY. Tried: " + "; ".join(tried))
