#!/usr/bin/env python3
"""The usage reports over 1,000,000 usage-log rows: how long Spark takes.

Writes a usage log in brokerd's layout (one JSON Lines file per node,
dataset and minute) -- by default 900,000 per-minute traffic rows and
100,000 connection rows over 7 days, 3 nodes, 200 tenants (a few big, many
small), 500 topics and 300 devices per tenant -- then times the tenant
report of the biggest tenant and the platform report (cold: the first
report of the session, then warm), on the same SparkSession a worker keeps.

    .venv/bin/python bench/reports_1m.py                  # 1,000,000 rows in a temporary directory
    .venv/bin/python bench/reports_1m.py --rows 200000 --keep /tmp/usage
    SPARK_MASTER=spark://HOST:7077 .venv/bin/python bench/reports_1m.py

Not part of the test suite: the time is measured, never asserted.
"""

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from spark_reports import reports, usagegen
from spark_reports.jobs import Period


def tenants_weighted(n: int) -> tuple[list[str], list[float]]:
    names = [f"t{i:03d}" for i in range(n)]
    return names, [1 / (i + 1) for i in range(n)]          # Zipf-like: t000 the biggest


class DayFiles:
    """One landed file per node, dataset and UTC day (``<node>-<YYYYMMDD>2359.jsonl``: the stamp of the
    day's last minute, so the compaction takes it as closed), lines appended as they come: the
    same rows as brokerd's file per minute in 1,440 times fewer files (--files-per day)."""

    def __init__(self, root: Path, dataset: str):
        self.root, self.dataset, self.open = root, dataset, {}

    def write(self, ts: float, node: str, lines: list[str]) -> None:
        day = datetime.fromtimestamp(ts, tz=UTC)
        key = (f"{day:%Y-%m-%d}", node)
        if key not in self.open:
            directory = self.root / self.dataset / f"date={key[0]}"
            directory.mkdir(parents=True, exist_ok=True)
            self.open[key] = (directory / f"{node}-{day:%Y%m%d}2359.jsonl").open("a")
        self.open[key].write("\n".join(lines) + "\n")

    def close(self) -> int:
        for f in self.open.values():
            f.close()
        return len(self.open)


def write_traffic(root: Path, rng: random.Random, rows: int, period: Period, nodes: list[str], tenants, weights,
                  topics: int, per_day: DayFiles | None = None) -> int:
    minutes = int((period.end - period.start) // 60)
    per_file, extra = divmod(rows, minutes * len(nodes))     # the first `extra` files get one more row
    written, index = 0, 0
    for m in range(minutes):
        ts = int(period.start) + 60 * m
        day = datetime.fromtimestamp(ts, tz=UTC)
        directory = root / "traffic" / f"date={day:%Y-%m-%d}"
        if per_day is None:
            directory.mkdir(parents=True, exist_ok=True)
        for node in nodes:
            n = min(per_file + (index < extra), rows - written)
            index += 1
            if n <= 0:
                return written
            lines, seen = [], set()
            for tenant in rng.choices(tenants, weights, k=n):
                topic = f"site/{rng.randrange(topics)}/telemetry"
                while (tenant, topic) in seen:
                    topic = f"site/{rng.randrange(topics)}/telemetry/{rng.randrange(1000)}"
                seen.add((tenant, topic))
                q0, q1 = rng.randrange(0, 60), rng.randrange(0, 20)
                out = rng.randrange(0, 120)
                lines.append(json.dumps(usagegen.traffic_row(
                    ts, tenant, topic, node=node, msgs_in_q0=q0, msgs_in_q1=q1, bytes_in=(q0 + q1) * 64,
                    msgs_out=out, bytes_out=out * 64, acl_denied=rng.random() < 0.01,
                    dropped_no_subscribers=rng.random() < 0.05), separators=(",", ":")))
            if per_day is not None:
                per_day.write(ts, node, lines)
            else:
                (directory / f"{node}-{day:%Y%m%d%H%M}.jsonl").write_text("\n".join(lines) + "\n")
            written += n
    return written


def write_fleet_log(root: Path, rows: int, period: Period, nodes: list[str], tenants, weights,
                    files_per: str = "minute", topics: int = 500) -> tuple[int, int, int]:
    """``rows`` usage-log rows of a fleet in brokerd's landing layout (10 % connections, 300 devices a
    tenant, traffic over ``topics`` topics); -> (connection rows, their files, traffic rows).
    ``files_per="day"``: the same rows, one file per node, dataset and day (DayFiles), written as they
    are made (no list of every connection in memory): 50M rows without 60,000 files to compact."""
    rng = random.Random(1)
    n_conn = rows // 10
    conns, conn_days = [], DayFiles(root, "connections") if files_per == "day" else None
    for i in range(n_conn):
        tenant = rng.choices(tenants, weights)[0]
        dev = f"dev{rng.randrange(300):03d}"
        closed = round(rng.uniform(period.start, period.end - 1), 3)
        length = round(min(rng.expovariate(1 / 3600), 3 * 86400), 3)
        m_in, m_out = rng.randrange(0, 2000), rng.randrange(0, 2000)
        row = usagegen.connection_row(
            tenant, f"{dev}-{i % 7}", closed - length, closed, username=f"{tenant}/{dev}",
            node=rng.choice(nodes), msgs_in=m_in, msgs_out=m_out, bytes_in=m_in * 64, bytes_out=m_out * 64,
            reason=rng.choice(usagegen.REASONS))
        if conn_days is not None:
            conn_days.write(closed, row["node"], [json.dumps(row, separators=(",", ":"))])
        else:
            conns.append(row)
    conn_files = conn_days.close() if conn_days is not None else usagegen.write_rows(root, "connections", conns)
    del conns
    traffic_days = DayFiles(root, "traffic") if files_per == "day" else None
    traffic = write_traffic(root, rng, rows - n_conn, period, nodes, tenants, weights, topics, traffic_days)
    if traffic_days is not None:
        traffic_days.close()
    return n_conn, conn_files, traffic


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000, help="usage-log rows in all (10%% connections)")
    ap.add_argument("--days", type=int, default=7)
    ap.add_argument("--tenants", type=int, default=200)
    ap.add_argument("--keep", metavar="DIR", help="write the log here and keep it (default: a temporary directory)")
    ap.add_argument("--reuse", action="store_true", help="with --keep: time the reports on the log already there")
    args = ap.parse_args()

    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="usage-bench-"))
    first = date(2026, 3, 2)
    period = Period.days(first, first + timedelta(days=args.days - 1))
    nodes = ["node1", "node2", "node3"]
    tenants, weights = tenants_weighted(args.tenants)
    try:
        if not args.reuse:
            shutil.rmtree(root, ignore_errors=True)
            t0 = time.perf_counter()
            n_conn, conn_files, traffic = write_fleet_log(root, args.rows, period, nodes, tenants, weights)
            files = sum(1 for _ in root.rglob("*.jsonl"))
            size = sum(p.stat().st_size for p in root.rglob("*.jsonl"))
            print(f"wrote {n_conn:,} connection rows ({conn_files:,} files) and {traffic:,} traffic rows: "
                  f"{files:,} files, {size / 2**20:.0f} MiB, in {time.perf_counter() - t0:.1f} s", flush=True)

        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        from spark_reports.spark import get_spark, setting

        t0 = time.perf_counter()
        spark = get_spark()
        print(f"SparkSession ({setting('SPARK_MASTER', 'local[*]')}, "
              f"{spark.sparkContext.defaultParallelism} cores): {time.perf_counter() - t0:.1f} s", flush=True)
        for attempt in ("cold", "warm"):
            for code, tenant in (("tenant", tenants[0]), ("platform", None)):
                t0 = time.perf_counter()
                result = reports.get(code).run(spark, str(root), period, tenant)
                took = time.perf_counter() - t0
                rows = result["rows"]
                print(f"{code:8} report {attempt}: {took:6.1f} s  ({rows['traffic']:,} traffic + "
                      f"{rows['connections']:,} connection rows selected; {result['totals']['messages']:,} messages, "
                      f"peak {result['totals']['peak_connections']:,} connections)", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
