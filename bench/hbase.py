#!/usr/bin/env python3
"""The HBase store in round trips, not Python speed (issue 22).

For fan-out 1, 10 and 100 (persistent QoS 1 sessions: clean session 0), one
brokerd per store -- ``memory``, ``sqlite`` and ``hbase`` -- in the same run.
The ``hbase`` store talks to the Thrift gateway test double
(``tests/hbase_double.py``) with ``--latency-ms`` added to every call (the
gateway-to-region-server round trip of a real cluster) and delete markers
on; ``hbase-0ms`` is the same with no latency added, so the two rows show
what the round trips cost apart from the double's own CPU. The double counts
every Thrift call. Reported per scenario and store:

- deliveries per second (the generator's ``recv_rate``);
- Thrift calls per stored message -- a queue entry: every delivery to a
  persistent subscriber was one, written at the publish's commit and deleted
  at the subscriber's PUBACK -- so per delivered message, and per publish
  (one publish stores fan-out entries); the double's count over the whole
  run, connects and subscribes included;
- the throughput ratio to sqlite.

Broker on CPU 0; generator and double on CPU 1 (``taskset``). The double is
Python over SQLite (in memory here), a transaction per up to 64 rows of a
call: its own CPU is part of what the ``hbase`` row measures, which a real
cluster would not add -- the call counts do not depend on it. The table shows the CPU brokerd and the
double used over the generator's run (100% = one core), so a run shows which
side it waited on.

    python bench/hbase.py                         # f1 f10 f100, 1 ms a call
    python bench/hbase.py --latency-ms 2 --runs 3 f100

Loopback only. Not part of the test suite: speed is measured, never asserted.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from proctree import stop  # noqa: E402
from run import DEFAULT_MQTTBENCH, fmt, free_port, wait_port  # noqa: E402

# name -> (fan-out, mqttbench arguments)
SCENARIOS = {
    "f1": (1, "pairs --clients 100 --qos 1 --payload 256 --rate 0 --window 8 --duration 10"),
    "f10": (10, "fanout --clients 10 --qos 1 --payload 256 --rate 0 --window 64 --duration 10"),
    "f100": (100, "fanout --clients 100 --qos 1 --payload 256 --rate 0 --window 16 --duration 10"),
}
STORES = ("memory", "sqlite", "hbase-0ms", "hbase")      # hbase: --latency-ms a call (default 1)


class Double:
    """The gateway double as a process on the generator's core, with its control port."""

    def __init__(self, python: str, tmp: Path, latency_ms: float):
        self.python, self.tmp, self.latency_ms = python, tmp, latency_ms
        self.proc = None
        self.port = self.control_port = 0

    def start(self) -> int:
        # tables in memory: the double's own disk writes (a WAL commit per row, since it
        # applies rows one by one) are not HBase's cost; nothing here kills it
        self.proc = subprocess.Popen(["taskset", "-c", "1", self.python, "-m", "tests.hbase_double", "--port", "0",
                                      "--data", ":memory:", "--delete-markers", "--control",
                                      "--latency-ms", str(self.latency_ms)], cwd=ROOT, stdout=subprocess.PIPE,
                                     text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("hbase-double ready"):
            raise RuntimeError(f"HBase double did not start: {line!r}")
        ready = dict(w.split("=", 1) for w in line.split()[2:])
        self.port, self.control_port = int(ready["port"]), int(ready["control"])
        return self.port

    def calls(self) -> dict:
        sys.path.insert(0, str(ROOT))
        from tests.hbase_double import control

        return json.loads(control(f"127.0.0.1:{self.control_port}", "calls"))

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def store_url(store: str, tmp: Path, double: Double | None) -> str:
    if store == "memory":
        return "memory://"
    if store == "sqlite":
        return f"sqlite:///{tmp}/brokerd-{time.time_ns()}.db"
    return f"hbase://127.0.0.1:{double.start()}?table_prefix=bench"


def run_one(store: str, args: str, python: str, mqttbench: Path, tmp: Path, latency_ms: float) -> dict:
    double = None
    if store.startswith("hbase"):
        double = Double(python, tmp, 0.0 if store == "hbase-0ms" else latency_ms)
    port = free_port()
    try:
        with open(tmp / f"brokerd-{store}.log", "a") as log:
            return _measure(store_url(store, tmp, double), args, python, mqttbench, port, log, double)
    finally:
        if double is not None:
            double.stop()


def _measure(url: str, args: str, python: str, mqttbench: Path, port: int, log, double: Double | None) -> dict:
    broker = subprocess.Popen(["taskset", "-c", "0", python, "-m", "brokerd", "--allow-anonymous", "--log-level",
                               "warning", "--listen", f"mqtt://127.0.0.1:{port}", "--store", url,
                               "--max-queued", "100000"], cwd=ROOT, stdout=log, stderr=log,
                              env=dict(os.environ, BROKERD_CLUSTER_SECRET="b" * 32))
    try:
        wait_port(port)
        time.sleep(0.5)
        before = double.calls()["total"] if double else 0
        procs = {"broker": broker.pid, **({"double": double.proc.pid} if double else {})}
        cpu0, t0 = {k: cpu_s(pid) for k, pid in procs.items()}, time.monotonic()
        cmd = ["taskset", "-c", "1", python, str(HERE / "mqttbench_persistent.py"), "--mqttbench",
               str(mqttbench), *args.split(), "--port", str(port), "--broker-pid", str(broker.pid), "--json"]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
        res = json.loads(lines[-1]) if lines else {"error": (out.stderr or out.stdout)[-2000:]}
        took = time.monotonic() - t0
        for k, pid in procs.items():          # over the generator's whole run (connects, publishing, draining)
            res[f"{k}_cpu_run_pct"] = round(100 * (cpu_s(pid) - cpu0[k]) / took, 1)
        if double is not None:
            snap = double.calls()
            res["thrift_calls"] = snap["total"] - before
            res["thrift_by_api"] = snap["calls"]
        return res
    finally:
        stop(broker)


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) the process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def per(res: dict, key: str) -> float | None:
    calls, n = res.get("thrift_calls"), res.get(key)
    return calls / n if calls is not None and n else None


def table(results: dict, scenarios: list[str], latency_ms: float) -> str:
    rows = ["| fan-out | store | deliveries/s | Thrift calls / stored (= delivered) msg | Thrift calls / publish "
            "| vs sqlite | brokerd CPU | double CPU |", "|---|---|---|---|---|---|---|---|"]
    for name in scenarios:
        fan = SCENARIOS[name][0]
        meds = {}
        for store in STORES:
            runs = results.get((name, store), [])
            rate = [r["recv_rate"] for r in runs if r.get("recv_rate")]
            meds[store] = statistics.median(rate) if rate else None
        for store in STORES:
            runs = results.get((name, store), [])
            published = [v for r in runs if (v := per(r, "puback")) is not None]
            delivered = [v for r in runs if (v := per(r, "received")) is not None]
            ratio = "-"
            if meds[store] and meds["sqlite"]:
                ratio = f"{meds[store] / meds['sqlite']:.2f}x"
            label = f"hbase ({latency_ms:g} ms/call)" if store == "hbase" else store
            cpu = [_cpu(runs, k) for k in ("broker", "double")]
            rows.append(f"| {fan} | {label} | {fmt(meds[store])} | "
                        f"{fmt(statistics.median(delivered)) if delivered else '-'} | "
                        f"{fmt(statistics.median(published)) if published else '-'} | {ratio} | {cpu[0]} | {cpu[1]} |")
    return "\n".join(rows)


def _cpu(runs: list, proc: str) -> str:
    got = [r[f"{proc}_cpu_run_pct"] for r in runs if r.get(f"{proc}_cpu_run_pct") is not None]
    return f"{statistics.median(got):.0f}%" if got else "-"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("scenarios", nargs="*", help=f"any of {', '.join(SCENARIOS)} (default: all)")
    ap.add_argument("--stores", default=",".join(STORES),
                    help=f"comma-separated, any of {', '.join(STORES)} (default: all)")
    ap.add_argument("--runs", type=int, default=1, help="runs per scenario and store; the table shows medians")
    ap.add_argument("--latency-ms", type=float, default=1.0, help="added to every Thrift call of the double")
    ap.add_argument("--mqttbench", default=os.environ.get("MQTTBENCH", str(DEFAULT_MQTTBENCH)))
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--duration", type=float, help="publish seconds of every scenario (default 10)")
    ap.add_argument("--out", default=str(ROOT / "var" / "bench" / "hbase.jsonl"))
    args = ap.parse_args(argv)
    scenarios = args.scenarios or list(SCENARIOS)
    unknown = [s for s in scenarios if s not in SCENARIOS]
    if unknown:
        ap.error(f"unknown scenario(s): {', '.join(unknown)}")
    stores = [s for s in args.stores.split(",") if s]
    if not stores or set(stores) - set(STORES):
        ap.error(f"--stores: any of {', '.join(STORES)}")
    mqttbench = Path(args.mqttbench)
    if not mqttbench.exists():
        print(f"error: mqttbench.py not found at {mqttbench} (set --mqttbench or MQTTBENCH)", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="brokerd-bench-hbase-") as tmp:
        for name in scenarios:
            for run in range(args.runs):
                for store in stores:
                    t0 = time.time()
                    cmd = SCENARIOS[name][1] + (f" --duration {args.duration:g}" if args.duration else "")
                    res = run_one(store, cmd, args.python, mqttbench, Path(tmp), args.latency_ms)
                    res.update(scenario=name, store=store, run=run, started=t0, latency_ms=args.latency_ms)
                    results.setdefault((name, store), []).append(res)
                    with out.open("a") as fh:
                        fh.write(json.dumps(res) + "\n")
                    print(f"{name} {store} run {run + 1}: deliveries/s={fmt(res.get('recv_rate'))} "
                          f"puback={res.get('puback')} received={res.get('received')} "
                          f"calls={res.get('thrift_calls', '-')}"
                          + (f" ERROR {res['error'][-300:]}" if "error" in res else ""), flush=True)
    print()
    print(table(results, scenarios, args.latency_ms))
    print(f"\nraw results appended to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
