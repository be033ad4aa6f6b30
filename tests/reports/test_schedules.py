"""Schedules: when they run and what they report (pure functions), starting
the due ones exactly once, and the email a scheduled report sends."""

import io
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


def test_runs_missed_while_beat_was_down_each_run_once_when_it_is_back(
        acme, django_capture_on_commit_callbacks, monkeypatch):
    """Before: the four days' runs missed collapsed into one report of the last day; the other days'
    reports were never sent. Now each missed day gets its own run (and email), oldest first, once."""
    sent = []
    monkeypatch.setattr("spark_reports.tasks.run_report.delay", lambda run_id: sent.append(run_id))
    s = ReportSchedule.objects.create(tenant=acme, frequency="daily", recipients=["ops@acme.test"],
                                      next_run_at=at(2026, 3, 1, 6))
    with django_capture_on_commit_callbacks(execute=True):
        runs = tasks.dispatch_due(at(2026, 3, 5, 7))         # beat was down from 3/1 05:00 to 3/5 07:00
        assert tasks.dispatch_due(at(2026, 3, 5, 7, 1)) == []
    assert [r.period_start for r in runs] == [at(2026, 2, 28), at(2026, 3, 1), at(2026, 3, 2), at(2026, 3, 3),
                                              at(2026, 3, 4)]
    assert all(r.period_end - r.period_start == timedelta(days=1) and r.schedule == s for r in runs)
    assert sent == [r.pk for r in runs]
    s.refresh_from_db()
    assert s.next_run_at == at(2026, 3, 6, 6) and s.last_run == runs[-1]


def test_catching_up_is_bounded_to_the_latest_periods(acme, settings):
    settings.REPORTS_MAX_CATCH_UP = 3
    ReportSchedule.objects.create(tenant=acme, frequency="weekly", recipients=["ops@acme.test"],
                                  next_run_at=at(2025, 3, 3, 6))                   # down for a year
    runs = tasks.dispatch_due(at(2026, 3, 11, 12))
    assert [(r.period_start, r.period_end) for r in runs] == [
        (at(2026, 2, 16), at(2026, 2, 23)), (at(2026, 2, 23), at(2026, 3, 2)), (at(2026, 3, 2), at(2026, 3, 9))]


def _scheduled_run(tenant, recipients):
    s = ReportSchedule.objects.create(tenant=tenant, frequency="weekly", recipients=recipients)
    return ReportRun.objects.create(tenant=tenant, schedule=s, status="succeeded", period_start=at(2026, 3, 2),
                                    period_end=at(2026, 3, 9), result=sample_result("tenant", tenant.slug))


def _parts(msg) -> dict:
    parsed = message_from_bytes(msg.message().as_bytes(), policy=policy.default)
    return {p.get_filename(): p for p in parsed.iter_attachments()}


def test_email(acme, settings):
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    settings.CONSOLE_PUBLIC_URL = "https://console.example.test/"
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
    # a link back to the report, absolute, in both bodies
    link = f"https://console.example.test/tenants/acme/reports/{run.pk}/"
    assert f'href="{link}"' in html and "Open the report in the console" in html
    assert f"In the console: {link}" in msg.body


def test_the_emailed_chart_is_drawn_by_matplotlib_with_title_axes_and_units(acme, settings):
    """The chart a reader sees: a PNG from matplotlib (its Software tag), the
    period in its title, "Day (UTC)" under the x axis, "Messages" beside the y
    axis with thousands separators, a legend for in and out."""
    from PIL import Image

    from spark_reports import charts, mailchart

    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    run = _scheduled_run(acme, ["ops@acme.test"])
    delivery.send_report(run)
    png = _parts(mail.outbox[0])["daily.png"].get_content()
    image = Image.open(io.BytesIO(png))
    assert image.info["Software"].startswith("Matplotlib")
    assert image.info["Title"] == "Messages per day, 2026-03-02 to 2026-03-08"
    assert image.size == (1184, 520)                    # 592 px wide in the email, at twice the density

    labels, series = charts.daily_series(run.result)
    fig = mailchart.daily_figure(labels, series, "Messages per day, 2026-03-02 to 2026-03-08")
    (ax,) = fig.axes
    fig.canvas.draw()
    assert fig.get_suptitle() == "Messages per day, 2026-03-02 to 2026-03-08"
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("Day (UTC)", "Messages")
    assert [t.get_text() for t in ax.get_xticklabels()] == labels == [f"03-0{d}" for d in range(2, 9)]
    assert "1,200" in [t.get_text() for t in ax.get_yticklabels()]      # the busiest day: 800 in + 400 out
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["messages in", "messages out"]


def test_a_period_without_traffic_gets_a_sentence_not_an_empty_chart(acme, settings):
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    run = _scheduled_run(acme, ["ops@acme.test"])
    quiet = sample_result("tenant", "acme")
    quiet["daily"] = [{**d, "msgs_in": 0, "msgs_out": 0, "connects": 0, "disconnects": 0} for d in quiet["daily"]]
    quiet["totals"].update(messages=0, msgs_in=0, msgs_out=0, connects=0, disconnects=0, devices=0)
    quiet["top_topics"] = []
    ReportRun.objects.filter(pk=run.pk).update(result=quiet)
    run.refresh_from_db()
    delivery.send_report(run)
    (msg,) = mail.outbox
    sentence = ("No traffic from 2026-03-02 to 2026-03-08 (UTC): no message was sent or received and no device "
                "connected, so there is no chart.")
    html = msg.alternatives[0].content
    assert sentence in html and sentence in msg.body
    assert "cid:" not in html and "<img" not in html
    assert "daily.png" not in _parts(msg)
    assert "usage-acme-2026-03-02-to-2026-03-08.csv" in _parts(msg)


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


def test_the_links_in_emails_start_at_console_public_url():
    """CONSOLE_PUBLIC_URL when set (checked), else production's first host over
    HTTPS, else where `make run` serves the console."""
    from django.core.exceptions import ImproperlyConfigured

    from console.env import console_public_url

    assert console_public_url("https://hub.example.com/console", True, ["x"], "0.0.0.0", "8000") == \
        "https://hub.example.com/console/"
    assert console_public_url("", True, [".example.com", "hub.example.com"], "0.0.0.0", "8000") == \
        "https://hub.example.com/"
    assert console_public_url("", False, ["localhost"], "127.0.0.1", "8001") == "http://127.0.0.1:8001/"
    assert console_public_url("", False, ["*"], "0.0.0.0", "8000") == "http://127.0.0.1:8000/"
    with pytest.raises(ImproperlyConfigured, match="CONSOLE_PUBLIC_URL"):
        console_public_url("hub.example.com", False, [], "127.0.0.1", "8000")


@pytest.mark.parametrize("frequency,ran,edited,hour,expected", [
    # a daily report sent at 06:00, moved to 09:00 at 07:00: the next is tomorrow's (was 09:00 today, yesterday again)
    ("daily", at(2026, 3, 4, 6, 0, 30), at(2026, 3, 4, 7), 9, at(2026, 3, 5, 9)),
    # a weekly one sent on Monday at 06:00, moved to 10:00 that morning: next Monday's (was the same week again)
    ("weekly", at(2026, 3, 9, 6, 0, 30), at(2026, 3, 9, 7), 10, at(2026, 3, 16, 10)),
    ("monthly", at(2026, 4, 1, 6, 0, 30), at(2026, 4, 1, 7), 8, at(2026, 5, 1, 8)),
])
def test_a_schedule_moved_later_the_same_day_does_not_send_the_same_period_again(
        acme, django_capture_on_commit_callbacks, monkeypatch, frequency, ran, edited, hour, expected):
    sent = []
    monkeypatch.setattr("spark_reports.tasks.run_report.delay", lambda run_id: sent.append(run_id))
    s = ReportSchedule.objects.create(tenant=acme, frequency=frequency, hour=6, recipients=["ops@acme.test"])
    services.schedule_saved(s, now=ran - timedelta(hours=2))
    with django_capture_on_commit_callbacks(execute=True):
        (first,) = tasks.dispatch_due(ran)
    s.refresh_from_db()
    s.hour = hour                                   # the edit form, later that morning
    s.save()
    services.schedule_saved(s, now=edited)
    with django_capture_on_commit_callbacks(execute=True):
        again = tasks.dispatch_due(ran.replace(hour=hour, minute=0, second=30))
    assert [(r.period_start, r.period_end) for r in again] == [] and sent == [first.pk]   # not the same again
    s.refresh_from_db()
    assert s.next_run_at == expected
    # disabled and enabled again that day: the same
    for enabled in (False, True):
        s.enabled = enabled
        s.save()
        services.schedule_saved(s, now=edited)
    assert s.next_run_at == expected
    # "Send now" is not a scheduled run: the next run still reports its period
    from django.contrib.auth import get_user_model

    other = ReportSchedule.objects.create(tenant=acme, frequency=frequency, hour=hour, recipients=["ops@acme.test"])
    services.send_now_run(other, get_user_model().objects.create_user("alice"), now=edited)
    services.schedule_saved(other, now=edited)
    assert other.next_run_at == ran.replace(hour=hour, minute=0, second=0)


def test_a_second_message_of_a_run_does_nothing(acme, monkeypatch):
    """A queued run queued again (its message looked lost: services.requeue_lost) may have two messages:
    the worker that takes the second one finds the run taken, done or failed, and leaves it."""
    from spark_reports.tasks import run_report

    ran = []
    monkeypatch.setattr(services, "_execute", lambda run, report: ran.append(run.pk) or run)
    run = ReportRun.objects.create(tenant=acme, period_start=at(2026, 3, 2), period_end=at(2026, 3, 9))
    for status in ("running", "succeeded", "failed"):
        ReportRun.objects.filter(pk=run.pk).update(status=status)
        assert run_report.apply(args=[run.pk], throw=True).get() == f"not queued ({status})"
        assert services.execute_run(run, attempt=1) is None
    assert ran == []
