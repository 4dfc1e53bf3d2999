"""How the LMCache connector lays a memory object out in kvpool.

Engine-free (no torch, no lmcache) so it can be tested on its own.

One chunk (one `CacheEngineKey`, key string K) is stored as:
- `K#meta`: the header below (at most 160 bytes);
- the payload, the object's raw bytes, under `K#<dtype>:<fmt>:<d0>x<d1>x...`
  (one key), or, when it is larger than the part size, in parts of exactly
  `part_bytes` (the last one shorter) under that key plus `/0`, `/1`, ...

The payload key names the shape, dtype and format, so a header can only ever
lead to bytes written for that very layout, and the reader asks for each part
by its exact size (a stored value of another size is a miss). A reader that
knows the engine's full-chunk layout reads full chunks straight from their
payload key; the header is needed for the others (the short last chunk). A
header proves nothing about its payload (parts fail or are evicted on their
own): lookups and reads check the parts themselves.

Header, little-endian:
| offset | size     | field                                                  |
|--------|----------|--------------------------------------------------------|
| 0      | 4        | magic `KVLM`                                           |
| 4      | 1        | version, 1                                             |
| 5      | 1        | ndim, 1..8                                             |
| 6      | 1        | length of the dtype name, 1..32                        |
| 7      | 1        | length of the format name, 1..32                      |
| 8      | 8        | payload bytes (= product of dims x element size)       |
| 16     | 8        | part bytes (payload split into parts of this size; 0:  |
|        |          | one value)                                             |
| 24     | 8 x ndim | dims                                                   |
| ...    | ...      | dtype name as torch spells it (`float16`, `bfloat16`)  |
| ...    | ...      | format name as LMCache's `MemoryFormat` (`KV_2LTD`)    |
"""

import struct
from typing import List, NamedTuple, Optional, Sequence, Tuple

MAGIC = b"KVLM"
VERSION = 1
MAX_NDIM = 8
MAX_NAME = 32
_FIXED = struct.Struct("<4sBBBBQQ")
MAX_HEADER_BYTES = _FIXED.size + 8 * MAX_NDIM + 2 * MAX_NAME


class Header(NamedTuple):
    shape: Tuple[int, ...]
    dtype_name: str
    fmt_name: str
    payload_bytes: int
    part_bytes: int  # 0: the payload is one value


def encode(h: Header) -> bytes:
    d = h.dtype_name.encode("ascii")
    f = h.fmt_name.encode("ascii")
    if not 1 <= len(h.shape) <= MAX_NDIM or not 1 <= len(d) <= MAX_NAME \
            or not 1 <= len(f) <= MAX_NAME:
        raise ValueError("layout does not fit the header: %r" % (h,))
    return (_FIXED.pack(MAGIC, VERSION, len(h.shape), len(d), len(f), h.payload_bytes,
                        h.part_bytes)
            + struct.pack("<%dQ" % len(h.shape), *h.shape) + d + f)


def decode(raw: Optional[bytes]) -> Optional[Header]:
    """The header, or None for anything that is not a well-formed one."""
    if raw is None or len(raw) < _FIXED.size:
        return None
    magic, version, ndim, dlen, flen, payload, part = _FIXED.unpack_from(raw, 0)
    if magic != MAGIC or version != VERSION or not 1 <= ndim <= MAX_NDIM:
        return None
    if len(raw) != _FIXED.size + 8 * ndim + dlen + flen or not dlen or not flen:
        return None
    shape = struct.unpack_from("<%dQ" % ndim, raw, _FIXED.size)
    off = _FIXED.size + 8 * ndim
    try:
        dtype_name = raw[off:off + dlen].decode("ascii")
        fmt_name = raw[off + dlen:].decode("ascii")
    except UnicodeDecodeError:
        return None
    return Header(tuple(shape), dtype_name, fmt_name, payload, part)


def meta_key(key: str) -> str:
    return key + "#meta"


def payload_keys(key: str, h: Header) -> List[str]:
    """The payload's key(s), in order."""
    base = "%s#%s:%s:%s" % (key, h.dtype_name, h.fmt_name, "x".join(map(str, h.shape)))
    if h.part_bytes == 0:
        return [base]
    n = -(-h.payload_bytes // h.part_bytes)
    return ["%s/%d" % (base, i) for i in range(n)]


def part_spans(h: Header) -> List[Tuple[int, int]]:
    """(offset, size) of each payload key's bytes within the object."""
    if h.part_bytes == 0:
        return [(0, h.payload_bytes)]
    return [(off, min(h.part_bytes, h.payload_bytes - off))
            for off in range(0, h.payload_bytes, h.part_bytes)]


def layout(shape: Sequence[int], dtype_name: str, fmt_name: str, payload_bytes: int,
           max_value_bytes: int) -> Header:
    """The header for an object, split in parts when it exceeds max_value_bytes."""
    part = 0 if payload_bytes <= max_value_bytes else max_value_bytes
    return Header(tuple(int(d) for d in shape), dtype_name, fmt_name, int(payload_bytes), part)
