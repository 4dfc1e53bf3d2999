"""kvpool.integrations._cuda: registering the client's mapped segment with CUDA.

Against a real kvpool-node and client: without a GPU registration is skipped
with its reason logged once and counted; with a fake CUDA runtime (records
every call, fails as told) registration covers the segment exactly, whole or
in chunks, is shared within the process, is undone on close and falls back
cleanly on failure. Plus the copy helpers.
"""

import ctypes
import logging

import pytest
import torch

import kvpool
from kvpool import _native
from kvpool.integrations import _cuda

MiB = 1 << 20
SEGMENT = 64 * MiB  # conftest's nodes: --dram-capacity 64MiB, --dram-read-room 0
RO = _cuda.HOST_REGISTER_PORTABLE | _cuda.HOST_REGISTER_READ_ONLY
RW = _cuda.HOST_REGISTER_PORTABLE
NO_GPU = "no CUDA device: torch.cuda.is_available() is False"
FALLBACK_LOG = ("kvpool: shared segment not registered with CUDA (%s); copies between it "
                "and a GPU are staged, not DMA")


class FakeRuntime:
    """Records calls; host_register fails (code 2, out of memory) for ranges
    over max_bytes, from the fail_at'th call on, or always with fail_all."""

    def __init__(self, max_bytes=None, fail_at=None, fail_all=False, raise_on_register=False):
        self.calls = []
        self.max_bytes = max_bytes
        self.fail_at = fail_at
        self.fail_all = fail_all
        self.raise_on_register = raise_on_register

    def host_register(self, address, nbytes, flags):
        self.calls.append(("register", address, nbytes, flags))
        if self.raise_on_register:
            raise RuntimeError("driver went away")
        n = sum(1 for c in self.calls if c[0] == "register")
        if self.fail_all or (self.max_bytes is not None and nbytes > self.max_bytes) \
                or (self.fail_at is not None and n >= self.fail_at):
            return 2
        return 0

    def host_unregister(self, address):
        self.calls.append(("unregister", address))
        return 0

    def error_string(self, code):
        return {2: "out of memory"}.get(code, "error %d" % code)


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.delenv("KVPOOL_CUDA_REGISTER", raising=False)
    monkeypatch.delenv("KVPOOL_CUDA_REGISTER_CHUNK", raising=False)
    _cuda.reset()
    yield
    _cuda.reset()


@pytest.fixture
def client(kvpool_node):
    c = kvpool.Client(kvpool_node.socket, namespace="cuda-test")
    yield c
    c.close()


def segment_mapping():
    maps = [m for m in _cuda.kvpool_mappings() if m.kind == "segment"]
    assert len(maps) == 1
    return maps[0]


def acquire(client, key):
    """(address, size, handle) of key's value in the mapped segment."""
    ids = client.key_ids([key])
    regions = (_native.Region * 1)()
    st = (_native.c_status * 1)(-1)
    rc = client._native_call(client._lib.kvpool_acquire, ids.ids, 1, regions, st)
    assert rc == 0 and st[0] == 0
    return regions[0].data, regions[0].size, regions[0].handle


def release(client, handle):
    client._native_call(client._lib.kvpool_release, (ctypes.c_uint64 * 1)(handle), 1)


def reserve(client, key, size):
    """(address, handle) of a reservation: where a put's bytes are written."""
    ids = client.key_ids([key])
    sizes = (ctypes.c_uint64 * 1)(size)
    regions = (_native.Region * 1)()
    st = (_native.c_status * 1)(-1)
    rc = client._native_call(client._lib.kvpool_reserve, ids.ids, sizes, 1, regions, st)
    assert rc == 0 and st[0] == 0
    return regions[0].data, regions[0].handle


def abort(client, handle):
    client._native_call(client._lib.kvpool_abort, (ctypes.c_uint64 * 1)(handle), 1)


def warnings_of(caplog):
    return [r.getMessage() for r in caplog.records
            if r.name == "kvpool.integrations" and r.levelno >= logging.WARNING]


# ---- no GPU: the real runtime lookup ------------------------------------------------------
@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_no_gpu_skips_with_reason_logged_once(client, caplog):
    caplog.set_level(logging.DEBUG, logger="kvpool.integrations")
    assert _cuda.default_runtime() == (None, NO_GPU)
    reg = _cuda.register_segment(client)
    again = _cuda.register_segment(client)
    for r in (reg, again):
        assert (r.registered, r.reason, r.bytes, r.ranges) == (False, NO_GPU, 0, ())
        assert not r.covers(segment_mapping().start, 1)
    assert warnings_of(caplog) == [FALLBACK_LOG % NO_GPU]
    assert _cuda.stats() == {"registered_bytes": 0, "registered_ranges": 0, "chunks": 0,
                             "failures": 2, "reason": NO_GPU}
    reg.close()
    again.close()
    assert client.put(["k"], [b"v"]) == [kvpool.StatusCode.OK]


def test_ctypes_runtime_missing_library():
    assert _cuda.CtypesRuntime.load(("libkvpool-no-such-cudart.so",)) == (
        None, "no CUDA runtime: cannot load libkvpool-no-such-cudart.so")


# ---- fake runtime against a real node ---------------------------------------------------------
def test_whole_segment_registered_read_only_and_shared(client, caplog):
    caplog.set_level(logging.DEBUG, logger="kvpool.integrations")
    value = bytes(range(256)) * 4096  # 1 MiB
    assert client.put(["k"], [value]) == [kvpool.StatusCode.OK]
    seg = segment_mapping()
    assert (seg.nbytes, seg.writable) == (SEGMENT, False)
    rt = FakeRuntime()
    reg = _cuda.register_segment(client, runtime=rt)
    assert rt.calls == [("register", seg.start, SEGMENT, RO)]
    assert (reg.registered, reg.reason, reg.bytes, reg.ranges) == (
        True, "", SEGMENT, ((seg.start, SEGMENT),))
    addr, size, handle = acquire(client, "k")
    try:
        assert size == len(value)
        assert reg.covers(addr, size)
        assert not reg.covers(seg.start + SEGMENT - 8, 16)
        assert not reg.covers(seg.start - 1, 1)
        assert bytes(_cuda.host_view(addr, size).numpy()) == value
    finally:
        release(client, handle)
    # A second registration of the same segment shares it: no CUDA call.
    again = _cuda.register_segment(client, runtime=rt)
    assert again.registered and again.ranges == reg.ranges
    assert len(rt.calls) == 1
    assert _cuda.stats() == {"registered_bytes": SEGMENT, "registered_ranges": 1, "chunks": 1,
                             "failures": 0, "reason": ""}
    reg.close()
    reg.close()
    assert len(rt.calls) == 1 and not reg.covers(addr, 1)
    again.close()
    assert rt.calls[1:] == [("unregister", seg.start)]
    assert _cuda.stats()["registered_bytes"] == 0
    assert warnings_of(caplog) == []
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO
             and r.name == "kvpool.integrations"]
    assert infos == ["kvpool: shared segment registered with CUDA (%d bytes in 1 ranges)"
                     % SEGMENT]


def test_chunked_registration_covers_segment_exactly(client):
    seg = segment_mapping()
    rt = FakeRuntime(max_bytes=24 * MiB)
    with _cuda.register_segment(client, runtime=rt, chunk_bytes=24 * MiB) as reg:
        assert rt.calls == [("register", seg.start, SEGMENT, RO),
                            ("register", seg.start, 24 * MiB, RO),
                            ("register", seg.start + 24 * MiB, 24 * MiB, RO),
                            ("register", seg.start + 48 * MiB, 16 * MiB, RO)]
        assert (reg.registered, reg.bytes) == (True, SEGMENT)
        assert reg.covers(seg.start, 24 * MiB)
        assert reg.covers(seg.start + 48 * MiB, 16 * MiB)
        assert not reg.covers(seg.start + 24 * MiB - 1, 2)  # straddles two chunks
        assert _cuda.stats()["chunks"] == 3
    assert rt.calls[4:] == [("unregister", seg.start), ("unregister", seg.start + 24 * MiB),
                            ("unregister", seg.start + 48 * MiB)]
    assert _cuda.stats() == {"registered_bytes": 0, "registered_ranges": 0, "chunks": 0,
                             "failures": 0, "reason": ""}


def test_chunk_size_from_environment(client, monkeypatch):
    monkeypatch.setenv("KVPOOL_CUDA_REGISTER_CHUNK", str(32 * MiB))
    seg = segment_mapping()
    rt = FakeRuntime(max_bytes=32 * MiB)
    reg = _cuda.register_segment(client, runtime=rt)
    assert [c[1:3] for c in rt.calls] == [(seg.start, SEGMENT), (seg.start, 32 * MiB),
                                          (seg.start + 32 * MiB, 32 * MiB)]
    reg.close()
    with pytest.raises(ValueError):
        _cuda.register_segment(client, runtime=rt, chunk_bytes=MiB + 1)
    monkeypatch.setenv("KVPOOL_CUDA_REGISTER_CHUNK", "12345")
    bad = _cuda.register_segment(client, runtime=rt)
    assert (bad.registered, bad.reason) == (False, "bad KVPOOL_CUDA_REGISTER_CHUNK=12345")
    assert rt.calls[3:] == [("unregister", seg.start), ("unregister", seg.start + 32 * MiB)]


def test_failed_chunk_rolls_back_and_falls_back_once(client, caplog):
    caplog.set_level(logging.DEBUG, logger="kvpool.integrations")
    seg = segment_mapping()
    rt = FakeRuntime(max_bytes=16 * MiB, fail_at=4)  # whole fails, chunks 1-2 pass, 3 fails
    reg = _cuda.register_segment(client, runtime=rt, chunk_bytes=16 * MiB)
    why = "cudaHostRegister failed: out of memory (error 2) for %d bytes at 0x%x" % (
        16 * MiB, seg.start + 32 * MiB)
    assert rt.calls == [("register", seg.start, SEGMENT, RO),
                        ("register", seg.start, 16 * MiB, RO),
                        ("register", seg.start + 16 * MiB, 16 * MiB, RO),
                        ("register", seg.start + 32 * MiB, 16 * MiB, RO),
                        ("unregister", seg.start), ("unregister", seg.start + 16 * MiB)]
    assert (reg.registered, reg.reason, reg.bytes) == (False, why, 0)
    # The failure is remembered: no second attempt, no second warning.
    again = _cuda.register_segment(client, runtime=rt, chunk_bytes=16 * MiB)
    assert (again.registered, again.reason) == (False, why)
    assert len(rt.calls) == 6
    reg.close()
    again.close()
    assert len(rt.calls) == 6
    assert warnings_of(caplog) == [FALLBACK_LOG % why]
    assert _cuda.stats() == {"registered_bytes": 0, "registered_ranges": 0, "chunks": 0,
                             "failures": 2, "reason": why}


def test_failure_without_chunking_and_runtime_exception(client):
    seg = segment_mapping()
    rt = FakeRuntime(fail_all=True)
    reg = _cuda.register_segment(client, runtime=rt, chunk_bytes=SEGMENT)
    assert rt.calls == [("register", seg.start, SEGMENT, RO)]
    assert reg.reason == "cudaHostRegister failed: out of memory (error 2) for %d bytes at 0x%x" \
        % (SEGMENT, seg.start)
    _cuda.reset()
    rt = FakeRuntime(raise_on_register=True)
    reg = _cuda.register_segment(client, runtime=rt, chunk_bytes=SEGMENT)
    assert reg.reason == ("cudaHostRegister failed: RuntimeError: driver went away for %d bytes "
                          "at 0x%x" % (SEGMENT, seg.start))
    assert not reg.registered


def test_already_registered_elsewhere_is_kept_not_unregistered(client):
    seg = segment_mapping()

    class Elsewhere(FakeRuntime):
        def host_register(self, address, nbytes, flags):
            super().host_register(address, nbytes, flags)
            return _cuda.ERROR_ALREADY_REGISTERED

    rt = Elsewhere()
    reg = _cuda.register_segment(client, runtime=rt)
    assert reg.registered and reg.covers(seg.start, SEGMENT)
    reg.close()
    assert rt.calls == [("register", seg.start, SEGMENT, RO)]


def test_staging_areas_registered_writable(client):
    addr, handle = reserve(client, "w", MiB)  # a put's bytes go to the staging area
    try:
        maps = _cuda.kvpool_mappings(include_staging=True)
        staging = [m for m in maps if m.kind == "staging"]
        seg = segment_mapping()
        assert len(staging) >= 1 and all(m.writable for m in staging)
        rt = FakeRuntime()
        reg = _cuda.register_segment(client, runtime=rt, include_staging=True)
        assert rt.calls == [("register", m.start, m.nbytes, RO if m.kind == "segment" else RW)
                            for m in maps]
        assert reg.bytes == SEGMENT + sum(m.nbytes for m in staging)
        assert reg.covers(addr, MiB)
        only = _cuda.register_segment(client, runtime=rt)  # shares the segment's registration
        assert only.ranges == ((seg.start, SEGMENT),) and not only.covers(addr, MiB)
        assert len(rt.calls) == len(maps)
        only.close()
        reg.close()
        assert rt.calls[len(maps):] == [("unregister", m.start) for m in maps]
    finally:
        abort(client, handle)


def test_writable_segment(node_factory):
    node = node_factory(extra_args=["--writable-segment=true"])
    with kvpool.Client(node.socket) as c:
        addr, handle = reserve(c, "w", MiB)
        try:
            seg = segment_mapping()
            assert seg.writable
            rt = FakeRuntime()
            reg = _cuda.register_segment(c, runtime=rt)
            assert rt.calls == [("register", seg.start, SEGMENT, RW)]
            assert reg.covers(addr, MiB)  # reservations are written in place
            reg.close()
        finally:
            abort(c, handle)


def test_no_runtime_calls_when_skipped(client, kvpool_node, monkeypatch, caplog):
    caplog.set_level(logging.DEBUG, logger="kvpool.integrations")
    rt = FakeRuntime()
    monkeypatch.setenv("KVPOOL_CUDA_REGISTER", "0")
    assert _cuda.register_segment(client, runtime=rt).reason == \
        "disabled by KVPOOL_CUDA_REGISTER=0"
    monkeypatch.delenv("KVPOOL_CUDA_REGISTER")
    with kvpool.Client(kvpool_node.socket, copy_mode=True) as copying:
        assert _cuda.register_segment(copying, runtime=rt).reason == \
            "copy mode: the client maps no segment"
    closed = kvpool.Client(kvpool_node.socket)
    closed.close()
    assert _cuda.register_segment(closed, runtime=rt).reason == "the client is closed"
    assert rt.calls == []
    assert warnings_of(caplog) == [FALLBACK_LOG % "disabled by KVPOOL_CUDA_REGISTER=0"]
    assert _cuda.stats()["failures"] == 3


def test_mappings_parsed_from_maps_file(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text(
        "7f0000000000-7f0004000000 r--s 00000000 00:01 11   /memfd:kvpool-dram (deleted)\n"
        "7f0004000000-7f0008000000 rw-s 00000000 00:01 12   /memfd:kvpool-staging (deleted)\n"
        "7f0008000000-7f0008001000 rw-p 00000000 00:00 0 \n"
        "7f0010000000-7f0010200000 rw-s 00000000 00:01 13   /memfd:kvpool-dram (deleted)\n"
        "7f0020000000-7f0020001000 r--p 00000000 fe:00 9    /usr/lib/libkvpool-dram.so\n")
    assert _cuda.kvpool_mappings(maps_path=str(maps)) == [
        _cuda.Mapping(0x7f0000000000, 64 * MiB, False, "segment", 11),
        _cuda.Mapping(0x7f0010000000, 2 * MiB, True, "segment", 13)]
    assert _cuda.kvpool_mappings(True, str(maps))[1] == _cuda.Mapping(
        0x7f0004000000, 64 * MiB, True, "staging", 12)
    rt = FakeRuntime()
    reg = _cuda.register_segment(None, runtime=rt, maps_path=str(maps))
    assert rt.calls == [("register", 0x7f0000000000, 64 * MiB, RO),
                        ("register", 0x7f0010000000, 2 * MiB, RW)]
    assert reg.bytes == 66 * MiB
    reg.close()
    empty = tmp_path / "empty"
    empty.write_text("")
    assert _cuda.register_segment(None, runtime=rt, maps_path=str(empty)).reason == \
        "no kvpool segment is mapped in this process"


# ---- copies ----------------------------------------------------------------------------------
class FakeTensor:
    def __init__(self, device):
        self.device = torch.device(device)
        self.copies = []

    def copy_(self, src, **kwargs):
        self.copies.append((src, kwargs))
        return self


def test_copy_into_async_only_when_registered_and_on_gpu(monkeypatch):
    events = []
    monkeypatch.setattr(_cuda, "_record_event", lambda: events.append("event") or "event")
    host, gpu = FakeTensor("cpu"), FakeTensor("cuda")
    assert _cuda.copy_into(gpu, host, True) == "event"
    assert gpu.copies == [(host, {"non_blocking": True})]
    assert _cuda.copy_into(host, gpu, True) == "event"
    assert host.copies == [(gpu, {"non_blocking": True})]
    assert _cuda.copy_into(gpu, host, False) is None
    assert gpu.copies[1] == (host, {})
    other = FakeTensor("cpu")
    assert _cuda.copy_into(other, host, True) is None  # host to host: nothing to overlap
    assert other.copies == [(host, {})]
    assert events == ["event", "event"]


def test_copy_into_real_tensors_and_host_view():
    src = torch.arange(256, dtype=torch.uint8).repeat(16)
    buf = bytearray(src.numel())
    view = _cuda.host_view(kvpool.buffer_address(buf)[0], len(buf))
    assert _cuda.copy_into(view, src, False) is None
    assert bytes(buf) == bytes(src.numpy())
    dst = torch.zeros_like(src)
    assert _cuda.copy_into(dst, view, True) is None
    assert torch.equal(dst, src)
    _cuda.wait(None)
    assert _cuda.host_view(0, 0).numel() == 0
