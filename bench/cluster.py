#!/usr/bin/env python3
"""Cross-node throughput of a brokerd cluster (issue #5).

Two brokerd nodes in one cluster (Redis bus, shared SQLite store), both on
CPU 0 -- so the brokers together get the core a single node gets in
``bench/run.py`` -- and the generator (and Redis) on CPU 1. ``pairs`` QoS 0
with publishers on node A and subscribers on node B (every message crosses a
node link) against the same load with everyone on node A, in the same run.
The broker CPU per delivered message is both nodes' together (the
generator's sampler summed over them: ``proctree``) -- what a message costs
the host when it crosses from one worker of ``--workers N`` to another (a
worker is such a node: the same links on loopback) against when it stays in
one.

    python bench/cluster.py --runs 3
"""

import argparse
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from run import DEFAULT_MQTTBENCH, free_port, wait_port  # noqa: E402

PAIRS = "pairs --clients 1000 --qos 0 --payload 1024 --rate 0 --window 8 --duration 15"


def start(cmd, **kw):
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kw)


def stop(p):
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()


def cluster(tmp: Path):
    rport = free_port()
    redis = start(["taskset", "-c", "1", "redis-server", "--port", str(rport), "--save", "", "--appendonly", "no"])
    wait_port(rport)
    nodes = []
    secret = secrets.token_hex(32)          # the node links' shared secret
    for name in ("a", "b"):
        port = free_port()
        p = start(["taskset", "-c", "0", sys.executable, "-m", "brokerd", "--allow-anonymous", "--log-level", "warning",
                   "--sys-interval", "0", "--node-id", name, "--listen", f"mqtt://127.0.0.1:{port}",
                   "--store", f"sqlite:///{tmp}/cluster.db", "--cluster", f"redis://127.0.0.1:{rport}/0"],
                  env={**os.environ, "BROKERD_CLUSTER_SECRET": secret})
        wait_port(port)
        nodes.append((p, port))
    time.sleep(1.5)
    return redis, nodes


def run(mqttbench: str, pub_port: int, sub_port: int, pid: int, also: int) -> dict:
    cmd = ["taskset", "-c", "1", sys.executable, str(HERE / "mqttbench_split.py"), "--mqttbench", mqttbench,
           "--sub-port", str(sub_port), *PAIRS.split(), "--port", str(pub_port), "--json", "--broker-pid", str(pid)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "BENCH_ALSO_PIDS": str(also)})
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    result = json.loads(lines[-1]) if lines else {}
    if "recv_rate" not in result:
        raise RuntimeError(f"generator failed: {result.get('status')} {result.get('errors')} {proc.stderr[-1500:]}")
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--mqttbench", default=os.environ.get("MQTTBENCH", str(DEFAULT_MQTTBENCH)))
    args = ap.parse_args()
    rates = {"one node": [], "across nodes": []}
    cpu = {"one node": [], "across nodes": []}        # µs of both nodes' CPU per delivered message
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as tmp:
            redis, nodes = cluster(Path(tmp))
            try:
                (a, pa), (b, pb) = nodes
                one = run(args.mqttbench, pa, pa, a.pid, b.pid)
                cross = run(args.mqttbench, pa, pb, a.pid, b.pid)
                for key, res in (("one node", one), ("across nodes", cross)):
                    rates[key].append(res["recv_rate"])
                    cpu[key].append(round(res.get("broker_cpu_pct", 0) / 100 / res["recv_rate"] * 1e6, 2))
                print({k: v[-1] for k, v in rates.items()}, "µs/msg", {k: v[-1] for k, v in cpu.items()},
                      "loss", cross["loss_pct"], flush=True)
            finally:
                for p, _ in nodes:
                    stop(p)
                stop(redis)
    med = {k: statistics.median(v) for k, v in rates.items()}
    med["ratio"] = round(med["across nodes"] / med["one node"], 3)
    med["cpu_us_per_msg"] = {k: statistics.median(v) for k, v in cpu.items()}
    print(med)
    out = ROOT / "var" / "bench" / "cluster.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"runs": rates, "cpu_us_per_msg": cpu, "median": med}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
