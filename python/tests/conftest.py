"""Shared pytest fixtures for kvpool's Python tests.

kvpool_node: a real kvpool-node (binary from env KVPOOL_NODE, else
  <repo>/build/src/node/kvpool-node) on a temporary socket and data dir with
  a free admin port; stopped after the test.
tool_binary(name): kvpoolctl / kvpool-bench of the same build tree.
node_factory: starts more nodes (each is a NodeProcess like kvpool_node).
standins_on_path: puts python/tests/standins first on sys.path (engine
  stand-ins importable under their real module names).
The package itself is imported from this checkout (python/ goes first on
sys.path), and the library from env KVPOOL_LIBRARY or the build tree.
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(TESTS_DIR)
REPO = os.path.dirname(PYTHON_DIR)
STANDINS = os.path.join(TESTS_DIR, "standins")

if PYTHON_DIR not in sys.path:
    sys.path.insert(0, PYTHON_DIR)
# Child processes (multi-rank tests) import the same package and stand-ins.
os.environ["PYTHONPATH"] = os.pathsep.join(
    [PYTHON_DIR, STANDINS] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])


def node_binary():
    return os.environ.get("KVPOOL_NODE") or os.path.join(REPO, "build", "src", "node", "kvpool-node")


def tool_binary(name):
    """build/tools/<name> (kvpoolctl, kvpool-bench) of the build tree that
    node_binary() comes from (<build>/src/node/kvpool-node)."""
    build = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(node_binary()))))
    return os.path.join(build, "tools", name)


_ADMIN_RE = re.compile(r"admin http://[0-9.]+:([0-9]+)")


class NodeProcess:
    """A kvpool-node child process with its own temp dir.

    .socket: the Unix socket path (stable across restart()).
    .admin_port: the admin HTTP port it bound.
    stop(): SIGTERM and wait; kill(): SIGKILL and wait; restart(): start again
    on the same socket (DRAM content is gone unless an SSD tier kept it)."""

    def __init__(self, extra_args=(), dram="64MiB"):
        self.dir = tempfile.mkdtemp(prefix="kvpool-py-")
        self.socket = os.path.join(self.dir, "node.sock")
        self.log_path = os.path.join(self.dir, "node.log")
        self.extra_args = list(extra_args)
        self.dram = dram
        self.proc = None
        self.admin_port = None
        try:
            self.start()
        except Exception:
            # A node that never started leaves nothing behind: its log is
            # in the error.
            shutil.rmtree(self.dir, ignore_errors=True)
            raise

    def start(self, timeout_s=20.0):
        if self.proc is not None:
            raise RuntimeError("node already running")
        # No read room: the segment is exactly the capacity, whose size the
        # tests of segment registration count in.
        args = [node_binary(), "--socket", self.socket, "--dram-capacity", self.dram,
                "--dram-read-room", "0",
                "--slab-size", "1MiB", "--admin-port", "0", "--node-id", "py-test-node",
                "--log-level", "info"] + self.extra_args
        # A node with a peer port needs the cluster key (or --insecure): a
        # test's cluster node gets one of its own unless the test chose.
        if (("--peers" in self.extra_args or "--etcd" in self.extra_args)
                and "--cluster-key-file" not in self.extra_args
                and "--insecure" not in self.extra_args):
            key = os.path.join(self.dir, "cluster.key")
            if not os.path.exists(key):
                fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                os.write(fd, os.urandom(32).hex().encode() + b"\n")
                os.close(fd)
            args += ["--cluster-key-file", key]
        log = open(self.log_path, "ab")
        self._log_offset = log.tell()
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_offset)
                m = _ADMIN_RE.search(f.read().decode("utf-8", "replace"))
            if m:
                self.admin_port = int(m.group(1))
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.01)
        text = self.log()
        self._reap(signal.SIGKILL)
        raise RuntimeError("kvpool-node did not start:\n" + text)

    def _reap(self, sig):
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        rc = self.proc.wait(timeout=30)
        self.proc = None
        return rc

    def stop(self):
        return self._reap(signal.SIGTERM)

    def kill(self):
        return self._reap(signal.SIGKILL)

    def restart(self):
        self.stop()
        self.start()

    @property
    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def log(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def cleanup(self):
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def node_factory():
    nodes = []

    def make(extra_args=(), dram="64MiB"):
        n = NodeProcess(extra_args, dram)
        nodes.append(n)
        return n

    yield make
    for n in nodes:
        n.cleanup()


@pytest.fixture
def kvpool_node(node_factory):
    return node_factory()


@pytest.fixture
def standins_on_path(monkeypatch):
    monkeypatch.syspath_prepend(STANDINS)
    return STANDINS


@pytest.fixture
def dead_socket():
    """A socket path no node listens on."""
    d = tempfile.mkdtemp(prefix="kvpool-py-dead-")
    yield os.path.join(d, "none.sock")
    shutil.rmtree(d, ignore_errors=True)


# The stand-in engines are importable by their real names in every test
# module (the connectors import them at module load).
if STANDINS not in sys.path:
    sys.path.insert(1, STANDINS)
