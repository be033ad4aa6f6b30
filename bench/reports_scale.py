#!/usr/bin/env python3
"""The usage lake at scale (issue 20): N usage rows in brokerd's landing
layout, compacted into the Parquet lake, then the reports over it.

Writes the log as bench/reports_1m.py does (10% connections, 90% per-minute
traffic rows over 7 days, 3 nodes, 200 Zipf-weighted tenants: one JSON Lines
file per node, dataset and minute), runs one compaction (its own process,
its own SparkSession), then the tenant report of the biggest tenant and the
platform report, each in a fresh process: ``cold`` is the first report of
that process with the SparkSession start included (printed apart too),
``warm`` the same report again. ``--modes rollups,raw`` times each report
over the daily rollups (closed days; the default) and over the raw rows
(``rollups=False``), in their own processes. One line per figure, ``NAME: SECONDS s``,
with the driver's peak RSS after each report; each result is saved beside the
log (``ROOT-CODE-result.json``) for bench/reports_duckdb.py to check.

    .venv/bin/python bench/reports_scale.py --rows 1000000
    .venv/bin/python bench/reports_scale.py --rows 1000000 --keep /tmp/scale --write-only
    flock -x /work/notes/bench.lock .venv/bin/python bench/reports_scale.py --rows 1000000 --keep /tmp/scale --reuse

At 10M+ rows or months of history the landing's file per minute makes the
one-off compaction of the backlog the long part (4.5 ms a file): ``--files-per
day`` lands the same rows in a file per node, dataset and day, ``--into-lake``
(50M) has Spark make rows of the same shape straight into the lake:

    nice -n 10 .venv/bin/python bench/reports_scale.py --rows 10000000 --days 90 --files-per day --keep /tmp/h --compact-only
    flock -x /work/notes/bench.lock .venv/bin/python bench/reports_scale.py --days 90 --keep /tmp/h --reuse --reports history
    SPARK_DRIVER_MEMORY=3g nice -n 10 .venv/bin/python bench/reports_scale.py --rows 50000000 --into-lake --keep /tmp/50m --compact-only
    flock -x /work/notes/bench.lock .venv/bin/python bench/reports_scale.py --keep /tmp/50m --reuse --reports platform --cold-only

90-day reports with and without the daily rollups (the compaction makes them; over a lake from
``--into-lake`` or an older version the first compaction does):

    nice -n 10 .venv/bin/python bench/reports_scale.py --rows 1000000 --days 90 --files-per day --keep /tmp/r90 --compact-only
    flock -x /work/notes/bench.lock .venv/bin/python bench/reports_scale.py --days 90 --keep /tmp/r90 --reuse --no-compact --modes rollups,raw

Not part of the test suite: the time is measured, never asserted.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import date, timedelta
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from reports_1m import tenants_weighted, write_fleet_log  # noqa: E402

from spark_reports.jobs import Period  # noqa: E402

NODES = ["node1", "node2", "node3"]


def period_of(days: int) -> Period:
    first = date(2026, 3, 2)
    return Period.days(first, first + timedelta(days=days - 1))


def write(root: Path, rows: int, days: int, tenants: int, files_per: str = "minute", topics: int = 500) -> None:
    shutil.rmtree(root, ignore_errors=True)
    t0 = time.perf_counter()
    period = period_of(days)
    names, weights = tenants_weighted(tenants)
    write_fleet_log(root, rows, period, NODES, names, weights, files_per, topics)
    print(f"write: {time.perf_counter() - t0:.1f} s", flush=True)


def write_lake(spark, root: str, rows: int, days: int, tenants: int, topics: int = 500) -> None:
    """The fleet of ``write_fleet_log`` made by Spark itself and written straight into the lake
    (``--into-lake``): the same shape -- 10% connections (Zipf-weighted tenant, 300 devices each,
    7 client ids a device, closed uniformly over the period, lengths exponential around an hour
    up to 3 days, 0-2,000 messages each way, 64-byte messages), 90% traffic rows spread evenly
    over the period's minutes and the 3 nodes (Zipf-weighted tenant, 500 topics, 0-59 QoS 0 and
    0-19 QoS 1 messages in, 0-119 out, 1% with an ACL denial, 5% dropped for want of
    subscribers) -- but drawn by Spark's ``rand`` (so not the same rows), and traffic keys may
    repeat within a minute where brokerd's are unique (the reports add them up either way).
    Written by the lake's own writer (``lake._write_parquet``: rows sorted by tenant, 1 MiB row
    groups) and committed per date with a manifest (``lake._commit``): the layout a compaction
    leaves, without landing ~15 GB of JSON first and compacting it (too long for 50M rows here)."""
    from pyspark.sql import functions as F

    from spark_reports import lake
    from spark_reports.schemas import CONNECTIONS_SCHEMA, TRAFFIC_SCHEMA
    from spark_reports.usagegen import REASONS

    period = period_of(days)
    names, weights = tenants_weighted(tenants)
    buckets, total, acc, table = 100_000, sum(weights), 0.0, []
    for name, w in zip(names, weights, strict=True):      # u in [0, 1) -> tenant, by cumulative weight
        lo, acc = round(acc / total * buckets), acc + w
        table += [(b, name) for b in range(lo, round(acc / total * buckets))]
    tenant_of = F.broadcast(spark.createDataFrame(table, "bucket int, tenant string"))

    def pick(seed):
        return F.floor(F.rand(seed) * buckets).cast("int").alias("bucket")

    def rnd(seed, n):
        return F.floor(F.rand(seed) * n).cast("long")

    n_conn = rows // 10
    seconds = period.end - period.start
    conns = spark.range(n_conn).select("id", pick(11), (F.lit(period.start) + F.rand(12) * (seconds - 1)).alias(
        "closed"), F.least(-F.log(1 - F.rand(13)) * 3600, F.lit(3 * 86400.0)).alias("length"),
        F.format_string("dev%03d", rnd(14, 300)).alias("dev"), rnd(15, 2000).alias("m_in"),
        rnd(16, 2000).alias("m_out"), rnd(17, len(NODES)).alias("n"), rnd(18, len(REASONS)).alias("r"))
    conns = conns.join(tenant_of, "bucket").select(
        "tenant", F.concat_ws("-", "dev", (F.col("id") % 7).cast("string")).alias("client_id"),
        F.concat_ws("/", "tenant", "dev").alias("username"),
        F.element_at(F.array(*map(F.lit, NODES)), F.col("n").cast("int") + 1).alias("node"),
        F.lit("5.0").alias("protocol"), F.lit("127.0.0.1").alias("ip"),
        F.round(F.col("closed") - F.round("length", 3), 3).alias("connected_at"),
        F.round("closed", 3).alias("disconnected_at"), F.col("m_in").alias("msgs_in"),
        F.col("m_out").alias("msgs_out"), (F.col("m_in") * 64).alias("bytes_in"),
        (F.col("m_out") * 64).alias("bytes_out"),
        F.element_at(F.array(*map(F.lit, REASONS)), F.col("r").cast("int") + 1).alias("reason"))
    conns = conns.withColumn("date", F.from_unixtime(F.floor("disconnected_at"), "yyyy-MM-dd"))

    n_traffic = rows - n_conn
    minutes = int(seconds // 60)
    zero = F.lit(0).cast("long")
    traffic = spark.range(n_traffic).select(
        (F.lit(int(period.start)) + 60 * ((F.col("id") * minutes) / n_traffic).cast("long")).alias("ts"),
        F.element_at(F.array(*map(F.lit, NODES)), (F.col("id") % len(NODES)).cast("int") + 1).alias("node"),
        pick(21), F.format_string("site/%d/telemetry", rnd(22, topics)).alias("topic"),
        rnd(23, 60).alias("q0"), rnd(24, 20).alias("q1"), rnd(25, 120).alias("out"),
        (F.rand(26) < 0.01).cast("long").alias("acl"), (F.rand(27) < 0.05).cast("long").alias("nosub"))
    traffic = traffic.join(tenant_of, "bucket").select(
        "ts", "node", "tenant", "topic", F.col("q0").alias("msgs_in_q0"), F.col("q1").alias("msgs_in_q1"),
        zero.alias("msgs_in_q2"), ((F.col("q0") + F.col("q1")) * 64).alias("bytes_in"),
        F.col("out").alias("msgs_out"), (F.col("out") * 64).alias("bytes_out"), zero.alias("dropped_queue_full"),
        zero.alias("dropped_expired"), F.col("nosub").alias("dropped_no_subscribers"),
        F.col("acl").alias("acl_denied"), zero.alias("quota_rejected"), zero.alias("auth_failures"),
        F.from_unixtime("ts", "yyyy-MM-dd").alias("date"))

    fs = lake.HadoopFS(spark)
    where = lake.default_lake(root)
    fs.mkdirs(where)
    now = time.time()
    run = lake.new_run_id(now)
    with lake.Lease(fs, where):
        for dataset, df, schema, time_col in (("connections", conns, CONNECTIONS_SCHEMA, "disconnected_at"),
                                              ("traffic", traffic, TRAFFIC_SCHEMA, "ts")):
            t0 = time.perf_counter()
            staged = f"{where}/{lake.STAGING}/{run}/{dataset}"
            stats = lake._write_parquet(spark, df.select(*schema.names), schema, time_col, staged,
                                        lake.ROW_GROUP_BYTES)
            for day in sorted(stats):
                lake._commit(fs, where, dataset, run, staged, day, [], stats[day], now)
            print(f"into the lake: {dataset} {sum(v['rows'] for v in stats.values()):,} rows, {len(stats)} dates, "
                  f"{time.perf_counter() - t0:.1f} s", flush=True)
        fs.delete(f"{where}/{lake.STAGING}/{run}", True)


def files_and_bytes(root: Path, pattern: str) -> tuple[int, int]:
    paths = [p for p in root.glob(pattern) if p.is_file()]
    return len(paths), sum(p.stat().st_size for p in paths)


def peak_rss(spark) -> str:
    """The highest resident set so far of the driver's JVM and of this Python process (VmHWM), and the
    JVM's heap limit: what SPARK_DRIVER_MEMORY bounds (local mode: the driver runs the tasks too)."""
    jvm = spark.sparkContext._jvm
    pid = jvm.java.lang.ProcessHandle.current().pid()

    def hwm(p) -> float:
        for line in Path(f"/proc/{p}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    runtime = jvm.java.lang.Runtime.getRuntime()
    jvm.java.lang.System.gc()
    live = (runtime.totalMemory() - runtime.freeMemory()) / 2**20
    return (f"driver JVM peak RSS {hwm(pid):,.0f} MiB (heap limit {runtime.maxMemory() / 2**20:,.0f} MiB, "
            f"{live:,.0f} MiB in use after a GC), Python {hwm('self'):,.0f} MiB")


def _stages(spark) -> list:
    """Every stage's StageData in Spark's status store (kept with the web UI off too)."""
    store = spark.sparkContext._jsc.sc().statusStore()
    seq = store.stageList(None, *(getattr(store, f"stageList$default${i}")() for i in range(2, 6)))
    return [seq.apply(i) for i in range(seq.length())]


def stages_since(spark, first_stage: int) -> tuple[int, int, int]:
    """(stages, input bytes, input records) of the stages numbered ``first_stage`` and after: what
    their tasks read from files (and from DISK_ONLY blocks, which count as input too)."""
    n = b = r = 0
    for st in _stages(spark):
        if st.stageId() >= first_stage:
            n, b, r = n + 1, b + st.inputBytes(), r + st.inputRecords()
    return n, b, r


def save(root: str, name: str, result: dict) -> None:
    """A report's result beside the log (``ROOT-NAME-result.json``), for bench/reports_duckdb.py to check."""
    Path(f"{root.rstrip('/')}-{name}-result.json").write_text(json.dumps(result, default=str))


def next_stage(spark) -> int:
    return max((st.stageId() for st in _stages(spark)), default=-1) + 1


def read_cost(spark, root: str, period, tenant: str | None) -> str:
    """What reading the period's rows (of one tenant) costs: Parquet/JSON files, rows and bytes the scans
    read (every column, as the reports do; the ``noop`` sink writes nothing)."""
    from spark_reports import jobs

    parts = []
    for name, read in (("traffic", jobs.read_traffic), ("connections", jobs.read_connections)):
        df = read(spark, root, period)
        df = jobs.for_tenant(df, tenant) if tenant else df
        files = len(df.inputFiles())
        first = next_stage(spark)
        df.write.format("noop").mode("overwrite").save()
        _, size, rows = stages_since(spark, first)
        parts.append(f"{name}: {files:,} files, {rows:,} rows / {size / 2**20:,.1f} MiB read")
    return "; ".join(parts)


def history(spark, root: str, days: int) -> None:
    """In one session (the worker's): the platform report of the history's last day, of its last 7 days,
    then of the last day again -- each with the files its reads list and the rows they scan."""
    from spark_reports import reports
    from spark_reports.jobs import Period

    whole = period_of(days)
    last = Period(whole.end - 86400, whole.end)
    week = Period(whole.end - 7 * 86400, whole.end)
    for label, period in (("1 day", last), ("7 days", week), ("1 day again", last)):
        t0 = time.perf_counter()
        result = reports.get("platform").run(spark, root, period)
        took = time.perf_counter() - t0
        print(f"platform report of {label} ({days} days of history): {took:.1f} s", flush=True)
        save(root, f"platform-last{round((period.end - period.start) / 86400)}", result)
        print(f"  ({result['rows']['traffic']:,} traffic + {result['rows']['connections']:,} connection rows; "
              f"{result['totals']['messages']:,} messages; {read_cost(spark, root, period, None)}; "
              f"{peak_rss(spark)})", flush=True)


def tenant_costs(spark, root: str, days: int, tenants: int) -> None:
    """The biggest and the smallest tenant's report (warm), with what their reads scan."""
    from spark_reports import reports

    names = tenants_weighted(tenants)[0]
    period = period_of(days)
    reports.get("tenant").run(spark, root, period, names[0])         # warm-up: JIT, the session's first job
    for tenant in (names[0], names[-1]):
        t0 = time.perf_counter()
        result = reports.get("tenant").run(spark, root, period, tenant)
        took = time.perf_counter() - t0
        print(f"tenant report of {tenant}: {took:.1f} s", flush=True)
        save(root, f"tenant-{tenant}", result)
        print(f"  ({result['rows']['traffic']:,} traffic + {result['rows']['connections']:,} connection rows of "
              f"its own; {result['totals']['messages']:,} messages; {read_cost(spark, root, period, tenant)})",
              flush=True)


def cds_note() -> str:
    """What the driver JVM started with (spark_reports.cds): the archive it maps, or one it writes at exit."""
    from spark_reports.spark import cds_plan

    plan = cds_plan()
    if plan.use:
        return f"class-data sharing archive {plan.use.name}"
    return "no class-data sharing archive yet (this JVM writes one at exit)" if plan.part else \
        "class-data sharing off"


def child(argv: list[str]) -> int:
    """In a fresh process: ``compact ROOT``, ``report CODE ROOT DAYS TENANTS``, ``history ROOT DAYS``,
    ``tenants ROOT DAYS TENANTS`` or ``into-lake ROOT ROWS DAYS TENANTS``."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from spark_reports import lake, reports
    from spark_reports.spark import get_spark

    t0 = time.perf_counter()
    spark = get_spark()
    start = time.perf_counter() - t0
    if argv[0] == "compact":
        r = lake.compact(spark, argv[1], settle=0, keep_landed=0)
        print(f"compaction: {r.seconds:.1f} s", flush=True)
        print(f"  (session start {start:.1f} s apart; {r.files:,} landed files, {r.rows:,} rows; daily rollups of "
              f"{len(r.rolled_up):,} dataset-dates in {r.rollup_seconds:.1f} s of it; {peak_rss(spark)})", flush=True)
        return 0
    if argv[0] == "into-lake":
        write_lake(spark, argv[1], int(argv[2]), int(argv[3]), int(argv[4]), int(argv[5]))
        return 0
    if argv[0] == "history":
        history(spark, argv[1], int(argv[2]))
        return 0
    if argv[0] == "tenants":
        tenant_costs(spark, argv[1], int(argv[2]), int(argv[3]))
        return 0
    code, root, days, tenants, attempts, mode = argv[1], argv[2], int(argv[3]), int(argv[4]), argv[5], argv[6]
    tenant = tenants_weighted(tenants)[0][0] if code == "tenant" else None
    label = "" if mode == "rollups" else " (raw rows)"
    for attempt in attempts.split(","):
        t0 = time.perf_counter()
        result = reports.get(code).run(spark, root, period_of(days), tenant, rollups=mode == "rollups")
        took = time.perf_counter() - t0 + (start if attempt == "cold" else 0)
        print(f"{code} report {attempt}{label}: {took:.1f} s", flush=True)
        save(root, code if mode == "rollups" else f"{code}-raw", result)
        rows = result["rows"]
        note = f"session start {start:.1f} s included, {cds_note()}; " if attempt == "cold" else ""
        print(f"  ({note}"
              f"{rows['traffic']:,} traffic + {rows['connections']:,} connection rows; "
              f"{result['totals']['messages']:,} messages; {peak_rss(spark)})", flush=True)
    return 0


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        return child(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--days", type=int, default=7)
    ap.add_argument("--tenants", type=int, default=200)
    ap.add_argument("--topics", type=int, default=500,
                    help="topics a tenant's traffic is spread over (fewer: more minutes of each topic a day, "
                         "so daily rollups hold fewer rows)")
    ap.add_argument("--keep", metavar="DIR", help="write the log here and keep it (default: a temporary directory)")
    ap.add_argument("--reuse", action="store_true", help="with --keep: the log (or lake) already there")
    ap.add_argument("--write-only", action="store_true", help="with --keep: write the log and stop")
    ap.add_argument("--no-compact", action="store_true", help="the reports over the landed files alone (before)")
    ap.add_argument("--files-per", choices=("minute", "day"), default="minute",
                    help="landed files: brokerd's one per node, dataset and minute, or one per day (the same rows "
                         "in 1,440 times fewer files, for 10M+ rows or months of history: the compaction's cost "
                         "per file is left out, the lake it makes is the same)")
    ap.add_argument("--into-lake", action="store_true",
                    help="no landed files: Spark makes the fleet's rows and writes them straight into the lake "
                         "(see write_lake: the same shape, other random draws), for 50M rows")
    ap.add_argument("--cold-only", action="store_true", help="each report once (its process's first), not again warm")
    ap.add_argument("--modes", default="rollups",
                    help="tenant and platform reports: 'rollups' (closed days from the daily rollups, the "
                         "default), 'raw' (every raw row of the period: rollups=False), or 'rollups,raw' -- each "
                         "in a fresh process, cold then warm")
    ap.add_argument("--compact-only", action="store_true", help="write (unless --reuse) and compact, no report")
    ap.add_argument("--reports", default="tenant,platform",
                    help="what to time after the compaction, comma-separated: tenant, platform, "
                         "history (the last day, the last 7 days, the last day again: one session), "
                         "tenants (the biggest and the smallest tenant's report, what each reads)")
    args = ap.parse_args()
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="usage-scale-"))
    me = [sys.executable, str(Path(__file__).resolve()), "--child"]
    try:
        if args.into_lake and not args.reuse:
            shutil.rmtree(root, ignore_errors=True)
            subprocess.run([*me, "into-lake", str(root), str(args.rows), str(args.days), str(args.tenants),
                            str(args.topics)], check=True)
        elif not args.reuse:
            write(root, args.rows, args.days, args.tenants, args.files_per, args.topics)
        n, size = files_and_bytes(root, "*/date=*/*.jsonl")
        print(f"landing: {n:,} files, {size / 2**20:.1f} MiB", flush=True)
        if args.write_only:
            return 0
        if not args.no_compact:
            # also over a lake made --into-lake or by an earlier version: the closed days' daily rollups
            subprocess.run([*me, "compact", str(root)], check=True)
        n, size = files_and_bytes(root, "lake/*/date=*/run=*/*.parquet")
        print(f"lake: {n:,} Parquet files, {size / 2**20:.1f} MiB", flush=True)
        n, size = files_and_bytes(root, "lake/rollups/*/date=*/run=*/*.parquet")
        print(f"daily rollups: {n:,} Parquet files, {size / 2**20:.1f} MiB", flush=True)
        if args.compact_only:
            return 0
        for code in args.reports.split(","):
            if code == "history":
                subprocess.run([*me, "history", str(root), str(args.days)], check=True)
            elif code == "tenants":
                subprocess.run([*me, "tenants", str(root), str(args.days), str(args.tenants)], check=True)
            else:
                for mode in args.modes.split(","):
                    subprocess.run([*me, "report", code, str(root), str(args.days), str(args.tenants),
                                    "cold" if args.cold_only else "cold,warm", mode], check=True)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
