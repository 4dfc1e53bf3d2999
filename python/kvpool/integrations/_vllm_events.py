"""KV events of the vLLM connector (ENGINES.md §6.1).

The worker reports a BlockStored event for each block it stored in kvpool,
each block it was to store and found there already, and each block it
loaded from kvpool (the load shows that kvpool holds it), so cache-aware
routers learn what kvpool's tier has:

  block_hashes       [the engine's hash of the block]: vLLM's prefix-cache
                     hash (request.block_hashes), as an int of its low 64
                     bits read big-endian (bytes when vLLM's
                     VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES is "0"). Where vLLM
                     gives none, kvpool's own hash of the block, the same way.
  parent_block_hash  the hash of the previous block of the same group (None
                     for the first block).
  token_ids          the block's tokens.
  block_size         the group's block size; group_idx the group's index;
                     kv_cache_spec_kind "full_attention", "sliding_window" or
                     "mamba", kv_cache_spec_sliding_window the window.
  medium             "CPU" (kvpool's DRAM tier), or the event_medium setting
                     (e.g. "STORAGE" for a node that keeps pages on SSD): the
                     client API does not tell which tier served a page.
  locality           "LOCAL" with a node on this host, "REMOTE" in remote mode.

The worker hands a KvpoolKVEvents to vLLM (get_kv_connector_kv_cache_events);
vLLM merges the workers' objects with aggregate(), and the scheduler side's
take_events() yields the events every worker reported (a block counts as
stored once every shard stored it; with MLA only the writing ranks count).

Pure functions and a plain container; not thread-safe.
"""

import dataclasses
import inspect
import os

_MASK64 = (1 << 64) - 1


def event_hash(h):
    """An engine block hash as KV events carry it."""
    if isinstance(h, int):
        return h & _MASK64
    raw = bytes(h) if not isinstance(h, bytes) else h
    if os.environ.get("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "1") == "0":
        return raw
    return int.from_bytes(raw[-8:], "big")


def block_info(request, indices, block_size, hash_block_size, own_hashes):
    """(engine hash, parent hash, token ids) of blocks `indices` of a group of
    `block_size` tokens. vLLM's request.block_hashes are per hash_block_size
    tokens; a group block of r such blocks has the hash of its last one."""
    engine = list(getattr(request, "block_hashes", None) or ())
    tokens = request.all_token_ids
    ratio = block_size // hash_block_size if block_size % hash_block_size == 0 else 0

    def hash_of(i):
        j = (i + 1) * ratio - 1
        if ratio and j < len(engine):
            return event_hash(engine[j])
        return event_hash(own_hashes[i])

    return [(hash_of(i), hash_of(i - 1) if i > 0 else None,
             list(tokens[i * block_size:(i + 1) * block_size])) for i in indices]


def _fields(cls):
    names = getattr(cls, "__struct_fields__", None)  # msgspec structs
    if names is not None:
        return set(names)
    if dataclasses.is_dataclass(cls):
        return {f.name for f in dataclasses.fields(cls)}
    try:
        return set(inspect.signature(cls).parameters)
    except (TypeError, ValueError):
        return set()


class EventFactory:
    """Builds BlockStored events of the running vLLM (fields it lacks are
    left out), or none when vLLM has no event model."""

    def __init__(self, medium, locality):
        try:
            from vllm.distributed.kv_events import BlockStored
        except Exception:  # vLLM without KV events
            BlockStored = None
        self._cls = BlockStored
        self._fields = _fields(BlockStored) if BlockStored is not None else set()
        self.medium = medium
        self.locality = locality

    @property
    def enabled(self):
        return self._cls is not None

    def stored(self, info, group, lora_name):
        """The BlockStored of one block: info = (hash, parent, tokens)."""
        h, parent, tokens = info
        values = {"block_hashes": [h], "parent_block_hash": parent, "token_ids": tokens,
                  "block_size": group.block_size, "lora_id": None, "medium": self.medium,
                  "lora_name": lora_name, "group_idx": group.index,
                  "kv_cache_spec_kind": group.kind,
                  "kv_cache_spec_sliding_window": group.window or None,
                  "locality": self.locality}
        return self._cls(**{k: v for k, v in values.items() if k in self._fields})


class KvpoolKVEvents:
    """The events of one step from one worker, or from several once merged
    with aggregate(). Events of blocks stored count toward the writing
    workers, events of blocks loaded toward all workers."""

    def __init__(self, events=(), writer=True):
        self.workers = 1
        self.writers = 1 if writer else 0
        self._seen = {}  # (kind, repr(event)) -> [event, count], in first-report order
        for kind, ev in events:
            self._seen.setdefault((kind, repr(ev)), [ev, 0])[1] += 1

    def aggregate(self, other):
        """Merges another worker's events into this object; returns it."""
        if other is None:
            return self
        self.workers += other.workers
        self.writers += other.writers
        for key, (ev, n) in other._seen.items():
            self._seen.setdefault(key, [ev, 0])[1] += n
        return self

    def get_all_events(self):
        return [ev for ev, _ in self._seen.values()]

    def get_common_events(self):
        """Events every worker that could report them reported."""
        out = []
        for (kind, _), (ev, n) in self._seen.items():
            if n >= (self.writers if kind == "save" else self.workers):
                out.append(ev)
        return out

    def __len__(self):
        return len(self._seen)


def common_events(obj):
    """The events to publish from what KVConnectorOutput.kv_cache_events holds."""
    if obj is None:
        return []
    if hasattr(obj, "get_common_events"):
        return list(obj.get_common_events())
    return list(obj)
