"""Daily rollups (spark_reports.rollups, made by the compaction in
spark_reports.lake): a 90-day report over them is the report over the raw
rows and the figures of tests/reports/expected.py; it reads rollups for the
closed days and raw rows only for the rest; a late row makes its day's
rollup again; a compaction failing half-way through its rollups and run
again neither loses nor doubles a row."""

import random
from collections import Counter
from datetime import date, timedelta

import pytest

from spark_reports import jobs, lake, reports
from spark_reports import usagegen as gen
from spark_reports.jobs import Period

from . import expected as X

DAY = 86400
FIRST = date(2026, 1, 1)
NODES = ["n1", "n2"]
REASONS = ["client disconnect", "keepalive timeout", "kicked"]
DAYS = [0, 3, 40, 55, 91, 92]     # days with usage, of 93


def _ts(d: int) -> float:
    return Period.days(FIRST + timedelta(days=d), FIRST + timedelta(days=d)).start


def _fleet(days, seed: int = 20) -> tuple[list, list]:
    """A few rows on each of ``days``: traffic of two tenants on two topics and tenant-wide, one
    minute a node; connections of named and anonymous devices, one across midnight, and a long
    one on days ending in 5 (touching three days)."""
    rng = random.Random(seed)
    traffic, conns = [], []
    for d in days:
        day = _ts(d)
        for k, node in enumerate(NODES):
            minute = day + 3600 * (1 + (d + k) % 22)
            for tenant in ("acme", "globex"):
                for topic in ("t/a", "t/b", ""):
                    traffic.append(gen.traffic_row(
                        minute, tenant, topic, node=node, msgs_in_q0=rng.randrange(50), msgs_in_q1=rng.randrange(5),
                        msgs_out=rng.randrange(80), bytes_in=rng.randrange(4000), bytes_out=rng.randrange(6000),
                        acl_denied=rng.randrange(2), dropped_expired=rng.randrange(2)))
        opened = day + rng.randrange(3600, 40000)
        conns.append(gen.connection_row("acme", f"c{d}", opened, opened + rng.randrange(1, 7200),
                                        username=f"acme/dev{d % 4}", node=NODES[d % 2], msgs_in=rng.randrange(90),
                                        msgs_out=rng.randrange(90), bytes_in=rng.randrange(900),
                                        reason=REASONS[d % 3]))
        conns.append(gen.connection_row("globex", f"anon{d % 3}", opened + 60, opened + 60 + rng.randrange(1, 900),
                                        node=NODES[(d + 1) % 2], msgs_out=rng.randrange(40), reason=REASONS[(d + 1) % 3]))
        conns.append(gen.connection_row("acme", f"night{d}", day + DAY - 600, day + DAY + 900,
                                        username=f"acme/night{d % 2}", node="n1", msgs_in=1))
        if d % 10 == 5:
            conns.append(gen.connection_row("globex", f"long{d}", day + 5000, day + 2 * DAY + 7000,
                                            username=f"globex/gw{d % 20}", node="n2", msgs_in=7, msgs_out=3))
    return conns, traffic


def _no_time(result: dict) -> dict:
    result.pop("generated_at")
    return result


def _dates(paths) -> set[str]:
    return {p.split("date=")[1][:10] for p in paths}


def _date(d: int) -> str:
    return (FIRST + timedelta(days=d)).isoformat()


def _check_totals(result, conns, traffic, period, tenant):
    want = X.totals(conns, traffic, period.start, period.end, tenant)
    for key in ("messages", "msgs_in", "bytes_in", "bytes_out", "rejected", "dropped", "connects", "disconnects",
                "devices", "peak_connections"):
        assert result["totals"][key] == want[key], key
    assert result["totals"]["median_session"] == want["median_session"] or X.is_median(
        result["totals"]["median_session"], want["session_lengths"], jobs.MEDIAN_ACCURACY)


def test_a_90_day_report_reads_rollups_and_equals_the_report_over_raw_rows(spark, tmp_path):
    """93 days of history, usage on six of them (days without any have no partition to read: the
    lake's cost is per day with data), compacted up to noon of the last day (the closed days rolled
    up), then a late file for day 40 landed. The 90-day platform report (days 3-92) over rollups is
    the report over the raw rows, whole; it and the tenant report give expected.py's figures (totals,
    daily series, top topics and devices, reasons, ranking, node peaks); their traffic is read from the rollups
    of the closed days but 40, and raw only for day 40 (its late file) and day 92 (today), the plan
    pruning the raw scan to the period. The next compaction takes the late file (day 40's rollup is
    then stale: read raw) and makes day 40's rollup again."""
    conns, traffic = _fleet(DAYS)
    gen.write_rows(tmp_path, "traffic", traffic)
    gen.write_rows(tmp_path, "connections", conns)
    now = _ts(92) + 43200
    r = lake.compact(spark, str(tmp_path), now=now, settle=0, keep_landed=0)
    closed_conns = sorted({d + k for d in DAYS for k in (0, 1) if d + k < 92} | {57})   # 57: day 55's long one
    assert sorted(r.rolled_up) == sorted([f"traffic/{_date(d)}" for d in DAYS if d < 92]
                                         + [f"connections/{_date(d)}" for d in closed_conns])
    late = [gen.traffic_row(_ts(40) + 7200, "acme", "t/a", node="n1", msgs_in_q0=1000, msgs_out=1)]
    gen.write_rows(tmp_path, "traffic", late, suffix="-2")      # as a node restarted in that minute names it
    traffic += late
    period = Period.days(FIRST + timedelta(days=3), FIRST + timedelta(days=92))

    snap = lake.snapshot(spark, str(tmp_path), str(tmp_path / "lake"), "traffic", _date(3), _date(92), rollups=True)
    assert sorted(snap.rolled_dates) == [_date(d) for d in DAYS if 3 <= d < 92 and d != 40]
    groups = jobs.traffic_groups(spark, str(tmp_path), period)
    plan = groups._jdf.queryExecution().executedPlan().toString()
    # three scans (the rollups, the lake's run of day 92, the landed files), each pruned by date
    assert plan.count("FileScan") == plan.count("PartitionFilters: [isnotnull(date#") == 3
    raw = jobs._read(spark, str(tmp_path), None, "traffic", jobs.TRAFFIC_SCHEMA, _date(3), _date(92), snap=snap)
    assert _dates(raw.inputFiles()) == {_date(40), _date(92)}                 # the raw read: the partial days only
    rolled = jobs._read_rollup(spark, str(tmp_path / "lake"), "traffic", snap, _date(3), _date(92))
    assert {f.split("/lake/")[1].split("/")[0] for f in rolled.inputFiles()} == {"rollups"}
    assert _dates(rolled.inputFiles()) == set(snap.rolled_dates)
    csnap = lake.snapshot(spark, str(tmp_path), str(tmp_path / "lake"), "connections", _date(3), None, period.end,
                          rollups=True)
    assert sorted(csnap.rolled_dates) == [_date(d) for d in closed_conns if d >= 3]

    for code, tenant in (("platform", None), ("tenant", "acme")):
        over_rollups = _no_time(reports.get(code).run(spark, str(tmp_path), period, tenant))
        if code == "platform":          # the tenant report's own parts are checked against plain Python below
            over_raw = _no_time(reports.get(code).run(spark, str(tmp_path), period, tenant, rollups=False))
            assert over_rollups == over_raw, code
        _check_totals(over_rollups, conns, traffic, period, tenant)
        want_daily = X.daily(conns, traffic, period.start, period.end, tenant)
        assert [(d["msgs_in"], d["msgs_out"], d["rejected"], d["connects"], d["disconnects"])
                for d in over_rollups["daily"]] == [
            (v["msgs_in"], v["msgs_out"], v["rejected"], v["connects"], v["disconnects"])
            for _, v in sorted(want_daily.items())]
        if tenant:
            assert [(t["topic"], t["messages"]) for t in over_rollups["top_topics"]] == X.top_topics(
                traffic, period.start, period.end, tenant, 10)
            assert [(t["device"], t["messages"]) for t in over_rollups["top_devices"]] == X.top_devices(
                conns, period.start, period.end, tenant, 10)
            closed = [c for c in X.touching(conns, period.start, period.end, tenant)
                      if period.start <= c["disconnected_at"] < period.end]
            dev0 = over_rollups["top_devices"][0]
            mine = [c for c in closed if X.device(c) == dev0["device"]]
            assert (dev0["connections"], dev0["connected_seconds"]) == (
                len(mine), round(sum(c["disconnected_at"] - c["connected_at"] for c in mine), 3))
            reasons = Counter(c["reason"] for c in closed)
            assert {r["reason"]: r["count"] for r in over_rollups["reasons"]} == reasons
        else:
            assert [(t["tenant"], t["messages"]) for t in over_rollups["tenants"]] == X.tenant_ranking(
                conns, traffic, period.start, period.end)
            assert {n["node"]: n["peak_connections"] for n in over_rollups["nodes"]} == X.node_peaks(
                conns, period.start, period.end)

    # the late file committed into day 40, its rollup not made again yet (a run stopped in between):
    # the old rollup is stale (its source is not the day's runs now), the day is read raw
    lake.compact(spark, str(tmp_path), now=now + 600, settle=0, keep_landed=0, rollups=False)
    snap = lake.snapshot(spark, str(tmp_path), str(tmp_path / "lake"), "traffic", _date(3), _date(92), rollups=True)
    assert _date(40) not in snap.rolled_dates and not snap.landed and any(f"date={_date(40)}/" in u for u in snap.runs)
    again = lake.compact(spark, str(tmp_path), now=now + 600, settle=0, keep_landed=0)
    assert again.rolled_up == [f"traffic/{_date(40)}"]
    snap = lake.snapshot(spark, str(tmp_path), str(tmp_path / "lake"), "traffic", _date(3), _date(92), rollups=True)
    assert sorted(snap.rolled_dates) == [_date(d) for d in DAYS if 3 <= d < 92]
    totals = jobs.traffic_totals(jobs.traffic_groups(spark, str(tmp_path), period)).collect()[0]
    assert totals["msgs_in"] == X.totals(conns, traffic, period.start, period.end)["msgs_in"]


class Boom(Exception):
    pass


def test_a_compaction_failing_mid_rollup_commit_then_run_again_neither_loses_nor_doubles(spark, tmp_path,
                                                                                           monkeypatch):
    """Four days compacted on the fifth; the run fails after the first of its rollups is committed
    (the others staged, not committed): the grouped figures are the raw rows' all along, and the
    next run discards the staged ones and finishes the rollups -- one current rollup a day, the
    same figures. (A failure before a rollup's commit is the same case for the rest.) The landing
    and the lake are ``file://`` URIs, the lake elsewhere than under the landing: every lake
    operation goes through Hadoop's filesystem layer."""
    point = "rollup committed"
    conns, traffic = _fleet(range(4), seed=21)
    gen.write_rows(tmp_path / "usage", "traffic", traffic)
    gen.write_rows(tmp_path / "usage", "connections", conns)
    landing, where = f"file://{tmp_path}/usage", f"file://{tmp_path}/elsewhere/lake"
    period = Period.days(FIRST, FIRST + timedelta(days=3))
    seen = []

    def fail(name):
        seen.append(name)
        if name == point and seen.count(name) == 1:
            raise Boom(name)

    def figures():
        t = jobs.traffic_totals(jobs.traffic_groups(spark, landing, period, where)).collect()[0].asDict()
        c = jobs.group_connection_totals(jobs.connection_groups(spark, landing, period, where), period).collect()[0]
        return {"messages": t["messages"], "bytes_in": t["bytes_in"], **c.asDict()}

    want = X.totals(conns, traffic, period.start, period.end)
    want = {k: want[k] for k in ("messages", "bytes_in", "connects", "disconnects", "devices")}
    monkeypatch.setattr(lake, "_checkpoint", fail)
    with pytest.raises(Boom):
        lake.compact(spark, landing, where, now=_ts(4) + 3600, settle=0, keep_landed=0)
    snap = lake.snapshot(spark, landing, where, "traffic", _date(0), _date(3), rollups=True)
    assert len(snap.rolled_dates) == 1
    assert figures() == want                                   # half-way: rollup or raw, every row once
    monkeypatch.setattr(lake, "_checkpoint", lambda name: None)
    r = lake.compact(spark, landing, where, now=_ts(4) + 3600, settle=0, keep_landed=0)
    assert len(r.discarded) == 1 and len(r.rolled_up) == 7
    fs = lake.HadoopFS(spark)
    for dataset in ("traffic", "connections"):
        for d in range(4):
            assert len(lake.rollups_of(fs, where, dataset, _date(d))) == 1, (dataset, d)
    todo = {f"{p.parent.name}/{p.name}" for p in (tmp_path / "elsewhere" / "lake" / lake.TODO).glob("*/date=*")}
    assert todo == {f"connections/date={_date(4)}"}            # today's: rolled up once it is closed
    assert figures() == want
    assert not (tmp_path / "usage" / "lake").exists() and list(tmp_path.glob("usage/*/date=*")) != []
    assert len(list((tmp_path / "elsewhere" / "lake" / "rollups").glob("*/date=*/run=*/*.parquet"))) == 8
