"""The console's rows of the audit log: one ``AuditEvent`` per change, written
by the view after the service succeeded.

Changes the console makes through brokerd's admin API (kick, subscriptions,
publish, retained deletes) are recorded by brokerd itself (source "api", actor
"console:USER (via api-token:NAME)"), so the console writes no second row for
them. ``before``/``after`` are JSON documents of what users see: never
secrets or their hashes.
"""

import json

from django.utils import timezone

from tenants import limits

from .models import AuditEvent


def remote_addr(request) -> str | None:
    return (request.META.get("REMOTE_ADDR") or None) if request is not None else None


def _json(value):
    if value is None:
        return None
    return json.dumps(value, sort_keys=True, default=str)


def record(request, action: str, object_type: str, object_id, *, tenant=None, before=None, after=None,
           actor: str | None = None) -> AuditEvent:
    """Write one console audit row. ``tenant`` is a Tenant, a slug or None."""
    if actor is None:
        actor = request.user.get_username() if request.user.is_authenticated else "anonymous"
    slug = getattr(tenant, "slug", tenant)
    return AuditEvent.objects.create(
        at=timezone.now(), actor=actor, source=AuditEvent.Source.CONSOLE, action=action,
        object_type=object_type, object_id=str(object_id), tenant=slug, before=_json(before),
        after=_json(after), remote_addr=remote_addr(request),
    )


# ---------------------------------------------------------------- documents (no secrets, no hashes)


def tenant_doc(t) -> dict:
    return {"slug": t.slug, "name": t.name, "status": t.status, "contact_emails": list(t.contact_emails or []),
            "default_acl": t.default_acl}


def device_doc(d) -> dict:
    return {"name": d.name, "description": d.description, "enabled": d.enabled,
            "cert_fingerprint": d.cert_fingerprint, "cert_cn": d.cert_cn}


def credential_doc(c) -> dict:
    return {"id": c.pk, "device": c.device.name, "label": c.label, "enabled": c.enabled,
            "expires_at": c.expires_at.isoformat() if c.expires_at else None,
            "last_rotated_at": c.last_rotated_at.isoformat() if c.last_rotated_at else None}


def rule_doc(r) -> dict:
    return {"id": r.pk, "position": r.position, "who": r.who, "device": r.device.name if r.device_id else None,
            "pattern": r.device_pattern or None, "action": r.action, "topic": r.topic, "allow": r.allow}


def quota_doc(q) -> dict:
    return {f: getattr(q, f) for f in limits.QUOTA_FIELDS}


def system_topics_doc(s) -> dict:
    return {"enabled": s.enabled, "interval": s.interval, "parts": list(s.parts)}


def membership_doc(m) -> dict:
    return {"user": m.user.get_username(), "email": m.user.email, "role": m.role}


def token_doc(t) -> dict:
    return {"name": t.name, "scope": t.scope, "revoked": t.revoked}
