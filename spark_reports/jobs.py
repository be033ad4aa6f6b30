"""The usage reports as PySpark jobs: plain functions, DataFrame -> DataFrame.

Input: the usage log brokerd writes (README, *Usage reports*), two JSON Lines
datasets partitioned by UTC date, read with the explicit schemas of spark_reports.schemas:

- ``connections/date=YYYY-MM-DD/<node>-<YYYYMMDDHHMM>.jsonl``: one row per
  closed connection (``date`` = the UTC date of ``disconnected_at``);
- ``traffic/date=YYYY-MM-DD/...``: per minute, node, tenant and topic, the
  message counters (``topic`` "" for tenant-wide rows such as authentication
  failures, "(other)" beyond 10,000 topics per tenant and minute).

A period is ``[start, end)`` in epoch seconds. What counts where:

- messages, bytes, rejections, drops and topics: the traffic rows whose
  minute ``ts`` lies in the period;
- connects: connections opened in the period; disconnects, session lengths,
  disconnect reasons and each device's traffic: connections closed in the
  period (a connection's counters are known only when it closes, so its
  traffic belongs to the day it closed);
- devices and peak concurrency: every connection that touches the period
  (opened or closed in it, or open across it). A device is the DEVICE of the
  user name ``TENANT/DEVICE``, or the client id of an anonymous client,
  within its tenant: the platform counts ``(tenant, device)`` pairs.
  Connections still open when the report runs are not in the log yet, so
  they are not counted.

Peak concurrency is a sweep over connection intervals ``[connected_at,
disconnected_at)`` clipped to the period: +1 at each connect, -1 at each
disconnect, running sum in time order, maximum. At one instant disconnects
count before connects, so a client that reconnects at the very instant its
old connection closed (touching intervals) is one connection, not two, and
a connection that opens and closes at the same instant never counts. The job
sums the +1s and -1s of each instant before the running sum, which is the
same thing: the level after an instant is all that a disconnect-first order
can reach at it.

Top-N tables are ordered by their value descending, then by name ascending,
so ties always come out in the same order.
"""

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from . import lake as lakes
from . import rollups as rollup_defs
from .schemas import CONNECTIONS_SCHEMA, TELEMETRY_SCHEMA, TRAFFIC_COUNTERS, TRAFFIC_SCHEMA

DAY = 86400

# (traffic column, label) in the order reports show them
REJECTION_KINDS = [
    ("acl_denied", "ACL denied"),
    ("quota_rejected", "quota exceeded"),
    ("auth_failures", "authentication failed"),
    ("dropped_queue_full", "dropped: queue full"),
    ("dropped_expired", "dropped: expired"),
    ("dropped_no_subscribers", "dropped: no subscribers"),
]
REJECTED = ["acl_denied", "quota_rejected", "auth_failures"]
DROPPED = ["dropped_queue_full", "dropped_expired", "dropped_no_subscribers"]


class UsageLogError(Exception):
    """The usage log cannot be read (missing, not a directory, unreachable)."""


@dataclass(frozen=True)
class Period:
    """``[start, end)`` in epoch seconds."""

    start: float
    end: float

    @classmethod
    def days(cls, first: date, last: date) -> "Period":
        """Whole UTC days, ``last`` included."""
        start = datetime(first.year, first.month, first.day, tzinfo=UTC)
        end = datetime(last.year, last.month, last.day, tzinfo=UTC) + timedelta(days=1)
        return cls(start.timestamp(), end.timestamp())

    @classmethod
    def between(cls, start: datetime, end: datetime) -> "Period":
        return cls(start.timestamp(), end.timestamp())

    @property
    def first_day(self) -> int:
        return int(self.start // DAY)

    @property
    def last_day(self) -> int:
        """The UTC day number of the period's last instant (inclusive)."""
        return int(max(self.start, self.end - 1e-6) // DAY)

    def date_of(self, day: int) -> str:
        return (date(1970, 1, 1) + timedelta(days=day)).isoformat()


# ---------------------------------------------------------------- reading


def _hadoop_path_status(spark, uri: str):
    jvm = spark.sparkContext._jvm
    path = jvm.org.apache.hadoop.fs.Path(uri)
    fs = path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    return fs, path


def check_usage_dir(spark, root: str) -> None:
    """UsageLogError unless ``root`` is a readable directory (any Hadoop filesystem)."""
    try:
        fs, path = _hadoop_path_status(spark, root)
        if not fs.exists(path):
            raise UsageLogError(f"usage log directory not found: {root}")
        if not fs.getFileStatus(path).isDirectory():
            raise UsageLogError(f"usage log path is not a directory: {root}")
        fs.listStatus(path)
    except UsageLogError:
        raise
    except Exception as exc:  # Py4JJavaError and friends: the Java message is what matters
        message = str(getattr(exc, "java_exception", exc)).strip().splitlines()[0]
        raise UsageLogError(f"usage log unreadable: {root}: {message}") from None


def _read(spark, root: str, lake: str | None, name: str, schema, first: str, last: str | None,
          opened_before: float | None = None, snap: lakes.Snapshot | None = None) -> DataFrame:
    """Dates ``first``..``last`` (None: open) of a dataset: the lake's
    committed runs and the landed files not compacted yet (spark_reports.lake),
    read as one DataFrame; the ``date`` filter stays on it, so the plan shows
    it as a partition filter of both scans. ``snap``: the snapshot to read
    (one taken with ``rollups``: the dates it reads from rollups left out)."""
    lake = lake or lakes.default_lake(root)
    if snap is None:
        snap = lakes.snapshot(spark, root, lake, name, first, last, opened_before)
    parts = []
    if snap.runs:
        parts.append(spark.read.schema(schema).option("basePath", f"{lake.rstrip('/')}/{name}")
                     .parquet(*snap.runs).select(*schema.names))
    if snap.landed or snap.landed_dirs:
        parts.append(spark.read.schema(schema).option("basePath", f"{root.rstrip('/')}/{name}")
                     .option("pathGlobFilter", "*.jsonl")          # never a temporary file
                     .option("mode", "DROPMALFORMED").json(snap.landed_dirs + snap.landed))
    if not parts:
        return spark.createDataFrame([], schema)
    df = parts[0] if len(parts) == 1 else parts[0].unionByName(parts[1])
    return df.filter(_date_bound(first, last))


def _date_bound(first: str, last: str | None):
    return F.col("date") >= first if last is None else F.col("date").between(first, last)


def _read_rollup(spark, lake: str, name: str, snap: lakes.Snapshot, first: str, last: str | None) -> DataFrame | None:
    """The daily rollups ``snap`` reads (spark_reports.rollups), bounded by date as ``_read``; None without any."""
    if not snap.rollups:
        return None
    schema, _ = rollup_defs.SCHEMAS[name]
    df = spark.read.schema(schema).option("basePath", lakes.rollup_root(lake, name)).parquet(*snap.rollups)
    return df.select(*schema.names).filter(_date_bound(first, last))


def read_connections(spark, root: str, period: Period, lake: str | None = None) -> DataFrame:
    """Connection rows that may touch ``period``: closed on or after its first day
    (a connection open across the period is in a later partition). Later
    partitions of the lake are read only where a connection opened before the
    period's end (each run's manifest says when its earliest one opened); the
    landed files not compacted yet (the last minutes) are read whatever their date."""
    df = _read(spark, root, lake, "connections", CONNECTIONS_SCHEMA, period.date_of(period.first_day), None,
               opened_before=period.end)
    return df.filter(
        F.col("tenant").isNotNull() & F.col("connected_at").isNotNull() & F.col("disconnected_at").isNotNull())


def read_traffic(spark, root: str, period: Period, lake: str | None = None) -> DataFrame:
    df = _read(spark, root, lake, "traffic", TRAFFIC_SCHEMA, period.date_of(period.first_day),
               period.date_of(period.last_day))
    return df.filter(F.col("tenant").isNotNull() & F.col("ts").isNotNull())


def read_telemetry(spark, root: str, period: Period, tenant: str, lake: str | None = None) -> DataFrame:
    """One tenant's telemetry rows (store rules' output, ``spark_reports.telemetry``)
    in ``period``: bounded on both ends by date partitions and by ``ts``, and
    filtered by tenant before anything else reads them -- a tenant's report
    never holds another tenant's rows (the lake's row groups are sorted by
    tenant, so the filter also skips theirs)."""
    df = _read(spark, root, lake, "telemetry", TELEMETRY_SCHEMA, period.date_of(period.first_day),
               period.date_of(period.last_day))
    return df.filter((F.col("tenant") == tenant) & F.col("ts").isNotNull() & F.col("dataset").isNotNull()
                     & (F.col("ts") >= F.lit(float(period.start))) & (F.col("ts") < F.lit(float(period.end))))


def whole_days(period: Period) -> bool:
    """Daily rollups answer periods of whole UTC days (the console's): "opened in the period" is then
    "opened on one of its days"."""
    return period.start % DAY == 0 and period.end % DAY == 0


def traffic_groups(spark, root: str, period: Period, lake: str | None = None, tenant: str | None = None,
                   rollups: bool = True) -> DataFrame:
    """The period's traffic grouped per day, tenant, node and topic (spark_reports.rollups): the daily
    rollup of each day that has a current one, the raw rows of the others grouped the same way (the
    partial days: today, a day with landed files waiting or a rollup not made yet). Whole-day periods."""
    lake = lake or lakes.default_lake(root)
    first, last = period.date_of(period.first_day), period.date_of(period.last_day)
    snap = lakes.snapshot(spark, root, lake, "traffic", first, last, rollups=rollups)
    raw = _read(spark, root, lake, "traffic", TRAFFIC_SCHEMA, first, last, snap=snap)
    raw = raw.filter(F.col("tenant").isNotNull() & F.col("ts").isNotNull() & _in("ts", period))
    out = rollup_defs.traffic_groups(raw if tenant is None else for_tenant(raw, tenant))
    rolled = _read_rollup(spark, lake, "traffic", snap, first, last)
    if rolled is not None:
        rolled = rolled.filter(F.col("day").between(period.first_day, period.last_day))
        out = out.unionByName(rolled if tenant is None else for_tenant(rolled, tenant))
    return out.drop("date")


def connection_groups(spark, root: str, period: Period, lake: str | None = None, tenant: str | None = None,
                      rollups: bool = True) -> DataFrame:
    """The connections touching the period, grouped per tenant, node, device, reason, open day and
    close day (spark_reports.rollups): rollups of the partitions (close days) that have a current
    one, the raw rows of the others. Partitions as ``read_connections``. Whole-day periods."""
    lake = lake or lakes.default_lake(root)
    first = period.date_of(period.first_day)
    snap = lakes.snapshot(spark, root, lake, "connections", first, None, period.end, rollups=rollups)
    raw = _read(spark, root, lake, "connections", CONNECTIONS_SCHEMA, first, None, snap=snap)
    raw = raw.filter(F.col("tenant").isNotNull() & F.col("connected_at").isNotNull()
                     & F.col("disconnected_at").isNotNull() & (F.col("connected_at") < F.lit(period.end))
                     & (F.col("disconnected_at") >= F.lit(period.start)))
    out = rollup_defs.connection_groups(raw if tenant is None else for_tenant(raw, tenant))
    rolled = _read_rollup(spark, lake, "connections", snap, first, None)
    if rolled is not None:
        rolled = rolled.filter((F.col("open_day") <= period.last_day) & (F.col("close_day") >= period.first_day))
        out = out.unionByName(rolled if tenant is None else for_tenant(rolled, tenant))
    return out.drop("date")


def spans(spark, root: str, period: Period, lake: str | None = None, tenant: str | None = None) -> DataFrame:
    """The raw connections touching the period, four columns of them (``tenant``, ``node``,
    ``connected_at``, ``disconnected_at``) and ``duration``: what peak concurrency and the median
    session length need, the figures no daily rollup gives (spark_reports.rollups)."""
    df = read_connections(spark, root, period, lake)
    df = df if tenant is None else for_tenant(df, tenant)
    df = df.filter((F.col("connected_at") < F.lit(period.end)) & (F.col("disconnected_at") >= F.lit(period.start)))
    return df.select("tenant", F.coalesce(F.col("node"), F.lit("")).alias("node"), "connected_at",
                     "disconnected_at", (F.col("disconnected_at") - F.col("connected_at")).alias("duration"))


# ---------------------------------------------------------------- selections


def for_tenant(df: DataFrame, tenant: str) -> DataFrame:
    return df.filter(F.col("tenant") == tenant)


def traffic_in(traffic: DataFrame, period: Period) -> DataFrame:
    """Traffic rows of minutes in the period, counters null -> 0, ``msgs_in`` added."""
    df = traffic.filter((F.col("ts") >= F.lit(period.start)) & (F.col("ts") < F.lit(period.end)))
    df = df.fillna(0, subset=TRAFFIC_COUNTERS).fillna("", subset=["topic", "node"])
    return df.withColumn("msgs_in", F.col("msgs_in_q0") + F.col("msgs_in_q1") + F.col("msgs_in_q2"))


def touching(conns: DataFrame, period: Period) -> DataFrame:
    """Connections opened or closed in the period, or open across it; with
    ``device``, ``duration`` and counters null -> 0."""
    df = conns.filter((F.col("connected_at") < F.lit(period.end)) & (F.col("disconnected_at") >= F.lit(period.start)))
    df = df.fillna(0, subset=["msgs_in", "msgs_out", "bytes_in", "bytes_out"]).fillna(
        {"reason": "", "node": ""})
    return df.withColumn("device", rollup_defs.device()).withColumn(
        "duration", F.col("disconnected_at") - F.col("connected_at"))


def _in(col: str, period: Period):
    return (F.col(col) >= F.lit(period.start)) & (F.col(col) < F.lit(period.end))


def _day(col: str):
    return F.floor(F.col(col) / DAY).cast("long")


def _sums(cols):
    return [F.coalesce(F.sum(c), F.lit(0)).cast("long").alias(c) for c in cols]


# ---------------------------------------------------------------- jobs


def traffic_totals(traffic: DataFrame, by: list[str] | None = None, extra=()) -> DataFrame:
    """Sums of every counter (one row, or one per ``by`` group); ``messages`` = in + out.
    ``extra``: more aggregates computed in the same job (the report's row count)."""
    cols = ["msgs_in", *TRAFFIC_COUNTERS]
    df = traffic.groupBy(*(by or [])).agg(*_sums(cols), *extra)
    return df.withColumn("messages", F.col("msgs_in") + F.col("msgs_out")).withColumn(
        "rejected", sum((F.col(c) for c in REJECTED), F.lit(0))).withColumn(
        "dropped", sum((F.col(c) for c in DROPPED), F.lit(0)))


MEDIAN_ACCURACY = 10_000       # percentile_approx: the value returned is within n / 10,000 ranks of the median


def connection_totals(conns: DataFrame, period: Period, by: list[str] | None = None, extra=()) -> DataFrame:
    """connects, disconnects, distinct devices and the median length of the
    sessions closed in the period (null without any).

    The median is approximate: a session length whose rank is within
    ``n / MEDIAN_ACCURACY`` of the middle (n sessions; exact below 10,000 of
    them but for the mean of the two middle values). The exact ``percentile``
    holds every length of a group in one task's memory: at 50M rows the
    platform report ran out of the default 1 GiB driver on it (21 s where this
    takes 4 s)."""
    opened = _in("connected_at", period)
    closed = _in("disconnected_at", period)
    return conns.groupBy(*(by or [])).agg(
        F.coalesce(F.sum(F.when(opened, 1).otherwise(0)), F.lit(0)).cast("long").alias("connects"),
        F.coalesce(F.sum(F.when(closed, 1).otherwise(0)), F.lit(0)).cast("long").alias("disconnects"),
        F.countDistinct("tenant", "device").alias("devices"),        # one name in two tenants: two devices
        F.percentile_approx(F.when(closed, F.col("duration")), F.lit(0.5), F.lit(MEDIAN_ACCURACY)).alias(
            "median_session"),
        *extra,
    )


def group_connection_totals(groups: DataFrame, period: Period, by: list[str] | None = None, extra=()) -> DataFrame:
    """``connection_totals`` but the median, from ``connection_groups`` (whole days): connects (opened
    on a day of the period), disconnects (closed on one), distinct devices of the rows touching it."""
    days = (period.first_day, period.last_day)
    return groups.groupBy(*(by or [])).agg(
        F.coalesce(F.sum(F.when(F.col("open_day").between(*days), F.col("connections")).otherwise(0)),
                   F.lit(0)).cast("long").alias("connects"),
        F.coalesce(F.sum(F.when(F.col("close_day").between(*days), F.col("connections")).otherwise(0)),
                   F.lit(0)).cast("long").alias("disconnects"),
        F.countDistinct("tenant", "device").alias("devices"),
        *extra,
    )


def median_session(spans_: DataFrame, period: Period) -> DataFrame:
    """``median_session`` of ``connection_totals``, over ``spans``."""
    return spans_.agg(F.percentile_approx(F.when(_in("disconnected_at", period), F.col("duration")), F.lit(0.5),
                                          F.lit(MEDIAN_ACCURACY)).alias("median_session"))


PEAK_BUCKET = 3600      # seconds: the running sum is taken per bucket, then across buckets


def peak_concurrency(conns: DataFrame, period: Period, by: list[str] | None = None) -> DataFrame:
    """``peak_connections`` and ``peak_at`` (the first instant it was reached),
    one row (per ``by`` group); no row without connections.

    In two steps, so that no step needs all of a group's instants in one task
    (the platform's were one window partition: one task for the whole period):
    per hour bucket, the running sum of the net changes and its highest level
    (first instant reaching it); then, per group, each bucket's level is
    offset by the net change of the buckets before it -- a running sum over at
    most 24 rows a day. The level at an instant is the same sum either way."""
    by = by or []
    start = F.greatest(F.col("connected_at"), F.lit(float(period.start)))
    end = F.least(F.col("disconnected_at"), F.lit(float(period.end)))
    events = conns.select(*by, start.alias("t"), F.lit(1).alias("delta")).unionByName(
        conns.select(*by, end.alias("t"), F.lit(-1).alias("delta")))
    # net change per instant: disconnects before connects at one instant (see the module's docstring)
    per_instant = events.groupBy(*by, "t").agg(F.sum("delta").alias("net")).withColumn(
        "bucket", F.floor(F.col("t") / PEAK_BUCKET).cast("long"))
    in_bucket = [*by, "bucket"]
    running = Window.partitionBy(*in_bucket).orderBy("t").rowsBetween(Window.unboundedPreceding, Window.currentRow)
    levels = per_instant.withColumn("level_in", F.sum("net").over(running))
    top_first = Window.partitionBy(*in_bucket).orderBy(F.desc("level_in"), F.asc("t"))
    tops = (levels.withColumn("rank", F.row_number().over(top_first)).filter(F.col("rank") == 1)
            .select(*in_bucket, F.col("level_in").alias("top"), F.col("t").alias("top_at")))
    nets = per_instant.groupBy(*in_bucket).agg(F.sum("net").alias("bucket_net"))
    before = Window.partitionBy(*by).orderBy("bucket").rowsBetween(Window.unboundedPreceding, -1)
    buckets = tops.join(nets, in_bucket).withColumn(
        "level", F.coalesce(F.sum("bucket_net").over(before), F.lit(0)) + F.col("top"))
    best = Window.partitionBy(*by).orderBy(F.desc("level"), F.asc("top_at"))
    return (buckets.withColumn("rank", F.row_number().over(best)).filter(F.col("rank") == 1)
            .select(*by, F.greatest(F.col("level"), F.lit(0)).cast("long").alias("peak_connections"),
                    F.col("top_at").alias("peak_at")))


def daily(traffic: DataFrame, conns: DataFrame, period: Period) -> DataFrame:
    """One row per UTC day of the period (days without data: zeros): messages,
    bytes, rejections, drops, connects and disconnects (the churn)."""
    c_in = conns.filter(_in("connected_at", period)).groupBy(_day("connected_at").alias("day")).agg(
        F.count(F.lit(1)).alias("connects"))
    c_out = conns.filter(_in("disconnected_at", period)).groupBy(_day("disconnected_at").alias("day")).agg(
        F.count(F.lit(1)).alias("disconnects"))
    return _daily(period, traffic.withColumn("day", _day("ts")), c_in, c_out)


def daily_groups(traffic: DataFrame, groups: DataFrame, period: Period) -> DataFrame:
    """``daily`` from ``traffic_groups`` and ``connection_groups`` (whole days)."""
    days = (period.first_day, period.last_day)
    c_in = groups.filter(F.col("open_day").between(*days)).groupBy(F.col("open_day").alias("day")).agg(
        F.sum("connections").alias("connects"))
    c_out = groups.filter(F.col("close_day").between(*days)).groupBy(F.col("close_day").alias("day")).agg(
        F.sum("connections").alias("disconnects"))
    return _daily(period, traffic, c_in, c_out)


def _daily(period: Period, traffic: DataFrame, c_in: DataFrame, c_out: DataFrame) -> DataFrame:
    spark = traffic.sparkSession
    days = spark.range(period.first_day, period.last_day + 1).select(F.col("id").alias("day"))
    t = traffic.groupBy("day").agg(
        *_sums(["msgs_in", "msgs_out", "bytes_in", "bytes_out"]),
        F.sum(sum((F.col(c) for c in REJECTED), F.lit(0))).cast("long").alias("rejected"),
        F.sum(sum((F.col(c) for c in DROPPED), F.lit(0))).cast("long").alias("dropped"),
    )
    out = days.join(t, "day", "left").join(c_in, "day", "left").join(c_out, "day", "left")
    value_cols = ["msgs_in", "msgs_out", "bytes_in", "bytes_out", "rejected", "dropped", "connects", "disconnects"]
    return out.fillna(0, subset=value_cols).select("day", *[F.col(c).cast("long").alias(c) for c in value_cols]).orderBy(
        "day")


def top_topics(traffic: DataFrame, n: int = 10) -> DataFrame:
    """Topics by messages (in + out), then by name; tenant-wide rows (topic "") and topics
    without a message (only refused publishes: ACL denied, over quota) left out."""
    df = traffic.filter(F.col("topic") != "").groupBy("topic").agg(
        *_sums(["msgs_in", "msgs_out", "bytes_in", "bytes_out"]))
    df = df.withColumn("messages", F.col("msgs_in") + F.col("msgs_out")).withColumn(
        "bytes", F.col("bytes_in") + F.col("bytes_out")).filter(F.col("messages") > 0)
    return df.orderBy(F.desc("messages"), F.asc("topic")).limit(n)


def top_devices(conns: DataFrame, period: Period, n: int = 10) -> DataFrame:
    """Devices by the messages (in + out) of their connections closed in the
    period, then by name; connected seconds to the millisecond."""
    return _top_devices(conns.filter(_in("disconnected_at", period)), F.count(F.lit(1)), "duration", n)


def top_devices_groups(groups: DataFrame, period: Period, n: int = 10) -> DataFrame:
    """``top_devices`` from ``connection_groups`` (whole days)."""
    closed = groups.filter(F.col("close_day").between(period.first_day, period.last_day))
    return _top_devices(closed, F.sum("connections").cast("long"), "connected_seconds", n)


def _top_devices(closed: DataFrame, count, seconds: str, n: int) -> DataFrame:
    df = closed.groupBy("device").agg(
        *_sums(["msgs_in", "msgs_out", "bytes_in", "bytes_out"]),
        count.alias("connections"),
        F.round(F.sum(seconds), 3).alias("connected_seconds"),
    )
    df = df.withColumn("messages", F.col("msgs_in") + F.col("msgs_out")).withColumn(
        "bytes", F.col("bytes_in") + F.col("bytes_out"))
    return df.orderBy(F.desc("messages"), F.asc("device")).limit(n)


def disconnect_reasons(conns: DataFrame, period: Period) -> DataFrame:
    return (conns.filter(_in("disconnected_at", period)).groupBy("reason").agg(F.count(F.lit(1)).alias("count"))
            .orderBy(F.desc("count"), F.asc("reason")))


def disconnect_reasons_groups(groups: DataFrame, period: Period) -> DataFrame:
    closed = groups.filter(F.col("close_day").between(period.first_day, period.last_day))
    return (closed.groupBy("reason").agg(F.sum("connections").cast("long").alias("count"))
            .orderBy(F.desc("count"), F.asc("reason")))


def tenant_ranking(traffic: DataFrame, conns: DataFrame, period: Period) -> DataFrame:
    """Every tenant with traffic or connections in the period, by messages
    (in + out) descending, then by slug; ``rank`` 1.."""
    return _ranking(traffic_totals(traffic, ["tenant"]), connection_totals(conns, period, ["tenant"]),
                    peak_concurrency(conns, period, ["tenant"]))


def tenant_ranking_groups(traffic: DataFrame, groups: DataFrame, spans_: DataFrame, period: Period) -> DataFrame:
    """``tenant_ranking`` from ``traffic_groups``, ``connection_groups`` and ``spans`` (whole days)."""
    return _ranking(traffic_totals(traffic, ["tenant"]), group_connection_totals(groups, period, ["tenant"]),
                    peak_concurrency(spans_, period, ["tenant"]))


def _ranking(totals: DataFrame, conn_totals: DataFrame, peaks: DataFrame) -> DataFrame:
    t = totals.select("tenant", "msgs_in", "msgs_out", "messages", "bytes_in", "bytes_out", "rejected", "dropped")
    c = conn_totals.select("tenant", "connects", "devices")
    p = peaks.select("tenant", "peak_connections")
    df = t.join(c, "tenant", "full_outer").join(p, "tenant", "left")
    df = df.fillna(0, subset=["msgs_in", "msgs_out", "messages", "bytes_in", "bytes_out", "rejected", "dropped",
                              "connects", "devices", "peak_connections"])
    order = Window.orderBy(F.desc("messages"), F.asc("tenant"))
    return df.withColumn("rank", F.row_number().over(order)).orderBy("rank")


def node_load(traffic: DataFrame, conns: DataFrame, period: Period) -> DataFrame:
    """Per node: messages and bytes it handled, connects, disconnects and its own peak concurrency."""
    return _node_load(traffic_totals(traffic, ["node"]), connection_totals(conns, period, ["node"]),
                      peak_concurrency(conns, period, ["node"]))


def node_load_groups(traffic: DataFrame, groups: DataFrame, spans_: DataFrame, period: Period) -> DataFrame:
    """``node_load`` from ``traffic_groups``, ``connection_groups`` and ``spans`` (whole days)."""
    return _node_load(traffic_totals(traffic, ["node"]), group_connection_totals(groups, period, ["node"]),
                      peak_concurrency(spans_, period, ["node"]))


def _node_load(totals: DataFrame, conn_totals: DataFrame, peaks: DataFrame) -> DataFrame:
    t = totals.select("node", "msgs_in", "msgs_out", "messages", "bytes_in", "bytes_out")
    c = conn_totals.select("node", "connects", "disconnects")
    p = peaks.select("node", "peak_connections")
    df = t.join(c, "node", "full_outer").join(p, "node", "left")
    return df.fillna(0, subset=["msgs_in", "msgs_out", "messages", "bytes_in", "bytes_out", "connects",
                                "disconnects", "peak_connections"]).orderBy("node")
