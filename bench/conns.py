#!/usr/bin/env python3
"""Many idle connections, each with one subscription: broker memory per
connection and the connect rate, brokerd beside Mosquitto in the same run.

A generator process holds at most its descriptor limit (20,000 here) of
connections, so N connections come from several generator processes
(``mqttbench_conns.py``, at most ``--per-gen`` clients each, every one from
loopback source addresses of its own, ``127.0.G.1``, ``127.0.G.2``, ...),
started together. Every client connects (keepalive 60), subscribes to a
topic of its own and stays idle for ``--hold`` seconds.

Reported per broker and run: connections held, connects per second over the
whole connect phase (CONNECT, CONNACK, SUBSCRIBE, SUBACK; from the first
generator's start to the last one's end), the broker's CPU per connect, and
its RSS -- summed over the broker process and every process under it (with
``--workers`` the supervisor and its workers) -- as the growth per
connection from before the first connect to the peak while they are held,
and as the total per connection; the broker's CPU while they are held idle,
as a share of one core (from the hold's first second to its end; the
generators send every client a PINGREQ each 30 s, so a ``--hold`` past 30 s
includes one round of them); then the broker's CPU per connection for the
disconnect wave when the generators close them all (until the broker is
quiet again). Mosquitto is one process: it runs with at
most ``--mosquitto-max`` connections (its descriptor limit), and the table
says how many it held.

    .venv/bin/python bench/conns.py s10 s19 --runs 3
    .venv/bin/python bench/conns.py s100 --workers 2 --broker-cpus 0,1
    .venv/bin/python bench/conns.py --clients 50000 --brokers brokerd --brokerd-arg=--workers=2 --cluster

``--workers N`` (or ``--cluster``) also starts a Redis for the cluster bus
(on the generator's CPUs) and gives brokerd ``--cluster``, a SQLite store and
a cluster secret, as ``--workers`` requires. Loopback only; not part of the
test suite.
"""

import argparse
import json
import math
import os
import secrets
import selectors
import shutil
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
from proctree import descendants as tree  # noqa: E402  (pid and every process under it)
from run import DEFAULT_MQTTBENCH, MOSQUITTO_CONF, free_port, wait_port  # noqa: E402

# name -> (connections, title)
SCENARIOS = {
    "s10": (10_000, "10,000 idle connections, one subscription each"),
    "s19": (19_000, "19,000 idle connections, one subscription each (one process's descriptors)"),
    "s50": (50_000, "50,000 idle connections, one subscription each"),
    "s100": (100_000, "100,000 idle connections, one subscription each"),
}
_CLK = os.sysconf("SC_CLK_TCK")


# ------------------------------------------------------------------ /proc



def _status_kb(pid: int, field: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(field):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _pss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _cpu_s(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            s = fh.read()
        fields = s[s.rindex(")") + 2:].split()
        return (int(fields[11]) + int(fields[12])) / _CLK
    except (OSError, ValueError, IndexError):
        return 0.0


def memory(pid: int) -> dict:
    """RSS and PSS (bytes) summed over the tree of ``pid``, and how many processes."""
    pids = tree(pid)
    return {"rss": 1024 * sum(_status_kb(p, "VmRSS:") for p in pids),
            "pss": 1024 * sum(_pss_kb(p) for p in pids), "procs": len(pids)}


def cpu(pid: int) -> float:
    return sum(_cpu_s(p) for p in tree(pid))


def redis_calls(port: int | None) -> dict:
    """Redis's calls so far by command (``INFO commandstats``; nothing without a Redis)."""
    if port is None:
        return {}
    out = subprocess.run(["redis-cli", "-p", str(port), "INFO", "commandstats"], capture_output=True, text=True,
                         timeout=10).stdout
    calls = {}
    for line in out.splitlines():
        if line.startswith("cmdstat_"):
            name, _, rest = line[len("cmdstat_"):].partition(":")
            calls[name] = int(rest.split(",")[0].split("=")[1])
    return calls


# ------------------------------------------------------------------ processes

class Proc:
    def __init__(self, cmd: list[str], log: Path, env: dict | None = None, cwd: Path = ROOT, **kw):
        self.log = open(log, "a")  # noqa: SIM115 -- open as long as the process runs
        self.p = subprocess.Popen(cmd, cwd=cwd, stdout=self.log, stderr=self.log, start_new_session=True,
                                  env=env, **kw)

    @property
    def pid(self) -> int:
        return self.p.pid

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.p.pid, signal.SIGKILL)
                self.p.wait()
        self.log.close()


def nofile(n: int) -> list[str]:
    """A prefix raising the descriptor limit of the command it runs (and of its children) to ``n``
    (raising the hard limit needs root); nothing if ``n`` is 0."""
    return ["prlimit", f"--nofile={n}:{n}"] if n else []


def start_broker(name: str, args, tmp: Path, port: int, redis_port: int | None) -> Proc:
    pin = ["taskset", "-c", args.broker_cpus]
    if name in ("brokerd", "before"):
        root = ROOT if name == "brokerd" else Path(args.before).resolve()
        extra = list(args.brokerd_arg)
        env = dict(os.environ, PYTHONPATH=str(root))
        store = "memory://"
        if redis_port is not None:
            extra += ["--cluster", f"redis://127.0.0.1:{redis_port}/0", "--node-id", f"bench{time.time_ns()}"]
            env["BROKERD_CLUSTER_SECRET"] = secrets.token_hex(32)
            store = f"sqlite:///{tmp}/brokerd-{time.time_ns()}.db"
        # (--max-connections is the host's, split evenly among --workers, and the kernel spreads connections
        # only about evenly: the 100,000 of s100 above the default's share of the busiest worker)
        cmd = [args.python, "-m", "brokerd", "--allow-anonymous", "--log-level", "warning", "--sys-interval", "0",
               "--listen", f"mqtt://127.0.0.1:{port}", "--store", store, "--max-connections", "1000000", *extra]
        log = tmp / f"{name}.log"
        start = log.stat().st_size if log.exists() else 0
        proc = Proc(nofile(args.brokerd_nofile) + pin + cmd, log, env=env, cwd=root)
        wait_port(port, 90.0)
        if any(a.startswith("--workers") for a in extra):
            # every worker listens once the supervisor says so
            deadline = time.monotonic() + 90
            while b"brokerd ready" not in log.read_bytes()[start:]:
                if time.monotonic() > deadline or proc.p.poll() is not None:
                    raise RuntimeError(f"brokerd --workers did not start: see {log}")
                time.sleep(0.1)
            time.sleep(1.0)
        return proc
    state = tmp / f"mosq-{time.time_ns()}"
    state.mkdir()
    conf = tmp / "mosquitto.conf"
    conf.write_text(MOSQUITTO_CONF.format(port=port, tmp=state, persistence="false"))
    proc = Proc(nofile(args.mosquitto_nofile) + pin + [shutil.which("mosquitto") or "/usr/sbin/mosquitto", "-c",
                                                      str(conf)], tmp / "mosquitto.log")
    wait_port(port, 90.0)
    return proc


def start_redis(args, tmp: Path) -> tuple[Proc, int]:
    port = free_port()
    proc = Proc(["taskset", "-c", args.gen_cpus, "redis-server", "--port", str(port), "--bind", "127.0.0.1",
                 "--save", "", "--appendonly", "no"], tmp / "redis.log")
    wait_port(port)
    return proc, port


def split(n: int, per_gen: int) -> list[int]:
    gens = max(1, math.ceil(n / per_gen))
    return [n // gens + (1 if i < n % gens else 0) for i in range(gens)]


def source_ips(g: int, n: int, per_ip: int) -> str:
    return ",".join(f"127.0.{g + 1}.{i + 1}" for i in range(max(1, math.ceil(n / per_ip))))


# ------------------------------------------------------------------ one run

def run_one(name: str, n: int, args, tmp: Path) -> dict:
    redis = None
    redis_port = None
    if name != "mosquitto" and args.cluster:
        redis, redis_port = start_redis(args, tmp)
    port = free_port()
    broker = start_broker(name, args, tmp, port, redis_port)
    gens: list[subprocess.Popen] = []
    try:
        time.sleep(args.settle)
        mem0 = memory(broker.pid)
        redis0 = memory(redis.pid)["rss"] if redis else 0
        start_at = time.time() + 1.5                     # every generator loaded and waiting
        hold = args.hold + args.settle + 5.0
        for g, k in enumerate(split(n, args.per_gen)):
            cmd = ["taskset", "-c", args.gen_cpus, args.python, str(HERE / "mqttbench_conns.py"),
                   "--mqttbench", str(args.mqttbench), "--start-at", f"{start_at:.3f}", "conns",
                   "--port", str(port), "--clients", str(k), "--client-prefix", f"g{g}-{os.getpid()}",
                   "--source-ips", source_ips(g, k, args.per_ip), "--keepalive", "60",
                   "--duration", str(hold), "--settle", "0", "--setup-timeout", str(args.setup_timeout),
                   "--conn-concurrency", str(args.conn_concurrency), "--nofile", "20000", "--json", "--quiet"]
            gens.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True))
        cpu0 = None
        while time.time() < start_at:
            time.sleep(0.01)
        cpu0, rcpu0, calls0 = cpu(broker.pid), cpu(redis.pid) if redis else 0.0, redis_calls(redis_port)
        phases, results = read_phases(gens, args.setup_timeout + 60)
        cpu1, rcpu1, calls1 = cpu(broker.pid), cpu(redis.pid) if redis else 0.0, redis_calls(redis_port)
        ok = sum(p["ok"] for p in phases)
        t0 = min((p["t0"] for p in phases), default=start_at)
        t1 = max((p["t1"] for p in phases), default=time.time())
        # the peak while they are held, and the broker's CPU then (from the hold's first second on: what is
        # left of the connect phase, the routes' announcements among workers, is over by then)
        peak = memory(broker.pid)
        deadline = time.monotonic() + args.hold
        held_cpu0 = held_t0 = None
        while time.monotonic() < deadline:
            time.sleep(min(1.0, args.hold))
            m = memory(broker.pid)
            if m["rss"] > peak["rss"]:
                peak = m
            if held_cpu0 is None:
                held_cpu0, held_t0 = cpu(broker.pid), time.monotonic()
        held_cpu1, held_t1 = cpu(broker.pid), time.monotonic()
        redis1 = memory(redis.pid)["rss"] if redis else 0
        # the disconnect wave: every generator closes its connections at the end of its duration; the
        # broker's CPU from before then until it is quiet again (no 10 ms of CPU in half a second)
        cpu2 = cpu(broker.pid)
        results += finish(gens)
        cpu3, quiet_by = cpu(broker.pid), time.monotonic() + 60
        while time.monotonic() < quiet_by:
            time.sleep(0.5)
            c = cpu(broker.pid)
            if c - cpu3 < 0.01:
                break
            cpu3 = c
        alive = sum(r.get("alive_after_hold", 0) for r in results)
        res = {"broker": name, "clients": n, "generators": len(gens), "connected": ok, "alive": alive,
               "connect_s": round(t1 - t0, 3), "connect_rate": round(ok / (t1 - t0), 1) if t1 > t0 else None,
               "broker_cpu_us_per_connect": round(1e6 * (cpu1 - cpu0) / ok, 1) if ok else None,
               "broker_cpu_us_per_disconnect": round(1e6 * (cpu3 - cpu2) / ok, 1) if ok else None,
               "broker_cpu_pct_held": round(100 * (held_cpu1 - held_cpu0) / (held_t1 - held_t0), 2)
               if held_t0 is not None and held_t1 - held_t0 >= 1.0 else None,
               "rss_before_mb": round(mem0["rss"] / 2**20, 1), "rss_held_mb": round(peak["rss"] / 2**20, 1),
               "pss_held_mb": round(peak["pss"] / 2**20, 1), "processes": peak["procs"],
               "errors": {k: v for r in results for k, v in r.get("errors", {}).items()}}
        if ok:
            res["bytes_per_conn"] = round((peak["rss"] - mem0["rss"]) / ok)
            res["total_bytes_per_conn"] = round(peak["rss"] / ok)
            res["pss_bytes_per_conn"] = round((peak["pss"] - mem0["pss"]) / ok)
            if redis:
                res["redis_bytes_per_conn"] = round((redis1 - redis0) / ok)
                # Redis's own CPU and calls while they connected (not in the broker's CPU above)
                res["redis_cpu_us_per_connect"] = round(1e6 * (rcpu1 - rcpu0) / ok, 1)
                calls = {c: n - calls0.get(c, 0) for c, n in calls1.items() if n > calls0.get(c, 0) and c != "info"}
                res["redis_calls_per_connect"] = round(sum(calls.values()) / ok, 3)
                res["redis_calls"] = dict(sorted(calls.items(), key=lambda kv: -kv[1]))
        return res
    finally:
        for g in gens:
            if g.poll() is None:
                g.kill()
                g.wait()
        broker.stop()
        if redis:
            redis.stop()


def read_phases(gens: list, timeout: float) -> tuple[list, list]:
    """Each generator's ``connected`` line (and the final results of those that ended early)."""
    sel = selectors.DefaultSelector()
    for g in gens:
        sel.register(g.stdout, selectors.EVENT_READ, g)
    phases, results, waiting = [], [], set(gens)
    deadline = time.monotonic() + timeout
    while waiting and time.monotonic() < deadline:
        for key, _ in sel.select(1.0):
            g = key.data
            line = g.stdout.readline()
            if not line:                                  # ended before its connect phase did
                sel.unregister(g.stdout)
                waiting.discard(g)
                continue
            if line.startswith("{"):
                obj = json.loads(line)
                if obj.get("phase") == "connected":
                    phases.append(obj)
                    sel.unregister(g.stdout)
                    waiting.discard(g)
                else:
                    results.append(obj)
    sel.close()
    return phases, results


def finish(gens: list) -> list:
    out = []
    for g in gens:
        try:
            stdout, _ = g.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            g.kill()
            stdout, _ = g.communicate()
        lines = [ln for ln in stdout.splitlines() if ln.startswith("{") and '"phase"' not in ln]
        if lines:
            out.append(json.loads(lines[-1]))
    return out


# ------------------------------------------------------------------ report

METRICS = [("connected", "connections held"), ("connect_rate", "connects/s (CONNECT + SUBSCRIBE)"),
           ("broker_cpu_us_per_connect", "broker CPU µs per connect"),
           ("broker_cpu_us_per_disconnect", "broker CPU µs per disconnect (the generators closing all)"),
           ("broker_cpu_pct_held", "broker CPU while they are held idle, % of one core"),
           ("bytes_per_conn", "RSS growth per connection, bytes"), ("total_bytes_per_conn", "total RSS / connections"),
           ("pss_bytes_per_conn", "PSS growth per connection"), ("processes", "broker processes"),
           ("redis_bytes_per_conn", "Redis RSS growth per connection"),
           ("redis_cpu_us_per_connect", "Redis CPU µs per connect"),
           ("redis_calls_per_connect", "Redis calls per connect (commands run, scripts' inner calls included)")]


def fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def table(results: dict, brokers: list[str], scenarios: list[str]) -> str:
    rows = ["| scenario | metric | " + " | ".join(brokers) + " | brokerd / mosquitto |",
            "|" + "---|" * (len(brokers) + 3)]
    for sc in scenarios:
        for path, label in METRICS:
            meds = {}
            for b in brokers:
                vals = [r[path] for r in results.get((sc, b), []) if r.get(path) is not None]
                meds[b] = statistics.median(vals) if vals else None
            if all(v is None for v in meds.values()):
                continue
            bd, mq = meds.get("brokerd"), meds.get("mosquitto")
            ratio = f"{bd / mq:.2f}x" if bd is not None and mq else "-"
            rows.append(f"| {sc} | {label} | " + " | ".join(fmt(meds[b]) for b in brokers) + f" | {ratio} |")
    return "\n".join(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("scenarios", nargs="*", help=f"of {', '.join(SCENARIOS)} (default s10 s19)")
    ap.add_argument("--clients", type=int, help="a number of connections instead of the scenarios")
    ap.add_argument("--brokers", default="brokerd,mosquitto")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--brokerd-arg", action="append", default=[], help="extra flag for brokerd (repeatable)")
    ap.add_argument("--workers", help="brokerd --workers N (implies --cluster)")
    ap.add_argument("--cluster", action="store_true", help="brokerd in a cluster: Redis, SQLite store, a secret")
    ap.add_argument("--broker-cpus", default="0", help="taskset CPU list of the broker (default 0)")
    ap.add_argument("--gen-cpus", default="1", help="taskset CPU list of the generators and Redis (default 1)")
    ap.add_argument("--per-gen", type=int, default=18_000, help="connections per generator process")
    ap.add_argument("--per-ip", type=int, default=6_000, help="connections per loopback source address")
    ap.add_argument("--mosquitto-max", type=int, default=19_000, help="connections Mosquitto (one process) gets")
    ap.add_argument("--mosquitto-nofile", type=int, default=0,
                    help="raise Mosquitto's descriptor limit to this (prlimit; root), e.g. 110000 with --mosquitto-max 100000")
    ap.add_argument("--brokerd-nofile", type=int, default=0, help="raise brokerd's (and its workers') descriptor limit")
    ap.add_argument("--before", help="checkout of an earlier revision: broker 'before' in --brokers runs its brokerd")
    ap.add_argument("--hold", type=float, default=10.0, help="seconds the connections are held once all are up")
    ap.add_argument("--settle", type=float, default=2.0, help="seconds after the broker starts before measuring")
    ap.add_argument("--setup-timeout", type=float, default=300.0)
    ap.add_argument("--conn-concurrency", type=int, default=100, help="connects in flight per generator")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--mqttbench", default=os.environ.get("MQTTBENCH", str(DEFAULT_MQTTBENCH)))
    ap.add_argument("--out", default=str(ROOT / "var" / "bench" / "conns.jsonl"))
    args = ap.parse_args(argv)
    if args.workers:
        args.brokerd_arg.append(f"--workers={args.workers}")
        args.cluster = True
    if args.clients:
        SCENARIOS["custom"] = (args.clients, f"{args.clients:,} idle connections, one subscription each")
        scenarios = ["custom"]
    else:
        scenarios = args.scenarios or ["s10", "s19"]
    unknown = [s for s in scenarios if s not in SCENARIOS]
    if unknown:
        ap.error(f"unknown scenario(s): {', '.join(unknown)}")
    brokers = args.brokers.split(",")
    if any(b not in ("brokerd", "mosquitto", "before") for b in brokers):
        ap.error("--brokers: brokerd, mosquitto and/or before (with --before)")
    if "before" in brokers and not args.before:
        ap.error("--brokers before needs --before PATH")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="brokerd-conns-") as tmp:
        for sc in scenarios:
            for run in range(args.runs):
                for b in brokers:
                    n = SCENARIOS[sc][0]
                    if b == "mosquitto":
                        n = min(n, args.mosquitto_max)
                    res = run_one(b, n, args, Path(tmp))
                    res.update(scenario=sc, run=run, started=time.time(), brokerd_args=args.brokerd_arg)
                    results.setdefault((sc, b), []).append(res)
                    with out.open("a") as fh:
                        fh.write(json.dumps(res) + "\n")
                    print(f"{sc} {b} run {run + 1}: " + ", ".join(
                        f"{label}={fmt(res.get(path))}" for path, label in METRICS if res.get(path) is not None)
                        + (f" errors={res['errors']}" if res["errors"] else ""), flush=True)
    print()
    print(table(results, brokers, scenarios))
    print(f"\nraw results appended to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
