"""Cache hints from the Python client (Client.hint, kvpool_hint) on a real
kvpool-node with an SSD tier: demote moves keys to SSD, prefetch brings
them back before the read (a prefetch hit on /metrics), retain and pin
keep keys through a flood that takes every other, release ends them, and
bad hints raise with nothing changed; every value byte-exact."""

import re
import urllib.request

import pytest

import kvpool

VALUE = 64 * 1024


def value(i):
    return (("hint/%d/" % i).encode() * (VALUE // 8 + 1))[:VALUE]


def metric(node, name):
    text = urllib.request.urlopen(
        "http://127.0.0.1:%d/metrics" % node.admin_port, timeout=10).read().decode()
    m = re.search(r"^%s (\S+)$" % re.escape(name), text, re.M)
    return float(m.group(1)) if m else None


def put(c, keys):
    for i in range(0, len(keys), 16):
        part = keys[i:i + 16]
        assert c.put(part, [value(int(k[1:])) for k in part]) == \
            [kvpool.StatusCode.OK] * len(part)


def test_demote_and_prefetch_move_keys_between_tiers(node_factory, tmp_path):
    node = node_factory(dram="16MiB", extra_args=[
        "--ssd", str(tmp_path), "--ssd-capacity", "64MiB", "--ssd-region-size", "1MiB"])
    c = kvpool.Client(node.socket, namespace="py-hints")
    try:
        keys = ["k%d" % i for i in range(8)]
        put(c, keys)
        assert c.hint("demote", keys[:5] + ["k99"]) == \
            {"applied": 5, "unknown": 1, "clipped": 0, "moved": 5}
        assert c.stats()["dram"]["entries"] == 3
        assert c.hint("prefetch", keys[:3] + ["k99"]) == \
            {"applied": 3, "unknown": 1, "clipped": 0, "moved": 3}
        assert c.stats()["dram"]["entries"] == 6
        assert c.get(keys) == [value(i) for i in range(8)]
        assert metric(node, 'kvpool_tenant_dram_prefetch_hits{tenant="default"}') == 3
        assert metric(node, 'kvpool_hints_total{op="prefetch"}') == 1
    finally:
        c.close()


def test_retain_pin_release_and_bad_hints(node_factory):
    node = node_factory(dram="16MiB", extra_args=[
        "--eviction", "lru", "--pin-max-bytes", "64KiB", "--hint-max-ttl", "1h"])
    c = kvpool.Client(node.socket, namespace="py-hints")
    try:
        keys = ["k%d" % i for i in range(200)]  # the store holds 250 of 64 KiB
        put(c, keys)
        assert c.hint("retain", ["k10", "k11"], ttl_s=600, priority=9)["applied"] == 2
        assert c.hint("pin", ["k12"], ttl_s=600)["applied"] == 1
        # Bad hints raise and change nothing.
        for op, ks, ttl, prio, code in [
                ("pin", ["k13"], 600, 0, kvpool.StatusCode.RESOURCE_EXHAUSTED),  # budget
                ("retain", ["k3"], 0, 0, kvpool.StatusCode.INVALID_ARGUMENT),  # ttl 0
                ("retain", ["k3"], 3601, 0, kvpool.StatusCode.INVALID_ARGUMENT),  # past max
                ("retain", ["k3"], 1, 256, kvpool.StatusCode.INVALID_ARGUMENT),
                ("retain", ["k3"] * 8193, 1, 0, kvpool.StatusCode.INVALID_ARGUMENT),
                ("keep", ["k3"], 1, 0, kvpool.StatusCode.INVALID_ARGUMENT)]:
            with pytest.raises(kvpool.KvpoolError) as e:
                c.hint(op, ks, ttl_s=ttl, priority=prio)
            assert e.value.code == code, (op, ttl, prio, e.value)
        put(c, ["k%d" % i for i in range(1000, 1300)])  # a flood of 300
        assert c.exists(["k10", "k11", "k12", "k3", "k13", "k199"]) == \
            [True, True, True, False, False, False]
        assert c.hint("release", ["k10", "k12", "k7"]) == \
            {"applied": 2, "unknown": 1, "clipped": 0, "moved": 0}
        put(c, ["k%d" % i for i in range(1300, 1600)])
        assert c.exists(["k10", "k11", "k12"]) == [False, True, False]
        assert c.get(["k11"]) == [value(11)]
        assert metric(node, 'kvpool_hints_refused_total{reason="pin_budget"}') == 1
        assert metric(node, 'kvpool_hints_refused_total{reason="bad_ttl"}') == 2
    finally:
        c.close()
