"""The email of a scheduled report: the key figures and a chart (PNG, inline
by Content-ID) in an HTML body with a plain-text alternative, and the whole
report as CSV attached; to the schedule's recipients that are still the
tenant's contacts."""

from email.mime.image import MIMEImage

from django.conf import settings
from django.core.mail import EmailMultiAlternatives
from django.template.loader import render_to_string
from django.utils import timezone

from . import charts, export
from .models import ReportRun
from .services import recipients
from .views_common import report_context


class NoRecipients(ValueError):
    """Nobody to send to: retrying will not help (not retried)."""


def build_message(run: ReportRun, to: list[str]) -> EmailMultiAlternatives:
    result = run.result
    labels, series = charts.daily_series(result)
    context = {"run": run, **report_context(run), "chart_cid": "daily-chart",
               "chart_legend": [(name, charts.PALETTE[i]) for i, (name, _) in enumerate(series)],
               "chart_max": f"{charts.stacked_max([v for _, v in series]):,.0f}"}
    subject = f"Usage report {run.tenant.slug if run.tenant_id else 'platform'}: " \
              f"{run.period_start:%Y-%m-%d} to {run.last_day:%Y-%m-%d}"
    text = render_to_string("spark_reports/email/report.txt", context)
    html = render_to_string("spark_reports/email/report.html", context)
    msg = EmailMultiAlternatives(subject, text, settings.DEFAULT_FROM_EMAIL, to)
    msg.attach_alternative(html, "text/html")
    image = MIMEImage(charts.png_bar_chart([values for _, values in series]), "png")
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
