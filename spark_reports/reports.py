"""The reports: which jobs make them and what their result looks like (a
registry after django-oscar's ``dashboard/reports``: a code, who may run it,
how to run it).

``run`` returns a plain, JSON-ready dict that ``ReportRun.result`` stores and
the pages, the CSV and the email read; nothing downstream touches Spark.
"""

from pyspark import StorageLevel
from pyspark.sql import functions as F

from . import jobs
from . import lake as lakes
from .jobs import Period
from .report_base import TOP_N, Progress, Report, _header, _iso, _noop  # noqa: F401  (_iso: tests read it here)
from .telemetry import TelemetryReport


def _rows(df) -> list[dict]:
    return [row.asDict() for row in df.collect()]


def _with_dates(rows: list[dict], period: Period) -> list[dict]:
    return [{"date": period.date_of(r.pop("day")), **r} for r in rows]


PARTITION_BYTES = 64 << 20      # input bytes (Spark's estimate) per partition of a report's persisted rows
MAX_PARTITIONS = 10_000         # where Spark cannot estimate a size it says "very big": keep the partitions


def _cached(df):
    """The period's rows, read once for the report's several jobs, kept on the
    executors' local disk, never in memory: ``.cache()`` of the whole period
    (after ``coalesce`` to one partition per core) held it in the heap of a
    local driver, which ran out of its default 1 GiB at 50M rows.

    Partitions of at most ~PARTITION_BYTES of input (never fewer than the
    cores): landed files of a minute each pack ~32 to a read partition, so
    a week of them (59,388 files) made ~1,850 partitions, and every job of
    the report ran that many tasks of a few hundred rows (1M rows: tenant
    report 111 s, platform 143 s). ``coalesce`` only merges (a no-op where
    the read has fewer partitions, as the lake's Parquet reads do)."""
    spark = df.sparkSession
    size = int(str(df._jdf.queryExecution().optimizedPlan().stats().sizeInBytes()))
    parts = max(spark.sparkContext.defaultParallelism, min(-(-size // PARTITION_BYTES), MAX_PARTITIONS))
    return df.coalesce(parts).persist(StorageLevel.DISK_ONLY)


def _peak(conns, period: Period) -> dict:
    p = jobs.peak_concurrency(conns, period).collect()
    peak = p[0].asDict() if p else {"peak_connections": 0, "peak_at": None}
    return {"peak_connections": peak["peak_connections"], "peak_at": _iso(peak["peak_at"])}


class _Reads:
    """A report's rows, read once and kept on disk while its jobs run (``_cached``): from daily
    rollups where they are current and the period is whole days (``grouped``: spark_reports.rollups),
    else the raw rows."""

    def __init__(self, spark, root, period: Period, tenant, lake, rollups: bool):
        self.period = period
        self.grouped = rollups and jobs.whole_days(period)
        if self.grouped:
            self.traffic = _cached(jobs.traffic_groups(spark, root, period, lake, tenant))
            self.conns = _cached(jobs.connection_groups(spark, root, period, lake, tenant))
            self.spans = _cached(jobs.spans(spark, root, period, lake, tenant))
        else:
            read_c, read_t = jobs.read_connections(spark, root, period, lake), jobs.read_traffic(spark, root, period, lake)
            if tenant is not None:
                read_c, read_t = jobs.for_tenant(read_c, tenant), jobs.for_tenant(read_t, tenant)
            self.conns = _cached(jobs.touching(read_c, period))
            self.traffic = _cached(jobs.traffic_in(read_t, period))
            self.spans = self.conns

    def unpersist(self) -> None:
        for df in {id(d): d for d in (self.conns, self.traffic, self.spans)}.values():
            df.unpersist()

    def totals(self) -> tuple[dict, dict]:
        """(the rows under the report, its totals): the row counts are one more sum in the totals' jobs
        (a job of their own each cost the report two of its ~16 jobs, ~0.5 s cold each)."""
        if self.grouped:
            t = _one(jobs.traffic_totals(self.traffic, extra=[_total("rows")]))
            c = _one(jobs.group_connection_totals(self.conns, self.period, extra=[_total("connections")]))
            c.update(_one(jobs.median_session(self.spans, self.period)))
        else:
            t = _one(jobs.traffic_totals(self.traffic, extra=[_total(F.lit(1))]))
            c = _one(jobs.connection_totals(self.conns, self.period, extra=[_total(F.lit(1))]))
        rows = {"connections": c.pop(ROWS), "traffic": t.pop(ROWS)}
        return rows, {**t, **c, **_peak(self.spans, self.period)}

    def daily(self) -> list[dict]:
        fn = jobs.daily_groups if self.grouped else jobs.daily
        return _with_dates(_rows(fn(self.traffic, self.conns, self.period)), self.period)

    def top_devices(self, n: int) -> list[dict]:
        fn = jobs.top_devices_groups if self.grouped else jobs.top_devices
        return _rows(fn(self.conns, self.period, n))

    def reasons(self) -> list[dict]:
        fn = jobs.disconnect_reasons_groups if self.grouped else jobs.disconnect_reasons
        return _rows(fn(self.conns, self.period))

    def tenants(self) -> list[dict]:
        if self.grouped:
            return _rows(jobs.tenant_ranking_groups(self.traffic, self.conns, self.spans, self.period))
        return _rows(jobs.tenant_ranking(self.traffic, self.conns, self.period))

    def nodes(self) -> list[dict]:
        if self.grouped:
            return _rows(jobs.node_load_groups(self.traffic, self.conns, self.spans, self.period))
        return _rows(jobs.node_load(self.traffic, self.conns, self.period))


ROWS = "_rows"


def _total(col):
    """The sum of ``col`` (a name or a column) as ``ROWS``: 0 without a row."""
    return F.coalesce(F.sum(col), F.lit(0)).cast("long").alias(ROWS)


def _one(df) -> dict:
    return df.collect()[0].asDict()


def _rejections(totals: dict) -> list[dict]:
    """``jobs.rejections`` from the report's totals (their sums are among them): no job of its own."""
    return [{"kind": kind, "label": label, "count": totals[kind]} for kind, label in jobs.REJECTION_KINDS]


def _past_damaged_rollups(spark, root, lake, run_once, tries: int = 3) -> dict:
    """``run_once()``; where it failed reading a daily rollup (a damaged file: a disk's fault, a host
    crash before the file reached the disk), that rollup deleted (``lake.drop_damaged_rollups``: the
    next compaction makes it again) and the report run again, reading that date's raw rows. Before,
    every report over the date failed until someone removed the file by hand."""
    for _ in range(tries):
        try:
            return run_once()
        except Exception as exc:
            if not lakes.drop_damaged_rollups(spark, lake or lakes.default_lake(root), _error_text(exc)):
                raise
    return run_once()


def _error_text(exc: BaseException) -> str:
    java = getattr(exc, "java_exception", None)
    try:
        return f"{exc}\n{java.toString() if java is not None else ''}"
    except Exception:       # the JVM gone meanwhile
        return str(exc)


class TenantUsageReport(Report):
    code = "tenant"
    title = "Tenant usage"
    steps = ["Reading the usage log", "Totals and peak concurrency", "Daily series", "Top topics and devices",
             "Rejections and disconnect reasons"]

    def is_available_to(self, user, tenant=None) -> bool:
        # imported here: the registry stays importable without Django (bench/reports_1m.py)
        from core.roles import is_platform_admin
        from tenants.access import membership_of

        return is_platform_admin(user) or (tenant is not None and membership_of(user, tenant) is not None)

    def run(self, spark, root, period, tenant=None, top_n=TOP_N, progress=_noop, lake=None, rollups=True) -> dict:
        assert tenant, "a tenant report needs a tenant"
        return _past_damaged_rollups(spark, root, lake, lambda: self._run(spark, root, period, tenant, top_n,
                                                                          progress, lake, rollups))

    def _run(self, spark, root, period, tenant, top_n, progress, lake, rollups) -> dict:
        n = len(self.steps)
        progress(1, n, self.steps[0])
        jobs.check_usage_dir(spark, root)
        reads = _Reads(spark, root, period, tenant, lake, rollups)
        try:
            out = _header(self.code, period, tenant, top_n)
            progress(2, n, self.steps[1])
            out["rows"], out["totals"] = reads.totals()
            progress(3, n, self.steps[2])
            out["daily"] = reads.daily()
            progress(4, n, self.steps[3])
            out["top_topics"] = _rows(jobs.top_topics(reads.traffic, top_n))
            out["top_devices"] = reads.top_devices(top_n)
            progress(5, n, self.steps[4])
            out["rejections"] = _rejections(out["totals"])
            out["reasons"] = reads.reasons()
            return out
        finally:
            reads.unpersist()


class PlatformReport(Report):
    code = "platform"
    title = "Platform usage"
    steps = ["Reading the usage log", "Totals and peak concurrency", "Daily series", "Tenants ranked",
             "Load per node"]

    def is_available_to(self, user, tenant=None) -> bool:
        from core.roles import is_platform_admin  # as above: no Django at import time

        return is_platform_admin(user)

    def run(self, spark, root, period, tenant=None, top_n=TOP_N, progress=_noop, lake=None, rollups=True) -> dict:
        return _past_damaged_rollups(spark, root, lake, lambda: self._run(spark, root, period, top_n, progress,
                                                                          lake, rollups))

    def _run(self, spark, root, period, top_n, progress, lake, rollups) -> dict:
        n = len(self.steps)
        progress(1, n, self.steps[0])
        jobs.check_usage_dir(spark, root)
        reads = _Reads(spark, root, period, None, lake, rollups)
        try:
            out = _header(self.code, period, None, top_n)
            progress(2, n, self.steps[1])
            out["rows"], out["totals"] = reads.totals()
            progress(3, n, self.steps[2])
            out["daily"] = reads.daily()
            progress(4, n, self.steps[3])
            out["tenants"] = reads.tenants()
            out["totals"]["tenants"] = len(out["tenants"])
            out["rejections"] = _rejections(out["totals"])
            progress(5, n, self.steps[4])
            out["nodes"] = reads.nodes()
            return out
        finally:
            reads.unpersist()


REPORTS: dict[str, Report] = {r.code: r for r in (TenantUsageReport(), PlatformReport(), TelemetryReport())}


def get(code: str) -> Report:
    return REPORTS[code]
