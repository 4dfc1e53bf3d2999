"""bench/compare.sh builds: the summary's verdicts and the script's answers
to bad arguments (the runs themselves are benchmarks, not tests)."""

import os
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMPARE = os.path.join(REPO, "bench", "compare.sh")
LIB = os.path.join(REPO, "bench", "compare_lib.py")


def summarize(tmp_path, rows, tolerance="5"):
    tsv = tmp_path / "metrics.tsv"
    tsv.write_text("".join("%s\t%s\t%s\t%s\n" % r for r in rows))
    p = subprocess.run(["/usr/bin/python3", LIB, "builds-summarize", str(tsv), tolerance],
                       capture_output=True, text=True, timeout=60)
    lines = {l.split()[0]: l for l in p.stdout.splitlines()[1:-1]}
    return p.returncode, lines, p.stdout.splitlines()[-1]


def test_medians_paired_ratios_and_verdicts(tmp_path):
    rows = []
    # A rate 4 % lower in B: within 5 %. Medians 100 and 96.
    for rnd, a, b in (("1", 100, 96), ("2", 90, 99), ("3", 110, 90), ("4", 101, 95)):
        rows += [(rnd, "A", "local_get_1m_gbps", a), (rnd, "B", "local_get_1m_gbps", b)]
    # Less is better: 18.14 against 17.48 is 3.8 % worse, within 5 %.
    for rnd in "12":
        rows += [(rnd, "A", "index_bytes_per_entry", 17.48), (rnd, "B", "index_bytes_per_entry", 18.14)]
    # The machine's own figure: shown, never judged, however far it moves.
    for rnd in "12":
        rows += [(rnd, "A", "memcpy_1m_gbps", 8.0), (rnd, "B", "memcpy_1m_gbps", 4.0)]
    # A lookup's share of a get: less is better, so 0.06 against 0.07 is B doing better.
    for rnd in "12":
        rows += [(rnd, "A", "lookup_share_of_batch_get", 0.07), (rnd, "B", "lookup_share_of_batch_get", 0.06)]
    # A run that could not compute a ratio prints nan: left out, not a zero.
    rows += [("1", "A", "local_get_1m_vs_redis", "nan"), ("1", "B", "local_get_1m_vs_redis", "nan")]
    rc, lines, last = summarize(tmp_path, rows)
    assert rc == 0, lines
    get = lines["local_get_1m_gbps"].split()
    assert get[1:5] == ["100.5", "95.5", "0.950", "0.950"]  # medians, B/A, median per-round ratio
    assert get[5] == "1/4"
    assert lines["local_get_1m_gbps"].endswith("within 5 %")
    assert "lower is better; within 5 %" in lines["index_bytes_per_entry"]
    assert lines["index_bytes_per_entry"].split()[5] == "0/2"
    assert lines["memcpy_1m_gbps"].endswith("not judged")
    assert "lower is better; within 5 %" in lines["lookup_share_of_batch_get"]
    assert lines["lookup_share_of_batch_get"].split()[5] == "2/2"
    assert "local_get_1m_vs_redis" not in lines
    assert last == "no judged metric worse than A by more than 5 %"


def test_a_metric_worse_beyond_the_tolerance_is_flagged(tmp_path):
    rows = [("1", "A", "local_exists_keys_per_s", 700000), ("1", "B", "local_exists_keys_per_s", 650000),
            ("1", "A", "local_errors", 0), ("1", "B", "local_errors", 3),
            ("1", "A", "local_put_1m_gbps", 5.0), ("1", "B", "local_put_1m_gbps", 4.9)]
    rc, lines, last = summarize(tmp_path, rows)
    assert rc == 1
    assert lines["local_exists_keys_per_s"].endswith("WORSE by 7.1 %")
    assert "lower is better; WORSE by inf %" in lines["local_errors"]
    assert lines["local_put_1m_gbps"].endswith("within 5 %")
    assert last == "worse than A by more than 5 %: local_errors local_exists_keys_per_s"
    # The same figures under a 10 % tolerance: only the errors.
    rc, lines, last = summarize(tmp_path, rows, "10")
    assert rc == 1
    assert last == "worse than A by more than 10 %: local_errors"


def run_builds(*args):
    return subprocess.run(["bash", COMPARE, "builds", *args], capture_output=True, text=True, timeout=60)


def test_bad_arguments_get_a_clear_error(tmp_path):
    p = run_builds("--a", str(tmp_path))  # no --b
    assert p.returncode == 2 and "Usage: bench/compare.sh builds" in p.stderr
    p = run_builds("--a", str(tmp_path), "--b", str(tmp_path), "--rounds", "0")
    assert p.returncode == 1 and "--rounds wants a positive whole number, not '0'" in p.stderr
    p = run_builds("--a", str(tmp_path), "--b", str(tmp_path), "--tolerance", "five")
    assert p.returncode == 1 and "--tolerance wants a percentage, not 'five'" in p.stderr
    p = run_builds("--a", str(tmp_path), "--b", str(tmp_path), "--mode", "builds")
    assert p.returncode == 1 and "--mode builds: not a mode this script compares" in p.stderr
    p = run_builds("--a", str(tmp_path / "nowhere"), "--b", str(tmp_path))
    assert p.returncode == 1 and "build directory %s does not exist" % (tmp_path / "nowhere") in p.stderr
    p = run_builds("--a", str(tmp_path), "--b", str(tmp_path))
    assert p.returncode == 1 and "no kvpool-node under %s" % tmp_path in p.stderr
