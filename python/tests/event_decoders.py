"""Test decoders of KV event batches, written from the rules that
../shared ENGINES.md part 7 quotes from the real consumers' code, applied
literally: a consumer drops a whole batch on one bad event.

  msgspec_vllm(payload)   vLLM's own decoder (7.1)
  llmd(payload, maps)     llm-d's indexer (7.2); maps=False is its release
                          @7be76e11 (positional events only), maps=True
                          with PR #661 (maps too, still needing token_ids
                          and block_size)
  dynamo(payload)         Dynamo's KV router (7.3)

Each returns the decoded events as dicts ("type" plus the fields present)
or raises Rejected with the consumer's reason."""

import msgpack


class Rejected(Exception):
    pass


# vLLM's declaration order and which fields are required (7.1).
VLLM_FIELDS = {
    "BlockStored": (["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                     "medium", "lora_name"],
                    ["extra_keys", "group_idx", "kv_cache_spec_kind",
                     "kv_cache_spec_sliding_window", "locality"]),
    "BlockRemoved": (["block_hashes", "medium"], ["group_idx", "locality"]),
    "AllBlocksCleared": ([], []),
}


def _unpack(payload):
    try:
        batch = msgpack.unpackb(payload, raw=False)
    except Exception as e:  # noqa: BLE001 - the decoder's own failure
        raise Rejected("not msgpack: %s" % e)
    if not isinstance(batch, list) or len(batch) != 3:
        raise Rejected("the batch is not a 3-array")
    ts, events, rank = batch
    if not isinstance(ts, (int, float)) or isinstance(ts, bool):
        raise Rejected("ts is not a float")
    if not isinstance(events, list):
        raise Rejected("events is not an array")
    if rank is not None and not isinstance(rank, int):
        raise Rejected("data_parallel_rank is not an int or nil")
    return events


def _is_hash(h):
    return isinstance(h, (bytes, int)) and not isinstance(h, bool)


def _check_vllm_types(d):
    t = d["type"]
    if "block_hashes" in d and (not isinstance(d["block_hashes"], list)
                                or not all(_is_hash(h) for h in d["block_hashes"])):
        raise Rejected("%s: block_hashes is not a list of bytes | int" % t)
    if "parent_block_hash" in d and d["parent_block_hash"] is not None \
            and not _is_hash(d["parent_block_hash"]):
        raise Rejected("parent_block_hash is not a hash or nil")
    if "token_ids" in d and (not isinstance(d["token_ids"], list)
                             or not all(isinstance(x, int) for x in d["token_ids"])):
        raise Rejected("token_ids is not a list of int")
    for f in ("block_size",):
        if f in d and (not isinstance(d[f], int) or isinstance(d[f], bool)):
            raise Rejected("%s is not an int" % f)
    for f in ("lora_id", "group_idx", "kv_cache_spec_sliding_window"):
        if f in d and d[f] is not None and not isinstance(d[f], int):
            raise Rejected("%s is not an int or nil" % f)
    for f in ("medium", "lora_name", "kv_cache_spec_kind", "locality"):
        if f in d and d[f] is not None and not isinstance(d[f], str):
            raise Rejected("%s is not a str or nil" % f)


def msgspec_vllm(payload):
    out = []
    for ev in _unpack(payload):
        if isinstance(ev, dict):
            tag = ev.get("type")
            if tag not in VLLM_FIELDS:
                raise Rejected("unknown tag %r" % (tag,))
            required, optional = VLLM_FIELDS[tag]
            for f in required:  # required means present, even under omit_defaults
                if f not in ev:
                    raise Rejected("Object missing required field `%s`" % f)
            d = {"type": tag}
            d.update({k: ev[k] for k in required + optional if k in ev})  # unknown keys ignored
        elif isinstance(ev, list) and ev:
            tag = ev[0]
            if tag not in VLLM_FIELDS:
                raise Rejected("unknown tag %r" % (tag,))
            required, optional = VLLM_FIELDS[tag]
            values = ev[1:]
            if len(values) < len(required):
                raise Rejected("%s: expected at least %d fields" % (tag, len(required)))
            d = {"type": tag}
            d.update(zip(required + optional, values))  # trailing extras ignored
        else:
            raise Rejected("an event is neither a map nor an array")
        _check_vllm_types(d)
        out.append(d)
    return out


def llmd(payload, maps=True):
    out = []
    for ev in _unpack(payload):
        if isinstance(ev, dict):
            if not maps:
                raise Rejected("failed to decode tagged union")
            tag = ev.get("type")
            d = dict(ev)
        elif isinstance(ev, list) and ev:
            tag = ev[0]
            names = VLLM_FIELDS.get(tag, ([], []))[0]
            d = {"type": tag}
            d.update(zip(names, ev[1:]))
            if tag == "BlockStored" and len(ev) < 5:
                raise Rejected("BlockStored with fewer than 5 elements")
        else:
            raise Rejected("failed to decode tagged union")
        if tag == "BlockStored":
            if not isinstance(d.get("token_ids"), list):
                raise Rejected("token_ids is not an array")
            if not isinstance(d.get("block_size"), int) or isinstance(d.get("block_size"), bool):
                raise Rejected("block_size is not an int")
        if tag in ("BlockStored", "BlockRemoved"):
            hashes = d.get("block_hashes")
            if not isinstance(hashes, list) or not all(_is_hash(h) for h in hashes):
                raise Rejected("block_hashes are not ints or bytes")
        elif tag != "AllBlocksCleared":
            raise Rejected("unknown tag %r" % (tag,))
        out.append(d)
    return out


def dynamo(payload):
    out = []
    for ev in _unpack(payload):
        if isinstance(ev, dict):
            tag = ev.get("type")
            need = {"BlockStored": ["type", "block_hashes", "token_ids", "block_size"],
                    "BlockRemoved": ["type", "block_hashes"], "AllBlocksCleared": ["type"]}
            if tag not in need:
                raise Rejected("unknown event type %r" % (tag,))
            for f in need[tag]:
                if f not in ev:
                    raise Rejected("missing field `%s`" % f)
            d = dict(ev)
        elif isinstance(ev, list) and ev:
            tag = ev[0]
            need = {"BlockStored": 5, "BlockRemoved": 2, "AllBlocksCleared": 1}
            if tag not in need or len(ev) < need[tag]:
                raise Rejected("positional %r too short" % (tag,))
            names = VLLM_FIELDS[tag][0]
            d = {"type": tag}
            d.update(zip(names, ev[1:]))
        else:
            raise Rejected("an event is neither a map nor a tuple")
        for h in d.get("block_hashes", []):
            # i64 or u64 only: a bytes hash makes serde reject the batch.
            if not isinstance(h, int) or isinstance(h, bool) or not -(1 << 63) <= h < (1 << 64):
                raise Rejected("block hash %r is not an integer" % (h,))
        if tag == "BlockStored" and (not isinstance(d["token_ids"], list)
                                     or not isinstance(d["block_size"], int)):
            raise Rejected("token_ids or block_size malformed")
        out.append(d)
    return out


def dynamo_tier(medium):
    """Dynamo's tier of a medium string (ENGINES.md 6.1), case-sensitive."""
    table = {"GPU": "Device", "DEVICE": "Device", "CPU": "HostPinned", "CPU_PINNED": "HostPinned",
             "CPU_TIER1": "HostPinned", "CPU_TIER2": "Disk", "DISK": "Disk", "NVME": "Disk",
             "STORAGE": "Disk", "EXTERNAL": "External", "REMOTE": "External",
             "SHARED": "External", "NETWORK": "External"}
    return table.get(medium, "Device")


DECODERS = {"vllm": msgspec_vllm, "llm-d": llmd, "dynamo": dynamo}
