"""The report pages: tenant reports under /tenants/<slug>/reports/ (members
read, tenant administrators run and schedule), the platform report under
/reports/ (platform administrators only).

Access as everywhere in the console (``tenants.access``, ``core.roles``): another tenant's
report or schedule is a 404, a viewer who tries to run, retry or schedule
gets 403. Views call ``spark_reports.services`` and, to queue a run,
``spark_reports.tasks``; Spark runs in the workers.
"""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_POST, require_safe

from core import audit
from core.roles import is_platform_admin, platform_admin_required
from core.shortcuts import paginate, posted
from tenants.access import get_tenant_for_user

from . import delivery, export, schedules, services, tasks
from .forms import RunReportForm, ScheduleForm
from .models import ReportRun, ReportSchedule
from .views_common import report_context

RUNS_PER_PAGE = 20


def _run_doc(run: ReportRun) -> dict:
    return {"id": run.pk, "kind": run.kind, "start": run.period_start.date().isoformat(),
            "last_day": run.last_day.isoformat()}


def _schedule_doc(s: ReportSchedule) -> dict:
    return {"id": s.pk, "frequency": s.frequency, "hour": s.hour, "recipients": list(s.recipients),
            "enabled": s.enabled}


def _links(run: ReportRun) -> dict:
    if run.tenant_id:
        args = [run.tenant.slug, run.pk]
        names = {k: f"report_{k}" for k in ("status", "csv", "print", "retry")}
        names["page"], lst = "report", reverse("reports", args=[run.tenant.slug])
    else:
        args = [run.pk]
        names = {k: f"platform_report_{k}" for k in ("status", "csv", "print", "retry")}
        names["page"], lst = "platform_report", reverse("platform_reports")
    links = {k: reverse(name, args=args) for k, name in names.items()}
    links["list"] = lst
    return links


def _run_list_context(request, runs) -> dict:
    page = paginate(request, runs, RUNS_PER_PAGE)
    for run in page.object_list:
        run.links = _links(run)
    return {"page": page, "runs": page.object_list}


# ---------------------------------------------------------------- tenant reports


@login_required
def tenant_reports(request, slug):
    """The tenant's runs and "Run report"."""
    tenant, rw = get_tenant_for_user(request, slug, write=request.method == "POST")
    form = RunReportForm(posted(request), tenant=True)
    if request.method == "POST" and form.is_valid():
        try:
            run = tasks.request_run(form.cleaned_data["kind"], form.cleaned_data["first"],
                                    form.cleaned_data["last"], tenant=tenant, user=request.user)
        except services.TooManyPending as exc:
            form.add_error(None, str(exc))
        else:
            audit.record(request, "report.run", "report", run.pk, tenant=tenant, after=_run_doc(run))
            return redirect("report", slug=tenant.slug, run_id=run.pk)
    context = {"tenant": tenant, "rw": rw, "form": form, "platform": False,
               "schedules": tenant.report_schedules.all(),
               **_run_list_context(request, ReportRun.objects.filter(tenant=tenant).select_related(
                   "tenant", "requested_by"))}
    return render(request, "spark_reports/reports.html", context)


def _tenant_run(request, slug, run_id, write=False):
    tenant, rw = get_tenant_for_user(request, slug, write=write)
    run = ReportRun.objects.filter(pk=run_id, tenant=tenant).select_related("tenant", "requested_by",
                                                                            "schedule").first()
    if run is None:
        raise Http404("No such report")
    return run, rw


def _mail(request) -> dict:
    """Where email goes, as this user may be told (the SMTP host: platform administrators)."""
    return delivery.mail_destination(show_host=is_platform_admin(request.user))


def _run_page(request, run, rw):
    context = {"run": run, "rw": rw, "tenant": run.tenant, "links": _links(run), "platform": not run.tenant_id,
               "mail": _mail(request) if run.schedule_id else None}
    if run.status == ReportRun.Status.SUCCEEDED:
        context.update(report_context(run))
    return render(request, "spark_reports/run.html", context)


def _status(request, run, rw):
    if run.done:
        # the whole page shows the result (or the failure): reload it
        response = HttpResponse(status=204)
        response["HX-Refresh"] = "true"
        return response
    # the header's badge too (out of band): it stayed "queued" while the card said "Running"
    return render(request, "spark_reports/partials/progress.html", {"run": run, "links": _links(run), "oob": True})


def _csv(request, run):
    if run.status != ReportRun.Status.SUCCEEDED:
        raise Http404("This report has no result")
    table = request.GET.get("table")
    if request.GET.get("format") == "zip":
        base = export.basename(run)
        response = HttpResponse(export.report_zip(run.result, base), content_type="application/zip")
        response["Content-Disposition"] = f'attachment; filename="{base}.zip"'
        return response
    if table:
        if table not in export.tables_of(run.result):
            raise Http404("No such table")
        body, name = export.table_csv(run.result, table), export.filename(run, table)
    else:
        body, name = export.report_csv(run.result), export.filename(run)
    response = HttpResponse(body, content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response


def _print(request, run):
    if run.status != ReportRun.Status.SUCCEEDED:
        raise Http404("This report has no result")
    return render(request, "spark_reports/print.html",
                  {"run": run, "tenant": run.tenant, "links": _links(run), **report_context(run)})


def _retry(request, run):
    if run.status != ReportRun.Status.FAILED:
        messages.info(request, "Only a failed report can be retried.")
    else:
        try:
            tasks.retry_run(run)
        except services.TooManyPending as exc:
            messages.error(request, f"Not retried: {exc}")
            return redirect(_links(run)["page"])
        audit.record(request, "report.retry", "report", run.pk, tenant=run.tenant, after=_run_doc(run))
        messages.success(request, "The report is queued again.")
    return redirect(_links(run)["page"])


@require_safe
@login_required
def tenant_report(request, slug, run_id):
    run, rw = _tenant_run(request, slug, run_id)
    return _run_page(request, run, rw)


@require_safe
@login_required
def tenant_report_status(request, slug, run_id):
    run, rw = _tenant_run(request, slug, run_id)
    return _status(request, run, rw)


@require_safe
@login_required
def tenant_report_csv(request, slug, run_id):
    run, _ = _tenant_run(request, slug, run_id)
    return _csv(request, run)


@require_safe
@login_required
def tenant_report_print(request, slug, run_id):
    run, _ = _tenant_run(request, slug, run_id)
    return _print(request, run)


@require_POST
@login_required
def tenant_report_retry(request, slug, run_id):
    run, _ = _tenant_run(request, slug, run_id, write=True)
    return _retry(request, run)


# ---------------------------------------------------------------- schedules


def _schedule_rows(tenant):
    rows = list(tenant.report_schedules.select_related("last_run"))
    for s in rows:
        s.next_period = schedules.period_for(s.frequency, s.next_run_at) if s.enabled and s.next_run_at else None
        s.live_recipients = services.recipients(s)
        s.send_now_period = schedules.period_for(s.frequency, timezone.now())
    return rows


@login_required
def schedule_list(request, slug):
    tenant, rw = get_tenant_for_user(request, slug, write=request.method == "POST")
    form = ScheduleForm(posted(request), tenant=tenant) if rw else None
    if request.method == "POST" and form.is_valid():
        schedule = services.create_schedule(form.save(commit=False), tenant, request.user)
        audit.record(request, "report_schedule.create", "report_schedule", schedule.pk, tenant=tenant,
                     after=_schedule_doc(schedule))
        messages.success(request, f"{schedule.get_frequency_display()} report scheduled.")
        return redirect("report_schedules", slug=tenant.slug)
    return render(request, "spark_reports/schedules.html",
                  {"tenant": tenant, "rw": rw, "form": form, "schedules": _schedule_rows(tenant),
                   "mail": _mail(request)})


def _tenant_schedule(request, slug, schedule_id, write=False):
    tenant, rw = get_tenant_for_user(request, slug, write=write)
    schedule = ReportSchedule.objects.filter(pk=schedule_id, tenant=tenant).first()
    if schedule is None:
        raise Http404("No such schedule")
    schedule.tenant = tenant
    return schedule, rw


@login_required
def schedule_edit(request, slug, schedule_id):
    schedule, rw = _tenant_schedule(request, slug, schedule_id, write=True)
    before = _schedule_doc(schedule)
    form = ScheduleForm(posted(request), instance=schedule, tenant=schedule.tenant)
    if request.method == "POST" and form.is_valid():
        schedule = form.save()
        services.schedule_saved(schedule)
        audit.record(request, "report_schedule.update", "report_schedule", schedule.pk, tenant=schedule.tenant,
                     before=before, after=_schedule_doc(schedule))
        messages.success(request, "Schedule saved.")
        return redirect("report_schedules", slug=slug)
    return render(request, "spark_reports/schedule_form.html",
                  {"tenant": schedule.tenant, "rw": rw, "form": form, "schedule": schedule})


@require_POST
@login_required
def schedule_send(request, slug, schedule_id):
    """"Send now": the schedule's report at once, a normal run emailed when done."""
    schedule, _ = _tenant_schedule(request, slug, schedule_id, write=True)
    to = services.recipients(schedule)
    if not to:
        messages.error(request, "Not sent: none of the schedule's recipients is still a contact of the tenant.")
        return redirect("report_schedules", slug=slug)
    try:
        run = tasks.send_now(schedule, request.user)
    except services.TooManyPending as exc:
        messages.error(request, f"Not sent: {exc}")
        return redirect("report_schedules", slug=slug)
    audit.record(request, "report_schedule.send", "report_schedule", schedule.pk, tenant=schedule.tenant,
                 after={**_schedule_doc(schedule), "run": run.pk, "start": run.period_start.date().isoformat(),
                        "last_day": run.last_day.isoformat()})
    # the run's page says where the email goes
    messages.success(request, f"Report queued: it will be emailed to {', '.join(to)} when done.")
    return redirect("report", slug=slug, run_id=run.pk)


@require_POST
@login_required
def schedule_toggle(request, slug, schedule_id):
    schedule, _ = _tenant_schedule(request, slug, schedule_id, write=True)
    before = _schedule_doc(schedule)
    services.toggle_schedule(schedule)
    audit.record(request, "report_schedule.update", "report_schedule", schedule.pk, tenant=schedule.tenant,
                 before=before, after=_schedule_doc(schedule))
    messages.success(request, f"Schedule {'enabled' if schedule.enabled else 'disabled'}.")
    return redirect("report_schedules", slug=slug)


@login_required
def schedule_delete(request, slug, schedule_id):
    schedule, rw = _tenant_schedule(request, slug, schedule_id, write=True)
    if request.method == "POST":
        before = _schedule_doc(schedule)
        services.delete_schedule(schedule)
        audit.record(request, "report_schedule.delete", "report_schedule", schedule_id, tenant=schedule.tenant,
                     before=before)
        messages.success(request, "Schedule deleted.")
        return redirect("report_schedules", slug=slug)
    return render(request, "spark_reports/schedule_delete.html",
                  {"tenant": schedule.tenant, "rw": rw, "schedule": schedule})


# ---------------------------------------------------------------- platform report


def _platform_run(run_id):
    run = ReportRun.objects.filter(pk=run_id, kind=ReportRun.Kind.PLATFORM).select_related("requested_by").first()
    if run is None:
        raise Http404("No such report")
    return run


@platform_admin_required
def platform_reports(request):
    form = RunReportForm(posted(request))
    if request.method == "POST" and form.is_valid():
        run = tasks.request_run(ReportRun.Kind.PLATFORM, form.cleaned_data["first"], form.cleaned_data["last"],
                                   user=request.user)
        audit.record(request, "report.run", "report", run.pk, after=_run_doc(run))
        return redirect("platform_report", run_id=run.pk)
    recent_tenant_runs = ReportRun.objects.filter(kind=ReportRun.Kind.TENANT).select_related(
        "tenant", "requested_by")[:10]
    for run in recent_tenant_runs:
        run.links = _links(run)
    context = {"form": form, "rw": True, "platform": True, "recent_tenant_runs": recent_tenant_runs,
               **_run_list_context(request, ReportRun.objects.filter(kind=ReportRun.Kind.PLATFORM).select_related(
                   "requested_by"))}
    return render(request, "spark_reports/reports.html", context)


@require_safe
@platform_admin_required
def platform_report(request, run_id):
    return _run_page(request, _platform_run(run_id), True)


@require_safe
@platform_admin_required
def platform_report_status(request, run_id):
    return _status(request, _platform_run(run_id), True)


@require_safe
@platform_admin_required
def platform_report_csv(request, run_id):
    return _csv(request, _platform_run(run_id))


@require_safe
@platform_admin_required
def platform_report_print(request, run_id):
    return _print(request, _platform_run(run_id))


@require_POST
@platform_admin_required
def platform_report_retry(request, run_id):
    return _retry(request, _platform_run(run_id))
