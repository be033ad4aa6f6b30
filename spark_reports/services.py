"""What the views and the tasks do with reports: request a run, execute it
(in a Celery worker), record a failure, retry, and start the schedules due.

Views never call Spark; they call ``request_run`` and read ``ReportRun``.
"""

import logging
from datetime import UTC, date, datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from . import reports, schedules
from .jobs import Period
from .models import ReportRun, ReportSchedule

log = logging.getLogger(__name__)


def _midnight(day: date) -> datetime:
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


def _enqueue_run(run: ReportRun) -> None:
    from .tasks import run_report

    transaction.on_commit(lambda: run_report.delay(run.pk))


def request_run(kind: str, first: date, last: date, tenant=None, user=None, schedule=None) -> ReportRun:
    """A queued ReportRun over the days ``first``..``last`` (included), handed
    to a worker once the transaction commits."""
    if kind == ReportRun.Kind.TENANT and tenant is None:
        raise ValueError("a tenant report needs a tenant")
    with transaction.atomic():
        run = ReportRun.objects.create(
            kind=kind, tenant=tenant if kind == ReportRun.Kind.TENANT else None,
            period_start=_midnight(first), period_end=_midnight(last) + timedelta(days=1),
            requested_by=user if user is not None and user.is_authenticated else None, schedule=schedule,
            progress="Waiting for a worker", progress_total=len(reports.get(kind).steps))
        _enqueue_run(run)
    return run


def retry_run(run: ReportRun) -> ReportRun:
    """Queue a failed run again (the retry button)."""
    with transaction.atomic():
        ReportRun.objects.filter(pk=run.pk).update(
            status=ReportRun.Status.QUEUED, error="", progress="Waiting for a worker", progress_step=0,
            started_at=None, finished_at=None)
        run.refresh_from_db()
        _enqueue_run(run)
    return run


def _update(run_id: int, **fields) -> None:
    ReportRun.objects.filter(pk=run_id).update(**fields)


def execute_run(run: ReportRun, attempt: int) -> ReportRun:
    """Run the report now (in this process); raise what the job raised."""
    from .spark import get_spark, usage_dir

    report = reports.get(run.kind)
    _update(run.pk, status=ReportRun.Status.RUNNING, started_at=timezone.now(), finished_at=None,
            attempts=run.attempts + 1, progress=f"Starting (attempt {attempt})", progress_step=0,
            progress_total=len(report.steps))

    def progress(step: int, total: int, text: str) -> None:
        _update(run.pk, progress=text, progress_step=step, progress_total=total)

    spark = get_spark()
    result = report.run(spark, usage_dir(), Period.between(run.period_start, run.period_end),
                        tenant=run.tenant.slug if run.tenant_id else None, top_n=settings.REPORTS_TOP_N,
                        progress=progress)
    _update(run.pk, status=ReportRun.Status.SUCCEEDED, result=result, error="", finished_at=timezone.now(),
            progress="Done", progress_step=len(report.steps))
    run.refresh_from_db()
    return run


def describe_error(exc: BaseException) -> str:
    """One line a person can act on (a Java stack trace is not one)."""
    text = str(exc).strip() or type(exc).__name__
    first = text.splitlines()[0]
    return first if len(first) <= 500 else first[:497] + "..."


def record_failure(run_id: int, exc: BaseException, final: bool, retry_in: float | None = None) -> None:
    reason = describe_error(exc)
    if final:
        _update(run_id, status=ReportRun.Status.FAILED, error=reason, finished_at=timezone.now(),
                progress="Failed")
    else:
        _update(run_id, status=ReportRun.Status.QUEUED, error=reason,
                progress=f"Attempt failed; retrying in {retry_in:.0f} s" if retry_in else "Attempt failed; retrying")


# ---------------------------------------------------------------- schedules


def schedule_saved(schedule: ReportSchedule, now: datetime | None = None) -> ReportSchedule:
    """After a create or edit: the next run from now (none while disabled)."""
    now = now or timezone.now()
    schedule.next_run_at = schedules.next_run(schedule.frequency, schedule.hour, now) if schedule.enabled else None
    schedule.save(update_fields=["next_run_at"])
    return schedule


def dispatch_due(now: datetime | None = None) -> list[ReportRun]:
    """Start a run for every enabled schedule whose next run has come. Each is
    claimed with a conditional update, so two beats (or a task delivered
    twice) start it once. Missed runs while nothing dispatched collapse into
    the latest one."""
    now = now or timezone.now()
    started = []
    for schedule in ReportSchedule.objects.filter(enabled=True, next_run_at__lte=now).select_related("tenant"):
        due = schedules.latest_due(schedule.frequency, schedule.hour, now)
        if due < schedule.next_run_at:
            due = schedule.next_run_at   # set by hand (or by a test) off the regular times
        following = schedules.next_run(schedule.frequency, schedule.hour, now)
        with transaction.atomic():
            claimed = ReportSchedule.objects.filter(pk=schedule.pk, next_run_at=schedule.next_run_at).update(
                next_run_at=following, last_run_at=now)
            if not claimed:
                continue
            first, last = schedules.period_for(schedule.frequency, due)
            run = request_run(ReportRun.Kind.TENANT, first, last, tenant=schedule.tenant, schedule=schedule)
            ReportSchedule.objects.filter(pk=schedule.pk).update(last_run=run)
        log.info("schedule %s of %s: report %s over %s..%s", schedule.pk, schedule.tenant, run.pk, first, last)
        started.append(run)
    return started


def recipients(schedule: ReportSchedule) -> list[str]:
    """The schedule's recipients that are still contacts of the tenant."""
    contacts = {e.lower() for e in schedule.tenant.contact_emails}
    return [e for e in schedule.recipients if e.lower() in contacts]
