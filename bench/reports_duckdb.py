#!/usr/bin/env python3
"""The reports' totals computed again by DuckDB, another engine, over the same
usage data (the lake's committed runs plus the landed files no manifest names,
as spark_reports.lake's readers take them), and compared with a report's result
that bench/reports_scale.py saved (``--save-results``).

    .venv/bin/pip install duckdb        # for this bench only: not a dependency of the project
    .venv/bin/python bench/reports_duckdb.py /tmp/scale --days 7 --result /tmp/scale-platform-result.json

The figures, in SQL of their own: messages and bytes of the period's traffic
minutes; connects (opened in the period), disconnects (closed in it), devices
(distinct tenant and device pairs of the connections touching it), peak
concurrency (a sweep over the clipped intervals, disconnects first at an
instant) and the exact median session length (the report's is approximate:
within n / 10,000 ranks). Exit status 1 if a figure differs.
"""

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from reports_scale import period_of  # noqa: E402

TRAFFIC_SQL = """
SELECT count(*) AS traffic_rows,
       sum(coalesce(msgs_in_q0, 0) + coalesce(msgs_in_q1, 0) + coalesce(msgs_in_q2, 0) + coalesce(msgs_out, 0))
           AS messages,
       sum(coalesce(bytes_in, 0)) AS bytes_in, sum(coalesce(bytes_out, 0)) AS bytes_out,
       sum(coalesce(acl_denied, 0) + coalesce(quota_rejected, 0) + coalesce(auth_failures, 0)) AS rejected,
       sum(coalesce(dropped_queue_full, 0) + coalesce(dropped_expired, 0) + coalesce(dropped_no_subscribers, 0))
           AS dropped
FROM traffic WHERE tenant IS NOT NULL AND ts >= $s AND ts < $e {tenant}
"""

CONNS_SQL = """
WITH c AS (
    SELECT *, CASE WHEN contains(username, '/') THEN substr(username, instr(username, '/') + 1)
                   ELSE coalesce(username, client_id) END AS device
    FROM connections
    WHERE tenant IS NOT NULL AND connected_at IS NOT NULL AND disconnected_at IS NOT NULL
      AND connected_at < $e AND disconnected_at >= $s {tenant})
SELECT count(*) AS connection_rows,
       count(*) FILTER (WHERE connected_at >= $s AND connected_at < $e) AS connects,
       count(*) FILTER (WHERE disconnected_at >= $s AND disconnected_at < $e) AS disconnects,
       count(DISTINCT (tenant, device)) AS devices,
       median(disconnected_at - connected_at) FILTER (WHERE disconnected_at >= $s AND disconnected_at < $e)
           AS median_exact
FROM c
"""

PEAK_SQL = """
WITH c AS (
    SELECT greatest(connected_at, $s) AS a, least(disconnected_at, $e) AS b FROM connections
    WHERE tenant IS NOT NULL AND connected_at IS NOT NULL AND disconnected_at IS NOT NULL
      AND connected_at < $e AND disconnected_at >= $s {tenant}),
events AS (SELECT a AS t, 1 AS d FROM c UNION ALL SELECT b AS t, -1 AS d FROM c),
per_instant AS (SELECT t, sum(d) AS net FROM events GROUP BY t),
levels AS (SELECT t, sum(net) OVER (ORDER BY t ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS level
           FROM per_instant)
SELECT greatest(coalesce(max(level), 0), 0) AS peak_connections FROM levels
"""


def readable(root: Path, dataset: str) -> tuple[list[str], list[str]]:
    """(Parquet files of the lake's committed, not superseded runs; landed files no manifest names)."""
    runs, named, replaced = {}, set(), set()                  # run directory -> its run id (one per date)
    for manifest in (root / "lake" / dataset).glob("date=*/run=*/_manifest.json"):
        m = json.loads(manifest.read_text())
        runs[manifest.parent] = m["run"]
        replaced.update(m.get("replaces", []))
        named.update(f["name"] for f in m["landed"])
    parquet = [str(p) for d, run in runs.items() if run not in replaced for p in d.glob("*.parquet")]
    landed = [str(p) for p in (root / dataset).glob("date=*/*.jsonl") if p.name not in named]
    return parquet, landed


def view(con, root: Path, dataset: str) -> int:
    from spark_reports.schemas import CONNECTIONS_SCHEMA, TRAFFIC_SCHEMA

    schema = TRAFFIC_SCHEMA if dataset == "traffic" else CONNECTIONS_SCHEMA
    kinds = {"string": "VARCHAR", "long": "BIGINT", "double": "DOUBLE", "integer": "INTEGER",
             "boolean": "BOOLEAN", "float": "DOUBLE"}
    cols = {f.name: kinds[f.dataType.typeName()] for f in schema.fields if f.name != "date"}
    parquet, landed = readable(root, dataset)
    parts = []
    if parquet:
        parts.append(f"SELECT {', '.join(cols)} FROM read_parquet({parquet!r})")
    if landed:
        columns = "{" + ", ".join(f"'{c}': '{t}'" for c, t in cols.items()) + "}"
        parts.append(f"SELECT {', '.join(cols)} FROM read_json({landed!r}, format='newline_delimited', "
                     f"columns={columns})")
    if not parts:
        parts.append("SELECT " + ", ".join(f"NULL::{t} AS {c}" for c, t in cols.items()) + " WHERE false")
    con.execute(f"CREATE OR REPLACE VIEW {dataset} AS " + " UNION ALL ".join(parts))
    return len(parquet) + len(landed)


def main() -> int:
    import duckdb

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("root", help="the usage log (landing) with its lake under ROOT/lake")
    ap.add_argument("--days", type=int, default=7, help="the bench's period: its first N days")
    ap.add_argument("--last", type=int, default=0, help="only the last N days of that period (0: all of it)")
    ap.add_argument("--tenant")
    ap.add_argument("--result", help="a report result (JSON) to compare with")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    root, period = Path(args.root), period_of(args.days)
    start = period.end - args.last * 86400 if args.last else period.start
    con = duckdb.connect()
    con.execute(f"SET threads = {args.threads}")
    t0 = time.perf_counter()
    files = {d: view(con, root, d) for d in ("traffic", "connections")}
    where = "AND tenant = $t" if args.tenant else ""
    params = {"s": start, "e": period.end, **({"t": args.tenant} if args.tenant else {})}
    figures = {}
    for sql in (TRAFFIC_SQL, CONNS_SQL, PEAK_SQL):
        cur = con.execute(sql.format(tenant=where), params)
        figures.update(zip([d[0] for d in cur.description], cur.fetchone(), strict=True))
    print(f"duckdb ({files['traffic']:,} traffic + {files['connections']:,} connection files, "
          f"{time.perf_counter() - t0:.1f} s): " + ", ".join(f"{k} {v:,}" if isinstance(v, int) else f"{k} {v}"
                                                            for k, v in figures.items()), flush=True)
    if not args.result:
        return 0
    result = json.loads(Path(args.result).read_text())
    got = {**result["totals"], "traffic_rows": result["rows"]["traffic"],
           "connection_rows": result["rows"]["connections"]}
    bad = [k for k in figures if k != "median_exact" and got.get(k) != figures[k]]
    for k in figures:
        mark = "" if k == "median_exact" else ("  DIFFERS" if k in bad else "  same")
        print(f"  {k:16} duckdb {figures[k]!s:>16}  report {got.get(k, got.get('median_session'))!s:>16}{mark}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
