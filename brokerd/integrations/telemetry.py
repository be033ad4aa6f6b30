"""The telemetry writer: store rules' output rows, landed for the Spark lake.

``TelemetryWriter.submit`` (called by the rule engine on the node that ran
the rule, inside the publish path) only appends the rendered record to its
tenant's queue: O(1), no I/O, no await. The queues are bounded in bytes, per
tenant (``--rules-store-tenant-buffer``) and for the node
(``--rules-store-buffer``); when a bound would be passed the OLDEST record is
dropped (the tenant's own, or -- for the node's bound -- the oldest of the
tenant holding the most bytes), counted in the rule's ``dropped`` and
``failed`` and logged as a warning (at most once per 10 s per node), as the
webhook sender does.

Every ``--rules-store-interval`` seconds -- or at once when the node's queue
holds a quarter of its bound or a tenant's half of its own, so that a busy
tenant's rows are written rather than dropped while the disk keeps up -- the
queued rows go to a thread that
writes them in the usage log's landing zone (``--usage-dir``), beside the
usage datasets and in their layout, so the lake's compaction
(``spark_reports.lake``) moves them into Parquet exactly once with them::

    <usage-dir>/telemetry/date=YYYY-MM-DD/<node>-<YYYYMMDDHHMM>[-n].jsonl
        one row per stored output row: tenant, dataset, rule (its id), ts
        (epoch seconds, millisecond precision), client_id, topic, node, data
        (the rule's output row as a JSON object, in a string)

``date`` is the UTC date of the row's ``ts``. Each file is written under a
temporary name, fsynced and renamed, so a reader never sees half of one. A
write that fails keeps its rows for the next round (they are the oldest, so
the bounds drop them first); a crash loses at most the last interval's rows.
"""

import asyncio
import datetime
import json
import logging
import os
import time
from pathlib import Path

from .buffer import Job, TenantBuffers

log = logging.getLogger("brokerd.rules.telemetry")

DATASET_DIR = "telemetry"


class TelemetryWriter(TenantBuffers):
    WHAT, ITEMS = "telemetry", "rows"

    def __init__(self, directory: str, node: str, node_bytes: int, tenant_bytes: int, interval: float = 5.0):
        super().__init__(node_bytes, tenant_bytes, log)
        self.dir = Path(directory)
        self.node = node
        self.interval = interval
        self.stored = self.files_written = 0
        self._task: asyncio.Task | None = None
        self._due: asyncio.Event | None = None    # set by submit when the queue should not wait for the interval

    # ---------------------------------------------------------------- the hot side: no I/O, no await

    def submit(self, tenant: str, rec, state) -> None:
        if not self._queue(tenant, rec, state):
            return
        due = self._due
        if due is not None and (self.queued[tenant] * 2 >= self.tenant_bytes or self.total * 4 >= self.node_bytes):
            due.set()

    def _take(self) -> list:
        jobs = [job for q in self.queues.values() for job in q]
        self.queues, self.queued, self.total = {}, {}, 0
        return jobs

    def _put_back(self, jobs: list[Job]) -> None:
        """A failed write's rows, before what came meanwhile (they are older), within the bounds."""
        newer = self._take()
        for job in jobs + newer:
            self.submit(job.tenant, job.item, job.state)

    # ---------------------------------------------------------------- writing

    def start(self) -> None:
        self._due = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="telemetry-writer")

    async def _run(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._due.wait(), self.interval)
            except TimeoutError:
                pass
            self._due.clear()
            if not await self.flush():
                # a failed write waits the interval out, however full the queue (its put-back rows, and
                # every row a busy tenant queues meanwhile, ask for a write at once)
                await asyncio.sleep(self.interval)

    async def flush(self) -> bool:
        """-> False: the write failed (its rows are queued again)."""
        jobs = self._take()
        if not jobs:
            return True
        try:
            await asyncio.to_thread(self.write, [_line(job, self.node) for job in jobs], time.time())
        except Exception as exc:
            log.warning("telemetry not written (%s); trying again in %g s", exc, self.interval)
            self._put_back(jobs)
            return False
        self.stored += len(jobs)
        for job in jobs:
            job.state.stored += 1
        return True

    async def stop(self) -> None:
        """The rest goes out now."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
        try:
            await self.flush()
        except Exception as exc:
            log.error("telemetry not written on the way out: %s", exc)
        for job in self._take():
            self._drop(job, "not written on the way out")

    def write(self, lines: list[tuple[str, str]], wall: float) -> None:
        """``(date, JSON line)`` pairs -> one file per date, named by the minute of ``wall``."""
        by_day: dict[str, list[str]] = {}
        for day, line in lines:
            by_day.setdefault(day, []).append(line)
        stamp = datetime.datetime.fromtimestamp(wall, datetime.UTC).strftime("%Y%m%d%H%M")
        for day, rows in sorted(by_day.items()):
            self._file(day, stamp, rows)

    def _file(self, day: str, stamp: str, lines: list[str]) -> None:
        folder = self.dir / DATASET_DIR / f"date={day}"
        folder.mkdir(parents=True, exist_ok=True)
        name = f"{self.node}-{stamp}"
        path = folder / f"{name}.jsonl"
        n = 1
        while path.exists():                      # the minute's second, third... batch
            n += 1
            path = folder / f"{name}-{n}.jsonl"
        tmp = folder / f".{path.name}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        self.files_written += 1


def _line(job: Job, node: str) -> tuple[str, str]:
    rec = job.item
    ts = rec.ts / 1000
    day = datetime.datetime.fromtimestamp(ts, datetime.UTC).strftime("%Y-%m-%d")
    return day, json.dumps({"tenant": job.tenant, "dataset": rec.dataset, "rule": job.state.id, "ts": ts,
                            "client_id": rec.clientid, "topic": rec.topic, "node": node, "data": rec.data},
                           separators=(",", ":"))     # ASCII: a lone surrogate cannot fail the file
