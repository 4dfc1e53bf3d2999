"""A KV event subscriber for tests, written from the wire format in
src/events/kv_events_format.h with Debian's python3-zmq and python3-msgpack:
decodes batches in both event encodings (maps and arrays in field order)."""

import struct

import msgpack
import zmq

# Field order of the array encoding, after the type tag.
FIELDS = {
    "BlockStored": ["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                    "medium", "lora_name"],
    "BlockRemoved": ["block_hashes", "medium"],
    "AllBlocksCleared": [],
}


def decode_event(ev):
    """An event as a dict with "type" and its fields, from either encoding."""
    if isinstance(ev, dict):
        return dict(ev)
    tag, values = ev[0], ev[1:]
    names = FIELDS[tag]
    if len(values) != len(names):
        raise AssertionError("%s with %d fields, expected %d" % (tag, len(values), len(names)))
    d = {"type": tag}
    d.update(zip(names, values))
    return d


def decode_batch(payload):
    """(ts, [event dicts], dp_rank) from one msgpack EventBatch."""
    batch = msgpack.unpackb(payload, raw=False)
    if not isinstance(batch, list) or len(batch) != 3:
        raise AssertionError("EventBatch is not a 3-array: %r" % (batch,))
    ts, events, rank = batch
    return ts, [decode_event(e) for e in events], rank


def flatten(events):
    """[(type, medium, hash)] in order (an int hash, the node's default, or the
    16-byte key id under --kv-events-hash bytes); AllBlocksCleared as (type,
    None, None)."""
    out = []
    for e in events:
        if e["type"] == "AllBlocksCleared":
            out.append((e["type"], None, None))
            continue
        for h in e["block_hashes"]:
            out.append((e["type"], e["medium"], h if isinstance(h, int) else bytes(h)))
    return out


def seq_of(frame):
    return struct.unpack(">q", frame)[0]


class Subscriber:
    def __init__(self, endpoint, replay_endpoint=None, topic=b""):
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, topic)
        self.sub.connect(endpoint)
        self.replay_endpoint = replay_endpoint

    def recv(self, timeout_ms=2000):
        """(seq, events) of the next batch, or None on timeout."""
        if not self.sub.poll(timeout_ms):
            return None
        frames = self.sub.recv_multipart()
        if len(frames) != 3:
            raise AssertionError("a message of %d frames" % len(frames))
        return seq_of(frames[1]), decode_batch(frames[2])[1]

    def replay(self, start, timeout_ms=5000):
        """[(seq, events)] of the batches the node still keeps from `start` on."""
        dealer = self.ctx.socket(zmq.DEALER)
        dealer.connect(self.replay_endpoint)
        try:
            dealer.send_multipart([b"", struct.pack(">q", start)])
            out = []
            while True:
                if not dealer.poll(timeout_ms):
                    raise AssertionError("replay: no end marker")
                frames = dealer.recv_multipart()
                if frames[0] != b"":
                    raise AssertionError("replay: no delimiter frame")
                topic, seq, payload = frames[1:]
                if seq_of(seq) == -1:
                    if topic != b"" or payload != b"":
                        raise AssertionError("replay: bad end marker")
                    return out
                out.append((seq_of(seq), decode_batch(payload)[1]))
        finally:
            dealer.close(0)

    def close(self):
        self.sub.close(0)
        self.ctx.term()
