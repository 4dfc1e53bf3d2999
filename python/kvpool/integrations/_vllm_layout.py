"""vLLM per-layer KV tensors (ENGINES.md §2.6) and kvpool's page format.

A page holds one block of a set of layers this worker owns (every layer of
a KV-cache group, or one layer in layer-wise mode), in a canonical form that
does not depend on the attention backend: MHA `(2, block_size, heads,
head_size)` (K then V), MLA `(block_size, head_size)`, a Mamba state tensor
its per-block shape. A page of no layers (a group with no layer on this
pipeline stage) is the header alone. Blocks are read and
written through each tensor's logical indexing, so any stride order (NHD,
HND, strided per-layer views of a shared buffer) lands in the same bytes,
and instances on different backends share pages.

Page = 32-byte header + the layers' blocks in registration order:
  0..7   magic b"kvpoolV1"
  8..23  geometry digest: SHA-256 of (layer names, canonical shapes, dtypes)
  24..31 first 8 bytes of SHA-256(key)
A page whose header does not match what this worker expects is never copied
into the KV cache.

Not thread-safe; owned by the worker's connector.
"""

import hashlib

import torch

HEADER_BYTES = 32
MAGIC = b"kvpoolV1"


_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _physical_order(t):
    """Dimensions from outermost to innermost in memory (from the strides)."""
    return tuple(sorted(range(t.dim()), key=lambda d: (-t.stride(d), d)))


class LayerLayout:
    """How one layer's KV tensor stores blocks, and how to copy them.

    kind:
      "kv_first"    (2, num_blocks, block_size, heads, head)    FlashAttention
      "block_first" (num_blocks, 2, block_size, heads, head)    FlashInfer and others
      "mla"         (num_blocks, block_size, head)              MLA backends
      "bhnc"        (num_blocks, heads, block_size, 2 * head)   standardized views (MHA)
      "bhnc_mla"    (num_blocks, 1, block_size, head)           standardized views (MLA)
      "state"       (num_blocks, *state_shape)                  Mamba state tensors
    """

    def __init__(self, name, tensor, kind, canon_shape):
        self.name = name
        self.kind = kind
        self.canon_shape = tuple(canon_shape)
        self.dtype = tensor.dtype
        self.element_size = tensor.element_size()
        self.device = tensor.device
        # Blocks are moved as integers of the element's width: the bytes are
        # the same, and integer copies are several times faster than bf16 or
        # fp8 ones on CPU.
        self.tensor = tensor.view(_BITS[self.element_size])
        self.bits = self.tensor.dtype
        self.block_bytes = self.element_size
        for d in self.canon_shape:
            self.block_bytes *= d
        self.physical_order = _physical_order(tensor)

    def describe(self):
        # The backend's layout is left out, so instances on different backends
        # share pages; the standardized views are their own family, because
        # how their content axis splits into K and V is read from ENGINES.md
        # alone (a misreading then makes loads fail, never swap K and V).
        family = "std" if self.kind.startswith("bhnc") else "v1"
        return "%s:%s:%s:%s" % (self.name, family, "x".join(map(str, self.canon_shape)),
                                str(self.dtype).replace("torch.", ""))

    def gather(self, ids):
        """(n, *canon_shape) copy of blocks `ids` (a LongTensor on the tensor's device)."""
        t = self.tensor
        if self.kind == "kv_first":
            return t.index_select(1, ids).transpose(0, 1)
        if self.kind in ("block_first", "mla", "state"):
            return t.index_select(0, ids)
        if self.kind == "bhnc_mla":
            return t[ids][:, 0]
        blocks = t[ids]
        n, h, bs, c = blocks.shape
        return blocks.reshape(n, h, bs, 2, c // 2).permute(0, 3, 2, 1, 4)

    def gather_into(self, ids, out):
        """Writes blocks `ids` into out (n, *canon_shape), in one pass where
        the layout allows (no temporary copy of the blocks)."""
        t = self.tensor
        if self.kind == "kv_first" and out.device == t.device:
            torch.index_select(t, 1, ids, out=out.transpose(0, 1))
        elif self.kind in ("block_first", "mla", "state") and out.device == t.device:
            torch.index_select(t, 0, ids, out=out)
        else:
            out.copy_(self.gather(ids))

    def scatter(self, ids, src):
        """Writes src (n, *canon_shape) into blocks `ids`."""
        t = self.tensor
        if self.kind == "kv_first":
            t[:, ids] = src.transpose(0, 1)
        elif self.kind in ("block_first", "mla", "state"):
            t[ids] = src
        elif self.kind == "bhnc_mla":
            t[ids] = src.unsqueeze(1)
        else:
            n, two, bs, h, d = src.shape
            t[ids] = src.permute(0, 3, 2, 1, 4).reshape(n, h, bs, two * d)


def detect(name, tensor, num_blocks, block_size, use_mla):
    """The LayerLayout of one registered KV tensor. Raises ValueError for a
    shape this connector does not know (the caller then disables itself)."""
    s = tuple(tensor.shape)
    if tensor.dim() == 5:
        if s[0] == 2 and s[1] == num_blocks and s[2] == block_size:
            return LayerLayout(name, tensor, "kv_first", (2, s[2], s[3], s[4]))
        if s[0] == num_blocks and s[1] == 2 and s[2] == block_size:
            return LayerLayout(name, tensor, "block_first", (2, s[2], s[3], s[4]))
    elif tensor.dim() == 3 and s[0] == num_blocks and s[1] == block_size:
        return LayerLayout(name, tensor, "mla", (s[1], s[2]))
    elif tensor.dim() == 4 and s[0] == num_blocks and s[2] == block_size:
        if use_mla and s[1] == 1:
            return LayerLayout(name, tensor, "bhnc_mla", (s[2], s[3]))
        if not use_mla and s[3] % 2 == 0:
            return LayerLayout(name, tensor, "bhnc", (2, s[2], s[1], s[3] // 2))
    raise ValueError("layer %s: KV tensor of shape %s, strides %s is not a layout kvpool knows "
                     "(num_blocks=%d, block_size=%d, mla=%s)"
                     % (name, s, tuple(tensor.stride()), num_blocks, block_size, use_mla))


def detect_state(name, tensor, num_blocks):
    """The LayerLayout of one Mamba state tensor: (num_blocks, *state_shape).
    Raises ValueError for another shape."""
    if tensor.dim() < 1 or tensor.shape[0] != num_blocks:
        raise ValueError("layer %s: state tensor of shape %s does not start with num_blocks=%s"
                         % (name, tuple(tensor.shape), num_blocks))
    return LayerLayout(name, tensor, "state", tuple(tensor.shape[1:]))


def infer_num_blocks(tensors, block_size):
    """num_blocks when the config does not say: the dimension next to the
    K/V axis (5-D) or the first one (3-D/4-D), if all layers agree."""
    found = set()
    for t in tensors:
        s = tuple(t.shape)
        if t.dim() == 5:
            found.add(s[1] if s[0] == 2 and s[2] == block_size else s[0])
        elif t.dim() in (3, 4):
            found.add(s[0])
    return found.pop() if len(found) == 1 else None


class PageFormat:
    """Layout of a page for one worker's set of layers."""

    def __init__(self, layers):
        self.layers = list(layers)
        self.offsets = {}
        off = HEADER_BYTES
        for layer in self.layers:
            # Each layer starts at a multiple of its element size so the
            # staging row can be viewed as that dtype in place.
            off += (-off) % layer.element_size
            self.offsets[layer.name] = off
            off += layer.block_bytes
        # Rows of a staging tensor start at multiples of 16, so every layer's
        # slice can be viewed as its dtype.
        self.page_bytes = off + (-off) % 16
        desc = "|".join(layer.describe() for layer in self.layers).encode()
        self.geometry = hashlib.sha256(desc).digest()[:16]

    def describe(self):
        if not self.layers:
            return "no layers, %d-byte pages" % self.page_bytes
        first = self.layers[0]
        return "%d layers, %s %s (physical dims %s), %d-byte pages" % (
            len(self.layers), first.kind, str(first.dtype).replace("torch.", ""),
            first.physical_order, self.page_bytes)

    def header_rows(self, keys):
        """(n, HEADER_BYTES) uint8 headers for these keys."""
        rows = bytearray()
        for k in keys:
            rows += MAGIC + self.geometry + hashlib.sha256(k).digest()[:8]
        return torch.frombuffer(rows, dtype=torch.uint8).view(len(keys), HEADER_BYTES)

    def layer_view(self, staging, layer):
        """The slice of a (n, page_bytes) uint8 staging tensor holding `layer`,
        viewed as (n, *canon_shape) of integers of the layer's element width
        (no copy)."""
        off = self.offsets[layer.name]
        part = staging[:, off:off + layer.block_bytes]
        return part.view(layer.bits).view((staging.shape[0],) + layer.canon_shape)
