"""The reports: which jobs make them and what their result looks like (a
registry after django-oscar's ``dashboard/reports``: a code, who may run it,
how to run it).

``run`` returns a plain, JSON-ready dict that ``ReportRun.result`` stores and
the pages, the CSV and the email read; nothing downstream touches Spark.
"""

from pyspark import StorageLevel

from . import jobs
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


def _totals(traffic, conns, period: Period) -> dict:
    t = jobs.traffic_totals(traffic).collect()[0].asDict()
    c = jobs.connection_totals(conns, period).collect()[0].asDict()
    p = jobs.peak_concurrency(conns, period).collect()
    peak = p[0].asDict() if p else {"peak_connections": 0, "peak_at": None}
    return {**t, **c, "peak_connections": peak["peak_connections"], "peak_at": _iso(peak["peak_at"])}


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

    def run(self, spark, root, period, tenant=None, top_n=TOP_N, progress=_noop, lake=None) -> dict:
        assert tenant, "a tenant report needs a tenant"
        n = len(self.steps)
        progress(1, n, self.steps[0])
        jobs.check_usage_dir(spark, root)
        conns = _cached(jobs.touching(jobs.for_tenant(jobs.read_connections(spark, root, period, lake), tenant), period))
        traffic = _cached(jobs.traffic_in(jobs.for_tenant(jobs.read_traffic(spark, root, period, lake), tenant), period))
        try:
            out = _header(self.code, period, tenant, top_n)
            out["rows"] = {"connections": conns.count(), "traffic": traffic.count()}
            progress(2, n, self.steps[1])
            out["totals"] = _totals(traffic, conns, period)
            progress(3, n, self.steps[2])
            out["daily"] = _with_dates(_rows(jobs.daily(traffic, conns, period)), period)
            progress(4, n, self.steps[3])
            out["top_topics"] = _rows(jobs.top_topics(traffic, top_n))
            out["top_devices"] = _rows(jobs.top_devices(conns, period, top_n))
            progress(5, n, self.steps[4])
            out["rejections"] = _rows(jobs.rejections(traffic))
            out["reasons"] = _rows(jobs.disconnect_reasons(conns, period))
            return out
        finally:
            conns.unpersist()
            traffic.unpersist()


class PlatformReport(Report):
    code = "platform"
    title = "Platform usage"
    steps = ["Reading the usage log", "Totals and peak concurrency", "Daily series", "Tenants ranked",
             "Load per node"]

    def is_available_to(self, user, tenant=None) -> bool:
        from core.roles import is_platform_admin  # as above: no Django at import time

        return is_platform_admin(user)

    def run(self, spark, root, period, tenant=None, top_n=TOP_N, progress=_noop, lake=None) -> dict:
        n = len(self.steps)
        progress(1, n, self.steps[0])
        jobs.check_usage_dir(spark, root)
        conns = _cached(jobs.touching(jobs.read_connections(spark, root, period, lake), period))
        traffic = _cached(jobs.traffic_in(jobs.read_traffic(spark, root, period, lake), period))
        try:
            out = _header(self.code, period, None, top_n)
            out["rows"] = {"connections": conns.count(), "traffic": traffic.count()}
            progress(2, n, self.steps[1])
            out["totals"] = _totals(traffic, conns, period)
            progress(3, n, self.steps[2])
            out["daily"] = _with_dates(_rows(jobs.daily(traffic, conns, period)), period)
            progress(4, n, self.steps[3])
            out["tenants"] = _rows(jobs.tenant_ranking(traffic, conns, period))
            out["totals"]["tenants"] = len(out["tenants"])
            out["rejections"] = _rows(jobs.rejections(traffic))
            progress(5, n, self.steps[4])
            out["nodes"] = _rows(jobs.node_load(traffic, conns, period))
            return out
        finally:
            conns.unpersist()
            traffic.unpersist()


REPORTS: dict[str, Report] = {r.code: r for r in (TenantUsageReport(), PlatformReport(), TelemetryReport())}


def get(code: str) -> Report:
    return REPORTS[code]
