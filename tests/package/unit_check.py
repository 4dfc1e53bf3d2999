"""Runs inside a private mount and network namespace (unshare -m -n), as
root: the kvpool-node.service unit of an extracted package root, checked and
started the way systemd would start it.

usage: unit_check.py ROOT SMOKE_BINARY...

- The package root is laid over /usr/bin, /etc and /lib/systemd/system
  (read-only overlays), /run is a fresh tmpfs, and /etc/passwd and
  /etc/group gain the kvpool user and group that the package's postinst
  would add: only this process and its children see any of it.
- `systemd-analyze verify` must print nothing for the unit (it reports
  unknown keys and bad values as warnings, exit code 0).
- The unit's ExecStartPre runs as root, as systemd runs it, against a
  stand-in bound over the host's shmem_enabled file: "never" becomes
  "advise", every other setting stays.
- The unit's ExecStart line runs as written, as the unit's User and Group,
  with $NOTIFY_SOCKET naming a datagram socket this script listens on, and
  /run/kvpool made as RuntimeDirectory= would make it. The node must send
  READY=1; then a C program built against the installed libkvpool-dev and
  the installed Python package (KVPOOL_LIBRARY names the installed
  libkvpool.so.0) put and read back values through the
  configured socket; SIGTERM (systemd's stop) must bring STOPPING=1 and a
  clean exit.
- With $KVPOOL_ENTRYPOINT, the container image's entrypoint is run the same
  way with no arguments (it must exec the node with the packaged
  configuration, so that the node itself gets the SIGTERM).
"""

import os
import pwd
import re
import shlex
import signal
import socket
import subprocess
import sys
import time

ROOT, SMOKES = sys.argv[1], sys.argv[2:]
UNIT = os.path.join(ROOT, "lib/systemd/system/kvpool-node.service")
UID = GID = 64999  # the kvpool user the postinst would create


def run(*cmd, **kw):
    return subprocess.run(cmd, check=True, **kw)


def fail(msg):
    print("unit_check: FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def unit_values(key):
    out = []
    with open(UNIT) as f:
        for line in f:
            if line.startswith(key + "="):
                out.append(line.split("=", 1)[1].strip())
    return out


def overlay(lower_first, target):
    run("mount", "-t", "overlay", "overlay", "-o",
        "lowerdir=%s:%s" % (lower_first, target), target)


def main():
    run("mount", "--make-rprivate", "/")
    run("ip", "link", "set", "lo", "up")
    # Accounts as the postinst makes them, over the host's.
    extra = os.path.join(os.path.dirname(ROOT), "etc-accounts")
    os.makedirs(extra, exist_ok=True)
    with open("/etc/passwd") as f:
        passwd = f.read()
    with open("/etc/group") as f:
        group = f.read()
    with open(os.path.join(extra, "passwd"), "w") as f:
        f.write(passwd + "kvpool:x:%d:%d:kvpool cache node:/var/lib/kvpool:/usr/sbin/nologin\n"
                % (UID, GID))
    with open(os.path.join(extra, "group"), "w") as f:
        f.write(group + "kvpool:x:%d:\n" % GID)
    run("mount", "-t", "overlay", "overlay", "-o",
        "lowerdir=%s:%s:/etc" % (extra, os.path.join(ROOT, "etc")), "/etc")
    overlay(os.path.join(ROOT, "usr/bin"), "/usr/bin")
    overlay(os.path.join(ROOT, "lib/systemd/system"), "/lib/systemd/system")
    run("mount", "-t", "tmpfs", "tmpfs", "/run")
    if pwd.getpwnam("kvpool").pw_uid != UID:
        fail("the kvpool account overlay is not in effect")

    # 1. systemd-analyze verify: silent means clean.
    v = subprocess.run(["systemd-analyze", "verify", "/lib/systemd/system/kvpool-node.service"],
                       capture_output=True, text=True)
    if v.returncode != 0 or v.stdout.strip() or v.stderr.strip():
        fail("systemd-analyze verify (rc %d): %s%s" % (v.returncode, v.stdout, v.stderr))
    print("systemd-analyze verify: clean")
    check_exec_start_pre()

    # 2. The unit's ExecStart as written, with the unit's user and notify socket.
    (exec_start,) = unit_values("ExecStart")
    if unit_values("Type") != ["notify"] or unit_values("User") != ["kvpool"]:
        fail("the unit is not Type=notify with User=kvpool")
    (runtime_dir,) = unit_values("RuntimeDirectory")
    run_dir = os.path.join("/run", runtime_dir)
    os.makedirs(run_dir)
    os.chown(run_dir, UID, GID)
    os.chmod(run_dir, int(unit_values("RuntimeDirectoryMode")[0], 8))
    print("ExecStart: " + exec_start)
    stop_within = int(unit_values("TimeoutStopSec")[0].rstrip("s"))
    serve_and_stop(shlex.split(exec_start), {}, run_dir, stop_within)
    # 3. The container image's entrypoint with no arguments: the node with
    # the packaged configuration, exec'd (the SIGTERM reaches it).
    entrypoint = os.environ.get("KVPOOL_ENTRYPOINT")
    if entrypoint:
        print("entrypoint: " + entrypoint)
        serve_and_stop([entrypoint], {"KVPOOL_CONFIG": "/etc/kvpool/kvpool-node.conf"}, run_dir,
                       stop_within)


THP_FILE = "/sys/kernel/mm/transparent_hugepage/shmem_enabled"


def check_exec_start_pre():
    """The unit's one ExecStartPre, as systemd runs it (as root, with its
    variables expanded),
    against a stand-in for the host's shmem_enabled file bound over it in
    this mount namespace: "never" becomes "advise"; any other setting is
    left alone; it exits 0 in each case."""
    (pre,) = unit_values("ExecStartPre")
    if not pre.startswith("-+/bin/sh -c "):
        fail("ExecStartPre is not a root shell command whose failure is ignored: " + pre)
    if not os.path.exists(THP_FILE):
        print("ExecStartPre: not run (this kernel has no %s)" % THP_FILE)
        return
    # systemd's expansion: "$$" is a "$", and $NAME or ${NAME} the unit's
    # environment variable, which this unit sets none of: empty.
    command = [re.sub(r"\$\{?\w+\}?", "", a.replace("$$", "\0")).replace("\0", "$")
               for a in shlex.split(pre[2:])]
    stand_in = os.path.join(os.path.dirname(ROOT), "shmem_enabled")
    with open(stand_in, "w") as f:
        f.write("never\n")
    run("mount", "--bind", stand_in, THP_FILE)
    try:
        for before, after in [("always within_size advise [never] deny force\n", "advise\n"),
                              ("always within_size [advise] never deny force\n", None),
                              ("[always] within_size advise never deny force\n", None),
                              ("always within_size advise never [deny] force\n", None)]:
            with open(THP_FILE, "w") as f:
                f.write(before)
            rc = subprocess.run(command).returncode
            with open(THP_FILE) as f:
                now = f.read()
            if rc != 0 or now != (after or before):
                fail("ExecStartPre on %r: rc %d, file %r, want %r" % (before, rc, now,
                                                                     after or before))
    finally:
        run("umount", THP_FILE)
    print("ExecStartPre: shmem_enabled never -> advise, the other settings kept")


def serve_and_stop(command, extra_env, run_dir, stop_within):
    """Runs command as the kvpool user with a notify socket: READY=1, then
    the C programs and the Python client through the socket, then SIGTERM:
    STOPPING=1 and exit code 0."""
    notify_name = "\0kvpool-unit-check-%d-%d" % (os.getpid(), time.monotonic_ns())
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(notify_name)
    env = {"PATH": "/usr/bin:/bin", "NOTIFY_SOCKET": "@" + notify_name[1:]}
    env.update(extra_env)
    argv = ["setpriv", "--reuid", str(UID), "--regid", str(GID), "--clear-groups", "--"] + command
    log = open(os.path.join(os.path.dirname(ROOT), "node.log"), "w")
    node = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)

    def expect(state, within):
        listener.settimeout(within)
        try:
            msg = listener.recv(4096).decode()
        except socket.timeout:
            node.kill()
            with open(log.name) as f:
                sys.stderr.write(f.read())
            fail("no %s from the node within %d s" % (state, within))
        if state not in msg.split("\n"):
            fail("expected %s, got %r" % (state, msg))
        print("notify: %r" % msg)

    expect("READY=1", 120)
    sock = os.path.join(run_dir, "kvpool.sock")
    if os.stat(sock).st_uid != UID:
        fail("the socket does not belong to the kvpool user")
    # The installed C library (via pkg-config and CMake) and Python package.
    libs = {"LD_LIBRARY_PATH": os.path.dirname(os.environ["KVPOOL_LIBRARY"])}
    for smoke in SMOKES:  # c_api_smoke: put, get, exists round trip of fixed keys
        run(smoke, sock, env=libs)
        # The installed kvpoolctl drops them, so the next program stores afresh.
        run("/usr/bin/kvpoolctl", "--socket", sock, "clear", "c-smoke", env=libs)
    py = ("import kvpool, sys\n"
          "c = kvpool.Client(sys.argv[1], namespace='package-test')\n"
          "c.clear()\n"
          "assert c.put(['k'], [b'v' * 4096]) == [kvpool.StatusCode.OK]\n"
          "assert c.get(['k']) == [b'v' * 4096]\n"
          "print('python3-kvpool', kvpool.__version__, 'round trip ok')\n")
    run("/usr/bin/python3", "-c", py, sock,
        env={"PYTHONPATH": os.path.join(ROOT, "usr/lib/python3/dist-packages"),
             "KVPOOL_LIBRARY": os.environ["KVPOOL_LIBRARY"], "PYTHONDONTWRITEBYTECODE": "1"})
    # systemd's (and Kubernetes') stop: SIGTERM, STOPPING=1, a clean exit in time.
    node.send_signal(signal.SIGTERM)
    expect("STOPPING=1", 30)
    try:
        rc = node.wait(timeout=stop_within)
    except subprocess.TimeoutExpired:
        node.kill()
        fail("the node did not stop within %d s" % stop_within)
    if rc != 0:
        fail("the node exited %d on SIGTERM" % rc)
    listener.close()
    print("stopped cleanly")


if __name__ == "__main__":
    main()
