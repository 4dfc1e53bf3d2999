"""Block descriptors of the three connectors, end to end: each engine
stand-in drives its connector as ENGINES.md says the engine does, against a
real kvpool-node publishing KV events, and every BlockStored the node tells
about a page the connector put must name that page's block the engine's
way, byte for byte (descriptor_events.check_pages): the engine's hash,
parent, token ids and block size (plus, for vLLM, group_idx, the spec kind
and the LoRA name), once per page put.

The expected values come from the engines' side, computed here:
  vLLM     request.block_hashes (the stand-in scheduler's prefix-cache
           hashes, bytes) as vLLM's events carry them: an int of the low 64
           bits, big-endian (bytes under VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0);
           the parent the previous block of the group; the block's tokens.
  SGLang   the page hashes the controller passes (get_hash_str, hex) as
           SGLang's radix-cache events write them: the signed int64 of the
           digest's first 8 bytes, big-endian; the parent the previous page;
           no tokens (the storage interface hands none).
  LMCache  the key's chunk_hash; no parent, no tokens (the remote connector
           interface hands neither); block_size the chunk's tokens.
Negative controls: the connector with block_descriptors off, and a wrong
expected hash, fail the same check."""

import json
from types import SimpleNamespace as NS

import pytest

import test_lmcache as lmt
from descriptor_events import EventTap, check_pages, decodes_everywhere, events_node, stored
from vllm_util import BS, env, prompt  # noqa: F401 (env: the engines fixture)

# ---------------------------------------------------------------- fixtures


@pytest.fixture(params=["map", "array"])
def encoding(request):
    return request.param


@pytest.fixture
def tap_factory(node_factory, caplog):
    """make(encoding, hash mode) -> (node, started EventTap). Afterwards: no
    connector in this process fell back to a put without descriptors (the
    node took every described put as it was)."""
    taps = []

    def make(encoding="map", hash_mode="int64"):
        node, endpoint = events_node(node_factory, encoding, hash_mode)
        tap = EventTap(node, endpoint).start()
        taps.append(tap)
        return node, tap

    caplog.set_level("WARNING")
    yield make
    for t in taps:
        t.close()
    fell_back = [r.getMessage() for r in caplog.get_records("call")
                 if "descriptor" in r.getMessage()]
    assert not fell_back, fell_back


# ---------------------------------------------------------------- vLLM

PLAIN = dict(layer_types=None)


def low64(h):
    return int.from_bytes(bytes(h)[-8:], "big")


def vllm_expected(encoding, req, blocks, group=0, kind="full_attention", block_size=BS,
                  pages=1, lora=None, as_bytes=False, hash_of=low64):
    """The BlockStored of blocks `blocks` of a request's group, each told
    `pages` times (one per page put: ranks x layer-wise units)."""
    hs = req.block_hashes
    conv = (lambda h: bytes(h)) if as_bytes else hash_of
    out = []
    for i in blocks:
        ev = stored(encoding, conv(hs[i]), conv(hs[i - 1]) if i else None,
                    req.all_token_ids[i * block_size:(i + 1) * block_size], block_size,
                    lora=lora, group=group, kind=kind)
        out.append((ev, pages))
    return out


def test_vllm_pages_name_the_engine_blocks(env, tap_factory, encoding):
    node, tap = tap_factory(encoding)
    toks = prompt(13)
    a = env.engine(env.config(node.socket, **PLAIN))
    ra = env.Request("a", toks, max_tokens=2)
    a.run([ra])
    # Step 1 stored blocks 0-2 (12 of the 13 prompt tokens).
    events = tap.collect()
    check_pages(events, vllm_expected(encoding, ra, range(3)))
    decodes_everywhere(tap.last_payloads)
    # A second instance loads blocks 0-2 and stores block 3 only, chained on block 2.
    b = env.engine(env.config(node.socket, **PLAIN))
    rb = env.Request("b", toks + [5, 6, 7, 8], max_tokens=1)
    b.run([rb])
    assert b.scheduler.external_hits["b"] == 12
    events = tap.collect()
    check_pages(events, vllm_expected(encoding, rb, [3]))
    assert rb.block_hashes[:3] == ra.block_hashes[:3]


def test_vllm_negative_controls(env, tap_factory):
    node, tap = tap_factory("map")
    toks = prompt(13)
    off = env.engine(env.config(node.socket, extra={"block_descriptors": False}, **PLAIN))
    r = env.Request("off", toks, max_tokens=1)
    off.run([r])
    events = tap.collect()
    # Three pages were put, told by their key ids: the check must fail.
    assert sum(len(ev["block_hashes"]) for _, ev in events) == 3
    with pytest.raises(AssertionError, match="differ"):
        check_pages(events, vllm_expected("map", r, range(3)))
    # Described pages, but the check expecting another hash (the first 8
    # bytes instead of vLLM's last 8) fails too; the right one passes.
    on = env.engine(env.config(node.socket, **PLAIN))
    r2 = env.Request("on", prompt(13, start=3000), max_tokens=1)
    on.run([r2])
    events = tap.collect()
    with pytest.raises(AssertionError, match="differ"):
        check_pages(events, vllm_expected("map", r2, range(3),
                                          hash_of=lambda h: int.from_bytes(h[:8], "big")))
    check_pages(events, vllm_expected("map", r2, range(3)))


def test_vllm_descriptors_agree_with_the_connectors_own_events(env, tap_factory):
    # The connector's own BlockStored (take_events) and the node's event of
    # the page it put say the same of each block.
    node, tap = tap_factory("map")
    lora = NS(lora_name="adapter-a", lora_int_id=1)
    e = env.engine(env.config(node.socket, events=True, **PLAIN))
    r = env.Request("a", prompt(17), max_tokens=1, lora_request=lora)
    e.run([r])
    events = tap.collect()
    check_pages(events, vllm_expected("map", r, range(4), lora="adapter-a"))
    own = [ev for batch in e.scheduler.kv_event_batches for ev in batch]
    node_said = [ev for _, ev in events]
    assert len(own) == 4
    assert sorted(repr((o.block_hashes, o.parent_block_hash, o.token_ids, o.block_size,
                        o.lora_name, o.group_idx, o.kv_cache_spec_kind)) for o in own) == \
        sorted(repr((n["block_hashes"], n["parent_block_hash"], n["token_ids"],
                     n["block_size"], n["lora_name"], n["group_idx"], n["kv_cache_spec_kind"]))
               for n in node_said)


def test_vllm_hybrid_groups(env, tap_factory):
    node, tap = tap_factory("map")
    toks = prompt(49)
    a = env.engine(env.config(node.socket))
    ra = env.Request("a", toks, max_tokens=1)
    a.run([ra])
    # Full blocks 0-11, the sliding window's blocks 10-11 and the Mamba
    # state block 11, each chained within its group on the previous block.
    check_pages(tap.collect(),
                vllm_expected("map", ra, range(12))
                + vllm_expected("map", ra, (10, 11), group=1, kind="sliding_window")
                + vllm_expected("map", ra, [11], group=2, kind="mamba"))


def test_vllm_every_page_of_a_block_carries_it(env, tap_factory):
    # Layer-wise: one page per layer (4), each with the block's descriptor.
    node, tap = tap_factory("map")
    e = env.engine(env.config(node.socket, extra={"layerwise": True}, num_layers=4, **PLAIN))
    r = env.Request("lw", prompt(9), max_tokens=1)
    e.run([r])
    check_pages(tap.collect(), vllm_expected("map", r, range(2), pages=4))


def test_vllm_tp2_ranks_put_the_same_descriptor(env, tap_factory):
    node, tap = tap_factory("map")
    e = env.engine(env.config(node.socket, tp=2, **PLAIN))
    r = env.Request("tp", prompt(13), max_tokens=1)
    e.run([r])
    check_pages(tap.collect(), vllm_expected("map", r, range(3), pages=2))


def test_vllm_byte_hashes(env, tap_factory, monkeypatch):
    # VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0: vLLM's events carry the hash
    # bytes; a node writing hashes as written tells those bytes, one in its
    # default int64 mode their last 8 bytes (vLLM's int hash).
    monkeypatch.setenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "0")
    node, tap = tap_factory("map", "as-written")
    e = env.engine(env.config(node.socket, **PLAIN))
    r = env.Request("b", prompt(9), max_tokens=1)
    e.run([r])
    check_pages(tap.collect(), vllm_expected("map", r, range(2), as_bytes=True))
    node2, tap2 = tap_factory("map", "int64")
    e2 = env.engine(env.config(node2.socket, **PLAIN))
    r2 = env.Request("b2", prompt(9), max_tokens=1)
    e2.run([r2])
    check_pages(tap2.collect(), vllm_expected("map", r2, range(2)))


# ---------------------------------------------------------------- SGLang


def sglang_hash(h):
    """SGLang's event hash of a page hash: signed int64 of its first 8 bytes."""
    return int.from_bytes(bytes.fromhex(h)[:8], "big", signed=True)


def sglang_expected(encoding, hashes, page_size, pieces=2, first_parent=None, roots=(0,),
                    hash_of=sglang_hash):
    """One event per page, `pieces` times; pages whose index is in `roots`
    have no parent unless it is page 0 and first_parent is given."""
    out = []
    for i, h in enumerate(hashes):
        if i in roots:
            parent = first_parent if i == 0 else None
        else:
            parent = hash_of(hashes[i - 1])
        out.append((stored(encoding, hash_of(h), parent, [], page_size), pieces))
    return out


@pytest.fixture
def sg(standins_on_path):
    import sglang_util

    return sglang_util


def _controller(sg, socket, kind="mha", layout="page_first", v1=True, **extra):
    return sg.make_controller(sg.make_pool(kind, layout), socket, v1=v1, extra=extra)


@pytest.mark.parametrize("kind,v1,layout", [("mha", True, "page_first"),
                                            ("mla", True, "page_first_direct"),
                                            ("mha", False, "layer_first")],
                         ids=["mha-zero-copy", "mla-zero-copy", "mha-generic"])
def test_sglang_pages_name_the_engine_pages(sg, tap_factory, encoding, kind, v1, layout):
    node, tap = tap_factory(encoding)
    ctrl = _controller(sg, node.socket, kind, layout, v1)
    try:
        _, toks, op = sg.write_pages(ctrl, 6, seed=1)
        assert op.ok and op.hashes == ctrl.page_hashes(toks)
        events = tap.collect()
        check_pages(events, sglang_expected(encoding, op.hashes, sg.PAGE,
                                            pieces=1 if kind == "mla" else 2))
        decodes_everywhere(tap.last_payloads)
        assert any(sglang_hash(h) < 0 for h in op.hashes)  # signed, as SGLang's are
    finally:
        ctrl.detach_storage_backend()


@pytest.mark.parametrize("pass_prefix", [True, False])
def test_sglang_parent_across_batches(sg, tap_factory, pass_prefix):
    # 130 pages: batches of 128 and 2. The second batch's first page gets its
    # parent from the prefix keys SGLang passes with
    # hicache_storage_pass_prefix_keys; without them it has none known.
    node, tap = tap_factory("map")
    extra = {"hicache_storage_pass_prefix_keys": True} if pass_prefix else {}
    ctrl = _controller(sg, node.socket, **extra)
    try:
        _, _, op = sg.write_pages(ctrl, 130, seed=2)
        assert op.ok
        roots = (0,) if pass_prefix else (0, 128)
        check_pages(tap.collect(), sglang_expected("map", op.hashes, sg.PAGE, roots=roots))
    finally:
        ctrl.detach_storage_backend()


def test_sglang_mla_rank1_writes_nothing_and_negative_controls(sg, tap_factory):
    node, tap = tap_factory("map")
    rank1 = sg.make_controller(sg.make_pool("mla"), node.socket, tp_rank=1, tp_size=2)
    off = _controller(sg, node.socket, block_descriptors=False)
    try:
        sg.write_pages(rank1, 3, seed=3)
        assert tap.collect() == []
        _, _, op = sg.write_pages(off, 3, seed=4)
        events = tap.collect()
        assert sum(len(ev["block_hashes"]) for _, ev in events) == 6  # K and V of 3 pages
        with pytest.raises(AssertionError, match="differ"):
            check_pages(events, sglang_expected("map", op.hashes, sg.PAGE))
        # Described pages checked against the last 8 bytes (vLLM's rule) fail.
        on = _controller(sg, node.socket)
        try:
            _, _, op2 = sg.write_pages(on, 3, seed=5, start=50000)
            events = tap.collect()
            with pytest.raises(AssertionError, match="differ"):
                check_pages(events, sglang_expected(
                    "map", op2.hashes, sg.PAGE,
                    hash_of=lambda h: int.from_bytes(bytes.fromhex(h)[-8:], "big")))
            check_pages(events, sglang_expected("map", op2.hashes, sg.PAGE))
        finally:
            on.detach_storage_backend()
    finally:
        rank1.detach_storage_backend()
        off.detach_storage_backend()


def test_sglang_hybrid_kv_pages_only(sg, tap_factory):
    # A hybrid model: the KV pages are described; the side pools' pages
    # (Mamba, SWA, indexer) are not SGLang blocks and are told by key id.
    node, tap = tap_factory("map")
    ctrl = sg.make_hybrid_controller(node.socket, extra={"hicache_storage_pass_prefix_keys": True})
    try:
        _, _, _, op = sg.write_hybrid(ctrl, 5, seed=6)
        assert op.ok
        events = tap.collect()
        described = [(raw, ev) for raw, ev in events if ev["block_size"]]
        check_pages(described, sglang_expected("map", op.hashes, sg.PAGE))
        side = [ev for _, ev in events if not ev["block_size"]]
        assert side and all(ev["parent_block_hash"] is None and ev["token_ids"] == []
                            for ev in side)
    finally:
        ctrl.detach_storage_backend()


# ---------------------------------------------------------------- LMCache

@pytest.fixture(params=lmt.CONTRACTS)
def lm(request, standins_on_path, monkeypatch):
    yield from lmt.contract_modules(request.param, monkeypatch)


@pytest.fixture
def engines():
    yield from lmt.closing_engines()


def lmcache_expected(encoding, keys, tokens, entries=2):
    """One event per chunk entry (payload part and header)."""
    out = []
    for i, k in enumerate(keys):
        ntok = min(lmt.CHUNK, len(tokens) - i * lmt.CHUNK)
        out.append((stored(encoding, k.chunk_hash, None, [], ntok), entries))
    return out


def test_lmcache_chunks_name_the_engine_chunks(lm, tap_factory, engines, encoding):
    node, tap = tap_factory(encoding)
    e = lmt.new_engine(engines, lm, lmt.make_config(lm, node.socket), lmt.make_metadata(lm))
    keys, _ = e.store(lmt.TOKENS)  # three full chunks and a 5-token one
    assert e.connector.stats["stored"] == 4
    events = tap.collect()
    check_pages(events, lmcache_expected(encoding, keys, lmt.TOKENS))
    decodes_everywhere(tap.last_payloads)
    assert any(k.chunk_hash >= 1 << 63 for k in keys)  # an unsigned 64-bit hash as is


def test_lmcache_negative_controls(lm, tap_factory, engines):
    node, tap = tap_factory("map")
    off = lmt.new_engine(engines, lm, lmt.make_config(lm, node.socket, block_descriptors=False),
                         lmt.make_metadata(lm))
    keys, _ = off.store(lmt.TOKENS)
    events = tap.collect()
    assert sum(len(ev["block_hashes"]) for _, ev in events) == 8
    with pytest.raises(AssertionError, match="differ"):
        check_pages(events, lmcache_expected("map", keys, lmt.TOKENS))
    on = lmt.new_engine(engines, lm, lmt.make_config(lm, node.socket), lmt.make_metadata(lm))
    toks = list(range(9000, 9000 + 2 * lmt.CHUNK))
    keys2, _ = on.store(toks)
    events = tap.collect()
    wrong = [(stored("map", k.chunk_hash ^ 1, None, [], lmt.CHUNK), 2) for k in keys2]
    with pytest.raises(AssertionError, match="differ"):
        check_pages(events, wrong)
    check_pages(events, lmcache_expected("map", keys2, toks))


# ---------------------------------------------------------------- never costs a page


def test_a_put_the_library_refuses_with_descriptors_is_made_without(standins_on_path):
    import logging

    from kvpool import KvpoolError, StatusCode
    from kvpool.descriptor import BlockDescriptor
    from kvpool.integrations._descriptors import Describer

    class Client:
        def __init__(self, fail):
            self.fail, self.calls = fail, []

        def put_ptrs(self, keys, ptrs, sizes, descriptors=None):
            self.calls.append((list(keys), descriptors))
            if descriptors is not None and self.fail == "lib":
                raise AttributeError("kvpool_put_described")
            if descriptors is not None and self.fail == "node":
                return [StatusCode.INVALID_ARGUMENT if d is not None else StatusCode.OK
                        for d in descriptors]
            return [StatusCode.OK] * len(keys)

    d = Describer(True, logging.getLogger("t"))
    desc = d.make(5, 4, [1, 2, 3, 4], None, 0)
    assert isinstance(desc, BlockDescriptor)
    # A block that cannot be described is put without one; one whose tokens
    # do not fit is described without them.
    assert d.make(1 << 70, 4) is None
    assert d.make(5, 4, [1, 2, 3]).token_ids == ()
    assert d.make(5, 5000, list(range(5000))).token_ids == ()
    node = Client("node")
    assert d.put_ptrs(node, ["a", "b"], [1, 2], [3, 3], [desc, None]) == [StatusCode.OK] * 2
    assert node.calls == [(["a", "b"], [desc, None]), (["a"], None)]
    whole = Client("whole")  # a node that fails a described put as a whole
    whole.put_ptrs = lambda keys, ptrs, sizes, descriptors=None: (
        whole.calls.append((list(keys), descriptors)) or
        ([StatusCode.OK] * len(keys) if descriptors is None else
         (_ for _ in ()).throw(KvpoolError(StatusCode.INTERNAL, "unexpected reply type"))))
    w = Describer(True, logging.getLogger("t"))
    for _ in range(3):
        assert w.put_ptrs(whole, ["a"], [1], [3], [desc]) == [StatusCode.OK]
    assert not w.enabled and w.fallbacks == 3  # the third in a row: it stops describing
    assert whole.calls == [(["a"], [desc]), (["a"], None)] * 3
    gone = Client("gone")  # the node is gone: not retried, not the descriptors' fault
    gone.put_ptrs = lambda *a, **k: (_ for _ in ()).throw(KvpoolError(StatusCode.UNAVAILABLE))
    with pytest.raises(KvpoolError):
        Describer(True, logging.getLogger("t")).put_ptrs(gone, ["a"], [1], [3], [desc])
    lib = Client("lib")
    assert d.put_ptrs(lib, ["a"], [1], [3], [desc]) == [StatusCode.OK]
    assert lib.calls == [(["a"], [desc]), (["a"], None)]
    assert not d.enabled  # that library never gets descriptors again
    assert d.put_ptrs(lib, ["b"], [1], [3], [desc]) == [StatusCode.OK]
    assert lib.calls[-1] == (["b"], None)


def test_settings_parse(standins_on_path):
    from kvpool.integrations._session import SessionSettings

    assert SessionSettings().block_descriptors is True
    assert SessionSettings().update({"block_descriptors": "false"}).block_descriptors is False
    assert SessionSettings().update({"block_descriptors": 0}).block_descriptors is False
    with pytest.raises(ValueError):
        SessionSettings().update({"block_descriptors": "maybe"})
    # SGLang's extra config is JSON: a JSON false is off.
    assert SessionSettings().update(json.loads('{"block_descriptors": false}')) \
        .block_descriptors is False
