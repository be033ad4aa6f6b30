"""The usage log the Spark reports read (issue #8): JSON Lines files under
``--usage-dir``, written without slowing the per-message path.

    <dir>/connections/date=YYYY-MM-DD/<node>-<YYYYMMDDHHMM>.jsonl
        one row per closed connection: tenant, client_id, username, node,
        protocol, ip, connected_at, disconnected_at (epoch seconds), msgs and
        bytes in/out, reason
    <dir>/traffic/date=YYYY-MM-DD/<node>-<YYYYMMDDHHMM>.jsonl
        per minute, tenant and topic: ts (start of the minute), msgs_in_q0..2,
        bytes_in, msgs_out, bytes_out, dropped_queue_full, dropped_expired,
        dropped_no_subscribers, acl_denied, quota_rejected, auth_failures
        (tenant-wide figures such as auth failures have topic "")

In memory the minute's traffic is a dict per tenant of small lists per topic
(two dict lookups and a few integer additions per PUBLISH); once a minute
(on the wall clock) the rows go to a thread that writes each file under a
temporary name and renames it, so a reader never sees half a file. Between
those, every ``--usage-checkpoint`` seconds (5) a copy of what the minute has
counted so far replaces the minute's files the same way (each file holds the
whole minute so far, never a part to be added to another), so a SIGKILL loses
at most the seconds since the last checkpoint; the reports' compaction takes a
minute's files two minutes after it ended, when the last write has happened. A tenant
with more than MAX_TOPICS distinct topics in a minute, or more than
MAX_TOPIC_BYTES of them (or the node past MAX_NODE_TOPIC_BYTES), has the
rest counted under "(other)": a topic may be 64 KiB, and 10,000 of those
would hold 640 MB until the minute is written (issue 16). Connections
still open when the node stops are written on the way out (reason "server
shutdown"); a crash loses the seconds since the last checkpoint, and the
rows of the connections still open then (their messages are in the traffic
rows; their connect and its duration are not written).
"""

import asyncio
import contextlib
import datetime
import json
import logging
import os
import threading
import time
from pathlib import Path

from ..routing.cache import topic_cost

log = logging.getLogger("brokerd.usage")

MAX_TOPICS = 10_000
MAX_TOPIC_BYTES = 4 * 1024 * 1024          # per tenant and minute: its rows' topics and the rows
MAX_NODE_TOPIC_BYTES = 32 * 1024 * 1024    # every tenant's together
MAX_PENDING = 2                            # days' last minutes kept apart while the log cannot be written
ROW_COST = 200                             # bytes of a row (list of 12 ints) and its dict slot
OTHER = "(other)"
# the traffic row's counters, in list order
FIELDS = ("msgs_in_q0", "msgs_in_q1", "msgs_in_q2", "bytes_in", "msgs_out", "bytes_out", "dropped_queue_full",
          "dropped_expired", "dropped_no_subscribers", "acl_denied", "quota_rejected", "auth_failures")
IN0, IN1, IN2, BYTES_IN, OUT, BYTES_OUT, QUEUE_FULL, EXPIRED, NO_SUBS, ACL, QUOTA, AUTH = range(len(FIELDS))
PROTOCOLS = {3: "3.1", 4: "3.1.1", 5: "5.0"}


class UsageLog:
    def __init__(self, directory: str, node: str, wall_offset: float, interval: float = 60.0,
                 checkpoint: float = 0.0):
        self.dir = Path(directory)
        self.node = node
        self.wall_offset = wall_offset           # loop time + wall_offset = epoch seconds
        self.interval = interval
        self.checkpoint = checkpoint if 0 < checkpoint < interval else 0.0
        self._names: dict[tuple, Path] = {}      # (dataset, date) -> this minute's file, chosen at its first write
        self._superseded: list[Path] = []        # a failed minute's checkpoints, its rows now in a later minute's
        # the last minute of a day that could not be written, kept with its own time until it is: merged
        # into the next minute it would be the next day's (a daily report's figures one day off)
        self._pending: list[tuple] = []
        self._writing = threading.Lock()
        self.traffic: dict[str, dict[str, list]] = {}
        self.topic_bytes: dict[str, int] = {}    # per tenant, this minute's rows (topic_cost + ROW_COST)
        self.node_topic_bytes = 0
        self.connections: list[dict] = []
        self._task: asyncio.Task | None = None
        self.files_written = 0

    # ------------------------------------------------------------ counting

    def _row(self, tenant: str, topic: str) -> list:
        rows = self.traffic.get(tenant)
        if rows is None:
            rows = self.traffic[tenant] = {}
        row = rows.get(topic)
        if row is None:
            cost = topic_cost(topic) + ROW_COST
            held = self.topic_bytes.get(tenant, 0)
            if (len(rows) >= MAX_TOPICS or held + cost > MAX_TOPIC_BYTES
                    or self.node_topic_bytes + cost > MAX_NODE_TOPIC_BYTES):
                topic = OTHER
                cost = ROW_COST
                row = rows.get(topic)
            if row is None:
                row = rows[topic] = [0] * len(FIELDS)
                self.topic_bytes[tenant] = held + cost
                self.node_topic_bytes += cost
        return row

    def published(self, tenant: str, topic: str, qos: int, size: int) -> None:
        row = self._row(tenant, topic)
        row[qos] += 1
        row[BYTES_IN] += size

    def delivered(self, tenant: str, topic: str, count: int, size: int) -> None:
        row = self._row(tenant, topic)
        row[OUT] += count
        row[BYTES_OUT] += count * size

    def count(self, tenant: str, topic: str, field: int, n: int = 1) -> None:
        self._row(tenant, topic)[field] += n

    def connection_closed(self, ch, tenant: str, now: float) -> None:
        reason = ch.close_reason[1] if ch.close_reason else "connection closed"
        self.connections.append({
            "tenant": tenant, "client_id": ch.client_id, "username": ch.username, "node": self.node,
            "protocol": PROTOCOLS.get(ch.version, str(ch.version)), "ip": ch.peer.rsplit(":", 1)[0],
            "connected_at": round((ch.connected_at or now) + self.wall_offset, 3),
            "disconnected_at": round(now + self.wall_offset, 3),
            "msgs_in": ch.msgs_in, "msgs_out": ch.msgs_out, "bytes_in": ch.bytes_in, "bytes_out": ch.bytes_out,
            "reason": reason,
        })

    # ------------------------------------------------------------- writing

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="usage-log")

    async def stop(self) -> None:
        """The rest goes out now (connections closed by the shutdown included)."""
        if self._task is not None:
            self._task.cancel()
        batch = self._take(self._minute_start(time.time()))
        try:
            await asyncio.to_thread(self._write_pending)
            await asyncio.to_thread(self.write, *batch)
        except Exception as exc:
            log.error("usage log not written on the way out: %s", exc)

    def _minute_start(self, wall: float) -> int:
        return int(wall // self.interval * self.interval)

    def _take(self, ts: int) -> tuple:
        """The minute's rows, and a fresh minute: new files from here on."""
        traffic, self.traffic = self.traffic, {}
        self.topic_bytes = {}
        self.node_topic_bytes = 0
        connections, self.connections = self.connections, []
        names, self._names = self._names, {}
        return ts, traffic, connections, names

    def _copy(self, ts: int) -> tuple:
        """What the minute has counted so far, for a checkpoint (the loop goes on adding to the original)."""
        traffic = {tenant: {topic: list(row) for topic, row in rows.items()} for tenant, rows in self.traffic.items()}
        return ts, traffic, list(self.connections), self._names

    async def _run(self) -> None:
        while True:
            now = time.time()
            end = (now // self.interval + 1) * self.interval
            step = end
            if self.checkpoint:
                step = min(end, (now // self.checkpoint + 1) * self.checkpoint)
            await asyncio.sleep(step - now)
            ts = int(end - self.interval)
            if step < end:
                batch = self._copy(ts)
                try:
                    await asyncio.to_thread(self.write, *batch)
                except Exception as exc:
                    log.debug("usage checkpoint not written (%s)", exc)
                continue
            batch = self._take(ts)
            try:
                await asyncio.to_thread(self._write_pending)
                await asyncio.to_thread(self.write, *batch)
            except Exception as exc:
                # kept for the next round rather than lost
                log.warning("usage log not written (%s); trying again next minute", exc)
                kept = await asyncio.to_thread(self._drop, batch[3])
                self._failed(batch, kept)

    def _failed(self, batch: tuple, kept: list) -> None:
        """The minute ``batch`` could not be written: its rows go into the next minute's -- unless the
        next minute is another (UTC) day: then it waits with its own time (``_pending``), written
        before the next minute is. (Days of failures keep MAX_PENDING such minutes at most, the
        oldest merged into the next: a minute holds up to MAX_NODE_TOPIC_BYTES of rows.)"""
        ts = batch[0]
        if _day(ts) == _day(ts + self.interval):
            self._merge(*batch[:3], kept)
            return
        self._superseded.extend(kept)
        self._pending.append((ts, batch[1], batch[2], {}))
        if len(self._pending) > MAX_PENDING:
            _, traffic, connections, names = self._pending.pop(0)
            _add_rows(self._pending[0][1], traffic)
            self._pending[0][2][:0] = connections
            self._superseded.extend(names.values())         # what a try of it wrote: its rows go with the next

    def _write_pending(self) -> None:
        """The days' last minutes that could not be written, each with its own time (raises: still not)."""
        while self._pending:
            # ``names``: the files a try that failed midway wrote (a traffic file, not the connections'),
            # replaced by the next try -- new ones beside them counted the minute twice
            ts, traffic, connections, names = self._pending[0]
            self.write(ts, traffic, connections, names)
            self._pending.pop(0)

    @staticmethod
    def _drop(names: dict) -> list[Path]:
        """A minute that could not be written whole: its checkpoints go (its rows go into the next
        minute's files instead; kept, they would be counted twice); those that cannot be removed now
        are removed once the next minute's files are written."""
        kept = []
        for path in names.values():
            try:
                path.unlink(missing_ok=True)
            except OSError:
                kept.append(path)
        return kept

    def _merge(self, ts, traffic, connections, kept: list) -> None:
        self._superseded.extend(kept)
        self.connections[:0] = connections
        for tenant, rows in traffic.items():
            for topic, row in rows.items():
                mine = self._row(tenant, topic)
                for i, v in enumerate(row):
                    mine[i] += v


    def write(self, ts: int, traffic: dict, connections: list, names: dict | None = None) -> None:
        """Write (or replace) the minute's files; ``names`` keeps the files the minute's earlier
        checkpoints chose, so each write replaces the last one instead of adding to it."""
        names = {} if names is None else names
        with self._writing:         # a checkpoint still being written when the node stops goes first
            superseded, self._superseded = self._superseded, []
            try:
                self._write(ts, traffic, connections, names)
            except BaseException:
                self._superseded[:0] = superseded
                raise
            for path in superseded:
                if path not in names.values():
                    with contextlib.suppress(FileNotFoundError):
                        path.unlink()

    def _write(self, ts: int, traffic: dict, connections: list, names: dict) -> None:
        stamp = datetime.datetime.fromtimestamp(ts, datetime.UTC)
        if traffic:
            lines = []
            for tenant, rows in traffic.items():
                for topic, row in rows.items():
                    if any(row):
                        lines.append(json.dumps({"ts": ts, "node": self.node, "tenant": tenant, "topic": topic,
                                                 **dict(zip(FIELDS, row, strict=True))}, separators=(",", ":")))
            self._file("traffic", stamp, lines, names)
        if connections:
            by_day: dict[str, list] = {}
            for c in connections:
                day = datetime.datetime.fromtimestamp(c["disconnected_at"], datetime.UTC).strftime("%Y-%m-%d")
                by_day.setdefault(day, []).append(json.dumps(c, separators=(",", ":")))
            for day, lines in by_day.items():
                self._file("connections", stamp, lines, names, day)

    def _file(self, dataset: str, stamp: datetime.datetime, lines: list[str], names: dict,
              day: str | None = None) -> None:
        if not lines:
            return
        day = day or stamp.strftime('%Y-%m-%d')
        path = names.get((dataset, day))
        if path is None:
            folder = self.dir / dataset / f"date={day}"
            folder.mkdir(parents=True, exist_ok=True)
            name = f"{self.node}-{stamp.strftime('%Y%m%d%H%M')}"
            path = folder / f"{name}.jsonl"
            n = 1
            while path.exists():                  # another batch for the same minute (a restart, a retry)
                n += 1
                path = folder / f"{name}-{n}.jsonl"
            names[(dataset, day)] = path
        tmp = path.parent / f".{path.name}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
            f.flush()
            os.fsync(f.fileno())
        replacing = path.exists()                 # a checkpoint of the same minute: not one more file
        os.replace(tmp, path)
        self.files_written += not replacing


def _day(ts: float) -> int:
    return int(ts // 86400)


def _add_rows(into: dict, traffic: dict) -> None:
    for tenant, rows in traffic.items():
        mine = into.setdefault(tenant, {})
        for topic, row in rows.items():
            have = mine.get(topic)
            if have is None:
                mine[topic] = list(row)
            else:
                for i, v in enumerate(row):
                    have[i] += v
