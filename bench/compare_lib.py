#!/usr/bin/env python3
"""Helpers for bench/compare.sh (Python 3 standard library only).

Subcommands:
  freeport                      print a free TCP port on 127.0.0.1
  redis-fill SIZE KEYS          write RESP "SET key:%012d <SIZE bytes>" for
                                keys 0..KEYS-1 to stdout (for redis-cli --pipe);
                                the key names are the ones redis-benchmark -r uses
  redis-csv TAGS_JSON           read redis-benchmark --csv output on stdin, print
                                one JSON result line per test row, merged with TAGS
  redis-next-n RPS SECONDS MIN  requests for a run of about SECONDS at RPS
  json-get PATH                 read JSON on stdin, print the value at a dotted
                                PATH (e.g. dram.index_bytes_per_entry)
  summarize RESULTS.jsonl       print the comparison table and the metric lines
"""
import csv
import json
import statistics
import sys


def freeport():
    import socket
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        print(s.getsockname()[1])


def redis_fill(size, keys):
    out = sys.stdout.buffer
    value = b"x" * size
    header = b"$%d\r\n" % size
    for i in range(keys):
        key = b"key:%012d" % i
        out.write(b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n" % (len(key), key))
        out.write(header)
        out.write(value)
        out.write(b"\r\n")
    out.flush()


def redis_csv(tags_json):
    tags = json.loads(tags_json)
    rows = list(csv.reader(sys.stdin))
    if not rows or rows[0][:2] != ["test", "rps"]:
        sys.exit("redis-csv: unexpected redis-benchmark output: %r" % rows[:2])
    head = rows[0]
    for row in rows[1:]:
        if not row:
            continue
        r = dict(zip(head, row))
        rps = float(r["rps"])
        size = int(tags["value_size"])
        line = dict(tags)
        line.update({
            "op": r["test"].lower(),
            "ops_per_s": rps,
            "bytes_per_s": rps * size,
            "gbps": rps * size / 1e9,
            "p50_us": float(r["p50_latency_ms"]) * 1000,
            "p99_us": float(r["p99_latency_ms"]) * 1000,
            "errors": 0,
            "misses": 0,
        })
        print(json.dumps(line))


def json_get(path):
    v = json.load(sys.stdin)
    for part in path.split("."):
        v = v[part]
    print(v)


def _median(rows, field):
    vals = [r[field] for r in rows if r.get(field) is not None]
    return statistics.median(vals) if vals else float("nan")


def _fmt_size(n):
    for shift, unit in ((30, "GiB"), (20, "MiB"), (10, "KiB")):
        if n >= (1 << shift) and n % (1 << shift) == 0:
            return "%d%s" % (n >> shift, unit)
    return "%dB" % n


def _fmt_us(us):
    if us != us:
        return "-"
    return "%.2fms" % (us / 1000) if us >= 1000 else "%.1fus" % us


def summarize(path):
    rows = [json.loads(l) for l in open(path) if l.strip()]
    extra = {}
    groups = {}
    for r in rows:
        if r.get("system") == "node":
            extra.update(r)
            continue
        key = (r["system"], r["op"], int(r["value_size"]), r.get("config", ""))
        groups.setdefault(key, []).append(r)

    med = {}
    for key, rs in groups.items():
        med[key] = {f: _median(rs, f) for f in ("gbps", "ops_per_s", "p50_us", "p99_us")}
        med[key]["reps"] = len(rs)
        med[key]["errors"] = sum(int(r.get("errors", 0)) for r in rs)
        med[key]["misses"] = sum(int(r.get("misses", 0)) for r in rs)

    # Redis's best configuration per (op, size), by median throughput.
    best = {}
    for (system, op, size, config), m in med.items():
        k = (system, op, size)
        if system == "redis" and (k in best and best[k][1]["ops_per_s"] >= m["ops_per_s"]):
            continue
        best[k] = (config, m)

    order = {"memcpy": 0, "kvpool": 1, "redis": 2}
    op_order = {"memcpy": 0, "get": 1, "zc-get": 2, "put": 3, "set": 4, "exists": 5}
    print()
    print("%-7s %-7s %-7s %-22s %9s %12s %10s %10s %4s %7s %7s" %
          ("system", "op", "value", "config", "GB/s", "ops/s", "p50", "p99", "reps", "errors", "misses"))
    for (system, op, size), (config, m) in sorted(
            best.items(), key=lambda kv: (kv[0][2], order.get(kv[0][0], 9), op_order.get(kv[0][1], 9))):
        all_cfgs = sorted(c for (s, o, z, c) in med if (s, o, z) == (system, op, size))
        cfg_note = config + (" (best of %d)" % len(all_cfgs) if len(all_cfgs) > 1 else "")
        print("%-7s %-7s %-7s %-22s %9.2f %12.0f %10s %10s %4d %7d %7d" %
              (system, op, _fmt_size(size), cfg_note, m["gbps"], m["ops_per_s"], _fmt_us(m["p50_us"]),
               _fmt_us(m["p99_us"]), m["reps"], m["errors"], m["misses"]))
    print("(medians over repetitions; GB/s = 1e9 bytes/s; kvpool p50/p99 are per batch call, "
          "Redis p50/p99 per request, memcpy per block)")
    print()

    mb = 1 << 20

    def gbps(system, op, size=mb):
        k = (system, op, size)
        return best[k][1]["gbps"] if k in best else float("nan")

    def ratio(a, b):
        return a / b if b and b == b and a == a else float("nan")

    memcpy_1m = gbps("memcpy", "memcpy")
    metrics = [
        ("local_get_1m_vs_memcpy", ratio(gbps("kvpool", "get"), memcpy_1m)),
        ("local_put_1m_vs_memcpy", ratio(gbps("kvpool", "put"), memcpy_1m)),
        ("local_zcget_1m_vs_memcpy", ratio(gbps("kvpool", "zc-get"), memcpy_1m)),
        ("local_get_1m_vs_redis", ratio(gbps("kvpool", "get"), gbps("redis", "get"))),
        ("local_put_1m_vs_redis", ratio(gbps("kvpool", "put"), gbps("redis", "set"))),
    ]
    exists = [k for k in best if k[0] == "kvpool" and k[1] == "exists"]
    keys_per_s = best[exists[0]][1]["ops_per_s"] if exists else float("nan")
    errors = sum(m["errors"] for (s, _, _, _), m in med.items() if s == "kvpool")
    lines = [("%.3f" % v) for _, v in metrics]
    out = list(zip([n for n, _ in metrics], lines))
    out += [
        ("local_exists_keys_per_s", "%.0f" % keys_per_s),
        ("index_bytes_per_entry", "%.2f" % float(extra.get("index_bytes_per_entry", "nan"))),
        ("memcpy_1m_gbps", "%.2f" % memcpy_1m),
        ("local_get_1m_gbps", "%.2f" % gbps("kvpool", "get")),
        ("local_put_1m_gbps", "%.2f" % gbps("kvpool", "put")),
        ("local_zcget_1m_gbps", "%.2f" % gbps("kvpool", "zc-get")),
        ("redis_get_1m_gbps", "%.2f" % gbps("redis", "get")),
        ("redis_set_1m_gbps", "%.2f" % gbps("redis", "set")),
        ("local_errors", str(errors)),
    ]
    for name, value in out:
        print("metric %s %s" % (name, value))
    return 1 if errors else 0


def main(argv):
    if len(argv) < 2:
        sys.exit(__doc__)
    cmd, args = argv[1], argv[2:]
    if cmd == "freeport":
        freeport()
    elif cmd == "redis-fill":
        redis_fill(int(args[0]), int(args[1]))
    elif cmd == "redis-csv":
        redis_csv(args[0])
    elif cmd == "redis-next-n":
        rps, secs, lo = float(args[0]), float(args[1]), int(args[2])
        print(max(lo, int(rps * secs)))
    elif cmd == "json-get":
        json_get(args[0])
    elif cmd == "summarize":
        return summarize(args[0])
    else:
        sys.exit("unknown subcommand %r\n%s" % (cmd, __doc__))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
