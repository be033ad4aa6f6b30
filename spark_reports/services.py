"""What the console does with reports in its database, and running one:
record a requested run, queue a failed one again, claim the schedules due,
execute a run (Spark, in a Celery worker), record a failure; save, switch and
delete schedules.

Nothing here queues work: ``spark_reports.tasks`` puts runs on Celery's
queue (``request_run``, ``retry_run``, ``dispatch_due``) and its tasks call
back into this module. Views never call Spark; they call those and read
``ReportRun``.
"""

import threading
from datetime import UTC, date, datetime, timedelta

from django.conf import settings
from django.db import close_old_connections, connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from . import reports, schedules
from .jobs import Period
from .models import ReportRun, ReportSchedule
from .spark import get_spark, lake_dir, spark_running, usage_dir


def _midnight(day: date) -> datetime:
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


def create_run(kind: str, first: date, last: date, tenant=None, user=None, schedule=None) -> ReportRun:
    """A queued ReportRun over the days ``first``..``last`` (included), for
    a worker to pick up (``tasks.request_run`` hands it over)."""
    if kind != ReportRun.Kind.PLATFORM and tenant is None:
        raise ValueError(f"a {kind} report needs a tenant")
    return ReportRun.objects.create(
        kind=kind, tenant=tenant if kind != ReportRun.Kind.PLATFORM else None,
        period_start=_midnight(first), period_end=_midnight(last) + timedelta(days=1),
        requested_by=user if user is not None and user.is_authenticated else None, schedule=schedule,
        progress="Waiting for a worker", progress_total=len(reports.get(kind).steps), queued_at=timezone.now())


class TooManyPending(Exception):
    """The tenant has ``REPORTS_MAX_PENDING`` reports waiting or running: one more on demand is refused
    (the workers are shared by every tenant: one tenant's button pressed a thousand times would put a
    thousand Spark jobs before everybody else's reports)."""


def check_pending(tenant) -> None:
    """Raise TooManyPending if ``tenant`` (None: the platform's, not limited) may not queue another
    run now. Called inside the transaction that creates it, the tenant's row locked where the
    database can (PostgreSQL), so two requests at once cannot both take the last place."""
    if tenant is None:
        return
    limit = settings.REPORTS_MAX_PENDING
    list(type(tenant).objects.select_for_update().filter(pk=tenant.pk).values_list("pk", flat=True))
    pending = ReportRun.objects.filter(tenant=tenant, status__in=(ReportRun.Status.QUEUED,
                                                                  ReportRun.Status.RUNNING)).count()
    if pending >= limit:
        raise TooManyPending(f"{pending} reports of this tenant are waiting or running (at most {limit} at once). "
                             "Ask again when one of them is done.")


def requeue_run(run: ReportRun) -> ReportRun:
    """A failed run back to queued (the retry button; ``tasks.retry_run`` hands it over)."""
    ReportRun.objects.filter(pk=run.pk).update(
        status=ReportRun.Status.QUEUED, error="", progress="Waiting for a worker", progress_step=0,
        started_at=None, finished_at=None, queued_at=timezone.now())
    run.refresh_from_db()
    return run


def _update(run_id: int, **fields) -> None:
    ReportRun.objects.filter(pk=run_id).update(**fields)


class _Heartbeat:
    """Marks a running run alive (``heartbeat_at``) every REPORTS_HEARTBEAT seconds from a thread of
    its own, whatever Spark is doing, until the run ends (``requeue_stalled``)."""

    def __init__(self, run_id: int):
        self.run_id = run_id
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._beat, name=f"report-{run_id}-heartbeat", daemon=True)

    def _beat(self) -> None:
        try:
            while not self.stop.wait(settings.REPORTS_HEARTBEAT):
                try:
                    ReportRun.objects.filter(pk=self.run_id, status=ReportRun.Status.RUNNING).update(
                        heartbeat_at=timezone.now())
                except Exception:       # a locked or unreachable database: the next beat
                    close_old_connections()
        finally:
            connection.close()          # this thread's own connection

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(5)


def execute_run(run: ReportRun, attempt: int) -> ReportRun | None:
    """Run the report now (in this process); raise what the job raised. None: the run is not queued
    (another worker took it, from a second message of it: ``requeue_lost``), nothing done."""
    report = reports.get(run.kind)
    now = timezone.now()
    taken = ReportRun.objects.filter(pk=run.pk, status=ReportRun.Status.QUEUED).update(
        status=ReportRun.Status.RUNNING, started_at=now, heartbeat_at=now, finished_at=None,
        attempts=F("attempts") + 1, progress=f"Starting (attempt {attempt})", progress_step=0,
        progress_total=len(report.steps))
    if not taken:
        return None
    with _Heartbeat(run.pk):
        return _execute(run, report)


def report_period(run: ReportRun) -> Period:
    """The run's period, starting no earlier than its tenant's ``usage_since`` (a slug reused after a
    tenant was deleted: the rows before are the deleted tenant's), rounded up to the minute (a traffic
    row is a minute's, stamped with its start: the minute of the re-creation may hold the deleted
    tenant's)."""
    period = Period.between(run.period_start, run.period_end)
    since = run.tenant.usage_since if run.tenant_id else None
    if since is None or since.timestamp() <= period.start:
        return period
    start = min(-(-since.timestamp() // 60) * 60, period.end)
    return Period(start, period.end)


def _execute(run: ReportRun, report) -> ReportRun:

    def progress(step: int, total: int, text: str) -> None:
        _update(run.pk, progress=text, progress_step=step, progress_total=total)

    if not spark_running():
        _update(run.pk, progress="Starting Spark: the worker's first report waits for it (up to half a minute)")
    spark = get_spark()
    result = report.run(spark, usage_dir(), report_period(run),
                        tenant=run.tenant.slug if run.tenant_id else None, top_n=settings.REPORTS_TOP_N,
                        progress=progress, lake=lake_dir())
    _update(run.pk, status=ReportRun.Status.SUCCEEDED, result=result, error="", finished_at=timezone.now(),
            progress="Done", progress_step=len(report.steps))
    run.refresh_from_db()
    return run


JOB_ABORTED = "Job aborted due to stage failure"   # Spark's wrapper of a task's failure: the cause says why


def _first_line(text) -> str:
    lines = str(text or "").strip().splitlines()
    return lines[0].strip() if lines else ""


def _java_reason(java) -> str:
    """What went wrong in the JVM: the first message of the cause chain that is not Spark's "job
    aborted" wrapper, and the root cause's where it is another (a checksum error, a refused
    connection)."""
    chain = []
    while java is not None and len(chain) < 10:
        chain.append((str(java.getClass().getSimpleName()), _first_line(java.getMessage())))
        java = java.getCause()
    said = [(name, msg) for name, msg in chain if msg]
    if not said:
        return chain[0][0] if chain else ""
    name, msg = next(((n, m) for n, m in said if not m.startswith(JOB_ABORTED)), said[0])
    root_name, root = said[-1]
    return msg if root in msg else f"{msg} ({root_name}: {root})"


STALLED = "The worker running it stopped (restarted or killed) at step {step} of {total}; queued again"


def requeue_stalled(now: datetime | None = None) -> list[ReportRun]:
    """Runs left "running" by a worker that is gone (no heartbeat for REPORTS_STALLED_AFTER seconds:
    killed, its host restarted -- Celery had its task taken, nobody runs it again) back to queued,
    each once (a conditional update), with the reason; ``tasks.dispatch_due_schedules`` queues them."""
    now = now or timezone.now()
    cut = now - timedelta(seconds=settings.REPORTS_STALLED_AFTER)
    out = []
    for run in ReportRun.objects.filter(status=ReportRun.Status.RUNNING, heartbeat_at__lt=cut):
        reason = STALLED.format(step=run.progress_step, total=run.progress_total)
        if ReportRun.objects.filter(pk=run.pk, status=ReportRun.Status.RUNNING,
                                    heartbeat_at=run.heartbeat_at).update(
                status=ReportRun.Status.QUEUED, error=reason, progress="Waiting for a worker", progress_step=0,
                queued_at=now):
            run.refresh_from_db()
            out.append(run)
    return out


def requeue_lost(now: datetime | None = None) -> list[ReportRun]:
    """Runs "queued" that no worker took REPORTS_STALLED_AFTER seconds after they were queued (or their
    retry was due): their Celery message went with a worker that had fetched it and was killed or
    restarted (a worker fetches messages ahead of running them; a retry waits in the worker that
    failed), or was never sent. Each is noted queued again now (a conditional update: once per beat
    however many dispatch) for ``tasks.requeue_stalled`` to send once more; a run that was only
    waiting behind others gets a second message, which finds it taken and does nothing."""
    now = now or timezone.now()
    cut = now - timedelta(seconds=settings.REPORTS_STALLED_AFTER)
    waiting = ReportRun.objects.filter(status=ReportRun.Status.QUEUED)
    waiting = waiting.filter(Q(queued_at__lt=cut) | Q(queued_at__isnull=True, created_at__lt=cut))
    out = []
    for run in waiting:
        if ReportRun.objects.filter(pk=run.pk, status=ReportRun.Status.QUEUED, queued_at=run.queued_at).update(
                queued_at=now):
            run.refresh_from_db()
            out.append(run)
    return out


def describe_error(exc: BaseException) -> str:
    """One line a person can act on (a Java stack trace is not one, nor py4j's "An error occurred
    while calling o7348.collectToPython.": a Java exception is described by its own messages)."""
    first = ""
    java = getattr(exc, "java_exception", None)
    if java is not None:
        try:
            first = _java_reason(java)
        except Exception:               # the JVM gone meanwhile: py4j's words are all there is
            first = ""
    if not first:
        first = _first_line(exc) or type(exc).__name__
    return first if len(first) <= 500 else first[:497] + "..."


def record_failure(run_id: int, exc: BaseException, final: bool, retry_in: float | None = None) -> None:
    reason = describe_error(exc)
    if final:
        _update(run_id, status=ReportRun.Status.FAILED, error=reason, finished_at=timezone.now(),
                progress="Failed")
    else:
        _update(run_id, status=ReportRun.Status.QUEUED, error=reason,
                queued_at=timezone.now() + timedelta(seconds=retry_in or 0),
                progress=f"Attempt failed; retrying in {retry_in:.0f} s" if retry_in else "Attempt failed; retrying")


# ---------------------------------------------------------------- schedules


def schedule_saved(schedule: ReportSchedule, now: datetime | None = None) -> ReportSchedule:
    """After a create, edit or enable: the next run from now whose period the schedule has not
    reported yet (none while disabled) -- a daily report sent at 06:00 and moved to 09:00 the same
    morning would otherwise report the same day again at 09:00 (weekly: the same week that Monday).
    "Send now" runs do not count: they leave the next run as it is."""
    now = now or timezone.now()
    following = None
    if schedule.enabled:
        following = schedules.next_run(schedule.frequency, schedule.hour, now)
        for _ in range(3):        # the periods of the next runs are all different: one step is enough
            first, last = schedules.period_for(schedule.frequency, following)
            if not schedule.runs.filter(requested_by__isnull=True, period_start=_midnight(first),
                                        period_end=_midnight(last) + timedelta(days=1)).exists():
                break
            following = schedules.next_run(schedule.frequency, schedule.hour, following)
    schedule.next_run_at = following
    schedule.save(update_fields=["next_run_at"])
    return schedule


def create_schedule(schedule: ReportSchedule, tenant, user) -> ReportSchedule:
    """Save a new ``schedule`` (from the form) of ``tenant`` made by ``user``, with its next run."""
    schedule.tenant = tenant
    schedule.created_by = user
    schedule.save()
    return schedule_saved(schedule)


def toggle_schedule(schedule: ReportSchedule) -> ReportSchedule:
    """Enable a disabled schedule (its next run from now) or disable it (none)."""
    schedule.enabled = not schedule.enabled
    schedule.save(update_fields=["enabled"])
    return schedule_saved(schedule)


def delete_schedule(schedule: ReportSchedule) -> None:
    """The schedule goes; the reports it made stay."""
    schedule.delete()


def due_schedules(now: datetime):
    """The enabled schedules whose next run has come."""
    return ReportSchedule.objects.filter(enabled=True, next_run_at__lte=now).select_related("tenant")


def missed_occurrences(schedule: ReportSchedule, now: datetime) -> list[datetime]:
    """The runs of a due ``schedule`` from its next run to ``now``, oldest first, one per period: several
    when beat or the workers were down over more than one of them, at most REPORTS_MAX_CATCH_UP (the
    latest ones; the older ones are not reported)."""
    bound = max(1, settings.REPORTS_MAX_CATCH_UP)
    out: list[datetime] = [schedule.next_run_at]      # may be off the regular times (set by hand)
    periods = {schedules.period_for(schedule.frequency, schedule.next_run_at)}
    at = schedules.next_run(schedule.frequency, schedule.hour, schedule.next_run_at)
    if now - at > timedelta(days=32 * bound):      # down for long: start near the bound, not years back
        at = schedules.next_run(schedule.frequency, schedule.hour, now - timedelta(days=32 * bound))
    while at <= now:
        period = schedules.period_for(schedule.frequency, at)
        if period not in periods:
            periods.add(period)
            out.append(at)
        at = schedules.next_run(schedule.frequency, schedule.hour, at)
    return out[-bound:]


@transaction.atomic
def claim_schedule(schedule: ReportSchedule, now: datetime) -> list[ReportRun]:
    """The runs of a due ``schedule`` (``missed_occurrences``: one per period whose run was missed while
    nothing dispatched, bounded), or [] when another dispatcher claimed it first. The claim is a
    conditional update of its next run, so two beats (or a task delivered twice) start them once.
    ``tasks.dispatch_due`` queues the runs once this transaction committed."""
    occurrences = missed_occurrences(schedule, now)
    following = schedules.next_run(schedule.frequency, schedule.hour, now)
    claimed = ReportSchedule.objects.filter(pk=schedule.pk, next_run_at=schedule.next_run_at).update(
        next_run_at=following, last_run_at=now)
    if not claimed:
        return []
    runs = []
    for due in occurrences:
        first, last = schedules.period_for(schedule.frequency, due)
        runs.append(create_run(ReportRun.Kind.TENANT, first, last, tenant=schedule.tenant, schedule=schedule))
    ReportSchedule.objects.filter(pk=schedule.pk).update(last_run=runs[-1])
    return runs


def send_now_run(schedule: ReportSchedule, user, now: datetime | None = None) -> ReportRun:
    """The run of "Send now": the period the schedule's run at ``now`` would
    report (yesterday, last week, last month), a normal scheduled run (emailed
    when done) requested by ``user``; the schedule's next run is unchanged.
    ``tasks.send_now`` queues it once its transaction commits."""
    now = now or timezone.now()
    first, last = schedules.period_for(schedule.frequency, now)
    run = create_run(ReportRun.Kind.TENANT, first, last, tenant=schedule.tenant, user=user, schedule=schedule)
    ReportSchedule.objects.filter(pk=schedule.pk).update(last_run=run, last_run_at=now)
    return run


def recipients(schedule: ReportSchedule) -> list[str]:
    """The schedule's recipients that are still contacts of the tenant."""
    contacts = {e.lower() for e in schedule.tenant.contact_emails}
    return [e for e in schedule.recipients if e.lower() in contacts]
