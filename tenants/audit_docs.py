"""What the audit log shows of the tenants app's objects (``core.audit.record``'s
``before``/``after``): what users see, never secrets or their hashes."""

from . import limits


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


def membership_doc(m, role: str | None = None) -> dict:
    """``role``: the one it had before a change (default: its role now)."""
    return {"user": m.user.get_username(), "email": m.user.email, "role": role or m.role}
