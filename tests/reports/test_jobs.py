"""The PySpark jobs against usage logs written in brokerd's layout, checked
against figures computed here with plain Python (tests/reports/expected.py)."""

import json
import os
import random
import subprocess
import sys
from datetime import date
from pathlib import Path

import pytest

from spark_reports import jobs, reports
from spark_reports import usagegen as gen
from spark_reports.jobs import Period

from . import expected as X

REPO = Path(__file__).resolve().parents[2]

PERIOD = Period.days(date(2026, 3, 2), date(2026, 3, 8))   # a Monday to a Sunday
TENANTS = ["acme", "globex", "default"]
NODES = ["n1", "n2", "n3"]


@pytest.fixture(scope="module")
def usage(tmp_path_factory):
    """~5,000 rows over the period and a day either side: 2,000 connections
    (some across the bounds, some zero-length, anonymous ones in "default"),
    3,000 traffic rows (tenant-wide ones among them)."""
    root = tmp_path_factory.mktemp("usage")
    rng = random.Random(8)
    conns = gen.random_connections(rng, 2000, PERIOD.start - 86400, PERIOD.end + 86400, TENANTS, NODES, 40)
    traffic = gen.random_traffic(rng, 3000, PERIOD.start - 86400, PERIOD.end + 86400, TENANTS, NODES, 25)
    gen.write_rows(root, "connections", conns)
    gen.write_rows(root, "traffic", traffic)
    return str(root), conns, traffic


def _jobs_so_far(spark) -> int:
    return spark.sparkContext._jsc.sc().statusStore().jobsList(None).size()


def _counted(spark, run):
    """``run()``'s report and the Spark jobs it ran (test_a_report_runs_few_spark_jobs)."""
    before = _jobs_so_far(spark)
    result = run()
    return result, _jobs_so_far(spark) - before


# Each report over the usage log is made once for the module (reading its ~4,800 files is most of a
# report's time): the tests below check its figures, and the Spark jobs it ran.
@pytest.fixture(scope="module")
def acme_counted(spark, usage):
    root, _, _ = usage
    return _counted(spark, lambda: reports.get("tenant").run(spark, root, PERIOD, "acme", top_n=5))


@pytest.fixture(scope="module")
def platform_counted(spark, usage):
    root, _, _ = usage
    return _counted(spark, lambda: reports.get("platform").run(spark, root, PERIOD))


@pytest.fixture(scope="module")
def acme_report(acme_counted):
    return acme_counted[0]


@pytest.fixture(scope="module")
def platform_report(platform_counted):
    return platform_counted[0]


def test_generated_log_is_big_enough(usage):
    _, conns, traffic = usage
    assert len(conns) + len(traffic) >= 5000
    # the interesting cases are in it
    assert any(c["connected_at"] < PERIOD.start <= c["disconnected_at"] for c in conns)
    assert any(c["connected_at"] < PERIOD.end <= c["disconnected_at"] for c in conns)
    assert any(c["connected_at"] == c["disconnected_at"] for c in conns)


@pytest.mark.parametrize("tenant", ["acme", "default"])
def test_tenant_totals(spark, usage, acme_report, tenant):
    root, conns, traffic = usage
    result = acme_report if tenant == "acme" else reports.get("tenant").run(spark, root, PERIOD, tenant, top_n=5)
    want = X.totals(conns, traffic, PERIOD.start, PERIOD.end, tenant)
    got = result["totals"]
    for key in ("msgs_in", "msgs_out", "bytes_in", "bytes_out", "messages", "rejected", "dropped", "acl_denied",
                "auth_failures", "connects", "disconnects", "devices", "peak_connections"):
        assert got[key] == want[key], key
    # approximate (bounded memory): a length of a middle rank, near the exact median
    assert X.is_median(got["median_session"], want["session_lengths"], jobs.MEDIAN_ACCURACY)
    assert got["median_session"] == pytest.approx(want["median_session"], rel=0.05)
    assert want["peak_connections"] >= 2      # overlapping intervals really happened
    assert got["peak_at"] == reports._iso(want["peak_at"])


def test_tenant_daily_series(usage, acme_report):
    _, conns, traffic = usage
    want = X.daily(conns, traffic, PERIOD.start, PERIOD.end, "acme")
    got = acme_report["daily"]
    assert [d["date"] for d in got] == [f"2026-03-0{d}" for d in range(2, 9)]
    for row, day in zip(got, sorted(want), strict=True):
        for key in ("msgs_in", "msgs_out", "rejected", "connects", "disconnects"):
            assert row[key] == want[day][key], (row["date"], key)


def test_top_topics_and_devices(usage, acme_report):
    _, conns, traffic = usage
    topics = X.top_topics(traffic, PERIOD.start, PERIOD.end, "acme", 5)
    assert [(r["topic"], r["messages"]) for r in acme_report["top_topics"]] == topics
    devices = X.top_devices(conns, PERIOD.start, PERIOD.end, "acme", 5)
    assert [(r["device"], r["messages"]) for r in acme_report["top_devices"]] == devices
    assert all(r["topic"] for r in acme_report["top_topics"])       # tenant-wide rows are no topic


def test_rejections_by_kind(usage, acme_report):
    _, _, traffic = usage
    rows = X.traffic_in(traffic, PERIOD.start, PERIOD.end, "acme")
    assert [r["kind"] for r in acme_report["rejections"]] == [k for k, _ in jobs.REJECTION_KINDS]
    for r in acme_report["rejections"]:
        assert r["count"] == sum(t[r["kind"]] for t in rows), r["kind"]


def test_disconnect_reasons(usage, acme_report):
    _, conns, _ = usage
    counts = {}
    for c in X.touching(conns, PERIOD.start, PERIOD.end, "acme"):
        if PERIOD.start <= c["disconnected_at"] < PERIOD.end:
            counts[c["reason"]] = counts.get(c["reason"], 0) + 1
    assert {r["reason"]: r["count"] for r in acme_report["reasons"]} == counts
    assert [r["count"] for r in acme_report["reasons"]] == sorted(counts.values(), reverse=True)


def test_platform_report(usage, platform_report):
    _, conns, traffic = usage
    want = X.totals(conns, traffic, PERIOD.start, PERIOD.end)
    for key in ("messages", "bytes_in", "connects", "disconnects", "devices", "peak_connections"):
        assert platform_report["totals"][key] == want[key], key
    assert [(r["tenant"], r["messages"]) for r in platform_report["tenants"]] == \
        X.tenant_ranking(conns, traffic, PERIOD.start, PERIOD.end)
    assert [r["rank"] for r in platform_report["tenants"]] == [1, 2, 3]
    peaks = X.node_peaks(conns, PERIOD.start, PERIOD.end)
    assert {r["node"]: r["peak_connections"] for r in platform_report["nodes"]} == peaks
    node_msgs = {n: sum(X.msgs_in(r) for r in X.traffic_in(traffic, PERIOD.start, PERIOD.end) if r["node"] == n)
                 for n in NODES}
    assert {r["node"]: r["msgs_in"] for r in platform_report["nodes"]} == node_msgs


# ---------------------------------------------------------------- hand-made cases


def _frame(spark, rows):
    schema = jobs.CONNECTIONS_SCHEMA
    return spark.createDataFrame([tuple(r.get(f.name) for f in schema.fields) for r in rows], schema)


def _conn(c, d, **kw):
    return gen.connection_row("t", kw.pop("client_id", f"c{c}-{d}"), c, d, **kw)


def _peak(spark, rows, period):
    out = jobs.peak_concurrency(jobs.touching(_frame(spark, rows), period), period).collect()
    return (out[0]["peak_connections"], out[0]["peak_at"]) if out else (0, None)


BASE = PERIOD.start


@pytest.mark.parametrize("code", ["tenant", "platform"])
def test_a_report_runs_few_spark_jobs(request, code):
    """Every Spark job is a fixed cost a report's reader waits for (planned, compiled on a cold
    session, scheduled): a report runs one per query, its row counts and rejections come with its
    totals. Adaptive query execution ran each shuffle stage as a job of its own (the tenant report:
    40 jobs, 27.1 s cold at 10M rows; 13 jobs, see the README), the row counts and rejections were
    three queries more. (The module's reports, counted as they were made.)"""
    result, ran = request.getfixturevalue(f"{'acme' if code == 'tenant' else 'platform'}_counted")
    assert result["rows"]["traffic"] > 0 and result["totals"]["messages"] > 0
    assert ran <= {"tenant": 13, "platform": 16}[code], ran


def test_peak_overlapping_intervals(spark):
    rows = [_conn(BASE + 0, BASE + 10), _conn(BASE + 5, BASE + 15), _conn(BASE + 8, BASE + 20),
            _conn(BASE + 16, BASE + 30)]
    assert _peak(spark, rows, PERIOD) == (3, BASE + 8)


def test_touching_intervals_count_once(spark):
    # a reconnect at the instant the old connection closed: disconnect first
    rows = [_conn(BASE + 0, BASE + 10), _conn(BASE + 10, BASE + 20), _conn(BASE + 20, BASE + 30)]
    assert _peak(spark, rows, PERIOD)[0] == 1
    # several closing and opening at one instant
    rows = [_conn(BASE + 0, BASE + 10), _conn(BASE + 1, BASE + 10), _conn(BASE + 10, BASE + 12),
            _conn(BASE + 10, BASE + 13), _conn(BASE + 10, BASE + 14)]
    assert _peak(spark, rows, PERIOD) == (3, BASE + 10)


def test_zero_length_connection_never_counts(spark):
    assert _peak(spark, [_conn(BASE + 5, BASE + 5)], PERIOD)[0] == 0
    assert _peak(spark, [_conn(BASE + 5, BASE + 5), _conn(BASE + 1, BASE + 9)], PERIOD)[0] == 1


def test_intervals_crossing_the_period_bounds(spark):
    p = Period(BASE + 100, BASE + 200)
    rows = [
        _conn(BASE + 50, BASE + 150),    # across the start: counted from the start
        _conn(BASE + 60, BASE + 250),    # across the start and the end
        _conn(BASE + 190, BASE + 400),   # across the end
        _conn(BASE + 10, BASE + 100),    # ends exactly at the start: not open in the period
        _conn(BASE + 200, BASE + 300),   # starts exactly at the end: outside
        _conn(BASE + 0, BASE + 99),      # before
    ]
    assert _peak(spark, rows, p) == (2, BASE + 100)
    rows.append(_conn(BASE + 120, BASE + 130))
    assert _peak(spark, rows, p) == (3, BASE + 120)
    totals = jobs.connection_totals(jobs.touching(_frame(spark, rows), p), p).collect()[0]
    # opened in the period: 190 and 120; closed in it: 150, 130 and the one ending at the start (100)
    assert (totals["connects"], totals["disconnects"]) == (2, 3)


def test_peak_per_node(spark):
    rows = [_conn(BASE, BASE + 10, node="a"), _conn(BASE + 1, BASE + 10, node="a"),
            _conn(BASE + 2, BASE + 10, node="b")]
    df = jobs.peak_concurrency(jobs.touching(_frame(spark, rows), PERIOD), PERIOD, ["node"])
    assert {r["node"]: r["peak_connections"] for r in df.collect()} == {"a": 2, "b": 1}


def test_one_device_name_in_two_tenants_is_two_devices_on_the_platform(spark):
    """The platform report counted device names: 300 where 1M rows held 30,913 TENANT/DEVICE pairs."""
    rows = [gen.connection_row(t, "sensor-1", BASE + 1, BASE + 10, username=f"{t}/sensor-1") for t in ("acme", "globex")]
    rows.append(gen.connection_row("acme", "sensor-1", BASE + 20, BASE + 30, username="acme/sensor-1"))   # again
    conns = jobs.touching(_frame(spark, rows), PERIOD)
    assert jobs.connection_totals(conns, PERIOD).collect()[0]["devices"] == 2
    per_tenant = jobs.connection_totals(conns, PERIOD, ["tenant"]).collect()
    assert {r["tenant"]: r["devices"] for r in per_tenant} == {"acme": 1, "globex": 1}


def test_a_topic_with_only_refused_publishes_is_not_a_top_topic(spark, tmp_path):
    """Denied topics were listed under Top topics with 0 messages."""
    ts = int(BASE) + 3600
    gen.write_rows(tmp_path, "traffic", [gen.traffic_row(ts, "t", "secret/x", acl_denied=5),
                                         gen.traffic_row(ts, "t", "plant/a", msgs_in_q0=2)])
    traffic = jobs.traffic_in(jobs.read_traffic(spark, str(tmp_path), PERIOD), PERIOD)
    assert [(r["topic"], r["messages"]) for r in jobs.top_topics(traffic, 10).collect()] == [("plant/a", 2)]
    assert jobs.traffic_totals(traffic).collect()[0]["acl_denied"] == 5        # still counted, as a rejection


def test_top_n_ties_by_name(spark, tmp_path):
    ts = int(BASE) + 3600
    rows = [gen.traffic_row(ts, "t", topic, msgs_in_q0=n) for topic, n in
            [("zeta", 50), ("beta", 50), ("alpha", 50), ("gamma", 70), ("delta", 10), ("omega", 50)]]
    rows.append(gen.traffic_row(ts, "t", "beta", node="node2", msgs_out=0))   # same topic, other node
    gen.write_rows(tmp_path, "traffic", rows)
    traffic = jobs.traffic_in(jobs.read_traffic(spark, str(tmp_path), PERIOD), PERIOD)
    top = [(r["topic"], r["messages"]) for r in jobs.top_topics(traffic, 4).collect()]
    assert top == [("gamma", 70), ("alpha", 50), ("beta", 50), ("omega", 50)]
    conns = [_conn(BASE + i, BASE + 100, client_id=name, username=f"t/{name}", msgs_in=m)
             for i, (name, m) in enumerate([("d3", 5), ("d1", 5), ("d2", 9), ("d0", 5)])]
    devices = jobs.top_devices(jobs.touching(_frame(spark, conns), PERIOD), PERIOD, 3).collect()
    assert [(r["device"], r["messages"]) for r in devices] == [("d2", 9), ("d0", 5), ("d1", 5)]


def test_empty_period(spark, usage):
    """A period without any data: zeros, empty tables, every day listed, no crash."""
    root, _, _ = usage
    p = Period.days(date(2025, 1, 1), date(2025, 1, 3))
    for code in ("tenant", "platform"):
        r = reports.get(code).run(spark, root, p, "acme")
        t = r["totals"]
        assert t["messages"] == t["connects"] == t["devices"] == t["peak_connections"] == t["rejected"] == 0
        assert t["median_session"] is None and t["peak_at"] is None
        assert [d["date"] for d in r["daily"]] == ["2025-01-01", "2025-01-02", "2025-01-03"]
        assert all(d["msgs_in"] == d["connects"] == 0 for d in r["daily"])
        assert all(row["count"] == 0 for row in r["rejections"])
        if code == "tenant":
            assert r["top_topics"] == r["top_devices"] == r["reasons"] == []
        else:
            assert r["tenants"] == r["nodes"] == []


def test_unknown_tenant_and_empty_log(spark, usage, tmp_path):
    root, _, _ = usage
    assert reports.get("tenant").run(spark, root, PERIOD, "nobody")["totals"]["messages"] == 0
    # a usage directory brokerd has not written into yet
    r = reports.get("tenant").run(spark, str(tmp_path), PERIOD, "acme")
    assert r["totals"]["connects"] == 0 and len(r["daily"]) == 7


def test_unreadable_usage_dir(spark, tmp_path):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    with pytest.raises(jobs.UsageLogError, match="not a directory"):
        reports.get("tenant").run(spark, str(not_a_dir), PERIOD, "acme")
    with pytest.raises(jobs.UsageLogError, match="not found"):
        reports.get("platform").run(spark, str(tmp_path / "missing"), PERIOD)


def test_temporary_and_malformed_files_are_skipped(spark, tmp_path):
    ts = int(BASE) + 60
    gen.write_rows(tmp_path, "traffic", [gen.traffic_row(ts, "t", "a", msgs_in_q1=3)])
    day = tmp_path / "traffic" / "date=2026-03-02"
    partial = json.dumps({"ts": ts, "tenant": "t", "topic": "a", "msgs_in_q1": 100})[:-1]
    (day / "node1-202603020001.jsonl.tmp").write_text(partial)            # a temporary name: never read
    row = json.dumps({"ts": ts, "node": "node9", "tenant": "t", "topic": "a", "msgs_in_q1": 4})
    (day / "node9-202603020001.jsonl").write_text(f"not json\n{row}\n")  # the bad line is dropped
    traffic = jobs.traffic_in(jobs.read_traffic(spark, str(tmp_path), PERIOD), PERIOD)
    assert jobs.traffic_totals(traffic).collect()[0]["msgs_in"] == 7


def test_spark_conf_is_parsed_and_a_malformed_one_stops_the_console():
    from spark_reports.spark import spark_conf

    assert spark_conf("spark.executor.memory=4g; spark.driver.extraJavaOptions=-Da=b -Dc=d;") == [
        ("spark.executor.memory", "4g"), ("spark.driver.extraJavaOptions", "-Da=b -Dc=d")]
    assert spark_conf("") == []
    env = dict(os.environ, SPARK_CONF="executor.memory=4g", DJANGO_SETTINGS_MODULE="console.settings")
    proc = subprocess.run([sys.executable, "-c", "import django; django.setup()"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "SPARK_CONF: 'executor.memory=4g' is not spark.NAME=VALUE" in proc.stderr


def test_spark_conf_reaches_the_session(spark):
    # tests/conftest.py runs the suite's Spark interpreted (SPARK_CONF): the property is on the session
    assert spark.conf.get("spark.sql.codegen.wholeStage") == "false"
