"""Schedules: when they run and what they report (pure functions), starting
the due ones exactly once, and the email a scheduled report sends."""

from datetime import UTC, date, datetime, timedelta
from email import message_from_bytes, policy

import pytest
from celery.exceptions import Retry
from django.core import mail

from spark_reports import delivery, services, tasks
from spark_reports.models import ReportRun, ReportSchedule
from spark_reports.schedules import latest_due, next_run, period_for

from .conftest import sample_result


def at(*args):
    return datetime(*args, tzinfo=UTC)


@pytest.mark.parametrize("frequency,after,expected", [
    ("daily", at(2026, 3, 4, 5, 59), at(2026, 3, 4, 6)),
    ("daily", at(2026, 3, 4, 6, 0), at(2026, 3, 5, 6)),          # strictly after
    ("weekly", at(2026, 3, 4, 12), at(2026, 3, 9, 6)),           # the next Monday
    ("weekly", at(2026, 3, 9, 5), at(2026, 3, 9, 6)),
    ("monthly", at(2026, 3, 4), at(2026, 4, 1, 6)),
    ("monthly", at(2026, 12, 15), at(2027, 1, 1, 6)),
])
def test_next_run(frequency, after, expected):
    assert next_run(frequency, 6, after) == expected


@pytest.mark.parametrize("frequency,run_at,first,last", [
    ("daily", at(2026, 3, 4, 6), date(2026, 3, 3), date(2026, 3, 3)),
    ("weekly", at(2026, 3, 9, 6), date(2026, 3, 2), date(2026, 3, 8)),       # Monday to Sunday before
    ("monthly", at(2026, 3, 1, 6), date(2026, 2, 1), date(2026, 2, 28)),
    ("monthly", at(2026, 1, 1, 6), date(2025, 12, 1), date(2025, 12, 31)),
])
def test_period_for(frequency, run_at, first, last):
    assert period_for(frequency, run_at) == (first, last)


def test_latest_due():
    assert latest_due("weekly", 6, at(2026, 3, 11, 12)) == at(2026, 3, 9, 6)
    assert latest_due("daily", 6, at(2026, 3, 11, 5)) == at(2026, 3, 10, 6)


def test_dispatch_starts_due_schedules_once(acme, globex, django_capture_on_commit_callbacks, monkeypatch):
    sent = []
    monkeypatch.setattr("spark_reports.tasks.run_report.delay", lambda run_id: sent.append(run_id))
    now = at(2026, 3, 9, 6, 0, 30)
    due = ReportSchedule.objects.create(tenant=acme, frequency="weekly", recipients=["ops@acme.test"],
                                        next_run_at=at(2026, 3, 9, 6))
    ReportSchedule.objects.create(tenant=globex, frequency="daily", recipients=["noc@globex.test"],
                                  next_run_at=at(2026, 3, 10, 6))                    # not yet
    ReportSchedule.objects.create(tenant=globex, frequency="daily", recipients=["noc@globex.test"],
                                  next_run_at=at(2026, 3, 9, 6), enabled=False)     # disabled
    with django_capture_on_commit_callbacks(execute=True):
        runs = tasks.dispatch_due(now)
        assert tasks.dispatch_due(now) == []                # a second beat tick in the same minute
    (run,) = runs
    assert sent == [run.pk]
    assert (run.tenant, run.schedule, run.kind, run.status) == (acme, due, "tenant", "queued")
    assert (run.period_start, run.period_end) == (at(2026, 3, 2), at(2026, 3, 9))
    due.refresh_from_db()
    assert due.next_run_at == at(2026, 3, 16, 6) and due.last_run == run


def test_missed_runs_collapse_into_the_latest(acme):
    s = ReportSchedule.objects.create(tenant=acme, frequency="daily", recipients=["ops@acme.test"],
                                      next_run_at=at(2026, 3, 1, 6))
    (run,) = tasks.dispatch_due(at(2026, 3, 5, 7))           # beat was down for four days
    assert run.period_start == at(2026, 3, 4)
    s.refresh_from_db()
    assert s.next_run_at == at(2026, 3, 6, 6)


def _scheduled_run(tenant, recipients):
    s = ReportSchedule.objects.create(tenant=tenant, frequency="weekly", recipients=recipients)
    return ReportRun.objects.create(tenant=tenant, schedule=s, status="succeeded", period_start=at(2026, 3, 2),
                                    period_end=at(2026, 3, 9), result=sample_result("tenant", tenant.slug))


def test_email(acme, settings):
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    run = _scheduled_run(acme, ["ops@acme.test", "gone@acme.test"])       # gone@ is no contact any more
    assert delivery.send_report(run) == ["ops@acme.test"]
    (msg,) = mail.outbox
    assert msg.to == ["ops@acme.test"]
    assert msg.subject == "Usage report acme: 2026-03-02 to 2026-03-08"
    assert "Messages:         5250" in msg.body
    html = msg.alternatives[0].content
    assert "5,250" in html and "cid:daily-chart" in html and "plant/&lt;b&gt;boiler" in html
    parsed = message_from_bytes(msg.message().as_bytes(), policy=policy.default)
    files = {p.get_filename(): p for p in parsed.iter_attachments()}
    assert files["usage-acme-2026-03-02-to-2026-03-08.csv"].get_content().startswith("section,item,metric,value")
    png = files["daily.png"]
    assert png["Content-ID"] == "<daily-chart>" and png.get_content()[:8] == b"\x89PNG\r\n\x1a\n"
    run.refresh_from_db()
    assert run.emailed_at is not None and run.emailed_to == ["ops@acme.test"]


def test_email_without_recipients_is_not_retried(acme, settings):
    from spark_reports.tasks import deliver_report

    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    run = _scheduled_run(acme, ["gone@acme.test"])
    with pytest.raises(delivery.NoRecipients):
        deliver_report.apply(args=[run.pk], throw=True)
    run.refresh_from_db()
    assert "no recipient" in run.email_error and not mail.outbox
    assert deliver_report.dont_autoretry_for == (ValueError,)


def test_run_report_task_records_each_failure(acme, monkeypatch, settings):
    """The task body outside a worker: a failure is recorded, queued for a retry, the last one fails it."""
    from spark_reports.tasks import run_report

    def boom(run, attempt):
        raise RuntimeError("HDFS unreachable\n\tat org.apache...")

    monkeypatch.setattr(services, "execute_run", boom)
    run = ReportRun.objects.create(tenant=acme, period_start=at(2026, 3, 2), period_end=at(2026, 3, 9))
    with pytest.raises(Retry):
        run_report.apply(args=[run.pk], retries=0, throw=True)
    run.refresh_from_db()
    assert run.status == "queued" and run.error == "HDFS unreachable" and "retrying in" in run.progress
    with pytest.raises(RuntimeError):
        run_report.apply(args=[run.pk], retries=settings.REPORTS_MAX_RETRIES, throw=True)
    run.refresh_from_db()
    assert run.status == "failed" and run.error == "HDFS unreachable" and run.finished_at is not None


def test_schedule_saved_next_run(acme):
    s = ReportSchedule.objects.create(tenant=acme, frequency="monthly", hour=3, recipients=["ops@acme.test"])
    services.schedule_saved(s, now=at(2026, 3, 4, 10))
    assert s.next_run_at == at(2026, 4, 1, 3)
    s.enabled = False
    services.schedule_saved(s, now=at(2026, 3, 4, 10))
    assert s.next_run_at is None
    assert timedelta(0) < at(2026, 4, 1, 3) - at(2026, 3, 4, 10)
