"""Alarms in the database: what the hub's rules decided, written idempotently,
and the reads the pages make.

Synchronous Django code; the hub calls it through ``database_sync_to_async``.
"""

import datetime as dt

from django.db import IntegrityError, transaction
from django.utils import timezone

from tenants import limits
from tenants.models import OwnQuota, Quota, Tenant

from .core import NODE_DOWN, Condition
from .models import Alarm

QUOTA_FIELDS = ("max_connections", "max_retained", "tenant_msgs_in", "tenant_msgs_out", "tenant_bytes_in",
                "tenant_bytes_out")


def effective_quotas() -> dict[str, dict]:
    """``{slug: {field: limit or None}}`` for every tenant: what brokerd enforces
    (the ceiling and the tenant's own limit, whichever is smaller), as
    ``tenants.queries.effective_quota`` computes it, in two queries."""
    own = {o.tenant_id: o for o in OwnQuota.objects.all()}
    out = {}
    for q in Quota.objects.select_related("tenant"):
        mine = own.get(q.tenant_id)
        out[q.tenant.slug] = {f: limits.effective_limit(getattr(q, f), getattr(mine, f, None) if mine else None)
                              for f in QUOTA_FIELDS}
    return out


def open_alarms():
    return Alarm.objects.filter(cleared_at__isnull=True)


def listed(state: str = "all", kind: str | None = None):
    """The alarms page: all, "open" or "cleared" ones, of one ``kind`` (any
    other value: every kind), newest first."""
    qs = Alarm.objects.all()
    if state == "open":
        qs = qs.filter(cleared_at__isnull=True)
    elif state == "cleared":
        qs = qs.filter(cleared_at__isnull=False)
    if kind in Alarm.Kind.values:
        qs = qs.filter(kind=kind)
    return qs.order_by("-raised_at", "-id")


def open_keys() -> set[tuple[str, str]]:
    return set(open_alarms().values_list("kind", "subject"))


def dismissed_nodes(since: dt.datetime) -> dict[str, dt.datetime]:
    """Nodes whose down alarm an administrator cleared by hand since ``since``
    (latest clearing per node): the hub stops watching them."""
    out = {}
    for subject, cleared in (Alarm.objects.filter(kind=NODE_DOWN, cleared_at__gte=since)
                             .exclude(dismissed_by="").values_list("subject", "cleared_at")):
        if subject not in out or cleared > out[subject]:
            out[subject] = cleared
    return out


def apply(raise_: list[Condition], clear: list[tuple[str, str]], now: dt.datetime | None = None) -> dict:
    """Raise and clear; another console process may have done the same
    already (the open-alarm constraint keeps one), so both are idempotent.
    -> ``{"raised": n, "cleared": n}`` (what this call changed)."""
    now = now or timezone.now()
    raised = cleared = 0
    if raise_:
        tenants = dict(Tenant.objects.filter(slug__in={c.tenant for c in raise_ if c.tenant})
                       .values_list("slug", "id"))
        for c in raise_:
            try:
                with transaction.atomic():
                    Alarm.objects.create(kind=c.kind, subject=c.subject, tenant_id=tenants.get(c.tenant),
                                         tenant_slug=c.tenant or "", message=c.message, raised_at=now)
                raised += 1
            except IntegrityError:
                pass
    for kind, subject in clear:
        cleared += Alarm.objects.filter(kind=kind, subject=subject, cleared_at__isnull=True).update(cleared_at=now)
    return {"raised": raised, "cleared": cleared}


def dismiss(alarm: Alarm, by: str) -> bool:
    """An administrator clears a node-down alarm by hand (the node left for good)."""
    return bool(Alarm.objects.filter(pk=alarm.pk, cleared_at__isnull=True)
                .update(cleared_at=timezone.now(), dismissed_by=by[:150]))


def as_dict(alarm: Alarm) -> dict:
    return {"id": alarm.id, "kind": alarm.kind, "kind_label": alarm.get_kind_display(), "subject": alarm.subject,
            "tenant": alarm.tenant_slug or None, "message": alarm.message,
            "raised_at": alarm.raised_at.timestamp(),
            "cleared_at": alarm.cleared_at.timestamp() if alarm.cleared_at else None}


def for_tenant(slug: str):
    return Alarm.objects.filter(tenant_slug=slug)
