"""kvpoolctl and kvpool-bench against a real kvpool-node: the socket from env
KVPOOL_SOCKET when no --socket is given (a --socket still wins), and
kvpoolctl's answer to an unknown command (its name and the usage on stderr,
exit 2) next to a known command's --help (stdout, exit 0).

The binaries are the build tree's (conftest.tool_binary: the tools next to
the kvpool-node that KVPOOL_NODE names)."""

import json
import os
import subprocess

import pytest

import kvpool
from conftest import tool_binary

KVPOOLCTL = tool_binary("kvpoolctl")
BENCH = tool_binary("kvpool-bench")

USAGE = "usage: kvpoolctl [--socket PATH] [--timeout DURATION] COMMAND ...\n"


def run(argv, socket=None, stdin=None):
    """argv run with KVPOOL_SOCKET=socket (unset when None) and no --socket
    of ours; the CompletedProcess with bytes stdout/stderr."""
    env = {k: v for k, v in os.environ.items() if k != "KVPOOL_SOCKET"}
    if socket is not None:
        env["KVPOOL_SOCKET"] = socket
    return subprocess.run(argv, env=env, input=stdin, capture_output=True, timeout=60)


@pytest.fixture(autouse=True)
def _binaries():
    for path in (KVPOOLCTL, BENCH):
        assert os.access(path, os.X_OK), "not built: %s" % path


def entries(node):
    with kvpool.Client(node.socket) as c:
        return c.stats()["dram"]["entries"]


def test_kvpoolctl_put_and_get_through_kvpool_socket(kvpool_node):
    value = b"v\x00\x01 \n\xffend"  # NUL, newline and a non-UTF-8 byte, through stdin
    put = run([KVPOOLCTL, "put", "ns", "k", "--value", "v"], socket=kvpool_node.socket)
    assert put.returncode == 0, put.stderr
    put2 = run([KVPOOLCTL, "put", "ns", "k2", "-"], socket=kvpool_node.socket, stdin=value)
    assert put2.returncode == 0, put2.stderr

    get = run([KVPOOLCTL, "get", "ns", "k"], socket=kvpool_node.socket)
    assert (get.returncode, get.stdout, get.stderr) == (0, b"v", b"")
    get2 = run([KVPOOLCTL, "get", "ns", "k2"], socket=kvpool_node.socket)
    assert (get2.returncode, get2.stdout) == (0, value)

    # The puts reached this node (not a node on a default socket).
    with kvpool.Client(kvpool_node.socket, namespace="ns") as c:
        assert c.get(["k", "k2"]) == [b"v", value]


def test_socket_flag_wins_over_kvpool_socket(kvpool_node, dead_socket):
    with kvpool.Client(kvpool_node.socket, namespace="ns") as c:
        c.put(["flag"], [b"from the client"])
    get = run([KVPOOLCTL, "--socket", kvpool_node.socket, "get", "ns", "flag"], socket=dead_socket)
    assert (get.returncode, get.stdout) == (0, b"from the client")


def test_kvpoolctl_with_kvpool_socket_naming_no_node_cannot_connect(kvpool_node, dead_socket):
    # Negative control: the same get with the variable pointing nowhere fails
    # to connect (exit 3) instead of finding the running node.
    with kvpool.Client(kvpool_node.socket, namespace="ns") as c:
        c.put(["k"], [b"v"])
    ok = run([KVPOOLCTL, "get", "ns", "k"], socket=kvpool_node.socket)
    assert (ok.returncode, ok.stdout) == (0, b"v")

    get = run([KVPOOLCTL, "get", "ns", "k"], socket=dead_socket)
    assert get.returncode == 3
    assert get.stdout == b""
    err = get.stderr.decode()
    assert err.startswith("kvpoolctl: cannot connect: ") and dead_socket in err, err


def test_kvpool_bench_through_kvpool_socket(kvpool_node):
    before = entries(kvpool_node)
    bench = run([BENCH, "--op", "put", "--value-size", "4KiB", "--batch", "1",
                 "--duration", "200ms", "--json"], socket=kvpool_node.socket)
    assert bench.returncode == 0, bench.stderr
    lines = [json.loads(line) for line in bench.stdout.decode().splitlines() if line.strip()]
    assert len(lines) == 1
    result = lines[0]
    assert (result["op"], result["value_size"], result["batch"]) == ("put", 4096, 1)
    assert result["ops"] > 0 and result["errors"] == 0
    # What it wrote is on this node: at least the timed puts are new entries
    # (the warm-up's puts come on top).
    assert entries(kvpool_node) - before >= result["ops"]


def test_kvpool_bench_with_kvpool_socket_naming_no_node_fails(dead_socket):
    bench = run([BENCH, "--op", "put", "--value-size", "4KiB", "--batch", "1",
                 "--duration", "200ms", "--json"], socket=dead_socket)
    assert bench.returncode != 0
    assert bench.stdout == b""
    err = bench.stderr.decode()
    assert "cannot connect" in err and dead_socket in err, err


@pytest.mark.parametrize("argv", [["bogus"], ["bogus", "--help"]])
def test_unknown_command_names_it_and_prints_the_usage(argv):
    out = run([KVPOOLCTL] + argv)
    assert out.returncode == 2
    assert out.stdout == b""
    err = out.stderr.decode()
    assert err.startswith("kvpoolctl: unknown command 'bogus'\n" + USAGE), err
    assert "exit status: 0 done, 1 a miss, 2 usage, 3 an error\n" in err


def test_known_command_help_goes_to_stdout():
    out = run([KVPOOLCTL, "get", "--help"])
    assert (out.returncode, out.stderr) == (0, b"")
    text = out.stdout.decode()
    assert text.startswith("usage: kvpoolctl [--socket PATH] [--timeout DURATION] get NS KEY"), text
    assert "unknown command" not in text
    # And the whole usage, asked for, goes to stdout with exit 0 as well.
    usage = run([KVPOOLCTL, "--help"])
    assert (usage.returncode, usage.stderr) == (0, b"")
    assert usage.stdout.decode().startswith(USAGE)
    assert "default $KVPOOL_SOCKET" in usage.stdout.decode()
