"""A kvpool.Client opened before os.fork(), used by parent and child at once
(multiprocessing with the fork start method, as engines' worker pools do):
every process reads only its own replies, byte for byte. The child's calls
go over connections of its own (after_fork="reconnect", the default), or
raise FAILED_PRECONDITION (after_fork="fail"); the parent is unaffected.
The client has one connection, so a shared socket would mix replies."""

import multiprocessing
import os

import pytest

import kvpool
from kvpool.client import StatusCode

VALUE_A = bytes((i * 7 + 1) % 256 for i in range(4096))
VALUE_B = bytes((i * 13 + 5) % 256 for i in range(4096))
GETS = 3000

_client = None  # the parent's, inherited by the forked workers


def _child_reads(_):
    """In a forked worker: GETS gets of b through the parent's client."""
    wrong = errors = 0
    for _ in range(GETS):
        try:
            got = _client.get(["b"])[0]
        except kvpool.KvpoolError:
            errors += 1
            continue
        wrong += got != VALUE_B
    return wrong, errors, os.getpid()


def _child_fails(_):
    try:
        _client.get(["b"])
        return "no error"
    except kvpool.KvpoolError as e:
        return "%s %s" % (StatusCode(e.code).name, e)


def _accepted(node):
    import urllib.request
    text = urllib.request.urlopen(
        "http://127.0.0.1:%d/metrics" % node.admin_port, timeout=5).read().decode()
    for line in text.splitlines():
        if line.startswith("kvpool_accepted_connections_total "):
            return float(line.split()[1])
    raise AssertionError("no kvpool_accepted_connections_total")


def test_forked_workers_and_the_parent_read_only_their_own_replies(kvpool_node):
    global _client
    _client = kvpool.Client(kvpool_node.socket, namespace="fork", max_connections=1)
    try:
        assert _client.put(["a", "b"], [VALUE_A, VALUE_B]) == [StatusCode.OK] * 2
        before = _accepted(kvpool_node)
        ctx = multiprocessing.get_context("fork")
        workers = 4
        with ctx.Pool(workers) as pool:
            pending = pool.map_async(_child_reads, range(workers))
            parent_wrong = parent_errors = 0
            for _ in range(GETS):
                got = _client.get(["a"])[0]
                parent_wrong += got != VALUE_A
            results = pending.get(timeout=120)
        assert parent_wrong == 0 and parent_errors == 0
        assert [r[:2] for r in results] == [(0, 0)] * workers
        # Each worker process opened its own connection; the parent none.
        assert _accepted(kvpool_node) - before == len({r[2] for r in results})
        assert _client.get(["a", "b"]) == [VALUE_A, VALUE_B]
    finally:
        _client.close()
        _client = None


def test_after_fork_fail_refuses_the_childs_calls(kvpool_node):
    global _client
    _client = kvpool.Client(kvpool_node.socket, namespace="fork", after_fork="fail")
    try:
        _client.put(["b"], [VALUE_B])
        before = _accepted(kvpool_node)
        ctx = multiprocessing.get_context("fork")
        with ctx.Pool(1) as pool:
            said = pool.map(_child_fails, [0])[0]
        assert said.startswith("FAILED_PRECONDITION"), said
        assert "opened before fork()" in said, said
        assert _accepted(kvpool_node) == before
        assert _client.get(["b"]) == [VALUE_B]
    finally:
        _client.close()
        _client = None


def test_after_fork_takes_only_the_two_modes(kvpool_node):
    with pytest.raises(ValueError):
        kvpool.Client(kvpool_node.socket, after_fork="share")


def _close_in_child(_):
    _client.close()  # must not wait for the parent's call in progress
    return "closed"


def test_a_call_in_progress_in_the_parent_does_not_hang_the_child(kvpool_node):
    global _client
    _client = kvpool.Client(kvpool_node.socket, namespace="fork")
    try:
        _client._inflight += 1  # as if another thread were inside a call at the fork
        ctx = multiprocessing.get_context("fork")
        with ctx.Pool(1) as pool:
            assert pool.map_async(_close_in_child, [0]).get(timeout=20) == ["closed"]
        _client._inflight -= 1
        assert _client.get(["nothing"]) == [None]
    finally:
        _client.close()
        _client = None
