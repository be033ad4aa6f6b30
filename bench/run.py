#!/usr/bin/env python3
"""brokerd vs Mosquitto in the same run: the numbers behind the README table.

Runs ``mqttbench.py`` (the shared, dependency-free load generator) against
each broker for each scenario. Every run restarts the broker pinned to CPU 0
and pins the generator to CPU 1 (``taskset``), so the two never share a core;
results are appended as JSON lines and summarised as a table of medians with
the brokerd/Mosquitto ratio.

    python bench/run.py                       # every scenario, 1 run each
    python bench/run.py --runs 3 a2 b20k      # chosen scenarios, median of 3
    python bench/run.py --list

With ``--workers N`` brokerd runs N worker processes (``--workers`` of
brokerd: a Redis for the cluster bus and an SQLite store are started and set
for it); ``--broker-cpus`` / ``--gen-cpus`` choose the cores (default 0 and
1). The broker's CPU and RSS are then its whole process tree (supervisor and
workers: ``mqttbench_tree.py``).

    python bench/run.py --brokers brokerd --workers 2 --broker-cpus 0,1 --gen-cpus 0,1 a2 c1

Loopback only. Not part of the test suite: speed is measured, never asserted.
"""

import argparse
import json
import os
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEFAULT_MQTTBENCH = ROOT.parent / "shared" / "bench" / "mqttbench.py"

# name -> (mqttbench arguments, metrics to report: (json path, label, better))
SCENARIOS = {
    "a2": ("pairs --clients 1000 --qos 0 --payload 1024 --rate 0 --window 8 --duration 15",
           "pairs QoS 0, 1 KiB, window 8 (closed loop)",
           [("recv_rate", "msg/s delivered", "higher"), ("loss_pct", "loss %", "lower"),
            ("broker_rss_peak_mb", "broker RSS MB", "lower")]),
    "a1": ("pairs --clients 1000 --qos 0 --payload 1024 --rate 0 --duration 15",
           "pairs QoS 0, 1 KiB, unlimited rate (overload)",
           [("recv_rate", "msg/s delivered", "higher"), ("loss_pct", "loss %", "lower"),
            ("broker_rss_peak_mb", "broker RSS MB", "lower")]),
    "b5k": ("pairs --clients 1000 --qos 1 --payload 1024 --rate 5000 --duration 15",
            "pairs QoS 1 at 5k msg/s",
            [("recv_rate", "msg/s delivered", "higher"), ("loss_pct", "loss %", "lower"),
             ("latency.p50_ms", "p50 ms", "lower"), ("latency.p99_ms", "p99 ms", "lower")]),
    "b10k": ("pairs --clients 1000 --qos 1 --payload 1024 --rate 10000 --duration 15",
             "pairs QoS 1 at 10k msg/s",
             [("recv_rate", "msg/s delivered", "higher"), ("loss_pct", "loss %", "lower"),
              ("latency.p50_ms", "p50 ms", "lower"), ("latency.p99_ms", "p99 ms", "lower")]),
    "b20k": ("pairs --clients 1000 --qos 1 --payload 1024 --rate 20000 --duration 15",
             "pairs QoS 1 at 20k msg/s",
             [("recv_rate", "msg/s delivered", "higher"), ("loss_pct", "loss %", "lower"),
              ("latency.p50_ms", "p50 ms", "lower"), ("latency.p99_ms", "p99 ms", "lower")]),
    "c1": ("fanout --clients 1000 --qos 0 --payload 100 --rate 0 --window 4 --batch 1 --duration 15",
           "fanout 1 -> 1000, 100 B",
           [("recv_rate", "deliveries/s", "higher"), ("loss_pct", "loss %", "lower")]),
    "d10": ("conns --clients 10000 --duration 10 --settle 2 --nofile 20000",
            "10,000 idle connections",
            [("broker_bytes_per_conn", "bytes RSS / connection", "lower"), ("connect_rate", "connects/s", "higher")]),
    # persistent sessions (clean session 0 for every client: bench/mqttbench_persistent.py)
    "p1": ("pairs --clients 200 --qos 1 --payload 512 --rate 0 --window 4 --duration 15",
           "persistent sessions, pairs QoS 1, 512 B, window 4",
           [("recv_rate", "msg/s delivered", "higher"), ("loss_pct", "loss %", "lower"),
            ("latency.p50_ms", "p50 ms", "lower"), ("latency.p99_ms", "p99 ms", "lower")]),
}
PERSISTENT = {"p1"}
DEFAULT_SCENARIOS = ["a2", "a1", "b5k", "b10k", "b20k", "c1", "d10"]

# Broker variants. "brokerd" is the in-memory default; "brokerd-sqlite" and
# "brokerd-hbase" keep sessions in the store (the HBase one through the test
# double of its Thrift gateway, tests/hbase_double.py); "brokerd-full" has
# every feature on (issue 18): the control plane with a tenant of 20 ACL
# rules, every client authenticated as one of its devices (FullFeatures),
# ``--store sqlite``, ``--admin``, and ``--cluster`` as the one node of a
# cluster on a real redis-server; "mosquitto-persist" turns Mosquitto's
# persistence on -- which only writes snapshots (on shutdown and every
# autosave_interval), not every message.
BROKERS = ("brokerd", "brokerd-sqlite", "brokerd-hbase", "brokerd-full", "mosquitto", "mosquitto-persist", "amqtt")
# amqtt, the other Python broker (shared/bench/peers): installed on first use into its own
# virtualenv under var/ (it pins other versions of packages brokerd uses)
AMQTT = "amqtt==0.12.1"
AMQTT_VENV = ROOT / "var" / "bench-amqtt"


def amqtt_python() -> str:
    py = AMQTT_VENV / "bin" / "python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(AMQTT_VENV)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", AMQTT, "uvloop"],
                       check=True)
    return str(py)

MOSQUITTO_CONF = """\
# the peer-anchor configuration of shared/bench/peers (default Nagle)
per_listener_settings false
listener {port} 127.0.0.1
allow_anonymous true
max_queued_messages 100000
persistence {persistence}
persistence_location {tmp}/
log_dest stderr
log_type error
connection_messages false
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"broker did not listen on {port}")


class HBaseDouble:
    """The test double of HBase's Thrift gateway, as a process on CPU 1 (with the generator)."""

    def __init__(self, python: str, tmp: Path):
        self.python = python
        self.tmp = tmp
        self.proc = None
        self.port = 0

    def start(self) -> int:
        data = self.tmp / f"hbase-{time.time_ns()}.db"
        self.proc = subprocess.Popen(["taskset", "-c", "1", self.python, "-m", "tests.hbase_double", "--port", "0",
                                      "--data", str(data)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if "port=" not in line:
            raise RuntimeError(f"HBase double did not start: {line!r}")
        self.port = int(line.rsplit("port=", 1)[1])
        return self.port

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def workers_of(extra: list[str]) -> str | None:
    """The --workers brokerd is given in ``extra`` (``--workers N`` or ``--workers=N``), if more than 1."""
    for i, arg in enumerate(extra):
        value = arg.split("=", 1)[1] if arg.startswith("--workers=") else (
            extra[i + 1] if arg == "--workers" and i + 1 < len(extra) else None)
        if value is not None and value != "1":
            return value
    return None


class Redis:
    """A redis-server for the workers' cluster bus (--workers N), on the broker's cores."""

    def __init__(self, cpus: str, tmp: Path):
        self.cpus, self.tmp = cpus, tmp
        self.proc = None
        self.port = 0

    def start(self) -> int:
        self.port = free_port()
        self.proc = subprocess.Popen(["taskset", "-c", self.cpus, "redis-server", "--port", str(self.port),
                                      "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir",
                                      str(self.tmp)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(self.port)
        return self.port

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


class FullFeatures:
    """What "every feature on" needs besides brokerd: a control plane (the
    console's database, provisioned once per sitting by ``bench/tenancy.py``:
    a tenant with 20 ACL rules, the one that allows the benchmark's topics
    last) and a redis-server for the cluster bus, on CPU 1 with the
    generator (a one-node cluster barely uses it), restarted with each run."""

    RULES = [{"topic": f"other/{i}/#", "action": "both", "allow": i % 2 == 0} for i in range(19)] + [
        {"topic": "bench/#", "action": "both", "allow": True}]

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.env = None
        self.secret = ""
        self.redis = None

    def provision(self) -> None:
        if self.env is None:
            from tenancy import console  # (bench/tenancy.py imports this module)

            secrets_, env = console(self.tmp, {"slug": "bench", "devices": 1, "rules": self.RULES})
            self.secret = secrets_["d0"]
            self.env = {**env, "BROKERD_CLUSTER_SECRET": secrets.token_hex(32)}

    def start_redis(self) -> int:
        port = free_port()
        self.redis = subprocess.Popen(["taskset", "-c", "1", shutil.which("redis-server") or "/usr/bin/redis-server",
                                       "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
                                       "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(port)
        return port

    def stop_redis(self) -> None:
        if self.redis is not None and self.redis.poll() is None:
            self.redis.terminate()
            self.redis.wait(10)
        self.redis = None


class Broker:
    def __init__(self, name: str, python: str, tmp: Path, extra: list[str], cpus: str = "0",
                 redis: Redis | None = None, root: Path = ROOT, full: FullFeatures | None = None):
        self.name = name
        self.python = python
        self.tmp = tmp
        self.extra = extra
        self.cpus = cpus
        self.redis = redis
        self.workers = workers_of(extra) if name.startswith("brokerd") else None
        self.root = root                  # the checkout whose brokerd runs
        self.full = full
        self.proc = None
        self.port = 0
        self.hbase = None
        self.env = None
        self.gen_args: list[str] = []     # the generator's extra arguments (credentials)

    def command(self) -> list[str]:
        if self.name == "brokerd-full":
            full = self.full
            full.provision()
            self.env = full.env
            self.gen_args = ["--username", "bench/d0", f"--password={full.secret}"]   # a secret may begin with "-"
            return [self.python, "-m", "brokerd", "--log-level", "warning", "--listen",
                    f"mqtt://127.0.0.1:{self.port}", "--store", f"sqlite:///{self.tmp}/brokerd-{time.time_ns()}.db",
                    "--admin", f"127.0.0.1:{free_port()}", "--cluster", f"redis://127.0.0.1:{full.start_redis()}/0",
                    "--node-id", "bench", *self.extra]
        if self.name.startswith("brokerd"):
            store = "memory://"
            if self.name == "brokerd-sqlite":
                store = f"sqlite:///{self.tmp}/brokerd-{time.time_ns()}.db"
            elif self.name == "brokerd-hbase":
                self.hbase = HBaseDouble(self.python, self.tmp)
                store = f"hbase://127.0.0.1:{self.hbase.start()}?table_prefix=bench"
            cluster = []
            if self.workers:                # N members of a cluster: its bus, and a store they share
                if store == "memory://":
                    store = f"sqlite:///{self.tmp}/brokerd-{time.time_ns()}.db"
                cluster = ["--cluster", f"redis://127.0.0.1:{self.redis.port}/0?prefix=b{time.time_ns()}"]
            return [self.python, "-m", "brokerd", "--allow-anonymous", "--log-level", "warning",
                    "--listen", f"mqtt://127.0.0.1:{self.port}", "--store", store, *cluster, *self.extra]
        if self.name.startswith("mosquitto"):
            conf = self.tmp / "mosquitto.conf"
            state = self.tmp / f"mosq-{time.time_ns()}"
            state.mkdir()
            conf.write_text(MOSQUITTO_CONF.format(port=self.port, tmp=state,
                                                  persistence="true" if self.name == "mosquitto-persist" else "false"))
            return [shutil.which("mosquitto") or "/usr/sbin/mosquitto", "-c", str(conf)]
        if self.name == "amqtt":
            peers = DEFAULT_MQTTBENCH.parent / "peers"
            conf = self.tmp / "amqtt.yaml"
            conf.write_text((peers / "amqtt_broker.yaml").read_text().replace("127.0.0.1:18832",
                                                                               f"127.0.0.1:{self.port}"))
            return [amqtt_python(), str(peers / "amqtt_launch.py"), str(conf), "--uvloop"]
        raise ValueError(self.name)

    def start(self) -> None:
        self.port = free_port()
        log_path = self.tmp / f"{self.name}.log"
        start = log_path.stat().st_size if log_path.exists() else 0
        cmd = self.command()        # first: brokerd-full's command provisions the control plane and sets self.env
        env = self.env if self.env is not None else dict(
            os.environ, BROKERD_CLUSTER_SECRET=os.environ.get("BROKERD_CLUSTER_SECRET") or "b" * 32)
        with open(log_path, "a") as log:
            self.proc = subprocess.Popen(["taskset", "-c", self.cpus, *cmd], cwd=self.root, stdout=log,
                                         stderr=log, start_new_session=True, env=env)
        wait_port(self.port)
        if self.workers:        # every worker listens (and can reach the others) once the supervisor says so
            deadline = time.monotonic() + 60
            while b"brokerd ready" not in log_path.read_bytes()[start:]:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(f"brokerd --workers {self.workers} did not start: see {log_path}")
                time.sleep(0.1)
            time.sleep(1.0)
        time.sleep(0.5)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.hbase is not None:
            self.hbase.stop()
        if self.full is not None:
            self.full.stop_redis()


def get(d: dict, path: str):
    for part in path.split("."):
        if not isinstance(d, dict) or part not in d:
            return None
        d = d[part]
    return d


def run_one(broker: Broker, args: str, mqttbench: Path, python: str, persistent: bool = False,
            gen_cpus: str = "1") -> dict:
    broker.start()
    try:
        gen = [str(mqttbench)]
        if persistent:
            gen = [str(HERE / "mqttbench_persistent.py"), "--mqttbench", str(mqttbench)]
        elif broker.workers:          # the broker's CPU and RSS: the supervisor and its workers
            gen = [str(HERE / "mqttbench_tree.py"), "--mqttbench", str(mqttbench)]
        cmd = ["taskset", "-c", gen_cpus, python, *gen, *args.split(), "--port", str(broker.port),
               "--broker-pid", str(broker.proc.pid), "--json", *broker.gen_args]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
        if not lines:
            return {"error": (out.stderr or out.stdout)[-2000:]}
        return json.loads(lines[-1])
    finally:
        broker.stop()


def fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        if abs(v) >= 10:
            return f"{v:.1f}"
        return f"{v:.3g}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def cpu_us_per_message(res: dict) -> float | None:
    """The broker's CPU per delivered message (µs): the figure that does not
    depend on how fast the generator can go."""
    cpu, rate = res.get("broker_cpu_pct"), res.get("recv_rate")
    if not cpu or not rate:
        return None
    return cpu / 100.0 / rate * 1e6


CPU_US = ("__cpu_us", "broker CPU µs per message", "lower")


def value(res: dict, path: str):
    return cpu_us_per_message(res) if path == CPU_US[0] else get(res, path)


def table(results: dict, brokers: list[str], scenarios: list[str]) -> str:
    """Markdown: scenario, metric, median per broker, the ratio of each brokerd
    variant to Mosquitto, and of each further variant to the first."""
    bds = [b for b in brokers if b.startswith("brokerd")]
    mq_name = next((b for b in brokers if b.startswith("mosquitto")), None)
    pairs = [(b, mq_name) for b in bds if mq_name] + [(b, bds[0]) for b in bds[1:]]
    head = "| scenario | metric | " + " | ".join(brokers) + "".join(f" | {a} / {b}" for a, b in pairs) + " |"
    rows = [head, "|" + "---|" * (len(brokers) + len(pairs) + 2)]
    for name in scenarios:
        _, title, metrics = SCENARIOS[name]
        if name != "d10":
            metrics = [*metrics, CPU_US]
        for path, label, _better in metrics:
            meds = {}
            for b in brokers:
                vals = [value(r, path) for r in results.get((name, b), [])]
                vals = [v for v in vals if v is not None]
                meds[b] = statistics.median(vals) if vals else None
            ratios = []
            for a, b in pairs:
                x, y = meds.get(a), meds.get(b)
                ratios.append(f"{x / y:.2f}x" if x is not None and y else "-")
            rows.append(f"| {name}: {title} | {label} | " + " | ".join(fmt(meds[b]) for b in brokers)
                        + "".join(f" | {r}" for r in ratios) + " |")
    return "\n".join(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("scenarios", nargs="*",
                    help=f"any of {', '.join(SCENARIOS)} (default: {' '.join(DEFAULT_SCENARIOS)})")
    ap.add_argument("--brokers", default="brokerd,mosquitto", help=f"comma-separated, of {', '.join(BROKERS)}")
    ap.add_argument("--runs", type=int, default=1, help="runs per scenario and broker; the table shows medians")
    ap.add_argument("--mqttbench", default=os.environ.get("MQTTBENCH", str(DEFAULT_MQTTBENCH)))
    ap.add_argument("--python", default=sys.executable, help="interpreter for brokerd and the generator")
    ap.add_argument("--brokerd-python", help="interpreter for brokerd alone (default: --python), e.g. another "
                                             "build of CPython under the same generator")
    ap.add_argument("--out", default=str(ROOT / "var" / "bench" / "results.jsonl"))
    ap.add_argument("--brokerd-arg", action="append", default=[], help="extra flag for brokerd (repeatable)")
    ap.add_argument("--workers", metavar="N",
                    help="brokerd --workers N (a Redis and an SQLite store are started for it); same as "
                         "--brokerd-arg=--workers=N")
    ap.add_argument("--broker-cpus", default="0", help="taskset cores of the broker (default 0)")
    ap.add_argument("--gen-cpus", default="1", help="taskset cores of the load generator (default 1)")
    ap.add_argument("--brokerd-root", default=str(ROOT),
                    help="the checkout whose brokerd runs (bench/ab.py: two revisions under one harness)")
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args(argv)
    if args.list:
        for name, (cmd, title, _) in SCENARIOS.items():
            print(f"{name:5} {title}: mqttbench.py {cmd}")
        return 0
    mqttbench = Path(args.mqttbench)
    if not mqttbench.exists():
        print(f"mqttbench.py not found at {mqttbench} (set --mqttbench or MQTTBENCH)", file=sys.stderr)
        return 2
    if not shutil.which("taskset"):
        print("taskset (util-linux) is required to pin broker and generator to different cores", file=sys.stderr)
        return 2
    if os.cpu_count() and os.cpu_count() < 2:
        print("warning: fewer than 2 CPUs; broker and generator will share a core", file=sys.stderr)
    scenarios = args.scenarios or DEFAULT_SCENARIOS
    unknown = [s for s in scenarios if s not in SCENARIOS]
    if unknown:
        ap.error(f"unknown scenario(s): {', '.join(unknown)}")
    brokers = args.brokers.split(",")
    if any(b not in BROKERS for b in brokers):
        ap.error(f"unknown broker in {args.brokers!r}: use {', '.join(BROKERS)}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    results: dict = {}
    if args.workers:
        args.brokerd_arg = [*args.brokerd_arg, f"--workers={args.workers}"]
    with tempfile.TemporaryDirectory(prefix="brokerd-bench-") as tmp:
        redis = Redis(args.broker_cpus, Path(tmp)) if workers_of(args.brokerd_arg) else None
        if redis is not None:
            redis.start()
        try:
            bench_all(args, scenarios, brokers, mqttbench, out, results, Path(tmp), redis, FullFeatures(Path(tmp)))
        finally:
            if redis is not None:
                redis.stop()
    print()
    print(table(results, brokers, scenarios))
    print(f"\nraw results appended to {out}")
    return 0


def bench_all(args, scenarios, brokers, mqttbench, out, results, tmp, redis, full) -> None:
    for name in scenarios:
        cmd = SCENARIOS[name][0]
        for run in range(args.runs):
            for b in brokers:
                broker = Broker(b, args.brokerd_python or args.python, tmp,
                                args.brokerd_arg if b.startswith("brokerd") else [],
                                args.broker_cpus, redis, Path(args.brokerd_root), full)
                t0 = time.time()
                res = run_one(broker, cmd, mqttbench, args.python, name in PERSISTENT, args.gen_cpus)
                res.update(scenario=name, broker=b, run=run, started=t0, args=cmd)
                results.setdefault((name, b), []).append(res)
                with out.open("a") as fh:
                    fh.write(json.dumps(res) + "\n")
                summary = ", ".join(f"{label}={fmt(get(res, path))}" for path, label, _ in SCENARIOS[name][2])
                cpu = res.get("broker_cpu_pct")
                per = f", broker CPU {cpu}% = {cpu / 100 / res['recv_rate'] * 1e6:.2f} µs/msg" if cpu and res.get(
                    "recv_rate") else ""
                print(f"{name} {b} run {run + 1}: {summary}{per}" + (f" ERROR {res['error'][-300:]}" if "error" in res
                                                                   else ""), flush=True)


if __name__ == "__main__":
    sys.exit(main())
