"""Stand-in of vllm/v1/executor/multiproc_executor.py: one process per rank.

The SchedulerOutput (with the connector metadata) is pickled to every worker
process, as vLLM's RPC does, so metadata that does not pickle fails here.
"""

import copy
import multiprocessing
import traceback


def _worker_main(conn, vllm_config, kv_cache_config, layout):
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    try:
        runner = GPUModelRunner(vllm_config, kv_cache_config, layout)
        conn.send(("ready", None))
        while True:
            cmd, arg = conn.recv()
            if cmd == "step":
                conn.send(("ok", runner.execute_model(arg)))
            elif cmd == "call":
                conn.send(("ok", getattr(runner, arg[0])(*arg[1])))
            elif cmd == "stop":
                runner.shutdown()
                conn.send(("ok", None))
                return
    except Exception:
        conn.send(("error", traceback.format_exc()))


class _Remote:
    def __init__(self, ctx, vllm_config, kv_cache_config, layout):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child, vllm_config, kv_cache_config,
                                                           layout), daemon=True)
        self.proc.start()
        self._expect("ready")

    def _expect(self, what="ok"):
        if not self.conn.poll(120):
            raise RuntimeError("worker process did not answer")
        kind, value = self.conn.recv()
        if kind == "error":
            raise RuntimeError("worker process failed:\n" + value)
        assert kind == what, kind
        return value

    def execute_model(self, so):
        self.conn.send(("step", so))
        return self._expect()

    def call(self, method, *args):
        self.conn.send(("call", (method, args)))
        return self._expect()

    def shutdown(self):
        if self.proc.is_alive():
            self.conn.send(("stop", None))
            self._expect()
        self.proc.join(30)


class MultiprocExecutor:
    def __init__(self, vllm_config, kv_cache_config, layout):
        ctx = multiprocessing.get_context("spawn")
        self.workers = []
        try:
            for rank in range(vllm_config.parallel_config.world_size):
                cfg = copy.deepcopy(vllm_config)
                cfg.parallel_config.rank = rank
                self.workers.append(_Remote(ctx, cfg, kv_cache_config, layout))
        except Exception:
            self.shutdown()
            raise

    def execute_model(self, so):
        return [w.execute_model(so) for w in self.workers]

    def shutdown(self):
        for w in self.workers:
            w.shutdown()
