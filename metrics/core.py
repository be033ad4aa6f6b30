"""Live metrics arithmetic: plain Python, no Django, no asyncio, no clock.

brokerd's admin API answers ``GET /api/v1/metrics`` with cumulative counters
per node and per tenant (the contract is in README "Live metrics"). The
console's hub (``metrics.hub``) polls it once a second and turns two
successive answers into what the dashboards show: per-second rates, CPU
percentages, latency quantiles. Everything here takes the documents and
``now`` as arguments, so it is tested without a broker.

Rates are computed per node (and per tenant on each node) and then summed:
a node that restarts (its counters start again from 0) contributes 0 for
that interval instead of a negative number, and one that stops answering
contributes nothing instead of a spike when it is back.
"""

from __future__ import annotations

from dataclasses import dataclass

from brokerd.metrics.counters import DROP_REASONS  # what brokerd counts drops by (one list for both sides)

# the drops that mean something went wrong: a publish nobody subscribes to is
# normal for telemetry, so ``no_subscribers`` is shown but raises no alarm
ALARMING_DROPS = ("queue_full", "expired", "too_large", "acl_denied", "quota")

# current values (a gauge is shown as is)
GAUGES = ("connections", "connections_max", "subscriptions", "retained", "queued", "inflight")
# cumulative counters (shown as totals and turned into per-second rates)
COUNTERS = ("msgs_in", "msgs_out", "bytes_in", "bytes_out", "connects", "disconnects", "drops",
            "auth_failures", "rule_drops")


def _qos_sum(value) -> int:
    if isinstance(value, dict):
        return sum(int(v or 0) for v in value.values())
    return int(value or 0)


def flatten(totals: dict | None) -> dict:
    """A TOTALS document -> one flat dict of numbers (gauges, counters, drops by reason)."""
    t = totals or {}
    dropped = t.get("dropped") or {}
    out = {g: int(t.get(g) or 0) for g in GAUGES}
    out.update({
        "msgs_in": _qos_sum(t.get("messages_in")),
        "msgs_out": _qos_sum(t.get("messages_out")),
        "bytes_in": int(t.get("bytes_in") or 0),
        "bytes_out": int(t.get("bytes_out") or 0),
        "connects": int(t.get("connects") or 0),
        "disconnects": int(t.get("disconnects") or 0),
        "drops": sum(int(dropped.get(r) or 0) for r in DROP_REASONS),
        "auth_failures": int(t.get("auth_failures") or 0),
        "rule_drops": int(t.get("rule_actions_dropped") or 0),     # rules' webhook requests / telemetry rows
    })
    for reason in DROP_REASONS:
        out["drop_" + reason] = int(dropped.get(reason) or 0)
    for direction in ("in", "out"):
        per_qos = t.get("messages_" + direction) or {}
        for q in ("0", "1", "2"):
            out[f"msgs_{direction}_q{q}"] = int(per_qos.get(q) or 0) if isinstance(per_qos, dict) else 0
    return out


RATE_KEYS = COUNTERS + tuple("drop_" + r for r in DROP_REASONS) + tuple(
    f"msgs_{d}_q{q}" for d in ("in", "out") for q in "012")


def rates(prev: dict | None, cur: dict, seconds: float) -> dict:
    """Per-second rates between two flattened documents; a counter that went
    down (the node restarted) counts as 0; no previous document -> all 0."""
    if prev is None or seconds <= 0:
        return dict.fromkeys(RATE_KEYS, 0.0)
    return {k: max(0, cur.get(k, 0) - prev.get(k, 0)) / seconds for k in RATE_KEYS}


def add_rates(into: dict, more: dict) -> dict:
    for k, v in more.items():
        into[k] = into.get(k, 0.0) + v
    return into


def alarming_drop_rate(r: dict) -> float:
    return sum(r.get("drop_" + reason, 0.0) for reason in ALARMING_DROPS)


def quantile(buckets: list, q: float) -> float | None:
    """The ``q`` quantile (0..1) of a cumulative histogram ``[[le, count], ...]``
    (ascending ``le``, the last may be ``inf``), interpolated linearly inside
    the bucket as Prometheus' ``histogram_quantile`` does; None without data."""
    if not buckets:
        return None
    total = buckets[-1][1]
    if total <= 0:
        return None
    rank = q * total
    prev_le, prev_count = 0.0, 0
    for le, count in buckets:
        le = float(le)
        if count >= rank:
            if le == float("inf"):
                return prev_le          # above the highest finite bound: its bound
            if count == prev_count:
                return le
            return prev_le + (le - prev_le) * (rank - prev_count) / (count - prev_count)
        prev_le, prev_count = le, count
    return prev_le


def histogram_delta(cur: dict | None, base: dict | None) -> list:
    """Buckets of ``cur`` minus ``base`` (the latency of a recent window); the
    whole of ``cur`` when there is no base or the node restarted."""
    if not cur:
        return []
    buckets = [[float(le), int(c)] for le, c in cur.get("buckets") or []]
    if not base:
        return buckets
    old = {float(le): int(c) for le, c in base.get("buckets") or []}
    delta = [[le, c - old.get(le, 0)] for le, c in buckets]
    if any(c < 0 for _, c in delta):
        return buckets
    return delta


def _flat(totals: dict | None) -> dict:
    """``flatten`` once per document: kept in the document (the next poll's
    ``prev`` reuses it), so each node's and tenant's totals are flattened once."""
    if totals is None:
        return flatten(None)
    flat = totals.get("_flat")
    if flat is None:
        flat = totals["_flat"] = flatten(totals)
    return flat


def _node_map(doc: dict | None) -> dict:
    return {n.get("node"): n for n in (doc or {}).get("nodes") or [] if n.get("node")}


def summarize(doc: dict, prev: dict | None, base: dict | None = None) -> dict:
    """The dashboards' view of one metrics document.

    ``prev`` is the previous document (rates), ``base`` an older one (the
    window of the latency quantiles, e.g. 10 s); both may be None. Returns
    ``{"at", "cluster": {...}, "nodes": [...], "tenants": {slug: {...}}}``
    where each entry holds the gauges, the cumulative counters and ``rates``.
    """
    at = float(doc.get("at") or 0)
    seconds = at - float(prev.get("at") or 0) if prev else 0.0
    prev_nodes, base_nodes = _node_map(prev), _node_map(base)
    cluster_rates = dict.fromkeys(RATE_KEYS, 0.0)
    tenant_rates: dict[str, dict] = {}
    nodes = []
    for node in doc.get("nodes") or []:
        name = node.get("node")
        health = node.get("health") or "unreachable"
        # a worker of a host (brokerd --workers N) says which: the pages group workers under their host
        entry = {"node": name, "health": health, "host": node.get("host") or name, "worker": node.get("worker")}
        if health == "unreachable" and "connections" not in node:
            nodes.append(entry)
            continue
        before = prev_nodes.get(name)
        usable = before is not None and "connections" in before and float(node.get("uptime") or 0) >= seconds
        flat = _flat(node)
        r = rates(_flat(before) if usable else None, flat, seconds)
        add_rates(cluster_rates, r)
        cpu = None
        if usable and seconds > 0 and node.get("cpu_seconds") is not None:
            cpu = max(0.0, float(node["cpu_seconds"]) - float(before.get("cpu_seconds") or 0)) / seconds * 100
        old = base_nodes.get(name) or before
        window = histogram_delta(node.get("latency"), (old or {}).get("latency") if usable else None)
        entry.update(flat)
        entry.update({
            "uptime": node.get("uptime"), "loop_lag": node.get("loop_lag"), "cpu": cpu,
            "memory_rss": node.get("memory_rss"), "rates": r,
            "p50": quantile(window, 0.5), "p99": quantile(window, 0.99),
            "latency_count": window[-1][1] if window else 0,
        })
        nodes.append(entry)
        prev_tenants = (before or {}).get("tenants") or {}
        for slug, totals in (node.get("tenants") or {}).items():
            tr = rates(_flat(prev_tenants[slug]) if usable and slug in prev_tenants else None, _flat(totals),
                       seconds)
            add_rates(tenant_rates.setdefault(slug, dict.fromkeys(RATE_KEYS, 0.0)), tr)
    cluster = flatten(doc.get("cluster"))
    cluster["rates"] = cluster_rates
    cluster["nodes"] = len(nodes)
    cluster["nodes_ok"] = sum(1 for n in nodes if n["health"] == "ok")
    tenants = {}
    for slug, totals in (doc.get("tenants") or {}).items():
        t = flatten(totals)
        t["rates"] = tenant_rates.get(slug) or dict.fromkeys(RATE_KEYS, 0.0)
        tenants[slug] = t
    return {"at": at, "interval": seconds, "cluster": cluster, "nodes": nodes, "tenants": tenants}


# ------------------------------------------------------------------ alarms

QUOTA = "quota"
NODE_DOWN = "node_down"
DROPS = "drops"
RULE_DROPS = "rule_drops"


@dataclass(frozen=True)
class Condition:
    kind: str
    subject: str
    tenant: str | None
    message: str

    @property
    def key(self) -> tuple[str, str]:
        return (self.kind, self.subject)


@dataclass
class AlarmSettings:
    quota_percent: float = 90.0     # tenant at or above this share of a quota
    quota_rate_for: float = 5.0     # a rate quota must stay that high this long (s)
    drops_rate: float = 10.0        # dropped messages per second (not counting "no subscribers") ...
    drops_for: float = 10.0         # ... for this long raises "drops rising"
    drops_clear_for: float = 30.0   # ... and below it for this long clears it
    node_down_after: float = 3.0    # a node seen before, not ok for this long


# (quota field, what it limits, its unit, value from a tenant's summary, is a rate)
QUOTA_RULES = (
    ("max_connections", "connections", "", lambda t: t["connections"], False),
    ("max_retained", "retained messages", "", lambda t: t["retained"], False),
    ("tenant_msgs_in", "messages in", "/s", lambda t: t["rates"]["msgs_in"], True),
    ("tenant_msgs_out", "messages out", "/s", lambda t: t["rates"]["msgs_out"], True),
    ("tenant_bytes_in", "bytes in", "/s", lambda t: t["rates"]["bytes_in"], True),
    ("tenant_bytes_out", "bytes out", "/s", lambda t: t["rates"]["bytes_out"], True),
)


def _num(v: float) -> str:
    return f"{v:,.0f}" if v >= 10 or v == int(v) else f"{v:,.1f}"


class AlarmRules:
    """Decides which alarms to raise and which to clear, given what is open.

    ``evaluate`` is called once per poll with the summary (None when brokerd
    does not answer), the tenants' effective quotas and the keys of the
    alarms open in the database; it returns ``(raise, clear)``. Whether an
    alarm is open comes from the caller, so two console processes deciding
    independently agree: a condition held long enough raises it (the
    database keeps one open alarm per kind and subject), and only the
    opposite, held long enough, clears it.
    """

    def __init__(self, settings: AlarmSettings | None = None):
        self.s = settings or AlarmSettings()
        self.last_ok: dict[str, float] = {}      # node -> last time it was seen healthy
        self._bad_since: dict[tuple, float] = {}
        self._good_since: dict[tuple, float] = {}

    def forget_node(self, node: str) -> None:
        self.last_ok.pop(node, None)

    def _held(self, key, bad: bool, now: float, raise_after: float, clear_after: float, is_open: bool) -> bool | None:
        """True: raise; False: clear; None: nothing to do."""
        if bad:
            self._good_since.pop(key, None)
            since = self._bad_since.setdefault(key, now)
            return True if not is_open and now - since >= raise_after else None
        self._bad_since.pop(key, None)
        since = self._good_since.setdefault(key, now)
        return False if is_open and now - since >= clear_after else None

    def evaluate(self, now: float, summary: dict | None, quotas: dict[str, dict], open_keys: set,
                 error: str | None = None) -> tuple[list[Condition], list[tuple[str, str]]]:
        raise_: list[Condition] = []
        clear: list[tuple[str, str]] = []

        def judge(cond: Condition, bad: bool, raise_after: float, clear_after: float):
            verdict = self._held(cond.key, bad, now, raise_after, clear_after, cond.key in open_keys)
            if verdict is True:
                raise_.append(cond)
            elif verdict is False:
                clear.append(cond.key)

        # -- nodes: every node seen healthy before (or with an open alarm) must be ok now
        reported = {} if summary is None else {n["node"]: n for n in summary["nodes"]}
        for name, n in reported.items():
            if n["health"] == "ok":
                self.last_ok[name] = now
        watched = set(self.last_ok) | {subject for kind, subject in open_keys if kind == NODE_DOWN}
        for name in sorted(watched):
            n = reported.get(name)
            if summary is None:
                why = f"node {name} does not answer (brokerd's admin API is unreachable: {error or 'no answer'})"
            elif n is None:
                why = f"node {name} is no longer in the cluster (stopped, crashed or left)"
            elif n["health"] == "fenced":
                why = f"node {name} is fenced (it lost the cluster bus and refuses clients)"
            else:
                why = f"node {name} is {n['health']}"
            bad = n is None or n["health"] != "ok"
            judge(Condition(NODE_DOWN, name, None, why), bad, self.s.node_down_after, 0.0)
        if summary is None:
            return raise_, clear            # quotas and drops cannot be judged without numbers

        # -- quotas and drops, per tenant
        share = self.s.quota_percent / 100.0
        tenants = summary["tenants"]
        judged_tenants = set(tenants) | set(quotas)
        for slug in sorted(judged_tenants):
            t = tenants.get(slug)
            limits = quotas.get(slug) or {}
            for field, what, unit, value, is_rate in QUOTA_RULES:
                limit = limits.get(field)
                key = (QUOTA, f"{slug}:{field}")
                if limit is None and key not in open_keys:
                    continue
                used = value(t) if t is not None else 0
                bad = limit is not None and used >= share * limit
                pct = 100.0 * used / limit if limit else 0.0
                msg = (f"tenant {slug}: {_num(used)}{unit} {what} of its quota of {_num(limit or 0)}{unit} "
                       f"({pct:.0f}%, {field})")
                after = self.s.quota_rate_for if is_rate else 0.0
                judge(Condition(QUOTA, key[1], slug, msg), bad, after, after)
            rate = alarming_drop_rate(t["rates"]) if t is not None else 0.0
            reasons = ", ".join(f"{r.replace('_', ' ')} {_num(t['rates']['drop_' + r])}/s" for r in ALARMING_DROPS
                                if t is not None and t["rates"]["drop_" + r] > 0)
            msg = (f"tenant {slug}: {_num(rate)} messages dropped per second for {self.s.drops_for:.0f} s"
                   f" or more ({reasons or 'no reason given'})")
            judge(Condition(DROPS, slug, slug, msg), rate >= self.s.drops_rate, self.s.drops_for,
                  self.s.drops_clear_for)
            lost = t["rates"].get("rule_drops", 0.0) if t is not None else 0.0
            msg = (f"tenant {slug}: its rules' actions are dropping {_num(lost)} webhook requests or telemetry "
                   f"rows per second (an endpoint or the landing zone is not keeping up; see its Rules page)")
            judge(Condition(RULE_DROPS, slug, slug, msg), lost > 0, self.s.drops_for, self.s.drops_clear_for)
        # open alarms about tenants that are gone from both the numbers and the quotas
        for kind, subject in open_keys:
            slug = subject.split(":", 1)[0] if kind == QUOTA else subject
            if kind in (DROPS, RULE_DROPS, QUOTA) and slug not in judged_tenants:
                clear.append((kind, subject))
        return raise_, clear
