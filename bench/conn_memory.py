#!/usr/bin/env python3
"""Where the bytes of an idle connection go: brokerd in this process under
tracemalloc, N real clients (each with one subscription, from
``mqttbench_conns.py`` in a child process), and the Python allocations that
appeared, per connection, by the line of brokerd that made them.

    .venv/bin/python bench/conn_memory.py --clients 5000
    .venv/bin/python bench/conn_memory.py --clients 5000 --no-subscribe -- --max-inflight 16

Flags after ``--`` go to brokerd. What tracemalloc sees is every object and
buffer allocated through Python's allocators, the event loop's transports
included (attributed to the line that runs the loop, ``<loop>``); memory C
code takes from malloc directly (libuv's handles) and the kernel's socket
buffers are not in it -- ``bench/conns.py`` measures the process's RSS.
Not part of the test suite.
"""

import argparse
import asyncio
import gc
import json
import linecache
import os
import subprocess
import sys
import time
import tracemalloc
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))
from run import DEFAULT_MQTTBENCH, free_port  # noqa: E402

from brokerd.config import load  # noqa: E402
from brokerd.server import Server  # noqa: E402


def site(tb) -> str:
    """The innermost frame of brokerd (or of the event loop) that led to an allocation."""
    frames = list(tb)
    if frames and frames[0].filename == __file__:
        frames.reverse()                       # innermost first
    for f in frames:
        if "/brokerd/" in f.filename:
            path = f.filename.split("/brokerd/", 1)[1]
            return f"{path}:{f.lineno}  {linecache.getline(f.filename, f.lineno).strip()[:72]}"
    return "<loop> (transports, sockets: C code called by the event loop)"


def proc_rss() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _sizes(server) -> dict:
    """sys.getsizeof of one connection's objects (the container-held ones: own size only)."""
    conn = next(iter(server.connections), None)
    if conn is None:
        return {}
    ch = conn.channel
    objs = {"transport": conn.transport, "MqttConnection": conn, "Channel": ch, "decoder": ch.decoder,
            "Session": ch.session}
    return {k: sys.getsizeof(v) for k, v in objs.items()}


async def measure(args, brokerd_args) -> dict:
    port = free_port()
    config = load(["--allow-anonymous", "--log-level", "warning", "--listen", f"mqtt://127.0.0.1:{port}",
                   *brokerd_args])
    server = Server(config, asyncio.get_running_loop())
    await server.start()
    gen = None
    try:
        gc.collect()
        types0 = Counter(type(o).__qualname__ for o in gc.get_objects())
        s0 = tracemalloc.take_snapshot()
        rss0 = proc_rss()
        cmd = ["taskset", "-c", args.gen_cpus, sys.executable, str(HERE / "mqttbench_conns.py"),
               "--mqttbench", str(args.mqttbench), "--subscribe", "" if args.no_subscribe else args.subscribe,
               "conns", "--port", str(port), "--clients", str(args.clients), "--duration", str(args.hold),
               "--keepalive", "60", "--settle", "0", "--nofile", "20000", "--json", "--quiet"]
        gen = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        loop = asyncio.get_running_loop()
        line = await loop.run_in_executor(None, gen.stdout.readline)
        connected = json.loads(line)["ok"]
        await asyncio.sleep(1.0)
        gc.collect()
        s1 = tracemalloc.take_snapshot()
        rss1 = proc_rss()
        types = Counter(type(o).__qualname__ for o in gc.get_objects())
        types.subtract(types0)
        by, count = Counter(), Counter()
        for st in s1.compare_to(s0, "traceback"):
            key = site(st.traceback)
            by[key] += st.size_diff
            count[key] += st.count_diff
        return {"connected": connected, "by": by, "count": count, "rss": rss1 - rss0,
                "connections": len(server.connections),
                "types": types, "sizes": _sizes(server)}
    finally:
        if gen is not None:
            gen.terminate()
            await asyncio.get_running_loop().run_in_executor(None, gen.wait)
        await server.stop(2.0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=5000)
    ap.add_argument("--subscribe", default="bench/conns/{}/cmd", help="each client's topic filter ({} = its id)")
    ap.add_argument("--no-subscribe", action="store_true")
    ap.add_argument("--hold", type=float, default=60.0, help="seconds the generator holds (it is stopped sooner)")
    ap.add_argument("--gen-cpus", default="1")
    ap.add_argument("--depth", type=int, default=30, help="tracemalloc frames")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--mqttbench", default=os.environ.get("MQTTBENCH", str(DEFAULT_MQTTBENCH)))
    ap.add_argument("brokerd_args", nargs="*", help="after --: flags for brokerd")
    args = ap.parse_args(argv)
    tracemalloc.start(args.depth)
    t0 = time.monotonic()
    try:
        import uvloop
        factory = uvloop.new_event_loop
    except ImportError:
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        res = runner.run(measure(args, args.brokerd_args))
    n = res["connected"] or 1
    total = sum(res["by"].values())
    print(f"{res['connected']} connections ({res['connections']} open at the broker), "
          f"{'no subscription' if args.no_subscribe else 'one subscription each'}, {time.monotonic() - t0:.0f} s")
    print(f"Python allocations: {total / n:,.0f} bytes per connection "
          f"(process RSS under tracemalloc: {res['rss'] / n:,.0f})")
    print(f"{'bytes':>8} {'objects':>7}  where (per connection)")
    for key, size in res["by"].most_common(args.top):
        if abs(size) < n:
            break
        print(f"{size / n:8.1f} {res['count'][key] / n:7.2f}  {key}")
    print("gc-tracked objects per connection, by type: " + ", ".join(
        f"{t} {c / n:.2f}" for t, c in res["types"].most_common(12) if c >= n / 2))
    print("sizes of one connection's objects: " + ", ".join(f"{k} {v}" for k, v in res["sizes"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
