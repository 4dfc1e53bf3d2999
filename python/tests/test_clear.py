"""Clearing a namespace on a real kvpool-node (kvpool_clear_namespace,
Client.clear, kvpoolctl clear): every key of the namespace a miss at once,
in DRAM and on SSD, other namespaces untouched byte for byte, the space
back, and the clear counted."""

import os
import subprocess

import kvpool
from ports_util import start_on_free_ports

VALUE = 64 * 1024


def value(ns, i):
    return (("%s/%d/" % (ns, i)).encode() * (VALUE // 8 + 1))[:VALUE]


def fill(c, ns, n):
    keys = ["k%d" % i for i in range(n)]
    for i in range(0, n, 16):
        part = keys[i:i + 16]
        assert c.put(part, [value(ns, int(k[1:])) for k in part]) == \
            [kvpool.StatusCode.OK] * len(part)
    return keys


def test_clear_drops_one_namespace_at_once_and_frees_its_space(node_factory):
    node = node_factory(dram="64MiB")
    a = kvpool.Client(node.socket, namespace="engine-a")
    b = kvpool.Client(node.socket, namespace="engine-b")
    try:
        before = a.stats()["dram"]
        keys_b = fill(b, "engine-b", 100)
        mid = a.stats()["dram"]
        keys_a = fill(a, "engine-a", 200)
        assert a.exists(keys_a) == [True] * 200
        assert a.clear() == 200
        assert a.exists(keys_a) == [False] * 200
        assert b.exists(keys_b) == [True] * 100
        assert b.get(keys_b) == [value("engine-b", i) for i in range(100)]
        after = a.stats()["dram"]
        assert after["entries"] == mid["entries"] == before["entries"] + 100
        assert after["used_bytes"] == mid["used_bytes"]
        # A second clear finds nothing; the namespace takes puts again.
        assert a.clear() == 0
        assert a.put(["k0"], [value("engine-a", 0)]) == [kvpool.StatusCode.OK]
        assert a.get(["k0"]) == [value("engine-a", 0)]
        # Clearing another namespace by name, from any client.
        assert a.clear("engine-b") == 100
        assert b.exists(keys_b) == [False] * 100
        assert a.exists(["k0"]) == [True]
    finally:
        a.close()
        b.close()


def test_clear_reaches_the_ssd_tier(node_factory, tmp_path):
    node = node_factory(dram="16MiB", extra_args=[
        "--ssd", str(tmp_path), "--ssd-capacity", "64MiB", "--ssd-region-size", "1MiB"])
    a = kvpool.Client(node.socket, namespace="a")
    b = kvpool.Client(node.socket, namespace="b")
    try:
        keys_b = fill(b, "b", 150)  # 9.4 MiB
        keys_a = fill(a, "a", 400)  # 25 MiB: most of a and b go to SSD
        a.flush()
        st = a.stats()
        # All 400 of a are held and DRAM holds fewer entries than that: some of
        # a are on SSD only, so the clear must reach the SSD tier.
        assert st["dram"]["entries"] < 400
        assert sum(a.exists(keys_a)) == 400
        assert a.clear() == 400
        assert a.exists(keys_a) == [False] * 400
        assert b.get(keys_b) == [value("b", i) for i in range(150)]
        st2 = a.stats()
        assert st2["dram"]["entries"] + st2["ssd"]["entries"] <= 150 + 150  # b, maybe twice
        assert sum(b.exists(keys_b)) == 150
        # After a restart from the SSD tier the cleared keys stay gone.
        node.stop()
        node.start()
        a2 = kvpool.Client(node.socket, namespace="a")
        b2 = kvpool.Client(node.socket, namespace="b")
        try:
            assert a2.exists(keys_a) == [False] * 400
            assert b2.get(keys_b[:20]) == [value("b", i) for i in range(20)]
        finally:
            a2.close()
            b2.close()
    finally:
        a.close()
        b.close()


def test_kvpoolctl_clear(node_factory):
    node = node_factory()
    c = kvpool.Client(node.socket, namespace="ctl")
    try:
        fill(c, "ctl", 5)
        ctl = os.path.join(os.path.dirname(os.environ.get("KVPOOL_NODE") or os.path.join(
            os.path.dirname(__file__), "..", "..", "build", "src", "node", "kvpool-node")),
            "..", "..", "tools", "kvpoolctl")
        out = subprocess.run([ctl, "--socket", node.socket, "clear", "ctl"], check=True,
                             capture_output=True, text=True).stdout
        assert out == "cleared ctl: 5 entries dropped\n"
        assert c.exists(["k%d" % i for i in range(5)]) == [False] * 5
        bad = subprocess.run([ctl, "--socket", node.socket, "clear"], capture_output=True)
        assert bad.returncode == 2
    finally:
        c.close()


def test_a_node_pooled_with_a_cluster_refuses_to_clear(node_factory):
    node = start_on_free_ports(lambda ports: node_factory(extra_args=[
        "--node-id", "n0", "--peers", "n0=127.0.0.1:%d" % ports[0], "--peer-port", str(ports[0])]),
        1)
    c = kvpool.Client(node.socket, namespace="pooled")
    try:
        fill(c, "pooled", 3)
        try:
            c.clear()
            raise AssertionError("clear of a pooled store succeeded")
        except kvpool.KvpoolError as e:
            assert e.code == kvpool.StatusCode.FAILED_PRECONDITION
            assert "pooled with a cluster" in str(e)
        assert c.exists(["k0", "k1", "k2"]) == [True] * 3  # nothing dropped
    finally:
        c.close()
