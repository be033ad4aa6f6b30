"""Live metrics pages: the cluster and node dashboards (platform
administrators), a tenant's dashboard in the portal, their history charts
(htmx fragments, or JSON with ``?format=json``) and the alarms.

The numbers on the pages move over the websockets (``metrics.consumers``,
``static/metrics/dashboard.js``); these views render the frame, the alarms
from the database and the history from ``metrics_sample``.
"""

from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from core import audit
from core.roles import platform_admin_required
from core.shortcuts import paginate, wants_fragment
from tenants import queries as tq
from tenants.access import get_live_scope_for_user

from . import alarms as alarm_db
from . import history_queries
from .core import NODE_DOWN
from .hub import poll_interval
from .models import Alarm


def _range(request) -> str:
    value = request.GET.get("range") or "1h"
    if value not in history_queries.RANGES:
        raise Http404("No such range")
    return value


def _history_context(url: str, data: dict, page: str | None = None, **params) -> dict:
    """The history fragment's context: the data and a tab per range (htmx
    swaps the fragment from ``url``; without JavaScript ``page`` reloads)."""
    links = []
    for r in history_queries.RANGES:
        hx = url + "?" + urlencode({**params, "range": r})
        links.append({"range": r, "hx": hx, "href": f"{page}?range={r}" if page else hx})
    return {"history": data, "range_links": links}


def _history_response(request, data: dict, url: str, **params):
    if request.GET.get("format") == "json":
        return JsonResponse(data)
    return render(request, "metrics/partials/history.html", _history_context(url, data, **params))


def _live(ws_path: str, scope: str, **extra) -> dict:
    return {"ws_path": ws_path, "scope": scope, "poll_interval": poll_interval(), **extra}


# ------------------------------------------------------------ platform


@platform_admin_required
def cluster(request):
    context = {**_live("/ws/metrics/", "cluster"),
               **_history_context(reverse("metrics_history"), history_queries.series(_range(request)), request.path)}
    return render(request, "metrics/cluster.html", context)


@platform_admin_required
def cluster_history(request):
    node = request.GET.get("node") or None
    params = {"node": node} if node else {}
    return _history_response(request, history_queries.series(_range(request), node=node), reverse("metrics_history"),
                             **params)


@platform_admin_required
def node(request, node):
    context = {"node": node, **_live("/ws/metrics/", "node", node=node),
               **_history_context(reverse("metrics_history"), history_queries.series(_range(request), node=node),
                                  request.path, node=node)}
    return render(request, "metrics/node.html", context)


@platform_admin_required
def alarm_list(request):
    state = request.GET.get("state") or "all"
    kind = request.GET.get("kind")
    context = {"page": paginate(request, alarm_db.listed(state, kind)), "state": state, "kind": kind,
               "kinds": Alarm.Kind.choices, "open_count": alarm_db.open_alarms().count()}
    tpl = "metrics/partials/alarm_table.html" if wants_fragment(request) else "metrics/alarms.html"
    return render(request, tpl, context)


@platform_admin_required
@require_POST
def alarm_dismiss(request, alarm_id):
    """Clear a node-down alarm by hand: the node left the cluster for good."""
    alarm = get_object_or_404(Alarm, pk=alarm_id, kind=NODE_DOWN)
    if alarm_db.dismiss(alarm, request.user.get_username()):
        audit.record(request, "alarm.dismiss", "alarm", str(alarm.pk), before={"subject": alarm.subject})
        messages.success(request, f"The alarm about node {alarm.subject} was cleared; the console stops "
                                  "watching that node until it is back.")
    target = request.POST.get("next") or ""
    if not url_has_allowed_host_and_scheme(target, {request.get_host()}, request.is_secure()):
        target = reverse("alarms")
    return redirect(target)


# ------------------------------------------------------------ tenant portal


@login_required
def tenant(request, slug):
    tenant_obj, rw = get_live_scope_for_user(request, slug)
    quota = tq.effective_quota(tenant_obj) if tenant_obj is not None else {}
    url = reverse("tenant_metrics_history", args=[slug])
    context = {"tenant_obj": tenant_obj, "slug": slug, "quota": quota,
               **_live(f"/ws/metrics/tenants/{slug}/", "tenant", slug=slug),
               **_history_context(url, _tenant_series(request, slug, tenant_obj), request.path)}
    return render(request, "metrics/tenant.html", context)


def _tenant_series(request, slug, tenant_obj) -> dict:
    """The tenant's history since it was created (a reused slug's rows are the previous tenant's)."""
    since = tenant_obj.created_at if tenant_obj is not None else None
    reused_at = tenant_obj.usage_since if tenant_obj is not None else None
    return history_queries.series(_range(request), tenant=slug, since=since, reused_at=reused_at)


@login_required
def tenant_history(request, slug):
    tenant_obj, _ = get_live_scope_for_user(request, slug)
    url = reverse("tenant_metrics_history", args=[slug])
    return _history_response(request, _tenant_series(request, slug, tenant_obj), url)
