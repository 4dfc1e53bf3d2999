"""deploy_test's cluster, from the installed packages only (run by
in_namespace.sh, as root, inside the private mount and PID namespace where
apt-get installed them).

usage: deploy_driver.py WORK

The lab: a hub network namespace with a bridge, and three "hosts" (a, b and
an intruder x), each a network namespace joined to the bridge by a veth pair
with one address on 10.77.0.0/24 (tests/harness/netns_lab.cc builds the same
shape). Every name and address lives in this mount namespace's own /run and
in namespaces made here, so nothing clashes with the host or with another
run. One etcd (Debian's etcd-server) listens in the hub on the bridge's
address, on a free port.

Each node is started as the installed kvpool-node.service would start it:
its ExecStart as written, with the --config file the only difference (a
per-host copy of the packaged /etc/kvpool/kvpool-node.conf with the cluster
settings added), as the unit's User and Group with their groups, under the
unit's Limit*= and UMask=, with NoNewPrivileges, with $NOTIFY_SOCKET, and a
runtime directory made as RuntimeDirectory= makes it (both hosts share this
mount namespace's /run, so each has its own directory).

Checks (each prints a summary line with its figures):
  restart:  kill -9 of b, and b started again at once: the first local put
            and get answered within LOCAL_WITHIN_S of the start; /readyz 200
            "ready for local work; not yet for cluster work: joining: ..."
            and /readyz/cluster 503 while it waits for its old lease;
            /api/v1/status "readiness"; cluster work back within the lease
            plus CLUSTER_MARGIN_S (/readyz/cluster 200 "ready", values put on
            a before and after the kill read byte-exact on b);
  intruder: a node without the cluster key (--insecure) registers in the
            same etcd and cluster; a and b leave it out of their views
            (kvpoolctl members), count it unproven (metrics), and 100 puts on
            a all read byte-exact on b; the intruder reads none of them;
  tenants:  a 1 MiB value put by tenant alpha's user on a reads byte-exact
            for alpha on b, and is a miss for beta and for default-tenant
            clients (a user of the kvpool group, and root) on a and on b;
  stop:     every node stops on SIGTERM with exit status 0, etcd stops, the
            namespaces are removed (also after a failure).
"""

import ctypes
import json
import os
import pwd
import random
import re
import resource
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

WORK = sys.argv[1]
HERE = os.path.dirname(os.path.abspath(__file__))
UNIT = "/lib/systemd/system/kvpool-node.service"
PACKAGED_CONF = "/etc/kvpool/kvpool-node.conf"
KEY_FILE = "/etc/kvpool/cluster.key"
TENANTS_FILE = "/etc/kvpool/tenants"
NET = "10.77.0."
HUB = "kvd-hub"
HOST_IP = {"a": 1, "b": 2, "x": 3}
PEER_PORT = 9711
LEASE_S = 3
DRAM = "256MiB"
# First local put+get after a restart. The old lease holds the node's id
# for LEASE_S after the kill: a node that waited for it would answer after
# LEASE_S. Its start itself (pre-faulting over 400 MiB of DRAM for it and two
# tenants) takes 0.5 to 1.5 s on a loaded 2-core host.
LOCAL_WITHIN_S = LEASE_S - 1.0
CLUSTER_MARGIN_S = 3.0   # cluster work back within the lease plus this
POLL_S = 0.02
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TEST_USERS = ("kvd-alpha", "kvd-beta", "kvd-engine")
CLIENT_CODE = open(os.path.join(HERE, "kv_client.py")).read()

libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNET = 0x40000000


class Failure(Exception):
    pass


def fail(msg):
    raise Failure(msg)


def log(msg):
    print(msg, flush=True)


def summary(check, msg):
    print("deploy_test: %s: %s" % (check, msg), flush=True)


def sh(*cmd, ns=None, timeout=30):
    """Runs cmd (in network namespace ns); its output; a Failure naming it."""
    argv = list(cmd) if ns is None else ["nsenter", "--net=/run/netns/" + ns, "--"] + list(cmd)
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        fail("`%s` exited %d: %s%s" % (shlex.join(argv), r.returncode, r.stdout, r.stderr))
    return r.stdout


def in_netns(ns, fn):
    """fn() on a thread inside network namespace ns (sockets it makes stay there)."""
    box = {}

    def body():
        try:
            fd = os.open("/run/netns/" + ns, os.O_RDONLY | os.O_CLOEXEC)
            try:
                if libc.setns(fd, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), "setns into " + ns)
            finally:
                os.close(fd)
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 -- handed to the caller
            box["error"] = e

    t = threading.Thread(target=body)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def http(ns, url, timeout=2.0):
    """(status, body) of a GET from inside ns; status None when it failed."""
    def get():
        try:
            with urllib.request.urlopen(url, timeout=timeout) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()
        except (urllib.error.URLError, OSError) as e:
            return None, str(e)
    return in_netns(ns, get)


def value(tag, size):
    return random.Random(tag).randbytes(size)


def tail(path, n=40):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError as e:
        return str(e)


# --- the installed unit -------------------------------------------------------

# systemd's Limit*= and Linux's RLIMIT_* numbers (asm-generic/resource.h;
# Python's resource module lacks some of the names).
RLIMITS = {"Limit" + name: number for number, name in enumerate(
    ["CPU", "FSIZE", "DATA", "STACK", "CORE", "RSS", "NPROC", "NOFILE", "MEMLOCK", "AS",
     "LOCKS", "SIGPENDING", "MSGQUEUE", "NICE", "RTPRIO", "RTTIME"])}


PROC_LIMITS = ["Max cpu time", "Max file size", "Max data size", "Max stack size",
               "Max core file size", "Max resident set", "Max processes", "Max open files",
               "Max locked memory", "Max address space", "Max file locks", "Max pending signals",
               "Max msgqueue size", "Max nice priority", "Max realtime priority",
               "Max realtime timeout"]


def proc_limit(rows, res):
    """(soft, hard) of resource res from the rows of /proc/PID/limits."""
    for row in rows:
        if row.startswith(PROC_LIMITS[res] + " "):
            soft, hard = row[len(PROC_LIMITS[res]):].split()[:2]
            conv = lambda v: resource.RLIM_INFINITY if v == "unlimited" else int(v)  # noqa: E731
            return conv(soft), conv(hard)
    fail("no '%s' row in /proc/PID/limits" % PROC_LIMITS[res])


def above(a, b):
    """Whether rlimit a exceeds rlimit b (RLIM_INFINITY is the largest)."""
    inf = resource.RLIM_INFINITY
    return a != b and (a == inf or (b != inf and a > b))


def has_cap_sys_resource():
    with open("/proc/self/status") as f:
        eff = next(int(line.split()[1], 16) for line in f if line.startswith("CapEff:"))
    return bool(eff & (1 << 24))  # CAP_SYS_RESOURCE


def rlimit_value(text, key):
    if text == "infinity":
        return resource.RLIM_INFINITY
    if not text.isdigit():
        fail("%s=%s: this test applies only plain numbers and 'infinity'" % (key, text))
    return int(text)


class Unit:
    """The [Service] settings of the installed unit that decide how the node runs."""

    def __init__(self, path):
        self.values = {}
        section = None
        with open(path) as f:
            for line in f:
                line = line.strip()
                if not line or line[0] in "#;":
                    continue
                if line.startswith("["):
                    section = line
                    continue
                if section == "[Service]" and "=" in line:
                    k, v = line.split("=", 1)
                    self.values.setdefault(k.strip(), []).append(v.strip())

    def one(self, key):
        v = self.values.get(key, [])
        if len(v) != 1:
            fail("%s: want exactly one %s= line, found %d" % (UNIT, key, len(v)))
        return v[0]

    def parse(self):
        self.exec_start = self.one("ExecStart")
        if self.exec_start[:1] in "-@+!:":
            fail("ExecStart=%s: prefixes are not emulated by this test" % self.exec_start)
        self.argv = shlex.split(self.exec_start)
        if "--config" not in self.argv:
            fail("ExecStart=%s names no --config FILE" % self.exec_start)
        if self.argv[self.argv.index("--config") + 1] != PACKAGED_CONF:
            fail("ExecStart=%s does not read %s" % (self.exec_start, PACKAGED_CONF))
        if self.one("Type") != "notify":
            fail("the unit is not Type=notify")
        self.user = pwd.getpwnam(self.one("User"))
        self.group_name = self.one("Group")
        self.gid = int(sh("getent", "group", self.group_name).split(":")[2])
        self.umask = int(self.one("UMask"), 8)
        self.runtime_mode = int(self.one("RuntimeDirectoryMode"), 8)
        self.no_new_privs = self.values.get("NoNewPrivileges", ["no"])[-1] in ("yes", "true", "1")
        # (key, resource, soft, hard) as applied; a limit above this
        # process's hard limit cannot be given without CAP_SYS_RESOURCE
        # (which systemd has, and some containers' root lacks): it is then
        # given as high as allowed, and said so.
        self.limits, self.clamped = [], []
        for key, vals in self.values.items():
            if not key.startswith("Limit"):
                continue
            if key not in RLIMITS:
                fail("the unit sets %s, which this test cannot apply" % key)
            soft, _, hard = vals[-1].partition(":")
            soft, hard = rlimit_value(soft, key), rlimit_value(hard or soft, key)
            cap = resource.getrlimit(RLIMITS[key])[1]
            if not has_cap_sys_resource() and above(hard, cap):
                self.clamped.append("%s=%s given as %s (no CAP_SYS_RESOURCE here)"
                                    % (key, vals[-1], cap))
                hard = cap
                soft = cap if above(soft, cap) else soft
            self.limits.append((key, RLIMITS[key], soft, hard))
        return self

    def argv_for(self, conf):
        """ExecStart as written, reading conf instead of the packaged file."""
        argv = list(self.argv)
        argv[argv.index("--config") + 1] = conf
        return argv


# --- nodes -----------------------------------------------------------------

class Node:
    """One kvpool-node on a lab host, started as the unit starts it."""

    def __init__(self, unit, host, settings):
        self.unit, self.host, self.ns = unit, host, "kvd-" + host
        self.ip = NET + str(HOST_IP[host])
        self.rundir = "/run/kvpool-" + host
        self.sock = self.rundir + "/kvpool.sock"
        self.conf = "/etc/kvpool/%s.conf" % host
        self.log_path = os.path.join(WORK, "node-%s.log" % host)
        self.proc = None
        self.starts = 0
        write_conf(self.conf, dict(settings, **{"socket": self.sock, "node-id": host,
                                                "peer-address": self.ip}))
        # RuntimeDirectory=: the unit's user and group, RuntimeDirectoryMode=.
        os.makedirs(self.rundir)
        os.chown(self.rundir, unit.user.pw_uid, unit.gid)
        os.chmod(self.rundir, unit.runtime_mode)
        # $NOTIFY_SOCKET: an abstract datagram socket in the host's network
        # namespace (abstract names are per network namespace).
        self.notify_name = "\0kvpool-deploy-notify-" + host
        self.notify = in_netns(self.ns, self._bind_notify)
        self.messages = []  # (monotonic time, message) as they arrive
        self.cv = threading.Condition()
        threading.Thread(target=self._read_notify, daemon=True).start()

    def _bind_notify(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        s.bind(self.notify_name)
        return s

    def _read_notify(self):
        while True:
            try:
                msg = self.notify.recv(4096).decode(errors="replace")
            except OSError:
                return
            with self.cv:
                self.messages.append((time.monotonic(), msg))
                self.cv.notify_all()

    def command(self):
        u = self.unit
        return (["nsenter", "--net=/run/netns/" + self.ns, "--",
                 "setpriv", "--reuid=%d" % u.user.pw_uid, "--regid=%d" % u.gid, "--init-groups"] +
                (["--no-new-privs"] if u.no_new_privs else []) +
                ["--"] + u.argv_for(self.conf))

    def _preexec(self):
        os.umask(self.unit.umask)
        for _, res, soft, hard in self.unit.limits:
            resource.setrlimit(res, (soft, hard))

    def start(self):
        """Starts the node; the monotonic time just before its exec."""
        u = self.unit
        env = {"PATH": PATH, "LANG": "C.UTF-8", "HOME": u.user.pw_dir, "USER": u.user.pw_name,
               "LOGNAME": u.user.pw_name, "SHELL": u.user.pw_shell,
               "NOTIFY_SOCKET": "@" + self.notify_name[1:], "RUNTIME_DIRECTORY": self.rundir,
               "STATE_DIRECTORY": "/var/lib/kvpool"}
        with self.cv:
            self.messages.clear()
        self.starts += 1
        out = open(self.log_path, "a")
        out.write("==== start %d: %s\n" % (self.starts, shlex.join(self.command())))
        out.flush()
        t0 = time.monotonic()
        self.proc = subprocess.Popen(self.command(), env=env, stdin=subprocess.DEVNULL, stdout=out,
                                     stderr=subprocess.STDOUT, cwd="/", preexec_fn=self._preexec,
                                     start_new_session=True)
        out.close()
        return t0

    def wait_notify(self, state, within, exited_ok=False):
        """The time state (READY=1, STOPPING=1) arrived on the notify socket."""
        deadline = time.monotonic() + within
        with self.cv:
            while True:
                for t, msg in self.messages:
                    if state in msg.split("\n"):
                        return t
                if self.proc.poll() is not None and not exited_ok:
                    fail("node %s exited %s before %s; its log:\n%s"
                         % (self.host, self.proc.returncode, state, tail(self.log_path)))
                left = deadline - time.monotonic()
                if left <= 0:
                    fail("no %s from node %s within %.0f s; its log:\n%s"
                         % (state, self.host, within, tail(self.log_path)))
                self.cv.wait(min(left, 0.1))

    def admin(self, path):
        return http(self.ns, "http://127.0.0.1:%d%s" % (ADMIN_PORT, path))

    def ctl(self, *args):
        return sh("/usr/bin/kvpoolctl", *args, ns=self.ns)

    def metric(self, name):
        code, body = self.admin("/metrics")
        if code != 200:
            fail("node %s: /metrics answered %s: %s" % (self.host, code, body[:200]))
        vals = [float(line.split()[-1]) for line in body.splitlines()
                if line.startswith(name + " ") or line.startswith(name + "{")]
        return sum(vals) if vals else None

    def check_process(self):
        """The running node has the unit's user, groups, umask and limits."""
        pid = self.proc.pid
        with open("/proc/%d/status" % pid) as f:
            st = dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
        u = self.unit
        uid, gid = u.user.pw_uid, u.gid
        if st["Uid"].split() != [str(uid)] * 4 or st["Gid"].split() != [str(gid)] * 4:
            fail("node %s runs as Uid %s Gid %s, want the unit's %d/%d"
                 % (self.host, st["Uid"], st["Gid"], uid, gid))
        if int(st["Umask"], 8) != u.umask:
            fail("node %s has umask %s, want the unit's %04o" % (self.host, st["Umask"], u.umask))
        if u.no_new_privs and st.get("NoNewPrivs") != "1":
            fail("node %s runs without no_new_privs" % self.host)
        with open("/proc/%d/limits" % pid) as f:
            rows = f.read().splitlines()
        for key, res, soft, hard in u.limits:
            got = proc_limit(rows, res)
            if got != (soft, hard):
                fail("node %s: %s is %s, want %s" % (self.host, key, got, (soft, hard)))

    def stop(self, within=30):
        """SIGTERM; its exit status (None when it had to be killed)."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=within)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None


def write_conf(path, settings):
    """The packaged configuration with settings replaced or added."""
    out, done = [], set()
    with open(PACKAGED_CONF) as f:
        for line in f.read().splitlines():
            m = re.match(r"\s*([a-z0-9-]+)\s*=", line)
            if m and m.group(1) in settings:
                out.append("%s = %s" % (m.group(1), settings[m.group(1)]))
                done.add(m.group(1))
            else:
                out.append(line)
    out.append("")
    out.append("# deploy_test: this host's settings")
    out += ["%s = %s" % (k, v) for k, v in settings.items() if k not in done]
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")
    os.chmod(path, 0o644)


def packaged_setting(name):
    with open(PACKAGED_CONF) as f:
        for line in f:
            m = re.match(r"\s*%s\s*=\s*(\S+)" % re.escape(name), line)
            if m:
                return m.group(1)
    fail("%s sets no %s" % (PACKAGED_CONF, name))


ADMIN_PORT = int(packaged_setting("admin-port"))


# --- clients -------------------------------------------------------------------

def kvpool_module():
    import kvpool
    if not kvpool.__file__.startswith("/usr/lib/python3/dist-packages/kvpool/"):
        fail("import kvpool found %s, not the installed python3-kvpool" % kvpool.__file__)
    return kvpool


def check_installed_library():
    with open("/proc/self/maps") as f:
        libs = {os.path.realpath(line.split()[-1]) for line in f if "libkvpool.so" in line}
    listed = {os.path.realpath(p) for p in sh("dpkg", "-L", "libkvpool0").split()
              if ".so" in p}
    if not libs or not libs <= listed:
        fail("the Python client loaded %s, not libkvpool0's %s" % (sorted(libs), sorted(listed)))
    return sorted(libs)


def as_user(user, node, op, namespace, key, size, seed):
    """kv_client.py as user (uid and groups) on node's host; its JSON answer."""
    pw = pwd.getpwnam(user)
    argv = ["nsenter", "--net=/run/netns/" + node.ns, "--",
            "setpriv", "--reuid=%d" % pw.pw_uid, "--regid=%d" % pw.pw_gid, "--init-groups", "--",
            "/usr/bin/python3", "-c", CLIENT_CODE, op, node.sock, namespace, key, str(size), seed]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=30, cwd="/",
                       env={"PATH": PATH, "HOME": "/", "PYTHONDONTWRITEBYTECODE": "1"})
    if r.returncode != 0:
        fail("%s's client %s on %s exited %d: %s%s"
             % (user, op, node.host, r.returncode, r.stdout, r.stderr))
    out = json.loads(r.stdout.strip().splitlines()[-1])
    if out["uid"] != pw.pw_uid:
        fail("%s's client ran as uid %s" % (user, out["uid"]))
    if not out["module"].startswith("/usr/lib/python3/dist-packages/kvpool/"):
        fail("%s's client imported %s, not the installed package" % (user, out["module"]))
    return out


def put_get_local(kv, node, namespace, key, data):
    """One local put and get on node as this process (root: the default
    tenant); True when the get returned data exactly."""
    try:
        with kv.Client(node.sock, namespace=namespace, timeout_ms=500) as c:
            if c.put([key], [data]) != [kv.StatusCode.OK]:
                return False
            return c.get([key]) == [data]
    except kv.KvpoolError:
        return False


def read_back(kv, node, namespace, keys, values):
    """(exact, wrong, missed) reading keys on node."""
    with kv.Client(node.sock, namespace=namespace, timeout_ms=3000) as c:
        got = c.get(keys)
    exact = sum(1 for g, v in zip(got, values) if g == v)
    missed = sum(1 for g in got if g is None)
    return exact, len(keys) - exact - missed, missed


# --- the lab -----------------------------------------------------------------

class Lab:
    def __init__(self):
        self.namespaces = []
        self.etcd = None
        self.etcd_rc = None
        self.etcd_log = os.path.join(WORK, "etcd.log")
        self.nodes = {}

    def netns(self, ns):
        sh("ip", "netns", "add", ns)
        self.namespaces.append(ns)
        sh("ip", "-n", ns, "link", "set", "lo", "up")

    def build(self):
        self.netns(HUB)
        sh("ip", "-n", HUB, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", HUB, "addr", "add", NET + "254/24", "dev", "br0")
        sh("ip", "-n", HUB, "link", "set", "br0", "up")
        for host, i in HOST_IP.items():
            ns, peer = "kvd-" + host, "v-" + host
            self.netns(ns)
            # The veth is made in the host and its other end moved straight
            # into the hub, so no interface ever appears outside the lab.
            sh("ip", "-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", peer,
               "netns", HUB)
            sh("ip", "-n", ns, "addr", "add", "%s%d/24" % (NET, i), "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")
            sh("ip", "-n", HUB, "link", "set", peer, "master", "br0")
            sh("ip", "-n", HUB, "link", "set", peer, "up")

    def start_etcd(self):
        def free_ports():
            socks = []
            for _ in range(2):
                s = socket.socket()
                s.bind((NET + "254", 0))
                socks.append(s)
            ports = [s.getsockname()[1] for s in socks]
            for s in socks:
                s.close()
            return ports

        client_port, peer_port = in_netns(HUB, free_ports)
        self.etcd_url = "http://%s254:%d" % (NET, client_port)
        peer_url = "http://127.0.0.1:%d" % peer_port
        data = os.path.join(WORK, "etcd-data")
        cmd = ["nsenter", "--net=/run/netns/" + HUB, "--", "etcd", "--name", "deploy",
               "--data-dir", data, "--listen-client-urls", self.etcd_url,
               "--advertise-client-urls", self.etcd_url, "--listen-peer-urls", peer_url,
               "--initial-advertise-peer-urls", peer_url,
               "--initial-cluster", "deploy=" + peer_url, "--initial-cluster-state", "new"]
        out = open(self.etcd_log, "w")
        self.etcd = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        out.close()
        deadline = time.monotonic() + 20
        for ns in ("kvd-a", "kvd-b", "kvd-x"):  # reachable from every host
            while True:
                code, body = http(ns, self.etcd_url + "/health", timeout=1)
                if code == 200 and '"health":"true"' in body.replace(" ", ""):
                    break
                if self.etcd.poll() is not None or time.monotonic() > deadline:
                    fail("etcd at %s does not answer from %s (%s %s); its log:\n%s"
                         % (self.etcd_url, ns, code, body[:200], tail(self.etcd_log)))
                time.sleep(0.1)

    def etcd_members(self):
        out = sh("etcdctl", "--endpoints", self.etcd_url, "get", "--prefix", "--keys-only",
                 "/kvpool/v1/default/members/", ns=HUB)
        return sorted(k.rsplit("/", 1)[-1] for k in out.split())

    def teardown(self, ok):
        """Stops nodes (SIGTERM) and etcd, removes the namespaces; the
        problems found, as messages."""
        problems = []
        for host, node in self.nodes.items():
            if node.proc is None:
                continue
            t0 = time.monotonic()
            rc = node.stop()
            if rc != 0:
                problems.append("node %s exited %s on SIGTERM; its log:\n%s"
                                % (host, rc, tail(node.log_path)))
            elif ok:
                try:
                    node.wait_notify("STOPPING=1", 1, exited_ok=True)
                except Failure as e:
                    problems.append(str(e))
            node.stop_s = time.monotonic() - t0
        if self.etcd is not None and self.etcd.poll() is None:
            self.etcd.send_signal(signal.SIGTERM)
            try:
                self.etcd_rc = self.etcd.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.etcd.kill()
                self.etcd.wait()
                problems.append("etcd did not stop on SIGTERM within 10 s")
        for ns in reversed(self.namespaces):
            r = subprocess.run(["ip", "netns", "del", ns], capture_output=True, text=True)
            if r.returncode != 0:
                problems.append("ip netns del %s: %s" % (ns, r.stderr.strip()))
        left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        if left.strip():
            problems.append("network namespaces left: " + left.strip())
        return problems


# --- the checks ---------------------------------------------------------------

def members_seen(node):
    """The node ids in node's view (kvpoolctl members --json)."""
    j = json.loads(node.ctl("members", "--admin", "127.0.0.1:%d" % ADMIN_PORT, "--json"))
    return sorted(m["node_id"] for m in j["members"])


def shard_owners(node):
    """The node ids owning shards in node's view (kvpoolctl shards --json)."""
    j = json.loads(node.ctl("shards", "--admin", "127.0.0.1:%d" % ADMIN_PORT, "--json"))
    return sorted(k for k, n in j["owned"].items() if n > 0)


def wait_for(what, within, fn, poll=POLL_S):
    """Polls fn() until it returns a true value; (value, seconds taken).
    what: the failure's message, or a function giving it."""
    t0 = time.monotonic()
    while True:
        v = fn()
        if v:
            return v, time.monotonic() - t0
        if time.monotonic() - t0 > within:
            fail("%s: not within %.1f s" % (what() if callable(what) else what, within))
        time.sleep(poll)


def check_restart(kv, lab):
    a, b = lab.nodes["a"], lab.nodes["b"]
    before = value("restart/before", 256 << 10)
    if put_get_local(kv, a, "deploy-restart", "before", before) is not True:
        fail("restart: a put and get on a before the kill failed")
    b.proc.kill()
    b.proc.wait()
    t0 = b.start()
    # The first local put+get on b, polled every 20 ms from the start.
    n = 0
    t_local = None
    while time.monotonic() - t0 < 10:
        n += 1
        if put_get_local(kv, b, "deploy-restart", "probe-%d" % n, value("probe/%d" % n, 4096)):
            t_local = time.monotonic() - t0
            break
        if b.proc.poll() is not None:
            fail("restart: b exited %s after its restart; its log:\n%s"
                 % (b.proc.returncode, tail(b.log_path)))
        time.sleep(POLL_S)
    if t_local is None:
        fail("restart: no local put+get answered on b within 10 s of its restart (%d tries); "
             "its log:\n%s" % (n, tail(b.log_path)))
    if t_local > LOCAL_WITHIN_S:
        fail("restart: the first local put+get on b was answered %.2f s after its start "
             "(want <= %.1f s; %d tries every %.0f ms)"
             % (t_local, LOCAL_WITHIN_S, n, POLL_S * 1000))
    t_ready = b.wait_notify("READY=1", 5) - t0
    # While it waits for its old lease: local yes, cluster not yet.
    rz = b.admin("/readyz")
    rzc = b.admin("/readyz/cluster")
    code, body = b.admin("/api/v1/status")
    if code != 200:
        fail("restart: /api/v1/status on b answered %s: %s" % (code, body[:300]))
    readiness = json.loads(body).get("readiness")
    log("restart: b %.2f s after its start: /readyz %s %r; /readyz/cluster %s %r; "
        "/api/v1/status readiness %s" % (time.monotonic() - t0, rz[0], rz[1], rzc[0], rzc[1],
                                         json.dumps(readiness)))
    if rzc[0] == 200:
        fail("restart: b was ready for cluster work %.2f s after its restart, inside the lease "
             "(%d s) of its killed registration: /readyz/cluster %s %r"
             % (time.monotonic() - t0, LEASE_S, rzc[0], rzc[1]))
    want = "ready for local work; not yet for cluster work: joining"
    if rz[0] != 200 or not rz[1].startswith(want):
        fail("restart: b's /readyz while joining answered %s %r, want 200 %r..."
             % (rz[0], rz[1], want))
    if rzc[0] != 503:
        fail("restart: b's /readyz/cluster while joining answered %s %r, want 503"
             % (rzc[0], rzc[1]))
    if (not isinstance(readiness, dict) or readiness.get("local") != "ready" or
            readiness.get("cluster") != "joining" or not readiness.get("detail")):
        fail("restart: b's /api/v1/status readiness while joining is %r, want local 'ready', "
             "cluster 'joining' and a detail" % (readiness,))
    # Cluster work resumes: /readyz/cluster 200 "ready", polled every 20 ms.
    bound = LEASE_S + CLUSTER_MARGIN_S

    def cluster_ready():
        code, body = b.admin("/readyz/cluster")
        if code == 200:
            if body != "ready":
                fail("restart: b's /readyz/cluster answered 200 %r, want 'ready'" % body)
            return True
        if code != 503:
            fail("restart: b's /readyz/cluster answered %s %r while joining" % (code, body))
        if b.proc.poll() is not None:
            fail("restart: b exited %s; its log:\n%s" % (b.proc.returncode, tail(b.log_path)))
        return False

    wait_for("restart: b's /readyz/cluster 200 after its restart",
                         bound - (time.monotonic() - t0), cluster_ready)
    t_cluster = time.monotonic() - t0
    rz = b.admin("/readyz")
    if rz != (200, "ready"):
        fail("restart: b's /readyz once joined answered %s %r, want 200 'ready'" % rz)
    readiness = json.loads(b.admin("/api/v1/status")[1]).get("readiness")
    if readiness.get("local") != "ready" or readiness.get("cluster") != "ready":
        fail("restart: b's readiness once joined is %r" % (readiness,))
    # A value put on a before the kill and one put after b joined read
    # byte-exact on b, within the same bound.
    after = value("restart/after", 256 << 10)
    if put_get_local(kv, a, "deploy-restart", "after", after) is not True:
        fail("restart: a put and get on a after b joined failed")
    tries = [0]

    def both_read():
        tries[0] += 1
        exact, wrong, _ = read_back(kv, b, "deploy-restart", ["before", "after"], [before, after])
        if wrong:
            fail("restart: b read wrong bytes for a value put on a")
        return exact == 2

    def why():
        exact, wrong, missed = read_back(kv, b, "deploy-restart", ["before", "after"],
                                         [before, after])
        return ("restart: values put on a (one before the kill, one after b joined) did not "
                "read byte-exact on b within %.1f s of its restart (lease %d s + %.0f s): "
                "%d exact, %d wrong, %d missed after %d tries"
                % (bound, LEASE_S, CLUSTER_MARGIN_S, exact, wrong, missed, tries[0]))

    wait_for(why, max(bound - (time.monotonic() - t0), 0.001), both_read)
    t_data = time.monotonic() - t0
    b.check_process()
    summary("restart", "first local put+get %.2f s after start (%d tries, READY=1 at %.2f s); "
            "/readyz 200 'ready for local work; not yet for cluster work: joining...' and "
            "/readyz/cluster 503 while joining; /readyz/cluster 200 'ready' %.2f s after start, "
            "values put on a read byte-exact on b at %.2f s (lease %d s, bound %.0f s)"
            % (t_local, n, t_ready, t_cluster, t_data, LEASE_S, bound))


def check_intruder(kv, lab, settings):
    a, b = lab.nodes["a"], lab.nodes["b"]
    x_settings = {k: v for k, v in settings.items()
                  if k not in ("cluster-key-file", "tenants-file")}
    x_settings["insecure"] = "true"
    x = lab.nodes["x"] = Node(lab.unit, "x", x_settings)
    t0 = x.start()
    t_ready = x.wait_notify("READY=1", 30) - t0
    # It registers in etcd (no proof), and a and b count it unproven.
    def registered():
        regs = lab.etcd_members()
        return regs if "x" in regs else None

    regs, _ = wait_for(lambda: "intruder: x's registration in etcd (etcd lists %s)"
                       % lab.etcd_members(), 10, registered, poll=0.05)
    t_reg = time.monotonic() - t0
    if regs != ["a", "b", "x"]:
        fail("intruder: etcd lists members %s, want a, b and x" % regs)
    for n in (a, b):
        wait_for(lambda: "intruder: kvpool_membership_unproven_members 1 on %s (it is %s)"
                 % (n.host, n.metric("kvpool_membership_unproven_members")), 10,
                 lambda: n.metric("kvpool_membership_unproven_members") == 1, poll=0.05)
    views = {n.host: members_seen(n) for n in (a, b)}
    for host, ids in views.items():
        if ids != ["a", "b"]:
            fail("intruder: %s's kvpoolctl members lists %s, want exactly a and b" % (host, ids))
        owners = shard_owners(lab.nodes[host])
        if owners != ["a", "b"]:
            fail("intruder: %s's kvpoolctl shards gives shards to %s, want a and b only"
                 % (host, owners))
    unproven = {n.host: n.metric("kvpool_membership_unproven_members") for n in (a, b)}
    if any(v != 1 for v in unproven.values()):
        fail("intruder: kvpool_membership_unproven_members is %s, want 1 on a and b" % unproven)
    keys = ["k%03d" % i for i in range(100)]
    vals = [value("intruder/%d" % i, 16 << 10) for i in range(100)]
    with kv.Client(a.sock, namespace="deploy-intruder", timeout_ms=3000) as c:
        st = c.put(keys, vals)
    if st != [kv.StatusCode.OK] * 100:
        fail("intruder: puts on a: %d of 100 OK" % st.count(kv.StatusCode.OK))
    exact, wrong, missed = read_back(kv, b, "deploy-intruder", keys, vals)
    if exact != 100:
        fail("intruder: of 100 values put on a, b read %d byte-exact, %d wrong, %d missed "
             "(want 100 exact)" % (exact, wrong, missed))
    x_exact, x_wrong, x_missed = read_back(kv, x, "deploy-intruder", keys, vals)
    if x_exact or x_wrong:
        fail("intruder: x (no cluster key) read %d of a's 100 values byte-exact and %d wrong "
             "(want 0 of them)" % (x_exact, x_wrong))
    refused = sum(n.metric("kvpool_transport_bootstrap_refused_total") or 0 for n in (a, b))
    x.check_process()
    rc = x.stop()
    if rc != 0:
        fail("intruder: x exited %s on SIGTERM; its log:\n%s" % (rc, tail(x.log_path)))
    summary("intruder", "x registered in etcd %.2f s after start (READY=1 at %.2f s; etcd "
            "lists %s); a and b list %s and %s, unproven members a=%d b=%d; 100/100 of a's "
            "puts read byte-exact on b; x read 0/100 (%d missed); a+b refused %d peer "
            "connections; x exited 0 on SIGTERM"
            % (t_reg, t_ready, ",".join(regs), views["a"], views["b"], unproven["a"],
               unproven["b"], x_missed, refused))


def check_tenants(lab):
    a, b = lab.nodes["a"], lab.nodes["b"]
    size, seed, ns_, key = 1 << 20, "tenant-alpha-1MiB", "deploy-tenants", "layer-0"
    r = as_user("kvd-alpha", a, "put", ns_, key, size, seed)
    if r["status"] != "OK":
        fail("tenants: alpha's 1 MiB put on a: %s" % r["status"])
    tries = [0]

    def alpha_on_b():
        tries[0] += 1
        r = as_user("kvd-alpha", b, "get", ns_, key, size, seed)
        if r["hit"] and not r["exact"]:
            fail("tenants: alpha read wrong bytes on b (%s bytes)" % r["size"])
        return r["hit"]

    _, t_alpha = wait_for(lambda: "tenants: alpha's 1 MiB value put on a is a miss for alpha "
                          "on b (%d tries)" % tries[0], 2.0, alpha_on_b, poll=0.05)
    hits = []
    for user in ("kvd-beta", "kvd-engine"):
        for node in (a, b):
            r = as_user(user, node, "get", ns_, key, size, seed)
            if r["hit"]:
                hits.append("%s on %s (%s bytes%s)" % (user, node.host, r["size"],
                                                       ", alpha's" if r["exact"] else ""))
    kv = kvpool_module()
    for node in (a, b):  # root: the default tenant too
        with kv.Client(node.sock, namespace=ns_, timeout_ms=3000) as c:
            got = c.get([key])[0]
        if got is not None:
            hits.append("root on %s (%d bytes)" % (node.host, len(got)))
    if hits:
        fail("tenants: alpha's value (namespace %s, key %s) was read by %s; want a miss for "
             "every other tenant" % (ns_, key, "; ".join(hits)))
    summary("tenants", "alpha's 1 MiB put on a read byte-exact by alpha on b (%d tries, "
            "%.2f s); beta, a kvpool-group user and root (default tenant) on a and on b: "
            "0 of 6 reads hit" % (tries[0], t_alpha))


def main():
    lab = Lab()
    ok = False
    problems = []
    try:
        lab.unit = unit = Unit(UNIT).parse()
        log("unit: ExecStart=%s User=%s Group=%s UMask=%04o %s%s" % (
            unit.exec_start, unit.user.pw_name, unit.group_name, unit.umask,
            " ".join("%s=%s" % (k, "infinity" if s == resource.RLIM_INFINITY else s)
                     for k, _, s, _ in unit.limits),
            " NoNewPrivileges=yes" if unit.no_new_privs else ""))
        for note in unit.clamped:
            log("unit: NOTE: " + note)
        # Test users: two tenants' and one of the default tenant, all in the
        # socket's group (README: adduser vllm kvpool).
        for user in TEST_USERS:
            sh("useradd", "--system", "--user-group", "--no-create-home", "--shell",
               "/usr/sbin/nologin", "--groups", unit.group_name, user)
        uid = {u: pwd.getpwnam(u).pw_uid for u in TEST_USERS}
        with open(TENANTS_FILE, "w") as f:
            f.write("# deploy_test: two tenants; everyone else is the default tenant\n"
                    "tenant alpha dram=64MiB uids=%d\n"
                    "tenant beta dram=64MiB uids=%d\n" % (uid["kvd-alpha"], uid["kvd-beta"]))
        os.chmod(TENANTS_FILE, 0o644)
        key = sh("openssl", "rand", "-hex", "32")
        old = os.umask(0o077)
        with open(KEY_FILE, "w") as f:
            f.write(key)
        os.umask(old)
        os.chmod(KEY_FILE, 0o600)
        os.chown(KEY_FILE, unit.user.pw_uid, unit.gid)

        lab.build()
        lab.start_etcd()
        log("lab: hub %s (bridge %s254/24), hosts a=%s1 b=%s2 x=%s3, etcd %s"
            % (HUB, NET, NET, NET, NET, lab.etcd_url))
        settings = {"dram-capacity": DRAM, "dram-read-room": "32MiB", "etcd": lab.etcd_url,
                    "peer-port": PEER_PORT, "cluster-key-file": KEY_FILE,
                    "tenants-file": TENANTS_FILE, "lease-ttl": "%ds" % LEASE_S}
        for host in ("a", "b"):
            lab.nodes[host] = Node(unit, host, settings)
        log("node a: " + shlex.join(lab.nodes["a"].command()))
        with open(lab.nodes["a"].conf) as f:
            log("  %s:\n    " % lab.nodes["a"].conf +
                "\n    ".join(l for l in f.read().splitlines() if l and not l.startswith("#")))
        starts = {h: n.start() for h, n in lab.nodes.items()}
        for h, n in lab.nodes.items():
            n.wait_notify("READY=1", 60)
            n.check_process()
        for h, n in lab.nodes.items():
            wait_for("node %s's /readyz/cluster 200" % h, 20,
                     lambda: n.admin("/readyz/cluster")[0] == 200, poll=0.05)
            wait_for("node %s seeing a and b" % h, 10, lambda: members_seen(n) == ["a", "b"],
                     poll=0.1)
        log("nodes a and b: ready for cluster work %.2f s after their start"
            % (time.monotonic() - min(starts.values())))
        kv = kvpool_module()
        if not put_get_local(kv, lab.nodes["a"], "deploy-smoke", "k", b"v" * 4096):
            fail("a first local put and get on a failed")
        libs = check_installed_library()
        log("client: %s over %s" % (kv.__file__, ", ".join(libs)))

        check_restart(kv, lab)
        check_intruder(kv, lab, settings)
        check_tenants(lab)
        ok = True
    except Failure as e:
        problems.append(str(e))
    except Exception as e:  # noqa: BLE001 -- reported with the logs below
        import traceback
        problems.append("unexpected error: %s\n%s" % (e, traceback.format_exc()))
    finally:
        problems += lab.teardown(ok)
    if problems:
        for p in problems:
            print("deploy_test: FAIL: " + p, file=sys.stderr, flush=True)
        for host, node in lab.nodes.items():
            print("---- node %s log (last lines, %s) ----\n%s"
                  % (host, node.log_path, tail(node.log_path, 25)), file=sys.stderr)
        return 1
    # etcd re-raises the SIGTERM once it has stopped: its status is -15.
    etcd = "etcd stopped on SIGTERM" if lab.etcd_rc in (0, -signal.SIGTERM) else (
        "etcd exited %s on SIGTERM" % lab.etcd_rc)
    summary("stop", "%s exited 0 on SIGTERM (STOPPING=1 sent; %s); %s; network namespaces "
            "removed" % (", ".join(h for h in lab.nodes if h != "x"),
                         ", ".join("%s %.2f s" % (h, getattr(n, "stop_s", 0))
                                   for h, n in lab.nodes.items() if h != "x"), etcd))
    return 0


if __name__ == "__main__":
    sys.exit(main())
