#!/usr/bin/env python3
"""Soak: one brokerd node under a long mixed load, its RSS, file descriptors
and event-loop lag sampled from the admin API (issue #10; not in CI).

The load, all on loopback, bounded in time and count:
- churn: CHURN clients a second connect (half MQTT 3.1.1 clean, half with a
  persistent session), subscribe, publish, and disconnect -- some abruptly;
- persistent sessions: SESSIONS devices with a stored session reconnect in
  turn and collect the QoS 1 messages queued for them while they were away;
- retained: a publisher sets, replaces and clears retained messages on
  RETAINED topics;
- a steady stream: PAIRS publisher/subscriber pairs at RATE msg/s, QoS 0/1.

Broker on CPU 0, this generator on CPU 1 (``taskset``). Every INTERVAL
seconds a sample (RSS, fds, loop lag, connections, sessions, subscriptions,
retained, queued, in-flight and dropped messages) goes to
``var/soak-<time>.jsonl``; at the end a summary with each curve's first,
last and highest value and its slope over the second half.

    .venv/bin/python bench/soak.py --minutes 30
"""

import argparse
import asyncio
import itertools
import json
import os
import random
import secrets
import statistics
import struct
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from proctree import stop  # noqa: E402
from run import free_port, wait_port  # noqa: E402

# ------------------------------------------------------------------ a minimal MQTT 3.1.1 client


def _str(s: str) -> bytes:
    b = s.encode()
    return struct.pack("!H", len(b)) + b


def _packet(first: int, body: bytes) -> bytes:
    n, out = len(body), bytearray([first])
    while True:
        byte, n = n % 128, n // 128
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out) + body


class Client:
    def __init__(self, client_id: str, clean: bool = True):
        self.id, self.clean = client_id, clean
        self.reader = self.writer = None
        self.received = 0
        self.session_present = False
        self._ids = itertools.cycle(range(1, 65536))
        self._task = self._pinger = None

    async def connect(self, port: int) -> "Client":
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", port)
        flags = 0x02 if self.clean else 0x00
        self.writer.write(_packet(0x10, _str("MQTT") + bytes([4, flags]) + struct.pack("!H", 60) + _str(self.id)))
        first, body = await self._read()
        if first >> 4 != 2 or body[1] != 0:
            raise ConnectionError(f"CONNACK {body!r}")
        self.session_present = bool(body[0] & 1)
        self._task = asyncio.create_task(self._pump())
        self._pinger = asyncio.create_task(self._ping())
        return self

    async def _ping(self):
        # Keep Alive is 60 s: a client that only receives (a QoS 0 subscriber
        # sends nothing back) must ping, or the broker rightly closes it at 90 s
        try:
            while True:
                await asyncio.sleep(30)
                self.writer.write(b"\xc0\x00")
        except (ConnectionError, OSError):
            pass

    async def _read(self):
        first = (await self.reader.readexactly(1))[0]
        mult, length = 1, 0
        while True:
            b = (await self.reader.readexactly(1))[0]
            length += (b & 0x7F) * mult
            mult *= 128
            if not b & 0x80:
                break
        return first, await self.reader.readexactly(length)

    async def _pump(self):
        try:
            while True:
                first, body = await self._read()
                if first >> 4 == 3:                       # PUBLISH: ack QoS 1
                    self.received += 1
                    if (first >> 1) & 3 == 1:
                        tlen = struct.unpack("!H", body[:2])[0]
                        self.writer.write(b"\x40\x02" + body[2 + tlen:4 + tlen])
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass

    def subscribe(self, topic: str, qos: int) -> None:
        self.writer.write(_packet(0x82, struct.pack("!H", next(self._ids)) + _str(topic) + bytes([qos])))

    def publish(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False) -> None:
        first = 0x30 | (qos << 1) | (1 if retain else 0)
        body = _str(topic) + (struct.pack("!H", next(self._ids)) if qos else b"") + payload
        self.writer.write(_packet(first, body))

    async def close(self, abrupt: bool = False) -> None:
        if self.writer is None:
            return
        if not abrupt:
            self.writer.write(b"\xe0\x00")
        try:
            await self.writer.drain()
        except (ConnectionError, OSError):
            pass
        self.writer.close()
        for task in (self._task, self._pinger):
            if task:
                task.cancel()


# ------------------------------------------------------------------ the load


async def churn(port, per_second, deadline, stats):
    n = 0
    while time.monotonic() < deadline:
        t0 = time.monotonic()
        clients = []
        for _ in range(per_second):
            n += 1
            c = Client(f"churn-{n % 5000}", clean=n % 2 == 0)
            try:
                await c.connect(port)
            except (ConnectionError, OSError) as exc:
                stats["churn_errors"] += 1
                stats["last_error"] = str(exc)
                continue
            # a device subscribes to the same filter each time it connects: a persistent
            # session that took a new one on every visit would collect up to 97 of them,
            # and its share of the traffic (and its offline queue) would grow for the
            # whole run instead of reaching a steady state
            c.subscribe(f"churn/{n % 5000 % 97}/#", 1)
            c.publish(f"churn/{n % 97}/x", b"c" * 64, qos=1)
            clients.append(c)
        await asyncio.sleep(0.2)
        for i, c in enumerate(clients):
            await c.close(abrupt=i % 5 == 0)
        stats["churn_connects"] += len(clients)
        await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - t0)))


async def sessions(port, count, deadline, stats):
    pub = await Client(f"sess-pub-{secrets.token_hex(3)}").connect(port)
    # every device subscribes once, then comes and goes
    for i in range(count):
        c = await Client(f"sess-{i}", clean=False).connect(port)
        c.subscribe(f"dev/{i}/cmd", 1)
        await asyncio.sleep(0.01)
        await c.close()
    i = 0
    while time.monotonic() < deadline:
        for _ in range(20):                           # queue a few messages for devices that are away
            pub.publish(f"dev/{random.randrange(count)}/cmd", b"s" * 200, qos=1)
        c = Client(f"sess-{i % count}", clean=False)
        try:
            await c.connect(port)
            stats["sessions_present"] += c.session_present
            await asyncio.sleep(0.3)
            stats["session_messages"] += c.received
            await c.close()
        except (ConnectionError, OSError) as exc:
            stats["session_errors"] += 1
            stats["last_error"] = str(exc)
        i += 1
        await asyncio.sleep(0.1)
    await pub.close()


async def retained(port, topics, deadline):
    pub = await Client(f"ret-{secrets.token_hex(3)}").connect(port)
    n = 0
    while time.monotonic() < deadline:
        t = f"ret/{n % topics}"
        pub.publish(t, b"" if n % 7 == 0 else b"r" * 100, qos=1, retain=True)    # every 7th clears
        n += 1
        if n % 50 == 0:
            await pub.writer.drain()
            await asyncio.sleep(0.05)
    await pub.close()


async def pairs(port, count, rate, deadline, stats):
    subs, pubs = [], []
    for i in range(count):
        s = await Client(f"pair-sub-{i}").connect(port)
        s.subscribe(f"pair/{i}", 1)
        subs.append(s)
        pubs.append(await Client(f"pair-pub-{i}").connect(port))
    await asyncio.sleep(0.5)
    sent, t0 = 0, time.monotonic()
    while time.monotonic() < deadline:
        for i, p in enumerate(pubs):
            p.publish(f"pair/{i}", b"p" * 256, qos=sent // count % 2)      # each pair QoS 0 and 1 in turn
            sent += 1
        ahead = t0 + sent / rate - time.monotonic()
        if ahead > 0:
            await asyncio.sleep(ahead)
        else:
            await asyncio.sleep(0)
    stats["pairs_sent"] = sent
    stats["pairs_received"] = sum(s.received for s in subs)
    for c in subs + pubs:
        await c.close()


def sample(admin: str, token: str) -> dict:
    req = urllib.request.Request(f"http://{admin}/api/v1/metrics", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        doc = json.load(resp)
    node = doc["nodes"][0] if isinstance(doc.get("nodes"), list) else next(iter(doc["nodes"].values()))
    row = {k: node.get(k) for k in ("memory_rss", "open_fds", "loop_lag", "connections", "subscriptions", "queued",
                                    "inflight", "retained", "cpu_seconds")}
    dropped = node.get("dropped") or {}
    row["no_subscribers"] = dropped.get("no_subscribers", 0)          # the retained topics nobody reads
    row["dropped"] = sum(v for k, v in dropped.items() if k != "no_subscribers")     # queue_full, expired, ...
    req = urllib.request.Request(f"http://{admin}/api/v1/clients?per_page=1",
                                 headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        row["sessions"] = json.load(resp)["total"]                    # connected + offline persistent
    return row


async def sampler(admin, token, interval, deadline, out, rows):
    t0 = time.monotonic()
    while time.monotonic() < deadline:
        try:
            row = {"t": round(time.monotonic() - t0, 1), **await asyncio.to_thread(sample, admin, token)}
        except Exception as exc:           # the node not answering is itself a finding
            row = {"t": round(time.monotonic() - t0, 1), "error": str(exc)}
        rows.append(row)
        out.write(json.dumps(row) + "\n")
        out.flush()
        await asyncio.sleep(interval)


def slope_per_hour(rows, key):
    pts = [(r["t"], r[key]) for r in rows[len(rows) // 2:] if r.get(key) is not None]
    if len(pts) < 3:
        return None
    mt, mv = statistics.fmean(t for t, _ in pts), statistics.fmean(v for _, v in pts)
    den = sum((t - mt) ** 2 for t, _ in pts)
    return sum((t - mt) * (v - mv) for t, v in pts) / den * 3600 if den else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--churn", type=int, default=20, help="connections a second (default 20)")
    ap.add_argument("--sessions", type=int, default=500)
    ap.add_argument("--retained", type=int, default=2000)
    ap.add_argument("--pairs", type=int, default=50)
    ap.add_argument("--rate", type=float, default=2000, help="msg/s of the steady pairs")
    ap.add_argument("--interval", type=float, default=10)
    ap.add_argument("--store", default=None, help="brokerd --store (default: a fresh SQLite file)")
    args = ap.parse_args()

    var = ROOT / "var"
    var.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    store = args.store or f"sqlite:///{var / f'soak-{stamp}.sqlite3'}"
    port, admin_port = free_port(), free_port()
    token = secrets.token_urlsafe(24)
    env = dict(os.environ, BROKERD_ADMIN_TOKEN=token, PYTHONUNBUFFERED="1")
    broker = subprocess.Popen(["taskset", "-c", "0", sys.executable, "-m", "brokerd", "--allow-anonymous",
                               "--listen", f"mqtt://127.0.0.1:{port}", "--admin", f"127.0.0.1:{admin_port}",
                               "--store", store, "--sys-interval", "10", "--log-level", "warning"],
                              cwd=ROOT, env=env)
    os.sched_setaffinity(0, {1})
    try:
        wait_port(port)
        wait_port(admin_port)
        deadline = time.monotonic() + args.minutes * 60
        stats = dict.fromkeys(("churn_connects", "churn_errors", "sessions_present", "session_messages",
                               "session_errors"), 0)
        rows: list[dict] = []
        path = var / f"soak-{stamp}.jsonl"
        with open(path, "w") as out:
            async def run():
                await asyncio.gather(
                    sampler(f"127.0.0.1:{admin_port}", token, args.interval, deadline, out, rows),
                    churn(port, args.churn, deadline, stats), sessions(port, args.sessions, deadline, stats),
                    retained(port, args.retained, deadline), pairs(port, args.pairs, args.rate, deadline, stats))
            asyncio.run(run())
        ok = [r for r in rows if "error" not in r]
        summary = {"minutes": args.minutes, "samples": len(rows), "failed_samples": len(rows) - len(ok),
                   "broker_alive": broker.poll() is None, **stats}
        for key, unit, scale in (("memory_rss", "MB", 1e6), ("open_fds", "", 1), ("loop_lag", "ms", 1e-3),
                                 ("sessions", "", 1), ("subscriptions", "", 1), ("queued", "", 1),
                                 ("inflight", "", 1), ("dropped", "", 1)):
            vals = [r[key] for r in ok if r.get(key) is not None]
            if vals:
                slope = slope_per_hour(ok, key)
                summary[key] = {"first": round(vals[0] / scale, 2), "last": round(vals[-1] / scale, 2),
                                "max": round(max(vals) / scale, 2), "median": round(statistics.median(vals) / scale, 2),
                                f"slope_2nd_half_per_hour{('_' + unit) if unit else ''}":
                                    None if slope is None else round(slope / scale, 2)}
        print(json.dumps(summary, indent=2))
        print(f"samples: {path}")
        return 0 if summary["broker_alive"] and not summary["failed_samples"] else 1
    finally:
        stop(broker)


if __name__ == "__main__":
    sys.exit(main())
