"""The telemetry report: what a tenant's devices said, as its store rules kept it.

A store rule (``manage.py rules add TENANT --sql SQL --store DATASET``)
appends its output rows to the tenant's telemetry dataset DATASET; brokerd
lands them with the usage log (``brokerd.integrations.telemetry``) and the
compaction moves them into the lake's ``telemetry`` dataset
(``spark_reports.lake``). Each row's ``data`` is the rule's output row as a
JSON object; this report reads it as a map of field -> value text, so a
field's type is whatever its values are: a value that reads as a number is
a number (``31.5``, ``"31.5"``), others (text, true/false, objects) are
counted but not summed.

For one tenant (never any other's rows: ``jobs.read_telemetry``) and a
period ``[start, end)``, optionally one dataset:

- ``datasets``: per dataset its rows, distinct devices (client ids) and
  rules, the first and last row's time;
- ``fields``: per dataset and top-level field, the rows holding it (not
  null), how many of those are numbers, and their min, average and max;
- ``series``: per dataset, time bucket and numeric field, the same figures;
  the bucket is an hour for periods up to SERIES_HOURLY_DAYS days, else a
  day (``bucket`` in the result says which), at most SERIES_MAX_ROWS rows
  (``series_truncated``).
"""

from datetime import UTC, datetime

from pyspark.sql import functions as F
from pyspark.sql import types as T

from . import jobs
from .jobs import Period
from .report_base import Report, _header, _iso, _noop

SERIES_HOURLY_DAYS = 31
SERIES_MAX_ROWS = 5000
_FIELDS = T.MapType(T.StringType(), T.StringType())


def values(rows):
    """One row per (row, top-level field): ``dataset``, ``ts``, ``field``, ``value`` (text), ``number``."""
    exploded = rows.select("dataset", "ts", F.explode(F.from_json("data", _FIELDS)).alias("field", "value"))
    number = F.col("value").try_cast("double")
    return exploded.filter(F.col("value").isNotNull()).withColumn(
        "number", F.when(~F.isnan(number), number))


def _stats(df, by: list[str]):
    return df.groupBy(*by).agg(
        F.count(F.lit(1)).alias("rows"), F.count("number").alias("numeric"), F.min("number").alias("min"),
        F.avg("number").alias("avg"), F.max("number").alias("max"))


def dataset_totals(rows):
    return rows.groupBy("dataset").agg(
        F.count(F.lit(1)).alias("rows"), F.countDistinct("client_id").alias("devices"),
        F.countDistinct("rule").alias("rules"), F.min("ts").alias("first"), F.max("ts").alias("last")
    ).orderBy("dataset")


def field_stats(vals):
    return _stats(vals, ["dataset", "field"]).orderBy("dataset", "field")


def series(vals, bucket_seconds: int):
    numeric = vals.filter(F.col("number").isNotNull()).withColumn(
        "at", (F.floor(F.col("ts") / bucket_seconds) * bucket_seconds).cast("long"))
    return _stats(numeric, ["dataset", "field", "at"]).drop("numeric").orderBy("dataset", "field", "at")


def _rounded(row: dict) -> dict:
    return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in row.items()}


class TelemetryReport(Report):
    code = "telemetry"
    title = "Telemetry"
    steps = ["Reading the telemetry", "Datasets", "Fields", "Series"]

    def is_available_to(self, user, tenant=None) -> bool:
        from core.roles import is_platform_admin
        from tenants.access import membership_of

        return is_platform_admin(user) or (tenant is not None and membership_of(user, tenant) is not None)

    def run(self, spark, root, period: Period, tenant=None, top_n=0, progress=_noop, lake=None,
            dataset: str | None = None) -> dict:
        assert tenant, "a telemetry report needs a tenant"
        n = len(self.steps)
        progress(1, n, self.steps[0])
        jobs.check_usage_dir(spark, root)
        rows = jobs.read_telemetry(spark, root, period, tenant, lake)
        if dataset:
            rows = rows.filter(F.col("dataset") == dataset)
        rows = rows.select("dataset", "rule", "ts", "client_id", "data").persist()
        try:
            out = _header(self.code, period, tenant, top_n)
            out["dataset"] = dataset
            progress(2, n, self.steps[1])
            out["datasets"] = [{**r.asDict(), "first": _iso(r["first"]), "last": _iso(r["last"])}
                               for r in dataset_totals(rows).collect()]
            vals = values(rows)
            progress(3, n, self.steps[2])
            out["fields"] = [_rounded(r.asDict()) for r in field_stats(vals).collect()]
            progress(4, n, self.steps[3])
            hourly = (period.end - period.start) <= SERIES_HOURLY_DAYS * jobs.DAY
            out["bucket"] = "hour" if hourly else "day"
            got = series(vals, 3600 if hourly else jobs.DAY).limit(SERIES_MAX_ROWS + 1).collect()
            out["series_truncated"] = len(got) > SERIES_MAX_ROWS
            out["series"] = [_rounded({**r.asDict(), "at": datetime.fromtimestamp(r["at"], UTC).isoformat()})
                             for r in got[:SERIES_MAX_ROWS]]
            return out
        finally:
            rows.unpersist()
