"""KV-cache groups of a vLLM model (ENGINES.md §6.3) and which of their blocks
kvpool stores and loads.

A plain model has one full-attention group. A hybrid model has several (full
attention, sliding window, Mamba), each with its own block table, block size
and layers. kvpool keys a block by (group, token-prefix hash) and decides per
group type what a prefix of T tokens needs (T a multiple of the lcm of the
groups' block sizes; k = T / block_size of the group):

  full attention  blocks [0, k): every block, since attention reads them all.
  sliding window  blocks [k - ceil((window - 1) / block_size), k): the next
                  token attends only to the window before T; older blocks
                  are freed by vLLM (null block 0 in the table).
  Mamba           block k - 1: the recurrent state after token T lives in
                  the block of the boundary (mamba_cache_mode "align"/"all");
                  other Mamba slots hold nothing worth keeping.

A prefix of T tokens is a hit only if every group has what it needs for T
(as vLLM's hybrid longest-hit search), so kvpool never reports tokens whose
recurrent state or window it cannot restore. Saves follow the same rule:
full-attention blocks always; sliding-window and Mamba blocks only where a
later lookup can use them, before a "reachable" boundary (with a Mamba group
in "align" mode, only the end of a scheduled chunk has a state; otherwise
every boundary).

Pure functions and plain data; thread-safe.
"""

import math
from dataclasses import dataclass
from typing import Optional

FULL = "full_attention"
SLIDING = "sliding_window"
MAMBA = "mamba"

NULL_BLOCK_ID = 0
# Mamba cache modes whose blocks hold the state at a block boundary.
_RESTORABLE_MAMBA_MODES = ("align", "all")


@dataclass
class Group:
    """One KV-cache group: index in kv_cache_groups, kind, block size in
    tokens, layer names (None: every registered layer), window in tokens
    (sliding window only)."""

    index: int
    kind: str
    block_size: int
    layer_names: Optional[list] = None
    window: int = 0

    @property
    def window_blocks(self):
        """Blocks a sliding-window group needs before a boundary."""
        return -(-(self.window - 1) // self.block_size) if self.window > 1 else 1

    def needed(self, tokens):
        """Block indices this group needs for a prefix of `tokens` tokens."""
        k = tokens // self.block_size
        if k <= 0:
            return range(0)
        if self.kind == SLIDING:
            return range(max(0, k - self.window_blocks), k)
        if self.kind == MAMBA:
            return range(k - 1, k)
        return range(k)

    def describe(self):
        if self.kind == SLIDING:
            return "swa%d/%d" % (self.window, self.block_size)
        return "%s/%d" % ("full" if self.kind == FULL else "mamba", self.block_size)


def spec_kind(spec):
    """FULL, SLIDING or MAMBA for a vLLM KVCacheSpec; None for a kind kvpool
    does not store (chunked local attention, cross attention, ...)."""
    name = type(spec).__name__
    if "Mamba" in name or (hasattr(spec, "shapes") and hasattr(spec, "dtypes")):
        return MAMBA
    if "SlidingWindow" in name:
        return SLIDING
    if "FullAttention" in name or "MLAAttention" in name:
        return SLIDING if getattr(spec, "sliding_window", None) else FULL
    return None


def groups_of(kv_cache_config, block_size):
    """The groups of kv_cache_config; one full-attention group of
    `block_size` when there is no config (vLLM <= 0.10) or it lists none.
    Raises ValueError for a group kind kvpool cannot store."""
    specs = list(getattr(kv_cache_config, "kv_cache_groups", None) or ())
    if not specs:
        return [Group(0, FULL, block_size)]
    groups = []
    for i, g in enumerate(specs):
        spec = getattr(g, "kv_cache_spec", None)
        kind = spec_kind(spec) if spec is not None else FULL
        if kind is None:
            raise ValueError("KV-cache group %d has a %s, which kvpool does not store"
                             % (i, type(spec).__name__))
        bs = int(getattr(spec, "block_size", None) or block_size)
        window = int(getattr(spec, "sliding_window", None) or 0) if kind == SLIDING else 0
        groups.append(Group(i, kind, bs, list(getattr(g, "layer_names", None) or ()), window))
    return groups


def is_hybrid(groups):
    return len(groups) > 1 or groups[0].kind != FULL


def lcm_block_size(groups):
    out = 1
    for g in groups:
        out = out * g.block_size // math.gcd(out, g.block_size)
    return out


def restorable(groups, mamba_cache_mode):
    """False when a Mamba group's state is not kept at block boundaries:
    such a model is never loaded (0 external tokens) nor saved."""
    if any(g.kind == MAMBA for g in groups):
        return mamba_cache_mode in _RESTORABLE_MAMBA_MODES
    return True


def reachable(groups, mamba_cache_mode, start, end):
    """Prefix lengths in (start, end] that a later lookup can hit, given the
    tokens [start, end) computed in one step."""
    unit = lcm_block_size(groups)
    if any(g.kind == MAMBA for g in groups) and mamba_cache_mode != "all":
        # "align": the state exists only at the chunk's end, if on a boundary.
        return [end] if end > start and end % unit == 0 else []
    first = start // unit + 1
    return [t * unit for t in range(first, end // unit + 1)]


def longest_hit(groups, first_tokens, cap_tokens, present):
    """The largest T, a multiple of the lcm block size with first_tokens < T
    <= cap_tokens, for which every group's needed blocks at index >=
    first_tokens // block_size satisfy present(group index, block index);
    first_tokens when there is none."""
    unit = lcm_block_size(groups)
    top = cap_tokens // unit * unit
    if top <= first_tokens:
        return first_tokens
    # Full-attention groups need a contiguous run: T cannot pass its end.
    for g in groups:
        if g.kind == FULL:
            i = first_tokens // g.block_size
            while i < top // g.block_size and present(g.index, i):
                i += 1
            top = min(top, i * g.block_size // unit * unit)
    t = top
    while t > first_tokens:
        if all(present(g.index, i) for g in groups if g.kind != FULL
               for i in g.needed(t) if i >= first_tokens // g.block_size):
            return t
        t -= unit
    return first_tokens
