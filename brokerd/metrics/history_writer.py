"""The metrics history: one row per minute per node and tenant, and the hour's
row, in the console's database (table ``metrics_sample``, the Django model
``metrics.models.Sample``) -- written by each node for itself with plain SQL,
as the audit log is (brokerd never imports Django).

Every minute (on the wall clock's minute) the node reads its figures, writes
what changed since the previous one (messages, bytes, connects, drops,
rejections) and the most connections seen at once (checked every few
seconds), and adds the same figures into the hour's row (an upsert); the rows of
periods the database refused are written with the next period's (at most a day
of them is kept). Once an
hour it deletes its own minute rows older than 7 days and hour rows older
than 90 days. Only tenants with connections or traffic in the minute get a
row; the node's row (tenant "") is always written.
"""

import asyncio
import datetime
import logging
import time

from . import node_figures

log = logging.getLogger("brokerd.metrics")

KEEP_MINUTES = datetime.timedelta(days=7)
KEEP_HOURS = datetime.timedelta(days=90)
COLUMNS = ("connections", "connects", "messages_in", "messages_out", "bytes_in", "bytes_out", "dropped", "rejected")
COUNTERS = COLUMNS[1:]
MAX_PENDING = 24 * 60       # periods kept while the database refuses them (a day of minutes), then the oldest go


def figures(t: dict) -> dict:
    """A TOTALS dict -> the cumulative counters of the history's columns."""
    d = t["dropped"]
    return {
        "connects": t["connects"],
        "messages_in": sum(t["messages_in"].values()),
        "messages_out": sum(t["messages_out"].values()),
        "bytes_in": t["bytes_in"],
        "bytes_out": t["bytes_out"],
        "dropped": d["queue_full"] + d["expired"] + d["too_large"] + d["no_subscribers"],
        "rejected": d["acl_denied"] + d["quota"] + t["auth_failures"],
    }


class History:
    def __init__(self, server, db, interval: float = 60.0, peek: float = 5.0):
        self.server = server
        self.db = db                                 # brokerd.tenancy.source.PolicyDatabase
        self.interval = interval
        self.peek = min(peek, interval / 2)
        self.node = server.config.node_id
        self.last: dict[str, dict] = {}              # tenant -> cumulative figures at the last row
        self.peak: dict[str, int] = {}               # tenant -> most connections seen in this period
        self._task: asyncio.Task | None = None
        self._pruned_at = 0.0
        self.rows_written = 0
        # periods whose rows the database refused (down, locked, failing over): written with the next
        # period's, in one transaction -- their counters have moved on, so a row not written is lost
        self.pending: list[tuple[datetime.datetime, list[tuple]]] = []

    def start(self) -> None:
        self._take(node_figures(self.server), first=True)
        self._task = asyncio.get_running_loop().create_task(self._run(), name="metrics-history")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def _take(self, snap: dict, first: bool = False) -> list[tuple]:
        """Rows for the period that ends now (and remember the counters)."""
        rows = []
        items = [("", snap)] + list(snap["tenants"].items())
        for tenant, t in items:
            now = figures(t)
            before = self.last.get(tenant)
            self.last[tenant] = now
            peak = max(self.peak.pop(tenant, 0), t["connections"])
            if first:
                continue
            # a counter that went down: the node restarted -- the new value is what happened since
            delta = {k: (now[k] - before[k] if before and now[k] >= before[k] else now[k]) for k in COUNTERS}
            if tenant and not peak and not any(delta.values()):
                continue
            rows.append((tenant, peak, delta))
        return rows

    def _watch_peaks(self, snap: dict) -> None:
        for tenant, t in [("", snap)] + list(snap["tenants"].items()):
            self.peak[tenant] = max(self.peak.get(tenant, 0), t["connections"])

    async def _run(self) -> None:
        while True:
            # sleep to the next boundary of the wall clock, peeking at connection counts on the way
            end = (time.time() // self.interval + 1) * self.interval
            while True:
                left = end - time.time()
                if left <= 0:
                    break
                await asyncio.sleep(min(left, self.peek))
                if end - time.time() > 0:
                    self._watch_peaks(node_figures(self.server))
            rows = self._take(node_figures(self.server))
            minute = datetime.datetime.fromtimestamp(end - self.interval, datetime.UTC)
            self.pending.append((minute, rows))
            if len(self.pending) > MAX_PENDING:
                lost = self.pending.pop(0)
                log.error("metrics history of %s not written: the database refused it for %d periods", lost[0],
                          MAX_PENDING)
            batch = list(self.pending)
            try:
                await asyncio.to_thread(self.write_periods, batch)
            except Exception as exc:
                log.warning("metrics history not written (%s); the next period writes it with its own", exc)
                continue
            del self.pending[:len(batch)]
            self.rows_written += sum(len(r) for _, r in batch)
            try:
                if time.time() - self._pruned_at > 3600:
                    await asyncio.to_thread(self.prune, datetime.datetime.now(datetime.UTC))
                    self._pruned_at = time.time()
            except Exception as exc:
                log.warning("metrics history not pruned (%s)", exc)

    # ------------------------------------------------------------------ SQL

    def _at(self, dt: datetime.datetime):
        return dt if self.db.kind == "pg" else dt.replace(tzinfo=None).isoformat(" ")

    def write(self, minute: datetime.datetime, rows: list[tuple]) -> None:
        self.write_periods([(minute, rows)])

    def write_periods(self, periods: list[tuple[datetime.datetime, list[tuple]]]) -> None:
        """The rows of some periods (and their hours' rows), in one transaction: all or none."""
        p = "?" if self.db.kind == "sqlite" else "%s"
        greatest = "MAX" if self.db.kind == "sqlite" else "GREATEST"
        cols = ", ".join(COLUMNS)
        insert = (f"INSERT INTO metrics_sample (resolution, at, node, tenant, {cols}) "
                  f"VALUES ({', '.join([p] * (4 + len(COLUMNS)))})")
        upsert = (insert + " ON CONFLICT (resolution, at, node, tenant) DO UPDATE SET "
                  f"connections = {greatest}(metrics_sample.connections, excluded.connections), "
                  + ", ".join(f"{c} = metrics_sample.{c} + excluded.{c}" for c in COUNTERS))
        statements = []
        for minute, rows in periods:
            hour = minute.replace(minute=0, second=0, microsecond=0)
            for tenant, peak, delta in rows:
                values = (peak, *(delta[c] for c in COUNTERS))
                statements.append((upsert, ("m", self._at(minute), self.node, tenant, *values)))
                statements.append((upsert, ("h", self._at(hour), self.node, tenant, *values)))
        if statements:
            self.db.execute(statements)

    def prune(self, now: datetime.datetime) -> None:
        p = "?" if self.db.kind == "sqlite" else "%s"
        self.db.execute([(f"DELETE FROM metrics_sample WHERE node = {p} AND resolution = {p} AND at < {p}",
                        (self.node, "m", self._at(now - KEEP_MINUTES))),
                       (f"DELETE FROM metrics_sample WHERE node = {p} AND resolution = {p} AND at < {p}",
                        (self.node, "h", self._at(now - KEEP_HOURS)))])
