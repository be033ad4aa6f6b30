"""The email of a scheduled report: the key figures, a link back to the
report in the console (CONSOLE_PUBLIC_URL) and a chart (a PNG drawn by
matplotlib, inline by Content-ID) in an HTML body with a plain-text
alternative, and the whole report as CSV attached; to the schedule's
recipients that are still the tenant's contacts. A period without a message
gets a sentence instead of the chart.

``mail_destination`` says where the console's email goes (files, the
worker's output, an SMTP host), for the pages that say "emailed".
"""

from email.mime.image import MIMEImage
from urllib.parse import urljoin

from django.conf import settings
from django.core.mail import EmailMultiAlternatives
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone

from . import charts, export
from .models import ReportRun
from .services import recipients
from .views_common import report_context


class NoRecipients(ValueError):
    """Nobody to send to: retrying will not help (not retried)."""


def report_url(run: ReportRun) -> str:
    """The run's page in the console, absolute (CONSOLE_PUBLIC_URL)."""
    path = reverse("report", args=[run.tenant.slug, run.pk]) if run.tenant_id else \
        reverse("platform_report", args=[run.pk])
    return urljoin(settings.CONSOLE_PUBLIC_URL, path.lstrip("/"))


def has_traffic(result: dict) -> bool:
    """Did any message go in or out in the period (is there a chart to draw)?"""
    return any(d.get("msgs_in") or d.get("msgs_out") for d in result.get("daily", []))


def no_traffic_sentence(run: ReportRun) -> str:
    t = (run.result or {}).get("totals", {})
    period = f"{run.period_start:%Y-%m-%d}" if run.period_start.date() == run.last_day else \
        f"{run.period_start:%Y-%m-%d} to {run.last_day:%Y-%m-%d}"
    connected = "" if t.get("connects") else " and no device connected"
    return f"No traffic from {period} (UTC): no message was sent or received{connected}, so there is no chart."


def build_message(run: ReportRun, to: list[str]) -> EmailMultiAlternatives:
    result = run.result
    labels, series = charts.daily_series(result)
    traffic = has_traffic(result)
    title = f"Messages per day, {run.period_start:%Y-%m-%d} to {run.last_day:%Y-%m-%d}"
    context = {"run": run, **report_context(run), "chart_cid": "daily-chart" if traffic else None,
               "chart_title": title, "report_url": report_url(run),
               "no_traffic": None if traffic else no_traffic_sentence(run)}
    subject = f"Usage report {run.tenant.slug if run.tenant_id else 'platform'}: " \
              f"{run.period_start:%Y-%m-%d} to {run.last_day:%Y-%m-%d}"
    text = render_to_string("spark_reports/email/report.txt", context)
    html = render_to_string("spark_reports/email/report.html", context)
    msg = EmailMultiAlternatives(subject, text, settings.DEFAULT_FROM_EMAIL, to)
    msg.attach_alternative(html, "text/html")
    if traffic:
        from . import mailchart  # matplotlib: see tests/test_layering.py LAZY

        image = MIMEImage(mailchart.daily_png(labels, series, title), "png")
        image.add_header("Content-ID", "<daily-chart>")
        image.add_header("Content-Disposition", "inline", filename="daily.png")
        msg.attach(image)
    msg.attach(export.filename(run), export.report_csv(result), "text/csv")
    return msg


def send_report(run: ReportRun) -> list[str]:
    """Send the run's email; -> the recipients. NoRecipients when none is left."""
    if run.schedule is None or run.result is None:
        raise ValueError(f"report {run.pk} is not a finished scheduled report")
    to = recipients(run.schedule)
    if not to:
        raise NoRecipients(f"schedule {run.schedule_id} has no recipient among the tenant's contacts")
    build_message(run, to).send()
    ReportRun.objects.filter(pk=run.pk).update(emailed_at=timezone.now(), emailed_to=to, email_error="")
    return to


BACKENDS = {
    "django.core.mail.backends.filebased.EmailBackend": "files",
    "django.core.mail.backends.console.EmailBackend": "console",
    "django.core.mail.backends.smtp.EmailBackend": "smtp",
    "django.core.mail.backends.locmem.EmailBackend": "memory",
    "django.core.mail.backends.dummy.EmailBackend": "dummy",
}


def mail_destination(show_host: bool = True) -> dict:
    """Where the console's email goes, for the pages: ``{"kind", "sent",
    "text"}`` -- ``sent`` False when nothing leaves the machine (development
    backends), ``text`` one sentence a person can act on. The SMTP host is
    named when ``show_host`` (platform administrators)."""
    kind = BACKENDS.get(settings.EMAIL_BACKEND, "other")
    if kind == "files":
        return {"kind": kind, "sent": False, "where": str(settings.EMAIL_FILE_PATH),
                "text": f"Development email: nothing is sent. Each email is written as a file to "
                        f"{settings.EMAIL_FILE_PATH} on the server (set EMAIL_URL to send by SMTP)."}
    if kind == "console":
        return {"kind": kind, "sent": False, "where": "the worker's output",
                "text": "Development email: nothing is sent. Each email is printed to the Celery worker's "
                        "output (set EMAIL_URL to send by SMTP)."}
    if kind == "memory":
        return {"kind": kind, "sent": False, "where": "memory",
                "text": "Email is kept in memory (a test setting): nothing is sent."}
    if kind == "dummy":
        return {"kind": kind, "sent": False, "where": "nowhere",
                "text": "Email is switched off (dummy backend): nothing is sent."}
    if kind == "smtp":
        host = f"{settings.EMAIL_HOST}:{settings.EMAIL_PORT}"
        return {"kind": kind, "sent": True, "where": host if show_host else "",
                "text": f"Reports are emailed through the SMTP server {host}." if show_host
                else "Reports are emailed to the recipients."}
    return {"kind": kind, "sent": True, "where": "", "text": f"Reports are emailed ({settings.EMAIL_BACKEND})."}
