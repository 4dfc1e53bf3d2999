"""deploy/grafana/kvpool.json: a well-formed dashboard whose every query
names metrics a real node exports."""

import json
import os
import re
import urllib.request

from ports_util import start_on_free_ports

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DASHBOARD = os.path.join(REPO, "deploy", "grafana", "kvpool.json")


def exported_families(port):
    text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10).read().decode()
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            names.add(line.split()[2])
    return names


def test_every_query_names_metrics_a_node_exports(node_factory, tmp_path):
    with open(DASHBOARD) as f:
        dash = json.load(f)
    panels = dash["panels"]
    assert len(panels) >= 10
    assert len({p["id"] for p in panels}) == len(panels)
    exprs = [t["expr"] for p in panels for t in p["targets"]]
    assert all(e.strip() for e in exprs)
    wanted = set()
    for e in exprs:
        for name in re.findall(r"\bkvpool_[a-z0-9_]+", e):
            wanted.add(re.sub(r"_(bucket|sum|count)$", "", name))
    assert "kvpool_op_latency_seconds" in wanted and "kvpool_ssd_used_bytes" in wanted
    # A one-member cluster with an SSD tier exports the SSD and peer metrics too.
    ssd = tmp_path / "ssd"
    ssd.mkdir()
    node = start_on_free_ports(lambda ports: node_factory([
        "--ssd", str(ssd), "--ssd-capacity", "64MiB", "--node-id", "n0",
        "--peers", "n0=127.0.0.1:%d" % ports[0], "--peer-port", str(ports[0])]), 1)
    have = exported_families(node.admin_port)
    missing = sorted(wanted - have)
    assert missing == [], "the dashboard queries metrics no node exports: %s" % missing
    # The node selector's query names a metric every node has.
    query = dash["templating"]["list"][1]["definition"]
    assert re.search(r"label_values\((kvpool_[a-z_]+), instance\)", query).group(1) in have
