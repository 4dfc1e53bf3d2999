#!/usr/bin/env python3
"""GPU <-> kvpool shared segment copy bandwidth: registered vs not vs pinned peak.

Starts a kvpool-node (binary: --node, else env KVPOOL_NODE, else
build/src/node/kvpool-node; library: --library, else env KVPOOL_LIBRARY,
else the build tree) in a temporary directory, opens a client, puts one
value per size (default 1, 4, 16, 64 MiB) and times, per size:
  h2d  segment -> GPU: the value acquired in place (kvpool_acquire, a view
       of the read-only mapped segment) copied into a GPU tensor.
  d2h  GPU -> segment: a reservation (kvpool_reserve: the connection's
       staging area, or the segment itself with --writable-segment) filled
       from a GPU tensor; the node copies it into the segment on commit (not
       timed; the reservation is aborted).
each three ways: `unregistered` (pageable: CUDA stages the copy), then
`registered` (kvpool.integrations._cuda.register_segment(include_staging)
and its copy_into: non_blocking on the current stream), and `pinned`, a
torch .pin_memory() tensor (cudaMallocHost memory: the peak). Each figure
is the bandwidth of --iters back-to-back copies up to a synchronize, after
one warm-up copy; acquire/reserve are outside the timing. Prints a table
and `metric NAME VALUE` lines: {h2d,d2h}_<S>MiB_{unregistered,registered,
pinned}_gbps, {h2d,d2h}_<S>MiB_registered_vs_unregistered and
..._registered_vs_pinned (ratios), and register_ms.

Without torch or a CUDA device it says so and exits 0. --dry-run runs the
same steps with CPU tensors (no GPU; registration is skipped), to check the
script itself.
"""

import argparse
import ctypes
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "python"))

MiB = 1 << 20


def start_node(binary, tmp, dram, writable):
    sock = os.path.join(tmp, "node.sock")
    log = open(os.path.join(tmp, "node.log"), "wb")
    args = [binary, "--socket", sock, "--dram-capacity", dram, "--admin-port", "0",
            "--client-staging-bytes", "160MiB", "--log-level", "warn"]
    if writable:
        args.append("--writable-segment=true")
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
    log.close()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if os.path.exists(sock):
            return proc, sock
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    with open(os.path.join(tmp, "node.log"), errors="replace") as f:
        raise SystemExit("gpu_copy_bench: kvpool-node did not start:\n" + f.read())


def region_of(client, call, key, size=None):
    """(address, handle) of kvpool_acquire (size None) or kvpool_reserve of one key."""
    from kvpool import _native

    ids = client.key_ids([key])
    regions = (_native.Region * 1)()
    st = (_native.c_status * 1)(-1)
    if size is None:
        rc = client._native_call(client._lib.kvpool_acquire, ids.ids, 1, regions, st)
    else:
        sizes = (ctypes.c_uint64 * 1)(size)
        rc = client._native_call(client._lib.kvpool_reserve, ids.ids, sizes, 1, regions, st)
    if rc != 0 or st[0] != 0:
        raise SystemExit("gpu_copy_bench: %s of %s failed: %d/%d" % (call, key, rc, st[0]))
    return regions[0].data, regions[0].handle


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--node", default=os.environ.get("KVPOOL_NODE")
                    or os.path.join(REPO, "build", "src", "node", "kvpool-node"))
    ap.add_argument("--library", default=os.environ.get("KVPOOL_LIBRARY"))
    ap.add_argument("--sizes-mib", default="1,4,16,64")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--dram", default="1GiB", help="the node's --dram-capacity")
    ap.add_argument("--writable-segment", action="store_true")
    ap.add_argument("--dry-run", action="store_true", help="CPU tensors, no GPU")
    args = ap.parse_args()
    if args.library:
        os.environ["KVPOOL_LIBRARY"] = args.library
    try:
        import torch
    except ImportError:
        print("gpu_copy_bench: torch is not installed; nothing to measure")
        return 0
    if not args.dry_run and not torch.cuda.is_available():
        print("gpu_copy_bench: no CUDA device (torch.cuda.is_available() is False); "
              "nothing to measure")
        return 0
    import kvpool
    from kvpool.integrations import _cuda

    dev = "cpu" if args.dry_run else "cuda"
    sync = (lambda: None) if args.dry_run else torch.cuda.synchronize
    sizes = [int(s) * MiB for s in args.sizes_mib.split(",")]

    def gbps(dst, src, registered, nbytes):
        _cuda.copy_into(dst, src, registered)
        sync()
        t = time.perf_counter()
        for _ in range(args.iters):
            _cuda.copy_into(dst, src, registered)
        sync()
        return nbytes * args.iters / (time.perf_counter() - t) / 1e9

    tmp = tempfile.mkdtemp(prefix="kvpool-gpu-bench-")
    proc, sock = start_node(args.node, tmp, args.dram, args.writable_segment)
    client = reg = None
    try:
        client = kvpool.Client(sock, namespace="gpu-copy-bench", timeout_ms=30000)
        gpu, host, pinned = {}, {}, {}
        for s in sizes:
            gpu[s] = torch.randint(0, 256, (s,), dtype=torch.uint8, device=dev)
            value = gpu[s].cpu()
            if client.put(["v%d" % s], [value.numpy()]) != [kvpool.StatusCode.OK]:
                raise SystemExit("gpu_copy_bench: put of %d bytes failed" % s)
            host[s] = (region_of(client, "acquire", "v%d" % s),
                       region_of(client, "reserve", "w%d" % s, s))
            pinned[s] = value.clone() if args.dry_run else value.pin_memory()
        res = {}
        for mode in ("unregistered", "registered"):
            if mode == "registered":
                t = time.perf_counter()
                reg = _cuda.register_segment(client, include_staging=True)
                res["register_ms"] = (time.perf_counter() - t) * 1e3
                if not reg.registered:
                    print("gpu_copy_bench: registration failed: %s" % reg.reason)
            for s in sizes:
                (src, _), (dst, _) = host[s]
                on = reg is not None and reg.covers(src, s)
                res["h2d", s, mode] = gbps(gpu[s], _cuda.host_view(src, s), on, s)
                on = reg is not None and reg.covers(dst, s)
                res["d2h", s, mode] = gbps(_cuda.host_view(dst, s), gpu[s], on, s)
        for s in sizes:
            res["h2d", s, "pinned"] = gbps(gpu[s], pinned[s], not args.dry_run, s)
            res["d2h", s, "pinned"] = gbps(pinned[s], gpu[s], not args.dry_run, s)
    finally:
        if reg is not None:
            reg.close()
        if client is not None:
            client.close()  # releases the acquisitions, aborts the reservations
        proc.terminate()
        proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)

    print("%-4s %8s %14s %12s %8s" % ("dir", "size", "unregistered", "registered", "pinned"))
    metrics = [("register_ms", res["register_ms"])]
    for d in ("h2d", "d2h"):
        for s in sizes:
            u, r, p = (res[d, s, m] for m in ("unregistered", "registered", "pinned"))
            print("%-4s %5dMiB %9.2f GB/s %7.2f GB/s %8.2f" % (d, s // MiB, u, r, p))
            name = "%s_%dMiB_" % (d, s // MiB)
            metrics += [(name + "unregistered_gbps", u), (name + "registered_gbps", r),
                        (name + "pinned_gbps", p),
                        (name + "registered_vs_unregistered", r / u),
                        (name + "registered_vs_pinned", r / p)]
    print("registration: %s" % (("%d bytes" % reg.bytes) if reg.registered else reg.reason))
    for name, value in metrics:
        print("metric %s %.3f" % (name, value))
    return 0


if __name__ == "__main__":
    sys.exit(main())
