"""The report pages and who may use them: root (platform administrator),
alice (admin of acme), victor (viewer of acme), bob (admin of globex, an
outsider to acme), anonymous. No worker here: runs are made as a worker
leaves them (``make_run``)."""

import re

import pytest
from django.urls import reverse

from spark_reports.models import ReportRun, ReportSchedule

HTMX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def acme_run(make_run, acme):
    return make_run(acme)


# ---------------------------------------------------------------- tenant reports


@pytest.mark.parametrize("who,status", [("root", 200), ("alice", 200), ("victor", 200), ("bob", 404),
                                        ("anonymous", 302)])
def test_report_list_access(clients, who, status):
    response = clients[who].get(reverse("reports", args=["acme"]))
    assert response.status_code == status
    if who == "anonymous":
        assert response["Location"].startswith(reverse("login"))


@pytest.mark.parametrize("who,status", [("root", 302), ("alice", 302), ("victor", 403), ("bob", 404)])
def test_run_report_access(clients, who, status):
    response = clients[who].post(reverse("reports", args=["acme"]),
                                 {"preset": "custom", "first": "2026-03-02", "last": "2026-03-08"})
    assert response.status_code == status
    runs = ReportRun.objects.filter(tenant__slug="acme")
    if status == 302:
        run = runs.get()
        assert response["Location"] == reverse("report", args=["acme", run.pk])
        assert run.status == "queued" and run.kind == "tenant"
        assert (run.period_start.date().isoformat(), run.last_day.isoformat()) == ("2026-03-02", "2026-03-08")
        assert run.requested_by.username == who
    else:
        assert not runs.exists()


def test_run_report_enqueues_after_commit(clients, django_capture_on_commit_callbacks, monkeypatch):
    sent = []
    monkeypatch.setattr("spark_reports.tasks.run_report.delay", lambda run_id: sent.append(run_id))
    with django_capture_on_commit_callbacks(execute=True):
        clients["alice"].post(reverse("reports", args=["acme"]), {"preset": "last_7"})
    assert sent == [ReportRun.objects.get().pk]


@pytest.mark.parametrize("data,error", [
    ({"preset": "custom", "first": "2026-03-09", "last": "2026-03-01"}, "ends before it starts"),
    ({"preset": "custom", "first": "2020-01-01", "last": "2026-03-01"}, "at most 366 days"),
    ({"preset": "custom", "first": "2026-03-01"}, "both dates"),
])
def test_run_report_form_errors(clients, data, error):
    response = clients["alice"].post(reverse("reports", args=["acme"]), data)
    assert response.status_code == 200 and error in response.content.decode()
    assert not ReportRun.objects.exists()


@pytest.mark.parametrize("who,status", [("root", 200), ("alice", 200), ("victor", 200), ("bob", 404)])
def test_result_page_access(clients, acme_run, who, status):
    response = clients[who].get(reverse("report", args=["acme", acme_run.pk]))
    assert response.status_code == status
    if status == 200:
        html = response.content.decode()
        assert "5,250" in html and "12" in html and "sensor-1" in html
        assert "plant/&lt;b&gt;boiler&lt;/b&gt;" in html and "<b>boiler" not in html      # escaped
        assert "<svg" in html
        assert reverse("report_csv", args=["acme", acme_run.pk]) in html


def test_other_tenants_run_is_404(clients, make_run, globex, acme):
    globex_run = make_run(globex)
    assert clients["alice"].get(reverse("report", args=["acme", globex_run.pk])).status_code == 404
    assert clients["alice"].get(reverse("report_csv", args=["acme", globex_run.pk])).status_code == 404
    assert clients["alice"].get(reverse("report", args=["globex", globex_run.pk])).status_code == 404
    assert clients["bob"].get(reverse("report", args=["globex", globex_run.pk])).status_code == 200
    # a platform run is not a tenant's
    platform_run = make_run(None)
    assert clients["root"].get(reverse("report", args=["acme", platform_run.pk])).status_code == 404


def test_progress_polls_then_refreshes(clients, make_run, acme):
    run = make_run(acme, status="running", progress="Daily series", progress_step=3)
    page = clients["victor"].get(reverse("report", args=["acme", run.pk])).content.decode()
    assert 'hx-trigger="every 1s"' in page and "Daily series" in page
    status = clients["victor"].get(reverse("report_status", args=["acme", run.pk]), **HTMX)
    assert status.status_code == 200 and "Step 3 of 5" in status.content.decode()
    run.status = "succeeded"
    run.save()
    done = clients["victor"].get(reverse("report_status", args=["acme", run.pk]), **HTMX)
    assert done["HX-Refresh"] == "true"


def test_the_header_badge_follows_the_run_while_it_is_polled(clients, make_run, acme):
    """The header's badge said "queued" while the polled card said "Running · Step 3 of 5"."""
    run = make_run(acme, status="queued", progress="Waiting for a worker", progress_step=0)
    page = clients["victor"].get(reverse("report", args=["acme", run.pk])).content.decode()
    assert re.search(r'<span id="run-status"><span class="badge badge-gray">queued</span>\s*</span>', page)
    assert 'hx-swap-oob' not in page                    # the first render has one badge, in the header
    run.status, run.progress, run.progress_step = "running", "Daily series", 3
    run.save()
    status = clients["victor"].get(reverse("report_status", args=["acme", run.pk]), **HTMX).content.decode()
    assert re.search(r'<span id="run-status" hx-swap-oob="true"><span class="badge badge-blue">running</span>\s*</span>',
                     status)
    assert "Step 3 of 5" in status


def test_csv_download(clients, acme_run):
    response = clients["victor"].get(reverse("report_csv", args=["acme", acme_run.pk]))
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    assert 'filename="usage-acme-2026-03-02-to-2026-03-08.csv"' in response["Content-Disposition"]
    body = response.content.decode()
    assert body.startswith("section,item,metric,value\n")
    assert "totals,,messages,5250\n" in body and "top_topics,plant/pump,messages,700\n" in body
    daily = clients["victor"].get(reverse("report_csv", args=["acme", acme_run.pk]) + "?table=daily")
    lines = daily.content.decode().splitlines()
    assert lines[0].startswith("date,msgs_in") and len(lines) == 8
    assert clients["victor"].get(reverse("report_csv", args=["acme", acme_run.pk]) + "?table=nope").status_code == 404


def test_printable_version(clients, acme_run):
    response = clients["victor"].get(reverse("report_print", args=["acme", acme_run.pk]))
    html = response.content.decode()
    assert response.status_code == 200 and "window.print()" in html and "@media print" not in html
    assert "reports.css" in html and "sidebar" not in html and "5,250" in html


def test_failure_shows_reason_and_retry(clients, make_run, acme):
    run = make_run(acme, status="failed", error="usage log directory not found: /nowhere", attempts=4)
    alice_page = clients["alice"].get(reverse("report", args=["acme", run.pk])).content.decode()
    assert "usage log directory not found: /nowhere" in alice_page and "After 4 attempts" in alice_page
    assert reverse("report_retry", args=["acme", run.pk]) in alice_page
    victor_page = clients["victor"].get(reverse("report", args=["acme", run.pk])).content.decode()
    assert "usage log directory not found" in victor_page
    assert reverse("report_retry", args=["acme", run.pk]) not in victor_page
    assert clients["victor"].post(reverse("report_retry", args=["acme", run.pk])).status_code == 403
    assert clients["bob"].post(reverse("report_retry", args=["acme", run.pk])).status_code == 404
    response = clients["alice"].post(reverse("report_retry", args=["acme", run.pk]))
    assert response.status_code == 302
    run.refresh_from_db()
    assert run.status == "queued" and run.error == ""
    # a failed run has no CSV
    failed = make_run(acme, status="failed", error="x")
    assert clients["alice"].get(reverse("report_csv", args=["acme", failed.pk])).status_code == 404


def test_a_failed_reports_reason_shows_tenant_members_no_platform_paths_or_hosts(clients, make_run, acme):
    """The reason names the file a job could not read; where the platform keeps its data (its mounts,
    hosts, Spark master) is for its administrators, who see the reason whole."""
    reason = ("Checksum error in file:/var/lib/mqtthub/usage/lake/connections/date=2026-03-04/run=7/"
              "part-00000-abc.snappy.parquet; master spark://10.0.0.5:7077")
    run = make_run(acme, status="failed", error=reason)
    for who in ("alice", "victor"):
        for url in (reverse("report", args=["acme", run.pk]), reverse("reports", args=["acme"])):
            page = clients[who].get(url).content.decode()
            assert "part-00000-abc.snappy.parquet" in page or "Checksum error in …/part-" in page, (who, url)
            assert "/var/lib/mqtthub" not in page and "10.0.0.5" not in page, (who, url)
    page = clients["root"].get(reverse("report", args=["acme", run.pk])).content.decode()
    assert "/var/lib/mqtthub/usage/lake/connections" in page and "spark://10.0.0.5:7077" in page


def test_reports_nav_entry(clients):
    html = clients["victor"].get(reverse("tenant", args=["acme"])).content.decode()
    assert reverse("reports", args=["acme"]) in html
    assert f'href="{reverse("platform_reports")}"' not in html
    assert f'href="{reverse("platform_reports")}"' in clients["root"].get(reverse("tenant_list")).content.decode()


# ---------------------------------------------------------------- schedules


def _schedule(tenant, **kw):
    from spark_reports import services

    s = ReportSchedule.objects.create(tenant=tenant, frequency=kw.pop("frequency", "weekly"),
                                      recipients=kw.pop("recipients", list(tenant.contact_emails)), **kw)
    return services.schedule_saved(s)


def test_schedules_viewer_reads_only(clients, acme):
    s = _schedule(acme)
    page = clients["victor"].get(reverse("report_schedules", args=["acme"]))
    html = page.content.decode()
    assert page.status_code == 200 and "ops@acme.test" in html and "Add schedule" not in html
    assert reverse("report_schedule_edit", args=["acme", s.pk]) not in html
    assert clients["victor"].post(reverse("report_schedules", args=["acme"]),
                                  {"frequency": "daily", "hour": "6", "recipients": ["ops@acme.test"]}).status_code == 403
    assert clients["victor"].post(reverse("report_schedule_toggle", args=["acme", s.pk])).status_code == 403
    assert clients["victor"].post(reverse("report_schedule_delete", args=["acme", s.pk])).status_code == 403
    assert clients["victor"].get(reverse("report_schedule_edit", args=["acme", s.pk])).status_code == 403


def test_schedules_outsider_404(clients, acme, globex):
    s = _schedule(acme)
    assert clients["bob"].get(reverse("report_schedules", args=["acme"])).status_code == 404
    assert clients["bob"].post(reverse("report_schedule_delete", args=["acme", s.pk])).status_code == 404
    # through his own tenant's URL: still not his
    assert clients["bob"].post(reverse("report_schedule_delete", args=["globex", s.pk])).status_code == 404
    assert ReportSchedule.objects.filter(pk=s.pk).exists()


def test_schedule_create_edit_disable_delete(clients, acme):
    c = clients["alice"]
    response = c.post(reverse("report_schedules", args=["acme"]),
                      {"frequency": "monthly", "hour": "7", "recipients": ["cto@acme.test"], "enabled": "on"})
    assert response.status_code == 302
    s = ReportSchedule.objects.get()
    assert (s.frequency, s.hour, s.recipients, s.enabled) == ("monthly", 7, ["cto@acme.test"], True)
    assert s.next_run_at.day == 1 and s.next_run_at.hour == 7
    html = c.get(reverse("report_schedules", args=["acme"])).content.decode()
    assert s.next_run_at.strftime("%Y-%m-%d 07:00") in html        # the next run is shown
    # edit
    response = c.post(reverse("report_schedule_edit", args=["acme", s.pk]),
                      {"frequency": "daily", "hour": "5", "recipients": ["ops@acme.test", "cto@acme.test"],
                       "enabled": "on"})
    assert response.status_code == 302
    s.refresh_from_db()
    assert s.frequency == "daily" and s.next_run_at.hour == 5 and len(s.recipients) == 2
    # disable: no next run
    c.post(reverse("report_schedule_toggle", args=["acme", s.pk]))
    s.refresh_from_db()
    assert not s.enabled and s.next_run_at is None
    c.post(reverse("report_schedule_toggle", args=["acme", s.pk]))
    s.refresh_from_db()
    assert s.enabled and s.next_run_at is not None
    # delete
    assert c.get(reverse("report_schedule_delete", args=["acme", s.pk])).status_code == 200
    assert c.post(reverse("report_schedule_delete", args=["acme", s.pk])).status_code == 302
    assert not ReportSchedule.objects.exists()


def test_schedule_recipients_are_tenant_contacts(clients, acme):
    response = clients["alice"].post(reverse("report_schedules", args=["acme"]),
                                     {"frequency": "daily", "hour": "6", "recipients": ["evil@elsewhere.test"]})
    assert response.status_code == 200 and "not one of the available choices" in response.content.decode()
    assert not ReportSchedule.objects.exists()


# ---------------------------------------------------------------- platform report


@pytest.mark.parametrize("who,status", [("root", 200), ("alice", 403), ("victor", 403), ("bob", 403),
                                        ("anonymous", 302)])
def test_platform_reports_admin_only(clients, make_run, who, status):
    run = make_run(None)
    assert clients[who].get(reverse("platform_reports")).status_code == status
    assert clients[who].get(reverse("platform_report", args=[run.pk])).status_code == status
    assert clients[who].get(reverse("platform_report_csv", args=[run.pk])).status_code == status
    response = clients[who].post(reverse("platform_reports"), {"preset": "last_30"})
    assert response.status_code == (302 if who in ("root", "anonymous") else 403)
    assert ReportRun.objects.filter(kind="platform").count() == (2 if who == "root" else 1)


def test_platform_result_page(clients, make_run, acme):
    run = make_run(None)
    html = clients["root"].get(reverse("platform_report", args=[run.pk])).content.decode()
    assert "Tenants by messages" in html and "globex" in html and "node1" in html
    # a tenant's run is not reachable as a platform run
    tenant_run = make_run(acme)
    assert clients["root"].get(reverse("platform_report", args=[tenant_run.pk])).status_code == 404


def test_the_spreadsheet_export_is_one_csv_per_section(clients, acme_run):
    import csv
    import io
    import zipfile

    response = clients["victor"].get(reverse("report_csv", args=["acme", acme_run.pk]) + "?format=zip")
    assert response.status_code == 200 and response["Content-Type"] == "application/zip"
    assert 'filename="usage-acme-2026-03-02-to-2026-03-08.zip"' in response["Content-Disposition"]
    z = zipfile.ZipFile(io.BytesIO(response.content))
    base = "usage-acme-2026-03-02-to-2026-03-08/"
    assert sorted(z.namelist()) == sorted(base + f for f in ("totals.csv", "daily.csv", "top_topics.csv",
                                                             "top_devices.csv", "rejections.csv", "reasons.csv"))
    daily = list(csv.DictReader(io.StringIO(z.read(base + "daily.csv").decode())))
    assert len(daily) == 7 and daily[0]["date"] == "2026-03-02" and daily[0]["msgs_in"] == "200"
    totals = dict(csv.reader(io.StringIO(z.read(base + "totals.csv").decode())))
    assert totals["messages"] == "5250" and totals["devices"] == "17"
    page = clients["victor"].get(reverse("report", args=["acme", acme_run.pk])).content.decode()
    assert "?format=zip" in page


def test_one_device_is_one_device(clients, make_run, acme):
    """The report read "1 devices" and "of 1 closed" (of what?)."""
    from .conftest import sample_result

    result = sample_result()
    result["totals"].update(devices=1, disconnects=1, connects=1)
    run = make_run(acme, result=result)
    page = clients["victor"].get(reverse("report", args=["acme", run.pk])).content.decode()
    assert "1 disconnect · 1 device<" in page and "of 1 session closed" in page
    assert "1 devices" not in page


def test_counts_and_times_read_as_words():
    from datetime import timedelta

    from django.utils import timezone

    from core.templatetags.core_tags import ago, plural_filter

    assert [plural_filter(n, "device") for n in (0, 1, 2, 1204)] == ["0 devices", "1 device", "2 devices",
                                                                     "1,204 devices"]
    assert plural_filter(1, "child,children") == "1 child" and plural_filter(3, "child,children") == "3 children"
    assert ago(timezone.now() - timedelta(seconds=20)) == "just now"             # was "0 minutes ago"
    assert ago(timezone.now() - timedelta(minutes=5, seconds=3)) == "5\xa0minutes ago"


# ---------------------------------------------------------------- send now, where email goes


@pytest.fixture
def eager_celery():
    """The tasks run in this process as ``delay`` is called (the worker's code, no worker process)."""
    from console.celery import app

    saved = {k: app.conf[k] for k in ("task_always_eager", "task_eager_propagates")}
    app.conf.update(task_always_eager=True, task_eager_propagates=True)
    yield
    app.conf.update(saved)


@pytest.mark.slow
def test_send_now_runs_the_schedule_at_once_and_emails_it(spark, clients, acme, globex, tmp_path, settings,
                                                          eager_celery, django_capture_on_commit_callbacks):
    """"Send now" on a daily schedule: a real run over yesterday (Spark, through
    the Celery task as the worker runs it), emailed to the schedule's recipients
    with a link back, audited; the schedule's next run stays where it was."""
    from datetime import UTC, datetime, timedelta

    from django.core import mail

    from core.models import AuditEvent
    from spark_reports import usagegen as gen

    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    settings.CONSOLE_PUBLIC_URL = "http://console.test:8000/"
    settings.USAGE_DIR = str(tmp_path / "usage")
    yesterday = (datetime.now(tz=UTC) - timedelta(days=1)).replace(hour=12, minute=0, second=0, microsecond=0)
    gen.write_rows(tmp_path / "usage", "traffic", [
        gen.traffic_row(yesterday.timestamp(), "acme", "plant/boiler", msgs_in_q1=40, bytes_in=4000, msgs_out=2),
        gen.traffic_row(yesterday.timestamp(), "globex", "other", msgs_in_q0=999)])
    s = _schedule(acme, frequency="daily", recipients=["ops@acme.test"])
    next_run = s.next_run_at

    # who may: as editing the schedule (viewers 403, another tenant's members 404)
    assert clients["victor"].post(reverse("report_schedule_send", args=["acme", s.pk])).status_code == 403
    assert clients["bob"].post(reverse("report_schedule_send", args=["acme", s.pk])).status_code == 404
    assert not ReportRun.objects.exists()

    with django_capture_on_commit_callbacks(execute=True):
        response = clients["alice"].post(reverse("report_schedule_send", args=["acme", s.pk]))
    run = ReportRun.objects.get()
    assert response.status_code == 302 and response["Location"] == reverse("report", args=["acme", run.pk])
    assert (run.status, run.schedule, run.requested_by.username) == ("succeeded", s, "alice"), run.error
    assert run.period_start.date() == run.last_day == yesterday.date()
    assert run.result["totals"]["messages"] == 42
    (msg,) = mail.outbox
    assert msg.to == ["ops@acme.test"]
    assert f"In the console: http://console.test:8000/tenants/acme/reports/{run.pk}/" in msg.body
    assert "Messages:         42 (40 in, 2 out)" in msg.body
    run.refresh_from_db()
    assert run.emailed_to == ["ops@acme.test"] and run.emailed_at is not None
    s.refresh_from_db()
    assert s.next_run_at == next_run and s.last_run == run
    event = AuditEvent.objects.get(action="report_schedule.send")
    assert (event.actor, event.tenant, event.object_id) == ("alice", "acme", str(s.pk))
    assert f'"run": {run.pk}' in event.after
    page = clients["alice"].get(response["Location"]).content.decode()
    assert "by alice (Send now of a daily schedule)" in page
    day = f"{yesterday:%Y-%m-%d}"
    assert f"Usage of Acme Corp, {day}" in page and f"{day} – {day}" not in page      # one day, one date


def test_send_now_without_a_recipient_left_sends_nothing(clients, acme):
    s = _schedule(acme, recipients=["gone@acme.test"])
    response = clients["alice"].post(reverse("report_schedule_send", args=["acme", s.pk]), follow=True)
    assert "none of the schedule&#x27;s recipients is still a contact" in response.content.decode()
    assert not ReportRun.objects.exists()


def test_the_schedules_page_says_where_email_goes(clients, acme, settings, tmp_path, make_run):
    _schedule(acme)
    settings.EMAIL_BACKEND = "django.core.mail.backends.filebased.EmailBackend"
    settings.EMAIL_FILE_PATH = str(tmp_path / "mail")
    page = clients["alice"].get(reverse("report_schedules", args=["acme"])).content.decode()
    assert "Development email: nothing is sent." in page
    assert f"Each email is written as a file to {tmp_path / 'mail'} on the server" in page
    assert "Send now" in page
    assert "Send now" not in clients["victor"].get(reverse("report_schedules", args=["acme"])).content.decode()

    settings.EMAIL_BACKEND = "django.core.mail.backends.console.EmailBackend"
    page = clients["alice"].get(reverse("report_schedules", args=["acme"])).content.decode()
    assert "printed to the Celery worker&#x27;s output" in page

    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "smtp.mail.test", 587
    assert "through the SMTP server smtp.mail.test:587" in \
        clients["root"].get(reverse("report_schedules", args=["acme"])).content.decode()
    page = clients["alice"].get(reverse("report_schedules", args=["acme"])).content.decode()
    assert "Reports are emailed to the recipients." in page and "smtp.mail.test" not in page   # a tenant's member


def test_a_scheduled_reports_page_says_where_its_email_went(clients, acme, settings, tmp_path, make_run):
    from django.utils import timezone

    s = _schedule(acme)
    settings.EMAIL_BACKEND = "django.core.mail.backends.filebased.EmailBackend"
    settings.EMAIL_FILE_PATH = str(tmp_path / "mail")
    run = make_run(acme, schedule=s, emailed_at=timezone.now(), emailed_to=["ops@acme.test"])
    page = clients["alice"].get(reverse("report", args=["acme", run.pk])).content.decode()
    assert "The email to ops@acme.test was made at" in page and str(tmp_path / "mail") in page
    assert "Emailed to" not in page
    queued = make_run(acme, status="queued", schedule=s)
    page = clients["alice"].get(reverse("report", args=["acme", queued.pk])).content.decode()
    assert "When it is done the report is emailed to the schedule's recipients." in page
    assert str(tmp_path / "mail") in page
    ReportSchedule.objects.filter(pk=s.pk).update(last_run=run, last_run_at=timezone.now())
    schedules_page = clients["alice"].get(reverse("report_schedules", args=["acme"])).content.decode()
    assert f"written to {tmp_path / 'mail'}" in schedules_page


def test_a_quiet_periods_page_says_so_instead_of_empty_charts(clients, make_run, acme):
    from .conftest import sample_result

    quiet = sample_result("tenant", "acme")
    quiet["daily"] = [{**d, "msgs_in": 0, "msgs_out": 0, "connects": 0, "disconnects": 0} for d in quiet["daily"]]
    run = make_run(acme, result=quiet)
    page = clients["alice"].get(reverse("report", args=["acme", run.pk])).content.decode()
    assert "No message was sent or received in this period." in page
    assert "No device connected or disconnected in this period." in page
    assert '<svg class="chart"' not in page
    busy = make_run(acme)
    page = clients["alice"].get(reverse("report", args=["acme", busy.pk])).content.decode()
    assert page.count('<svg class="chart"') == 2 and "No message was sent" not in page


# ---------------------------------------------------------------- one tenant cannot fill the workers' queue


def test_a_tenant_may_have_only_so_many_reports_waiting_or_running(clients, make_run, acme, globex, settings):
    """The workers are every tenant's: a tenant admin pressing "Run report" (or a script posting it) a
    thousand times queued a thousand Spark jobs ahead of every other tenant's reports and schedules.
    Past REPORTS_MAX_PENDING runs waiting or running, "Run report", "Send now" and "Retry" say why on
    the page and queue nothing; once one is done the next is taken; other tenants are not held back."""
    settings.REPORTS_MAX_PENDING = 3
    make_run(acme, status="running")
    url = reverse("reports", args=["acme"])
    for _ in range(2):
        assert clients["alice"].post(url, {"preset": "last_7"}).status_code == 302
    page = clients["alice"].post(url, {"preset": "last_7"})
    assert page.status_code == 200
    assert "3 reports of this tenant are waiting or running (at most 3 at once)" in page.content.decode()
    pending = ReportRun.objects.filter(tenant=acme, status__in=("queued", "running"))
    assert pending.count() == 3
    # another tenant's button still works
    assert clients["bob"].post(reverse("reports", args=["globex"]), {"preset": "last_7"}).status_code == 302

    failed = make_run(acme, status="failed", error="x")
    page = clients["alice"].post(reverse("report_retry", args=["acme", failed.pk]), follow=True).content.decode()
    assert "Not retried: 3 reports of this tenant are waiting or running" in page
    failed.refresh_from_db()
    assert failed.status == "failed"
    s = _schedule(acme)
    page = clients["alice"].post(reverse("report_schedule_send", args=["acme", s.pk]), follow=True).content.decode()
    assert "Not sent: 3 reports of this tenant are waiting or running" in page
    assert pending.count() == 3

    ReportRun.objects.filter(pk=pending.first().pk).update(status="succeeded")       # one is done
    assert clients["alice"].post(reverse("report_retry", args=["acme", failed.pk])).status_code == 302
    failed.refresh_from_db()
    assert failed.status == "queued" and pending.count() == 3


def test_a_tenant_may_have_only_so_many_schedules(clients, acme, settings):
    """Each schedule is a Spark job a period: past REPORTS_MAX_SCHEDULES the form says so inline and
    saves nothing; editing one of them still works."""
    settings.REPORTS_MAX_SCHEDULES = 2
    first, _ = _schedule(acme), _schedule(acme)
    url = reverse("report_schedules", args=["acme"])
    page = clients["alice"].post(url, {"frequency": "daily", "hour": "6", "recipients": ["ops@acme.test"],
                                       "enabled": "on"})
    assert page.status_code == 200
    assert "This tenant has 2 report schedules, the most it may have" in page.content.decode()
    assert ReportSchedule.objects.filter(tenant=acme).count() == 2
    response = clients["alice"].post(reverse("report_schedule_edit", args=["acme", first.pk]),
                                     {"frequency": "weekly", "hour": "7", "recipients": ["ops@acme.test"],
                                      "enabled": "on"})
    assert response.status_code == 302
    first.refresh_from_db()
    assert first.frequency == "weekly"
