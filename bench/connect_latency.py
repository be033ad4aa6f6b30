#!/usr/bin/env python3
"""CONNACK latency of CONNECTs arriving at a steady rate (open loop), per broker.

``bench/conns.py`` measures a connect storm as a closed loop (a fixed number of
CONNECTs in flight): it shows the CPU a CONNECT costs and the rate a broker
keeps up, not how long one device waits for its CONNACK when devices arrive at
their own pace. Here CONNECTs start at exponential intervals (``--rate`` per
second on average, for ``--duration`` seconds, at most 10,000), each on a new connection that
stays open until the end; the time from ``connect()`` to the CONNACK's first
four bytes is recorded, and its percentiles printed per broker and rate:

    .venv/bin/python bench/connect_latency.py --brokers brokerd,mosquitto --rates 200,2000
    .venv/bin/python bench/connect_latency.py --brokers brokerd --workers 2 --broker-cpus 0,1 \\
        --variant gap0=--cluster-claim-gap=0 --variant gap5ms=--cluster-claim-gap=0.005 --runs 2

``--variant NAME=FLAG[,FLAG...]`` runs brokerd once per variant with those extra flags (alternating, each
run in every variant before the next run). The generator is this script (asyncio, uvloop), pinned to
``--gen-cpus``. Nothing here asserts a speed; it is a measuring tool.
"""

import argparse
import asyncio
import json
import random
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import mqttbench_load  # noqa: E402
from run import Broker, Redis  # noqa: E402

# CONNECTs per rate at most, all held to the end: connect() to one address and port has about half the
# ephemeral ports (~14,000 here), and past them some connects waited ~1 s (a p99 of a second for every broker)
MAX_CONNECTS = 10_000


SLOW = 0.5                  # seconds: a CONNACK (or a TCP connect alone) counted as slow


async def probe(port: int, rate: float, duration: float, prefix: str) -> dict:
    pkt_connect = mqttbench_load.load(mqttbench_load.default_path()).pkt_connect    # the shared generator's
    loop = asyncio.get_running_loop()
    latencies: list[float] = []
    slow_tcp = 0                       # CONNECTs whose TCP connect alone took over SLOW
    failures = 0
    writers = []

    async def one(i: int) -> None:
        nonlocal failures, slow_tcp
        t0 = time.perf_counter()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            if time.perf_counter() - t0 > SLOW:
                slow_tcp += 1
            writers.append(writer)
            writer.write(pkt_connect(f"{prefix}-{i}", 60, True, None, None, False))     # 3.1.1, clean
            ack = await asyncio.wait_for(reader.readexactly(4), 10)
        except (TimeoutError, OSError, asyncio.IncompleteReadError):
            failures += 1
            return
        if ack[0] != 0x20 or ack[3] != 0:
            failures += 1
            return
        latencies.append(time.perf_counter() - t0)

    rng = random.Random(1)
    tasks = []
    t = loop.time()
    end = t + duration
    i = 0
    while True:
        t += rng.expovariate(rate)
        if t >= end:
            break
        delay = t - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(one(i)))
        i += 1
    await asyncio.gather(*tasks)
    # closed with a reset, leaving no TIME_WAIT to use up the next run's ephemeral ports
    linger = struct.pack("ii", 1, 0)
    for w in writers:
        w.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
        w.close()
    latencies.sort()
    n = len(latencies)

    def pct(p: float) -> float:
        return round(latencies[min(n - 1, int(p * n))] * 1000, 3) if n else float("nan")

    return {"connects": i, "ok": n, "failed": failures, "p50_ms": pct(0.50), "p90_ms": pct(0.90),
            "p99_ms": pct(0.99), "over_500ms": sum(1 for x in latencies if x > SLOW),
            "tcp_over_500ms": slow_tcp, "mean_ms": round(statistics.fmean(latencies) * 1000, 3) if n else None}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--brokers", default="brokerd", help="comma-separated: brokerd, mosquitto")
    ap.add_argument("--rates", default="200,2000", help="CONNECTs per second, comma-separated")
    ap.add_argument("--duration", type=float, default=5.0,
                    help=f"seconds of CONNECTs per rate, shortened to make at most {MAX_CONNECTS:,}")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--workers", metavar="N", help="brokerd --workers N (with a Redis and an SQLite store)")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=FLAGS",
                    help="a brokerd variant: NAME=FLAG[,FLAG...] (repeatable)")
    ap.add_argument("--broker-cpus", default="0")
    ap.add_argument("--gen-cpus", default="1")
    ap.add_argument("--out", default=str(HERE.parent / "var" / "bench" / "connect_latency.jsonl"))
    args = ap.parse_args(argv)
    variants: list[tuple[str, list[str]]] = []
    for b in args.brokers.split(","):
        if b == "brokerd" and args.variant:
            variants += [(f"brokerd:{v.split('=', 1)[0]}", v.split("=", 1)[1].split(",")) for v in args.variant]
        else:
            variants.append((b, []))
    rates = [float(r) for r in args.rates.split(",")]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows: dict = {}
    with tempfile.TemporaryDirectory(prefix="brokerd-connlat-") as tmp:
        redis = Redis(args.broker_cpus, Path(tmp)) if args.workers else None
        if redis is not None:
            redis.start()
        try:
            for run in range(args.runs):
                for name, flags in variants:
                    base = name.split(":", 1)[0]
                    extra = [*flags, *([f"--workers={args.workers}"] if args.workers and base == "brokerd" else [])]
                    broker = Broker(base, sys.executable, Path(tmp), extra, args.broker_cpus, redis)
                    broker.start()
                    try:
                        for rate in rates:
                            cmd = ["taskset", "-c", args.gen_cpus, sys.executable, "-c",
                                   "import asyncio, json, sys, uvloop; sys.path.insert(0, sys.argv[1]);"
                                   "import connect_latency as c;"
                                   "print(json.dumps(uvloop.run(c.probe(int(sys.argv[2]), float(sys.argv[3]),"
                                   " float(sys.argv[4]), sys.argv[5]))))",
                                   str(HERE), str(broker.port), str(rate),
                                   str(min(args.duration, MAX_CONNECTS / rate)),
                                   f"r{run}-{int(rate)}-{time.time_ns()}"]
                            res = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True,
                                                            timeout=args.duration * 4 + 60).stdout)
                            res.update(broker=name, flags=extra, rate=rate, run=run, started=time.time())
                            rows.setdefault((name, rate), []).append(res)
                            with out.open("a") as fh:
                                fh.write(json.dumps(res) + "\n")
                            print(f"{name} {rate:g}/s run {run + 1}: p50 {res['p50_ms']} ms, p90 {res['p90_ms']}, "
                                  f"p99 {res['p99_ms']}, {res['ok']} of {res['connects']} answered", flush=True)
                    finally:
                        broker.stop()
        finally:
            if redis is not None:
                redis.stop()
    print("\n| broker | CONNECTs/s | p50 ms | p90 ms | p99 ms | failed |\n|---|---|---|---|---|---|")
    for (name, rate), rs in rows.items():
        med = {k: statistics.median(r[k] for r in rs) for k in ("p50_ms", "p90_ms", "p99_ms")}
        print(f"| {name} | {rate:g} | {med['p50_ms']:.2f} | {med['p90_ms']:.2f} | {med['p99_ms']:.2f} | "
              f"{sum(r['failed'] for r in rs)} |")
    print(f"\nraw results appended to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
