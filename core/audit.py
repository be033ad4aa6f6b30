"""The console's rows of the audit log: one ``AuditEvent`` per change, written
by the view after the service succeeded.

Changes the console makes through brokerd's admin API (kick, subscriptions,
publish, retained deletes) are recorded by brokerd itself (source "console", actor
the user, as the console's own rows), so the console writes no second row for
them. ``before``/``after`` are JSON documents of what users see: never
secrets or their hashes (each app shapes its own, e.g. ``tenants.audit_docs``).
"""

import json

from django.utils import timezone

from .models import AuditEvent


def remote_addr(request) -> str | None:
    return (request.META.get("REMOTE_ADDR") or None) if request is not None else None


def _json(value):
    if value is None:
        return None
    return json.dumps(value, sort_keys=True, default=str)


def record(request, action: str, object_type: str, object_id, *, tenant=None, before=None, after=None,
           actor: str | None = None, source: str = AuditEvent.Source.CONSOLE) -> AuditEvent:
    """Write one console audit row. ``tenant`` is a Tenant, a slug or None;
    ``source`` "api" for the console's REST API (``console.api``)."""
    if actor is None:
        actor = request.user.get_username() if request.user.is_authenticated else "anonymous"
    slug = getattr(tenant, "slug", tenant)
    return AuditEvent.objects.create(
        at=timezone.now(), actor=actor, source=source, action=action,
        object_type=object_type, object_id=str(object_id), tenant=slug, before=_json(before),
        after=_json(after), remote_addr=remote_addr(request),
    )
