"""Keys of vLLM KV blocks in kvpool (ENGINES.md §2.5).

A block's key is a chained SHA-256 of the token prefix it ends, computed by
the connector itself rather than taken from vLLM's `request.block_hashes`:
vLLM seeds those with a per-process random root unless PYTHONHASHSEED is
pinned, so two instances would never share a prefix. What makes KV differ
for the same tokens goes into the chain as vLLM does it: the LoRA adapter (every
block), the cache salt (first block) and the multimodal inputs overlapping a
block. The namespace fingerprints the model and the KV geometry (for a
hybrid model, its KV-cache groups); the rank suffix separates
tensor-parallel shards (MHA) and pipeline stages.

Key = block hash + group tag + layer tag + rank suffix. The group tag
("/g<index>") is empty for a model with one full-attention group, so such
models keep the keys of earlier releases. The layer tag ("/L<index>",
layer-wise mode only) names the layer's page; "/L0" is written last and
stands for the whole block in lookups.

Pure functions; thread-safe.
"""

import hashlib
from array import array

from ._dtypes import dtype_name

HASH_BYTES = 32
_ROOT = hashlib.sha256(b"kvpool/vllm/block-hash/v1").digest()


def _mm_items(request):
    """(offset, length, identifier bytes) of each multimodal input, from
    mm_features (newer vLLM) or mm_hashes + mm_positions (older)."""
    items = []
    for f in getattr(request, "mm_features", None) or ():
        pos = getattr(f, "mm_position", None)
        ident = getattr(f, "identifier", None) or getattr(f, "mm_hash", None)
        if pos is not None and ident is not None:
            items.append((int(pos.offset), int(pos.length), str(ident).encode()))
    if not items:
        hashes = getattr(request, "mm_hashes", None) or ()
        positions = getattr(request, "mm_positions", None) or ()
        for h, pos in zip(hashes, positions):
            items.append((int(pos.offset), int(pos.length), str(h).encode()))
    return items


class BlockHasher:
    """The chained block hashes of one request, extended as tokens become known.

    REQUIRES: the request's tokens before `len(hashes) * block_size` never change
    (true of vLLM requests: tokens are only appended)."""

    def __init__(self, request, block_size):
        self._request = request
        self._bs = block_size
        lora = getattr(request, "lora_request", None)
        name = getattr(lora, "lora_name", None) if lora is not None else None
        self._lora = b"lora:" + str(name).encode() if name is not None else b""
        salt = getattr(request, "cache_salt", None)
        self._salt = b"salt:" + str(salt).encode() if salt else b""
        self._mm = _mm_items(request)
        self.hashes = []

    def upto(self, num_blocks, tokens=None):
        """The first num_blocks hashes (fewer if fewer full blocks are known)."""
        if tokens is None:
            tokens = self._request.all_token_ids
        num_blocks = min(num_blocks, len(tokens) // self._bs)
        bs = self._bs
        parent = self.hashes[-1] if self.hashes else _ROOT
        for i in range(len(self.hashes), num_blocks):
            start, end = i * bs, (i + 1) * bs
            h = hashlib.sha256(parent)
            h.update(array("q", tokens[start:end]).tobytes())
            h.update(self._lora)
            if i == 0:
                h.update(self._salt)
            for off, length, ident in self._mm:
                if off < end and off + length > start:
                    h.update(b"mm:%d:%d:" % (off, length) + ident)
            parent = h.digest()
            self.hashes.append(parent)
        return self.hashes[:num_blocks]


def _call(obj, name, *args):
    fn = getattr(obj, name, None)
    if not callable(fn):
        return None
    try:
        return fn(*args)
    except Exception:  # geometry helpers are optional; the page header checks the rest
        return None


def namespace(vllm_config, override=None, groups=None):
    """(namespace, use_mla): the model, KV dtype, block size, attention kind
    and per-rank geometry as both the scheduler and the workers see them in
    vllm_config (the workers check the tensors against the page header), and
    the description of a hybrid model's groups (`groups`: a str)."""
    mc = vllm_config.model_config
    cc = vllm_config.cache_config
    pc = vllm_config.parallel_config
    use_mla = bool(getattr(mc, "use_mla", False))
    cache_dtype = getattr(cc, "cache_dtype", "auto") or "auto"
    dtype = cache_dtype if cache_dtype != "auto" else dtype_name(getattr(mc, "dtype", "auto"))
    parts = ["kvpool-vllm/1",
             "model=" + str(override or mc.model),
             "rev=" + str(getattr(mc, "revision", None) or ""),
             "dtype=" + dtype,
             "block=%d" % cc.block_size,
             "attn=" + ("mla" if use_mla else "mha")]
    for label, value in (("head", _call(mc, "get_head_size")),
                         ("kvheads", None if use_mla else _call(mc, "get_num_kv_heads", pc)),
                         ("layers", _call(mc, "get_num_layers", pc))):
        if value is not None:
            parts.append("%s=%d" % (label, value))
    if not use_mla:
        parts.append("tp=%d" % getattr(pc, "tensor_parallel_size", 1))
    parts.append("pp=%d" % getattr(pc, "pipeline_parallel_size", 1))
    if groups:
        parts.append("groups=" + groups)
    return ";".join(parts), use_mla


def group_tag(hybrid, group):
    """The key part naming a KV-cache group (empty for non-hybrid models)."""
    return b"/g%d" % group if hybrid else b""


def layer_tag(index):
    """The key part naming one layer's page (layer-wise mode)."""
    return b"/L%d" % index


def rank_suffix(use_mla, tp_rank, pp_rank):
    """The key suffix of one worker's shard: MLA latents are the same on every
    TP rank, so MLA keys carry only the pipeline stage."""
    if use_mla:
        return b"/p%d" % pp_rank
    return b"/t%d/p%d" % (tp_rank, pp_rank)


def all_rank_suffixes(use_mla, tp_size, pp_size):
    """Every shard a block needs to be complete, in rank order."""
    tps = [0] if use_mla else range(tp_size)
    return [rank_suffix(use_mla, t, p) for p in range(pp_size) for t in tps]
