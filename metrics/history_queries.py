"""History charts from ``metrics_sample``: the console's reads of the rows
brokerd writes (the writer is ``brokerd/metrics/history.py``).

Three ranges: the last hour and the last 24 hours from the minute rows (the
24 hours in 5-minute points), the last 7 days from the hour rows. A point
sums the nodes' rows of its period: counters become average rates per
second over the period (count / seconds), ``connections`` is the highest
sum of the nodes' per-row peaks within the point (an upper bound of the
cluster's peak: nodes may peak at different moments).

A period without any node row is unknown (None: a gap in the chart, brokerd
was not running or has not written it yet); a period with node rows but no
row of the tenant is 0 for the tenant (brokerd writes tenant rows only for
tenants it served).
"""

import datetime as dt
import math

from django.db.models import Sum
from django.utils import timezone

from .models import Sample

# range -> (resolution of the rows, seconds per point, points)
RANGES = {
    "1h": (Sample.Resolution.MINUTE, 60, 60),
    "24h": (Sample.Resolution.MINUTE, 300, 288),
    "7d": (Sample.Resolution.HOUR, 3600, 168),
}
COUNTERS = ("connects", "messages_in", "messages_out", "bytes_in", "bytes_out", "dropped", "rejected")
SERIES = ("connections", "msgs_in", "msgs_out", "bytes_in", "bytes_out", "drops", "rejected", "connects")
_RATE_OF = {"msgs_in": "messages_in", "msgs_out": "messages_out", "bytes_in": "bytes_in",
            "bytes_out": "bytes_out", "drops": "dropped", "rejected": "rejected", "connects": "connects"}


def _floor(t: dt.datetime, step: int) -> int:
    ts = int(t.timestamp())
    return ts - ts % step


def series(range_key: str, *, tenant: str = "", node: str | None = None, now: dt.datetime | None = None,
           since: dt.datetime | None = None, reused_at: dt.datetime | None = None) -> dict:
    """``{"range", "step", "t": [unix...], "connections": [...], "msgs_in": [...], ..., "totals": {...}}``:
    the cluster (``tenant=""``), one tenant, or one node (``node``). ``since``: the tenant's creation --
    rows are kept by slug, and a deleted tenant's slug may be given to a new one: the periods before
    are unknown (gaps), never the previous tenant's figures. ``reused_at``: when the slug was given again
    (``Tenant.usage_since``): the rows of the minute or hour it fell in hold the deleted tenant's figures
    too, so the tenant's rows start with the next one."""
    resolution, step, points = RANGES[range_key]
    row_seconds = 3600 if resolution == Sample.Resolution.HOUR else 60
    cut = None if since is None else _floor(since, row_seconds)
    if reused_at is not None:
        cut = max(cut or 0, math.ceil(reused_at.timestamp() / row_seconds) * row_seconds)
    now = now or timezone.now()
    end = _floor(now, step)
    start = end - (points - 1) * step
    start_dt = dt.datetime.fromtimestamp(start, tz=dt.UTC)
    end_dt = dt.datetime.fromtimestamp(end + step, tz=dt.UTC)
    base = Sample.objects.filter(resolution=resolution, at__gte=start_dt, at__lt=end_dt)
    if node:
        base = base.filter(node=node)
    # periods with data at all (any node wrote its own row)
    known = {_floor(at, step) for at in base.filter(tenant="").values_list("at", flat=True).distinct()}
    mine = base.filter(tenant=tenant)
    if cut is not None:
        mine = mine.filter(at__gte=dt.datetime.fromtimestamp(cut, tz=dt.UTC))
    rows = (mine.values("at")
            .annotate(connections=Sum("connections"), **{c: Sum(c) for c in COUNTERS}).order_by("at"))
    sums: dict[int, dict] = {}
    for row in rows:
        key = _floor(row["at"], step)
        known.add(key)
        acc = sums.setdefault(key, dict.fromkeys(COUNTERS, 0) | {"connections": 0})
        for c in COUNTERS:
            acc[c] += row[c] or 0
        acc["connections"] = max(acc["connections"], row["connections"] or 0)
    out = {"range": range_key, "step": step, "resolution": resolution, "t": []} | {s: [] for s in SERIES}
    totals = dict.fromkeys(COUNTERS, 0) | {"connections_peak": 0}
    for i in range(points):
        t = start + i * step
        out["t"].append(t)
        if t not in known or (cut is not None and t + step <= cut):
            for s in SERIES:
                out[s].append(None)
            continue
        acc = sums.get(t) or (dict.fromkeys(COUNTERS, 0) | {"connections": 0})
        out["connections"].append(acc["connections"])
        for s, c in _RATE_OF.items():
            out[s].append(round(acc[c] / step, 3))
        for c in COUNTERS:
            totals[c] += acc[c]
        totals["connections_peak"] = max(totals["connections_peak"], acc["connections"])
    out["totals"] = totals
    out["known_points"] = sum(1 for v in out["connections"] if v is not None)
    return out
