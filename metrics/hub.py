"""The metrics hub: one per console process, on its event loop.

Once a second (``METRICS_POLL_INTERVAL``) it asks brokerd's admin API for
``GET /api/v1/metrics`` (in a thread: the client is blocking), turns the
answer into rates (``metrics.core.summarize``), evaluates the alarms
(``metrics.core.AlarmRules`` -> ``metrics.alarms``) and sends each
websocket its update over the channel layer: the cluster view to the group
of administrators' sockets, a tenant's view to the group of that tenant's
sockets. Any node answers for the cluster: the client asks the one that
answered last and fails over to the others (``core.brokerd_client``), whose
admin APIs the hub also learns from ``GET /api/v1/nodes`` every
``BROKERD_ADMIN_DISCOVERY_INTERVAL`` seconds; so a dead node is reported
(and alarmed) by a live one. When no node answers it sends an "unreachable"
update and keeps asking.

It starts lazily -- from the first HTTP request or websocket that reaches
the ASGI application (``HubStarter`` in console/asgi.py) -- and keeps
running, so alarms are watched while the console is up. Group names carry
the process's hub id: with ``channels_redis`` several console processes
share the layer, each runs its own hub, and each hub feeds only its own
process's sockets (no double updates). Alarms are written idempotently, so
two hubs agree on them (see ``metrics.core.AlarmRules``).
"""

from __future__ import annotations

import asyncio
import collections
import datetime as dt
import logging
import time
import uuid

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.utils import timezone

from core.brokerd_client import BrokerdClient, BrokerdError

from . import alarms as alarm_db
from . import core

log = logging.getLogger("metrics.hub")

SERIES_POINTS = 300          # live chart points kept per scope (5 minutes at 1 s)
LATENCY_WINDOW = 10          # latency quantiles over the last N polls
QUOTA_REFRESH = 5.0          # seconds between reloads of the tenants' quotas
TOP_TENANTS = 25             # tenants in the cluster view's table
FORGET_AFTER = 600           # seconds a tenant's points are kept after its last socket closed
KEEP_TENANTS = 200           # the busiest tenants' points are kept unwatched: their page opens on 5 minutes
# a live chart point: [unix time, connections, msgs in/s, msgs out/s, bytes in/s, bytes out/s, drops/s]
POINT_FIELDS = ("t", "connections", "msgs_in", "msgs_out", "bytes_in", "bytes_out", "drops")


def _point(at: float, gauges: dict, r: dict) -> list:
    return [round(at, 3), gauges.get("connections", 0), round(r["msgs_in"], 2), round(r["msgs_out"], 2),
            round(r["bytes_in"], 1), round(r["bytes_out"], 1), round(r["drops"], 2)]


def _short_rates(r: dict) -> dict:
    keys = ("msgs_in", "msgs_out", "bytes_in", "bytes_out", "connects", "disconnects", "drops", "auth_failures")
    out = {k: round(r.get(k, 0.0), 2) for k in keys}
    out["drops_by_reason"] = {reason: round(r.get("drop_" + reason, 0.0), 2) for reason in core.DROP_REASONS}
    return out


def _totals(flat: dict) -> dict:
    keys = core.GAUGES + core.COUNTERS
    out = {k: flat.get(k, 0) for k in keys}
    out["dropped"] = {reason: flat.get("drop_" + reason, 0) for reason in core.DROP_REASONS}
    out["msgs_in_qos"] = [flat.get(f"msgs_in_q{q}", 0) for q in "012"]
    out["msgs_out_qos"] = [flat.get(f"msgs_out_q{q}", 0) for q in "012"]
    return out


class Hub:
    def __init__(self):
        self.id = uuid.uuid4().hex[:12]
        self._task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.reset()

    def reset(self) -> None:
        """Forget everything (tests; a new configuration)."""
        self.rules = core.AlarmRules(alarm_settings())
        self.docs: collections.deque = collections.deque(maxlen=LATENCY_WINDOW + 1)
        self.series: collections.deque = collections.deque(maxlen=SERIES_POINTS)
        self.node_series: dict[str, collections.deque] = {}
        self.tenant_series: dict[str, collections.deque] = {}
        self.watchers: collections.Counter = collections.Counter()   # "" = cluster, else tenant slug
        self._unwatched: dict[str, float] = {}       # tenant -> when its last socket closed
        self._kept: dict[str, float] = {}            # unwatched tenant -> when a point was last kept for it
        self.latest: dict | None = None                # the last cluster payload
        self.latest_tenant: dict[str, dict] = {}
        self.open_alarms: list[dict] = []
        self.quotas: dict[str, dict] = {}
        self._quotas_at = 0.0
        self.polls = 0
        self.failures = 0

    # ------------------------------------------------------------ groups

    def group(self, slug: str | None = None) -> str:
        return f"metrics.cluster.{self.id}" if not slug else f"metrics.tenant.{slug}.{self.id}"

    def watch(self, slug: str | None) -> None:
        self.watchers[slug or ""] += 1
        self._unwatched.pop(slug or "", None)
        if slug and slug not in self.tenant_series:
            self.tenant_series[slug] = collections.deque(maxlen=SERIES_POINTS)

    def unwatch(self, slug: str | None) -> None:
        self.watchers[slug or ""] -= 1
        if self.watchers[slug or ""] <= 0:
            del self.watchers[slug or ""]
            if slug:
                self._unwatched[slug] = time.monotonic()

    def _forget_unwatched(self) -> None:
        """A tenant nobody watched for FORGET_AFTER seconds: drop its points
        (kept meanwhile, so a reloaded page keeps its chart)."""
        now = time.monotonic()
        for slug, since in list(self._kept.items()):
            if now - since > FORGET_AFTER or self.watchers.get(slug):
                del self._kept[slug]
                if not self.watchers.get(slug) and slug not in self._unwatched:
                    self.tenant_series.pop(slug, None)
                    self.latest_tenant.pop(slug, None)
        for slug, since in list(self._unwatched.items()):
            if now - since > FORGET_AFTER:
                del self._unwatched[slug]
                if slug not in self._kept:
                    self.tenant_series.pop(slug, None)
                    self.latest_tenant.pop(slug, None)

    def hello(self, slug: str | None = None, node: str | None = None, since: float | None = None) -> dict:
        """The first message on a new socket: the recent chart points and the last update (a
        tenant's: only those from ``since`` on, when its slug was given again after a deleted
        tenant had it -- the points are kept by slug)."""
        if slug:
            latest = self.latest_tenant.get(slug)
            series = list(self.tenant_series.get(slug) or ())
            if since is not None:
                series = [p for p in series if p[0] >= since]
                latest = latest if latest is not None and (latest.get("at") or 0) >= since else None
        else:
            latest = self.latest
            series = list(self.series)
        out = {"type": "hello", "scope": "tenant" if slug else "cluster", "tenant": slug or None,
               "interval": poll_interval(), "fields": POINT_FIELDS, "series": series, "latest": latest}
        if node:
            out["node"] = node
            out["node_series"] = list(self.node_series.get(node) or ())
        return out

    # ------------------------------------------------------------ running

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def ensure_started(self) -> None:
        """Start polling on the running event loop unless it already runs there."""
        if not getattr(settings, "METRICS_HUB", True):
            return
        loop = asyncio.get_running_loop()
        if self.running and self._loop is loop:
            return
        self._loop = loop
        self._task = loop.create_task(self._run(), name=f"metrics-hub-{self.id}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass

    async def _run(self) -> None:
        interval = poll_interval()
        client = BrokerdClient(timeout=max(2.0, 2 * interval))
        layer = get_channel_layer()
        log.info("metrics hub %s polling %s every %.1f s", self.id, ", ".join(client.endpoints.configured),
                 interval)
        loop = asyncio.get_running_loop()
        next_at = discover_at = loop.time()
        while True:
            try:
                if discovery_interval() > 0 and loop.time() >= discover_at:
                    discover_at = loop.time() + discovery_interval()
                    await self.discover(client)
                await self.tick(client, layer)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("metrics hub: poll failed")
            next_at = max(next_at + interval, loop.time() + 0.05)
            await asyncio.sleep(next_at - loop.time())

    async def discover(self, client: BrokerdClient) -> None:
        """Learn the cluster's admin APIs (core.brokerd_client): polls and pages fail over to them."""
        before = list(client.endpoints.learned)
        try:
            learned = await asyncio.to_thread(client.discover)
        except BrokerdError as exc:
            log.debug("metrics hub: could not list the nodes: %s", exc.message)
            return
        if learned != before:
            log.info("metrics hub: admin APIs of the cluster: %s", ", ".join(client.endpoints.configured + learned))

    async def tick(self, client: BrokerdClient, layer) -> None:
        now = time.time()
        asked = client.base_url
        try:
            doc = await asyncio.to_thread(client.metrics)
            error = None
        except BrokerdError as exc:
            doc, error = None, exc.message
        if doc is not None and client.base_url != asked:
            log.warning("metrics hub: %s does not answer; %s does", asked, client.base_url)
        self.polls += 1
        if doc is not None:
            prev = self.docs[-1] if self.docs else None
            summary = core.summarize(doc, prev, self.docs[0] if self.docs else None)
            self.docs.append(doc)
        else:
            if self.failures == 0:
                log.warning("metrics hub: %s", error)
            self.failures += 1
            summary = None
            self.docs.clear()       # rates start afresh once brokerd is back
        if doc is not None and self.failures:
            log.info("metrics hub: brokerd answers again")
            self.failures = 0
        if getattr(settings, "METRICS_ALARMS", True):
            self.open_alarms = await database_sync_to_async(self._alarm_round)(now, summary, error)
        await self.broadcast(layer, now, summary, error)

    # ------------------------------------------------------------ alarms (in a thread)

    def _alarm_round(self, now: float, summary: dict | None, error: str | None) -> list[dict]:
        if now - self._quotas_at >= QUOTA_REFRESH:
            self.quotas = alarm_db.effective_quotas()
            self._quotas_at = now
        keys = alarm_db.open_keys()
        down = [n for n in self.rules.last_ok if summary is None
                or n not in {x["node"] for x in summary["nodes"] if x["health"] == "ok"}]
        if down:
            since = dt.datetime.fromtimestamp(min(self.rules.last_ok[n] for n in down), tz=dt.UTC)
            for node, cleared in alarm_db.dismissed_nodes(since).items():
                if node in down and cleared.timestamp() >= self.rules.last_ok[node]:
                    self.rules.forget_node(node)
        raise_, clear = self.rules.evaluate(now, summary, self.quotas, keys, error)
        if raise_ or clear:
            changed = alarm_db.apply(raise_, clear, timezone.now())
            if changed["raised"] or changed["cleared"]:
                log.info("metrics hub: alarms raised %s, cleared %s", [c.key for c in raise_], clear)
        return [alarm_db.as_dict(a) for a in alarm_db.open_alarms().order_by("raised_at", "id")]

    # ------------------------------------------------------------ updates

    async def broadcast(self, layer, now: float, summary: dict | None, error: str | None) -> None:
        self._forget_unwatched()
        if summary is None:
            cluster = {"type": "update", "state": "unreachable", "error": error, "at": now,
                       "alarms": self.open_alarms}
            self.latest = cluster
            if layer is not None and self.watchers.get(""):
                await layer.group_send(self.group(), {"type": "metrics.update", "payload": cluster})
            for slug in [s for s in self.watchers if s]:
                payload = {"type": "update", "state": "unreachable", "error": "brokerd does not answer",
                           "at": now, "tenant": slug, "alarms": self._tenant_alarms(slug)}
                self.latest_tenant[slug] = payload
                if layer is not None:
                    await layer.group_send(self.group(slug), {"type": "metrics.update", "payload": payload})
            return
        at = summary["at"] or now
        c = summary["cluster"]
        point = _point(at, c, c["rates"])
        self.series.append(point)
        nodes = []
        for n in summary["nodes"]:
            entry = {"node": n["node"], "health": n["health"], "host": n.get("host") or n["node"],
                     "worker": n.get("worker")}
            if "rates" in n:
                p = _point(at, n, n["rates"])
                self.node_series.setdefault(n["node"], collections.deque(maxlen=SERIES_POINTS)).append(p)
                entry.update({k: n.get(k) for k in ("uptime", "loop_lag", "cpu", "memory_rss", "p50", "p99",
                                                    "latency_count")})
                entry["totals"] = _totals(n)
                entry["rates"] = _short_rates(n["rates"])
                entry["point"] = p
            nodes.append(entry)
        tenants = sorted(summary["tenants"].items(),
                         key=lambda kv: (-(kv[1]["rates"]["msgs_in"] + kv[1]["rates"]["msgs_out"]),
                                         -kv[1]["connections"], kv[0]))
        cluster = {
            "type": "update", "state": "ok", "at": at, "interval": summary["interval"],
            "totals": _totals(c), "rates": _short_rates(c["rates"]), "point": point,
            "nodes_total": c["nodes"], "nodes_ok": c["nodes_ok"], "nodes": nodes,
            "tenants": [{"slug": slug, "connections": t["connections"], "msgs_in": t["msgs_in"],
                         "msgs_out": t["msgs_out"], "rates": _short_rates(t["rates"]),
                         "max_connections": (self.quotas.get(slug) or {}).get("max_connections"),
                         "anonymous": bool(settings.ANONYMOUS_TENANT) and slug == settings.ANONYMOUS_TENANT}
                        for slug, t in tenants[:TOP_TENANTS]],
            "tenants_total": len(tenants), "alarms": self.open_alarms,
        }
        self.latest = cluster
        if layer is not None and self.watchers.get(""):
            await layer.group_send(self.group(), {"type": "metrics.update", "payload": cluster})
        for slug in [s for s in self.watchers if s]:
            payload = self.tenant_payload(slug, at, summary["tenants"].get(slug))
            self.latest_tenant[slug] = payload
            self.tenant_series.setdefault(slug, collections.deque(maxlen=SERIES_POINTS)).append(payload["point"])
            if layer is not None:
                await layer.group_send(self.group(slug), {"type": "metrics.update", "payload": payload})
        # the busiest tenants' points are kept with nobody watching, as the cluster's are: a tenant's
        # page opens on the last minutes (it opened on an empty chart); the others fill from the page's start
        kept_at = time.monotonic()
        for slug, t in tenants[:KEEP_TENANTS]:
            if not self.watchers.get(slug):
                self.tenant_series.setdefault(slug, collections.deque(maxlen=SERIES_POINTS)).append(
                    _point(at, t, t["rates"]))
                self._kept[slug] = kept_at

    def _tenant_alarms(self, slug: str) -> list[dict]:
        return [a for a in self.open_alarms if a["tenant"] == slug]

    def tenant_payload(self, slug: str, at: float, t: dict | None) -> dict:
        """A tenant's own numbers only (no node names, nothing of other tenants)."""
        flat = t if t is not None else core.flatten({})
        r = t["rates"] if t is not None else core.rates(None, flat, 0)
        return {"type": "update", "state": "ok", "at": at, "tenant": slug, "totals": _totals(flat),
                "rates": _short_rates(r), "point": _point(at, flat, r),
                "quota": {k: v for k, v in (self.quotas.get(slug) or {}).items()},
                "alarms": self._tenant_alarms(slug)}


def poll_interval() -> float:
    return float(getattr(settings, "METRICS_POLL_INTERVAL", 1.0))


def discovery_interval() -> float:
    return float(getattr(settings, "BROKERD_ADMIN_DISCOVERY_INTERVAL", 10.0))


def alarm_settings() -> core.AlarmSettings:
    return core.AlarmSettings(
        quota_percent=float(getattr(settings, "METRICS_ALARM_QUOTA_PERCENT", 90)),
        drops_rate=float(getattr(settings, "METRICS_ALARM_DROPS_RATE", 10)),
        drops_for=float(getattr(settings, "METRICS_ALARM_DROPS_FOR", 10)),
        drops_clear_for=float(getattr(settings, "METRICS_ALARM_DROPS_CLEAR_FOR", 30)),
        node_down_after=float(getattr(settings, "METRICS_ALARM_NODE_DOWN_AFTER", 3)),
    )


_hub: Hub | None = None


def get_hub() -> Hub:
    global _hub
    if _hub is None:
        _hub = Hub()
    return _hub


class HubStarter:
    """ASGI wrapper: the first request or websocket starts the hub (daphne
    has no lifespan events), so alarms are watched from then on."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] in ("http", "websocket"):
            get_hub().ensure_started()
        return await self.app(scope, receive, send)
