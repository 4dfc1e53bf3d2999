"""The connectors' shared session (kvpool.integrations._session): one settings
vocabulary with the older names as aliases, the retry interval, and a failed
call answered as a miss, the same way by the SGLang, vLLM and LMCache
connectors."""

import asyncio
import types

import pytest
import torch

import kvpool
from kvpool.integrations._session import ALIASES, Session, SessionSettings, canonical

# ---- settings -----------------------------------------------------------------------------


def test_aliases_map_to_the_settings():
    assert canonical({"kvpool_socket": "/s", "kvpool_remote": "h:1", "kvpool_namespace": "n",
                      "kvpool_timeout_ms": 300, "kvpool_retry_interval_s": 2.5}) == {
        "socket": "/s", "remote": "h:1", "namespace": "n", "timeout_ms": 300,
        "retry_interval_ms": 2500.0}
    assert canonical({"reconnect_interval_ms": 50}) == {"retry_interval_ms": 50}
    assert canonical({"retry_interval_s": "0.2"}) == {"retry_interval_ms": 200.0}
    # A setting under its own name wins over its alias; other keys pass through.
    assert canonical({"retry_interval_ms": 7, "retry_interval_s": 9, "io_threads": 2}) == {
        "retry_interval_ms": 7, "io_threads": 2}
    assert sorted({name for name, _ in ALIASES.values()}) == [
        "namespace", "remote", "retry_interval_ms", "socket", "timeout_ms"]


def test_settings_parse_convert_and_check_bounds():
    s = SessionSettings().update({"socket": "", "remote": None, "timeout_ms": "250",
                                  "retry_interval_s": 0.0004, "prefetch_threshold": 4})
    assert (s.socket, s.remote, s.namespace, s.timeout_ms, s.retry_interval_ms) == (
        None, None, None, 250, 0)
    with pytest.raises(ValueError, match="timeout_ms"):
        SessionSettings().update({"kvpool_timeout_ms": 0})
    with pytest.raises(ValueError, match="retry_interval_ms"):
        SessionSettings().update({"reconnect_interval_ms": -1})


def _sglang_settings(extra):
    from kvpool.integrations.sglang import KvpoolHiCacheStorage

    return KvpoolHiCacheStorage(types.SimpleNamespace(extra_config=extra)).settings


def _vllm_settings(extra):
    from vllm.config import KVTransferConfig, VllmConfig

    from kvpool.integrations.vllm import _Settings

    cfg = VllmConfig(kv_transfer_config=KVTransferConfig(
        kv_connector="KvpoolConnector", kv_role="kv_both", kv_connector_extra_config=extra))
    return _Settings(cfg).session


def _lmcache_settings(extra):
    from kvpool.integrations.lmcache import resolve_settings
    from lmcache.v1.config import LMCacheEngineConfig

    cfg = LMCacheEngineConfig(remote_storage_plugins=["kvpool"], extra_config={
        "remote_storage_plugin.kvpool." + k: v for k, v in extra.items()})
    return resolve_settings("plugin://kvpool", None, cfg)


def _fields(s):
    return (s.socket, s.remote, s.namespace, s.timeout_ms, s.retry_interval_ms)


@pytest.mark.parametrize("read,defaults,old,old_read", [
    (_sglang_settings, (None, None, "", 2000, 1000),
     {"reconnect_interval_ms": 40}, (None, None, "", 2000, 40)),
    (_vllm_settings, (None, None, None, 2000, 10000),
     {"kvpool_socket": "/x.sock", "kvpool_remote": "h:7", "kvpool_namespace": "t",
      "kvpool_timeout_ms": 300, "kvpool_retry_interval_s": 0.04}, ("/x.sock", "h:7", "t", 300, 40)),
    (_lmcache_settings, (None, None, "lmcache", 5000, 1000),
     {"retry_interval_s": 0.04}, (None, None, "lmcache", 5000, 40)),
], ids=["sglang", "vllm", "lmcache"])
def test_every_connector_reads_one_vocabulary(standins_on_path, read, defaults, old, old_read):
    assert _fields(read({})) == defaults
    assert _fields(read({"socket": "/x.sock", "remote": "h:7", "namespace": "t",
                         "timeout_ms": 300, "retry_interval_ms": 40})) == (
        "/x.sock", "h:7", "t", 300, 40)
    assert _fields(read(old)) == old_read  # the names older releases used


# ---- the session, with a stand-in client and clock -----------------------------------------


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class Opener:
    """Stands in for kvpool.Client: counts opens; fails while `down`."""

    def __init__(self):
        self.down = True
        self.opened = []

    def __call__(self, socket, namespace, timeout_ms, remote):
        self.opened.append((socket, namespace, timeout_ms, remote))
        if self.down:
            raise kvpool.KvpoolError(kvpool.StatusCode.UNAVAILABLE, "no node")
        return types.SimpleNamespace(close=lambda: None, exists=lambda keys: [True] * len(keys))


def _session(retry_ms=1000, **kw):
    clock, opener = FakeClock(), Opener()
    s = Session(SessionSettings(socket="/s", namespace="ns", timeout_ms=300,
                                retry_interval_ms=retry_ms), open_client=opener, clock=clock,
                **kw)
    return s, clock, opener


def test_retry_interval_is_honoured():
    s, clock, opener = _session(retry_ms=1000)
    exists = lambda c: c.exists(["k"])  # noqa: E731
    assert s.call(exists, "miss") == "miss"
    assert len(opener.opened) == 1
    opener.down = False
    clock.now += 0.999  # within the interval: no attempt
    assert s.call(exists, "miss") == "miss" and s.client() is None
    assert len(opener.opened) == 1 and s.connected is False
    clock.now += 0.001
    assert s.call(exists, "miss") == [True]
    assert opener.opened == [("/s", "ns", 300, None)] * 2 and s.connected is True
    assert s.errors == 0  # a call without a client is a miss, not a failed call


def test_zero_interval_tries_on_every_call():
    s, clock, opener = _session(retry_ms=0)
    for _ in range(3):
        assert s.client() is None
    assert len(opener.opened) == 3


def test_a_failed_call_is_its_default_and_keeps_the_client():
    s, clock, opener = _session()
    opener.down = False

    def fail(exc):
        def call(client):
            raise exc
        return call

    assert s.call(fail(kvpool.KvpoolError(kvpool.StatusCode.DEADLINE_EXCEEDED)), 0) == 0
    assert s.call(fail(TypeError("not a buffer")), [None]) == [None]
    assert s.call(fail(kvpool.KvpoolError(kvpool.StatusCode.DEADLINE_EXCEEDED)), 0,
                  on_error=lambda e: int(e.code)) == 8
    assert s.errors == 3
    assert s.connected is True and len(opener.opened) == 1  # the library reconnects by itself
    assert s.call(lambda c: "ok") == "ok"


def test_a_failed_on_open_is_a_failed_open():
    closed = []

    def on_open(client):
        client.close = lambda: closed.append(client)
        raise kvpool.KvpoolError(kvpool.StatusCode.UNAVAILABLE, "no limit")

    s, clock, opener = _session(on_open=on_open)
    opener.down = False
    assert s.client() is None and s.connected is False and len(closed) == 1


def test_reopen_and_close():
    s, clock, opener = _session()
    opener.down = False
    assert s.client() is not None
    s.reopen("other")  # at once, whatever the retry interval
    assert s.namespace == "other" and opener.opened[-1][1] == "other" and s.connected
    s.close()
    s.close()
    assert s.call(lambda c: "hit", "miss") == "miss" and len(opener.opened) == 2


# ---- the three connectors against a real node ----------------------------------------------


class SglangSide:
    """batch_set_v1 / batch_exists of the SGLang backend."""

    retry_alias = "reconnect_interval_ms"
    retry_scale = 1

    def __init__(self, socket, extra):
        from sglang_util import PAGE, make_controller, make_pool

        self.backend = make_controller(make_pool("mha", "page_first"), socket,
                                       extra=extra).storage_backend
        self.host = self.backend.mem_pool_host.alloc(2 * PAGE)
        self.keys = ["p0", "p1"]

    def session(self):
        return self.backend._session

    def store(self):
        return self.backend.batch_set_v1(self.keys, self.host) == [True, True]

    def hits(self):
        return self.backend.batch_exists(self.keys)

    def close(self):
        self.backend.close()


class VllmSide:
    """The vLLM scheduler's lookup; pages stored with a raw client under the
    connector's namespace and keys."""

    retry_alias = "kvpool_retry_interval_s"
    retry_scale = 1000
    BS = 4

    def __init__(self, socket, extra):
        from vllm.config import CacheConfig, KVTransferConfig, ModelConfig, VllmConfig
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
        from vllm.v1.request import Request

        from kvpool.integrations import _vllm_keys as k
        from kvpool.integrations.vllm import KvpoolConnector

        self.socket = socket
        self.cfg = VllmConfig(model_config=ModelConfig(model="test/model"),
                              cache_config=CacheConfig(block_size=self.BS),
                              kv_transfer_config=KVTransferConfig(
                                  kv_connector="KvpoolConnector", kv_role="kv_both",
                                  kv_connector_extra_config=dict(extra, kvpool_socket=socket)))
        self.connector = KvpoolConnector(self.cfg, KVConnectorRole.SCHEDULER)
        self.request = Request("r", list(range(3 * self.BS)))
        self.namespace, mla = k.namespace(self.cfg)
        self.keys = [h + k.rank_suffix(mla, 0, 0)
                     for h in k.BlockHasher(self.request, self.BS).upto(2)]

    def session(self):
        return self.connector._scheduler_side._session

    def store(self):
        with kvpool.Client(self.socket, namespace=self.namespace) as c:
            return c.put(self.keys, [b"page"] * 2) == [kvpool.StatusCode.OK] * 2

    def hits(self):
        tokens, load_async = self.connector.get_num_new_matched_tokens(self.request, 0)
        assert load_async is False
        return tokens // self.BS

    def close(self):
        self.connector.shutdown()


class LmcacheSide:
    """batched_put / batched_contains of the LMCache connector."""

    retry_alias = "retry_interval_s"
    retry_scale = 1000

    def __init__(self, socket, extra):
        from lmcache.utils import CacheEngineKey
        from lmcache.v1.config import LMCacheEngineConfig
        from lmcache.v1.memory_management import MemoryFormat, TensorMemoryAllocator

        from kvpool.integrations.lmcache import KvpoolRemoteConnector

        plugin = "remote_storage_plugin.kvpool."
        cfg = LMCacheEngineConfig(remote_storage_plugins=["kvpool"], extra_config=dict(
            {plugin + k: v for k, v in extra.items()}, **{plugin + "socket": socket}))
        self.connector = KvpoolRemoteConnector(config=cfg, url="plugin://kvpool")
        self.keys = [CacheEngineKey("m", 1, 0, h, torch.float16) for h in (1, 2)]
        allocator = TensorMemoryAllocator(1 << 20)
        self.objs = [allocator.allocate(torch.Size([2, 2, 4, 8]), torch.float16,
                                        MemoryFormat.KV_2LTD) for _ in self.keys]

    def session(self):
        return self.connector._session

    def store(self):
        before = self.connector.stats["stored"]
        asyncio.run(self.connector.batched_put(self.keys, self.objs))
        return self.connector.stats["stored"] - before == 2

    def hits(self):
        return sum(self.connector.batched_contains(self.keys))

    def close(self):
        self.connector.close_sync()
        for obj in self.objs:
            obj.ref_count_down()


SIDES = [SglangSide, VllmSide, LmcacheSide]
SIDE_IDS = ["sglang", "vllm", "lmcache"]


@pytest.mark.parametrize("side", SIDES, ids=SIDE_IDS)
def test_a_failed_call_is_a_miss_in_every_connector(standins_on_path, kvpool_node, side):
    c = side(kvpool_node.socket, {"timeout_ms": 2000, "retry_interval_ms": 0})
    try:
        assert c.store() and c.hits() == 2
        session = c.session()
        assert isinstance(session, Session) and session.errors == 0
        kvpool_node.kill()
        assert c.hits() == 0  # no exception
        assert session.errors == 1 and session.connected is True
        kvpool_node.start()  # empty; the library reconnects the same client
        assert c.hits() == 0
        assert c.store() and c.hits() == 2
        assert session.errors == 1
    finally:
        c.close()


@pytest.mark.parametrize("retry_ms,connects", [(60000, False), (0, True)])
@pytest.mark.parametrize("side", SIDES, ids=SIDE_IDS)
def test_every_connector_honours_the_retry_interval(standins_on_path, kvpool_node, side,
                                                    retry_ms, connects):
    """Given under each connector's older name: with no node at the first
    attempt, the next attempt waits for the interval."""
    kvpool_node.stop()
    c = side(kvpool_node.socket, {side.retry_alias: retry_ms / side.retry_scale})
    try:
        assert c.session().settings.retry_interval_ms == retry_ms
        assert c.hits() == 0 and c.session().connected is False
        kvpool_node.start()
        assert c.hits() == 0
        assert c.session().connected is connects
        if connects:
            assert c.store() and c.hits() == 2
    finally:
        c.close()


def test_an_open_session_registers_the_segment_or_says_why_not(kvpool_node):
    from kvpool.integrations import _cuda
    plain = Session(SessionSettings(socket=kvpool_node.socket), "ns")
    assert plain.client() is not None
    assert plain.segment_registration.reason == "not asked for"
    plain.close()
    s = Session(SessionSettings(socket=kvpool_node.socket), "ns", register_cuda=True)
    assert s.segment_registration.reason == "no client"
    assert s.client() is not None
    reg = s.segment_registration
    if torch.cuda.is_available():
        assert reg.registered and reg.bytes > 0 and reg.current()
    else:  # the reason is told, nothing is registered
        assert not reg.registered and reg.bytes == 0
        assert reg.reason == "no CUDA device: torch.cuda.is_available() is False"
        assert _cuda.stats()["reason"] == reg.reason
    s.close()
    assert s.segment_registration.reason == "closed"


def test_a_registration_of_a_replaced_segment_is_not_current(tmp_path):
    from kvpool.integrations import _cuda
    maps = tmp_path / "maps"
    line = "7f0000000000-7f0004000000 r--s 00000000 00:01 %d /memfd:kvpool-dram (deleted)\n"
    maps.write_text(line % 1111)
    m = _cuda.kvpool_mappings(False, str(maps))
    assert [(x.start, x.nbytes, x.inode) for x in m] == [(0x7f0000000000, 64 << 20, 1111)]
    reg = _cuda.SegmentRegistration([(m[0].start, m[0].nbytes, m[0].inode)],
                                    [(m[0].start, m[0].nbytes)])
    assert reg.current(str(maps))
    maps.write_text(line % 2222)  # the node restarted: same address, a new memfd
    assert not reg.current(str(maps))
    maps.write_text("")
    assert not reg.current(str(maps))
