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
  duration-ms TEXT              a kvpool-bench duration (2s, 500ms) in milliseconds
  size-bytes TEXT               a kvpool-node size (3GiB, 64MiB, 4096) in bytes
  thread-cpu PID                print {thread name: CPU seconds} of a process
  cpu-per-gib BEFORE AFTER BENCH_OUT   one "node" results line: CPU seconds
                                per GiB put by thread, between two thread-cpu
                                samples around the put run in BENCH_OUT
SSD mode (bench/compare_ssd.sh):
  sample URL INTERVAL OUT NAME...   append {"t": monotonic s, NAME: value...} to OUT
                                every INTERVAL s from a Prometheus /metrics URL
                                until killed
  write-rates SAMPLES REPS FLUSH_THREADS   split the SSD write phase in SAMPLES
                                into REPS equal byte windows; print one JSON
                                result per window (SSD write GB/s and put GB/s)
                                and one with the region writes' latency and how
                                busy the FLUSH_THREADS flush slots were
  fio-gbps read|write           read fio --output-format=json on stdin, print GB/s
  metric URL NAME               print one unlabelled series from /metrics (0 if absent)
  log-recovery-s                read a node log on stdin, print seconds from the
                                SSD file's open to "ssd: started" (-1 if absent)
  tag-get THREADS REP P0 P1 H0 H1   tag kvpool-bench --json lines on stdin as
                                cold SSD gets, with promotions (P1-P0) and node
                                hits (H1-H0) during the run
  show-get                      one human-readable line per tagged get result
  ssd-summarize RESULTS.jsonl   print the SSD table and metric lines
Remote mode (bench/compare_remote.sh):
  scrape URL                    print every series of a /metrics URL as one JSON object
  iperf-json REP                read iperf3 -J on stdin, print one JSON result line
  remote-run PHASE REP A_URL B_URL A_PID B_PID -- CMD...   run CMD (a kvpool-bench
                                --json run), print its result lines tagged with
                                PHASE/REP and what the nodes counted meanwhile
                                (remote fetches, hits, lookups) and the CPU
                                seconds of node A, node B and the client
  remote-summarize RESULTS.jsonl   print the remote table and metric lines
Builds mode (bench/compare_builds.sh):
  shapes-summarize RESULTS.jsonl POLICY   the shapes tables and metric lines
  builds-summarize METRICS.tsv TOLERANCE   read "ROUND\tA|B\tNAME\tVALUE" lines,
                                print per metric both builds' medians, B/A, the
                                median per-round ratio and the rounds B did
                                better in; exit 1 when a kvpool metric is worse
                                in B by more than TOLERANCE percent (medians)
"""
import csv
import json
import math
import os
import re
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


def _load_results(path):
    """The rows of a results.jsonl, and the "node" rows merged into one dict."""
    rows = [json.loads(l) for l in open(path) if l.strip()]
    node = {}
    for r in rows:
        if r.get("system") == "node":
            node.update(r)
    return rows, node


def duration_ms(text):
    """A kvpool-bench duration ("2s", "500ms", "2m", "250") in milliseconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*", text)
    if not m:
        raise SystemExit("not a duration: %r" % text)
    scale = {"ms": 1, None: 1, "s": 1000, "m": 60000, "h": 3600000}[m.group(2)]
    return int(float(m.group(1)) * scale)


def size_bytes(text):
    """A size as kvpool-node reads it ("3GiB", "64MiB", "4096") in bytes."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMGT]i?B?|B)?\s*", text)
    if not m:
        raise SystemExit("not a size: %r" % text)
    unit = (m.group(2) or "B").rstrip("B").rstrip("i")
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30, "T": 40}[unit]


def thread_cpu(pid):
    """{thread name: CPU seconds} of a process's threads (user + system),
    summed over threads of one name."""
    ticks = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir("/proc/%d/task" % pid):
        try:
            stat = open("/proc/%d/task/%s/stat" % (pid, tid)).read()
        except OSError:  # the thread ended meanwhile
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / ticks
    return out


def cpu_per_gib(before_path, after_path, bench_out_path):
    """A "node" results row: CPU seconds per GiB put, by thread name, over
    the put run whose kvpool-bench JSON is in bench_out_path."""
    before = json.load(open(before_path))
    after = json.load(open(after_path))
    runs = [json.loads(l) for l in open(bench_out_path) if l.strip()]
    put_bytes = sum(r["bytes_per_s"] * r["duration_s"] for r in runs)
    gib = put_bytes / (1 << 30)
    per = {name: (after[name] - before.get(name, 0.0)) / gib
           for name in after if gib > 0 and after[name] - before.get(name, 0.0) > 0}
    return {"system": "node", "put_cpu_s_per_gib": per, "put_cpu_gib": gib}


def summarize(path):
    rows = [json.loads(l) for l in open(path) if l.strip()]
    extra = {}
    groups = {}
    phased = {}  # phase -> rows (the responsiveness runs)
    for r in rows:
        if r.get("system") == "node":
            extra.update(r)
            continue
        if r.get("phase"):
            phased.setdefault(r["phase"], []).append(r)
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
    # Responsiveness: 4 KiB gets alone and under a 4 MiB put stream (medians
    # of the runs' p50/p99, per call of one key).
    if "get-alone" in phased and "get-under-put" in phased:
        alone, under = phased["get-alone"], phased["get-under-put"]
        p99_alone, p99_under = _median(alone, "p99_us"), _median(under, "p99_us")
        print("responsiveness: 4 KiB get (batch 1) p50/p99 alone %s/%s, under a 4 MiB put stream "
              "%s/%s (%d runs each; misses alone %d, under put %d)" % (
                  _fmt_us(_median(alone, "p50_us")), _fmt_us(p99_alone),
                  _fmt_us(_median(under, "p50_us")), _fmt_us(p99_under), len(under),
                  sum(int(r.get("misses", 0)) for r in alone),
                  sum(int(r.get("misses", 0)) for r in under)))
        errors += sum(int(r.get("errors", 0)) for r in alone + under)
        out += [
            ("local_get_p50_alone_us", "%.1f" % _median(alone, "p50_us")),
            ("local_get_p99_alone_us", "%.1f" % p99_alone),
            ("local_get_p50_under_put_us", "%.1f" % _median(under, "p50_us")),
            ("local_get_p99_under_put_us", "%.1f" % p99_under),
            ("local_get_p99_under_put_vs_alone", "%.2f" % ratio(p99_under, p99_alone)),
        ]
    if "first-fill" in phased:
        fills = {int(r["value_size"]): float(r["gbps"]) for r in phased["first-fill"]}
        if mb in fills:
            out.append(("local_first_fill_1m_gbps", "%.2f" % fills[mb]))
            out.append(("local_first_fill_1m_vs_memcpy", "%.3f" % ratio(fills[mb], memcpy_1m)))
    per = extra.get("put_cpu_s_per_gib")
    if per:
        print("node CPU seconds per GiB put (4 MiB values, %.1f GiB): %s" % (
            extra.get("put_cpu_gib", 0), ", ".join(
                "%s %.3f" % (n, v) for n, v in sorted(per.items(), key=lambda kv: -kv[1]))))
        out.append(("local_put_cpu_s_per_gib", "%.3f" % sum(per.values())))
        for n, v in sorted(per.items()):
            out.append(("local_put_cpu_%s_s_per_gib" % re.sub(r"[^a-z0-9]+", "_", n.lower()).strip("_"),
                        "%.3f" % v))
    for name, value in out:
        print("metric %s %s" % (name, value))
    return 1 if errors else 0


# ---- SSD mode ------------------------------------------------------------------

def _scrape_all(url):
    """Every sample of a Prometheus text page: {name with labels: value}."""
    import urllib.request
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        name, _, value = line.rpartition(" ")
        try:
            out[name] = float(value)
        except ValueError:
            pass
    return out


def _scrape(url, names):
    return {k: v for k, v in _scrape_all(url).items() if k in names}


def sample(url, interval, out_path, names):
    import signal
    import time
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    names = set(names)
    with open(out_path, "a") as out:
        while True:
            t = time.monotonic()
            try:
                row = _scrape(url, names)
            except Exception:  # the node may be busy; try again next tick
                row = None
            if row is not None:
                row["t"] = t
                out.write(json.dumps(row) + "\n")
                out.flush()
            time.sleep(max(0.0, interval - (time.monotonic() - t)))


def _at_bytes(samples, field, target):
    """Time (linear interpolation) at which samples[field] reached target."""
    prev = None
    for s in samples:
        if s[field] >= target:
            if prev is None or s[field] == prev[field]:
                return s["t"]
            f = (target - prev[field]) / (s[field] - prev[field])
            return prev["t"] + f * (s["t"] - prev["t"])
        prev = s
    return samples[-1]["t"]


def write_rates(path, reps, flush_threads):
    w, b = "kvpool_ssd_write_bytes_total", "kvpool_bytes_written_total"
    rows = [json.loads(l) for l in open(path) if l.strip()]
    rows = [r for r in rows if w in r and b in r]
    if len(rows) < 3:
        sys.exit("write-rates: too few samples in %s" % path)
    first = next((r for r in rows if r[w] > 0), None)
    if first is None:
        sys.exit("write-rates: the SSD tier wrote nothing")
    # The phase ends at the last sample before the final flush (that one only
    # writes the part-filled region): when puts stopped growing.
    last_put = max(r[b] for r in rows)
    end = next(r for r in rows if r[b] >= last_put)
    w0, w1 = first[w], end[w]
    if w1 <= w0:
        sys.exit("write-rates: no SSD writes while the puts ran")
    span = [r for r in rows if first["t"] <= r["t"] <= end["t"]]
    for i in range(reps):
        lo = w0 + (w1 - w0) * i / reps
        hi = w0 + (w1 - w0) * (i + 1) / reps
        t_lo, t_hi = _at_bytes(span, w, lo), _at_bytes(span, w, hi)
        dt = max(t_hi - t_lo, 1e-9)
        # Puts over the same window (the client is throttled to the SSD).
        pb = [r for r in span if t_lo <= r["t"] <= t_hi]
        put_gbps = ((pb[-1][b] - pb[0][b]) / max(pb[-1]["t"] - pb[0]["t"], 1e-9) / 1e9
                    if len(pb) >= 2 else float("nan"))
        print(json.dumps({"system": "kvpool", "op": "ssd-write", "rep": i,
                          "gbps": (hi - lo) / dt / 1e9, "bytes": hi - lo, "seconds": dt}))
        print(json.dumps({"system": "kvpool", "op": "put-dram-full", "rep": i, "gbps": put_gbps}))
    # Where the write time goes: the device's time per region write, and the
    # share of the phase the flush threads spent in writes. Near 1: the disk
    # (at kvpool's depth) is the limit; well below: the demotion path is.
    ls, lc = "kvpool_ssd_write_latency_seconds_sum", "kvpool_ssd_write_latency_seconds_count"
    if ls in first and lc in first:
        dt = max(end["t"] - first["t"], 1e-9)
        writes = end[lc] - first[lc]
        busy = end[ls] - first[ls]
        print(json.dumps({"system": "node", "write_phase_s": dt,
                          "region_writes": writes,
                          "region_write_ms": 1000 * busy / writes if writes else float("nan"),
                          "region_write_gbps": (end[w] - first[w]) / busy / 1e9 if busy else float("nan"),
                          "flush_busy": busy / (dt * flush_threads)}))


def fio_gbps(rw):
    j = json.load(sys.stdin)
    bw = sum(job[rw]["bw_bytes"] for job in j["jobs"])
    print("%.4f" % (bw / 1e9))


def metric(url, name):
    print("%.0f" % _scrape(url, {name}).get(name, 0.0))


def log_recovery_s():
    import datetime
    opened = started = None
    for line in sys.stdin:
        parts = line.split(" ", 2)
        if len(parts) < 3:
            continue
        try:
            t = datetime.datetime.strptime(parts[1], "%Y-%m-%dT%H:%M:%S.%fZ").timestamp()
        except ValueError:
            continue
        if opened is None and "ssd:" in line and "opened with" in line:
            opened = t
        if "ssd: started with" in line:
            started = t
    print("%.3f" % (started - opened) if opened is not None and started is not None else "-1")


def tag_get(threads, rep, p0, p1, h0, h1):
    promoted, hits = float(p1) - float(p0), float(h1) - float(h0)
    for l in sys.stdin:
        if not l.strip():
            continue
        r = json.loads(l)
        r.update({"system": "kvpool", "op": "cold-get", "threads": int(threads), "rep": int(rep),
                  "promotions": promoted, "node_hits": hits,
                  "ssd_share": promoted / hits if hits > 0 else float("nan")})
        print(json.dumps(r))


def show_get():
    for l in sys.stdin:
        r = json.loads(l)
        print("  cold get %d thread(s) rep %d: %6.3f GB/s  p50 %8.1fus p99 %8.1fus  misses %d errors %d"
              "  from SSD: %.1f%% of hits" % (r["threads"], r["rep"], r["gbps"], r["p50_us"], r["p99_us"],
                                             r["misses"], r["errors"], 100 * r["ssd_share"]))


def ssd_summarize(path):
    rows, node = _load_results(path)
    nan = float("nan")

    def med(op, field="gbps", **match):
        vals = [r[field] for r in rows if r.get("op") == op and r.get(field) is not None
                and all(r.get(k) == v for k, v in match.items())]
        vals = [v for v in vals if v == v]
        return statistics.median(vals) if vals else nan

    def count(op, **match):
        return sum(1 for r in rows if r.get("op") == op and all(r.get(k) == v for k, v in match.items()))

    fio_w, fio_r = med("write", system="fio"), med("read", system="fio")
    fio_r32 = med("read-qd32", system="fio")
    qd_w = next((r["qd"] for r in rows if r.get("system") == "fio" and r["op"] == "write"), 0)
    qd_r = next((r["qd"] for r in rows if r.get("system") == "fio" and r["op"] == "read"), 0)
    kv_w, kv_put = med("ssd-write"), med("put-dram-full")
    get1, get2 = med("cold-get", threads=1), med("cold-get", threads=2)
    best_t = 2 if (get2 == get2 and (get1 != get1 or get2 >= get1)) else 1
    kv_r = get2 if best_t == 2 else get1
    # Paired ratios: each cold-get run over the fio read just before it.
    fio_pair = {(r["threads"], r["rep"]): r["gbps"] for r in rows if r.get("op") == "read-paired"}
    pair_ratios = [r["gbps"] / fio_pair[(r["threads"], r["rep"])] for r in rows
                   if r.get("op") == "cold-get" and r.get("threads") == best_t
                   and fio_pair.get((r["threads"], r["rep"]))]
    read_ratio_paired = statistics.median(pair_ratios) if pair_ratios else nan
    fio_r_paired = med("read-paired", system="fio", threads=best_t)
    share = med("cold-get", "ssd_share", threads=best_t)
    gib = node.get("ssd_used_bytes", 0) / float(1 << 30)
    scan_s, ckpt_s = med("recovery-scan", "seconds"), med("recovery-checkpoint", "seconds")
    scan_log, ckpt_log = med("recovery-scan", "log_seconds"), med("recovery-checkpoint", "log_seconds")
    stop_s = med("recovery-checkpoint", "stop_seconds")
    recov_ok = all(r.get("recovery") == ("scan" if r["op"] == "recovery-scan" else "checkpoint")
                   and r.get("entries") == node.get("ssd_entries")
                   for r in rows if r.get("op", "").startswith("recovery-"))
    errors = sum(int(r.get("errors", 0)) for r in rows if r.get("op") == "cold-get")
    misses = sum(int(r.get("misses", 0)) for r in rows if r.get("op") == "cold-get")

    def ratio(a, b):
        return a / b if b and b == b and a == a else nan

    print()
    print("%-7s %-26s %9s %5s %s" % ("system", "measure", "value", "reps", "notes"))
    print("%-7s %-26s %9.3f %5d %s" % ("fio", "seq write GB/s", fio_w, count("write", system="fio"),
                                       "1 MiB, O_DIRECT, io_uring, iodepth %d" % qd_w))
    print("%-7s %-26s %9.3f %5d %s" % ("fio", "seq read GB/s", fio_r, count("read", system="fio"),
                                       "1 MiB, O_DIRECT, io_uring, iodepth %d" % qd_r))
    print("%-7s %-26s %9.3f %5d %s" % ("fio", "seq read GB/s, paired", fio_r_paired,
                                       count("read-paired", system="fio", threads=best_t),
                                       "the same, each just before a %d-thread cold-get run" % best_t))
    print("%-7s %-26s %9.3f %5d %s" % ("fio", "seq read GB/s, qd 32", fio_r32, count("read-qd32", system="fio"),
                                       "reference: the device with more reads in flight"))
    print("%-7s %-26s %9.3f %5d %s" % ("kvpool", "SSD write GB/s", kv_w, count("ssd-write"),
                                       "region writes while puts demote (equal byte windows)"))
    print("%-7s %-26s %9.3f %5d %s" % ("kvpool", "put GB/s, DRAM full", kv_put, count("put-dram-full"),
                                       "client puts in the same windows"))
    print("%-7s %-26s %9.3f %5d %s" % ("kvpool", "cold get GB/s, 1 thread", get1, count("cold-get", threads=1),
                                       "batch 16, 1 MiB values only on SSD"))
    print("%-7s %-26s %9.3f %5d %s" % ("kvpool", "cold get GB/s, 2 threads", get2, count("cold-get", threads=2),
                                       "batch 16; %.0f%% of hits promoted from SSD" % (100 * share)))
    print("%-7s %-26s %9.3f %5d %s" % ("kvpool", "restart after kill, s", scan_s, count("recovery-scan"),
                                       "until /readyz; scan itself %.3f s (log); %.2f GiB on SSD" % (scan_log, gib)))
    print("%-7s %-26s %9.3f %5d %s" % ("kvpool", "restart after stop, s", ckpt_s, count("recovery-checkpoint"),
                                       "until /readyz; checkpoint load %.3f s (log); clean stop took %.2f s"
                                       % (ckpt_log, stop_s)))
    print("(medians over repetitions; GB/s = 1e9 bytes/s)")
    if "flush_busy" in node:
        print("write phase: %d region writes in %.2f s, %.1f ms each (%.2f GB/s per write); flush threads "
              "busy %.0f%% of the time" % (node["region_writes"], node["write_phase_s"], node["region_write_ms"],
                                          node["region_write_gbps"],
                                          100 * node["flush_busy"]))
    if not recov_ok:
        print("WARNING: a restart did not recover by the expected method or lost entries (see results)")
    print()
    out = [
        ("ssd_cold_read_vs_fio", "%.3f" % (read_ratio_paired if read_ratio_paired == read_ratio_paired
                                            else ratio(kv_r, fio_r))),
        ("ssd_cold_read_vs_fio_unpaired", "%.3f" % ratio(kv_r, fio_r)),
        ("ssd_write_vs_fio", "%.3f" % ratio(kv_w, fio_w)),
        ("ssd_index_bytes_per_entry", "%.2f" % float(node.get("index_bytes_per_entry", nan))),
        ("ssd_recovery_s_per_gib", "%.3f" % ratio(scan_s, gib)),
        ("ssd_checkpoint_load_s_per_gib", "%.3f" % ratio(ckpt_s, gib)),
        ("ssd_cold_read_gbps", "%.3f" % kv_r),
        ("ssd_cold_read_threads", "%d" % best_t),
        ("ssd_cold_read_ssd_share", "%.3f" % share),
        ("ssd_write_gbps", "%.3f" % kv_w),
        ("ssd_put_dram_full_gbps", "%.3f" % kv_put),
        ("fio_read_gbps", "%.3f" % fio_r),
        ("fio_write_gbps", "%.3f" % fio_w),
        ("fio_read_paired_gbps", "%.3f" % fio_r_paired),
        ("fio_read_qd32_gbps", "%.3f" % fio_r32),
        ("fio_read_iodepth", "%d" % qd_r),
        ("fio_write_iodepth", "%d" % qd_w),
        ("ssd_recovery_scan_log_s_per_gib", "%.3f" % ratio(scan_log, gib)),
        ("ssd_checkpoint_load_log_s_per_gib", "%.3f" % ratio(ckpt_log, gib)),
        ("ssd_write_region_ms", "%.2f" % float(node.get("region_write_ms", nan))),
        ("ssd_write_flush_busy", "%.3f" % float(node.get("flush_busy", nan))),
        ("ssd_demotions_gathered_share", "%.3f" % ratio(node.get("lent_gather", nan), node.get("demotions", nan))),
        ("ssd_demotions_lent_share", "%.3f" % ratio(node.get("lent_gather", nan) + node.get("lent_copy", nan),
                                                    node.get("demotions", nan))),
        ("ssd_errors", "%d" % (errors + misses + (0 if recov_ok else 1))),
    ]
    for name, value in out:
        print("metric %s %s" % (name, value))
    return 1 if errors or misses or not recov_ok else 0


# ---- remote mode ---------------------------------------------------------------

def _proc_cpu_s(pid):
    import os
    with open("/proc/%d/stat" % int(pid)) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # utime, stime are fields 14 and 15 (1-based); fields[0] is field 3.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def iperf_json(rep):
    j = json.load(sys.stdin)
    end = j["end"]
    recv = end["sum_received"]["bits_per_second"] / 8
    cpu = end.get("cpu_utilization_percent", {})
    print(json.dumps({"system": "iperf3", "op": "tcp", "value_size": 1 << 20, "config": "1 stream, -l 1M",
                      "rep": int(rep), "gbps": recv / 1e9, "ops_per_s": recv / (1 << 20),
                      "cpu_sender_pct": cpu.get("host_total"), "cpu_receiver_pct": cpu.get("remote_total"),
                      "retransmits": end.get("sum_sent", {}).get("retransmits")}))


def remote_run(phase, rep, a_url, b_url, a_pid, b_pid, cmd):
    import resource
    import subprocess
    import time
    a0, b0 = _scrape_all(a_url + "/metrics"), _scrape_all(b_url + "/metrics")
    ca0, cb0 = _proc_cpu_s(a_pid), _proc_cpu_s(b_pid)
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    p = subprocess.run(cmd, stdout=subprocess.PIPE)
    wall = time.monotonic() - t0
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    ca1, cb1 = _proc_cpu_s(a_pid), _proc_cpu_s(b_pid)
    time.sleep(0.05)  # let the publisher's 5 ms flushes land before the counters are read
    a1, b1 = _scrape_all(a_url + "/metrics"), _scrape_all(b_url + "/metrics")
    if p.returncode not in (0, 3):
        sys.stderr.write("kvpool-bench failed (exit %d): %s\n" % (p.returncode, " ".join(cmd)))
        return p.returncode

    def d(m0, m1, name):
        return m1.get(name, 0.0) - m0.get(name, 0.0)

    lines = [l for l in p.stdout.decode().splitlines() if l.strip()]
    if len(lines) != 1:
        sys.stderr.write("remote-run: expected one result line, got %d\n" % len(lines))
        return 1
    client_cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    for l in lines:
        r = json.loads(l)
        hits = d(b0, b1, "kvpool_hits_total")
        rhits = d(b0, b1, "kvpool_remote_hits_total")
        r.update({
            "system": "kvpool", "phase": phase, "rep": int(rep), "config": "batch %d" % r["batch"],
            "b_hits": hits, "b_remote_hits": rhits, "b_remote_fetches": d(b0, b1, "kvpool_remote_fetches_total"),
            "b_remote_fetch_bytes": d(b0, b1, "kvpool_remote_fetch_bytes_total"),
            "b_remote_misses": d(b0, b1, "kvpool_remote_misses_total"),
            "b_remote_lookups": d(b0, b1, "kvpool_remote_lookups_total"),
            "b_dir_lookups": d(b0, b1, "kvpool_directory_lookups_total"),
            "a_dir_lookups": d(a0, a1, "kvpool_directory_lookups_total"),
            "b_evictions": d(b0, b1, "kvpool_dram_evictions_total"),
            "peer_errors": sum(d(b0, b1, k) + d(a0, a1, k) for k in set(b1) | set(a1)
                               if k.startswith("kvpool_peer_errors_total")),
            "placement_moved": d(b0, b1, "kvpool_placement_moved_total"),
            "placement_kept": d(b0, b1, "kvpool_placement_kept_total"),
            "remote_share": rhits / hits if hits > 0 else float("nan"),
            "wall_s": wall, "cpu_a_s": ca1 - ca0, "cpu_b_s": cb1 - cb0, "cpu_client_s": client_cpu,
        })
        print(json.dumps(r))
        sys.stdout.flush()
        sys.stderr.write("  %-9s rep %d: %7.3f GB/s %10.0f items/s  p50 %9.1fus p99 %9.1fus  remote %5.1f%% of B's hits"
                         "  cpu A %.2f B %.2f client %.2f s / %.2f s  errors %d misses %d\n" % (
                             phase, int(rep), r["gbps"], r["ops_per_s"], r["p50_us"], r["p99_us"],
                             100 * r["remote_share"] if r["remote_share"] == r["remote_share"] else -1,
                             r["cpu_a_s"], r["cpu_b_s"], client_cpu, wall, r["errors"], r["misses"]))
    return 0


def remote_summarize(path):
    rows, node = _load_results(path)
    nan = float("nan")

    def med(vals):
        vals = [v for v in vals if v is not None and v == v]
        return statistics.median(vals) if vals else nan

    def sel(**match):
        return [r for r in rows if all(r.get(k) == v for k, v in match.items())]

    def ratio(a, b):
        return a / b if b and b == b and a == a else nan

    mb = 1 << 20
    iperf = sel(system="iperf3")
    iperf_g = med([r["gbps"] for r in iperf])
    # Redis GET: the best configuration by median.
    redis_best, redis_cfg, redis_p50 = nan, "-", nan
    for cfg in sorted({r["config"] for r in sel(system="redis", op="get")}):
        rs = sel(system="redis", op="get", config=cfg)
        g = med([r["gbps"] for r in rs])
        if redis_best != redis_best or g > redis_best:
            redis_best, redis_cfg, redis_p50 = g, cfg, med([r["p50_us"] for r in rs])
    get = sel(system="kvpool", phase="get")
    get_g = med([r["gbps"] for r in get])
    share = med([r["remote_share"] for r in get])
    # A zero-copy get that reads only the values' stamps reports no GB/s of
    # its own: the bytes it made readable are items x value size.
    zc = sel(system="kvpool", phase="zc-get")
    zc_g = med([r["ops_per_s"] * r["value_size"] / 1e9 for r in zc])
    zc_share = med([r["remote_share"] for r in zc])
    local = sel(system="kvpool", phase="local-get")
    local_g = med([r["gbps"] for r in local])
    ex = sel(system="kvpool", phase="exists")
    ex_k = med([r["ops_per_s"] for r in ex])
    put = sel(system="kvpool", phase="put")
    put_g = med([r["gbps"] for r in put])

    def call_ms(r):
        return 1000 * r["duration_s"] / r["calls"] if r.get("calls") else nan

    def lookup_share(size):
        shares = []
        for rep in sorted({r["rep"] for r in sel(phase="ls-get", value_size=size)}):
            g = sel(phase="ls-get", value_size=size, rep=rep)
            e = sel(phase="ls-exists", value_size=size, rep=rep)
            if g and e:
                shares.append(ratio(call_ms(e[0]), call_ms(g[0])))
        g = sel(phase="ls-get", value_size=size)
        e = sel(phase="ls-exists", value_size=size)
        return (med(shares), med([call_ms(r) for r in e]), med([call_ms(r) for r in g]),
                med([r["remote_share"] for r in g]))

    ls64, ls64_e, ls64_g, ls64_rs = lookup_share(64 << 10)
    ls1m, ls1m_e, ls1m_g, ls1m_rs = lookup_share(mb)

    def cores(rs, field):
        # Over the timed run: node CPU outside it (the client's start) is near zero.
        return med([r[field] / r["duration_s"] for r in rs if r.get("duration_s")])

    def cpu_per_gb(rs, field):
        return med([r[field] / (r["b_remote_fetch_bytes"] / 1e9) for r in rs if r.get("b_remote_fetch_bytes")])

    kv_rows = [r for r in rows if r.get("system") == "kvpool"]
    errors = sum(int(r.get("errors", 0)) + int(r.get("mismatches", 0)) for r in kv_rows)
    misses = sum(int(r.get("misses", 0)) for r in kv_rows if r.get("phase") != "put")
    peer_errors = sum(r.get("peer_errors", 0) for r in kv_rows)

    print()
    print("%-8s %-30s %10s %5s %s" % ("system", "measure", "value", "reps", "notes"))

    def line(system, measure, value, reps, note, fmt="%10.3f"):
        print(("%-8s %-30s " + fmt + " %5s %s") % (system, measure, value, reps, note))

    line("iperf3", "TCP GB/s, 1 stream", iperf_g, len(iperf),
         "loopback, 1 MiB writes; CPU sender %.0f%% receiver %.0f%%" % (
             med([r.get("cpu_sender_pct") for r in iperf]), med([r.get("cpu_receiver_pct") for r in iperf])))
    line("redis", "GET GB/s, 1 MiB", redis_best, len(sel(system="redis", op="get", config=redis_cfg)),
         "best config: %s (p50 %.0fus per request)" % (redis_cfg, redis_p50))
    line("kvpool", "remote get GB/s, 1 MiB", get_g, len(get),
         "B reads keys held on A, batch 16; %.1f%% of B's hits were remote fetches; p50 %.1f ms per call"
         % (100 * share, med([r["p50_us"] for r in get]) / 1000))
    line("kvpool", "  CPU cores while getting", nan, len(get),
         "node A %.2f, node B %.2f, client %.2f (incl. its start) of %s; CPU s per GB fetched: A %.2f B %.2f client %.2f" % (
             cores(get, "cpu_a_s"), cores(get, "cpu_b_s"), cores(get, "cpu_client_s"), node.get("cpus", "?"),
             cpu_per_gb(get, "cpu_a_s"), cpu_per_gb(get, "cpu_b_s"), cpu_per_gb(get, "cpu_client_s")), fmt="%10s")
    line("kvpool", "zero-copy remote get GB/s", zc_g, len(zc),
         "acquire on B of keys held on A, read in place (stamps checked), batch 16; %.1f%% remote; "
         "CPU s per GB: A %.2f B %.2f" % (100 * zc_share, cpu_per_gb(zc, "cpu_a_s"), cpu_per_gb(zc, "cpu_b_s")))
    line("kvpool", "local get GB/s on A, 1 MiB", local_g, len(local),
         "reference: the same keys read on their holder (one copy, no network)")
    if put:
        line("kvpool", "put GB/s via B, placement home", put_g, len(put),
             "%.0f%% of puts stored on their home A" % (100 * med([
                 ratio(r["placement_moved"], r["placement_moved"] + r["placement_kept"]) for r in put])))
    else:
        line("kvpool", "remote put", nan, 0, node.get("put_note", "not measured"))
    line("kvpool", "remote exists keys/s", ex_k, len(ex),
         "batch 128, 4 KiB keys held only on A, asked through B; %.0f%% of lookups went to A over UCX, "
         "p50 %.0fus per call" % (100 * med([ratio(r["a_dir_lookups"], r["b_remote_lookups"]) for r in ex]),
                                 med([r["p50_us"] for r in ex])), fmt="%10.0f")
    line("kvpool", "lookup share, batch 64, 64 KiB", ls64, len(sel(phase="ls-get", value_size=64 << 10)),
         "exists call %.3f ms / get call %.3f ms (%.0f%% remote)" % (ls64_e, ls64_g, 100 * ls64_rs))
    line("kvpool", "lookup share, batch 64, 1 MiB", ls1m, len(sel(phase="ls-get", value_size=mb)),
         "exists call %.3f ms / get call %.3f ms (%.0f%% remote)" % (ls1m_e, ls1m_g, 100 * ls1m_rs))
    line("kvpool", "directory bytes per entry", node.get("directory_bytes_per_entry", nan), 1,
         "kvpool_directory_bytes / kvpool_directory_entries, A and B (%d entries)" % node.get("directory_entries", 0),
         fmt="%10.1f")
    line("kvpool", "directory ghost bytes per entry", node.get("directory_ghost_bytes_per_entry", nan), 1,
         "kvpool_directory_ghost_bytes / kvpool_directory_entries, A and B (--directory-ghost)",
         fmt="%10.1f")
    print("(medians over repetitions; GB/s = 1e9 bytes/s)")
    print()
    # Ratios pair each repetition's figures, taken back to back (the median
    # of the per-repetition ratios), so load that comes and goes on a
    # shared machine moves both sides of a ratio alike.
    def paired(num_rows, den_rows, gbps=lambda r: r["gbps"]):
        den = {r["rep"]: r["gbps"] for r in den_rows}
        return med([ratio(gbps(r), den.get(r["rep"], nan)) for r in num_rows])

    redis_rows = sel(system="redis", op="get", config=redis_cfg)
    zc_gbps = lambda r: r["ops_per_s"] * r["value_size"] / 1e9  # noqa: E731
    print("paired per repetition (rep: iperf3, redis %s, get, zero-copy get GB/s):" % redis_cfg)
    for rep in sorted({r["rep"] for r in iperf}):
        def one(rows, f=lambda r: r["gbps"]):
            v = [f(r) for r in rows if r["rep"] == rep]
            return v[0] if v else nan
        print("  rep %d: %.3f  %.3f  %.3f  %.3f" % (rep, one(iperf), one(redis_rows), one(get), one(zc, zc_gbps)))
    print()
    out = [
        ("remote_get_1m_vs_iperf", "%.3f" % paired(get, iperf)),
        ("remote_get_1m_vs_redis", "%.3f" % paired(get, redis_rows)),
        ("remote_exists_keys_per_s", "%.0f" % ex_k),
        ("lookup_share_of_batch_get", "%.3f" % ls64),
        ("lookup_share_of_batch_get_1m", "%.3f" % ls1m),
        ("directory_bytes_per_entry", "%.1f" % node.get("directory_bytes_per_entry", nan)),
        ("directory_ghost_bytes_per_entry", "%.1f" % node.get("directory_ghost_bytes_per_entry", nan)),
        ("remote_zc_get_1m_vs_iperf", "%.3f" % paired(zc, iperf, zc_gbps)),
        ("remote_get_1m_gbps", "%.3f" % get_g),
        ("remote_zc_get_1m_gbps", "%.3f" % zc_g),
        ("remote_get_remote_share", "%.3f" % share),
        ("iperf3_tcp_gbps", "%.3f" % iperf_g),
        ("redis_get_1m_gbps", "%.3f" % redis_best),
        ("local_get_1m_gbps_on_holder", "%.3f" % local_g),
        ("remote_put_1m_gbps", "%.3f" % put_g if put else "unsupported"),
        ("remote_errors", str(errors + misses + int(peer_errors))),
    ]
    for name, value in out:
        print("metric %s %s" % (name, value))
    return 1 if errors or misses or peer_errors else 0


# Metrics where less is better; every other judged metric is a rate or ratio
# where more is better.
_LOWER_BETTER = re.compile(
    r"(_per_entry|_errors|wrong_bytes|failed_items|_s_per_gib|_ms|_us|_vs_alone|_cost_.*|_write_per_hit_byte_.*|_share_of_.*)$")
# Metrics of the machine or of the other systems in the run (memcpy, Redis,
# iperf3, fio) and counts that describe the run: shown, never judged.
_NOT_JUDGED = re.compile(r"^(memcpy|redis|iperf3|fio)_|_threads$|^ssd_(entries|used_bytes)$|_share$|_total$")


def builds_summarize(path, tolerance):
    tol = float(tolerance) / 100.0
    vals = {}  # name -> label -> {round: value}
    for line in open(path):
        parts = line.rstrip("\n").split("\t")
        if len(parts) != 4:
            continue
        rnd, label, name, value = parts
        try:
            v = float(value)
        except ValueError:
            continue
        if math.isnan(v):
            continue
        vals.setdefault(name, {}).setdefault(label, {})[rnd] = v
    print("%-40s %12s %12s %7s %7s %8s  %s" % ("metric", "A median", "B median", "B/A", "paired", "B better", "verdict"))
    flagged = []
    for name in sorted(vals):
        a, b = vals[name].get("A", {}), vals[name].get("B", {})
        if not a or not b:
            continue
        ma, mb = statistics.median(a.values()), statistics.median(b.values())
        rounds = sorted(set(a) & set(b))
        lower = bool(_LOWER_BETTER.search(name))
        ratios = [b[r] / a[r] for r in rounds if a[r]]
        better = sum(1 for r in rounds if (b[r] < a[r] if lower else b[r] > a[r]))
        ratio = mb / ma if ma else (1.0 if mb == ma else math.inf)
        if _NOT_JUDGED.search(name):
            verdict = "not judged"
        else:
            worse = ratio - 1.0 if lower else 1.0 - ratio
            verdict = ("lower is better; " if lower else "") + (
                "WORSE by %.1f %%" % (100 * worse) if worse > tol else "within %g %%" % (100 * tol))
            if worse > tol:
                flagged.append(name)
        print("%-40s %12.5g %12.5g %7.3f %7s %8s  %s" % (
            name, ma, mb, ratio, "%.3f" % statistics.median(ratios) if ratios else "-",
            "%d/%d" % (better, len(rounds)), verdict))
    if flagged:
        print("worse than A by more than %g %%: %s" % (100 * tol, " ".join(flagged)))
        return 1
    print("no judged metric worse than A by more than %g %%" % (100 * tol))
    return 0


def shapes_summarize(path, judged, slack=0.02):
    """bench/compare_shapes.sh: a table per trace, and the judged policy's
    worst and mean ratio to LRU and to the best policy at each point."""
    rows, _ = _load_results(path)
    hit = {}
    # The offline LRU and Belady caches at the entries the judged policy's
    # node reached (kvpool-bench --trace computes them beside each replay).
    offline = {}
    traces, policies = [], []
    for r in rows:
        name, policy, pct = r["label"].split("/")
        hit[(name, policy, int(pct))] = r["block_hit_ratio"]
        if policy == judged:
            offline[(name, int(pct))] = (r.get("offline_lru_block_hit_ratio"),
                                         r.get("offline_belady_block_hit_ratio"))
        for seq, v in ((traces, name), (policies, policy)):
            if v not in seq:
                seq.append(v)
    vs_lru, vs_best, below = [], [], []
    for name in traces:
        print("\n%s\n| capacity | %s | %s / lru | best | offline LRU | Belady |" %
              (name, " | ".join(policies), judged))
        print("|---|" + "---|" * (len(policies) + 4))
        for pct in sorted({k[2] for k in hit if k[0] == name}):
            h = {p: hit[(name, p, pct)] for p in policies}
            best = max(policies, key=lambda p: h[p])
            # Where LRU keeps nothing there is no ratio to judge (the best-of
            # check below still covers the point).
            ratio = h[judged] / h["lru"] if h["lru"] else None
            if ratio is not None:
                vs_lru.append((ratio, name, pct))
            to_best = h[judged] / h[best] if h[best] else 1.0
            vs_best.append((to_best, name, pct))
            if to_best < 1 - slack:
                below.append("%s %d %%" % (name, pct))
            lru_off, belady = offline.get((name, pct), (None, None))
            fmt = lambda v: "-" if v is None else "%.4f" % v
            print("| %d %% | %s | %s | %s | %s | %s |" % (
                pct, " | ".join("%.4f" % h[p] for p in policies),
                "-" if ratio is None else "%.3f" % ratio, best, fmt(lru_off), fmt(belady)))
            for p in policies:
                print("metric shapes_hit_%s_%s_%dpct %.4f" % (name, p, pct, h[p]))
            if belady is not None:
                print("metric shapes_hit_%s_belady_%dpct %.4f" % (name, pct, belady))
    worst = min(vs_lru)
    print()
    print("metric shapes_hit_vs_lru_min %.3f" % worst[0])
    print("(the smallest: %s at %d %%)" % (worst[1], worst[2]))
    print("metric shapes_hit_vs_lru_mean %.3f" % (sum(v[0] for v in vs_lru) / len(vs_lru)))
    worst = min(vs_best)
    print("metric shapes_hit_vs_best_min %.3f" % worst[0])
    print("(the smallest: %s at %d %%)" % (worst[1], worst[2]))
    print("metric shapes_points_below_best %d" % len(below))
    if below:
        print("(below the best less %g %%: %s)" % (100 * slack, ", ".join(below)))
    print("metric shapes_wrong_bytes %d" % sum(r["wrong_bytes"] for r in rows))
    return 0


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
    elif cmd == "duration-ms":
        print(duration_ms(argv[2]))
    elif cmd == "size-bytes":
        print(size_bytes(argv[2]))
    elif cmd == "thread-cpu":
        print(json.dumps(thread_cpu(int(argv[2]))))
    elif cmd == "cpu-per-gib":
        print(json.dumps(cpu_per_gib(argv[2], argv[3], argv[4])))
    elif cmd == "summarize":
        return summarize(args[0])
    elif cmd == "sample":
        sample(args[0], float(args[1]), args[2], args[3:])
    elif cmd == "write-rates":
        write_rates(args[0], int(args[1]), int(args[2]) if len(args) > 2 else 2)
    elif cmd == "fio-gbps":
        fio_gbps(args[0])
    elif cmd == "metric":
        metric(args[0], args[1])
    elif cmd == "log-recovery-s":
        log_recovery_s()
    elif cmd == "tag-get":
        tag_get(*args[:6])
    elif cmd == "show-get":
        show_get()
    elif cmd == "ssd-summarize":
        return ssd_summarize(args[0])
    elif cmd == "scrape":
        print(json.dumps(_scrape_all(args[0])))
    elif cmd == "iperf-json":
        iperf_json(args[0])
    elif cmd == "remote-run":
        sep = args.index("--")
        return remote_run(*args[:sep], args[sep + 1:])
    elif cmd == "remote-summarize":
        return remote_summarize(args[0])
    elif cmd == "shapes-summarize":
        return shapes_summarize(args[0], args[1])
    elif cmd == "builds-summarize":
        return builds_summarize(args[0], args[1])
    else:
        sys.exit("unknown subcommand %r\n%s" % (cmd, __doc__))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
