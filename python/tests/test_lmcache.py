"""kvpool.integrations.lmcache driven the way LMCache drives a remote
connector (stand-ins under standins/lmcache, ENGINES.md §3 and §6.2), against
a real kvpool-node. Every test that takes `lm` runs twice: under the 2025
and under the 2026 LMCache contract (a fresh import of the stand-ins and of
the connector for each)."""

import asyncio
import hashlib
import importlib
import os
import struct
import sys
import threading
import time

import pytest
import torch

import kvpool
from kvpool.integrations import _lmcache_format as fmt

LAYERS, HEADS, HEAD_SIZE, CHUNK = 2, 4, 16, 16
MODEL = "org/test-model"


CONTRACTS = ("2025", "2026")
CONTRACT_ENV = "KVPOOL_LMCACHE_CONTRACT"  # read by the stand-ins (lmcache._contract)
CONNECTOR_MODULE = "kvpool.integrations.lmcache"


def lmcache_modules():
    """The LMCache stand-in modules, imported under their real names, and the
    kvpool connector module loaded under them."""
    import types

    import lmcache._contract as contract
    import lmcache.utils as utils
    import lmcache.v1.config as config
    import lmcache.v1.memory_management as mm
    import lmcache.v1.metadata as metadata
    import lmcache.v1.storage_backend.connector as connector
    import lmcache.v1.storage_backend.connector.base_connector as base_connector
    import lmcache.v1.storage_backend.local_cpu_backend as local_cpu
    import lmcache.v1.storage_backend.remote_backend as remote_backend
    import lmcache.v1.storage_backend.storage_manager as storage_manager
    kvlm = importlib.import_module(CONNECTOR_MODULE)
    return types.SimpleNamespace(contract=contract.CONTRACT, config=config, mm=mm,
                                 metadata=metadata, connector=connector,
                                 base_connector=base_connector, local_cpu=local_cpu,
                                 remote_backend=remote_backend,
                                 storage_manager=storage_manager, utils=utils, kvlm=kvlm)


def _lmcache_module_names():
    return [n for n in sys.modules
            if n == "lmcache" or n.startswith("lmcache.") or n == CONNECTOR_MODULE]


def load_contract(contract, monkeypatch):
    """Imports the stand-ins of `contract` and the connector under them;
    monkeypatch puts back the modules there were before."""
    import kvpool.integrations as integrations
    for name in _lmcache_module_names():
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(integrations, "lmcache", None, raising=False)
    monkeypatch.setenv(CONTRACT_ENV, contract)
    mods = lmcache_modules()
    assert mods.contract == contract
    return mods


def contract_modules(contract, monkeypatch):
    """A fixture's body: the modules of `contract` for one test. After it the
    modules imported during the test go; monkeypatch then puts the old ones
    back."""
    yield load_contract(contract, monkeypatch)
    for name in _lmcache_module_names():
        del sys.modules[name]


@pytest.fixture(params=CONTRACTS)
def lm(request, standins_on_path, monkeypatch):
    yield from contract_modules(request.param, monkeypatch)


def contains_answer(lm, hits, stop=True):
    """What the connector's batched_contains answers for per-key presence
    `hits` under lm's contract: the leading-hit count (2026), else one bool
    per key, all False after the first miss when `stop`."""
    n = hits.index(False) if False in hits else len(hits)
    if lm.contract == "2026":
        return n
    return [True] * n + [False] * (len(hits) - n) if stop else list(hits)


def make_config(lm, socket, plugin="kvpool", class_name="KvpoolConnectorAdapter", **settings):
    extra = {
        "remote_storage_plugin.%s.module_path" % plugin: "kvpool.integrations.lmcache",
        "remote_storage_plugin.%s.class_name" % plugin: class_name,
        "remote_storage_plugin.%s.socket" % plugin: socket,
        "remote_storage_plugin.%s.retry_interval_s" % plugin: 0.2,
        "remote_storage_plugin.%s.timeout_ms" % plugin: 2000,
    }
    blocking = settings.pop("blocking_timeout_secs", 10)
    for k, v in settings.items():
        extra["remote_storage_plugin.%s.%s" % (plugin, k)] = v
    return lm.config.LMCacheEngineConfig(chunk_size=CHUNK, remote_storage_plugins=[plugin],
                                         extra_config=extra, blocking_timeout_secs=blocking)


def make_metadata(lm, dtype=torch.float16, layers=LAYERS, heads=HEADS, head_size=HEAD_SIZE,
                  mla=False, world_size=1, worker_id=0):
    return lm.metadata.LMCacheMetadata(
        model_name=MODEL, world_size=world_size, worker_id=worker_id, fmt="vllm",
        kv_dtype=dtype, kv_shape=(layers, 1 if mla else 2, CHUNK, 1 if mla else heads,
                                  head_size), use_mla=mla)


def chunk_hashes(tokens):
    """Prefix-chained hash per CHUNK tokens (the last chunk may be short)."""
    out, prev = [], b""
    for start in range(0, len(tokens), CHUNK):
        h = hashlib.sha256(prev + struct.pack("<%dI" % len(tokens[start:start + CHUNK]),
                                              *tokens[start:start + CHUNK])).digest()
        out.append(int.from_bytes(h[:8], "little"))
        prev = h
    return out


class Engine:
    """One LMCache instance: a StorageManager (event loop thread, CPU backend,
    one RemoteBackend per plugin) plus the chunking of a token sequence."""

    def __init__(self, lm, config, metadata, capacity_bytes=64 << 20, local_cpu_backend=None):
        self.lm, self.metadata = lm, metadata
        self.allocator = lm.mm.TensorMemoryAllocator(capacity_bytes)
        cpu = local_cpu_backend or lm.local_cpu.LocalCPUBackend(config, self.allocator,
                                                                 metadata=metadata)
        self.sm = lm.storage_manager.StorageManager(config, metadata, cpu)
        self.backend = next(iter(self.sm.remote_backends.values()))
        self.connector = self.backend.connection.getWrappedConnector()

    def keys(self, tokens):
        md = self.metadata
        return [self.lm.utils.CacheEngineKey(md.model_name, md.world_size, md.worker_id, h,
                                             md.kv_dtype) for h in chunk_hashes(tokens)]

    def chunk_shape(self, ntok):
        layers, kv, _, heads, head_size = self.metadata.kv_shape
        return torch.Size([kv, layers, ntok, heads * head_size])

    def fmt(self):
        mf = self.lm.mm.MemoryFormat
        return mf.KV_MLA_FMT if self.metadata.use_mla else mf.KV_2LTD

    def store(self, tokens, seed=0):
        """Puts every chunk (fire-and-forget, then waits); returns keys and the
        bytes each chunk should read back as."""
        keys = self.keys(tokens)
        objs, expected = [], []
        for i, key in enumerate(keys):
            ntok = min(CHUNK, len(tokens) - i * CHUNK)
            obj = self.sm.allocate(self.chunk_shape(ntok), self.metadata.kv_dtype, self.fmt())
            gen = torch.Generator().manual_seed(seed * 1000 + i)
            obj.tensor.copy_(torch.randn(obj.get_shape(), generator=gen).to(obj.get_dtype()))
            objs.append(obj)
            expected.append(bytes(obj.byte_array))
        self.sm.batched_put(keys, objs)
        self.backend.wait_for_puts()
        return keys, expected

    def check_and_release(self, objs, keys, expected):
        """Asserts byte-exact, right shape/dtype/format; releases the objects."""
        for obj, key, want, i in zip(objs, keys, expected, range(len(keys))):
            assert obj is not None, "chunk %d missed" % i
            ntok = len(want) // (self.chunk_shape(1).numel() *
                                 torch.empty((), dtype=self.metadata.kv_dtype).element_size())
            assert obj.get_shape() == self.chunk_shape(ntok)
            assert obj.get_dtype() == self.metadata.kv_dtype
            assert obj.get_memory_format() == self.fmt()
            assert bytes(obj.byte_array) == want
            obj.ref_count_down()

    def assert_no_leaks(self):
        assert self.allocator.live_count() == 0
        assert self.allocator.guard_violations == []

    def close(self):
        self.sm.close()


def closing_engines():
    """A fixture's body: a list of engines, closed after the test."""
    made = []
    yield made
    for e in made:
        e.close()


@pytest.fixture
def engines():
    yield from closing_engines()


def new_engine(engines, *args, **kwargs):
    e = Engine(*args, **kwargs)
    engines.append(e)
    return e


TOKENS = list(range(1000, 1000 + 3 * CHUNK + 5))  # three full chunks and a 5-token one


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_round_trip_is_byte_exact_with_short_last_chunk(lm, kvpool_node, engines, dtype):
    e = new_engine(engines, lm, make_config(lm, kvpool_node.socket), make_metadata(lm, dtype))
    keys, expected = e.store(TOKENS)
    assert [len(b) for b in expected][-1] == 5 * len(expected[0]) // CHUNK
    assert e.connector.stats["stored"] == 4
    e.check_and_release(e.backend.batched_get_blocking(keys), keys, expected)
    # Single-key path too.
    e.check_and_release([e.backend.get_blocking(keys[-1])], keys[-1:], expected[-1:])
    assert e.connector.stats["hits"] == 5 and e.connector.stats["misses"] == 0
    e.assert_no_leaks()


def test_contains_prefix_and_batched_contains(lm, kvpool_node, engines):
    cfg = make_config(lm, kvpool_node.socket)
    cfg.extra_config["use_exists_sync"] = False
    e = new_engine(engines, lm, cfg, make_metadata(lm))
    keys, _ = e.store(TOKENS)
    other = e.keys(list(range(7, 7 + 2 * CHUNK)))
    assert e.backend.batched_async_contains("l1", keys) == 4
    assert e.backend.batched_async_contains("l2", keys[:2] + other[:1] + keys[2:]) == 2
    assert e.backend.batched_async_contains("l3", other + keys) == 0
    assert e.backend.contains(keys[3]) is True
    assert e.backend.contains(other[0]) is False
    c = e.connector
    assert c.exists_sync(keys[0]) is True and c.exists_sync(other[1]) is False
    mixed = [keys[0], other[0], keys[1]]
    if lm.contract == "2026":
        assert c.batched_contains(mixed) == 1
    else:
        assert c.batched_contains(mixed) == [True, False, False]
        assert c.batched_contains(mixed, False) == [True, False, True]
    assert e.backend.batched_contains(mixed) == 1
    assert e.backend.batched_contains(keys) == 4
    # A lookup then a non-blocking prefetch: the found prefix, the rest released.
    fut = e.backend.batched_get_non_blocking("l4", keys[:2] + other[:1] + keys[2:])
    got = fut.result(timeout=10)
    assert len(got) == 2
    for obj in got:
        obj.ref_count_down()
    e.assert_no_leaks()


def test_two_instances_share_one_node(lm, kvpool_node, engines):
    a = new_engine(engines, lm, make_config(lm, kvpool_node.socket), make_metadata(lm))
    b = new_engine(engines, lm, make_config(lm, kvpool_node.socket), make_metadata(lm))
    keys, expected = a.store(TOKENS, seed=3)
    longer = b.keys(TOKENS[:3 * CHUNK] + list(range(5, 5 + CHUNK)))
    assert longer[:3] == keys[:3] and longer[3] != keys[3]
    assert b.backend.batched_async_contains("x", longer) == 3
    b.check_and_release(b.backend.batched_get_blocking(keys), keys, expected)
    b.assert_no_leaks()


_WRITER = """
import sys, torch
sys.path.insert(0, %(tests)r)
import test_lmcache as t
lm = t.lmcache_modules()
e = t.Engine(lm, t.make_config(lm, %(socket)r), t.make_metadata(lm, torch.bfloat16))
e.store(t.TOKENS, seed=11)
e.assert_no_leaks()
print("stored", e.connector.stats["stored"])
e.close()
"""


def test_two_processes_share_one_node(lm, kvpool_node, engines):
    """One LMCache process writes; another, started later, loads byte-exact
    (the writer runs the same contract: it inherits KVPOOL_LMCACHE_CONTRACT)."""
    import subprocess
    tests = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run([sys.executable, "-c", _WRITER % {"tests": tests,
                                                           "socket": kvpool_node.socket}],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["stored", "4"]
    reader = new_engine(engines, lm, make_config(lm, kvpool_node.socket),
                        make_metadata(lm, torch.bfloat16))
    # The bytes the writer stored: the same seeded data, regenerated here.
    probe = new_engine(engines, lm, make_config(lm, kvpool_node.socket, namespace="probe"),
                       make_metadata(lm, torch.bfloat16))
    keys, expected = probe.store(TOKENS, seed=11)
    assert reader.backend.batched_async_contains("x", keys) == 4
    reader.check_and_release(reader.backend.batched_get_blocking(keys), keys, expected)
    reader.assert_no_leaks()


def test_namespaces_are_disjoint(lm, kvpool_node, engines):
    a = new_engine(engines, lm, make_config(lm, kvpool_node.socket, namespace="a"),
                   make_metadata(lm))
    b = new_engine(engines, lm, make_config(lm, kvpool_node.socket, namespace="b"),
                   make_metadata(lm))
    keys, _ = a.store(TOKENS)
    assert a.backend.batched_async_contains("x", keys) == 4
    assert b.backend.batched_async_contains("x", keys) == 0
    assert b.backend.batched_get_blocking(keys) == [None] * 4


def test_node_down_at_start_is_misses(lm, dead_socket, engines):
    e = new_engine(engines, lm, make_config(lm, dead_socket), make_metadata(lm))
    keys, _ = e.store(TOKENS)  # no exception
    assert e.connector.stats["stored"] == 0
    assert e.backend.batched_async_contains("x", keys) == 0
    assert e.backend.contains(keys[0]) is False
    assert e.backend.batched_get_blocking(keys) == [None] * 4
    assert e.backend.get_blocking(keys[0]) is None
    assert e.connector.exists_sync(keys[0]) is False
    assert asyncio.run_coroutine_threadsafe(e.connector.ping(), e.sm.loop).result(10) != 0
    e.assert_no_leaks()


def test_node_killed_mid_run_is_misses_then_recovers(lm, kvpool_node, engines):
    e = new_engine(engines, lm, make_config(lm, kvpool_node.socket), make_metadata(lm))
    keys, expected = e.store(TOKENS)
    assert e.backend.batched_async_contains("x", keys) == 4
    kvpool_node.kill()
    assert e.backend.batched_get_blocking(keys) == [None] * 4
    assert e.backend.batched_async_contains("x", keys) == 0
    assert e.backend.contains(keys[0]) is False
    e.store(TOKENS)  # puts while down: no exception
    assert e.connector.stats["errors"] >= 1
    e.assert_no_leaks()
    kvpool_node.restart()  # empty: the node had no SSD tier
    ping = e.backend.connection.ping
    deadline = time.monotonic() + 10
    while asyncio.run_coroutine_threadsafe(ping(), e.sm.loop).result(10) != 0:
        assert time.monotonic() < deadline, "connector did not see the node come back"
        time.sleep(0.05)
    keys, expected = e.store(TOKENS, seed=9)
    e.check_and_release(e.backend.batched_get_blocking(keys), keys, expected)
    e.assert_no_leaks()


def test_hung_node_is_misses_within_the_deadline(lm, kvpool_node, engines):
    import signal
    e = new_engine(engines, lm, make_config(lm, kvpool_node.socket, timeout_ms=500),
                   make_metadata(lm))
    keys, expected = e.store(TOKENS)
    os.kill(kvpool_node.proc.pid, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 10  # SIGSTOP takes effect asynchronously
        while open("/proc/%d/stat" % kvpool_node.proc.pid).read().rsplit(")", 1)[1].split()[0] \
                != "T":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        start = time.monotonic()
        assert e.backend.batched_get_blocking(keys) == [None] * 4
        assert time.monotonic() - start < 5
        assert e.backend.batched_async_contains("x", keys) == 0
        assert e.backend.timeouts == 0  # the connector answered before LMCache gave up
    finally:
        os.kill(kvpool_node.proc.pid, signal.SIGCONT)
    deadline = time.monotonic() + 10
    while e.backend.batched_async_contains("x", keys) != 4:
        assert time.monotonic() < deadline, "hits did not come back after SIGCONT"
        time.sleep(0.05)
    e.check_and_release(e.backend.batched_get_blocking(keys), keys, expected)
    e.assert_no_leaks()


def test_foreign_or_broken_layouts_are_misses(lm, kvpool_node, engines):
    a = new_engine(engines, lm, make_config(lm, kvpool_node.socket), make_metadata(lm))
    keys, expected = a.store(TOKENS)
    # Same model name and keys, another KV shape (more layers): every header is foreign.
    b = new_engine(engines, lm, make_config(lm, kvpool_node.socket),
                   make_metadata(lm, layers=LAYERS + 2))
    assert b.backend.batched_get_blocking(keys) == [None] * 4
    assert b.connector.stats["rejected_headers"] == 4
    c = new_engine(engines, lm, make_config(lm, kvpool_node.socket), make_metadata(lm, mla=True))
    assert c.backend.batched_get_blocking(keys) == [None] * 4
    b.assert_no_leaks()
    c.assert_no_leaks()

    raw = kvpool.Client(kvpool_node.socket, namespace="lmcache")
    new = a.keys(list(range(50, 50 + 5 * CHUNK)))
    s = [k.to_string() for k in new]
    good = fmt.decode(raw.get([fmt.meta_key(keys[0].to_string())])[0])
    assert good is not None and good.shape == (2, LAYERS, CHUNK, HEADS * HEAD_SIZE)
    payload = expected[0]
    # 0: header says bfloat16 (engine runs float16), payload stored under that layout.
    h0 = good._replace(dtype_name="bfloat16")
    # 1: garbage header. 2: header fine, payload missing.
    # 3: header fine, payload of another size under the right key.
    # 4: header claims more tokens than a chunk holds.
    h4 = good._replace(shape=(2, LAYERS, CHUNK * 2, HEADS * HEAD_SIZE),
                       payload_bytes=2 * len(payload))
    assert raw.put([fmt.meta_key(x) for x in s],
                   [fmt.encode(h0), b"KVLM garbage", fmt.encode(good), fmt.encode(good),
                    fmt.encode(h4)]) == [kvpool.StatusCode.OK] * 5
    assert raw.put([fmt.payload_keys(s[0], h0)[0], fmt.payload_keys(s[3], good)[0],
                    fmt.payload_keys(s[4], h4)[0]],
                   [payload, payload[:-2], payload + payload]) == [kvpool.StatusCode.OK] * 3
    before = dict(a.connector.stats)
    assert a.backend.batched_get_blocking(new) == [None] * 5
    assert a.connector.stats["rejected_headers"] - before["rejected_headers"] == 3  # 0, 1, 4
    # Lookups agree: only 3 (a payload of the wrong size: exists cannot tell) looks stored.
    assert a.backend.batched_async_contains("x", new) == 0
    assert a.connector.batched_contains(new, False) \
        == contains_answer(lm, [False, False, False, True, False], stop=False)
    a.assert_no_leaks()
    raw.close()


def test_lookups_check_the_payload_too(lm, kvpool_node, engines):
    e = new_engine(engines, lm, make_config(lm, kvpool_node.socket), make_metadata(lm))
    keys, _ = e.store(TOKENS)
    raw = kvpool.Client(kvpool_node.socket, namespace="lmcache")
    s = [k.to_string() for k in keys]
    headers = [fmt.decode(h) for h in raw.get([fmt.meta_key(x) for x in s])]
    assert headers[3].shape[2] == 5
    # Evict the payloads of chunk 1 and of the short last chunk; headers stay.
    assert raw.remove(fmt.payload_keys(s[1], headers[1]) + fmt.payload_keys(s[3], headers[3])) \
        == [kvpool.StatusCode.OK] * 2
    assert e.backend.batched_async_contains("x", keys) == 1
    assert e.connector.batched_contains(keys, False) \
        == contains_answer(lm, [True, False, True, False], stop=False)
    assert e.backend.contains(keys[1]) is False and e.backend.contains(keys[2]) is True
    got = e.backend.batched_get_blocking(keys)
    assert [g is not None for g in got] == [True, False, True, False]
    for g in got:
        if g is not None:
            g.ref_count_down()
    e.assert_no_leaks()
    raw.close()


def test_newer_base_class_init_gets_config_and_metadata(lm, kvpool_node, monkeypatch):
    """LMCache 2026's RemoteConnector.__init__(config, metadata); older has none."""
    from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector
    from kvpool.integrations.lmcache import KvpoolRemoteConnector
    seen = []
    monkeypatch.setattr(RemoteConnector, "__init__",
                        lambda self, config, metadata: seen.append((config, metadata)),
                        raising=False)
    cfg, md = make_config(lm, kvpool_node.socket), make_metadata(lm)
    c = KvpoolRemoteConnector(loop=None, local_cpu_backend=None, config=cfg, metadata=md)
    assert seen == [(cfg, md)]
    c.close_sync()
    c.close_sync()  # idempotent


def test_put_leaves_release_to_lmcache(lm, kvpool_node, engines):
    e = new_engine(engines, lm, make_config(lm, kvpool_node.socket), make_metadata(lm))
    key = e.keys(TOKENS[:CHUNK])[0]
    obj = e.sm.allocate(e.chunk_shape(CHUNK), torch.float16, e.fmt())
    obj.tensor.fill_(1.5)
    fut = e.backend.submit_put_task(key, obj)  # serde ref up; the wrapper drops it after put
    assert fut.result(timeout=10) is None
    assert obj.get_ref_count() == 1  # only ours: the connector released nothing
    obj.ref_count_down()
    got = e.backend.get_blocking(key)
    assert bool((got.tensor == 1.5).all())
    got.ref_count_down()
    e.assert_no_leaks()


class SlowCalls:
    """Makes one client method slow (held until released) to observe the event
    loop while a native call is in progress."""

    def __init__(self, client, name):
        self.client, self.name = client, name
        self.real = getattr(client, name)
        self.entered, self.release, self.finished = (threading.Event(), threading.Event(),
                                                     threading.Event())

        def slow(*args, **kwargs):
            self.entered.set()
            self.release.wait(10)
            try:
                return self.real(*args, **kwargs)
            finally:
                self.finished.set()

        setattr(client, name, slow)

    def undo(self):
        setattr(self.client, self.name, self.real)


def ticker(loop, stop):
    ticks = [0]

    async def tick():
        while not stop.is_set():
            ticks[0] += 1
            await asyncio.sleep(0.005)

    return ticks, asyncio.run_coroutine_threadsafe(tick(), loop)


def test_event_loop_keeps_running_during_a_slow_get(lm, kvpool_node, engines):
    e = new_engine(engines, lm, make_config(lm, kvpool_node.socket), make_metadata(lm))
    keys, expected = e.store(TOKENS)
    slow = SlowCalls(e.connector._client, "get_ptrs")
    stop = threading.Event()
    ticks, tick_future = ticker(e.sm.loop, stop)
    result = []
    getter = threading.Thread(target=lambda: result.append(e.backend.batched_get_blocking(keys)))
    getter.start()
    assert slow.entered.wait(10)
    start = ticks[0]
    # While the get is parked in a native call, the loop serves other work:
    # ticks advance and a lookup completes.
    assert e.backend.batched_async_contains("x", keys) == 4
    deadline = time.monotonic() + 5
    while ticks[0] < start + 20:
        assert time.monotonic() < deadline, "event loop blocked during get"
        time.sleep(0.005)
    slow.release.set()
    getter.join(10)
    stop.set()
    tick_future.result(5)
    slow.undo()
    e.check_and_release(result[0], keys, expected)
    e.assert_no_leaks()


def test_ticker_detects_a_blocked_loop(lm, kvpool_node, engines):
    """Control for the test above: a coroutine that blocks stops the ticker."""
    e = new_engine(engines, lm, make_config(lm, kvpool_node.socket), make_metadata(lm))
    stop, entered, release = threading.Event(), threading.Event(), threading.Event()
    ticks, tick_future = ticker(e.sm.loop, stop)

    async def blocking():
        entered.set()
        release.wait(10)

    blocked = asyncio.run_coroutine_threadsafe(blocking(), e.sm.loop)
    assert entered.wait(10)
    start = ticks[0]
    time.sleep(0.2)
    assert ticks[0] == start
    release.set()
    blocked.result(5)
    stop.set()
    tick_future.result(5)


def test_get_cancelled_on_timeout_releases_its_objects(lm, kvpool_node, engines):
    # One connector thread: a later job runs after the earlier job's done-callbacks.
    e = new_engine(engines, lm, make_config(lm, kvpool_node.socket, blocking_timeout_secs=0.2,
                                            io_threads=1), make_metadata(lm))
    keys, _ = e.store(TOKENS)
    slow = SlowCalls(e.connector._client, "get_ptrs")
    assert e.backend.batched_get_blocking(keys) == [None] * 4  # timed out, cancelled
    assert e.backend.timeouts == 1
    assert e.allocator.live_count() == 4  # the native call still owns them
    slow.release.set()
    assert slow.finished.wait(10)
    e.connector._executor.submit(lambda: None).result(10)
    slow.undo()
    # The release is registered by the cancelled task's handler, which runs on
    # the engine's event loop, not on the connector's thread: on a loaded
    # machine it may come after the no-op above. Bounded wait, then exact.
    deadline = time.monotonic() + 5
    while e.allocator.live_count() and time.monotonic() < deadline:
        time.sleep(0.01)
    e.assert_no_leaks()


def test_allocation_failures_are_misses(lm, kvpool_node, engines):
    e = new_engine(engines, lm, make_config(lm, kvpool_node.socket), make_metadata(lm))
    keys, expected = e.store(TOKENS)
    chunk_bytes = len(expected[0])
    small = new_engine(engines, lm, make_config(lm, kvpool_node.socket), make_metadata(lm),
                       capacity_bytes=2 * chunk_bytes + len(expected[3]))
    got = small.backend.batched_get_blocking(keys)
    assert [g is not None for g in got] == [True, True, False, True]  # the short last chunk fits
    for g in got:
        if g is not None:
            g.ref_count_down()
    small.assert_no_leaks()
    sched = new_engine(engines, lm, make_config(lm, kvpool_node.socket), make_metadata(lm),
                       local_cpu_backend=lm.local_cpu.SafeLocalCPUBackend())
    assert sched.backend.batched_get_blocking(keys) == [None] * 4
    assert sched.backend.batched_async_contains("x", keys) == 4  # lookups still work


def test_values_over_the_node_limit_are_split(lm, node_factory, engines):
    node = node_factory(extra_args=["--max-value-size", "4KiB"])
    e = new_engine(engines, lm, make_config(lm, node.socket), make_metadata(lm))
    keys, expected = e.store(TOKENS)
    assert len(expected[0]) == 8192
    e.check_and_release(e.backend.batched_get_blocking(keys), keys, expected)
    raw = kvpool.Client(node.socket, namespace="lmcache")
    h = fmt.decode(raw.get([fmt.meta_key(keys[0].to_string())])[0])
    assert h.part_bytes == 4096 and len(fmt.payload_keys(keys[0].to_string(), h)) == 2
    assert raw.exists(fmt.payload_keys(keys[0].to_string(), h)) == [True, True]
    raw.close()
    e.assert_no_leaks()


def test_mla_rank0_writes_all_ranks_read(lm, kvpool_node, engines):
    r0 = new_engine(engines, lm, make_config(lm, kvpool_node.socket),
                    make_metadata(lm, torch.bfloat16, mla=True, world_size=2, worker_id=0))
    r1 = new_engine(engines, lm, make_config(lm, kvpool_node.socket),
                    make_metadata(lm, torch.bfloat16, mla=True, world_size=2, worker_id=1))
    keys1, _ = r1.store(TOKENS, seed=5)
    assert r1.connector.stats["stored"] == 0  # rank 1 skips puts
    keys0, expected = r0.store(TOKENS, seed=5)
    assert r1.backend.batched_async_contains("x", keys1) == 4
    r1.check_and_release(r1.backend.batched_get_blocking(keys1), keys0, expected)
    r1.assert_no_leaks()


def test_registry_routes(lm, kvpool_node, engines):
    conn = lm.connector
    loop = asyncio.new_event_loop()
    cpu = lm.local_cpu.LocalCPUBackend()
    cfg = make_config(lm, kvpool_node.socket, plugin="kvpool.primary", namespace="p")
    made = []
    try:
        # Legacy single remote: remote_url plus the plugin-registered adapter.
        legacy = conn.CreateConnector("kvpool://%s?namespace=legacy" % kvpool_node.socket,
                                      loop, cpu, cfg, make_metadata(lm))
        made.append(legacy)
        w = legacy.getWrappedConnector()
        assert w.settings.socket == kvpool_node.socket and w.settings.namespace == "legacy"
        # Per-name plugin URL (LMCache >= #2666) with its own settings.
        named = conn.CreateConnector("plugin://kvpool.primary", loop, cpu, cfg, make_metadata(lm),
                                     plugin_name="kvpool.primary")
        made.append(named)
        assert named.getWrappedConnector().settings.namespace == "p"
        # class_name naming the connector itself: LMCache wraps it.
        dyn_cfg = make_config(lm, kvpool_node.socket, class_name="KvpoolRemoteConnector")
        dyn = conn.CreateConnector("plugin://kvpool", loop, cpu, dyn_cfg, None, "kvpool")
        made.append(dyn)
        assert type(dyn.getWrappedConnector()).__name__ == "KvpoolRemoteConnector"
        assert dyn.getWrappedConnector().settings.socket == kvpool_node.socket
        # Other schemes go elsewhere.
        hole = conn.CreateConnector("blackhole://", loop, cpu, cfg, make_metadata(lm))
        assert type(hole.getWrappedConnector()).__name__ == "BlackholeConnector"
        with pytest.raises(ValueError):
            conn.CreateConnector("plugin://redis", loop, cpu, cfg)
    finally:
        for c in made:
            c.getWrappedConnector().close_sync()
        loop.close()
    from kvpool.integrations.lmcache import KvpoolConnectorAdapter, resolve_settings
    a = KvpoolConnectorAdapter()
    assert a.can_parse("kvpool://") and a.can_parse("plugin://kvpool")
    assert a.can_parse("plugin://kvpool.x") and not a.can_parse("plugin://kvpoolx")
    s = resolve_settings("kvpool://10.0.0.1:7400,10.0.0.2:7400/?timeout_ms=250", None, None)
    assert (s.remote, s.socket, s.timeout_ms) == ("10.0.0.1:7400,10.0.0.2:7400", None, 250)


def test_header_format():
    h = fmt.layout((2, 32, 7, 1024), "bfloat16", "KV_2LTD", 2 * 32 * 7 * 1024 * 2, 1 << 18)
    raw = fmt.encode(h)
    assert len(raw) <= fmt.MAX_HEADER_BYTES and fmt.decode(raw) == h
    assert h.part_bytes == 1 << 18
    assert fmt.part_spans(h) == [(0, 1 << 18), (1 << 18, 1 << 18), (2 << 18, 1 << 18),
                                 (3 << 18, 917504 - (3 << 18))]
    assert fmt.payload_keys("k", h)[3] == "k#bfloat16:KV_2LTD:2x32x7x1024/3"
    assert fmt.decode(raw[:-1]) is None and fmt.decode(raw + b"x") is None
    assert fmt.decode(b"XXXX" + raw[4:]) is None and fmt.decode(None) is None
    small = fmt.layout((1, 2, 3, 4), "float16", "KV_MLA_FMT", 48, 1 << 20)
    assert small.part_bytes == 0 and fmt.part_spans(small) == [(0, 48)]
    assert fmt.payload_keys("k", small) == ["k#float16:KV_MLA_FMT:1x2x3x4"]


def test_object_buffer_without_raw_data(lm):
    """Memory objects without a flat raw_data tensor are addressed through
    byte_array (or tensor)."""
    from kvpool.integrations.lmcache import _object_buffer
    a = lm.mm.TensorMemoryAllocator(1 << 20)
    obj = a.allocate(torch.Size([2, 2, 3, 8]), torch.bfloat16, lm.mm.MemoryFormat.KV_2LTD)

    class Wrapped:
        byte_array = property(lambda self: obj.byte_array)
        tensor = property(lambda self: obj.tensor)
        get_size = obj.get_size

    addr, nbytes, _ = _object_buffer(Wrapped())
    assert (addr, nbytes) == (obj.raw_data.data_ptr(), 2 * 2 * 3 * 8 * 2)
    obj.ref_count_down()


def test_layerwise_objects_round_trip(lm, kvpool_node, engines):
    """Layer-wise keys and formats (KV_T2D) go through the header path."""
    e = new_engine(engines, lm, make_config(lm, kvpool_node.socket), make_metadata(lm))
    key = e.keys(TOKENS[:CHUNK])[0].split_layers(LAYERS)[1]
    assert key.to_string().endswith("@1")
    obj = e.sm.allocate(torch.Size([7, 2, HEADS * HEAD_SIZE]), torch.float16,
                        lm.mm.MemoryFormat.KV_T2D)
    obj.tensor.copy_(torch.randn(obj.get_shape()).half())
    want = bytes(obj.byte_array)
    e.backend.submit_put_task(key, obj).result(10)
    obj.ref_count_down()
    assert e.backend.contains(key) is True
    got = e.backend.get_blocking(key)
    assert got.get_shape() == torch.Size([7, 2, HEADS * HEAD_SIZE])
    assert got.get_memory_format() == lm.mm.MemoryFormat.KV_T2D
    assert bytes(got.byte_array) == want
    got.ref_count_down()
    e.assert_no_leaks()
