"""kvpool.Client against a real kvpool-node."""

import ctypes
import os
import threading

import numpy as np
import pytest
import torch

import kvpool
from kvpool import Client, KvpoolError, StatusCode, buffer_address
from ports_util import start_on_free_ports

OK = StatusCode.OK


def pattern(seed, n):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def test_put_get_roundtrip_of_every_buffer_kind(kvpool_node):
    with Client(kvpool_node.socket, namespace="rt") as c:
        raw = pattern(1, 4096)
        values = [raw, bytearray(raw[:100]), memoryview(raw)[7:1007],
                  np.frombuffer(pattern(2, 8192), dtype=np.uint8).copy(),
                  torch.arange(777, dtype=torch.int32)]
        keys = ["bytes", b"bytearray", "memoryview", "numpy", "torch"]
        assert c.put(keys, values) == [OK] * 5
        got = c.get(keys + ["absent"])
        assert got[0] == raw
        assert got[1] == raw[:100]
        assert got[2] == raw[7:1007]
        assert got[3] == values[3].tobytes()
        assert got[4] == values[4].numpy().tobytes()
        assert got[5] is None


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_tensor_ptr_roundtrip_is_byte_exact(kvpool_node, dtype):
    with Client(kvpool_node.socket) as c:
        src = [torch.randn(64, 128).to(dtype) for _ in range(8)]
        keys = ["t%d" % i for i in range(8)]
        addr = [buffer_address(t) for t in src]
        assert c.put_ptrs(keys, [a for a, _ in addr], [n for _, n in addr]) == [OK] * 8
        dst = [torch.zeros(64, 128, dtype=dtype) for _ in range(8)]
        daddr = [buffer_address(t) for t in dst]
        assert c.get_ptrs(keys, [a for a, _ in daddr], [n for _, n in daddr]) == [OK] * 8
        for s, d in zip(src, dst):
            assert s.view(torch.int16).equal(d.view(torch.int16))


def test_get_ptrs_size_mismatch_is_not_ok(kvpool_node):
    with Client(kvpool_node.socket) as c:
        assert c.put(["k"], [b"x" * 100]) == [OK]
        small = ctypes.create_string_buffer(50)
        big = ctypes.create_string_buffer(200)
        exact = ctypes.create_string_buffer(100)
        st = c.get_ptrs(["k", "k", "k", "miss"],
                        [ctypes.addressof(small), ctypes.addressof(big), ctypes.addressof(exact),
                         ctypes.addressof(exact)], [50, 200, 100, 100])
        assert st == [StatusCode.RESOURCE_EXHAUSTED, StatusCode.FAILED_PRECONDITION, OK,
                      StatusCode.NOT_FOUND]
        assert exact.raw == b"x" * 100


def test_first_writer_wins_and_already_exists_is_ok(kvpool_node):
    with Client(kvpool_node.socket) as c:
        assert c.put(["dup"], [b"first"]) == [OK]
        assert c.put(["dup"], [b"second"]) == [OK]
        assert c.get(["dup"]) == [b"first"]


def test_per_item_failures_are_statuses(kvpool_node):
    with Client(kvpool_node.socket) as c:
        too_big = c.max_value_size + 1
        buf = ctypes.create_string_buffer(16)
        st = c.put_ptrs(["zero", "huge", "fine"], [ctypes.addressof(buf)] * 3, [0, too_big, 16])
        assert st == [StatusCode.INVALID_ARGUMENT, StatusCode.INVALID_ARGUMENT, OK]
        assert c.exists(["zero", "huge", "fine"]) == [False, False, True]


def test_namespaces_isolate_keys(kvpool_node):
    with Client(kvpool_node.socket, namespace="a") as a, \
            Client(kvpool_node.socket, namespace=b"b") as b:
        assert a.put(["k"], [b"from-a"]) == [OK]
        assert b.get(["k"]) == [None]
        assert b.put(["k"], [b"from-b"]) == [OK]
        assert a.get(["k"]) == [b"from-a"]
        assert b.get(["k"]) == [b"from-b"]


def test_exists_hit_prefix_remove(kvpool_node):
    with Client(kvpool_node.socket) as c:
        keys = ["p%d" % i for i in range(10)]
        assert c.put(keys[:4] + keys[5:], [b"v"] * 9) == [OK] * 9
        assert c.exists(keys) == [True] * 4 + [False] + [True] * 5
        assert c.hit_prefix(keys) == 4
        assert c.hit_prefix(keys[5:]) == 5
        assert c.hit_prefix([]) == 0
        assert c.remove(["p0", "p4"]) == [OK, StatusCode.NOT_FOUND]
        assert c.hit_prefix(keys) == 0


def test_key_ids_are_reusable_and_bound_to_the_namespace(kvpool_node):
    with Client(kvpool_node.socket, namespace="x") as c, \
            Client(kvpool_node.socket, namespace="y") as other:
        ids = c.key_ids(["a", "b"])
        assert len(ids) == 2
        assert c.put(ids, [b"1", b"2"]) == [OK, OK]
        assert c.get(ids) == [b"1", b"2"]
        assert c.get(["a", "b"]) == [b"1", b"2"]
        with pytest.raises(ValueError):
            other.get(ids)


def test_values_larger_than_a_megabyte(kvpool_node):
    big = pattern(3, 3 << 20)
    with Client(kvpool_node.socket) as c, Client(kvpool_node.socket, copy_mode=True) as cc:
        assert c.put(["big"], [big]) == [OK]
        assert c.get(["big"]) == [big]
        assert cc.get(["big", "small-miss"]) == [big, None]  # second, exact-size round


def test_socket_from_environment(kvpool_node, monkeypatch):
    monkeypatch.setenv("KVPOOL_SOCKET", kvpool_node.socket)
    with Client() as c:
        assert c.socket == kvpool_node.socket
        assert c.put(["env"], [b"1"]) == [OK]


def test_node_down_at_open_raises_unavailable(dead_socket):
    with pytest.raises(KvpoolError) as e:
        Client(dead_socket, timeout_ms=500)
    assert e.value.code == StatusCode.UNAVAILABLE
    assert "no kvpool node" in e.value.message


def test_node_killed_then_restarted(kvpool_node):
    c = Client(kvpool_node.socket, timeout_ms=2000)
    assert c.put(["before"], [b"1"]) == [OK]
    kvpool_node.kill()
    for call in (lambda: c.get(["before"]), lambda: c.put(["x"], [b"1"]),
                 lambda: c.exists(["before"]), lambda: c.hit_prefix(["before"])):
        with pytest.raises(KvpoolError) as e:
            call()
        assert e.value.code == StatusCode.UNAVAILABLE
    kvpool_node.start()
    assert c.get(["before"]) == [None]  # DRAM content died with the node
    assert c.put(["after"], [b"2"]) == [OK]
    assert c.get(["after"]) == [b"2"]
    c.close()


def test_close_is_idempotent_and_later_calls_raise(kvpool_node):
    c = Client(kvpool_node.socket)
    c.close()
    c.close()
    assert c.closed
    with pytest.raises(KvpoolError) as e:
        c.get(["k"])
    assert e.value.code == StatusCode.FAILED_PRECONDITION


def test_concurrent_threads_share_one_client(kvpool_node):
    errors = []
    with Client(kvpool_node.socket) as c:
        def work(t):
            try:
                for r in range(20):
                    keys = ["t%d-%d-%d" % (t, r, i) for i in range(16)]
                    vals = [pattern(t * 1000 + r * 16 + i, 2048) for i in range(16)]
                    assert c.put(keys, vals) == [OK] * 16
                    assert c.get(keys) == vals
            except BaseException as e:  # collected and asserted below
                errors.append(e)
        threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []


def test_buffer_address_rejects_what_it_cannot_address():
    with pytest.raises(ValueError):
        buffer_address(torch.zeros(4, 4).t())
    with pytest.raises(ValueError):
        buffer_address(np.zeros((4, 4))[:, 1])
    with pytest.raises(TypeError):
        buffer_address("a string")
    t = torch.zeros(3, dtype=torch.float16)
    assert buffer_address(t) == (t.data_ptr(), 6)
    assert buffer_address(b"") == (0, 0)


def test_status_codes_match_the_library():
    lib = kvpool._native.lib()
    names = {c: lib.kvpool_status_name(c).decode() for c in StatusCode}
    assert names[StatusCode.OK] == "OK"
    assert names[StatusCode.NOT_FOUND] == "NotFound"
    assert names[StatusCode.DEADLINE_EXCEEDED] == "DeadlineExceeded"
    assert names[StatusCode.PERMISSION_DENIED] == "PermissionDenied"
    assert lib.kvpool_status_name(len(StatusCode)).decode() == "Unknown"
    assert len(set(names.values())) == len(StatusCode)
    assert kvpool.version().count(".") == 2


def test_library_path_from_environment(monkeypatch):
    monkeypatch.setenv("KVPOOL_LIBRARY", "/nonexistent/libkvpool.so")
    assert kvpool._native.candidates()[0] == "/nonexistent/libkvpool.so"


def test_remote_mode_reaches_a_node_over_its_peer_port(node_factory, monkeypatch):
    """Client(remote=...) on a host without a node socket: a one-node static
    --peers cluster, UCX over loopback TCP."""
    monkeypatch.setenv("UCX_TLS", "tcp")
    monkeypatch.setenv("UCX_NET_DEVICES", "lo")
    # A remote client without a token: the node runs without the cluster key.
    node, (port,) = start_on_free_ports(
        lambda ports: (node_factory(["--node-id", "n1", "--peers", "n1=127.0.0.1:%d" % ports[0],
                                     "--peer-port", str(ports[0]), "--insecure"]), ports), 1)
    big = pattern(4, 3 << 20)  # over the first 1 MiB guess: a second, exact-size round
    with Client(remote="127.0.0.1:%d" % port, namespace="r") as c:
        assert c.put(["a", "big"], [b"hello", big]) == [OK, OK]
        assert c.get(["a", "big", "miss"]) == [b"hello", big, None]
        assert c.exists(["a", "miss"]) == [True, False]
        assert c.hit_prefix(["a", "big", "miss"]) == 2
    with Client(node.socket, namespace="r") as local:
        assert local.get(["a"]) == [b"hello"]


def test_acquire_reads_values_in_place_and_releases_them(kvpool_node):
    with Client(kvpool_node.socket) as c, Client(kvpool_node.socket, copy_mode=True) as cc:
        assert c.maps_segment and not cc.maps_segment
        assert c.put(["a", "b"], [b"x" * 1000, b"y" * 3]) == [StatusCode.OK] * 2
        with c.acquire(["a", "missing", "b"]) as regions:
            assert regions[1] is None
            assert [size for _, size in (regions[0], regions[2])] == [1000, 3]
            assert ctypes.string_at(*regions[0]) == b"x" * 1000
            assert ctypes.string_at(*regions[2]) == b"y" * 3
            pins = c.stats()["dram"]["pinned"]
        assert pins == 2
        assert c.stats()["dram"]["pinned"] == 0  # released on leaving
        with c.acquire([]) as none:
            assert none == []
        with pytest.raises(KvpoolError) as e:
            with cc.acquire(["a"]):
                pass
        assert e.value.code == StatusCode.FAILED_PRECONDITION


def test_client_name_is_what_the_node_shows_for_the_connection(kvpool_node):
    import json
    import urllib.request

    def clients():
        url = "http://127.0.0.1:%d/api/v1/clients" % kvpool_node.admin_port
        return json.loads(urllib.request.urlopen(url, timeout=10).read())["clients"]

    with kvpool.Client(kvpool_node.socket, namespace="n", client_name="py engine 3") as c:
        assert c.put(["k"], [b"x" * 100]) == [kvpool.StatusCode.OK]
        (me,) = clients()
        assert me["name"] == "py engine 3"
        assert me["pid"] == os.getpid()
        assert me["bytes_written"] == 100
    # Without a name, the program's (its argv[0]'s base name).
    with open("/proc/self/cmdline", "rb") as f:
        program = os.path.basename(f.read().split(b"\0")[0].decode())
    with kvpool.Client(kvpool_node.socket, namespace="n") as c:
        c.exists(["k"])
        names = [x["name"] for x in clients()]  # the first may still be closing
        assert program in names and set(names) <= {program, "py engine 3"}, names


def test_described_puts_and_the_prefix_lookup(kvpool_node):
    """Blocks put with descriptors are what Client.lookup_prefix finds; a
    bad descriptor fails its own key only (nothing stored); a descriptor
    mapping naming a key not in the put raises before anything is sent."""
    c = Client(kvpool_node.socket, namespace="lookup")
    chain = [0x7000 + i for i in range(4)]
    descs = [kvpool.BlockDescriptor(hash=h, parent=chain[i - 1] if i else None,
                                    token_ids=range(i * 8, i * 8 + 8), block_size=8)
             for i, h in enumerate(chain[:3])]
    assert c.put(["b0", "b1", "b2"], [b"x" * 100] * 3, descriptors=descs) == [StatusCode.OK] * 3
    got = c.lookup_prefix(chain)
    assert got["blocks"] == 4 and got["longest"] == 3
    assert [(h["blocks"], h["dram"], h["ssd"], h["tiers"]) for h in got["holders"]] == \
        [(3, 3, 0, "DDD")]
    assert c.lookup_prefix([0x1, chain[0]])["longest"] == 0  # the first block is not held
    # A malformed descriptor (cut short) fails its key; the other is stored.
    bad = descs[0].encode()[:-1]
    assert c.put(["c0", "c1"], [b"y", b"z"], descriptors=[bad, None]) == \
        [StatusCode.INVALID_ARGUMENT, StatusCode.OK]
    assert c.get(["c0", "c1"]) == [None, b"z"]
    with pytest.raises(ValueError, match="not in the put"):
        c.put(["d0"], [b"w"], descriptors={"d0": descs[0], "stranger": descs[1]})
    assert c.get(["d0"]) == [None]
    with pytest.raises(ValueError, match="token ids"):
        kvpool.BlockDescriptor(hash=1, block_size=8, token_ids=range(7))
    with pytest.raises(KvpoolError) as e:
        c.lookup_prefix([1] * 5000)
    assert e.value.code == StatusCode.INVALID_ARGUMENT
    c.close()
