"""Upgrades as an operator meets them (docs/operations.md, Upgrades).

A node restarted on the SSD tier it wrote keeps its entries; a tier in
another on-disk format version stops the start with a message that says
what and how to go on, and --ssd-wipe-other-format starts it empty; a
client speaking another protocol version is refused with a clear error.
"""

import os
import struct

import pytest

import kvpool


def ssd_args(path):
    return ["--ssd", str(path), "--ssd-capacity", "64MiB", "--ssd-region-size", "1MiB"]


def test_restart_keeps_ssd_entries_and_another_format_is_refused_then_wiped(node_factory,
                                                                           tmp_path):
    ssd = tmp_path / "ssd"
    node = node_factory(ssd_args(ssd), dram="16MiB")
    keys = ["k%d" % i for i in range(64)]
    values = [os.urandom(256 << 10) for _ in keys]  # 16 MiB: most go down to SSD
    with kvpool.Client(node.socket, namespace="upgrade") as c:
        assert c.put(keys, values) == [kvpool.StatusCode.OK] * len(keys)
    assert node.stop() == 0
    node.start()  # the same on-disk format: everything comes back
    with kvpool.Client(node.socket, namespace="upgrade") as c:
        assert c.get(keys) == values
    assert node.stop() == 0

    # Another format version in the superblock (uint16 at offset 4).
    data = ssd / "kvpool-ssd.data"
    with open(data, "r+b") as f:
        f.seek(4)
        f.write(struct.pack("<H", 99))
    with pytest.raises(RuntimeError) as e:
        node.start()
    log = str(e.value)
    assert "holds an SSD tier of on-disk format version 99" in log
    assert "--ssd-wipe-other-format" in log
    with open(data, "rb") as f:  # left as it was
        f.seek(4)
        assert struct.unpack("<H", f.read(2))[0] == 99

    node.extra_args += ["--ssd-wipe-other-format"]
    node.start()
    with kvpool.Client(node.socket, namespace="upgrade") as c:
        assert c.get(keys) == [None] * len(keys)
        assert c.put(keys[:1], values[:1]) == [kvpool.StatusCode.OK]
    assert "starts cold: format version 99" in node.log()
