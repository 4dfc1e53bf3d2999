#!/usr/bin/env python3
"""Layer-wise loading of the vLLM connector: how loads overlap compute.

Run with /usr/bin/python3 from the repository root (or anywhere):
  bench/vllm_layerwise.py [--reps 7] [--layers 32] [--blocks 64]
It starts its own kvpool-node (binary from env KVPOOL_NODE, else
build/src/node/kvpool-node; library from env KVPOOL_LIBRARY or the build
tree) in a temporary directory and stops it on exit.

In the vLLM stand-in driver (python/tests/standins/vllm) an instance stores
a prompt of `blocks` blocks of 16 tokens with layer-wise pages (L layers,
8 KV heads of 128, bf16: 64 KiB per layer and block), then a fresh instance
runs its first step, which loads those blocks layer by layer. Each attention
layer waits for its load, "computes" (a sleep of c_sleep seconds plus the
stand-in's own per-layer work) and queues its save. Measured:
  l          the per-layer load time: the median time of one layer's load
             job (kvpool read into staging, header check, copy into the
             layer's blocks), with c_sleep = 0;
  c          the per-layer compute time: the same forward pass with no load
             planned, divided by L (the sleep, its overshoot and the
             stand-in's work);
  forward    the forward pass (start_load_kv to the return of wait_for_save),
             median of --reps runs, for c_sleep = l/2 and c_sleep = 2l;
and, for comparison, L*(c+l) (every load before its layer, in series) and
max(L*c, L*l) + max(c, l) (loads overlap compute, one layer of whichever is
shorter left over), with their ratios to the measured forward.
Also the same forward in whole-block mode (every load in start_load_kv, then
the layers), measured. Ends with `metric NAME VALUE` lines.
"""

import argparse
import copy
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
for p in (os.path.join(REPO, "python", "tests", "standins"), os.path.join(REPO, "python")):
    if p not in sys.path:
        sys.path.insert(0, p)
if not os.environ.get("KVPOOL_LIBRARY"):
    os.environ["KVPOOL_LIBRARY"] = os.path.join(REPO, "build", "src", "client", "libkvpool.so")

import logging  # noqa: E402

import torch  # noqa: E402

BS = 16


def log(msg):
    print("[vllm-layerwise %s] %s" % (time.strftime("%H:%M:%S"), msg), file=sys.stderr,
          flush=True)


class Node:
    """A kvpool-node on a temporary socket."""

    def __init__(self, dram="1GiB"):
        self.dir = tempfile.mkdtemp(prefix="kvpool-bench-")
        self.socket = os.path.join(self.dir, "node.sock")
        binary = os.environ.get("KVPOOL_NODE") or os.path.join(REPO, "build", "src", "node",
                                                               "kvpool-node")
        self.log = open(os.path.join(self.dir, "node.log"), "wb")
        self.proc = subprocess.Popen([binary, "--socket", self.socket, "--dram-capacity", dram,
                                      "--admin-port", "0", "--node-id", "bench-node"],
                                     stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with open(os.path.join(self.dir, "node.log"), "rb") as f:
                if re.search(rb"admin http://", f.read()):
                    return
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        self.stop()
        raise RuntimeError("kvpool-node did not start")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(30)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def config(socket, layers, layerwise):
    from vllm.config import (CacheConfig, KVTransferConfig, ModelConfig, SchedulerConfig,
                             VllmConfig)

    return VllmConfig(
        model_config=ModelConfig(model="bench/model", dtype=torch.bfloat16,
                                 num_hidden_layers=layers, num_key_value_heads=8, head_dim=128),
        cache_config=CacheConfig(block_size=BS),
        scheduler_config=SchedulerConfig(max_num_batched_tokens=1 << 16),
        kv_transfer_config=KVTransferConfig(
            kv_connector="KvpoolConnector", kv_connector_module_path="kvpool.integrations.vllm",
            kv_role="kv_both",
            kv_connector_extra_config={"socket": socket, "timeout_ms": 30000,
                                       "layerwise": layerwise, "load_async_min_tokens": 0}))


def first_step(cfg, tokens, num_blocks):
    """A fresh instance and the scheduler output of its first step (loads only)."""
    from vllm.v1.engine.core import EngineCore
    from vllm.v1.request import Request

    e = EngineCore(cfg, num_blocks)
    e.runner.verify = False
    e.add_request(Request("r", tokens, max_tokens=1))
    so = e.scheduler.schedule()
    loads = so.kv_connector_metadata.loads
    assert sum(len(t.block_ids) for t in loads) == len(tokens) // BS, "prefix not in kvpool"
    assert not so.kv_connector_metadata.saves
    return e, so


def compute_only(engine, so, c, reps):
    """Median forward time of the same step with no load planned."""
    from kvpool.integrations.vllm import KvpoolConnectorMetadata

    bare = copy.copy(so)
    bare.kv_connector_metadata = KvpoolConnectorMetadata()
    runner = engine.runner
    runner.layer_compute_s = c
    times = []
    for _ in range(reps + 1):
        runner.execute_model(bare)
        times.append(runner.forward_s)
    return statistics.median(times[1:])


def timed_forwards(engine, so, c, reps):
    """reps forward passes of the same step with compute c per layer:
    (forward times, per-layer load job times)."""
    runner = engine.runner
    w = runner.connector._worker_side
    jobs = []
    orig = w._read

    def read(lane, unit, batch):
        t0 = time.perf_counter()
        r = orig(lane, unit, batch)
        jobs.append(time.perf_counter() - t0)
        return r

    w._read = read
    runner.layer_compute_s = c
    times = []
    for _ in range(reps + 1):  # the first run warms buffers up
        out = runner.execute_model(so)
        assert not out.kv_connector_output.invalid_block_ids
        times.append(runner.forward_s)
    w._read = orig
    n = len(runner.layer_names)
    return times[1:], jobs[n:]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--blocks", type=int, default=64)
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    from vllm.v1.engine.core import EngineCore
    from vllm.v1.request import Request

    L = args.layers
    tokens = [1000 + (7 * i) % 5003 for i in range(args.blocks * BS + 1)]
    num_blocks = args.blocks + 8
    node = Node()
    try:
        for layerwise in (True, False):
            a = EngineCore(config(node.socket, L, layerwise), num_blocks)
            a.run([Request("a", tokens, max_tokens=1)])
            a.shutdown()
        log("stored %d blocks x %d layers" % (args.blocks, L))
        lw, so = first_step(config(node.socket, L, True), tokens, num_blocks)
        t0, jobs = timed_forwards(lw, so, 0.0, args.reps)
        l_s = statistics.median(jobs)
        log("l = %.3f ms per layer (forward with c=0: %.1f ms)"
            % (l_s * 1e3, statistics.median(t0) * 1e3))
        metrics = [("vllm_layerwise_layers", L), ("vllm_layerwise_l_ms", l_s * 1e3),
                   ("vllm_layerwise_c0_forward_ms", statistics.median(t0) * 1e3)]
        whole, so_whole = first_step(config(node.socket, L, False), tokens, num_blocks)
        for name, c_sleep in (("short", l_s / 2), ("long", 2 * l_s)):
            c = compute_only(lw, so, c_sleep, args.reps) / L
            times, _ = timed_forwards(lw, so, c_sleep, args.reps)
            fwd = statistics.median(times)
            serial = L * (c + l_s)
            overlap = max(L * c, L * l_s) + max(c, l_s)
            wtimes, _ = timed_forwards(whole, so_whole, c_sleep, args.reps)
            runs = " ".join("%.1f" % (x * 1e3) for x in times)
            log("c_sleep %.3f ms, c=%s %.3f ms: forward %.1f ms (runs %s), L*(c+l) %.1f ms, "
                "overlap bound %.1f ms, whole-block forward %.1f ms"
                % (c_sleep * 1e3, name, c * 1e3, fwd * 1e3, runs, serial * 1e3, overlap * 1e3,
                   statistics.median(wtimes) * 1e3))
            p = "vllm_layerwise_c%s_" % name
            metrics += [(p + "c_sleep_ms", c_sleep * 1e3), (p + "c_ms", c * 1e3),
                        (p + "forward_ms", fwd * 1e3),
                        (p + "serial_ms", serial * 1e3), (p + "overlap_bound_ms", overlap * 1e3),
                        (p + "ratio_forward_to_serial", fwd / serial),
                        (p + "ratio_forward_to_overlap_bound", fwd / overlap),
                        (p + "whole_block_forward_ms", statistics.median(wtimes) * 1e3)]
        lw.shutdown()
        whole.shutdown()
    finally:
        node.stop()
    for name, value in metrics:
        print("metric %s %s" % (name, ("%.3f" % value) if isinstance(value, float) else value))


if __name__ == "__main__":
    main()
