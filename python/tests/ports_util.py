"""Loopback ports for the nodes tests start.

A port found free (bound to port 0, then closed) can be taken by another
test's process before the node binds it. The node then fails to start
with "Address already in use", and start_on_free_ports tries other
ports."""

import socket


def free_ports(count):
    """`count` distinct loopback ports that were free a moment ago."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port():
    return free_ports(1)[0]


def start_on_free_ports(start, count, tries=5):
    """start(ports) with `count` free ports; its result. When it raises
    because a port was taken meanwhile, it is called again with other ports,
    `tries` times in all."""
    for attempt in range(tries):
        ports = free_ports(count)
        try:
            return start(ports)
        except RuntimeError as e:
            if "Address already in use" not in str(e) or attempt == tries - 1:
                raise
