"""Daily rollups of the usage lake (issue 20): what the reports sum, grouped
per day, so that a report over 30 or 90 days reads a few grouped rows per
tenant, node, topic and device instead of every per-minute traffic row and
every connection.

The compaction (``spark_reports.lake``) writes them for closed days from
the lake's committed rows; a report (``spark_reports.jobs``, ``*_groups``)
reads the rollup of a day where it is current and groups that day's raw
rows the same way where it is not -- both sides have the same columns, so
the report's jobs run on their union and cannot tell them apart.

- traffic: per ``(day, tenant, node, topic)``: the number of rows, ``msgs_in``
  and the sum of every counter. Everything the reports take from traffic
  is a sum of these (messages, bytes, rejections, drops, top topics, the
  daily series, per tenant and per node).
- connections: per ``(tenant, node, device, reason, open_day, close_day)``:
  the number of connections, their messages and bytes in and out, and their
  connected seconds. With whole-day periods, "opened in the period" is
  ``open_day`` in it, "closed in it" ``close_day`` in it and "touching it"
  ``open_day <= last day and close_day >= first day``, exactly: connects,
  disconnects, the daily churn, top devices, disconnect reasons -- and the
  distinct devices, exactly too (the device is a key: a day's rollup holds
  its device set, and the period's devices are the distinct keys of the
  rows touching it).

What no daily rollup can give: peak concurrency (a maximum over instants of
intervals that span days) and the median session length (a percentile).
The reports compute both from the raw connection rows of the period, read
with the four columns they need (``spans`` in jobs).
"""

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from .schemas import TRAFFIC_COUNTERS

DAY = 86400

TRAFFIC_ROLLUP_SCHEMA = T.StructType([
    T.StructField("day", T.LongType()),            # UTC day number of ``ts``
    T.StructField("tenant", T.StringType()),
    T.StructField("node", T.StringType()),
    T.StructField("topic", T.StringType()),
    T.StructField("rows", T.LongType()),           # traffic rows grouped here
    T.StructField("msgs_in", T.LongType()),
    *[T.StructField(name, T.LongType()) for name in TRAFFIC_COUNTERS],
    T.StructField("date", T.StringType()),         # the lake partition it was made from
])

CONNECTION_SUMS = ["msgs_in", "msgs_out", "bytes_in", "bytes_out"]

CONNECTIONS_ROLLUP_SCHEMA = T.StructType([
    T.StructField("tenant", T.StringType()),
    T.StructField("node", T.StringType()),
    T.StructField("device", T.StringType()),
    T.StructField("reason", T.StringType()),
    T.StructField("open_day", T.LongType()),       # UTC day number of ``connected_at``
    T.StructField("close_day", T.LongType()),      # ... of ``disconnected_at``
    T.StructField("connections", T.LongType()),
    *[T.StructField(name, T.LongType()) for name in CONNECTION_SUMS],
    T.StructField("connected_seconds", T.DoubleType()),
    T.StructField("date", T.StringType()),
])

# dataset -> (rollup schema, the column its rows are sorted by after tenant)
SCHEMAS = {"traffic": (TRAFFIC_ROLLUP_SCHEMA, "day"), "connections": (CONNECTIONS_ROLLUP_SCHEMA, "close_day")}


def day_of(col: str):
    return F.floor(F.col(col) / DAY).cast("long")


def device():
    """A device is the DEVICE of ``TENANT/DEVICE``, else the user name or client id."""
    return F.when(F.col("username").contains("/"), F.expr("substr(username, instr(username, '/') + 1)")
                  ).otherwise(F.coalesce(F.col("username"), F.col("client_id")))


def traffic_groups(df: DataFrame) -> DataFrame:
    """Raw traffic rows (with ``date``) -> the traffic rollup's rows. Counters null -> 0, topic and node
    null -> "" first, as the reports take them (``jobs.traffic_in``)."""
    df = df.fillna(0, subset=TRAFFIC_COUNTERS).fillna("", subset=["topic", "node"])
    msgs_in = F.col("msgs_in_q0") + F.col("msgs_in_q1") + F.col("msgs_in_q2")
    return df.groupBy("date", day_of("ts").alias("day"), "tenant", "node", "topic").agg(
        F.count(F.lit(1)).alias("rows"), F.sum(msgs_in).cast("long").alias("msgs_in"),
        *[F.sum(c).cast("long").alias(c) for c in TRAFFIC_COUNTERS]).select(*TRAFFIC_ROLLUP_SCHEMA.names)


def connection_groups(df: DataFrame) -> DataFrame:
    """Raw connection rows (with ``date``; tenant and both instants not null) -> the connections
    rollup's rows. Counters null -> 0, reason and node null -> "" first (``jobs.touching``)."""
    df = df.fillna(0, subset=CONNECTION_SUMS).fillna({"reason": "", "node": ""})
    return df.groupBy("date", "tenant", "node", device().alias("device"), "reason",
                      day_of("connected_at").alias("open_day"), day_of("disconnected_at").alias("close_day")).agg(
        F.count(F.lit(1)).alias("connections"), *[F.sum(c).cast("long").alias(c) for c in CONNECTION_SUMS],
        F.sum(F.col("disconnected_at") - F.col("connected_at")).alias("connected_seconds"),
    ).select(*CONNECTIONS_ROLLUP_SCHEMA.names)


GROUPERS = {"traffic": traffic_groups, "connections": connection_groups}
