"""Celery end to end with real processes: a worker (``celery -A console
worker -P threads``) and beat (``celery -A console beat``, schedule from the
database) on the embedded filesystem broker, sharing a SQLite file database
with this test process, whose default connection is pointed at the same
file for the duration (``shared_db``). The worker runs Spark itself.

- "Run report" in the console -> the worker runs the Spark job -> the run
  succeeded with a result -> the page shows the figures;
- a schedule due now -> beat dispatches it -> the worker runs the report and
  emails it (file backend) to the schedule's recipients with the CSV;
- an unreadable usage log -> retried (backoff 1 s) -> failed, with the
  reason on the page.
"""

import email
import os
import random
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta
from email import policy

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse

from spark_reports import usagegen as gen
from spark_reports.jobs import Period

from ..controlplane import ControlPlane
from ..integration.helpers import wait_until
from ..procs import ROOT
from . import expected as X

pytestmark = pytest.mark.slow

TODAY = datetime.now(tz=UTC).date()
DAYS = 10


class Proc:
    """A Celery process with its output collected by a thread."""

    def __init__(self, args, env, ready: str, timeout: float = 60):
        self.lines: list[str] = []
        self.proc = subprocess.Popen([sys.executable, "-m", "celery", "-A", "console", *args], cwd=ROOT, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        threading.Thread(target=self._read, daemon=True).start()
        wait_for(lambda: any(ready in ln for ln in self.lines) or self.proc.poll() is not None, timeout,
                 lambda: self.log())
        assert self.proc.poll() is None, self.log()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())

    def log(self) -> str:
        return "\n".join(self.lines[-80:])

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def wait_for(predicate, timeout: float, explain=lambda: "") -> None:
    wait_until(predicate, timeout, interval=0.2, message="timed out", explain=explain)


@pytest.fixture(scope="module")
def plane(tmp_path_factory):
    """A migrated console database file, its VAR_DIR, and a usage log of the
    last DAYS days (and today) written in brokerd's layout."""
    return make_plane(tmp_path_factory)


def make_plane(tmp_path_factory, connections: int = 600, traffic_rows: int = 1000):
    """``plane``'s control plane, with a usage log of that many rows (a file per node and minute:
    most of a report's and of beat's compaction's time here is reading them; the figures are checked
    against expected.py whatever their number, tests/reports/test_jobs.py checks them on 5,000 rows;
    1,500 and 2,500 made each report here read ~4,000 files)."""
    plane = ControlPlane(tmp_path_factory.mktemp("celery"))
    usage = plane.dir / "usage"
    rng = random.Random(88)
    period = Period.days(TODAY - timedelta(days=DAYS), TODAY)
    conns = gen.random_connections(rng, connections, period.start, period.end, ["acme", "globex"], ["n1", "n2"], 30)
    traffic = gen.random_traffic(rng, traffic_rows, period.start, period.end, ["acme", "globex"], ["n1", "n2"], 20)
    gen.write_rows(usage, "connections", conns)
    gen.write_rows(usage, "traffic", traffic)
    plane.usage, plane.conns, plane.traffic = usage, conns, traffic
    plane.env.update(USAGE_DIR=str(usage), REPORTS_RETRY_BACKOFF="1", REPORTS_DISPATCH_INTERVAL="1",
                     METRICS_HUB="false", SPARK_SHUFFLE_PARTITIONS="2", LAKE_COMPACT_INTERVAL="10")
    plane.env.pop("EMAIL_URL", None)
    plane.env.pop("EMAIL_HOST", None)
    plane.env.pop("REDIS_URL", None)
    plane.env.pop("CELERY_BROKER_URL", None)
    return plane


@pytest.fixture(scope="module")
def worker(plane):
    proc = Proc(["worker", "-P", "threads", "-c", "2", "--without-mingle", "--without-gossip", "-l", "info"],
                plane.env, ready="ready.")
    yield proc
    proc.stop()


@pytest.fixture
def beat(plane, worker):
    """Beat for the tests that need it only: its compaction every 3 s is not left
    running under the others' reports."""
    proc = Proc(["beat", "-l", "info", "--pidfile="], plane.env, ready="beat: Starting")
    yield proc
    proc.stop()


def _fresh_producers(app) -> None:
    """Celery keeps its connection pool and, apart from it, the producers made on one of its
    connections: a task sent before (another test's, on another folder) left producers that
    would send this module's tasks where its worker does not look."""
    app._pool = None
    app.amqp._producer_pool = None


@pytest.fixture
def shared_db(plane, django_db_blocker, settings):
    """This process's default database connection on the plane's file (as the
    worker's), Celery's producer on the plane's broker folder, its VAR_DIR."""
    from django.db import connections
    from django.db.backends.sqlite3.base import DatabaseWrapper

    from console.celery import app

    settings.VAR_DIR = plane.dir
    settings.USAGE_DIR = str(plane.usage)
    settings.BROKERD_ADMIN_URL = "http://127.0.0.1:9"
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    broker = plane.dir / "celery"
    saved_conf = {"broker_url": app.conf.broker_url, "broker_transport_options": app.conf.broker_transport_options}
    app.conf.update(broker_url="filesystem://", broker_transport_options={
        "data_folder_in": str(broker / "queue"), "data_folder_out": str(broker / "queue"),
        "control_folder": str(broker / "control")})
    _fresh_producers(app)
    with django_db_blocker.unblock():
        old = connections["default"]
        new = DatabaseWrapper({**old.settings_dict, "NAME": str(plane.dir / "console.sqlite3")}, "default")
        connections["default"] = new
        try:
            yield plane
        finally:
            new.close()
            connections["default"] = old
            app.conf.update(saved_conf)
            _fresh_producers(app)


@pytest.fixture
def people(shared_db):
    """acme (two contacts) with alice its administrator; made once in the shared file."""
    from tenants import services
    from tenants.models import Membership, Tenant

    acme = Tenant.objects.filter(slug="acme").first() or services.create_tenant(
        "acme", name="Acme Corp", contact_emails=["ops@acme.test", "cto@acme.test", "not-chosen@acme.test"])
    User = get_user_model()
    alice = User.objects.filter(username="alice").first()
    if alice is None:
        alice = User.objects.create_user("alice", "alice@acme.test", "pw-alice-123456")
        Membership.objects.create(user=alice, tenant=acme, role=Membership.Role.ADMIN)
    client = Client()
    client.force_login(alice)
    return acme, client


def _run_finished(run_id):
    from spark_reports.models import ReportRun

    return ReportRun.objects.get(pk=run_id).done


def wait_for_run(run_id, proc: Proc, timeout: float = 240) -> None:
    """Wait for a report run to end; on a timeout, the worker's log and then the run's
    state (last: a failure's summary line shows its end)."""
    from spark_reports.models import ReportRun

    def explain():
        run = ReportRun.objects.get(pk=run_id)
        return (f"{proc.log()}\n---- run {run_id}: status={run.status} attempts={run.attempts} "
                f"progress={run.progress!r} error={run.error[:300]!r}")

    wait_for(lambda: _run_finished(run_id), timeout, explain)


def test_on_demand_report(worker, people, plane):
    from spark_reports.models import ReportRun

    acme, client = people
    first, last = TODAY - timedelta(days=7), TODAY - timedelta(days=1)
    response = client.post(reverse("reports", args=["acme"]),
                           {"preset": "custom", "first": first.isoformat(), "last": last.isoformat()})
    assert response.status_code == 302
    run = ReportRun.objects.get(pk=int(response["Location"].rstrip("/").rsplit("/", 1)[1]))
    # the page polls while the worker runs it
    assert 'hx-trigger="every 1s"' in client.get(response["Location"]).content.decode()
    wait_for_run(run.pk, worker)
    run.refresh_from_db()
    assert run.status == "succeeded", (worker.log(), run.error)
    assert run.attempts == 1 and run.result["tenant"] == "acme"

    period = Period.days(first, last)
    want = X.totals(plane.conns, plane.traffic, period.start, period.end, "acme")
    got = run.result["totals"]
    assert (got["messages"], got["connects"], got["peak_connections"], got["devices"]) == \
        (want["messages"], want["connects"], want["peak_connections"], want["devices"])
    assert len(run.result["daily"]) == 7

    page = client.get(response["Location"]).content.decode()
    assert f"{want['messages']:,}" in page and f"{want['connects']:,}" in page
    top = X.top_topics(plane.traffic, period.start, period.end, "acme", 10)[0]
    assert top[0] in page and f"{top[1]:,}" in page
    csv = client.get(reverse("report_csv", args=["acme", run.pk])).content.decode()
    assert f"totals,,messages,{want['messages']}\n" in csv


def test_schedule_due_now_is_emailed(worker, beat, people, plane):
    from spark_reports import services
    from spark_reports.models import ReportRun, ReportSchedule

    acme, client = people
    mail = plane.dir / "mail"
    before = set(mail.glob("*")) if mail.exists() else set()
    schedule = ReportSchedule.objects.create(tenant=acme, frequency="daily", hour=6,
                                             recipients=["ops@acme.test", "cto@acme.test"])
    services.schedule_saved(schedule)
    ReportSchedule.objects.filter(pk=schedule.pk).update(next_run_at=datetime.now(tz=UTC) - timedelta(seconds=1))

    def sent():     # written whole: Django's file backend ends each message with a line of 79 dashes
        return mail.exists() and {p for p in set(mail.glob("*")) - before
                                  if b"\n" + b"-" * 79 + b"\n" in p.read_bytes()}

    wait_for(sent, 150, lambda: beat.log() + "\n----\n" + worker.log())
    run = ReportRun.objects.get(schedule=schedule)
    assert run.status == "succeeded"
    yesterday = TODAY - timedelta(days=1)
    assert run.period_start.date() == yesterday and run.last_day == yesterday
    schedule.refresh_from_db()
    assert schedule.last_run_id == run.pk and schedule.next_run_at > datetime.now(tz=UTC)

    (path,) = sent()
    msg = email.message_from_bytes(path.read_bytes().split(b"\n" + b"-" * 79 + b"\n")[0], policy=policy.default)
    assert sorted(a.strip() for a in msg["To"].split(",")) == ["cto@acme.test", "ops@acme.test"]
    assert "not-chosen" not in msg["To"]
    assert f"{yesterday:%Y-%m-%d}" in msg["Subject"]
    html = msg.get_body(("html",)).get_content()
    period = Period.days(yesterday, yesterday)
    want = X.totals(plane.conns, plane.traffic, period.start, period.end, "acme")
    assert f"{want['messages']:,}" in html and "cid:daily-chart" in html
    parts = {p.get_filename(): p for p in msg.iter_attachments()}
    csv_name = f"usage-acme-{yesterday}-to-{yesterday}.csv"
    assert csv_name in parts and parts[csv_name].get_content_type() == "text/csv"
    assert f"totals,,messages,{want['messages']}" in parts[csv_name].get_content()
    assert parts["daily.png"].get_content().startswith(b"\x89PNG")
    run.refresh_from_db()
    assert run.emailed_at is not None and sorted(run.emailed_to) == ["cto@acme.test", "ops@acme.test"]
    # the schedules page shows the last run
    page = client.get(reverse("report_schedules", args=["acme"])).content.decode()
    assert reverse("report", args=["acme", run.pk]) in page


def test_beat_compacts_the_log_and_reports_read_lake_and_landing(worker, beat, people, plane):
    """Beat runs the compaction every LAKE_COMPACT_INTERVAL (10) s on the worker;
    a report run afterwards reads the lake and what is still landed: the same figures."""
    from spark_reports.models import ReportRun

    acme, client = people
    lake = plane.usage / "lake"
    wait_for(lambda: list(lake.glob("traffic/date=*/run=*")) and list(lake.glob("connections/date=*/run=*")), 150,
             lambda: beat.log() + "\n----\n" + worker.log())
    first, last = TODAY - timedelta(days=DAYS), TODAY
    response = client.post(reverse("reports", args=["acme"]),
                           {"preset": "custom", "first": first.isoformat(), "last": last.isoformat()})
    run_id = int(response["Location"].rstrip("/").rsplit("/", 1)[1])
    wait_for_run(run_id, worker)
    run = ReportRun.objects.get(pk=run_id)
    assert run.status == "succeeded", (worker.log(), run.error)
    period = Period.days(first, last)
    want = X.totals(plane.conns, plane.traffic, period.start, period.end, "acme")
    got = run.result["totals"]
    for key in ("messages", "bytes_in", "rejected", "connects", "disconnects", "devices", "peak_connections"):
        assert got[key] == want[key], key


def test_failing_job_is_retried_then_failed(worker, people, plane):
    from spark_reports.models import ReportRun

    acme, client = people
    saved = plane.usage.with_name("usage.saved")
    plane.usage.rename(saved)
    plane.usage.write_text("a file where the usage directory should be")
    try:
        response = client.post(reverse("reports", args=["acme"]), {"preset": "last_7"})
        run_id = int(response["Location"].rstrip("/").rsplit("/", 1)[1])
        wait_for_run(run_id, worker, 120)
    finally:
        os.remove(plane.usage)
        saved.rename(plane.usage)
    run = ReportRun.objects.get(pk=run_id)
    assert run.status == "failed"
    assert run.attempts == 4                       # the first try and 3 retries
    assert "usage log path is not a directory" in run.error
    page = client.get(response["Location"]).content.decode()
    assert "usage log path is not a directory" in page and "The report failed" in page
    assert reverse("report_retry", args=["acme", run_id]) in page
    # retry once the log is back
    client.post(reverse("report_retry", args=["acme", run_id]))
    wait_for_run(run_id, worker, 120)
    run.refresh_from_db()
    assert run.status == "succeeded" and run.error == "" and run.attempts == 5
