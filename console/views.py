"""The platform pages: sign-in, home/overview, tenants, the audit log and API
tokens. Each view authorises (``core.roles``, ``tenants.access``), validates
a form, calls a service and renders -- the page, or for htmx its fragment."""

from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.db import connection
from django.db.models import Count
from django.http import JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.templatetags.static import static
from django.urls import reverse
from django.views.decorators.http import require_POST, require_safe

from core import audit
from core.forms import AuditFilterForm
from core.models import AuditEvent
from core.roles import is_platform_admin, platform_admin_required
from core.shortcuts import Live, apply_service_error, paginate, posted, redirect_back, render_page
from core.views import audit_page
from tenants import queries as tq
from tenants import services as ts
from tenants.access import get_tenant_for_user, user_tenants
from tenants.audit_docs import tenant_doc
from tenants.errors import ServiceError

from . import services as cs
from .forms import DeleteTenantForm, LoginForm, TenantForm, TenantSearchForm, TokenForm
from .models import ApiToken


@require_safe
def favicon(request):
    """``/favicon.ico``: the console's icon (browsers ask for it where a page names none)."""
    return redirect(static("console/favicon.svg"), permanent=True)


def healthz(request):
    """Liveness/readiness for load balancers and the container HEALTHCHECK."""
    with connection.cursor() as cur:
        cur.execute("SELECT 1")
    return JsonResponse({"status": "ok"})


# ---------------------------------------------------------------- sign-in


class LoginView(auth_views.LoginView):
    template_name = "console/login.html"
    authentication_form = LoginForm
    redirect_authenticated_user = True


class LogoutView(auth_views.LogoutView):
    pass


class PasswordChangeView(auth_views.PasswordChangeView):
    template_name = "console/password_change.html"

    def get_success_url(self):
        return reverse("home")

    def form_valid(self, form):
        response = super().form_valid(form)
        audit.record(self.request, "user.password_change", "user", self.request.user.get_username())
        messages.success(self.request, "Your password was changed.")
        return response


# ---------------------------------------------------------------- home


@login_required
def home(request):
    """Platform administrators: the overview. Tenant users: their tenant, or a
    picker when they belong to several."""
    if is_platform_admin(request.user):
        return overview(request)
    tenants = list(user_tenants(request.user))
    if len(tenants) == 1:
        return redirect("tenant", slug=tenants[0].slug)
    return render(request, "console/picker.html", {"tenants": tenants})


NODE_SUMS = ("connected", "sessions", "subscriptions", "retained", "messages_received", "messages_sent",
             "bytes_received", "bytes_sent")


def host_rows(nodes: list[dict]) -> list[dict]:
    """The node list as the overview shows it: a host that runs ``brokerd --workers N``
    is one row (its workers' figures summed; retained messages, copied to every
    worker, counted once) with its workers under it; a node without workers is its
    own host. -> [{"host", "node" (a one-process node, else None), "workers" (sorted
    by slot), "health" (ok when every worker is), and the figures}]."""
    hosts: dict[str, dict] = {}
    for n in nodes:
        worker = n.get("worker")
        name = n.get("host") or n.get("id")
        if worker is None:          # one process: a host of its own (a node listed twice stays twice)
            hosts[f"{name}\0{len(hosts)}"] = {"host": n.get("id"), "node": n, "workers": [], **n}
            continue
        row = hosts.setdefault(name, {"host": name, "node": None, "workers": []})
        row["workers"].append(n)
    rows = []
    for row in hosts.values():
        if row["workers"]:
            ws = sorted(row["workers"], key=lambda w: (w.get("worker"), str(w.get("id"))))
            row["workers"] = ws
            row.update({k: sum(w.get(k) or 0 for w in ws) for k in NODE_SUMS})
            row["retained"] = max(w.get("retained") or 0 for w in ws)
            healthy = [w.get("health") for w in ws]
            row["health"] = "ok" if all(h == "ok" for h in healthy) else \
                "unreachable" if all(h == "unreachable" for h in healthy) else "degraded"
            row["healthy_workers"] = healthy.count("ok")
            row["uptime"] = max((w.get("uptime") or 0 for w in ws), default=0)
            row["listeners"] = next((w.get("listeners") for w in ws if w.get("listeners")), [])
        rows.append(row)
    return sorted(rows, key=lambda r: str(r["host"]))


@platform_admin_required
def overview(request):
    live = Live(request)
    nodes = live.call("nodes")
    totals = rows = None
    if nodes is not None:
        rows = host_rows(nodes)
        totals = {k: sum(r.get(k) or 0 for r in rows) for k in NODE_SUMS}
        totals["nodes"] = len(rows)               # hosts: the workers of one count once
        totals["healthy"] = sum(1 for r in rows if r.get("health") == "ok")
        totals["workers"] = sum(len(r["workers"]) for r in rows)
    context = {"nodes": nodes, "hosts": rows, "totals": totals, "db": tq.platform_numbers(),
               "brokerd_error": live.error.message if live.error else None, **live.context()}
    return render_page(request, "console/overview.html", "console/partials/cluster.html", context)


# ---------------------------------------------------------------- tenants


@login_required
def tenant_list(request):
    form = TenantSearchForm(request.GET or None)
    qs = user_tenants(request.user).annotate(
        device_count=Count("devices", distinct=True), member_count=Count("memberships", distinct=True))
    if form.is_valid():
        qs = tq.search_tenants(qs, form.cleaned_data.get("q"), form.cleaned_data.get("status"))
    page = paginate(request, qs)
    context = {"form": form, "page": page, "tenants": page.object_list,
               "filtered": bool(request.GET.get("q") or request.GET.get("status"))}
    return render_page(request, "console/tenant_list.html", "console/partials/tenant_table.html", context)


@platform_admin_required
def tenant_create(request):
    form = TenantForm(posted(request))
    if request.method == "POST" and form.is_valid():
        d = form.cleaned_data
        try:
            tenant = ts.create_tenant(d["slug"], name=d["name"], contact_emails=d["contact_emails"],
                                      default_acl=d["default_acl"])
        except ServiceError as exc:
            apply_service_error(form, exc)
        else:
            audit.record(request, "tenant.create", "tenant", tenant.slug, tenant=tenant, after=tenant_doc(tenant))
            messages.success(request, f"Tenant {tenant.slug} created.")
            return redirect("tenant", slug=tenant.slug)
    return render(request, "console/tenant_form.html", {"form": form, "creating": True})


@platform_admin_required
def tenant_edit(request, slug):
    tenant, _ = get_tenant_for_user(request, slug, write=True)
    initial = {"name": tenant.name, "contact_emails": "\n".join(tenant.contact_emails or []),
               "default_acl": tenant.default_acl}
    form = TenantForm(posted(request), initial=initial, editing=True)
    if request.method == "POST" and form.is_valid():
        before = tenant_doc(tenant)
        d = form.cleaned_data
        try:
            ts.update_tenant(tenant, name=d["name"], contact_emails=d["contact_emails"],
                             default_acl=d["default_acl"])
        except ServiceError as exc:
            apply_service_error(form, exc)
        else:
            audit.record(request, "tenant.update", "tenant", tenant.slug, tenant=tenant, before=before,
                         after=tenant_doc(tenant))
            messages.success(request, f"Tenant {tenant.slug} saved.")
            return redirect("tenant", slug=tenant.slug)
    return render(request, "console/tenant_form.html", {"form": form, "tenant": tenant, "creating": False})


def _set_status(request, slug, suspend: bool):
    tenant, _ = get_tenant_for_user(request, slug, write=True)
    before = tenant_doc(tenant)
    if suspend:
        ts.suspend_tenant(tenant)
        messages.warning(request, f"Tenant {tenant.slug} suspended: its devices are refused.")
    else:
        ts.resume_tenant(tenant)
        messages.success(request, f"Tenant {tenant.slug} resumed.")
    audit.record(request, "tenant.suspend" if suspend else "tenant.resume", "tenant", tenant.slug, tenant=tenant,
                 before=before, after=tenant_doc(tenant))
    return redirect_back(request, reverse("tenant", args=[tenant.slug]))


@platform_admin_required
@require_POST
def tenant_suspend(request, slug):
    return _set_status(request, slug, True)


@platform_admin_required
@require_POST
def tenant_resume(request, slug):
    return _set_status(request, slug, False)


@platform_admin_required
def tenant_delete(request, slug):
    tenant, _ = get_tenant_for_user(request, slug, write=True)
    if tenant.is_anonymous:
        # brokerd would go on admitting anonymous clients into a tenant the console no longer shows
        messages.error(request, f"{tenant.slug} is the tenant of anonymous clients (ANONYMOUS_TENANT): it stays. "
                                "Suspend it to refuse anonymous clients.")
        return redirect("tenant", slug=tenant.slug)
    counts = tq.tenant_contents(tenant)
    form = DeleteTenantForm(posted(request), slug=tenant.slug)
    if request.method == "POST" and form.is_valid():
        before = {**tenant_doc(tenant), "removed": counts}
        ts.delete_tenant(tenant)
        audit.record(request, "tenant.delete", "tenant", slug, tenant=slug, before=before)
        messages.success(request, f"Tenant {slug} and everything it owned were deleted.")
        return redirect("tenant_list")
    return render(request, "console/tenant_delete.html", {"tenant": tenant, "counts": counts, "form": form})


# ---------------------------------------------------------------- audit log


@platform_admin_required
@require_safe  # the log is read-only here: no POST, PUT, PATCH or DELETE
def audit_log(request):
    form = AuditFilterForm(request.GET or None)
    return audit_page(request, AuditEvent.objects.all(), form, "console/audit.html", {"scoped": False})


# ---------------------------------------------------------------- API tokens


def _token_doc(t) -> dict:
    """What the audit log shows of a token: never its secret or hash."""
    return {"name": t.name, "scope": t.scope, "revoked": t.revoked}


@platform_admin_required
def token_list(request):
    tokens = ApiToken.objects.select_related("created_by").order_by("revoked", "name")
    return render(request, "console/tokens.html", {"tokens": tokens})


@platform_admin_required
def token_create(request):
    form = TokenForm(posted(request))
    if request.method == "POST" and form.is_valid():
        try:
            token, secret = cs.issue_token(form.cleaned_data["name"], form.cleaned_data["scope"],
                                           created_by=request.user)
        except ServiceError as exc:
            apply_service_error(form, exc)
        else:
            audit.record(request, "token.create", "api_token", token.name, after=_token_doc(token))
            response = render(request, "console/token_secret.html", {"token": token, "secret": secret})
            response["Cache-Control"] = "no-store"
            return response
    return render(request, "console/token_form.html", {"form": form})


@platform_admin_required
def token_revoke(request, token_id):
    token = get_object_or_404(ApiToken, pk=token_id)
    if request.method == "POST":
        before = _token_doc(token)
        try:
            cs.revoke_token(token)
        except ServiceError as exc:
            messages.error(request, str(exc))
        else:
            audit.record(request, "token.revoke", "api_token", token.name, before=before,
                         after=_token_doc(token))
            messages.success(request, f"Token {token.name} revoked: brokerd refuses it within a few seconds.")
        return redirect("token_list")
    return render(request, "console/token_revoke.html", {"token": token})

