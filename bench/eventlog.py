#!/usr/bin/env python3
"""What a node pays to read another node's cluster event log entries (issue 18).

Every node reads every other node's entries: on ``--workers 6`` each
CONNECT's route is read and applied by five workers. This driver hands the
real ``Bus.read_events`` the reply Redis gives an XREAD (entries as nodes
write them, ``n`` then ``e``; the reply comes from a stand-in for the bus's
Redis line, so no socket and no Redis are involved) and runs the real
``EventLog.read`` over it into a ``ClusterRoutes``, then prints the Python
cost per entry of each step. Nothing here asserts a speed; it is a
measuring tool.

    .venv/bin/python bench/eventlog.py                      # 20,000 route entries, 1,000 per read
    .venv/bin/python bench/eventlog.py --entries 100000 --per-read 500
"""

import argparse
import asyncio
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from brokerd.cluster.bus import Bus, _dumps  # noqa: E402
from brokerd.cluster.eventlog import EventLog  # noqa: E402
from brokerd.cluster.routes import ClusterRoutes  # noqa: E402


class ReplayLine:
    """Stands in for the bus's XREAD line: each call answers with the next prepared reply."""

    def __init__(self, replies):
        self.replies = replies

    async def call(self, *args):
        return self.replies.pop() if self.replies else {}


class NotFenced:
    fenced = False


def replies(entries: int, per_read: int, writer: str) -> list:
    """XREAD replies (RESP3: {stream: [[id, [field, value, ...]], ...]}) of route entries, last first."""
    out = []
    for start in range(0, entries, per_read):
        batch = []
        for i in range(start, min(entries, start + per_read)):
            e = {"t": "route", "n": writer, "tn": "bench", "f": f"idle/g0-{i:07d}", "s": 1, "d": 0}
            batch.append([f"1700000000000-{i}".encode(), [b"n", writer.encode(), b"e", _dumps(e).encode()]])
        out.append({b"brokerd:events": batch})
    out.reverse()
    return out


def reader(prepared: list) -> tuple[Bus, EventLog]:
    bus = Bus.__new__(Bus)                  # no connection: read_events only calls the line
    bus._events_in = ReplayLine(prepared)
    bus.k = lambda *parts: "brokerd:events"
    log = EventLog.__new__(EventLog)        # the parts of EventLog that read() uses
    log.id, log.bus, log.routes, log.fence = "host-w0", bus, ClusterRoutes("host-w0"), NotFenced()
    log.epoch, log.applied, log.last_event = 0, None, "0-0"
    return bus, log


async def main(args) -> None:
    reads = -(-args.entries // args.per_read)
    bus, _ = reader(replies(args.entries, args.per_read, "host-w1"))
    t0 = time.perf_counter()
    for _ in range(reads):
        await bus.read_events("0-0", own="host-w0")
    parse = time.perf_counter() - t0
    _, log = reader(replies(args.entries, args.per_read, "host-w1"))
    t0 = time.perf_counter()
    for _ in range(reads):
        await log.read()
    whole = time.perf_counter() - t0
    _, log = reader(replies(args.entries, args.per_read, "host-w0"))
    t0 = time.perf_counter()
    for _ in range(reads):
        await log.read()
    own = time.perf_counter() - t0
    n = args.entries
    print(f"another node's entry: read_events {parse / n * 1e6:.2f} µs, read and applied {whole / n * 1e6:.2f} µs")
    print(f"an entry of its own (passed over unparsed): {own / n * 1e6:.2f} µs")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--entries", type=int, default=20_000)
    ap.add_argument("--per-read", type=int, default=1_000)
    asyncio.run(main(ap.parse_args()))
