"""A tenant's live usage and its quotas: totals over the clients brokerd's
admin API lists for the tenant, and how much of each limit they use (plain
Python: the view asks brokerd, this adds up)."""

from . import limits

SUMMED = ("subscriptions", "queued", "messages_in", "messages_out", "bytes_in", "bytes_out")


def client_totals(clients: list[dict], retained: int | None) -> dict:
    """Totals over brokerd's client documents (``retained``: the tenant's
    retained messages, None when unknown)."""
    connected = [c for c in clients if c.get("connected")]
    return {"connected": len(connected), "offline": len(clients) - len(connected),
            **{k: sum(c.get(k) or 0 for c in clients) for k in SUMMED}, "retained": retained}


def quota_rows(effective: dict, totals: dict | None, devices: int | None = None) -> list[dict]:
    """One row per quota field: its limit in force, and for the limits live
    numbers measure (connections, retained messages) the use and its percent;
    ``devices``: how many the tenant has (the console's own count)."""
    used = {"max_connections": totals and totals["connected"], "max_retained": totals and totals["retained"]}
    if devices is not None:
        used["max_devices"] = devices
    rows = []
    for field in limits.QUOTA_FIELDS:
        limit, value = effective[field], used.get(field)
        percent = None
        if limit and value is not None:
            percent = min(100, round(100 * value / limit))
        rows.append({"field": field, "limit": limit, "used": value, "percent": percent, "has_usage": field in used})
    return rows
