"""Block descriptors: what a put says about each key so the node's KV events
name the block the way the engine's own events do (docs/kv-events.md).

    d = BlockDescriptor(hash=0x1234, parent=None, token_ids=range(16), block_size=16)
    client.put(keys, values, descriptors=[d, ...])

The bytes are the format of docs/kv-events.md ("Block descriptors"); the
node checks them again and refuses a put item whose descriptor is malformed.
"""

import struct

VERSION = 1
MAX_TOKENS = 4096
MAX_BLOCK_SIZE = 65536
MAX_HASH_BYTES = 32

_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")


def _hash_bytes(h, what):
    """A hash field: kind byte, then the int or the length-prefixed bytes."""
    if isinstance(h, bool):
        raise ValueError("block descriptor: a bool is not a %s" % what)
    if isinstance(h, int):
        if 0 <= h < 1 << 64:
            return b"\x01" + _U64.pack(h)
        if -(1 << 63) <= h < 0:
            return b"\x02" + _I64.pack(h)
        raise ValueError("block descriptor: %s %d does not fit 64 bits" % (what, h))
    if isinstance(h, (bytes, bytearray, memoryview)):
        b = bytes(h)
        if not 1 <= len(b) <= MAX_HASH_BYTES:
            raise ValueError("block descriptor: a bytes %s must be 1 to %d bytes"
                             % (what, MAX_HASH_BYTES))
        return b"\x03" + bytes([len(b)]) + b
    raise ValueError("block descriptor: %s must be an int or bytes, not %s"
                     % (what, type(h).__name__))


def _short(s, what):
    b = (s or "").encode("utf-8")
    if len(b) > 255:
        raise ValueError("block descriptor: %s over 255 bytes" % what)
    return bytes([len(b)]) + b


class BlockDescriptor:
    """One engine block: its hash and parent hash as the engine's events
    write them (int or bytes; parent None for a chain's first block), its
    token ids (empty, or block_size of them), the block size, and optionally
    the KV cache group, the LoRA name and the cache spec kind."""

    __slots__ = ("hash", "parent", "token_ids", "block_size", "group_idx", "lora_name",
                 "spec_kind", "_bytes")

    def __init__(self, hash, block_size, token_ids=(), parent=None, group_idx=None,
                 lora_name=None, spec_kind=None):
        self.hash = hash
        self.parent = parent
        self.token_ids = tuple(int(t) for t in token_ids)
        self.block_size = int(block_size)
        self.group_idx = group_idx
        self.lora_name = lora_name
        self.spec_kind = spec_kind
        self._bytes = None
        self.encode()  # checks now, so a bad descriptor fails where it is made

    def encode(self):
        """The descriptor's bytes (ValueError when a field breaks a rule)."""
        if self._bytes is not None:
            return self._bytes
        if not 1 <= self.block_size <= MAX_BLOCK_SIZE:
            raise ValueError("block descriptor: block_size %d is not 1 to %d"
                             % (self.block_size, MAX_BLOCK_SIZE))
        n = len(self.token_ids)
        if n not in (0, self.block_size) or n > MAX_TOKENS:
            raise ValueError("block descriptor: %d token ids for a block of %d (0 or block_size,"
                             " at most %d)" % (n, self.block_size, MAX_TOKENS))
        if any(not 0 <= t < 1 << 32 for t in self.token_ids):
            raise ValueError("block descriptor: a token id outside 0 .. 2^32-1")
        group = -1 if self.group_idx is None else int(self.group_idx)
        if group < -1 or group >= 1 << 31:
            raise ValueError("block descriptor: group_idx %d is not 0 .. 2^31-1" % group)
        parent = b"\x00" if self.parent is None else _hash_bytes(self.parent, "parent hash")
        self._bytes = b"".join((
            bytes([VERSION]), _hash_bytes(self.hash, "hash"), parent,
            struct.pack("<II", self.block_size, n), struct.pack("<%dI" % n, *self.token_ids),
            struct.pack("<i", group), _short(self.lora_name, "lora_name"),
            _short(self.spec_kind, "spec_kind")))
        return self._bytes

    def __repr__(self):
        return ("BlockDescriptor(hash=%r, parent=%r, block_size=%d, %d tokens, group=%r)"
                % (self.hash, self.parent, self.block_size, len(self.token_ids), self.group_idx))


def as_bytes(d):
    """A descriptor argument's bytes: a BlockDescriptor, bytes, or None (b"")."""
    if d is None:
        return b""
    if isinstance(d, BlockDescriptor):
        return d.encode()
    if isinstance(d, (bytes, bytearray, memoryview)):
        return bytes(d)
    raise TypeError("a descriptor is a BlockDescriptor, bytes or None, not %s"
                    % type(d).__name__)
