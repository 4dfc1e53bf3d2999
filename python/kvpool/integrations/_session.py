"""What the engine connectors share: their settings vocabulary and a Session,
the kvpool client a connector talks through.

Settings. Every connector reads the same names (`SessionSettings`) from its
engine's configuration; the names older releases used are aliases
(`ALIASES`). A connector may choose its own defaults (see docs/connectors.md).

Session. The client is opened on first use. While no node can be reached, a
call answers its default at once and an attempt to open the client is made
at most every retry_interval_ms. A call that fails as a whole (node gone,
deadline passed, any exception) answers its default too: the engine sees a
miss or a failed store, never an exception. The open client is kept, since
the library reconnects to a node that comes back. The first failure of a run
is logged as a warning and the next success at info, so a node that stays
down does not flood the log.

Thread-safe.
"""

import logging
import threading
import time
from dataclasses import dataclass, fields
from typing import Callable, Mapping, Optional

from kvpool.client import Client

from . import _cuda

logger = logging.getLogger("kvpool.integrations")

# Older setting name -> (name, factor from the older unit to the name's unit).
ALIASES = {
    "kvpool_socket": ("socket", None),
    "kvpool_remote": ("remote", None),
    "kvpool_namespace": ("namespace", None),
    "kvpool_timeout_ms": ("timeout_ms", None),
    "kvpool_retry_interval_s": ("retry_interval_ms", 1000),
    "reconnect_interval_ms": ("retry_interval_ms", None),
    "retry_interval_s": ("retry_interval_ms", 1000),
}


def _text(value):
    return str(value) if value != "" else None


def _ms(value):
    return int(round(float(value)))


def _bool(value):
    if isinstance(value, str):
        v = value.strip().lower()
        if v in ("1", "true", "yes", "on"):
            return True
        if v in ("0", "false", "no", "off", ""):
            return False
        raise ValueError("kvpool: %r is not a boolean" % value)
    return bool(value)


@dataclass
class SessionSettings:
    """How a connector reaches kvpool. A subclass adds its connector's own
    settings to the fields and their parsers to PARSERS."""

    # The node's Unix socket; None: env KVPOOL_SOCKET, else the library's default.
    socket: Optional[str] = None
    # "host:port[,host:port]" of cluster nodes: remote mode, no local node.
    remote: Optional[str] = None
    # Separates deployments; each connector says how it builds its namespace from it.
    namespace: Optional[str] = None
    # Deadline of each kvpool call: longer rides out a slow node, shorter
    # makes a hung node a miss sooner.
    timeout_ms: int = 2000
    # While no node can be reached, the wait between attempts to open the
    # client. An attempt costs microseconds with a local socket but up to
    # timeout_ms in remote mode, on the engine thread that makes the call.
    retry_interval_ms: int = 1000
    # Attach to each page put the block descriptor the engine's own KV events
    # would carry for it, so the node's events name the block the engine's
    # way (kvpool.integrations._descriptors); costs a few hundred bytes a page.
    block_descriptors: bool = True
    # Cache hints (kvpool.integrations._hints): the TTL of a retain or pin
    # that names none, and of the retention an LMCache lookup's pin asks.
    hint_default_ttl_s: float = 60.0

    PARSERS = {"socket": _text, "remote": _text, "namespace": str, "timeout_ms": _ms,
               "retry_interval_ms": _ms, "block_descriptors": _bool,
               "hint_default_ttl_s": float}

    def update(self, values: Optional[Mapping]) -> "SessionSettings":
        """Takes the settings in `values` (aliases included; a name wins over
        its alias; None is unset; other keys are ignored). Raises ValueError
        for a value out of bounds."""
        values = canonical(values)
        for f in fields(self):
            if values.get(f.name) is not None:
                setattr(self, f.name, self.PARSERS[f.name](values[f.name]))
        self.validate()
        return self

    def validate(self) -> None:
        if self.timeout_ms < 1:
            raise ValueError("kvpool: timeout_ms must be at least 1, not %r" % self.timeout_ms)
        if self.retry_interval_ms < 0:
            raise ValueError("kvpool: retry_interval_ms must not be negative, not %r"
                             % self.retry_interval_ms)
        if not 0 < self.hint_default_ttl_s <= 7 * 24 * 3600:
            raise ValueError("kvpool: hint_default_ttl_s must be in (0, 604800], not %r"
                             % self.hint_default_ttl_s)


def canonical(values: Optional[Mapping]) -> dict:
    """values with every alias renamed to its setting and converted to its
    unit; a setting given under its own name keeps that value."""
    out = dict(values or {})
    for alias, (name, factor) in ALIASES.items():
        if alias not in out:
            continue
        value = out.pop(alias)
        if out.get(name) is None and value is not None:
            out[name] = float(value) * factor if factor else value
    return out


class Session:
    """A connector's kvpool client. `namespace` is the one the client opens
    under (default: settings.namespace). `on_open(client)` runs after each
    open, before the client is used; if it raises, the open failed. `log` is
    the connector's logger. `open_client(socket, namespace=, timeout_ms=,
    remote=)` makes the client and `clock()` tells monotonic seconds: kvpool's
    Client and time.monotonic unless a test stands in for them."""

    def __init__(self, settings: SessionSettings, namespace: Optional[str] = None,
                 on_open: Optional[Callable[[Client], None]] = None,
                 log: logging.Logger = logger, open_client: Callable[..., Client] = Client,
                 clock: Callable[[], float] = time.monotonic, register_cuda: bool = False,
                 client_name: Optional[str] = None):
        self.settings = settings
        self._namespace = (settings.namespace or "") if namespace is None else namespace
        self._on_open = on_open
        self._log = log
        self._open_client = open_client
        self._clock = clock
        self._lock = threading.Lock()
        self._client = None  # protected by _lock (read without it on the fast path)
        self._next_open = 0.0  # protected by _lock: monotonic seconds
        self._closed = False  # protected by _lock
        self._errors = 0  # protected by _lock
        self._failing = False  # protected by _lock
        # register_cuda: the connector copies between the segment and GPUs, so
        # the segment is registered with CUDA when a client opens.
        self._register_cuda = register_cuda
        # What the node shows for this engine's connections (kvpoolctl clients).
        self._client_name = client_name
        self._cuda = _cuda.SegmentRegistration(  # protected by _lock
            reason="no client" if register_cuda else "not asked for")

    @property
    def namespace(self) -> str:
        return self._namespace

    @property
    def connected(self) -> bool:
        return self._client is not None

    @property
    def errors(self) -> int:
        """Calls that failed as a whole since the session began."""
        return self._errors

    def client(self) -> Optional[Client]:
        """The open client; else opens one if the retry interval has passed.
        None when there is none. Never raises."""
        client = self._client
        return client if client is not None else self._open()

    def _open(self) -> Optional[Client]:
        s = self.settings
        with self._lock:
            if self._client is not None or self._closed:
                return self._client
            now = self._clock()
            if now < self._next_open:
                return None
            self._next_open = now + s.retry_interval_ms / 1000.0
            client = None
            try:
                named = {"client_name": self._client_name} if self._client_name else {}
                client = self._open_client(s.socket, namespace=self._namespace,
                                           timeout_ms=s.timeout_ms, remote=s.remote, **named)
                if self._on_open is not None:
                    self._on_open(client)
            except Exception as e:  # no node, no libkvpool: run without the cache
                if client is not None:
                    client.close()
                if not self._failing:
                    self._log.warning("kvpool: cannot connect (%s); answering misses until a node "
                                   "is reachable", e)
                self._failing = True
                return None
            self._client = client
            self._failing = False
        if self._register_cuda:
            self._register(client)
        self._log.info("kvpool: connected (namespace %s)", self._namespace)
        return client

    def _register(self, client) -> None:
        """Registers the client's segment with CUDA (outside the lock: it may
        take a while). Copies between the segment and a GPU are DMA only from
        registered memory; without a GPU this logs once and is skipped."""
        try:
            reg = _cuda.register_segment(client)
        except Exception as e:  # a bad KVPOOL_CUDA_REGISTER_CHUNK and the like
            reg = _cuda.SegmentRegistration(reason="not registered: %r" % (e,))
        with self._lock:
            stale = self._cuda
            if self._client is client:
                self._cuda = reg
            else:  # closed or reopened meanwhile
                stale = reg
        stale.close()

    @property
    def segment_registration(self) -> "_cuda.SegmentRegistration":
        """The open client's segment as registered with CUDA (.registered,
        .reason, .covers(address, nbytes)). A registration that no longer
        names the mapped segment (the node restarted and the client mapped its
        new one) is replaced first."""
        reg = self._cuda
        if reg.registered and not reg.current():
            client = self._client
            if client is not None:
                self._register(client)
            reg = self._cuda
            if reg.registered and not reg.current():
                return _cuda.SegmentRegistration(reason="the segment changed")
        return reg

    def call(self, fn: Callable[[Client], object], default=None, what: str = "call",
             on_error: Optional[Callable[[Exception], object]] = None):
        """fn(client); `default` when there is no client, and on_error(e) (else
        `default`) when it raises. `what` names the call in the log."""
        client = self.client()
        if client is None:
            return default
        try:
            result = fn(client)
        except Exception as e:  # the engine must not see it
            self.failed(what, e)
            return default if on_error is None else on_error(e)
        if self._failing:
            with self._lock:
                recovered, self._failing = self._failing, False
            if recovered:
                self._log.info("kvpool: calls succeed again")
        return result

    def failed(self, what: str, e: Exception) -> None:
        """Counts a call that failed as a whole and logs the first of a run."""
        with self._lock:
            self._errors += 1
            first, self._failing = not self._failing, True
        if first:
            self._log.warning("kvpool: %s failed (%r); answering misses", what, e)
        else:
            self._log.debug("kvpool: %s failed (%r)", what, e)

    def reopen(self, namespace: str) -> None:
        """Closes the client and opens one under `namespace` now."""
        with self._lock:
            old, self._client = self._client, None
            reg, self._cuda = self._cuda, _cuda.SegmentRegistration(reason="no client")
            self._namespace = namespace
            self._next_open = 0.0
        reg.close()
        if old is not None:
            old.close()
        self.client()

    def close(self) -> None:
        """Closes the client (waiting for calls in progress); later calls
        answer their defaults. Idempotent."""
        with self._lock:
            self._closed = True
            client, self._client = self._client, None
            reg, self._cuda = self._cuda, _cuda.SegmentRegistration(reason="closed")
        reg.close()
        if client is not None:
            client.close()
