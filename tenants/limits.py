"""Quota fields and their arithmetic (plain Python, no Django).

Every limit is a positive integer or ``None`` for unlimited. A broker node has
its own limits (flags such as ``--max-connections``); the limit that applies
to a tenant's client is the smaller of the ones that are set.
"""

from collections.abc import Mapping

# The quota fields in the order of the snapshot and the console; all per
# second where a rate, "client_*" per client, "tenant_*" per tenant.
QUOTA_FIELDS = (
    "max_connections",  # concurrent connections of the tenant
    "connect_rate",  # CONNECTs per second, whole tenant
    "client_msgs_in",
    "client_bytes_in",
    "client_msgs_out",
    "client_bytes_out",
    "tenant_msgs_in",
    "tenant_bytes_in",
    "tenant_msgs_out",
    "tenant_bytes_out",
    "max_subscriptions",  # per client
    "max_queued",  # messages per session queue
    "max_retained",  # retained messages of the tenant
    "max_payload",  # bytes
    "max_session_expiry",  # seconds
    "max_delayed",  # $delayed/... messages of the tenant waiting to be published
    "max_devices",  # devices of the tenant (the console's; brokerd has nothing to enforce)
)

MAX_LIMIT = 2**63 - 1  # what a BigInteger column holds


def check_limit(name: str, value) -> int | None:
    """``value`` if it is a valid limit (positive int or None), else ValueError."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be a positive integer or none, not {value!r}")
    if not 1 <= value <= MAX_LIMIT:
        raise ValueError(f"{name} must be a positive integer or none, not {value}")
    return value


def effective_limit(*limits: int | None) -> int | None:
    """The smallest of the limits that are set; None when none is (unlimited)."""
    set_ = [v for v in limits if v is not None]
    return min(set_) if set_ else None


def within(limit: int | None, value: int) -> bool:
    """Is ``value`` allowed under ``limit``? (``value <= limit``; None is unlimited)."""
    return limit is None or value <= limit


def clamp(requested: int, limit: int | None) -> int:
    """``requested`` capped by ``limit`` (e.g. a client's session expiry)."""
    return requested if limit is None else min(requested, limit)


def effective_limits(node: Mapping[str, int | None], tenant: Mapping[str, int | None]) -> dict:
    """Field by field ``effective_limit`` of a node's and a tenant's quota."""
    return {f: effective_limit(node.get(f), tenant.get(f)) for f in QUOTA_FIELDS}
