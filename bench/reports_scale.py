#!/usr/bin/env python3
"""The usage lake at scale (issue 20): N usage rows in brokerd's landing
layout, compacted into the Parquet lake, then the reports over it.

Writes the log as bench/reports_1m.py does (10% connections, 90% per-minute
traffic rows over 7 days, 3 nodes, 200 Zipf-weighted tenants: one JSON Lines
file per node, dataset and minute), runs one compaction (its own process,
its own SparkSession), then the tenant report of the biggest tenant and the
platform report, each in a fresh process: ``cold`` is the first report of
that process with the SparkSession start included (printed apart too),
``warm`` the same report again. One line per figure, ``NAME: SECONDS s``.

    .venv/bin/python bench/reports_scale.py --rows 1000000
    .venv/bin/python bench/reports_scale.py --rows 1000000 --keep /tmp/scale --write-only
    flock -x /work/notes/bench.lock .venv/bin/python bench/reports_scale.py --rows 1000000 --keep /tmp/scale --reuse

Not part of the test suite: the time is measured, never asserted.
"""

import argparse
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


def write(root: Path, rows: int, days: int, tenants: int) -> None:
    shutil.rmtree(root, ignore_errors=True)
    t0 = time.perf_counter()
    period = period_of(days)
    names, weights = tenants_weighted(tenants)
    write_fleet_log(root, rows, period, NODES, names, weights)
    print(f"write: {time.perf_counter() - t0:.1f} s", flush=True)


def files_and_bytes(root: Path, pattern: str) -> tuple[int, int]:
    paths = [p for p in root.glob(pattern) if p.is_file()]
    return len(paths), sum(p.stat().st_size for p in paths)


def child(argv: list[str]) -> int:
    """In a fresh process: ``compact ROOT`` or ``report CODE ROOT DAYS TENANTS``."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from spark_reports import lake, reports
    from spark_reports.spark import get_spark

    t0 = time.perf_counter()
    spark = get_spark()
    start = time.perf_counter() - t0
    if argv[0] == "compact":
        r = lake.compact(spark, argv[1], settle=0, keep_landed=0)
        print(f"compaction: {r.seconds:.1f} s", flush=True)
        print(f"  (session start {start:.1f} s apart; {r.files:,} landed files, {r.rows:,} rows)", flush=True)
        return 0
    code, root, days, tenants = argv[1], argv[2], int(argv[3]), int(argv[4])
    tenant = tenants_weighted(tenants)[0][0] if code == "tenant" else None
    for attempt in ("cold", "warm"):
        t0 = time.perf_counter()
        result = reports.get(code).run(spark, root, period_of(days), tenant)
        took = time.perf_counter() - t0 + (start if attempt == "cold" else 0)
        print(f"{code} report {attempt}: {took:.1f} s", flush=True)
        rows = result["rows"]
        note = f"session start {start:.1f} s included; " if attempt == "cold" else ""
        print(f"  ({note}"
              f"{rows['traffic']:,} traffic + {rows['connections']:,} connection rows; "
              f"{result['totals']['messages']:,} messages)", flush=True)
    return 0


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        return child(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--days", type=int, default=7)
    ap.add_argument("--tenants", type=int, default=200)
    ap.add_argument("--keep", metavar="DIR", help="write the log here and keep it (default: a temporary directory)")
    ap.add_argument("--reuse", action="store_true", help="with --keep: the log (or lake) already there")
    ap.add_argument("--write-only", action="store_true", help="with --keep: write the log and stop")
    ap.add_argument("--no-compact", action="store_true", help="the reports over the landed files alone (before)")
    args = ap.parse_args()
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="usage-scale-"))
    me = [sys.executable, str(Path(__file__).resolve()), "--child"]
    try:
        if not args.reuse:
            write(root, args.rows, args.days, args.tenants)
        n, size = files_and_bytes(root, "*/date=*/*.jsonl")
        print(f"landing: {n:,} files, {size / 2**20:.1f} MiB", flush=True)
        if args.write_only:
            return 0
        if not args.no_compact:
            subprocess.run([*me, "compact", str(root)], check=True)
        n, size = files_and_bytes(root, "lake/*/date=*/run=*/*.parquet")
        print(f"lake: {n:,} Parquet files, {size / 2**20:.1f} MiB", flush=True)
        for code in ("tenant", "platform"):
            subprocess.run([*me, "report", code, str(root), str(args.days), str(args.tenants)], check=True)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
