"""Worker side of the vLLM connector: copies blocks between the paged KV
cache and kvpool pages.

Pages. In the default mode a page holds one block of every layer of one
KV-cache group (key: hash + group tag + rank suffix). In layer-wise mode a
page holds one layer's block (key: ... + "/L<index within the group>"), so a
layer can be loaded and saved on its own; the "/L0" page of a block is put
after every other layer's page of it succeeded and stands for the whole
block in lookups.

Threads. kvpool calls run on three single-thread lanes, so vLLM's thread
only queues work:
  layer  layer-wise loads of this step, one job per layer in model order;
         wait_for_layer_load(name) waits for that layer's job only.
  save   this step's saves: save_kv_layer queues the copy of the layer's
         blocks (and, layer-wise, the put of its pages); wait_for_save
         waits for what was queued, then does the rest on the calling
         thread, which waits for it anyway (a hop would only add a wake-up).
  async  loads vLLM asked for with load_kv_async (the request waits outside
         the batch); finished requests are reported by get_finished /
         get_transfer_results, in the same step as their failed blocks.
Default-mode loads run in start_load_kv itself, as do Mamba groups' loads in
layer-wise mode (vLLM's per-layer hooks run around attention layers only).
Layers whose save_kv_layer was never called are copied at wait_for_save,
when the forward pass has finished writing them.

Faults: a page that is missing, fails, or whose header does not match is
never copied into the KV cache; its block is reported by
get_block_ids_with_load_errors. For a hybrid model a request's load is all
or nothing (vLLM cannot recompute from a block whose sliding window or
recurrent state was never loaded), so one failed page reports every block
of that request's load.

vLLM calls this object from one thread; the lanes' jobs share state under
self._lock.
"""

import contextlib
import logging
import threading
from concurrent.futures import ThreadPoolExecutor

import torch

from . import _cuda
from . import _vllm_keys as keys_mod
from ._descriptors import Describer
from ._session import Session
from ._vllm_events import EventFactory, KvpoolKVEvents
from ._vllm_groups import MAMBA, NULL_BLOCK_ID
from ._vllm_layout import HEADER_BYTES, PageFormat, detect, detect_state, infer_num_blocks

logger = logging.getLogger("kvpool.integrations.vllm")

# Pages a load stages at once on the KV cache's device: a long hit is loaded
# in chunks, so its staging stays this small.
_LOAD_CHUNK_BYTES = 64 << 20


def worker_ranks(settings, parallel_config):
    try:
        from vllm.distributed.parallel_state import get_pp_group, get_tensor_model_parallel_rank

        return int(get_tensor_model_parallel_rank()), int(get_pp_group().rank_in_group)
    except Exception:  # not importable or not initialized: the worker's rank in the config
        rank = int(getattr(parallel_config, "rank", 0))
        return rank % settings.tp_size, (rank // settings.tp_size) % settings.pp_size


class _Unit:
    """The layers one page holds (LayerLayouts) and the key part naming it."""

    def __init__(self, group, layers, tag, names):
        self.group = group
        self.layers = layers
        self.tag = tag
        self.fmt = PageFormat(layers)
        self.names = names  # vLLM layer names of these layers
        self.commit = tag in (b"", keys_mod.layer_tag(0))
        self.label = "g%d%s" % (group.index, tag.decode())
        self.by_name = {}  # vLLM layer name -> its LayerLayouts
        for x in layers:
            self.by_name.setdefault(x.name.split("#")[0], []).append(x)


def _fence(layers):
    """An event recorded on the calling thread's stream, for layers on a GPU."""
    for layer in layers:
        if layer.device.type == "cuda":
            ev = torch.cuda.Event()
            ev.record(torch.cuda.current_stream(layer.device))
            return ev
    return None


class _Batch:
    """The blocks of one group to move for one or more requests."""

    def __init__(self, group):
        self.group = group
        self.block_ids = []
        self.hashes = []
        self.reqs = []  # request id per block
        self.infos = []  # event info per block, or None
        self.lora = []

    def add(self, tr):
        ok = len(tr.hashes) == len(tr.block_ids)
        infos = tr.events if tr.events and len(tr.events) == len(tr.block_ids) else None
        for i, b in enumerate(tr.block_ids):
            if b == NULL_BLOCK_ID:
                continue
            self.block_ids.append(b)
            self.hashes.append(tr.hashes[i] if ok else None)
            self.reqs.append(tr.req_id)
            self.infos.append(infos[i] if infos else None)
            self.lora.append(tr.lora_name)


class _SaveStep:
    """One step's saves: per group the blocks to store, per unit its staging."""

    def __init__(self, meta, batches):
        self.meta = meta
        self.batches = batches  # group index -> _Batch (blocks kvpool lacks, after begin)
        self.keep = {}  # group index -> positions in the batch to store
        self.present = {}  # group index -> positions kvpool already has
        self.staging = {}  # unit -> (n, page) tensor
        self.pending = {}  # unit -> layer names still to copy
        self.put_ok = {}  # unit -> list[bool] per kept position
        self.ids = {}  # (group index, device) -> block ids tensor of the kept blocks
        self.descs = {}  # group index -> block descriptor (or None) per kept position
        self.queue = []  # (unit, layer name, fence) told by save_kv_layer, not copied yet
        self.draining = False  # a _drain_saves job is queued or running
        self.futures = []


class WorkerSide:
    def __init__(self, settings, vllm_config, kv_cache_config):
        s = self._s = settings
        self.tp_rank, self.pp_rank = worker_ranks(s, vllm_config.parallel_config)
        self._session = Session(s.session, s.namespace, log=logger, register_cuda=True,
                                client_name="vllm worker tp%d pp%d" % (self.tp_rank,
                                                                       self.pp_rank))
        self._suffix = keys_mod.rank_suffix(s.use_mla, self.tp_rank, self.pp_rank)
        # MLA latents are identical on every TP rank: rank 0 writes them.
        self._writes = s.save and not (s.use_mla and self.tp_rank != 0)
        num_blocks = getattr(kv_cache_config, "num_blocks", None)
        if num_blocks is None:
            num_blocks = getattr(vllm_config.cache_config, "num_gpu_blocks", None)
        self._num_blocks = num_blocks
        self._units = None  # group index -> [_Unit]; None: disabled
        self._unit_of = {}  # vLLM layer name -> _Unit
        self._order = []  # layer names in registration (model) order
        self._lock = threading.Lock()
        self._lanes = {}
        self._streams = {}
        self._buffers = {}
        self._load_errors = set()  # guarded by _lock
        self._events = []  # (kind, event), guarded by _lock
        self._async_done = []  # (req id, failed block ids, events), guarded by _lock
        self._layer_loads = {}  # layer name -> Future (this step)
        self._step_loads = []  # Futures of this step's layer-wise loads
        self._save = None
        self._factory = EventFactory(s.event_medium, s.locality) if s.events else None
        # Each page put names its block as vLLM's own events would (the
        # scheduler's event info of the block: _vllm_events.block_info).
        self._describer = Describer(s.descriptors, logger)
        if self._factory is not None and not self._factory.enabled:
            self._factory = None
        self.stats = {"loaded_blocks": 0, "load_errors": 0, "saved_blocks": 0,
                      "skipped_saves": 0, "failed_saves": 0, "async_loads": 0}

    # ---- setup ----
    def register_kv_caches(self, kv_caches):
        s = self._s
        if s.groups is None or not s.usable:
            logger.error("kvpool connector disabled: %s", s.disabled_reason)
            return
        num_blocks = self._num_blocks or infer_num_blocks(
            [t for t in kv_caches.values() if isinstance(t, torch.Tensor)], s.block_size)
        units = {}
        try:
            for g in s.groups:
                if s.hybrid:
                    names = [n for n in g.layer_names if n in kv_caches]
                else:  # one group: every layer, in registration order (the page format)
                    names = list(kv_caches)
                per_layer = []
                for n in names:
                    value = kv_caches[n]
                    if g.kind == MAMBA:
                        tensors = list(value) if isinstance(value, (list, tuple)) else [value]
                        per_layer.append((n, [detect_state("%s#%d" % (n, j), t, num_blocks)
                                              for j, t in enumerate(tensors)]))
                    else:
                        per_layer.append((n, [detect(n, value, num_blocks, g.block_size,
                                                     s.use_mla)]))
                if s.layerwise:
                    units[g.index] = [_Unit(g, lays, keys_mod.layer_tag(i), [n])
                                      for i, (n, lays) in enumerate(per_layer)]
                    if not units[g.index]:  # no layer here: a header-only marker page
                        units[g.index] = [_Unit(g, [], keys_mod.layer_tag(0), [])]
                else:
                    units[g.index] = [_Unit(g, [x for _, lays in per_layer for x in lays], b"",
                                            [n for n, _ in per_layer])]
        except ValueError as e:
            logger.error("kvpool connector disabled: %s", e)
            return
        if not any(u.layers for us in units.values() for u in us):
            return
        self._units = units
        self._order = list(kv_caches)
        self._unit_of = {n: u for us in units.values() for u in us for n in u.names}
        logger.info("kvpool connector: rank tp%d/pp%d, %s, namespace %s", self.tp_rank,
                    self.pp_rank, "; ".join("%s: %s" % (u.label, u.fmt.describe())
                                            for us in units.values() for u in us[:1]),
                    s.namespace)

    # ---- helpers ----
    def _lane(self, name):
        lane = self._lanes.get(name)
        if lane is None:
            lane = self._lanes[name] = ThreadPoolExecutor(1, "kvpool-vllm-" + name)
        return lane

    def _key(self, unit, h):
        return h + keys_mod.group_tag(self._s.hybrid, unit.group.index) + unit.tag + self._suffix

    def _count(self, name, n):
        if n:
            with self._lock:
                self.stats[name] += n

    def _staging(self, slot, n, row, device=None):
        """(n, row) rows (host memory unless `device`), reused across steps
        (fresh memory would cost a page fault per 4 KiB on every step). Each
        slot belongs to one lane."""
        buf = self._buffers.get(slot)
        if buf is None or buf.shape[0] < n or buf.shape[1] != row:
            buf = torch.empty((max(n, 16), row), dtype=torch.uint8, device=device)
            self._buffers[slot] = buf
        return buf[:n]

    def _fetch(self, lane, unit, keys, row):
        """The pages of `keys` as (n, row) rows and one status per key (0:
        OK), or (None, None) when the call failed. Runs in the lane's stream
        context (_device). A client that maps the node's segment copies each
        page straight from the segment, while it is pinned, into rows on the
        layers' device: a DMA when the segment is registered with CUDA
        (_cuda), asynchronous on the lane's stream, waited for before the pages
        are released. Else kvpool_get copies the pages into host rows."""
        layer_devices = {layer.device for layer in unit.layers}
        device = layer_devices.pop() if len(layer_devices) == 1 else torch.device("cpu")

        def in_place(c):
            rows = self._staging((lane, "load", unit.label, str(device)), len(keys), row, device)
            reg = self._session.segment_registration
            statuses, done = [], []
            with c.acquire(keys) as regions:
                try:
                    for j, r in enumerate(regions):
                        if r is None or r[1] != row:
                            statuses.append(1)
                            continue
                        statuses.append(0)
                        done.append(_cuda.copy_into(rows[j], _cuda.host_view(r[0], row),
                                                    reg.covers(r[0], row)))
                finally:
                    for d in done:  # before the pages are released
                        _cuda.wait(d)
            return rows, statuses

        def copied(c):
            rows = self._staging((lane, "load", unit.label), len(keys), row)
            base = rows.data_ptr()
            ptrs = [base + j * row for j in range(len(keys))]
            return rows, c.get_ptrs(keys, ptrs, [row] * len(keys))

        return self._session.call(lambda c: in_place(c) if c.maps_segment else copied(c),
                                  (None, None), "load")

    @contextlib.contextmanager
    def _device(self, lane, layers):
        """Runs GPU work on `layers` on this lane's own stream, after what the
        calling thread's stream had queued, and waits for it at the end (also
        when it raises), so a finished job's blocks are in place and its
        staging rows free."""
        dev = next((x.device for x in layers if x.device.type == "cuda"), None)
        if dev is None:
            yield
            return
        stream = self._streams.get((lane, dev))
        if stream is None:
            stream = self._streams[(lane, dev)] = torch.cuda.Stream(dev)
        stream.wait_stream(torch.cuda.current_stream(dev))
        try:
            with torch.cuda.stream(stream):
                yield
        finally:
            stream.synchronize()

    def _read(self, lane, unit, batch):
        """Loads the unit's pages of `batch` into its layers, at most
        _LOAD_CHUNK_BYTES of pages at a time (the staging rows on the layers'
        device stay that small); the positions in the batch that failed."""
        n = len(batch.block_ids)
        bad = {i for i, h in enumerate(batch.hashes) if h is None}
        idx = [i for i in range(n) if i not in bad]
        per = max(1, _LOAD_CHUNK_BYTES // max(1, unit.fmt.page_bytes))
        for start in range(0, len(idx), per):
            bad |= self._read_chunk(lane, unit, batch, idx[start:start + per])
        return bad

    def _read_chunk(self, lane, unit, batch, idx):
        """_read of the batch positions `idx`; the ones that failed."""
        keys = [self._key(unit, batch.hashes[i]) for i in idx]
        fmt = unit.fmt
        row = fmt.page_bytes
        with self._device(lane, unit.layers):
            staging, statuses = self._fetch(lane, unit, keys, row)
            if statuses is None:
                return set(idx)
            want = fmt.header_rows(keys).to(staging.device)
            header_ok = (staging[:, :HEADER_BYTES] == want).all(dim=1).tolist()
            good = [j for j, st in enumerate(statuses) if st == 0 and header_ok[j]]
            bad = {idx[j] for j in set(range(len(keys))) - set(good)}
            if good and unit.layers:
                rows = staging
                if len(good) < len(keys):
                    rows = staging.index_select(
                        0, torch.tensor(good, dtype=torch.long, device=staging.device))
                for layer in unit.layers:
                    ids = torch.tensor([batch.block_ids[idx[j]] for j in good], dtype=torch.long,
                                       device=layer.device)
                    layer.scatter(ids, fmt.layer_view(rows, layer).to(layer.device))
        return bad

    def _batches(self, transfers):
        out = {}
        for tr in transfers:
            g = self._s.groups[tr.group] if 0 <= tr.group < len(self._s.groups) else None
            if g is None:
                continue
            out.setdefault(g.index, _Batch(g)).add(tr)
        return out

    def _finish_loads(self, batches, failed):
        """Reports a load's failed blocks (failed: group index -> positions);
        returns the events of the loaded ones. Hybrid models fail a request's
        whole load when any of its pages failed."""
        if self._s.hybrid:
            bad_reqs = {b.reqs[i] for gi, b in batches.items() for i in failed.get(gi, ())}
            for gi, b in batches.items():
                failed[gi] = {i for i, r in enumerate(b.reqs) if r in bad_reqs}
        errors, events, loaded = set(), [], 0
        for gi, b in batches.items():
            for i, bid in enumerate(b.block_ids):
                if i in failed.get(gi, ()):
                    errors.add(bid)
                else:
                    loaded += 1
                    if self._factory is not None and b.infos[i] is not None:
                        events.append(("load", self._factory.stored(b.infos[i], b.group,
                                                                    b.lora[i])))
        self._count("loaded_blocks", loaded)
        self._count("load_errors", len(errors))
        return errors, events

    # ---- loads ----
    def start_load_kv(self, meta):
        # vLLM's dummy runs bind a bare KVConnectorMetadata.
        transfers = getattr(meta, "loads", None) or ()
        self._join_loads()
        if not transfers:
            return
        sync, by_req = [], {}
        for tr in transfers:
            if getattr(tr, "load_async", False):
                by_req.setdefault(tr.req_id, []).append(tr)
            else:
                sync.append(tr)
        for req_id, trs in by_req.items():  # one background job per request
            self._count("async_loads", 1)
            self._lane("async").submit(self._async_job, req_id, self._batches(trs))
        if not sync:
            return
        batches = self._batches(sync)
        if self._units is None:
            errors, _ = self._finish_loads(batches, {gi: set(range(len(b.block_ids)))
                                                     for gi, b in batches.items()})
            with self._lock:
                self._load_errors |= errors
            return
        failed = {gi: set() for gi in batches}
        lazy = []
        for gi, b in batches.items():
            for unit in self._units[gi]:
                if self._s.layerwise and b.group.kind != MAMBA and unit.layers:
                    lazy.append(unit)
                else:
                    failed[gi] |= self._read("main", unit, b)
        if not lazy:
            self._report_loads(batches, failed)
            return
        lazy.sort(key=lambda u: min((self._order.index(n) for n in u.names),
                                    default=len(self._order)))
        lane = self._lane("layer")
        futures = []
        for unit in lazy:
            f = lane.submit(self._load_layer_job, unit, batches[unit.group.index], failed)
            futures.append(f)
            for n in unit.names:
                self._layer_loads[n] = f
        # Errors and events once every layer is in (a job on the same lane).
        futures.append(lane.submit(self._report_loads, batches, failed))
        self._step_loads = futures

    def _load_layer_job(self, unit, batch, failed):
        try:
            bad = self._read("layer", unit, batch)
        except Exception as e:  # never reaches vLLM: the blocks are load errors
            self._session.failed("load", e)
            bad = set(range(len(batch.block_ids)))
        with self._lock:
            failed[unit.group.index] |= bad

    def _report_loads(self, batches, failed):
        errors, events = self._finish_loads(batches, failed)
        with self._lock:
            self._load_errors |= errors
            self._events.extend(events)

    def wait_for_layer_load(self, layer_name):
        f = self._layer_loads.pop(layer_name, None)
        if f is not None:
            f.result()

    def _join_loads(self):
        futures, self._step_loads = self._step_loads, []
        self._layer_loads = {}
        for f in futures:
            f.result()

    def _async_job(self, req_id, batches):
        failed = {gi: set() for gi in batches}
        try:
            for gi, b in batches.items():
                for unit in (self._units or {}).get(gi, ()):
                    failed[gi] |= self._read("async", unit, b)
                if self._units is None:
                    failed[gi] = set(range(len(b.block_ids)))
        except Exception as e:
            self._session.failed("load", e)
            failed = {gi: set(range(len(b.block_ids))) for gi, b in batches.items()}
        errors, events = self._finish_loads(batches, failed)
        with self._lock:
            self._async_done.append((req_id, errors, events))

    def transfer_results(self):
        """(finished_recving, failed_recving) of asynchronous loads finished
        since the last call; their failed blocks join the load errors."""
        self._join_loads()
        with self._lock:
            done, self._async_done = self._async_done, []
            recving, failed = set(), set()
            for req_id, errors, events in done:
                recving.add(req_id)
                if errors:
                    failed.add(req_id)
                    self._load_errors |= errors
                self._events.extend(events)
        return recving, failed

    def take_load_errors(self):
        self._join_loads()
        with self._lock:
            errors, self._load_errors = self._load_errors, set()
        return errors

    # ---- saves ----
    def save_kv_layer(self, meta, layer_name):
        step = self._save_step(meta)
        if step is None:
            return
        unit = self._unit_of.get(layer_name)
        if unit is None or unit.group.index not in step.batches:
            return
        fence = _fence(unit.layers)
        with self._lock:
            step.queue.append((unit, layer_name, fence))
            if step.draining:  # the running job takes this layer too
                return
            step.draining = True
        step.futures.append(self._lane("save").submit(self._drain_saves, step))

    def _drain_saves(self, step):
        """Copies the layers save_kv_layer told, in order, until none is left:
        one job per layer while the model computes between them, one for a
        run of layers told while the lane was busy (no per-layer hand-off)."""
        while True:
            with self._lock:
                jobs, step.queue = step.queue, []
                if not jobs:
                    step.draining = False
                    return
            for unit, layer_name, fence in jobs:
                self._save_layer_job(step, unit, layer_name, fence)

    def _save_step(self, meta):
        if not self._writes or self._units is None or not getattr(meta, "saves", None):
            return None
        if self._save is None or self._save.meta is not meta:  # first layer of this step
            if self._save is not None:  # the previous step never reached wait_for_save
                self.wait_for_save()
            batches = self._batches(meta.saves)
            batches = {gi: b for gi, b in batches.items() if b.block_ids}
            self._save = step = _SaveStep(meta, batches)
            step.futures.append(self._lane("save").submit(self._begin_save_job, step))
        return self._save

    def _begin_save_job(self, step):
        """Drops blocks kvpool already has (their commit page exists) and
        prepares each unit's staging with page headers."""
        try:
            self._begin_save(step)
        except Exception as e:
            self._session.failed("save", e)
            step.keep = {gi: [] for gi in step.batches}

    def _begin_save(self, step):
        for gi, b in step.batches.items():
            commit = next(u for u in self._units[gi] if u.commit)
            keys = [self._key(commit, h) for h in b.hashes]
            present = self._session.call(lambda c: c.exists(keys), None, "exists")
            if present is None:  # kvpool down: nothing to save into
                self._count("failed_saves", len(keys))
                step.keep[gi] = []
                continue
            step.keep[gi] = [i for i, p in enumerate(present) if not p]
            step.present[gi] = [i for i, p in enumerate(present) if p]
            self._count("skipped_saves", len(keys) - len(step.keep[gi]))
            for unit in self._units[gi]:
                kept = [b.hashes[i] for i in step.keep[gi]]
                staging = self._staging(("save", unit.label), len(kept), unit.fmt.page_bytes)
                if kept:
                    staging[:, :HEADER_BYTES] = unit.fmt.header_rows(
                        [self._key(unit, h) for h in kept])
                step.staging[unit] = staging
                step.pending[unit] = set(unit.names)

    def _save_layer_job(self, step, unit, layer_name, fence):
        try:
            self._copy_layer(step, unit, layer_name, fence)
            if not step.pending.get(unit) and not unit.commit and unit not in step.put_ok:
                self._put_unit(step, unit)
        except Exception as e:
            self._session.failed("save", e)
            step.put_ok[unit] = [False] * len(step.keep.get(unit.group.index, ()))

    def _copy_layer(self, step, unit, layer_name, fence):
        pending = step.pending.get(unit)
        keep = step.keep.get(unit.group.index)
        if not pending or layer_name not in pending:
            return
        pending.discard(layer_name)
        if not keep:
            return
        b = step.batches[unit.group.index]
        staging = step.staging[unit]
        layers = unit.by_name.get(layer_name, ())
        if fence is not None:
            fence.synchronize()
        with self._device("save", layers):
            for layer in layers:
                ids = step.ids.get((unit.group.index, layer.device))
                if ids is None:
                    ids = step.ids[(unit.group.index, layer.device)] = torch.tensor(
                        [b.block_ids[i] for i in keep], dtype=torch.long, device=layer.device)
                layer.gather_into(ids, unit.fmt.layer_view(staging, layer))

    def _descriptors(self, step, gi):
        """The block descriptor of each kept block of group gi (None where
        it has none), built once per step: every page of a block (each
        layer-wise unit, each rank) carries the same one."""
        descs = step.descs.get(gi)
        if descs is None:
            b = step.batches[gi]
            descs = []
            for i in step.keep.get(gi, []):
                info = b.infos[i]
                if info is None or not self._describer.enabled:
                    descs.append(None)
                    continue
                h, parent, tokens = info
                descs.append(self._describer.make(h, b.group.block_size, tokens, parent,
                                                  b.group.index, b.lora[i], b.group.kind))
            step.descs[gi] = descs
        return descs

    def _put_unit(self, step, unit, only=None):
        """Puts the unit's pages of the kept blocks (positions in `only`, else
        all), each with its block's descriptor; records one success flag per
        kept block."""
        gi = unit.group.index
        keep = step.keep.get(gi, [])
        sel = [j for j in range(len(keep)) if only is None or j in only]
        ok = [False] * len(keep)
        if sel:
            b = step.batches[gi]
            keys = [self._key(unit, b.hashes[keep[j]]) for j in sel]
            staging = step.staging[unit]
            row = unit.fmt.page_bytes
            base = staging.data_ptr()
            ptrs = [base + j * row for j in sel]
            every = self._descriptors(step, gi)
            descs = [every[j] for j in sel]
            put = self._describer.put_ptrs
            statuses = self._session.call(lambda c: put(c, keys, ptrs, [row] * len(keys), descs),
                                          None, "save")
            for j, st in zip(sel, statuses or ()):
                ok[j] = st == 0
        step.put_ok[unit] = ok

    def _finish_save_job(self, step, fence):
        if fence is not None:
            fence.synchronize()
        for gi in step.batches:
            try:
                self._finish_group(step, gi)
            except Exception as e:
                self._session.failed("save", e)

    def _finish_group(self, step, gi):
        """Copies the layers save_kv_layer did not report, puts the pages not
        put yet, then the commit pages of the blocks whose other pages all
        succeeded."""
        units = self._units[gi]
        for unit in units:
            for name in list(step.pending.get(unit, ())):
                self._copy_layer(step, unit, name, None)
            if not unit.commit and unit not in step.put_ok:
                self._put_unit(step, unit)
        keep = step.keep.get(gi, [])
        others = [step.put_ok[u] for u in units if not u.commit]
        whole = {j for j in range(len(keep)) if all(ok[j] for ok in others)}
        commit = next(u for u in units if u.commit)
        self._put_unit(step, commit, whole)
        done = [j for j in sorted(whole) if step.put_ok[commit][j]]
        self._count("saved_blocks", len(done))
        self._count("failed_saves", len(keep) - len(done))
        if self._factory is not None:  # blocks stored now or found stored, in block order
            b = step.batches[gi]
            have = sorted([keep[j] for j in done] + step.present.get(gi, []))
            events = [("save", self._factory.stored(b.infos[i], b.group, b.lora[i]))
                      for i in have if b.infos[i] is not None]
            with self._lock:
                self._events.extend(events)

    def wait_for_save(self):
        """Waits for the save lane's jobs of this step, then copies the layers
        never told and puts the remaining pages on this thread."""
        self._join_loads()
        step, self._save = self._save, None
        if step is None:
            return
        fence = _fence([x for gi in step.batches for u in self._units[gi] for x in u.layers])
        for f in step.futures:
            f.result()
        self._finish_save_job(step, fence)

    # ---- events, shutdown ----
    def take_events(self):
        """This step's KV events as a KvpoolKVEvents (also when empty, so
        that merging counts every worker); None when events are off."""
        if self._factory is None:
            return None
        with self._lock:
            events, self._events = self._events, []
        return KvpoolKVEvents(events, writer=self._writes)

    def close(self):
        try:
            self.wait_for_save()
            self._join_loads()
        except Exception:
            pass
        for lane in self._lanes.values():
            lane.shutdown(wait=True)
        self._lanes = {}
        self._buffers = {}
        self._session.close()
