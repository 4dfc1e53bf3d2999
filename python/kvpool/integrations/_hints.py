"""Cache hints an engine's request carries, applied to kvpool (docs/hints.md;
which engine passes them where: docs/connectors.md).

Engines and routers are converging on one versioned envelope, `kv_hints`:

    {"protocol_version": "0.1", "message_id": "...",
     "actions": [{"action_id": "...", "action_type": "retain",
                  "action_version": "1", "payload": {"ttl_s": 30, "priority": 5}}]}

An action's type is one of kvpool's hints: "retain" (ttl, priority), "pin"
(ttl), "prefetch", "demote" or "release"; its payload names the TTL as
"ttl_s", "ttl_seconds" or "ttl_ms" (retain and pin without one get the
connector's `hint_default_ttl_s`, default 60) and a priority 0-255. Other
action types ("share", a signal) and malformed actions are skipped and
counted: hints are advisory, and nothing here ever fails an engine call. A
single action may also come bare ({"action_type": ..., "payload": ...} or
{"op": ..., "ttl_s": ...}).
"""

import logging
import threading

from ..client import KvpoolError, StatusCode

OPS = ("retain", "pin", "prefetch", "demote", "release")
MAX_KEYS = 8192  # a hint names at most this many keys (kvpool_hint)
DEFAULT_TTL_S = 60.0


class Action:
    __slots__ = ("op", "ttl_s", "priority")

    def __init__(self, op, ttl_s=0.0, priority=0):
        self.op, self.ttl_s, self.priority = op, ttl_s, priority

    def __repr__(self):
        return "Action(%r, ttl_s=%r, priority=%r)" % (self.op, self.ttl_s, self.priority)

    def __eq__(self, other):
        return (isinstance(other, Action) and
                (self.op, self.ttl_s, self.priority) == (other.op, other.ttl_s, other.priority))


def _number(payload, *names):
    for name in names:
        v = payload.get(name)
        if isinstance(v, bool) or v is None:
            continue
        if isinstance(v, (int, float)):
            return float(v)
        return None  # present but not a number: malformed
    return 0.0


def _action(a, default_ttl_s):
    """One envelope action as an Action, or None when kvpool has no such
    hint or it is malformed."""
    if not isinstance(a, dict):
        return None
    op = a.get("action_type", a.get("op"))
    if not isinstance(op, str) or op.lower() not in OPS:
        return None
    op = op.lower()
    payload = a.get("payload", a)
    if not isinstance(payload, dict):
        return None
    ttl_s = _number(payload, "ttl_s", "ttl_seconds")
    if ttl_s == 0.0:
        ms = _number(payload, "ttl_ms")
        ttl_s = None if ms is None else ms / 1000.0
    priority = _number(payload, "priority")
    if ttl_s is None or priority is None or ttl_s < 0 or not 0 <= priority <= 255:
        return None
    if op in ("retain", "pin") and ttl_s == 0:
        ttl_s = default_ttl_s
    return Action(op, ttl_s, int(priority))


def parse(envelope, default_ttl_s=DEFAULT_TTL_S):
    """(actions kvpool applies, actions skipped) of a kv_hints value."""
    if envelope is None:
        return [], 0
    if isinstance(envelope, dict) and "actions" in envelope:
        items = envelope["actions"]
        if not isinstance(items, list):
            return [], 1
    else:
        items = [envelope]
    out, skipped = [], 0
    for a in items:
        act = _action(a, default_ttl_s)
        if act is None:
            skipped += 1
        else:
            out.append(act)
    return out, skipped


class Applier:
    """Sends hints through a connector's Session; counts what happened.
    Thread-safe."""

    def __init__(self, session, log=None, default_ttl_s=DEFAULT_TTL_S):
        self._session = session
        self._log = log or logging.getLogger("kvpool")
        self.default_ttl_s = default_ttl_s
        self._lock = threading.Lock()
        self.sent = 0      # hints the node applied
        self.refused = 0   # hints the node refused (its budgets, a bad TTL)
        self.skipped = 0   # actions kvpool has no hint for, or malformed
        self._warned = False

    def skip(self, n=1):
        """Counts actions not applied (a layout hints cannot name)."""
        with self._lock:
            self.skipped += n

    def apply_envelope(self, envelope, keys, ops=OPS):
        """Applies a kv_hints value's actions whose op is in `ops` to keys
        (names in the session's namespace). Returns the actions applied."""
        actions, skipped = parse(envelope, self.default_ttl_s)
        self.skip(skipped)
        done = []
        for a in actions:
            if a.op in ops:
                self.apply(a, keys)
                done.append(a)
        return done

    def apply(self, action, keys):
        """One hint on keys, in batches of MAX_KEYS. Never raises."""
        keys = list(keys)
        if not keys:
            return
        client = self._session.client()
        if client is None:
            return
        for i in range(0, len(keys), MAX_KEYS):
            try:
                client.hint(action.op, keys[i:i + MAX_KEYS], ttl_s=action.ttl_s,
                            priority=action.priority)
            except KvpoolError as e:
                with self._lock:
                    self.refused += 1
                    first, self._warned = not self._warned, True
                if first or e.code != StatusCode.FAILED_PRECONDITION:
                    self._log.warning("kvpool: %s hint not applied: %s", action.op, e)
                continue
            except Exception as e:  # the engine must not see it
                self._session.failed("hint", e)
                return
            with self._lock:
                self.sent += 1
