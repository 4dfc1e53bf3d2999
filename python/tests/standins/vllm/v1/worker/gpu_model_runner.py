"""Stand-in of vllm/v1/worker/gpu_model_runner.py with the connector hooks of
kv_connector_model_runner_mixin.py and the per-layer hooks of the attention
layer (ENGINES.md §2.3, §2.6).

It allocates per-layer KV tensors in a chosen backend layout, registers them
with the worker-side connector, and runs each step as vLLM does:
bind_connector_metadata, start_load_kv(forward_context), per layer
wait_for_layer_load -> attention -> save_kv_layer, wait_for_save,
get_finished + get_block_ids_with_load_errors, clear_connector_metadata.

"Attention" is a deterministic stand-in: the KV of token p in layer l is a
function of the token prefix [0, p], the layer and the (global) head, so any
instance computes the same bytes for the same prefix. Before writing, each
layer reads back the KV of every already-computed token of every scheduled
request and compares it byte for byte with what it should be; blocks that
differ are reported in ModelRunnerOutput.wrong_kv_block_ids (a stand-in
field): the engine would have attended to wrong KV there. The sampled token
is a hash of the request's KV in the last layer, so wrong KV also changes
the output.

Hybrid models (several KV-cache groups, ENGINES.md §6.3): the layers of all
groups share the KVCacheConfig's tensors (one raw buffer per KVCacheTensor,
blocks outermost, one page per block); attention layers are views in the
block-major FlashAttention form, Mamba layers a list of state tensors
(num_blocks, *shape). Block b of group g is index b in the layers of g.
Sliding-window layers read only the window; a Mamba layer reads the state
after the computed tokens from the block of the last computed token and
writes the state after the step's tokens to the block of the last one; a
state is a deterministic function of the prefix, checked like KV. The
per-layer connector hooks run around attention layers only.

layer_compute_s: a simulated compute time per attention layer (sleep), for
measuring how loads overlap compute; verify=False skips the read checks;
forward_s: the last forward pass's time, from start_load_kv to the return of
wait_for_save.
"""

import hashlib
import time

import torch

from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.forward_context import ForwardContext
from vllm.v1.attention.backend import AttentionMetadata
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput

# Backend layouts of ENGINES.md §2.6. For each: the logical shape of one
# layer, how the physical buffer is ordered, and where token slots live.
LAYOUTS = ("flash_attn", "flash_attn_block_major", "flashinfer_nhd", "flashinfer_hnd", "mla",
           "standard_blhnc", "standard_mla")


def prefix_ids(tokens):
    """One int per position identifying the token prefix ending there."""
    out, r = [], 17
    for t in tokens:
        r = (r * 1000003 + int(t) + 1) % 2147483647
        out.append(r)
    return out


def expected_kv(prefix, layer, head_offset, num_heads, head_size, dtype, mla):
    """KV of the positions whose prefix ids are `prefix`: (n, 2, H, D) for MHA
    (H heads starting at global head `head_offset`), (n, D) for MLA."""
    p = torch.tensor(prefix, dtype=torch.int64)
    if mla:
        x = (p[:, None] * 7 + layer * 131 + torch.arange(head_size)[None, :]) % 251
    else:
        heads = torch.arange(head_offset, head_offset + num_heads)
        kv = torch.arange(2)
        x = (p[:, None, None, None] * 7 + layer * 131 + kv[None, :, None, None] * 29
             + heads[None, None, :, None] * 17 + torch.arange(head_size)[None, None, None, :]) % 251
    return (x.to(torch.float32) / 251.0 - 0.5).to(dtype)


def allocate_kv_caches(layout, layer_names, num_blocks, block_size, num_heads, head_size, dtype):
    """Per-layer tensors as vLLM's runner hands them to register_kv_caches,
    filled with a value no real KV has (so a block that was never written
    shows up)."""
    nl, nb, bs, h, d = len(layer_names), num_blocks, block_size, num_heads, head_size

    def fill(t):
        return t.fill_(3.0)

    if layout == "flash_attn":  # (2, NB, BS, H, D), contiguous
        caches = [fill(torch.empty(2, nb, bs, h, d, dtype=dtype)) for _ in range(nl)]
    elif layout == "flash_attn_block_major":  # (2, NB, ...) logical, blocks outermost in memory
        caches = [fill(torch.empty(nb, 2, bs, h, d, dtype=dtype)).transpose(0, 1) for _ in range(nl)]
    elif layout == "flashinfer_nhd":  # (NB, 2, BS, H, D)
        caches = [fill(torch.empty(nb, 2, bs, h, d, dtype=dtype)) for _ in range(nl)]
    elif layout == "flashinfer_hnd":  # (NB, 2, BS, H, D) logical over an (NB, 2, H, BS, D) buffer
        caches = [fill(torch.empty(nb, 2, h, bs, d, dtype=dtype)).permute(0, 1, 3, 2, 4)
                  for _ in range(nl)]
    elif layout == "mla":  # (NB, BS, D)
        caches = [fill(torch.empty(nb, bs, d, dtype=dtype)) for _ in range(nl)]
    elif layout == "standard_blhnc":  # one buffer (B, L, H, N, 2*D); layer views [B, H, N, C]
        buf = fill(torch.empty(nb, nl, h, bs, 2 * d, dtype=dtype))
        caches = [buf[:, i] for i in range(nl)]
    elif layout == "standard_mla":  # one buffer (B, L, 1, N, D); layer views [B, 1, N, D]
        buf = fill(torch.empty(nb, nl, 1, bs, d, dtype=dtype))
        caches = [buf[:, i] for i in range(nl)]
    else:
        raise ValueError(layout)
    return dict(zip(layer_names, caches))


class _Slots:
    """Reads/writes the KV of token slots in one layer tensor of a layout."""

    def __init__(self, layout, tensor):
        self.layout, self.t = layout, tensor

    def write(self, blk, off, kv):
        t, lay = self.t, self.layout
        if lay in ("flash_attn", "flash_attn_block_major"):
            t[0, blk, off] = kv[:, 0]
            t[1, blk, off] = kv[:, 1]
        elif lay in ("flashinfer_nhd", "flashinfer_hnd"):
            t[blk, 0, off] = kv[:, 0]
            t[blk, 1, off] = kv[:, 1]
        elif lay == "mla":
            t[blk, off] = kv
        elif lay == "standard_blhnc":
            d = kv.shape[-1]
            t[blk, :, off, :d] = kv[:, 0]
            t[blk, :, off, d:] = kv[:, 1]
        else:  # standard_mla
            t[blk, 0, off] = kv

    def read(self, blk, off):
        t, lay = self.t, self.layout
        if lay in ("flash_attn", "flash_attn_block_major"):
            return torch.stack([t[0, blk, off], t[1, blk, off]], dim=1)
        if lay in ("flashinfer_nhd", "flashinfer_hnd"):
            return torch.stack([t[blk, 0, off], t[blk, 1, off]], dim=1)
        if lay == "mla":
            return t[blk, off]
        if lay == "standard_blhnc":
            x = t[blk, :, off]
            d = x.shape[-1] // 2
            return torch.stack([x[..., :d], x[..., d:]], dim=1)
        return t[blk, 0, off]


def _bits(x):
    return x.contiguous().view(torch.int16 if x.element_size() == 2 else torch.int32)


def expected_state(prefix_id, layer, shape, dtype):
    """A Mamba layer's state tensor after the prefix whose last prefix id is
    `prefix_id`."""
    n = 1
    for d in shape:
        n *= d
    x = (int(prefix_id) * 7 + layer * 131 + torch.arange(n) * 3) % 251
    return (x.to(torch.float32) / 251.0 - 0.5).to(dtype).reshape(shape)


def _esize(dtype):
    return torch.empty((), dtype=dtype).element_size()


def _contiguous_strides(shape):
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return tuple(reversed(out))


def _kind(spec):
    name = type(spec).__name__
    if "Mamba" in name:
        return "mamba"
    return "sliding_window" if getattr(spec, "sliding_window", None) else "full_attention"


def allocate_hybrid(kv_cache_config, dtype):
    """Per-layer views over the shared raw buffers of kv_cache_config:
    {layer: tensor (attention) or [state tensors] (Mamba)}, and the page size."""
    spec_of = {n: g.kv_cache_spec for g in kv_cache_config.kv_cache_groups for n in g.layer_names}
    nb = kv_cache_config.num_blocks
    caches = {}
    for kt in kv_cache_config.kv_cache_tensors:
        page = kt.size // nb
        raw = torch.empty(kt.size, dtype=torch.uint8)
        raw.view(torch.int16).fill_(0x4040)  # a value no real KV or state has
        for name in kt.shared_by:
            spec = spec_of[name]
            if _kind(spec) == "mamba":
                views, off = [], 0
                for shape, dt in zip(spec.shapes, spec.dtypes):
                    e = _esize(dt)
                    views.append(raw.view(dt).as_strided((nb,) + tuple(shape),
                                                         (page // e,) + _contiguous_strides(shape),
                                                         off // e))
                    n = e
                    for d in shape:
                        n *= d
                    off += n
                caches[name] = views
            else:
                e = _esize(spec.dtype)
                bs, h, d = spec.block_size, spec.num_kv_heads, spec.head_size
                caches[name] = raw.view(spec.dtype).as_strided(
                    (2, nb, bs, h, d), (bs * h * d, page // e, h * d, d, 1))
    return caches


class GPUModelRunner:
    def __init__(self, vllm_config, kv_cache_config, layout="flash_attn"):
        self.vllm_config = vllm_config
        mc, pc = vllm_config.model_config, vllm_config.parallel_config
        self.block_size = vllm_config.cache_config.block_size
        self.mla = layout in ("mla", "standard_mla")
        assert self.mla == mc.use_mla, "layout and model_config.use_mla disagree"
        self.tp_rank = pc.rank % pc.tensor_parallel_size
        self.num_heads = mc.get_num_kv_heads(pc)
        self.head_size = mc.get_head_size()
        self.dtype = mc.dtype
        self.layout = layout
        self.layer_compute_s = 0.0
        self.verify = True
        self.forward_s = 0.0
        groups = kv_cache_config.kv_cache_groups
        self.hybrid = bool(kv_cache_config.kv_cache_tensors)
        self.group_of = {}  # layer name -> (group index, kind, block size, window, spec)
        for gi, g in enumerate(groups):
            spec = g.kv_cache_spec
            for n in g.layer_names:
                self.group_of[n] = (gi, _kind(spec), getattr(spec, "block_size", self.block_size),
                                    getattr(spec, "sliding_window", None) or 0, spec)
        if self.hybrid:
            self.layer_names = [n for n in _model_order(groups)]
            self.kv_caches = allocate_hybrid(kv_cache_config, self.dtype)
            layout = self.layout = "flash_attn_block_major"
        else:
            self.layer_names = list(groups[0].layer_names)
            self.kv_caches = allocate_kv_caches(layout, self.layer_names,
                                                kv_cache_config.num_blocks, self.block_size,
                                                self.num_heads, self.head_size, self.dtype)
        self.slots = {n: _Slots(layout, t) for n, t in self.kv_caches.items()
                      if isinstance(t, torch.Tensor)}
        self.connector = None
        if vllm_config.kv_transfer_config is not None:
            self.connector = KVConnectorFactory.create_connector(
                vllm_config, KVConnectorRole.WORKER, kv_cache_config,
                hybrid_kv_cache_manager=len(groups) > 1)
            self.connector.register_kv_caches(self.kv_caches)
        self.reqs = {}  # req id -> [tokens, block ids per group]
        self.hook_log = []  # (hook, layer name) in call order, when record_hooks
        self.record_hooks = False

    def _kv(self, tokens_prefix, layer_idx):
        return expected_kv(tokens_prefix, layer_idx, self.tp_rank * self.num_heads,
                           self.num_heads, self.head_size, self.dtype, self.mla)

    def _update_states(self, so):
        for nr in so.scheduled_new_reqs:
            self.reqs[nr.req_id] = [list(nr.prompt_token_ids), [list(x) for x in nr.block_ids]]
        c = so.scheduled_cached_reqs
        for i, rid in enumerate(c.req_ids):
            st = self.reqs[rid]
            if rid in c.all_token_ids:
                st[0] = list(c.all_token_ids[rid])
            if c.new_block_ids[i]:
                for g, ids in enumerate(c.new_block_ids[i]):
                    st[1][g].extend(ids)
        for rid in so.finished_req_ids:
            self.reqs.pop(rid, None)

    def _table(self, rid, name):
        gi = self.group_of[name][0] if self.hybrid else 0
        return self.reqs[rid][1][gi]

    def execute_model(self, so):
        self._update_states(so)
        computed = {nr.req_id: nr.num_computed_tokens for nr in so.scheduled_new_reqs}
        c = so.scheduled_cached_reqs
        computed.update(zip(c.req_ids, c.num_computed_tokens))
        conn = self.connector
        attn_meta = {name: AttentionMetadata() for name in self.layer_names}
        ctx = ForwardContext(no_compile_layers={}, attn_metadata=attn_meta)
        t0 = time.perf_counter()
        if conn is not None:
            conn.bind_connector_metadata(so.kv_connector_metadata)
            conn.start_load_kv(ctx)
        wrong = set()
        plan = {}
        for rid, n in so.num_scheduled_tokens.items():
            tokens = self.reqs[rid][0]
            start = computed[rid]
            plan[rid] = (start, n, prefix_ids(tokens[:start + n]), torch.arange(start + n))
        for li, name in enumerate(self.layer_names):
            kind = self.group_of.get(name, (0, "full_attention"))[1]
            if kind == "mamba":
                self._mamba_layer(li, name, plan, wrong)
                continue
            if conn is not None:
                self._hook("wait", name)
                conn.wait_for_layer_load(name)
            if self.layer_compute_s:
                time.sleep(self.layer_compute_s)
            self._attention_layer(li, name, plan, wrong)
            if conn is not None:
                self._hook("save", name)
                conn.save_kv_layer(name, self.kv_caches[name], attn_meta[name])
        kvo = None
        if conn is not None:
            conn.wait_for_save()
        self.forward_s = time.perf_counter() - t0
        if conn is not None:
            res = conn.get_transfer_results(set(so.finished_req_ids))
            kvo = KVConnectorOutput(finished_sending=res.finished_sending,
                                    finished_recving=res.finished_recving,
                                    invalid_block_ids=set(conn.get_block_ids_with_load_errors()),
                                    kv_cache_events=conn.get_kv_connector_kv_cache_events())
            conn.clear_connector_metadata()
        out = ModelRunnerOutput(req_ids=list(plan), kv_connector_output=kvo)
        last = [n for n in self.layer_names
                if self.group_of.get(n, (0, "full_attention"))[1] == "full_attention"][-1]
        for rid, (start, n, pre, pos) in plan.items():
            if start + n == len(self.reqs[rid][0]):
                ids = self._table(rid, last)
                bs = self.group_of[last][2] if self.hybrid else self.block_size
                blk = torch.tensor([ids[p // bs] for p in range(start + n)], dtype=torch.long)
                kv = self.slots[last].read(blk, pos % bs)
                data = kv.contiguous().view(torch.uint8).numpy().tobytes()
                out.sampled_token_ids[rid] = int.from_bytes(hashlib.sha256(data).digest()[:4],
                                                            "little") % 32000
        out.wrong_kv_block_ids = wrong
        return out

    def _hook(self, what, name):
        if self.record_hooks:
            self.hook_log.append((what, name))

    def _attention_layer(self, li, name, plan, wrong):
        slots = self.slots[name]
        _, kind, bs, window, _ = self.group_of.get(name, (0, "full_attention", self.block_size,
                                                          0, None))
        for rid, (start, n, pre, pos) in plan.items():
            ids = self._table(rid, name)
            first = max(0, start - window + 1) if kind == "sliding_window" else 0
            if self.verify and start > first:
                p = pos[first:start]
                blk = torch.tensor([ids[int(q) // bs] for q in p], dtype=torch.long)
                got = _bits(slots.read(blk, p % bs))
                want = _bits(self._kv(pre[first:start], li))
                bad = (got != want).reshape(start - first, -1).any(dim=1)
                wrong.update(int(b) for b in blk[bad].unique())
            p = pos[start:]
            blk = torch.tensor([ids[int(q) // bs] for q in p], dtype=torch.long)
            slots.write(blk, p % bs, self._kv(pre[start:], li))

    def _mamba_layer(self, li, name, plan, wrong):
        states = self.kv_caches[name]
        spec = self.group_of[name][4]
        bs = spec.block_size
        for rid, (start, n, pre, pos) in plan.items():
            ids = self._table(rid, name)
            if self.verify and start:
                blk = ids[(start - 1) // bs]
                for j, (shape, dt) in enumerate(zip(spec.shapes, spec.dtypes)):
                    want = expected_state(pre[start - 1], li * 8 + j, shape, dt)
                    if blk == 0 or not torch.equal(_bits(states[j][blk]), _bits(want)):
                        wrong.add(blk)
            blk = ids[(start + n - 1) // bs]
            for j, (shape, dt) in enumerate(zip(spec.shapes, spec.dtypes)):
                states[j][blk] = expected_state(pre[start + n - 1], li * 8 + j, shape, dt)

    def block_bytes(self, block_id):
        """Every layer's bytes of one block, layer after layer, each as MHA
        (K/V, tokens, heads, head) or MLA (tokens, head): the order of
        ENGINES.md's logical shapes, whatever the physical layout."""
        return b"".join(self.layer_block_bytes(n, block_id) for n in self.layer_names)

    def layer_block_bytes(self, name, block_id):
        """One layer's bytes of one block (a Mamba layer: its state tensors)."""
        if self.group_of.get(name, (0, "full_attention"))[1] == "mamba":
            return b"".join(t[block_id].contiguous().view(torch.uint8).numpy().tobytes()
                            for t in self.kv_caches[name])
        bs = self.group_of[name][2] if self.hybrid else self.block_size
        kv = self.slots[name].read(torch.full((bs,), block_id, dtype=torch.long),
                                   torch.arange(bs))
        if not self.mla:  # (tokens, K/V, heads, head) -> (K/V, tokens, heads, head)
            kv = kv.transpose(0, 1)
        return kv.contiguous().view(torch.uint8).numpy().tobytes()

    def shutdown(self):
        if self.connector is not None:
            self.connector.shutdown()


def _model_order(groups):
    """Layer names in model order (by the layer number in the name)."""
    import re

    names = [n for g in groups for n in g.layer_names]
    return sorted(names, key=lambda n: int(re.search(r"layers\.(\d+)\.", n).group(1)))
