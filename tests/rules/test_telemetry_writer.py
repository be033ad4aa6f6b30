"""The telemetry writer's own rules (store rules' rows, before the lake): the
byte bounds of its buffer (drop-oldest, per tenant and per node, counted on
the rule), a failed write kept for the next round, the landed file's layout.
The end-to-end behaviour (real brokerd, paho, Spark) is in
tests/reports/test_telemetry.py."""

import asyncio
import json
import sys

from brokerd.integrations.telemetry import TelemetryWriter
from brokerd.rules.actions import Store, TelemetryRecord
from brokerd.rules.context import Context


class State:
    """A rule's counters, as the writer sees them (RuleState's fields)."""

    def __init__(self, rid=1):
        self.id = rid
        self.stored = self.dropped = self.failed = 0
        self.last_error = None

    def fail(self, error, wall):
        self.failed += 1
        self.last_error = error


def record(n: int, size=1000) -> TelemetryRecord:
    rec = TelemetryRecord("temps", 1_764_100_000_000 + n, f"d{n}", "sensors/x/temp", json.dumps({"n": n}))
    rec.size = size                     # what the buffer counts it as (data + topic + client id + 96)
    return rec


def queued(w, tenant):
    return [json.loads(j.item.data)["n"] for j in w.queues.get(tenant, ())]


def test_a_full_tenant_buffer_drops_its_own_oldest_rows_and_counts_them(tmp_path):
    w = TelemetryWriter(str(tmp_path), "n1", node_bytes=100_000, tenant_bytes=3000)
    a, b = State(1), State(2)
    for n in range(5):
        w.submit("acme", record(n), a)
    w.submit("globex", record(9), b)
    assert queued(w, "acme") == [2, 3, 4] and queued(w, "globex") == [9]
    assert (a.dropped, a.failed, b.dropped) == (2, 2, 0) and "tenant's telemetry buffer was full" in a.last_error


def test_a_full_node_buffer_drops_the_oldest_of_the_biggest_tenant(tmp_path):
    w = TelemetryWriter(str(tmp_path), "n1", node_bytes=4000, tenant_bytes=3000)
    a, b = State(1), State(2)
    for n in range(3):
        w.submit("acme", record(n), a)
    w.submit("globex", record(10), b)
    w.submit("globex", record(11), b)
    assert queued(w, "acme") == [1, 2] and queued(w, "globex") == [10, 11]
    assert (a.dropped, b.dropped) == (1, 0) and w.total == 4000
    w.submit("tiny", record(20, size=100_000), State(3))              # larger than a tenant's bound
    assert "tiny" not in w.queues and w.dropped == 2


def test_rows_land_as_json_lines_per_date_and_a_failed_write_is_tried_again(tmp_path):
    w = TelemetryWriter(str(tmp_path / "usage"), "n1", node_bytes=100_000, tenant_bytes=50_000)
    s = State(7)
    rec = Store({"dataset": "temps"}).message({"t": 31.5, "room": "k\ud800"}, Context(
        "message.publish", "sensors/k/temp", b"", "dev-1", timestamp=1_764_115_200_250), None)
    (tmp_path / "usage").write_text("not a directory")                # the write fails: kept
    w.submit("acme", rec, s)
    asyncio.run(w.flush())
    assert (s.stored, s.dropped, w.total) == (0, 0, rec.size)
    (tmp_path / "usage").unlink()
    asyncio.run(w.flush())
    assert (s.stored, w.total) == (1, 0)
    [f] = (tmp_path / "usage" / "telemetry" / "date=2025-11-26").glob("n1-*.jsonl")
    row = json.loads(f.read_text())
    assert row == {"tenant": "acme", "dataset": "temps", "rule": 7, "ts": 1_764_115_200.25, "client_id": "dev-1",
                   "topic": "sensors/k/temp", "node": "n1", "data": row["data"]}
    assert json.loads(row["data"])["t"] == 31.5


def test_a_filling_queue_is_written_before_the_interval(tmp_path):
    """Half a tenant's bound queued: written at once, not after --rules-store-interval (60 s here),
    so a busy tenant's rows reach the disk instead of being dropped."""
    async def scene():
        w = TelemetryWriter(str(tmp_path / "usage"), "n1", node_bytes=1_000_000, tenant_bytes=4000, interval=60)
        s = State(1)
        w.start()
        try:
            w.submit("acme", record(1), s)
            await asyncio.sleep(0.2)
            assert s.stored == 0                       # a quarter of the tenant's bound: waits for the interval
            w.submit("acme", record(2), s)             # half of it: written now
            for _ in range(100):
                if s.stored == 2:
                    break
                await asyncio.sleep(0.05)
            assert (s.stored, s.dropped) == (2, 0)
        finally:
            await w.stop()

    asyncio.run(scene())


def test_a_failing_write_waits_for_the_interval_even_with_a_full_queue(tmp_path):
    """A write that failed put its rows back through submit(), which -- the queue being over half
    its bound -- asked for a write at once: a disk that refused writes was retried in a tight loop
    (a thread, a failed write and a warning per round, thousands a second) instead of every
    --rules-store-interval seconds as the log said."""
    async def scene():
        (tmp_path / "usage").write_text("not a directory")           # every write fails
        w = TelemetryWriter(str(tmp_path / "usage"), "n1", node_bytes=1_000_000, tenant_bytes=4000, interval=1)
        attempts = []
        write = w.write
        w.write = lambda lines, wall: (attempts.append(wall), write(lines, wall))
        s = State(1)
        w.start()
        try:
            w.submit("acme", record(1), s)
            w.submit("acme", record(2), s)             # half the tenant's bound: a write at once, which fails
            await asyncio.sleep(1.5)
            assert 1 <= len(attempts) <= 3, f"{len(attempts)} write attempts in 1.5 s with a 1 s interval"
            assert s.stored == 0 and queued(w, "acme") == [1, 2]
        finally:
            w._task.cancel()

    asyncio.run(scene())


def test_the_buffer_bounds_what_rows_hold_in_memory_not_their_characters(tmp_path):
    """A row's size was its characters: rows of 4-byte characters (emoji,
    CJK beyond the BMP) held four times the tenant's bound in memory. Now
    the buffer counts the bytes each row's texts hold."""
    w = TelemetryWriter(str(tmp_path), "n1", node_bytes=10_000_000, tenant_bytes=100_000)
    s = State(3)
    for n in range(200):
        w.submit("acme", Store({"dataset": "temps"}).message({"n": n, "mood": "\U0001F600" * 2000}, Context(
            "message.publish", "sensors/\U0001F600/temp", b"", "dev-\U0001F600", timestamp=1_764_115_200_250), None), s)
    held = sum(sys.getsizeof(j.item.data) + sys.getsizeof(j.item.topic) + sys.getsizeof(j.item.clientid)
               for j in w.queues["acme"])
    assert s.dropped > 0
    assert held <= 100_000, f"{held} bytes held for a tenant bound of 100,000"
