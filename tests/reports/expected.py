"""Expected report figures computed from the generated rows with plain
Python, independently of spark_reports.jobs (no Spark, other algorithms:
the peak by counting open intervals at every candidate instant)."""

import statistics
from collections import Counter, defaultdict

DAY = 86400
REJECTED = ("acl_denied", "quota_rejected", "auth_failures")
DROPPED = ("dropped_queue_full", "dropped_expired", "dropped_no_subscribers")


def msgs_in(row):
    return row["msgs_in_q0"] + row["msgs_in_q1"] + row["msgs_in_q2"]


def device(row):
    u = row["username"]
    return u.split("/", 1)[1] if u and "/" in u else (u or row["client_id"])


def traffic_in(traffic, start, end, tenant=None):
    return [r for r in traffic if start <= r["ts"] < end and (tenant is None or r["tenant"] == tenant)]


def touching(conns, start, end, tenant=None):
    return [c for c in conns if c["connected_at"] < end and c["disconnected_at"] >= start
            and (tenant is None or c["tenant"] == tenant)]


def peak(conns, start, end):
    """Most intervals [c, d) clipped to [start, end) open at one instant."""
    spans = [(max(c["connected_at"], start), min(c["disconnected_at"], end)) for c in conns]
    spans = [(a, b) for a, b in spans if a < b]
    best, at = 0, None
    for t in sorted({a for a, _ in spans}):
        n = sum(1 for a, b in spans if a <= t < b)
        if n > best:
            best, at = n, t
    return best, at


def totals(conns, traffic, start, end, tenant=None):
    t = traffic_in(traffic, start, end, tenant)
    c = touching(conns, start, end, tenant)
    closed = [x for x in c if start <= x["disconnected_at"] < end]
    p, at = peak(c, start, end)
    return {
        "msgs_in": sum(msgs_in(r) for r in t),
        "msgs_out": sum(r["msgs_out"] for r in t),
        "bytes_in": sum(r["bytes_in"] for r in t),
        "bytes_out": sum(r["bytes_out"] for r in t),
        "messages": sum(msgs_in(r) + r["msgs_out"] for r in t),
        "rejected": sum(r[k] for r in t for k in REJECTED),
        "dropped": sum(r[k] for r in t for k in DROPPED),
        "acl_denied": sum(r["acl_denied"] for r in t),
        "auth_failures": sum(r["auth_failures"] for r in t),
        "connects": sum(1 for x in c if start <= x["connected_at"] < end),
        "disconnects": len(closed),
        "devices": len({(x["tenant"], device(x)) for x in c}),     # a device is TENANT/DEVICE
        "median_session": statistics.median([x["disconnected_at"] - x["connected_at"] for x in closed])
        if closed else None,
        "session_lengths": [x["disconnected_at"] - x["connected_at"] for x in closed],
        "peak_connections": p,
        "peak_at": at,
    }


def is_median(value, lengths, accuracy) -> bool:
    """``value`` is one of ``lengths`` whose rank is within len / accuracy (+ 1 for the two
    middles of an even count) of the middle: what an approximate median may return."""
    ordered = sorted(lengths)
    n = len(ordered)
    slack = n / accuracy + 1
    return any(v == value and abs(i - (n - 1) / 2) <= slack for i, v in enumerate(ordered))


def daily(conns, traffic, start, end, tenant=None):
    days = {d: Counter() for d in range(int(start // DAY), int((end - 1) // DAY) + 1)}
    for r in traffic_in(traffic, start, end, tenant):
        d = days[r["ts"] // DAY]
        d["msgs_in"] += msgs_in(r)
        d["msgs_out"] += r["msgs_out"]
        d["rejected"] += sum(r[k] for k in REJECTED)
    for c in touching(conns, start, end, tenant):
        if start <= c["connected_at"] < end:
            days[int(c["connected_at"] // DAY)]["connects"] += 1
        if start <= c["disconnected_at"] < end:
            days[int(c["disconnected_at"] // DAY)]["disconnects"] += 1
    return days


def top_topics(traffic, start, end, tenant, n):
    agg = defaultdict(int)
    for r in traffic_in(traffic, start, end, tenant):
        if r["topic"]:
            agg[r["topic"]] += msgs_in(r) + r["msgs_out"]
    return sorted(((t, m) for t, m in agg.items() if m), key=lambda kv: (-kv[1], kv[0]))[:n]


def top_devices(conns, start, end, tenant, n):
    agg = defaultdict(int)
    for c in touching(conns, start, end, tenant):
        if start <= c["disconnected_at"] < end:
            agg[device(c)] += c["msgs_in"] + c["msgs_out"]
    return sorted(agg.items(), key=lambda kv: (-kv[1], kv[0]))[:n]


def tenant_ranking(conns, traffic, start, end):
    tenants = {r["tenant"] for r in traffic_in(traffic, start, end)} | {c["tenant"] for c in touching(conns, start, end)}
    rows = [(t, totals(conns, traffic, start, end, t)["messages"]) for t in tenants]
    return sorted(rows, key=lambda kv: (-kv[1], kv[0]))


def node_peaks(conns, start, end):
    by_node = defaultdict(list)
    for c in touching(conns, start, end):
        by_node[c["node"]].append(c)
    return {node: peak(rows, start, end)[0] for node, rows in by_node.items()}
