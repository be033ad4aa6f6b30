"""The usage log's datasets as Spark schemas (README, *Usage reports*),
shared by the jobs that read them and the compaction that moves them into
the lake; ``date`` is the partition directory's."""

from pyspark.sql import types as T

CONNECTIONS_SCHEMA = T.StructType([
    T.StructField("tenant", T.StringType()),
    T.StructField("client_id", T.StringType()),
    T.StructField("username", T.StringType()),
    T.StructField("node", T.StringType()),
    T.StructField("protocol", T.StringType()),
    T.StructField("ip", T.StringType()),
    T.StructField("connected_at", T.DoubleType()),
    T.StructField("disconnected_at", T.DoubleType()),
    T.StructField("msgs_in", T.LongType()),
    T.StructField("msgs_out", T.LongType()),
    T.StructField("bytes_in", T.LongType()),
    T.StructField("bytes_out", T.LongType()),
    T.StructField("reason", T.StringType()),
    T.StructField("date", T.StringType()),      # the partition directory
])

TRAFFIC_COUNTERS = [
    "msgs_in_q0", "msgs_in_q1", "msgs_in_q2", "bytes_in", "msgs_out", "bytes_out",
    "dropped_queue_full", "dropped_expired", "dropped_no_subscribers",
    "acl_denied", "quota_rejected", "auth_failures",
]

TRAFFIC_SCHEMA = T.StructType([
    T.StructField("ts", T.LongType()),
    T.StructField("node", T.StringType()),
    T.StructField("tenant", T.StringType()),
    T.StructField("topic", T.StringType()),
    *[T.StructField(name, T.LongType()) for name in TRAFFIC_COUNTERS],
    T.StructField("date", T.StringType()),
])

# store rules' output rows (brokerd.integrations.telemetry): ``data`` is the row as a JSON object
TELEMETRY_SCHEMA = T.StructType([
    T.StructField("tenant", T.StringType()),
    T.StructField("dataset", T.StringType()),
    T.StructField("rule", T.LongType()),
    T.StructField("ts", T.DoubleType()),
    T.StructField("client_id", T.StringType()),
    T.StructField("topic", T.StringType()),
    T.StructField("node", T.StringType()),
    T.StructField("data", T.StringType()),
    T.StructField("date", T.StringType()),
])
