"""The tenant pages, shared by platform administrators and the tenant portal:
overview and usage, devices, credentials, ACL rules (with the checker),
quotas, $SYS settings, members and the tenant's audit log.

Every view starts with ``tenants.access.get_*_for_user`` (404 for another
tenant's objects, 403 for a viewer who tries to write), validates a form,
calls ``tenants.services`` and writes one audit row when it succeeded.
"""

import io

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_POST, require_safe

from core import audit
from core.forms import AuditFilterForm
from core.models import AuditEvent
from core.roles import is_platform_admin
from core.shortcuts import (
    Live,
    apply_service_error,
    paginate,
    posted,
    redirect_back,
    render_page,
    wants_fragment,
)
from core.views import audit_page

from . import audit_docs, limits, memberships, onboarding, queries, services, usage
from . import device_import as importing
from .access import (
    get_credential_for_user,
    get_device_for_user,
    get_membership_for_user,
    get_rule_for_user,
    get_tenant_for_user,
    tenant_admin_or_platform,
)
from .errors import LastAdministrator, NotFound, ServiceError
from .forms import (
    AclCheckForm,
    AclRuleForm,
    CredentialForm,
    DeviceForm,
    DeviceImportForm,
    ExpireForm,
    MemberForm,
    MemberRoleForm,
    QuotaForm,
    SystemTopicsForm,
)
from .models import Membership

LIVE_PAGE = 1000


def _secret_response(request, context):
    """The page that shows a new secret: rendered once, never stored or cached.
    Its "Connect this device" panel's examples hold the secret; nowhere else do they."""
    live = Live(request)
    context = {**context, **_connect_context(live, context["tenant"], context["device"], context["secret"]),
               "rw": True, **live.context()}
    response = render(request, "tenants/credential_secret.html", context)
    response["Cache-Control"] = "no-store"
    return response


def _broker_urls(live) -> tuple[list[str], str]:
    """Where devices reach the broker -> ``(urls, source)``: ``MQTT_PUBLIC_URLS``
    when set ("setting"), else what the live nodes advertise ("cluster"), else
    nothing ("unreachable": no answer from brokerd's admin API)."""
    configured = onboarding.public_urls(settings.MQTT_PUBLIC_URLS)
    if configured:
        return configured, "setting"
    nodes = live.call("nodes")
    if nodes is None:
        return [], "unreachable"
    return onboarding.advertised_urls(nodes), "cluster"


def _connect_context(live, tenant, device, secret=None) -> dict:
    """The "Connect this device" panel (``onboarding.connect_panel``) and the ACL
    notice: what the tenant's rules decide for the panel's examples."""
    urls, source = _broker_urls(live)
    panel = onboarding.connect_panel(urls, f"{tenant.slug}/{device.name}", device.name, secret)
    topic, topic_filter = onboarding.example_topics(device.name)
    access = services.example_access(tenant, device.name, topic, topic_filter)
    problem = None if source != "unreachable" else (live.unavailable or (live.error and live.error.message))
    notice = {"kind": "device", "device": device.name, "topic": topic, "filter": topic_filter, "access": access,
              "denied": not all(a.allowed for a in access.values()), "own_rule": services.own_topics_rule(tenant)}
    return {"connect": {**panel, "source": source, "problem": problem}, "acl_notice": notice}


def _tenant_notice(tenant) -> dict:
    """The overview's ACL notice: shown while no device may do anything."""
    return {"kind": "tenant", "denied": queries.allows_nothing(tenant), "own_rule": None}


# ---------------------------------------------------------------- overview


def _usage(request, tenant) -> dict:
    """Live numbers of the tenant's clients and its quota usage."""
    live = Live(request)
    clients = live.call("clients", tenant=tenant.slug, per_page=LIVE_PAGE)
    retained = live.call("retained", tenant.slug, per_page=1)
    totals = None
    if clients is not None:
        totals = usage.client_totals(clients["items"], retained["total"] if retained is not None else None)
    return {"live": totals, "quota_rows": usage.quota_rows(queries.effective_quota(tenant), totals,
                                                           tenant.devices.count()),
            **live.context()}


@login_required
def tenant_overview(request, slug):
    tenant, rw = get_tenant_for_user(request, slug)
    context = {"tenant": tenant, "rw": rw, **_usage(request, tenant)}
    if wants_fragment(request):
        return render(request, "tenants/partials/usage.html", context)
    context["db"] = queries.tenant_numbers(tenant)
    context["system_topics"] = queries.system_topics(tenant)
    context["acl_notice"] = _tenant_notice(tenant)
    return render(request, "tenants/overview.html", context)


# ---------------------------------------------------------------- devices


def _connected_devices(request, tenant) -> tuple[set | None, Live]:
    live = Live(request)
    answer = live.call("clients", tenant=tenant.slug, connected="true", per_page=LIVE_PAGE)
    if answer is None:
        return None, live
    return {c["device"] for c in answer["items"] if c.get("device")}, live


@login_required
def device_list(request, slug):
    tenant, rw = get_tenant_for_user(request, slug)
    q = request.GET.get("q", "").strip()
    qs = queries.search_devices(queries.devices(tenant), q)
    page = paginate(request, qs)
    connected, live = _connected_devices(request, tenant)
    for device in page.object_list:
        device.online = None if connected is None else device.name in connected
    context = {"tenant": tenant, "rw": rw, "page": page, "devices": page.object_list, "q": q, **live.context()}
    return render_page(request, "tenants/devices.html", "tenants/partials/device_table.html", context)


@login_required
def device_create(request, slug):
    tenant, rw = get_tenant_for_user(request, slug, write=True)
    form = DeviceForm(posted(request), initial={"with_credential": True})
    if request.method == "POST" and form.is_valid():
        d = form.cleaned_data
        fields = {"description": d["description"], "cert_fingerprint": d["cert_fingerprint"] or None,
                  "cert_cn": d["cert_cn"] or None}
        try:
            if d["with_credential"]:
                device, credential, secret = services.provision_device(
                    tenant, d["name"], label=d["label"], expires_at=d["expires_at"], **fields)
            else:
                device, credential, secret = services.create_device(tenant, d["name"], **fields), None, None
        except ServiceError as exc:
            # "device acme/x already exists" belongs under the name the user typed
            apply_service_error(form, exc, {"device": "name"})
        else:
            audit.record(request, "device.create", "device", device.name, tenant=tenant,
                         after=audit_docs.device_doc(device))
            if credential is None:
                messages.success(request, f"Device {device.name} created.")
                return redirect("device", slug=tenant.slug, name=device.name)
            audit.record(request, "credential.create", "credential", credential.pk, tenant=tenant,
                         after=audit_docs.credential_doc(credential))
            return _secret_response(request, {"tenant": tenant, "device": device, "credential": credential,
                                              "secret": secret, "created_device": True})
    return render(request, "tenants/device_form.html", {"tenant": tenant, "rw": rw, "form": form, "creating": True})


@login_required
def device_import(request, slug):
    """Many devices from a CSV file, in one change (``tenants.device_import``): the answer is the file of
    their secrets, a download shown once and never stored; a refused file changes nothing and says why
    (``device_import`` is this view: the module is ``importing`` here)."""
    tenant, rw = get_tenant_for_user(request, slug, write=True)
    form = DeviceImportForm(posted(request), request.FILES if request.method == "POST" else None)
    if request.method == "POST" and form.is_valid():
        upload = form.cleaned_data["file"]
        try:
            text = io.TextIOWrapper(upload.file, encoding="utf-8", newline="")
            rows = importing.parse(text, importing.MAX_ROWS)
            # checked before the transaction: it holds the database's write lock (SQLite's, everyone's)
            checked = services.check_device_rows(tenant, rows, label=form.cleaned_data["label"])
            with transaction.atomic():
                made = services.create_checked_devices(tenant, checked)
                audit.record(request, "device.import", "device", f"{len(made)} devices", tenant=tenant,
                             after={"devices": len(made), "names": [d.name for d, _, _ in made[:100]],
                                    "label": form.cleaned_data["label"]})
        except ServiceError as exc:
            form.add_error("file", str(exc)[:1].upper() + str(exc)[1:])
        else:
            response = HttpResponse(importing.secrets_text(tenant.slug, made), content_type="text/csv")
            stamp = timezone.now().strftime("%Y%m%d-%H%M%S")
            response["Content-Disposition"] = f'attachment; filename="{tenant.slug}-devices-{stamp}.csv"'
            response["Cache-Control"] = "no-store"
            return response
    return render(request, "tenants/device_import.html", {"tenant": tenant, "rw": rw, "form": form})


@login_required
def device_detail(request, slug, name):
    device, rw = get_device_for_user(request, slug, name)
    tenant = device.tenant
    live = Live(request)
    sessions = live.call("clients", tenant=tenant.slug, username=f"{tenant.slug}/{device.name}",
                         per_page=LIVE_PAGE)
    context = {
        "tenant": tenant, "device": device, "rw": rw, "credentials": queries.credentials(device),
        "rules": [r for r in queries.acl_rules(tenant) if r.device_id == device.pk],
        "sessions": sessions["items"] if sessions is not None else None,
        "username": f"{tenant.slug}/{device.name}", **_connect_context(live, tenant, device), **live.context(),
    }
    return render(request, "tenants/device_detail.html", context)


@login_required
def device_edit(request, slug, name):
    device, rw = get_device_for_user(request, slug, name, write=True)
    tenant = device.tenant
    initial = {"description": device.description, "cert_fingerprint": device.cert_fingerprint or "",
               "cert_cn": device.cert_cn or ""}
    form = DeviceForm(posted(request), initial=initial, editing=True)
    if request.method == "POST" and form.is_valid():
        before = audit_docs.device_doc(device)
        d = form.cleaned_data
        try:
            services.update_device(device, description=d["description"],
                                   cert_fingerprint=d["cert_fingerprint"] or None, cert_cn=d["cert_cn"] or None)
        except ServiceError as exc:
            apply_service_error(form, exc)
        else:
            audit.record(request, "device.update", "device", device.name, tenant=tenant, before=before,
                         after=audit_docs.device_doc(device))
            messages.success(request, f"Device {device.name} saved.")
            return redirect("device", slug=tenant.slug, name=device.name)
    return render(request, "tenants/device_form.html",
                  {"tenant": tenant, "rw": rw, "form": form, "device": device, "creating": False})


def _device_enabled(request, slug, name, enabled: bool):
    device, _ = get_device_for_user(request, slug, name, write=True)
    before = audit_docs.device_doc(device)
    (services.enable_device if enabled else services.disable_device)(device)
    audit.record(request, "device.enable" if enabled else "device.disable", "device", device.name,
                 tenant=device.tenant, before=before, after=audit_docs.device_doc(device))
    messages.success(request, f"Device {device.name} {'enabled' if enabled else 'disabled'}.")
    return redirect_back(request, reverse("device", args=[slug, name]))


@login_required
@require_POST
def device_enable(request, slug, name):
    return _device_enabled(request, slug, name, True)


@login_required
@require_POST
def device_disable(request, slug, name):
    return _device_enabled(request, slug, name, False)


@login_required
def device_delete(request, slug, name):
    device, rw = get_device_for_user(request, slug, name, write=True)
    tenant = device.tenant
    counts = queries.device_contents(device)
    if request.method == "POST":
        before = {**audit_docs.device_doc(device), "removed": counts}
        services.delete_device(device)
        audit.record(request, "device.delete", "device", name, tenant=tenant, before=before)
        messages.success(request, f"Device {name} deleted.")
        return redirect("devices", slug=tenant.slug)
    return render(request, "tenants/device_delete.html",
                  {"tenant": tenant, "rw": rw, "device": device, "counts": counts})


# ---------------------------------------------------------------- credentials


@login_required
def credential_create(request, slug, name):
    device, rw = get_device_for_user(request, slug, name, write=True)
    tenant = device.tenant
    form = CredentialForm(posted(request))
    if request.method == "POST" and form.is_valid():
        try:
            credential, secret = services.create_credential(device, label=form.cleaned_data["label"],
                                                            expires_at=form.cleaned_data["expires_at"])
        except ServiceError as exc:
            apply_service_error(form, exc)
        else:
            audit.record(request, "credential.create", "credential", credential.pk, tenant=tenant,
                         after=audit_docs.credential_doc(credential))
            return _secret_response(request, {"tenant": tenant, "device": device, "credential": credential,
                                              "secret": secret})
    return render(request, "tenants/credential_form.html", {"tenant": tenant, "rw": rw, "device": device,
                                                            "form": form})


@login_required
def credential_rotate(request, slug, name, credential_id):
    credential, rw = get_credential_for_user(request, slug, name, credential_id, write=True)
    device = credential.device
    if request.method == "POST":
        before = audit_docs.credential_doc(credential)
        credential, secret = services.rotate_credential(credential)
        audit.record(request, "credential.rotate", "credential", credential.pk, tenant=device.tenant,
                     before=before, after=audit_docs.credential_doc(credential))
        return _secret_response(request, {"tenant": device.tenant, "device": device, "credential": credential,
                                          "secret": secret, "rotated": True})
    return render(request, "tenants/credential_confirm.html",
                  {"tenant": device.tenant, "rw": rw, "device": device, "credential": credential,
                   "what": "rotate"})


def _credential_change(request, slug, name, credential_id, action: str, change, text: str):
    credential, _ = get_credential_for_user(request, slug, name, credential_id, write=True)
    before = audit_docs.credential_doc(credential)
    change(credential)
    audit.record(request, f"credential.{action}", "credential", credential.pk, tenant=credential.device.tenant,
                 before=before, after=audit_docs.credential_doc(credential))
    messages.success(request, text.format(id=credential.pk))
    return redirect("device", slug=slug, name=name)


@login_required
@require_POST
def credential_enable(request, slug, name, credential_id):
    return _credential_change(request, slug, name, credential_id, "enable", services.enable_credential,
                              "Credential #{id} enabled.")


@login_required
@require_POST
def credential_disable(request, slug, name, credential_id):
    return _credential_change(request, slug, name, credential_id, "disable", services.disable_credential,
                              "Credential #{id} disabled: it no longer lets the device in.")


@login_required
def credential_expire(request, slug, name, credential_id):
    credential, rw = get_credential_for_user(request, slug, name, credential_id, write=True)
    device = credential.device
    form = ExpireForm(posted(request))
    if request.method == "POST" and form.is_valid():
        before = audit_docs.credential_doc(credential)
        try:
            services.expire_credential(credential, form.cleaned_data["at"])
        except ServiceError as exc:
            apply_service_error(form, exc)
        else:
            audit.record(request, "credential.expire", "credential", credential.pk, tenant=device.tenant,
                         before=before, after=audit_docs.credential_doc(credential))
            when = form.cleaned_data["at"]
            messages.success(request, f"Credential #{credential.pk} expired." if when is None else
                             f"Credential #{credential.pk} expires {when:%Y-%m-%d %H:%M} UTC.")
            return redirect("device", slug=slug, name=name)
    return render(request, "tenants/credential_expire.html",
                  {"tenant": device.tenant, "rw": rw, "device": device, "credential": credential, "form": form})


@login_required
def credential_delete(request, slug, name, credential_id):
    credential, rw = get_credential_for_user(request, slug, name, credential_id, write=True)
    device = credential.device
    if request.method == "POST":
        before = audit_docs.credential_doc(credential)
        pk = credential.pk
        services.delete_credential(credential)
        audit.record(request, "credential.delete", "credential", pk, tenant=device.tenant, before=before)
        messages.success(request, f"Credential #{pk} deleted.")
        return redirect("device", slug=slug, name=name)
    return render(request, "tenants/credential_confirm.html",
                  {"tenant": device.tenant, "rw": rw, "device": device, "credential": credential,
                   "what": "delete"})


# ---------------------------------------------------------------- ACL rules

ACL_ALIASES = {"device_pattern": "pattern"}


def _acl_context(tenant, rw, form=None, editing=None, check_form=None, check=None) -> dict:
    rules = list(queries.acl_rules(tenant))
    if form is None and rw:
        form = AclRuleForm(tenant=tenant)
    return {"tenant": tenant, "rw": rw, "rules": rules, "form": form, "editing": editing,
            "check_form": check_form or AclCheckForm(), "check": check,
            "device_names": list(tenant.devices.order_by("name").values_list("name", flat=True))}


def _acl_editor(request, context):
    return render_page(request, "tenants/acl.html", "tenants/partials/acl_editor.html", context)


@login_required
def acl_rules(request, slug):
    tenant, rw = get_tenant_for_user(request, slug)
    return _acl_editor(request, _acl_context(tenant, rw))


@login_required
def acl_add(request, slug):
    tenant, rw = get_tenant_for_user(request, slug, write=True)
    if request.method != "POST":
        return redirect("acl", slug=slug)
    form = AclRuleForm(request.POST, tenant=tenant)
    if form.is_valid():
        try:
            rule = services.add_acl_rule(tenant, position=form.cleaned_data.get("position"), **form.service_kwargs())
        except ServiceError as exc:
            apply_service_error(form, exc, ACL_ALIASES)
        else:
            audit.record(request, "acl.add", "acl_rule", rule.pk, tenant=tenant, after=audit_docs.rule_doc(rule))
            messages.success(request, f"{rule.name} added at position {rule.position}.")
            if not request.htmx:
                return redirect("acl", slug=slug)
            form = None
    return _acl_editor(request, _acl_context(tenant, rw, form=form))


@login_required
def acl_edit(request, slug, rule_id):
    rule, rw = get_rule_for_user(request, slug, rule_id, write=True)
    tenant = rule.tenant
    if request.method == "POST":
        form = AclRuleForm(request.POST, tenant=tenant, editing=True)
        if form.is_valid():
            before = audit_docs.rule_doc(rule)
            try:
                services.update_acl_rule(rule, **form.service_kwargs())
            except ServiceError as exc:
                apply_service_error(form, exc, ACL_ALIASES)
            else:
                audit.record(request, "acl.update", "acl_rule", rule.pk, tenant=tenant, before=before,
                             after=audit_docs.rule_doc(rule))
                messages.success(request, f"{rule.name} saved.")
                if not request.htmx:
                    return redirect("acl", slug=slug)
                return _acl_editor(request, _acl_context(tenant, rw))
    else:
        form = AclRuleForm(tenant=tenant, editing=True, initial={
            "who": rule.who, "device": rule.device.name if rule.device_id else "",
            "pattern": rule.device_pattern, "action": rule.action, "topic": rule.topic,
            "allow": "allow" if rule.allow else "deny"})
    return _acl_editor(request, _acl_context(tenant, rw, form=form, editing=rule))


@login_required
@require_POST
def acl_move(request, slug, rule_id):
    rule, rw = get_rule_for_user(request, slug, rule_id, write=True)
    tenant = rule.tenant
    try:
        position = int(request.POST.get("position", ""))
    except ValueError:
        position = None
    position = services.move_target(rule, request.POST.get("direction"), position)
    if position is not None:
        before = audit_docs.rule_doc(rule)
        services.move_acl_rule(rule, position)
        rule.refresh_from_db()
        audit.record(request, "acl.move", "acl_rule", rule.pk, tenant=tenant, before=before,
                     after=audit_docs.rule_doc(rule))
    if not request.htmx:
        return redirect("acl", slug=slug)
    return _acl_editor(request, _acl_context(tenant, rw))


@login_required
def acl_delete(request, slug, rule_id):
    rule, rw = get_rule_for_user(request, slug, rule_id, write=True)
    tenant = rule.tenant
    if request.method == "POST":
        before = audit_docs.rule_doc(rule)
        services.delete_acl_rule(rule)
        audit.record(request, "acl.delete", "acl_rule", before["id"], tenant=tenant, before=before)
        messages.success(request, f"ACL rule {before['id']} deleted.")
        if not request.htmx:
            return redirect("acl", slug=slug)
        return _acl_editor(request, _acl_context(tenant, rw))
    return render(request, "tenants/acl_delete.html", {"tenant": tenant, "rw": rw, "rule": rule})


@login_required
@require_POST
def acl_own_topics(request, slug):
    """The one-click rule ``allow both {device}/#`` (``services.allow_own_topics``):
    added last with its audit row, or, when the tenant has it already, nothing
    added and nothing logged. htmx swaps the notice it came from; a plain POST
    goes back to the page (``next``)."""
    tenant, rw = get_tenant_for_user(request, slug, write=True)
    rule, created = services.allow_own_topics(tenant)
    if created:
        audit.record(request, "acl.add", "acl_rule", rule.pk, tenant=tenant, after=audit_docs.rule_doc(rule))
    if wants_fragment(request):
        notice = {"kind": request.POST.get("kind", "tenant"), "done": rule, "created": created}
        return render(request, "tenants/partials/acl_notice.html",
                      {"tenant": tenant, "rw": rw, "acl_notice": notice, "next": request.POST.get("next", "")})
    if created:
        messages.success(request, f"{rule.name} added at position {rule.position}: every device may publish and subscribe "
                                  f"under its own name ({rule.topic}).")
    else:
        messages.info(request, f"{rule.name} (position {rule.position}) already lets every device publish and subscribe "
                               f"under its own name ({rule.topic}).")
    return redirect_back(request, reverse("acl", kwargs={"slug": slug}))


@login_required
def acl_check(request, slug):
    """"Would device X (client id Y) be allowed to publish/subscribe TOPIC?",
    answered with brokerd's own ACL engine on the tenant's rules (``services.check_acl``)."""
    tenant, rw = get_tenant_for_user(request, slug)
    form = AclCheckForm(request.GET or None)
    check = None
    if form.is_valid():
        d = form.cleaned_data
        client_id = d["client_id"] or d["device"]
        try:
            answer = services.check_acl(tenant, d["device"], client_id, d["action"], d["topic"])
        except ServiceError as exc:
            form.add_error("topic", str(exc)[:1].upper() + str(exc)[1:])
        else:
            check = {**answer._asdict(), "device": d["device"], "client_id": client_id, "action": d["action"],
                     "topic": d["topic"]}
    if wants_fragment(request):
        return render(request, "tenants/partials/acl_check.html",
                      {"tenant": tenant, "check_form": form, "check": check})
    return render(request, "tenants/acl.html", _acl_context(tenant, rw, check_form=form, check=check))


# ---------------------------------------------------------------- quotas


def _quota_rows(ceiling_form, own_form, tenant):
    ceiling = queries.quota(tenant)
    own = queries.own_quota(tenant)
    effective = queries.effective_quota(tenant)
    rows = []
    for field in limits.QUOTA_FIELDS:
        rows.append({"field": field, "help": ceiling._meta.get_field(field).help_text,
                     "ceiling": getattr(ceiling, field), "own": getattr(own, field),
                     "effective": effective[field],
                     "ceiling_field": ceiling_form[field] if ceiling_form is not None else None,
                     "own_field": own_form[field] if own_form is not None else None})
    return rows


class _Invalid(Exception):
    """Roll back what a combined save wrote: one of its forms has errors."""


@login_required
def quotas(request, slug):
    """Platform administrators set the ceilings; the tenant's administrators
    (and platform administrators) its own lower limits; everyone sees what
    is in force.

    The page is one form: a platform administrator's Save posts ``which=both``
    and saves ceilings and own limits together, or neither (errors inline,
    everything typed kept) -- two forms mixed in one table saved one and
    dropped what was typed in the other. ``which=ceiling`` / ``own`` save one."""
    tenant, rw = get_tenant_for_user(request, slug)
    admin = is_platform_admin(request.user)
    ceiling, own = queries.quota(tenant), queries.own_quota(tenant)
    which = request.POST.get("which") if request.method == "POST" else None
    if which in ("ceiling", "both") and not admin:
        raise PermissionDenied("Only platform administrators set the ceilings")
    if which is not None and not rw:
        raise PermissionDenied("Viewers cannot change the limits")
    posted = request.POST if which is not None else None
    ceiling_form = QuotaForm(posted if which in ("ceiling", "both") else None, prefix="ceiling",
                             initial=ceiling.as_dict()) if admin else None
    own_form = QuotaForm(posted if which in ("own", "both") else None, prefix="own", ceiling=ceiling,
                         initial=own.as_dict()) if rw else None
    saved = which in ("ceiling", "own", "both") and _save_quotas(request, tenant, which, ceiling_form, own_form)
    if saved:
        messages.success(request, {"ceiling": "Ceilings saved.", "own": "Your limits saved."}.get(which, "Limits saved."))
        if not request.htmx:
            return redirect("quotas", slug=slug)
        ceiling_form = QuotaForm(prefix="ceiling", initial=queries.quota(tenant).as_dict()) if admin else None
        own_form = QuotaForm(prefix="own", ceiling=queries.quota(tenant),
                             initial=queries.own_quota(tenant).as_dict()) if rw else None
    elif which == "both" and ceiling_form.is_bound and own_form is not None:
        own_form.is_valid()                  # its errors shown too, whatever the ceilings' were
    context = {"tenant": tenant, "rw": rw, "admin": admin, "ceiling_form": ceiling_form, "own_form": own_form,
               "rows": _quota_rows(ceiling_form, own_form, tenant)}
    return render_page(request, "tenants/quotas.html", "tenants/partials/quota_table.html", context)


def _save_quotas(request, tenant, which, ceiling_form, own_form) -> bool:
    """Validate and save the posted forms in one transaction; -> saved (else the forms carry the errors)."""
    try:
        with transaction.atomic():
            if which in ("ceiling", "both"):
                _save_quota(request, tenant, ceiling_form, "ceiling")
            if which in ("own", "both"):
                if which == "both":           # checked against the ceilings just saved
                    own_form.ceiling = queries.quota(tenant)
                _save_quota(request, tenant, own_form, "own")
    except _Invalid:
        return False
    return True


def _save_quota(request, tenant, form, kind: str) -> None:
    if not form.is_valid():
        raise _Invalid
    values = {f: form.cleaned_data.get(f) for f in limits.QUOTA_FIELDS}
    before = audit_docs.quota_doc(queries.quota(tenant) if kind == "ceiling" else queries.own_quota(tenant))
    try:
        row = services.update_quota(tenant, **values) if kind == "ceiling" else services.update_own_quota(tenant, **values)
    except ServiceError as exc:
        apply_service_error(form, exc)
        raise _Invalid from None
    audit.record(request, "quota.update" if kind == "ceiling" else "own_quota.update", "quota", tenant.slug,
                 tenant=tenant, before=before, after=audit_docs.quota_doc(row))


# ---------------------------------------------------------------- $SYS settings


@login_required
def system_topics(request, slug):
    tenant, rw = get_tenant_for_user(request, slug)
    admin = is_platform_admin(request.user)
    setting = queries.system_topics(tenant)
    if request.method == "POST" and not admin:
        raise PermissionDenied("Only platform administrators change the system topics")
    initial = {"enabled": setting.enabled, "interval": setting.interval, "parts": list(setting.parts)}
    form = SystemTopicsForm(posted(request), initial=initial) if admin else None
    if request.method == "POST" and form.is_valid():
        before = audit_docs.system_topics_doc(setting)
        d = form.cleaned_data
        try:
            setting = services.update_system_topics(tenant, enabled=d["enabled"], interval=d["interval"],
                                                    parts=d["parts"])
        except ServiceError as exc:
            apply_service_error(form, exc)
        else:
            audit.record(request, "system_topics.update", "system_topics", tenant.slug, tenant=tenant,
                         before=before, after=audit_docs.system_topics_doc(setting))
            messages.success(request, "System topic settings saved.")
            return redirect("system_topics", slug=slug)
    return render(request, "tenants/system_topics.html",
                  {"tenant": tenant, "rw": rw, "form": form, "setting": setting,
                   "all_parts": SystemTopicsForm.base_fields["parts"].choices})


# ---------------------------------------------------------------- members


def _members_context(tenant, rw, request, form=None):
    members = list(Membership.objects.filter(tenant=tenant).select_related("user").order_by("user__username"))
    return {"tenant": tenant, "rw": rw, "members": members, "form": form or (MemberForm() if rw else None),
            "role_choices": Membership.Role.choices, "allow_existing": is_platform_admin(request.user)}


@login_required
def members(request, slug):
    tenant, rw = get_tenant_for_user(request, slug)
    form = None
    if request.method == "POST":
        tenant, rw = get_tenant_for_user(request, slug, write=True)
        form = MemberForm(request.POST)
        if form.is_valid():
            d = form.cleaned_data
            try:
                membership = memberships.add_member(tenant, username=d["username"], email=d["email"],
                                           password=d["password"], role=d["role"],
                                           allow_existing=is_platform_admin(request.user))
            except ServiceError as exc:
                apply_service_error(form, exc)
            else:
                audit.record(request, "member.add", "membership", membership.user.get_username(), tenant=tenant,
                             after=audit_docs.membership_doc(membership))
                messages.success(request, f"{membership.user.get_username()} added as "
                                          f"{membership.get_role_display()}.")
                return redirect("members", slug=slug)
    return render(request, "tenants/members.html", _members_context(tenant, rw, request, form))


@login_required
@require_POST
def member_role(request, slug, membership_id):
    membership, _ = get_membership_for_user(request, slug, membership_id, write=True)
    username = membership.user.get_username()
    form = MemberRoleForm(request.POST)
    if not form.is_valid():
        messages.error(request, f"Choose a role for {username}.")
        return redirect("members", slug=slug)
    role = form.cleaned_data["role"]
    if role == membership.role:
        return redirect("members", slug=slug)
    try:
        with transaction.atomic():      # the change and its audit row, together
            previous = memberships.change_role(membership, role)
            audit.record(request, "member.role", "membership", username, tenant=membership.tenant,
                         before=audit_docs.membership_doc(membership, role=previous),
                         after=audit_docs.membership_doc(membership))
    except NotFound:
        raise Http404("No such member")
    except LastAdministrator as exc:
        messages.error(request, str(exc))
        return redirect("members", slug=slug)
    messages.success(request, f"{username} is now {membership.get_role_display()}.")
    if membership.user_id == request.user.pk and not is_platform_admin(request.user) \
            and membership.role != Membership.Role.ADMIN:
        return redirect("tenant", slug=slug)
    return redirect("members", slug=slug)


@login_required
def member_remove(request, slug, membership_id):
    membership, rw = get_membership_for_user(request, slug, membership_id, write=True)
    tenant = membership.tenant
    if request.method == "POST":
        try:
            with transaction.atomic():      # the change and its audit row, together
                memberships.remove_member(membership)
                before = audit_docs.membership_doc(membership)
                audit.record(request, "member.remove", "membership", before["user"], tenant=tenant, before=before)
        except NotFound:
            raise Http404("No such member")
        except LastAdministrator as exc:
            messages.error(request, str(exc))
            return redirect("members", slug=slug)
        messages.success(request, f"{before['user']} no longer has access to {tenant.slug}.")
        if membership.user_id == request.user.pk and not is_platform_admin(request.user):
            return redirect("home")
        return redirect("members", slug=slug)
    return render(request, "tenants/member_remove.html", {"tenant": tenant, "rw": rw, "membership": membership,
                                                          "last_admin": memberships.is_last_admin(membership)})


# ---------------------------------------------------------------- audit log of the tenant


@login_required
@require_safe  # the log is read-only here: no POST, PUT, PATCH or DELETE
def tenant_audit(request, slug):
    tenant, rw = get_tenant_for_user(request, slug)
    tenant_admin_or_platform(request, tenant)
    form = AuditFilterForm(request.GET or None)
    del form.fields["tenant"]
    # rows are kept by slug: a deleted tenant's slug given to a new tenant must not show the previous one's
    events = AuditEvent.objects.filter(tenant=tenant.slug, at__gte=tenant.created_at)
    return audit_page(request, events, form, "tenants/audit.html",
                      {"tenant": tenant, "rw": rw, "scoped": True})
