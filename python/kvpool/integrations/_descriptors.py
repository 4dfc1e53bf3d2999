"""Block descriptors the connectors attach to the pages they put, so that the
node's KV events (docs/kv-events.md) name each block the way the engine's
own events would: its hash, parent hash, token ids, block size, group, LoRA
name and cache spec kind (kvpool.descriptor.BlockDescriptor). What each
connector attaches, and why, is in docs/connectors.md ("Block descriptors").

Describing is best effort and never costs a page:
- a descriptor that cannot be built is left out (logged once); one whose
  tokens break a limit (more than kvpool.descriptor.MAX_TOKENS) is built
  without its tokens first;
- a put the client, library or node refuses because of the descriptors (an
  older libkvpool without kvpool_put_described, an encoding error, a node
  that fails a described put as a whole with INTERNAL or INVALID_ARGUMENT)
  is made again without them; descriptors are turned off for good when the
  library lacks the call, or after _GIVE_UP such puts in a row whose plain
  retry succeeded (the node cannot take them); a call that fails as a whole
  for the node's sake (UNAVAILABLE, DEADLINE_EXCEEDED, ...) is not retried;
- an item the node refuses with INVALID_ARGUMENT (its descriptor
  malformed) is put again without its descriptor.

The setting `block_descriptors` (every connector; default true) turns it
off. Thread-safe.
"""

import threading

from kvpool.client import KvpoolError, StatusCode
from kvpool.descriptor import BlockDescriptor

_MASK64 = (1 << 64) - 1
# Described puts failing as a whole, each time fine without descriptors,
# after which a connector stops describing.
_GIVE_UP = 3
# Whole-call failures a described put may owe to its descriptors.
_DESCRIPTOR_FAILURES = frozenset((StatusCode.INTERNAL, StatusCode.INVALID_ARGUMENT))


def int_hash(h):
    """An int hash as a descriptor takes it: as is when it fits a signed or
    unsigned 64-bit int, else its low 64 bits (vLLM's int event hashes are
    the low 64 bits too)."""
    h = int(h)
    if -(1 << 63) <= h <= _MASK64:
        return h
    return h & _MASK64


def sha256_hex_to_int64(s):
    """SGLang's page hash (64 lowercase hex chars of a SHA-256) as the signed
    64-bit int of its first 8 bytes, big-endian; None when `s` is not such a
    hash."""
    if not isinstance(s, str) or len(s) != 64:
        return None
    try:
        raw = bytes.fromhex(s)
    except ValueError:
        return None
    return int.from_bytes(raw[:8], "big", signed=True)


class Describer:
    """One connector's descriptors: builds them and puts with them."""

    def __init__(self, enabled, log):
        self._enabled = bool(enabled)
        self._log = log
        self._lock = threading.Lock()
        self._said = set()  # protected by _lock: the kinds of trouble logged once
        self._refused_in_a_row = 0  # protected by _lock
        self.fallbacks = 0  # puts made again without descriptors (for tests and logs)

    @property
    def enabled(self):
        return self._enabled

    def _once(self, kind, msg, *args):
        with self._lock:
            if kind in self._said:
                return
            self._said.add(kind)
        self._log.warning("kvpool: " + msg, *args)

    def make(self, hash, block_size, token_ids=(), parent=None, group_idx=None, lora_name=None,
             spec_kind=None):
        """A BlockDescriptor, or None when describing is off or the fields
        do not make one (logged once)."""
        if not self._enabled or hash is None:
            return None
        try:
            return BlockDescriptor(hash, block_size, token_ids, parent, group_idx, lora_name,
                                   spec_kind)
        except Exception as e:  # noqa: BLE001 - a block we cannot describe is put as is
            first = e
        if token_ids:
            try:  # e.g. a block of more tokens than a descriptor holds
                d = BlockDescriptor(hash, block_size, (), parent, group_idx, lora_name, spec_kind)
                self._once("no-tokens", "a block is described without its tokens (%s)", first)
                return d
            except Exception:  # noqa: BLE001
                pass
        self._once("bad", "a block cannot be described (%s); its pages are put without a "
                   "descriptor", first)
        return None

    def put_ptrs(self, client, keys, ptrs, sizes, descriptors):
        """client.put_ptrs(keys, ptrs, sizes) with `descriptors` (parallel to
        keys; None entries have none). Never loses a put to them: see the
        module docstring. Raises what put_ptrs raises without descriptors."""
        if not self._enabled or not descriptors or all(d is None for d in descriptors):
            return client.put_ptrs(keys, ptrs, sizes)
        try:
            statuses = client.put_ptrs(keys, ptrs, sizes, descriptors)
        except KvpoolError as e:
            if e.code not in _DESCRIPTOR_FAILURES:  # the node's trouble (gone, late): not ours
                raise
            self._count_fallback()
            self._once("call", "a put with block descriptors failed (%s); put without them", e)
            statuses = client.put_ptrs(keys, ptrs, sizes)  # raises if it was not ours
            with self._lock:
                self._refused_in_a_row += 1
                give_up = self._refused_in_a_row >= _GIVE_UP and self._enabled
                if give_up:
                    self._enabled = False
            if give_up:
                self._log.warning("kvpool: the node fails every put with block descriptors (%s); "
                                  "pages are put without them from now on", e)
            return statuses
        except AttributeError as e:  # a libkvpool without kvpool_put_described
            self._enabled = False
            self._count_fallback()
            self._once("lib", "this libkvpool cannot attach block descriptors (%s); pages are "
                       "put without them", e)
            return client.put_ptrs(keys, ptrs, sizes)
        except Exception as e:  # noqa: BLE001 - e.g. a descriptor the client refuses
            self._count_fallback()
            self._once("put", "a put with block descriptors failed (%r); put without them", e)
            return client.put_ptrs(keys, ptrs, sizes)
        with self._lock:
            self._refused_in_a_row = 0
        redo = [i for i, st in enumerate(statuses)
                if st == StatusCode.INVALID_ARGUMENT and descriptors[i] is not None]
        if redo:
            self._count_fallback()
            self._once("refused", "the node refused %d block descriptors; those pages are put "
                       "without them", len(redo))
            again = client.put_ptrs([keys[i] for i in redo], [ptrs[i] for i in redo],
                                    [sizes[i] for i in redo])
            statuses = list(statuses)
            for i, st in zip(redo, again):
                statuses[i] = st
        return statuses

    def _count_fallback(self):
        with self._lock:
            self.fallbacks += 1
