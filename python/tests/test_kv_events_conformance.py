"""A real kvpool-node's KV events against test decoders of the real
consumers (event_decoders: vLLM's msgspec rules, llm-d's indexer, Dynamo's
router, from ENGINES.md part 7), in both encodings: a scripted sequence of
puts, evictions, SSD demotion and promotion, a remove and a namespace clear
decodes with 0 batches rejected by any of them. The even keys are put with
block descriptors (kvpool.BlockDescriptor): each event about one names the
engine hash, parent, tokens and block size that were put, on the right
medium, and Dynamo's and llm-d's rules index exactly those blocks.
Negative controls: the node's encoding before this (maps of three fields,
16-byte bin hashes) is rejected by each decoder that must reject it, and a
block named by its key id (no descriptor) is indexed by neither router."""

import time

import msgpack
import pytest
import zmq

import kvpool
from event_decoders import DECODERS, Rejected, dynamo, dynamo_tier, llmd, msgspec_vllm
from kv_events_util import seq_of
from ports_util import free_port, start_on_free_ports

VALUE = 256 * 1024
TOPIC = b"kv@node-a@model-x"
BLOCK = 16  # tokens per block, as the router's kv_block_size


def engine_block(i):
    """What an engine says of the block the i-th key holds (even keys): a
    chain of int hashes, 16 tokens each."""
    if i % 2:
        return None
    parent = None if i == 0 else 0x5EED0000 + i - 2
    return {"hash": 0x5EED0000 + i, "parent": parent,
            "tokens": list(range(i * BLOCK, (i + 1) * BLOCK))}


def descriptor(i):
    b = engine_block(i)
    if b is None:
        return None
    return kvpool.BlockDescriptor(hash=b["hash"], parent=b["parent"], token_ids=b["tokens"],
                                  block_size=BLOCK, group_idx=0, spec_kind="full")


def indexed(events, router):
    """The hashes a router indexes from BlockStored events: Dynamo needs its
    own block size and every block's tokens (7.3); llm-d re-hashes the
    tokens and indexes nothing from an event without them (7.2)."""
    out = set()
    for e in events:
        if e["type"] != "BlockStored":
            continue
        n = len(e["block_hashes"])
        if router == "dynamo" and (e["block_size"] != BLOCK or len(e["token_ids"]) != n * BLOCK):
            continue  # "Block not published"
        if router == "llm-d" and not e["token_ids"]:
            continue
        out.update(e["block_hashes"])
    return out


def run_script(node_factory, tmp_path, encoding):
    """Runs the sequence on a fresh node; returns (live frames, replayed
    payloads, the int hashes of the keys put)."""
    node, (pub, rep) = start_on_free_ports(lambda ports: (node_factory(extra_args=[
        "--kv-events-endpoint", "tcp://127.0.0.1:%d" % ports[0],
        "--kv-events-replay-endpoint", "tcp://127.0.0.1:%d" % ports[1],
        "--kv-events-encoding", encoding, "--kv-events-batch-interval", "2ms",
        "--kv-events-topic", TOPIC.decode(), "--eviction", "lru",
        "--ssd", str(tmp_path / encoding), "--ssd-capacity", "64MiB",
        "--ssd-region-size", "1MiB"], dram="16MiB"), ports), 2)
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv@")  # as llm-d subscribes
    sub.connect("tcp://127.0.0.1:%d" % pub)
    time.sleep(0.3)
    c = kvpool.Client(node.socket, namespace="conf")
    keys = ["k%d" % i for i in range(90)]  # 22 MiB into 16 MiB of DRAM: demotions
    for i, k in enumerate(keys):
        assert c.put([k], [bytes([i % 251]) * VALUE], descriptors=[descriptor(i)]) == \
            [kvpool.StatusCode.OK]
    c.flush()
    assert c.get([keys[0]]) == [bytes([0]) * VALUE]  # from SSD: promoted
    assert c.remove([keys[-2], keys[-1]]) == [kvpool.StatusCode.OK] * 2
    c2 = kvpool.Client(node.socket, namespace="gone")
    assert c2.put(["x"], [b"y" * 4096]) == [kvpool.StatusCode.OK]
    assert c2.clear() == 1  # the namespace clear: its entry is told removed
    c2.close()
    ids = c.key_ids(keys)
    hashes = [ids.ids[i].hi for i in range(ids.n)]
    time.sleep(0.3)
    live = []
    while sub.poll(200):
        live.append(sub.recv_multipart())
    # Every batch from seq 0, through the replay socket (3 frames a reply).
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect("tcp://127.0.0.1:%d" % rep)
    dealer.send_multipart([b"", (0).to_bytes(8, "big")])
    replayed = []
    while True:
        assert dealer.poll(5000), "no end marker"
        frames = dealer.recv_multipart()
        assert len(frames) == 4, frames[:1]
        if seq_of(frames[2]) == -1:
            break
        assert frames[1] == TOPIC
        replayed.append(frames[3])
    c.close()
    sub.close(0)
    dealer.close(0)
    ctx.term()
    return live, replayed, hashes


@pytest.mark.parametrize("encoding", ["map", "array"])
def test_every_batch_decodes_under_every_consumers_rules(node_factory, tmp_path, encoding):
    live, replayed, hashes = run_script(node_factory, tmp_path, encoding)
    assert replayed, "no batches"
    assert all(f[0] == TOPIC and len(f) == 3 for f in live)  # kv@<pod>@<model>, 3 frames
    rejected = {name: 0 for name in DECODERS}
    decoded = {}
    for payload in replayed:
        for name, decode in DECODERS.items():
            try:
                decoded.setdefault(name, []).extend(decode(payload))
            except Rejected:
                rejected[name] += 1
        if encoding == "array":  # llm-d's release without map support
            llmd(payload, maps=False)
    assert rejected == {name: 0 for name in DECODERS}
    events = decoded["vllm"]
    assert events[0]["type"] == "AllBlocksCleared"
    stored = [(e["medium"], h) for e in events if e["type"] == "BlockStored"
              for h in e["block_hashes"]]
    removed = [(e["medium"], h) for e in events if e["type"] == "BlockRemoved"
               for h in e["block_hashes"]]
    # Every key put was told stored on CPU; demotions stored on STORAGE;
    # the promotion stored the first key on CPU again; the remove is told.
    assert {h for m, h in stored if m == "CPU"} >= \
        {h for i, h in enumerate(hashes) if i % 2} | {engine_block(i)["hash"] for i in range(0, 90, 2)}
    assert any(m == "STORAGE" for m, _ in stored)
    assert any(h == hashes[-1] for _, h in removed)  # key 89: undescribed
    assert {dynamo_tier(m) for m, _ in stored} == {"HostPinned", "Disk"}
    # Described keys: every event names the block as it was put, on each
    # medium it went through; no event names one by its key id.
    engine = {engine_block(i)["hash"]: engine_block(i) for i in range(0, 90, 2)}
    key_hashes = {h for i, h in enumerate(hashes) if i % 2 == 0}
    seen = {"CPU": set(), "STORAGE": set()}
    for e in events:
        if e["type"] == "AllBlocksCleared":
            continue
        assert not key_hashes & set(e["block_hashes"])
        if e["type"] != "BlockStored" or e["block_hashes"][0] not in engine:
            continue
        # A chain of described blocks is one event, as an engine tells it:
        # the first one's parent, every block's tokens in order.
        hs = e["block_hashes"]
        assert e["parent_block_hash"] == engine[hs[0]]["parent"]
        assert e["token_ids"] == [t for h in hs for t in engine[h]["tokens"]]
        for j in range(1, len(hs)):
            assert engine[hs[j]]["parent"] == hs[j - 1]
        assert e["block_size"] == BLOCK
        if encoding == "map":
            assert e["group_idx"] == 0 and e["kv_cache_spec_kind"] == "full"
        seen[e["medium"]].update(hs)
    assert seen["CPU"] == set(engine)
    assert seen["STORAGE"], "no described block told on STORAGE"
    assert engine_block(0)["hash"] in {h for m, h in stored if m == "CPU"}
    assert [m for m, h in stored if h == engine_block(0)["hash"]].count("CPU") >= 2  # promoted
    assert (0x5EED0000 + 88) in {h for _, h in removed}  # key 88's remove, by its engine hash
    # The routers index exactly the described blocks (the undescribed keys,
    # the negative control, are named by key ids they cannot use).
    for router in ("dynamo", "llm-d"):
        assert indexed(decoded[router], router) == set(engine), router
    for e in events:
        if e["type"] != "AllBlocksCleared":
            assert e.get("locality", "LOCAL") == "LOCAL"
            assert all(isinstance(h, int) for h in e["block_hashes"])


def old_batch(encoding):
    """A batch as the node encoded it before: maps of type, block_hashes and
    medium only; 16-byte bin hashes in both encodings."""
    h = bytes(range(16))
    if encoding == "map":
        events = [{"type": "BlockStored", "block_hashes": [h], "medium": "CPU"},
                  {"type": "BlockRemoved", "block_hashes": [h], "medium": "CPU"}]
    else:
        events = [["BlockStored", [h], None, [], 0, None, "CPU", None],
                  ["BlockRemoved", [h], "CPU"]]
    return msgpack.packb([1.0, events, None], use_bin_type=True)


def test_negative_controls_the_old_encoding_is_rejected():
    old_map, old_array = old_batch("map"), old_batch("array")
    with pytest.raises(Rejected, match="missing required field `parent_block_hash`"):
        msgspec_vllm(old_map)
    with pytest.raises(Rejected, match="token_ids"):
        llmd(old_map)
    with pytest.raises(Rejected, match="tagged union"):
        llmd(old_map, maps=False)
    with pytest.raises(Rejected):
        dynamo(old_map)
    with pytest.raises(Rejected, match="not an integer"):
        dynamo(old_array)  # bytes hashes: the whole batch
    # The positional old batch was fine for vLLM and llm-d.
    assert len(msgspec_vllm(old_array)) == 2
    assert len(llmd(old_array, maps=False)) == 2


def test_namespace_topics_carry_their_namespaces_blocks(node_factory, tmp_path):
    """--kv-events-topics-file: a namespace's blocks go on its kv@<pod>@<model>
    topic (llm-d reads the model from it), the others on --kv-events-topic;
    every topic opens with AllBlocksCleared; a batch holds one topic's
    events; the replay answers each batch with its own topic."""
    topics = tmp_path / "topics"
    topics.write_text("# namespace=topic\nmodel-a=kv@node-a@model-a\n\nmodel|b=c=kv@node-a@model-b\n")
    node, (pub, rep) = start_on_free_ports(lambda ports: (node_factory(extra_args=[
        "--kv-events-endpoint", "tcp://127.0.0.1:%d" % ports[0],
        "--kv-events-replay-endpoint", "tcp://127.0.0.1:%d" % ports[1],
        "--kv-events-batch-interval", "2ms", "--kv-events-topic", TOPIC.decode(),
        "--kv-events-topics-file", str(topics)]), ports), 2)
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv@")
    sub.connect("tcp://127.0.0.1:%d" % pub)
    time.sleep(0.3)
    put = {}
    for ns in ("model-a", "model|b=c", "other"):
        c = kvpool.Client(node.socket, namespace=ns)
        keys = ["%s-%d" % (ns, i) for i in range(20)]
        # Interleaved: the node's batches must still keep the topics apart.
        for k in keys:
            assert c.put([k], [b"v" * 1024]) == [kvpool.StatusCode.OK]
        ids = c.key_ids(keys)
        put[ns] = {ids.ids[i].hi for i in range(ids.n)}
        c.close()
    time.sleep(0.3)
    by_topic = {}
    while sub.poll(300):
        topic, seq, payload = sub.recv_multipart()
        for e in msgspec_vllm(payload):
            by_topic.setdefault(topic, []).append(e)
    want = {b"kv@node-a@model-a": "model-a", b"kv@node-a@model-b": "model|b=c", TOPIC: "other"}
    assert set(by_topic) == set(want)
    for topic, ns in want.items():
        events = by_topic[topic]
        stored = {h for e in events if e["type"] == "BlockStored" for h in e["block_hashes"]}
        assert stored == put[ns], topic
    # The replay: every batch, each under its own topic.
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect("tcp://127.0.0.1:%d" % rep)
    dealer.send_multipart([b"", (0).to_bytes(8, "big")])
    cleared = set()
    while True:
        assert dealer.poll(5000), "no end marker"
        frames = dealer.recv_multipart()
        if seq_of(frames[2]) == -1:
            break
        events = msgspec_vllm(frames[3])
        hashes = {h for e in events for h in e.get("block_hashes", [])}
        assert hashes <= put[want[frames[1]]]
        cleared |= {frames[1] for e in events if e["type"] == "AllBlocksCleared"}
    assert cleared == set(want)
    sub.close(0)
    dealer.close(0)
    ctx.term()


def test_a_malformed_topics_file_stops_the_node_with_its_line(node_factory, tmp_path):
    topics = tmp_path / "topics"
    topics.write_text("model-a=kv@node-a@model-a\nmodel-b=kv@pod-only\n")
    with pytest.raises(RuntimeError, match="line 2: topic 'kv@pod-only'"):
        node_factory(extra_args=["--kv-events-endpoint", "tcp://127.0.0.1:%d" % free_port(),
                                 "--kv-events-topics-file", str(topics)])
