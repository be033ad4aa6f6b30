"""A report that fails says why, in words a person can act on, on its page."""

import random
import time
from datetime import UTC, date, datetime

from django.urls import reverse

from spark_reports import lake
from spark_reports import usagegen as gen
from spark_reports.jobs import Period
from spark_reports.models import ReportRun


def test_a_damaged_lake_file_is_named_on_the_failed_reports_page(spark, clients, acme, settings, tmp_path):
    """A Spark job that failed in the JVM was shown as py4j's "An error occurred while calling
    o7348.collectToPython." -- nothing said which file, or what was wrong with it."""
    from spark_reports.tasks import run_report

    root = tmp_path / "usage"
    period = Period.days(date(2026, 3, 2), date(2026, 3, 8))
    rng = random.Random(3)
    gen.write_rows(root, "connections", gen.random_connections(rng, 100, period.start, period.end, ["acme"],
                                                               ["n1"], 5))
    gen.write_rows(root, "traffic", gen.random_traffic(rng, 200, period.start, period.end, ["acme"], ["n1"], 5))
    lake.compact(spark, str(root), now=time.time(), settle=0, keep_landed=0)
    # a disk's damage in the middle of one of the lake's files (the day's rows: what the report reads of
    # connections, for the peak; a damaged rollup is read past, test_a_damaged_daily_rollup_...)
    damaged = sorted((root / "lake" / "connections" / "date=2026-03-04").glob("run=*/part-*.parquet"))[0]
    with open(damaged, "r+b") as f:
        f.write(b"\0" * 64)
    settings.USAGE_DIR = str(root)
    run = ReportRun.objects.create(tenant=acme, period_start=datetime(2026, 3, 2, tzinfo=UTC),
                                   period_end=datetime(2026, 3, 9, tzinfo=UTC))
    run_report.apply(args=[run.pk], retries=settings.REPORTS_MAX_RETRIES)      # the last attempt
    run.refresh_from_db()
    assert run.status == "failed"
    assert "An error occurred while calling" not in run.error
    assert damaged.name in run.error and "Checksum error" in run.error, run.error
    page = clients["alice"].get(reverse("report", args=["acme", run.pk])).content.decode()
    assert "The report failed" in page and damaged.name in page


def test_a_damaged_daily_rollup_is_read_past_and_made_again(spark, acme, settings, tmp_path):
    """A daily rollup file damaged on disk (or cut short by a host crash before it reached the disk)
    made every report over its date fail, for good: the rollup stayed "current". It is derived data:
    now the report reads the date's rows instead, with the same figures, and the next compaction
    makes the rollup again."""
    from spark_reports.tasks import run_report

    from . import expected as X

    root = tmp_path / "usage"
    period = Period.days(date(2026, 3, 2), date(2026, 3, 8))
    rng = random.Random(3)
    conns = gen.random_connections(rng, 100, period.start, period.end, ["acme"], ["n1"], 5)
    traffic = gen.random_traffic(rng, 200, period.start, period.end, ["acme"], ["n1"], 5)
    gen.write_rows(root, "connections", conns)
    gen.write_rows(root, "traffic", traffic)
    lake.compact(spark, str(root), now=time.time(), settle=0, keep_landed=0)
    day = root / "lake" / "rollups" / "traffic" / "date=2026-03-04"
    damaged = sorted(day.glob("run=*/part-*.parquet"))[0]
    with open(damaged, "r+b") as f:
        f.write(b"\0" * 64)
    settings.USAGE_DIR = str(root)
    want = X.totals(conns, traffic, period.start, period.end, "acme")
    for i in range(2):          # the first report reads past it, the one after the compaction reads the new one
        run = ReportRun.objects.create(tenant=acme, period_start=datetime(2026, 3, 2, tzinfo=UTC),
                                       period_end=datetime(2026, 3, 9, tzinfo=UTC))
        run_report.apply(args=[run.pk], retries=settings.REPORTS_MAX_RETRIES)      # the last attempt
        run.refresh_from_db()
        assert run.status == "succeeded", run.error
        for key in ("messages", "bytes_in", "rejected", "connects", "devices", "peak_connections"):
            assert run.result["totals"][key] == want[key], key
        if i == 0:
            assert not damaged.exists()
            assert "traffic/2026-03-04" in lake.compact(spark, str(root), now=time.time(), settle=0,
                                                        keep_landed=0).rolled_up
    assert list(day.glob("run=*/_manifest.json"))
