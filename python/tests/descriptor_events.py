"""Helpers of test_connector_descriptors.py: a node with KV events on, a tap
that collects every event it publishes between two marker puts (raw msgpack
bytes of each event and its decoded form), the BlockStored a described
block must be told as, and the byte-exact check of a connector's pages.

Written from docs/kv-events.md, src/events/kv_events_format.h and the
descriptor format (kvpool.descriptor), not from the connectors: the
expected events come from what the engine stand-ins hold (vLLM's
request.block_hashes, SGLang's page hashes, LMCache's keys)."""

import collections

import msgpack
import zmq

import kvpool
from event_decoders import DECODERS
from ports_util import start_on_free_ports

MASK64 = (1 << 64) - 1


def events_node(node_factory, encoding="map", hash_mode="int64", extra=()):
    """(node, PUB endpoint) of a fresh node publishing KV events."""
    def start(ports):
        endpoint = "tcp://127.0.0.1:%d" % ports[0]
        return node_factory(extra_args=["--kv-events-endpoint", endpoint,
                                        "--kv-events-encoding", encoding,
                                        "--kv-events-hash", hash_mode,
                                        "--kv-events-batch-interval", "2ms"] + list(extra)), endpoint

    return start_on_free_ports(start, 1)


def raw_events(payload):
    """[(raw bytes of the event, decoded event)] of one EventBatch."""
    u = msgpack.Unpacker(raw=False)
    u.feed(payload)
    assert u.read_array_header() == 3
    u.skip()  # ts
    out = []
    for _ in range(u.read_array_header()):
        start = u.tell()
        ev = u.unpack()
        out.append((payload[start:u.tell()], ev))
    return out


def _tag(ev):
    return ev["type"] if isinstance(ev, dict) else ev[0]


def _hashes(ev):
    return ev["block_hashes"] if isinstance(ev, dict) else ev[1]


class EventTap:
    """Subscribes to a node's events. start() returns once the subscription
    is live (a marker put is told); collect() puts another marker and
    returns every event told in between, markers left out. Markers are
    undescribed puts in a namespace of their own, named by their key id's
    high 64 bits (--kv-events-hash int64 or as-written)."""

    def __init__(self, node, endpoint):
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(endpoint)
        self.client = kvpool.Client(node.socket, namespace="event-tap")
        self.payloads = []
        self._markers = set()
        self._n = 0

    def _marker(self):
        key = "marker-%d" % self._n
        self._n += 1
        assert self.client.put([key], [b"m"]) == [kvpool.StatusCode.OK]
        h = self.client.key_ids([key]).ids[0].hi
        self._markers.add(h)
        return h

    def _read_until(self, h, timeout_ms):
        """Reads batches until one tells marker h; False on timeout."""
        while self.sub.poll(timeout_ms):
            frames = self.sub.recv_multipart()
            assert len(frames) == 3
            self.payloads.append(frames[2])
            if any(h in _hashes(ev) for _, ev in raw_events(frames[2])
                   if _tag(ev) == "BlockStored"):
                return True
        return False

    def start(self):
        for _ in range(100):  # a SUB socket joins asynchronously
            if self._read_until(self._marker(), 100):
                self.payloads = []
                return self
        raise AssertionError("the subscription never went live")

    def collect(self):
        """[(raw, event)] told since start() (or the last collect()), in order."""
        assert self._read_until(self._marker(), 5000), \
            "the closing marker was never told by its key id (named by a descriptor not its own?)"
        payloads, self.payloads = self.payloads, []
        out = []
        for p in payloads:
            for raw, ev in raw_events(p):
                if _tag(ev) == "BlockStored" and set(_hashes(ev)) & self._markers:
                    # A marker merged into a run of undescribed blocks: the
                    # run without it (a marker never joins a described run).
                    rest = [h for h in _hashes(ev) if h not in self._markers]
                    if not rest:
                        continue
                    ev = dict(ev, block_hashes=rest) if isinstance(ev, dict) else \
                        [ev[0], rest] + ev[2:]
                    raw = msgpack.packb(ev, use_bin_type=True)
                out.extend(split_chain(raw, ev))
        self.last_payloads = payloads
        return out

    def close(self):
        self.client.close()
        self.sub.close(0)
        self.ctx.term()


def split_chain(raw, ev):
    """A described BlockStored told for a chain of blocks (docs/kv-events.md:
    the first block's parent, the tokens concatenated) as the one-block
    events of its blocks: [(raw, event)]. Other events as they are."""
    if _tag(ev) != "BlockStored" or len(_hashes(ev)) < 2:
        return [(raw, ev)]
    if isinstance(ev, dict):
        hashes, parent, tokens, size = (ev["block_hashes"], ev["parent_block_hash"],
                                        ev["token_ids"], ev["block_size"])
    else:
        hashes, parent, tokens, size = ev[1], ev[2], ev[3], ev[4]
    if size == 0:  # undescribed keys: one event, named by their key ids
        return [(raw, ev)]
    per = len(tokens) // len(hashes)
    assert per * len(hashes) == len(tokens), "a chain's tokens do not split by block"
    out = []
    for j, h in enumerate(hashes):
        p = parent if j == 0 else hashes[j - 1]
        t = tokens[j * per:(j + 1) * per]
        if isinstance(ev, dict):
            one = dict(ev, block_hashes=[h], parent_block_hash=p, token_ids=t)
        else:
            one = [ev[0], [h], p, t] + ev[4:]
        out.append((msgpack.packb(one, use_bin_type=True), one))
    return out


def stored(encoding, h, parent, tokens, block_size, lora=None, group=None, kind=None):
    """The BlockStored a described block is told as (docs/kv-events.md):
    maps in the node's field order, group_idx and kv_cache_spec_kind in
    maps only and only when set; arrays positional."""
    if encoding == "array":
        return ["BlockStored", [h], parent, list(tokens), block_size, None, "CPU", lora]
    ev = {"type": "BlockStored", "block_hashes": [h], "parent_block_hash": parent,
          "token_ids": list(tokens), "block_size": block_size, "lora_id": None, "medium": "CPU",
          "lora_name": lora}
    if group is not None:
        ev["group_idx"] = group
    if kind is not None:
        ev["kv_cache_spec_kind"] = kind
    ev["locality"] = "LOCAL"
    return ev


def check_pages(events, expected):
    """Asserts that the BlockStored events told are, byte for byte, exactly
    the expected ones: expected is [(event, number of pages put for that
    block)]. Every page put is told once, with its block's descriptor."""
    got = collections.Counter(raw for raw, ev in events if _tag(ev) == "BlockStored")
    want = collections.Counter()
    for ev, pages in expected:
        want[msgpack.packb(ev, use_bin_type=True)] += pages
    if got != want:
        missing = want - got
        extra = got - want
        raise AssertionError(
            "BlockStored events differ from the blocks put:\n  missing %s\n  unexpected %s"
            % ([msgpack.unpackb(r, raw=False) for r in list(missing)[:4]],
               [msgpack.unpackb(r, raw=False) for r in list(extra)[:4]]))


def decodes_everywhere(payloads, consumers=tuple(DECODERS)):
    """Every batch decodes under each consumer's rules (event_decoders)."""
    for p in payloads:
        for name in consumers:
            DECODERS[name](p)
