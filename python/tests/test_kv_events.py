"""KV events of a real kvpool-node, read by a subscriber written from the
wire format (kv_events_util): exact stored/removed events for a scripted
sequence, in order, with no gaps in sequence numbers, and replay."""

import time

import pytest

import kvpool
from kv_events_util import Subscriber, flatten
from ports_util import start_on_free_ports

VALUE = 256 * 1024


def events_node(node_factory, encoding="map", extra=()):
    node, (pub, rep) = start_on_free_ports(lambda ports: (node_factory(extra_args=[
        "--kv-events-endpoint", "tcp://127.0.0.1:%d" % ports[0],
        "--kv-events-replay-endpoint", "tcp://127.0.0.1:%d" % ports[1],
        "--kv-events-encoding", encoding, "--kv-events-batch-interval", "2ms",
        "--eviction", "lru"] + list(extra), dram="16MiB"), ports), 2)
    return node, "tcp://127.0.0.1:%d" % pub, "tcp://127.0.0.1:%d" % rep


def hashes(client, keys, as_bytes=False):
    """The hashes events name the keys by: the key id's high 64 bits as an
    int (the default), or the 16-byte key id (--kv-events-hash bytes)."""
    ids = client.key_ids(keys)
    if not as_bytes:
        return [ids.ids[i].hi for i in range(ids.n)]
    return [ids.ids[i].hi.to_bytes(8, "big") + ids.ids[i].lo.to_bytes(8, "big")
            for i in range(ids.n)]


def all_batches(sub, want_events, timeout_s=10):
    """Every batch from seq 0 through replay, until `want_events` blocks are told."""
    deadline = time.monotonic() + timeout_s
    while True:
        batches = sub.replay(0)
        got = sum(len(flatten(ev)) for _, ev in batches)
        if got >= want_events or time.monotonic() > deadline:
            return batches
        time.sleep(0.02)


def value(i):
    return bytes([i % 251]) * VALUE


@pytest.mark.parametrize("encoding", ["map", "array"])
def test_scripted_puts_evictions_and_removes_give_exact_events(node_factory, encoding):
    node, pub, rep = events_node(node_factory, encoding)
    sub = Subscriber(pub, rep)
    c = kvpool.Client(node.socket, namespace="ev")
    try:
        # Fill DRAM one key at a time until the first eviction, then two more.
        keys, n_evicted = [], 0
        i = 0
        while n_evicted < 2:
            k = "k%d" % i
            assert c.put([k], [value(i)]) == [kvpool.StatusCode.OK]
            keys.append(k)
            held = c.stats()["dram"]["entries"]
            n_evicted = len(keys) - held
            i += 1
        cap = len(keys) - n_evicted
        assert c.remove([keys[-1]]) == [kvpool.StatusCode.OK]
        h = hashes(c, keys)
        # The node starts over: its first event clears what a router knew.
        want = [("AllBlocksCleared", None, None)]
        want += [("BlockStored", "CPU", x) for x in h[:cap]]
        for j in range(cap, len(keys)):
            want.append(("BlockRemoved", "CPU", h[j - cap]))  # LRU: the oldest goes first
            want.append(("BlockStored", "CPU", h[j]))
        want.append(("BlockRemoved", "CPU", h[-1]))
        batches = all_batches(sub, len(want))
        seqs = [s for s, _ in batches]
        assert seqs == list(range(len(batches)))  # from 0, no gaps
        got = [e for _, ev in batches for e in flatten(ev)]
        assert got == want
        # Live subscribers see the same batches from the seq they joined at.
        assert c.put(["late"], [value(7)]) == [kvpool.StatusCode.OK]
        live = None
        deadline = time.monotonic() + 10
        while live is None and time.monotonic() < deadline:
            r = sub.recv(200)
            if r is not None and any(e[2] == hashes(c, ["late"])[0] for e in flatten(r[1])):
                live = r
        assert live is not None and live[0] >= len(batches)
        # Replay from a seq in the middle gives exactly the batches from it on.
        mid = len(batches) // 2
        again = sub.replay(mid)
        assert [s for s, _ in again][:len(batches) - mid] == seqs[mid:]
        assert again[:len(batches) - mid] == batches[mid:]
        metrics = node_metrics(node)
        assert metrics["kvpool_kv_events_dropped_total"] == 0
        assert metrics["kvpool_kv_events_total"] >= len(want)
    finally:
        c.close()
        sub.close()


def test_ssd_tier_moves_and_drops_are_told_with_their_medium(node_factory, tmp_path):
    node, pub, rep = events_node(node_factory, extra=[
        "--ssd", str(tmp_path), "--ssd-capacity", "8MiB", "--ssd-region-size", "1MiB"])
    sub = Subscriber(pub, rep)
    c = kvpool.Client(node.socket, namespace="ev")
    try:
        # Enough values to overflow DRAM (16 MiB) and then the SSD tier (8 MiB).
        n = 120
        for i in range(n):
            assert c.put(["s%d" % i], [value(i)]) == [kvpool.StatusCode.OK]
        c.flush()
        h = hashes(c, ["s%d" % i for i in range(n)])
        st = c.stats()
        ssd_entries = st["ssd"]["entries"]
        deadline = time.monotonic() + 10
        got = []
        while time.monotonic() < deadline:
            batches = sub.replay(0)
            got = [e for _, ev in batches for e in flatten(ev)]
            held = {}
            for typ, medium, x in got:
                held.setdefault(medium, set())
                if typ == "BlockStored":
                    held[medium].add(x)
                else:
                    held[medium].discard(x)
            if len(held.get("STORAGE", ())) == ssd_entries:
                break
            time.sleep(0.05)
        assert [s for s, _ in batches] == list(range(len(batches)))
        assert got[0] == ("AllBlocksCleared", None, None)
        # Per key: stored on CPU first; a move to SSD is removed from CPU then
        # stored on STORAGE; every STORAGE removal follows a STORAGE store.
        for x in h:
            mine = [(t, m) for t, m, y in got if y == x]
            assert mine[0] == ("BlockStored", "CPU")
            state = {"CPU": False, "STORAGE": False}
            for t, m in mine:
                assert state[m] == (t == "BlockRemoved"), (mine, x)
                state[m] = t == "BlockStored"
        assert any(t == "BlockRemoved" and m == "STORAGE" for t, m, _ in got)  # SSD reclaimed
        # What the events say each tier holds is what the node holds.
        assert len(held["CPU"]) == st["dram"]["entries"]
        assert len(held["STORAGE"]) == ssd_entries
        # A restarted node announces what its SSD tier recovered.
        c.close()
        sub.close()
        node.stop()
        node.start()
        sub = Subscriber(pub, rep)
        c = kvpool.Client(node.socket, namespace="ev")
        st = c.stats()
        batches = all_batches(sub, 1 + st["ssd"]["entries"])
        got = [e for _, ev in batches for e in flatten(ev)]
        assert got[0] == ("AllBlocksCleared", None, None)
        recovered = {x for t, m, x in got[1:] if t == "BlockStored" and m == "STORAGE"}
        assert len(recovered) == st["ssd"]["entries"] > 0
        assert recovered <= set(h)
    finally:
        c.close()
        sub.close()


def node_metrics(node):
    import urllib.request
    text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % node.admin_port).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("kvpool_kv_events") and "{" not in line.split(" ")[0]:
            name, v = line.split(" ")[:2]
            out[name] = float(v)
    return out
