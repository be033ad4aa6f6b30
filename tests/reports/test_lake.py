"""The usage lake (spark_reports.lake): compaction of the landed log into
Parquet exactly once, whatever point a run dies at; reports over lake +
landing giving the figures of the landing alone and of tests/reports/expected.py;
reads bounded by the period; a tenant's read skipping the other tenants' row groups."""

import io
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
from collections import Counter
from datetime import date
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from spark_reports import jobs, lake, reports, tasks
from spark_reports import usagegen as gen
from spark_reports.jobs import CONNECTIONS_SCHEMA, TRAFFIC_SCHEMA, Period

from . import expected as X

PERIOD = Period.days(date(2026, 3, 2), date(2026, 3, 4))
TENANTS = ["acme", "globex", "default"]
NODES = ["n1", "n2"]
REPO = Path(__file__).resolve().parents[2]
EVERYTHING = Period.days(date(2000, 1, 1), date(2100, 1, 1))


def _usage(root, seed, conns_n, traffic_n, start, end):
    rng = random.Random(seed)
    conns = gen.random_connections(rng, conns_n, start, end, TENANTS, NODES, 20)
    traffic = gen.random_traffic(rng, traffic_n, start, end, TENANTS, NODES, 10)
    gen.write_rows(root, "connections", conns)
    gen.write_rows(root, "traffic", traffic)
    return conns, traffic


def _all(spark, root, dataset, lake_only=False):
    """Every row of a dataset as a reader sees it (lake + landing, or the lake's committed runs only)."""
    schema = TRAFFIC_SCHEMA if dataset == "traffic" else CONNECTIONS_SCHEMA
    if lake_only:
        snap = lake.snapshot(spark, str(root), lake.default_lake(str(root)), dataset, "0000", None)
        if not snap.runs:
            return Counter()
        df = spark.read.schema(schema).option("basePath", f"{root}/lake/{dataset}").parquet(*snap.runs)
    else:
        df = jobs._read(spark, str(root), None, dataset, schema, "0000", None)
    names = [f.name for f in schema.fields if f.name != "date"]
    return Counter(tuple(r[n] for n in names) for r in df.select(*names).collect())


def _raw(rows, dataset):
    schema = TRAFFIC_SCHEMA if dataset == "traffic" else CONNECTIONS_SCHEMA
    return Counter(tuple(r.get(f.name) for f in schema.fields if f.name != "date") for r in rows)


def _landed(root):
    return sorted(p.name for p in Path(root).glob("*/date=*/*.jsonl"))


def _assert_exactly_once(spark, root, conns, traffic, lake_only=False):
    assert _all(spark, root, "traffic", lake_only) == _raw(traffic, "traffic")
    assert _all(spark, root, "connections", lake_only) == _raw(conns, "connections")


@pytest.fixture
def small(tmp_path):
    """~200 rows over two days in brokerd's layout (one file per node, dataset and minute)."""
    conns, traffic = _usage(tmp_path, 20, 60, 140, PERIOD.start, PERIOD.start + 2 * 86400)
    return tmp_path, conns, traffic


# ---------------------------------------------------------------- exactly once


def test_compaction_moves_every_row_once_and_removes_the_landed_files(spark, small):
    root, conns, traffic = small
    files = len(_landed(root))
    r = lake.compact(spark, str(root), settle=0, keep_landed=0)
    assert (r.files, r.rows, r.deleted) == (files, len(conns) + len(traffic), files)
    assert _landed(root) == []
    _assert_exactly_once(spark, root, conns, traffic, lake_only=True)
    # nothing left to do: a second run commits nothing and reads nothing twice
    again = lake.compact(spark, str(root), settle=0, keep_landed=0)
    assert (again.files, again.rows, again.dates) == (0, 0, [])
    _assert_exactly_once(spark, root, conns, traffic, lake_only=True)


def test_a_compaction_with_nothing_to_do_reads_no_manifest_again(spark, small, monkeypatch):
    """A committed manifest never changes: once read, a process keeps it. Beat's compaction with
    nothing new (every few minutes, and every 3 s in test_celery) read every manifest of every
    date it looked at, each time -- a file read and a dozen JVM round trips apiece. A run
    directory without a manifest (not committed) is looked at again each time, and counts once
    its manifest is there."""
    root, conns, traffic = small
    lake.compact(spark, str(root), settle=0, keep_landed=600)      # landed files stay: their dates are planned
    reads = []
    real = lake.HadoopFS.read_text

    def spy(self, uri):
        reads.append(uri)
        return real(self, uri)

    monkeypatch.setattr(lake.HadoopFS, "read_text", spy)
    again = lake.compact(spark, str(root), settle=0, keep_landed=600)
    assert (again.files, again.rows, again.dates) == (0, 0, [])
    assert [u for u in reads if u.endswith(lake.MANIFEST)] == []
    # a run directory whose manifest comes later
    fs = lake.HadoopFS(spark)
    lake_root = lake.default_lake(str(root))
    day = lake.date_dirs(fs, f"{lake_root}/traffic")[0]
    before = lake.committed(fs, lake_root, "traffic", day)
    late = Path(lake_root) / "traffic" / f"date={day}" / "run=20990101T000000-0000late"
    late.mkdir()
    assert lake.committed(fs, lake_root, "traffic", day).runs == before.runs
    manifest = dict(before.manifests[before.runs[0]], run="20990101T000000-0000late", landed=[])
    (late / lake.MANIFEST).write_text(json.dumps(manifest))
    assert lake.committed(fs, lake_root, "traffic", day).runs == sorted(before.runs + [str(late)])


class Boom(Exception):
    pass


@pytest.mark.parametrize("point", ["written", "moved", "manifest written", "committed", "deleting"])
def test_a_run_failing_half_way_then_run_again_neither_loses_nor_doubles(spark, small, monkeypatch, point):
    """A failure after the Parquet is written (before any commit), after a
    date's rows are moved into the lake but before its manifest is there, after
    the manifest is written under its temporary name, after the first of several
    dates is committed, after the first landed file is deleted: the log reads the
    same all along (a run directory without its manifest is not read), and the
    next run finishes the job (and deletes such a directory)."""
    root, conns, traffic = small
    seen = []

    def fail(name):
        seen.append(name)
        if name == point and seen.count(name) == 1:
            raise Boom(name)

    monkeypatch.setattr(lake, "_checkpoint", fail)
    with pytest.raises(Boom):
        lake.compact(spark, str(root), settle=0, keep_landed=0)
    _assert_exactly_once(spark, root, conns, traffic)          # half-way: every row once
    if point == "committed":
        assert _landed(root)                                   # committed, not yet deleted: read from the lake
    run_dirs = list(root.glob("lake/*/date=*/run=*"))
    unpublished = [d for d in run_dirs if not (d / lake.MANIFEST).exists()]
    assert len(unpublished) == (1 if point in ("moved", "manifest written") else 0), run_dirs
    monkeypatch.setattr(lake, "_checkpoint", lambda name: None)
    r = lake.compact(spark, str(root), settle=0, keep_landed=0)
    assert len(r.discarded) == 1                               # the failed run's staged output
    assert _landed(root) == []
    _assert_exactly_once(spark, root, conns, traffic, lake_only=True)
    assert all((d / lake.MANIFEST).exists() for d in root.glob("lake/*/date=*/run=*"))


@pytest.mark.slow
def test_compaction_killed_mid_commit_then_run_again(spark, small):
    """A real SIGKILL of a compaction process (its own JVM) after it committed
    its first date and before the rest: the lease it held and its staged output
    are taken over and discarded, nothing is lost or doubled."""
    root, conns, traffic = small
    proc = subprocess.Popen([sys.executable, "-m", "tests.reports.lake_killed", "committed", str(root)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"})
    try:
        line = proc.stdout.readline()        # bounded by the test timeout
        assert line.strip() == "paused at committed"
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    lease = json.loads((root / "lake" / lake.LEASE).read_text())
    assert lease["pid"] == proc.pid                            # it died holding the lease
    committed = list((root / "lake").glob("*/date=*/run=*"))
    assert len(committed) == 1 and any((root / "lake" / lake.STAGING).iterdir())
    _assert_exactly_once(spark, root, conns, traffic)
    r = lake.compact(spark, str(root), settle=0, keep_landed=0)
    assert len(r.discarded) == 1
    assert _landed(root) == []
    _assert_exactly_once(spark, root, conns, traffic, lake_only=True)


def test_a_running_compaction_holds_the_lake(spark, small):
    root, _, _ = small
    fs = lake.HadoopFS(spark)
    with lake.Lease(fs, str(root / "lake")), pytest.raises(lake.CompactionBusy):
        lake.compact(spark, str(root), settle=0)


def test_a_lease_being_written_is_not_taken_for_a_stale_one(spark, tmp_path):
    """A lease file another compaction has created but not written yet (empty) is
    as old as the file, not "held since 1970": no second compaction takes it over
    (two compactions at once each committed the same landed files: a report of the
    Celery worker's lake counted 3.2x the messages)."""
    (tmp_path / "lake").mkdir()
    (tmp_path / "lake" / lake.LEASE).write_text("")
    with pytest.raises(lake.CompactionBusy), lake.Lease(lake.HadoopFS(spark), str(tmp_path / "lake")):
        pass
    assert (tmp_path / "lake" / lake.LEASE).read_text() == ""     # left to its holder


def test_compactions_started_at_once_in_one_worker_run_one_at_a_time(spark, tmp_path):
    """A Celery worker's threads asking for the lease at the same moment: one gets it."""
    (tmp_path / "lake").mkdir()
    fs = lake.HadoopFS(spark)
    for _ in range(5):
        barrier, got, inside = threading.Barrier(2), [], threading.Event()

        def take(barrier=barrier, got=got, inside=inside):
            barrier.wait(10)
            try:
                with lake.Lease(fs, str(tmp_path / "lake")):
                    got.append(1)
                    inside.wait(2)
            except lake.CompactionBusy:
                inside.set()

        threads = [threading.Thread(target=take) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(15)
        assert got == [1]
        assert not (tmp_path / "lake" / lake.LEASE).exists()


def test_open_minutes_wait_and_committed_files_stay_for_a_while(spark, tmp_path):
    """Only minutes closed ``settle`` seconds ago are compacted; a compacted
    landed file stays ``keep_landed`` seconds (for reports that listed it), read once."""
    t0 = PERIOD.start + 3600
    rows = [gen.traffic_row(t0 + 60 * i, "acme", "a", msgs_in_q0=1) for i in range(5)]
    gen.write_rows(tmp_path, "traffic", rows)
    r = lake.compact(spark, str(tmp_path), now=t0 + 180, settle=30, keep_landed=600)
    assert (r.files, r.deleted) == (2, 0)                      # minutes 0 and 1 closed 30 s before
    assert len(_landed(tmp_path)) == 5
    assert _all(spark, tmp_path, "traffic") == _raw(rows, "traffic")
    later = lake.compact(spark, str(tmp_path), now=t0 + 400, settle=30, keep_landed=600)
    assert (later.files, later.deleted) == (3, 0)
    last = lake.compact(spark, str(tmp_path), now=t0 + 1001, settle=30, keep_landed=600)
    assert (last.files, last.deleted) == (0, 5)
    assert _all(spark, tmp_path, "traffic", lake_only=True) == _raw(rows, "traffic")


# ---------------------------------------------------------------- reports


@pytest.mark.slow
def test_report_over_lake_and_landing_is_the_report_over_landing(spark, tmp_path):
    """Half the log compacted (up to the middle of a day), the rest still
    landed: the same figures as the landing alone, and as expected.py."""
    landing_only, mixed = tmp_path / "a", tmp_path / "b"
    conns, traffic = _usage(landing_only, 21, 200, 300, PERIOD.start - 86400, PERIOD.end + 86400)
    shutil.copytree(landing_only, mixed)
    r = lake.compact(spark, str(mixed), now=PERIOD.start + 1.5 * 86400, settle=0, keep_landed=0)
    assert r.rows and _landed(mixed)
    for code, tenant in (("tenant", "acme"), ("platform", None)):
        a = reports.get(code).run(spark, str(landing_only), PERIOD, tenant)
        b = reports.get(code).run(spark, str(mixed), PERIOD, tenant)
        a.pop("generated_at"), b.pop("generated_at")
        assert a == b, code
        want = X.totals(conns, traffic, PERIOD.start, PERIOD.end, tenant)
        for key in ("messages", "bytes_in", "bytes_out", "rejected", "dropped", "connects", "disconnects",
                    "devices", "peak_connections"):
            assert b["totals"][key] == want[key], (code, key)


def _plan(df) -> str:
    return df._jdf.queryExecution().executedPlan().toString()


def test_a_one_day_report_reads_only_its_days(spark, tmp_path):
    """Twelve days of history, the first ten compacted: a report of day 6
    reads traffic of day 6 only, and of the connections day 6's run and the
    files still landed (days 11 and 12), none before; the plan prunes by date."""
    first = PERIOD.start - 5 * 86400
    conns, traffic = [], []
    for d in range(12):
        noon = first + d * 86400 + 43200
        traffic += [gen.traffic_row(noon + 60 * i, "acme", "t/a", node=n, msgs_in_q0=d + 1) for i in range(3)
                    for n in NODES]
        conns.append(gen.connection_row("acme", f"c{d}", noon - 600, noon, username=f"acme/d{d}", msgs_in=d))
    gen.write_rows(tmp_path, "traffic", traffic)
    gen.write_rows(tmp_path, "connections", conns)
    lake.compact(spark, str(tmp_path), now=first + 10 * 86400, settle=0, keep_landed=0)
    day = Period(first + 5 * 86400, first + 6 * 86400)
    want_day = day.date_of(day.first_day)
    snap = lake.snapshot(spark, str(tmp_path), str(tmp_path / "lake"), "traffic", want_day, want_day)
    assert len(snap.runs) == 1 and not snap.landed and not snap.landed_dirs and f"date={want_day}/" in snap.runs[0]
    csnap = lake.snapshot(spark, str(tmp_path), str(tmp_path / "lake"), "connections", want_day, None, day.end)
    days = sorted({p.split("date=")[1][:10] for p in csnap.runs + csnap.landed + csnap.landed_dirs})
    # day 6, then the two days still landed; the lake's days 7-9 hold only connections opened after the period
    assert days == [want_day, day.date_of(day.first_day + 5), day.date_of(day.first_day + 6)]
    unbounded = lake.snapshot(spark, str(tmp_path), str(tmp_path / "lake"), "connections", want_day, None)
    assert len(unbounded.runs) == 5                            # days 6-10: without the manifests' bound
    t = jobs.read_traffic(spark, str(tmp_path), day)
    assert "PartitionFilters: [isnotnull(date#" in _plan(t) and want_day in _plan(t)
    assert t.count() == 6
    result = reports.get("tenant").run(spark, str(tmp_path), day, "acme")
    assert result["totals"]["msgs_in"] == 6 * 6 and result["totals"]["connects"] == 1


def _scanned_rows(spark, df) -> tuple[int, int]:
    """(rows the Parquet scan produced, rows out) for ``df`` run without AQE (the session's
    setting put back after: ``unset`` would turn Spark's default, on, back on)."""
    saved = spark.conf.get("spark.sql.adaptive.enabled")
    spark.conf.set("spark.sql.adaptive.enabled", "false")
    try:
        out = len(df.collect())
        plan = df._jdf.queryExecution().executedPlan()
        leaves = plan.collectLeaves()
        scanned = 0
        for i in range(leaves.size()):
            leaf = leaves.apply(i)
            if "Parquet" in leaf.toString():
                scanned += leaf.metrics().apply("numOutputRows").value()
        return scanned, out
    finally:
        spark.conf.set("spark.sql.adaptive.enabled", saved)


def test_a_tenant_filter_skips_the_other_tenants_row_groups(spark, tmp_path):
    """Rows sorted by tenant in small row groups: a tenant's read scans a
    fraction of the day (the Parquet row-group statistics on ``tenant``)."""
    rng = random.Random(23)
    tenants = [f"t{i:02d}" for i in range(20)]
    traffic = gen.random_traffic(rng, 2000, PERIOD.start, PERIOD.start + 600, tenants, NODES, 200)
    gen.write_rows(tmp_path, "traffic", traffic)
    lake.compact(spark, str(tmp_path), settle=0, keep_landed=0, row_group_bytes=4096)
    df = jobs.for_tenant(jobs.read_traffic(spark, str(tmp_path), PERIOD), "t07")
    scanned, out = _scanned_rows(spark, df)
    assert out == sum(1 for r in traffic if r["tenant"] == "t07") > 0
    assert out <= scanned < len(traffic) / 4, (scanned, len(traffic))
    everything, _ = _scanned_rows(spark, jobs.read_traffic(spark, str(tmp_path), PERIOD))
    assert everything == len(traffic)


# ---------------------------------------------------------------- Celery, beat, manage.py


def test_beat_schedules_the_compaction(db, settings):
    from django_celery_beat.models import PeriodicTask

    settings.LAKE_COMPACT_INTERVAL = 240
    tasks.ensure_periodic_task()
    task = PeriodicTask.objects.get(name=tasks.COMPACT_TASK_NAME)
    assert (task.task, task.enabled, task.interval.every) == ("spark_reports.tasks.compact_usage", True, 240)
    # a copy beat sends expires after one interval: a compaction longer than the interval piles nothing up
    from django_celery_beat.schedulers import ModelEntry
    assert ModelEntry(task).options["expires"] == 240
    settings.LAKE_COMPACT_INTERVAL = 0                         # 0: not by beat
    tasks.ensure_periodic_task()
    assert not PeriodicTask.objects.get(name=tasks.COMPACT_TASK_NAME).enabled
    assert PeriodicTask.objects.get(name=tasks.DISPATCH_TASK_NAME).enabled


def test_manage_py_compact_usage_and_the_task(spark, small, settings):
    root, conns, traffic = small
    settings.USAGE_DIR, settings.USAGE_LAKE = str(root), ""
    settings.LAKE_SETTLE, settings.LAKE_KEEP_LANDED = 0, 0
    out = io.StringIO()
    call_command("compact_usage", stdout=out)
    assert json.loads(out.getvalue())["rows"] == len(conns) + len(traffic)
    assert _landed(root) == []
    _assert_exactly_once(spark, root, conns, traffic, lake_only=True)
    assert tasks.compact_usage() == "0 files, 0 rows"
    with lake.Lease(lake.HadoopFS(spark), str(root / "lake")):
        assert tasks.compact_usage() == "busy"
        with pytest.raises(CommandError, match="already running"):
            call_command("compact_usage", stdout=io.StringIO())


def test_closed_days_runs_are_merged_into_one_exactly_once(spark, small, monkeypatch):
    """A compaction every few minutes leaves a run per compaction in a date;
    once the date is closed they are merged into one run sorted by tenant --
    also when the merge fails after its first date's commit and runs again."""
    root, conns, traffic = small
    for hours in (6, 12, 18):                                  # three runs, each taking what has closed
        lake.compact(spark, str(root), now=PERIOD.start + hours * 3600, settle=0, keep_landed=0)
    day1 = PERIOD.date_of(PERIOD.first_day)
    assert len(lake.committed(lake.HadoopFS(spark), str(root / "lake"), "traffic", day1).runs) == 3
    seen = []

    def fail(name):
        seen.append(name)
        if name == "merge committed" and seen.count(name) == 1:    # day 1's traffic merged, its connections not
            raise Boom(name)

    monkeypatch.setattr(lake, "_checkpoint", fail)
    later = PERIOD.start + 5 * 86400
    with pytest.raises(Boom):
        lake.compact(spark, str(root), now=later, settle=0, keep_landed=0)
    _assert_exactly_once(spark, root, conns, traffic)
    monkeypatch.setattr(lake, "_checkpoint", lambda name: None)
    r = lake.compact(spark, str(root), now=later, settle=0, keep_landed=0)
    assert r.merged == ["connections/" + day1] and r.dropped_runs == 8     # 4 runs of each dataset on day 1
    _assert_exactly_once(spark, root, conns, traffic, lake_only=True)
    fs = lake.HadoopFS(spark)
    for dataset in ("traffic", "connections"):
        for day in lake.date_dirs(fs, str(root / "lake" / dataset)):
            state = lake.committed(fs, str(root / "lake"), dataset, day)
            assert len(state.runs) == 1 and not state.replaced, (dataset, day)
    assert _landed(root) == []


# ---------------------------------------------------------------- the worker's long-lived session


def _history(root, first, days):
    """``days`` days of two tenants' usage, one file per node, dataset and minute: traffic at three
    minutes a day on both nodes, connections of a few minutes, and one a day across midnight (it
    closes in the next day's partition and touches both days)."""
    conns, traffic = [], []
    for d in range(days):
        day = first + d * 86400
        for tenant, k in (("acme", 1), ("globex", 2)):
            traffic += [gen.traffic_row(day + 3600 * h + 60 * k, tenant, f"t/{h}", node=n, msgs_in_q0=d + k,
                                        msgs_out=k) for h in (3, 12, 20) for n in NODES]
            conns.append(gen.connection_row(tenant, f"c{d}", day + 7200, day + 7200 + 300 * k,
                                            username=f"{tenant}/d{d % 5}", node=NODES[k - 1]))
        conns.append(gen.connection_row("acme", f"night{d}", day + 86400 - 600, day + 86400 + 600,
                                        username=f"acme/night{d}", node="n1"))
    gen.write_rows(root, "traffic", traffic)
    gen.write_rows(root, "connections", conns)
    return conns, traffic


def _dates(paths) -> set[str]:
    return {p.split("date=")[1][:10] for p in paths}


@pytest.mark.slow
def test_the_workers_session_runs_report_after_report_over_a_long_history(spark, tmp_path, settings, monkeypatch,
                                                                          acme, globex):
    """30 days of history, the first 27 compacted into the lake, the last 3 still landed; one
    session (the worker's: services.execute_run on get_spark()) runs report after report of a day
    or a week anywhere in it. Each one's figures are those of expected.py; what its reads list is
    the period's date partitions (connections: and the next day's, where one opened in the period
    closed, and the days still landed), never the rest of the history; the period's rows are on
    disk while it runs (once its totals have read them), not in the driver's heap, and nothing
    stays in the session after it."""
    from spark_reports import services

    first = PERIOD.start - 20 * 86400
    conns, traffic = _history(tmp_path, first, 30)
    lake.compact(spark, str(tmp_path), now=first + 27 * 86400, settle=0, keep_landed=0)
    settings.USAGE_DIR, settings.USAGE_LAKE = str(tmp_path), ""
    # days 27-29 still landed, and day 30: the last night's connection closed then
    landed_days = {PERIOD.date_of(int(first // 86400) + d) for d in (27, 28, 29, 30)}
    assert _dates(str(p) for p in Path(tmp_path).glob("*/date=*/*.jsonl")) == landed_days

    reads = []                                  # (dataset, files the DataFrame lists) of each read
    real_read, real_rollup = jobs._read, jobs._read_rollup

    def spy_read(spark_, root, lake_, name, *args, **kwargs):
        df = real_read(spark_, root, lake_, name, *args, **kwargs)
        reads.append((name, df.inputFiles()))
        return df

    def spy_rollup(spark_, lake_, name, *args, **kwargs):       # the closed days' daily rollups
        df = real_rollup(spark_, lake_, name, *args, **kwargs)
        reads.append((name, df.inputFiles() if df is not None else []))
        return df

    monkeypatch.setattr(jobs, "_read", spy_read)
    monkeypatch.setattr(jobs, "_read_rollup", spy_rollup)
    storage = []                                # the session's stored blocks when a report's rows are read
    real_update = services._update

    def spy_update(run_id, **fields):
        if fields.get("progress_step") == 3:         # the totals' jobs have read the rows
            infos = spark.sparkContext._jsc.sc().getRDDStorageInfo()
            storage.append([(i.memSize(), i.diskSize()) for i in infos])
        real_update(run_id, **fields)

    monkeypatch.setattr(services, "_update", spy_update)
    session = spark._jsc
    runs = [("platform", None, 3, 3), ("tenant", acme, 12, 12), ("platform", None, 14, 20),
            ("tenant", globex, 26, 26), ("platform", None, 28, 28), ("platform", None, 3, 3)]
    for kind, tenant, d0, d1 in runs:
        reads.clear()
        storage.clear()
        period = Period(first + d0 * 86400, first + (d1 + 1) * 86400)
        run = services.create_run(kind, date.fromisoformat(period.date_of(period.first_day)),
                                  date.fromisoformat(period.date_of(period.last_day)), tenant=tenant)
        run = services.execute_run(run, attempt=1)
        label = (kind, d0, d1)
        assert run.status == "succeeded", label
        slug = tenant.slug if tenant else None
        want = X.totals(conns, traffic, period.start, period.end, slug)
        for key in ("messages", "msgs_in", "connects", "disconnects", "devices", "peak_connections"):
            assert run.result["totals"][key] == want[key], (label, key)
        period_days = {period.date_of(d) for d in range(period.first_day, period.last_day + 1)}
        listed = {name: [f for n, files in reads if n == name for f in files] for name, _ in reads}
        assert _dates(listed["traffic"]) == period_days, label
        next_day = {period.date_of(period.last_day + 1)}
        assert _dates(listed["connections"]) <= period_days | next_day | landed_days, label
        assert period_days <= _dates(listed["connections"]), label
        # files: a compacted day's one Parquet file, a landed day's 12 (3 hours x 2 tenants x 2 nodes)
        assert len(listed["traffic"]) == sum(12 if d in landed_days else 1 for d in period_days), label
        assert storage and storage[0] and all(mem == 0 and disk > 0 for mem, disk in storage[0]), (label, storage)
        assert spark._jsc is session and spark._jsc.sc().getPersistentRDDs().isEmpty(), label


def test_a_report_over_many_small_landed_files_runs_few_tasks(spark, tmp_path):
    """600 landed files (a minute each): the report's persisted rows are in a partition per core or so,
    not ~20 of 32 files each -- every job of the report ran that many tasks (1M rows in 59,388 files:
    ~1,850 tasks a job, the tenant report 111 s)."""
    rows = [gen.traffic_row(PERIOD.start + 60 * i, "acme", "t/a", msgs_in_q0=1) for i in range(600)]
    gen.write_rows(tmp_path, "traffic", rows)
    seen = []

    def progress(step, total, text):
        if step == 3:                           # the totals' jobs have read the rows
            seen.append([(i.numPartitions(), i.memSize()) for i in spark.sparkContext._jsc.sc().getRDDStorageInfo()])

    result = reports.get("tenant").run(spark, str(tmp_path), PERIOD, "acme", progress=progress)
    assert result["totals"]["msgs_in"] == 600
    # a partition per core, or per shuffle partition where the rows come out of a shuffle (adaptive
    # execution, off, no longer coalesces those): never one per few files
    cores = max(spark.sparkContext.defaultParallelism, int(spark.conf.get("spark.sql.shuffle.partitions")))
    assert seen and seen[0] and all(n <= cores and mem == 0 for n, mem in seen[0]), (seen, cores)
