"""Celery: the queue of report work, and what a worker and beat do with it.

What puts a run on the queue, once the transaction that records it commits
(views and beat call these; the records are ``spark_reports.services``'):

- ``request_run(...)``: a new run (the "Run report" button);
- ``retry_run(run)``: a failed run again (the retry button);
- ``dispatch_due(now)``: a run for every schedule due (one per missed period), each claimed once;
- ``send_now(schedule, user)``: a schedule's run at once (its "Send now").

The tasks, thin wrappers over ``services`` and ``delivery``:

- ``run_report(run_id)``: the Spark job; retried with exponential backoff
  (REPORTS_RETRY_BACKOFF seconds, doubled, at most REPORTS_MAX_RETRIES times),
  each failure's reason recorded on the run, the last one marking it failed.
  A scheduled run then queues ``deliver_report``.
- ``deliver_report(run_id)``: the email, retried on its own (an SMTP outage
  does not re-run Spark).
- ``dispatch_due_schedules()``: run by beat every REPORTS_DISPATCH_INTERVAL
  seconds from the database schedule (django-celery-beat); starts the
  ReportSchedules that are due, and queues again the runs whose worker is
  gone (``requeue_stalled``: no heartbeat for REPORTS_STALLED_AFTER seconds), and the queued
  runs that no worker took that long after they were queued (their message was lost with a worker).
- ``compact_usage()``: run by beat every LAKE_COMPACT_INTERVAL seconds (0: not
  scheduled); one compaction run of the landed usage log into the lake
  (``spark_reports.lake``) on the worker's SparkSession; a run already going
  (the lake's lease) makes it a no-op.

This module imports ``services`` and ``delivery``, never the other way round.
"""

import logging

from celery import shared_task
from celery.signals import beat_init
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from . import delivery, lake, services
from .models import ReportRun
from .spark import get_spark, lake_dir, usage_dir

log = logging.getLogger(__name__)

DISPATCH_TASK_NAME = "spark_reports: start due report schedules"
COMPACT_TASK_NAME = "spark_reports: compact the usage log into the lake"


def _enqueue(run: ReportRun) -> None:
    transaction.on_commit(lambda: run_report.delay(run.pk))


def request_run(kind: str, first, last, tenant=None, user=None, schedule=None) -> ReportRun:
    """A queued ReportRun over the days ``first``..``last`` (included), handed
    to a worker once the transaction commits (``services.TooManyPending`` past the
    tenant's REPORTS_MAX_PENDING, as for ``retry_run`` and ``send_now``)."""
    with transaction.atomic():
        services.check_pending(tenant if kind != ReportRun.Kind.PLATFORM else None)
        run = services.create_run(kind, first, last, tenant=tenant, user=user, schedule=schedule)
        _enqueue(run)
    return run


def retry_run(run: ReportRun) -> ReportRun:
    """Queue a failed run again (the retry button)."""
    with transaction.atomic():
        services.check_pending(run.tenant)
        services.requeue_run(run)
        _enqueue(run)
    return run


def send_now(schedule, user) -> ReportRun:
    """A schedule's report now, over the period its run now would cover,
    emailed to its recipients when done (``run_report`` queues the email)."""
    with transaction.atomic():
        services.check_pending(schedule.tenant)
        run = services.send_now_run(schedule, user)
        _enqueue(run)
    return run


def dispatch_due(now=None) -> list[ReportRun]:
    """Start the runs of every enabled schedule whose next run has come (one per period missed while
    nothing dispatched, ``services.missed_occurrences``), each schedule claimed once
    (``services.claim_schedule``) and its runs queued when the claim commits."""
    now = now or timezone.now()
    started = []
    for schedule in services.due_schedules(now):
        with transaction.atomic():
            runs = services.claim_schedule(schedule, now)
            for run in runs:
                _enqueue(run)
        for run in runs:
            log.info("schedule %s of %s: report %s over %s..%s", schedule.pk, schedule.tenant, run.pk,
                     run.period_start.date(), run.last_day)
        started += runs
    return started


@shared_task(bind=True, autoretry_for=(Exception,), max_retries=settings.REPORTS_MAX_RETRIES,
             retry_backoff=settings.REPORTS_RETRY_BACKOFF, retry_backoff_max=3600, retry_jitter=False)
def run_report(self, run_id: int) -> str:
    run = ReportRun.objects.select_related("tenant", "schedule").filter(pk=run_id).first()
    if run is None or run.status != ReportRun.Status.QUEUED:
        return "gone" if run is None else f"not queued ({run.status})"     # a second message of it
    retries = self.request.retries
    try:
        run = services.execute_run(run, attempt=retries + 1)
        if run is None:
            return "taken by another worker"
    except Exception as exc:
        final = retries >= self.max_retries
        delay = None if final else min(3600, self.retry_backoff * 2 ** retries)
        services.record_failure(run_id, exc, final=final, retry_in=delay)
        log.warning("report %s attempt %s failed%s: %s", run_id, retries + 1, "" if final else ", retrying",
                    services.describe_error(exc))
        raise
    if run.schedule_id:
        deliver_report.delay(run.pk)
    return "succeeded"


@shared_task(bind=True, autoretry_for=(Exception,), dont_autoretry_for=(ValueError,), max_retries=5,
             retry_backoff=60, retry_jitter=False)
def deliver_report(self, run_id: int) -> str:
    run = ReportRun.objects.select_related("tenant", "schedule__tenant").filter(pk=run_id).first()
    if run is None or run.emailed_at is not None:
        return "nothing to do"
    try:
        delivery.send_report(run)
    except Exception as exc:
        ReportRun.objects.filter(pk=run_id).update(email_error=str(exc)[:500])
        raise
    return "sent"


def requeue_stalled(now=None) -> list[ReportRun]:
    """Queue again the runs whose worker is gone (``services.requeue_stalled``) and the queued runs
    whose message is (``services.requeue_lost``), once each."""
    runs = []
    for run in services.requeue_stalled(now):
        log.warning("report %s: %s", run.pk, run.error)
        transaction.on_commit(lambda pk=run.pk: run_report.delay(pk))
        runs.append(run)
    for run in services.requeue_lost(now):
        log.warning("report %s: queued and not taken by a worker; queued again", run.pk)
        transaction.on_commit(lambda pk=run.pk: run_report.delay(pk))
        runs.append(run)
    return runs


@shared_task
def dispatch_due_schedules() -> int:
    requeue_stalled()
    return len(dispatch_due())


def run_compaction() -> dict:
    """One compaction run now, in this process (the task and ``manage.py compact_usage``)."""
    r = lake.compact(get_spark(), usage_dir(), lake_dir(), settle=settings.LAKE_SETTLE,
                     keep_landed=settings.LAKE_KEEP_LANDED, row_group_bytes=settings.LAKE_ROW_GROUP_BYTES)
    return r.__dict__


@shared_task
def compact_usage() -> str:
    try:
        r = run_compaction()
    except lake.CompactionBusy as exc:
        log.info("compaction skipped: %s", exc)
        return "busy"
    return f"{r['files']} files, {r['rows']} rows"


def _periodic(name: str, task: str, every: int) -> None:
    """Beat sends ``task`` every ``every`` s; a copy not started within that
    time expires (the worker drops it), so a run that takes longer than the
    interval never piles copies up in the queue."""
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    if every <= 0:
        PeriodicTask.objects.filter(name=name).update(enabled=False)
        return
    interval, _ = IntervalSchedule.objects.get_or_create(every=every, period=IntervalSchedule.SECONDS)
    PeriodicTask.objects.update_or_create(
        name=name, defaults={"task": task, "interval": interval, "enabled": True, "crontab": None, "solar": None,
                             "clocked": None, "one_off": False,
                             "expires": None, "expire_seconds": every})


def ensure_periodic_task() -> None:
    """The database-scheduled tasks beat runs (kept in step with the settings):
    the schedules' dispatch and the lake's compaction."""
    _periodic(DISPATCH_TASK_NAME, "spark_reports.tasks.dispatch_due_schedules", settings.REPORTS_DISPATCH_INTERVAL)
    _periodic(COMPACT_TASK_NAME, "spark_reports.tasks.compact_usage", settings.LAKE_COMPACT_INTERVAL)


@beat_init.connect
def _beat_init(sender=None, **kwargs):
    ensure_periodic_task()
