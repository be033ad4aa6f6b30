"""The audit log's page, shared by the platform's log (``console.views.audit_log``)
and a tenant's (``tenants.views.tenant_audit``): they authorise and choose
the rows; this filters, pages and renders them."""

import json

from .shortcuts import paginate, render_page

AUDIT_TABLE = "core/partials/audit_table.html"


def audit_page(request, qs, form, template, extra):
    """``qs`` filtered by the bound ``form``, a page of it with each event's
    before/after pretty-printed, rendered in ``template`` (htmx: the table)."""
    if form.is_valid():
        qs = form.filter(qs)
    page = paginate(request, qs)
    for event in page.object_list:
        event.before_pretty = _pretty(event.before)
        event.after_pretty = _pretty(event.after)
    context = {"form": form, "page": page, "events": page.object_list, **extra}
    return render_page(request, template, AUDIT_TABLE, context)


def _pretty(text):
    if not text:
        return None
    try:
        return json.dumps(json.loads(text), indent=2, sort_keys=True)
    except ValueError:
        return text
