"""Report runs and schedules.

A ``ReportRun`` is one report over one period: made by "Run report" in the
console or by a ``ReportSchedule`` coming due, run by the Celery task
``spark_reports.tasks.run_report``, its result kept here as JSON (Celery
keeps no results). A platform report has no tenant; a tenant usage or
telemetry report has one.
"""

from django.conf import settings
from django.db import models
from django.utils import timezone

from tenants.fields import LineListField


class ReportRun(models.Model):
    class Kind(models.TextChoices):
        TENANT = "tenant", "tenant usage"
        PLATFORM = "platform", "platform usage"
        TELEMETRY = "telemetry", "telemetry"     # what a tenant's store rules kept (spark_reports.telemetry)

    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"

    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.TENANT)
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, null=True, blank=True,
                               related_name="report_runs")
    # [period_start, period_end): whole UTC days
    period_start = models.DateTimeField()
    period_end = models.DateTimeField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    progress = models.CharField(max_length=200, blank=True)
    progress_step = models.PositiveSmallIntegerField(default=0)
    progress_total = models.PositiveSmallIntegerField(default=0)
    error = models.TextField(blank=True)
    attempts = models.PositiveIntegerField(default=0)
    result = models.JSONField(null=True, blank=True)
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True,
                                     related_name="+")
    schedule = models.ForeignKey("ReportSchedule", on_delete=models.SET_NULL, null=True, blank=True,
                                 related_name="runs")
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # while running: the worker's last sign of life (REPORTS_HEARTBEAT); none for REPORTS_STALLED_AFTER
    # seconds -- the worker is gone -- and beat queues the run again (services.requeue_stalled)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    # while queued: when it was put on Celery's queue (a retry: when it is due). A queued run no worker
    # took for REPORTS_STALLED_AFTER seconds after that -- its message was lost with a worker that had
    # fetched it, or never sent -- is queued again by beat (services.requeue_lost); a worker takes a
    # run only from "queued" (services.execute_run), so a second message of it is a no-op
    queued_at = models.DateTimeField(null=True, blank=True)
    # scheduled runs: the email
    emailed_at = models.DateTimeField(null=True, blank=True)
    emailed_to = LineListField()
    email_error = models.TextField(blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["tenant", "-created_at"], name="spark_run_tenant_created")]

    def __str__(self):
        return f"{self.get_kind_display()} report {self.pk} ({self.tenant or 'platform'})"

    @property
    def done(self) -> bool:
        return self.status in (self.Status.SUCCEEDED, self.Status.FAILED)

    @property
    def last_day(self):
        """The period's last day (inclusive)."""
        return (self.period_end - timezone.timedelta(days=1)).date()

    @property
    def period_label(self) -> str:
        """"2026-03-02 – 2026-03-08", or one date for a one-day period."""
        first, last = self.period_start.date(), self.last_day
        return f"{first:%Y-%m-%d}" if first == last else f"{first:%Y-%m-%d} – {last:%Y-%m-%d}"

    @property
    def duration(self) -> float | None:
        if self.started_at and self.finished_at:
            return (self.finished_at - self.started_at).total_seconds()
        return None


class ReportSchedule(models.Model):
    class Frequency(models.TextChoices):
        DAILY = "daily"
        WEEKLY = "weekly"
        MONTHLY = "monthly"

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="report_schedules")
    frequency = models.CharField(max_length=8, choices=Frequency.choices, default=Frequency.WEEKLY)
    # UTC hour of the day the report runs: daily every day, weekly on Mondays,
    # monthly on the 1st -- each over the day, week or month just ended
    hour = models.PositiveSmallIntegerField(default=6)
    # a subset of the tenant's contact emails (checked again when sending)
    recipients = LineListField()
    enabled = models.BooleanField(default=True)
    next_run_at = models.DateTimeField(null=True, blank=True)
    last_run_at = models.DateTimeField(null=True, blank=True)
    last_run = models.ForeignKey(ReportRun, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True,
                                   related_name="+")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["tenant_id", "id"]
        indexes = [models.Index(fields=["enabled", "next_run_at"], name="spark_schedule_due")]

    def __str__(self):
        return f"{self.frequency} report of {self.tenant}"
