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

The worker hands a KvpoolKVEvents (a vLLM KVConnectorKVEvents where vLLM is
importable) to vLLM (get_kv_connector_kv_cache_events); vLLM's
KVOutputAggregator merges the workers' objects (add_events,
increment_workers), and the scheduler side's take_events() yields the events
every worker reported (a block counts as stored once every shard stored it;
with MLA only the writing ranks count), each once.

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


try:  # vLLM's container ABC where vLLM is importable (ENGINES.md 7.4)
    from vllm.distributed.kv_events import KVConnectorKVEvents as _EventsBase
except Exception:
    _EventsBase = object


class _Reported(list):
    """get_all_events()'s list: the events themselves, carrying which of them
    were stores and whether their worker writes, so that add_events() on
    another container counts them the way this one does."""

    saves = frozenset()
    writer = True


class KvpoolKVEvents(_EventsBase):
    """The events of one step from one worker, or of several merged.

    vLLM merges the TP workers' objects in KVOutputAggregator: the first
    worker's is the accumulator, and for each further worker it calls
    add_events(theirs.get_all_events()) and increment_workers(1). aggregate()
    then keeps the events every worker reported (stores: every writing
    worker; with MLA only the writing ranks store) and returns self, as
    vLLM's reference container does. Events of blocks loaded count toward
    every worker."""

    def __init__(self, events=(), writer=True):
        self.workers = 1
        self.writers = 1 if writer else 0
        self._writer = bool(writer)
        self._seen = {}  # (kind, repr(event)) -> [event, count], in first-report order
        for kind, ev in events:
            self._seen.setdefault((kind, repr(ev)), [ev, 0])[1] += 1

    # ---- vLLM's KVConnectorKVEvents ----
    def add_events(self, events):
        """Another worker's events (its get_all_events()): each counts once."""
        saves = getattr(events, "saves", frozenset())
        if getattr(events, "writer", True) and isinstance(events, _Reported):
            self.writers += 1
        for ev in events:
            kind = "save" if repr(ev) in saves else "load"
            self._seen.setdefault((kind, repr(ev)), [ev, 0])[1] += 1

    def increment_workers(self, count=1):
        self.workers += count

    def get_number_of_workers(self):
        return self.workers

    def get_all_events(self):
        out = _Reported(ev for ev, _ in self._seen.values())
        out.saves = frozenset(r for (kind, r) in self._seen if kind == "save")
        out.writer = self._writer
        return out

    def clear_events(self):
        self._seen.clear()

    def merge(self, other):
        self.add_events(other.get_all_events())
        return self

    def aggregate(self, other=None):
        """With no argument: keeps only the events every worker reported,
        with the worker count reset to one, and returns self. With another
        container (engines that merge pairwise): merges it in first."""
        if other is not None:
            self.add_events(other.get_all_events())
            self.increment_workers(other.get_number_of_workers())
            self.writers += max(0, other.writers - (1 if other._writer else 0))
            return self
        common = [(kind, r, ev) for (kind, r), (ev, n) in self._seen.items()
                  if n >= (self.writers if kind == "save" else self.workers)]
        self._seen = {(kind, r): [ev, 1] for kind, r, ev in common}
        self.workers = 1
        self.writers = 1
        self._writer = True
        return self

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
    if isinstance(obj, KvpoolKVEvents):
        return list(obj.aggregate().get_all_events())
    if hasattr(obj, "get_common_events"):
        return list(obj.get_common_events())
    return list(obj)
