"""The Mosquitto-compatible ``$SYS/broker/...`` tree, published on an interval.

Values are retained, QoS 0, as text, like Mosquitto's. Load figures are
exponentially damped moving averages of the per-minute rate over 1, 5 and 15
minutes. Differences from Mosquitto: ``messages/*`` count PUBLISH packets
(Mosquitto counts every packet type there), and there is no ``heap/*``.

In a cluster, ``$SYS/broker/...`` is the node's own tree and
``$SYS/cluster/...`` the sum over every node (nodes, clients, sessions,
subscriptions, messages and bytes; retained messages, copied to every node,
the largest node's count). A host that runs
``--workers N`` is one node to its users: each worker publishes the host's
figures -- its workers' summed through the cluster bus (refreshed every
second; the gauges only a ``$SYS`` round computes, in flight, stored,
dropped, maximum, every round) -- so a subscriber reads the same tree
whichever worker it landed on.

With a control plane, every tenant gets its own tree inside its own topic
space, with its own figures (its clients, its messages and bytes, its
subscriptions and retained messages) -- so a tenant's devices see their
tenant's ``$SYS`` subtree and nothing of others -- as far as the tenant's
system-topic settings allow (enabled, interval, which parts) -- on a host
that runs ``--workers N``, the tenant's figures over the host's workers. Without one,
the anonymous tenant gets the node's figures.
"""

import math
import os

from . import __version__
from .protocol.packets import Publish

PREFIX = "$SYS/broker/"
CLUSTER_PREFIX = "$SYS/cluster/"
WINDOWS = ((1, "1min"), (5, "5min"), (15, "15min"))
PARTS = {                     # tenant setting part -> first level(s) of the keys it controls
    "clients": ("clients/",),
    "messages": ("messages/", "publish/messages/"),
    "bytes": ("bytes/",),
    "subscriptions": ("subscriptions/",),
    "retained": ("retained messages/",),
    "load": ("load/",),
}


class _Load:
    """Damped per-minute rates of some counters."""

    __slots__ = ("last", "values")

    def __init__(self):
        self.last = None
        self.values: dict[str, float] = {}

    def update(self, now: float, counters: dict) -> None:
        last = self.last
        self.last = (now, counters)
        if last is None:
            return
        dt = now - last[0]
        if dt <= 0:
            return
        for key, value in counters.items():
            per_min = (value - last[1].get(key, 0)) * 60.0 / dt
            for minutes, label in WINDOWS:
                name = f"{key}/{label}"
                factor = math.exp(-dt / (minutes * 60.0))
                prev = self.values.get(name, per_min)
                self.values[name] = prev * factor + per_min * (1.0 - factor)


class SysTopics:
    def __init__(self, broker, interval: float, now: float):
        self.broker = broker
        self.interval = interval
        self.next_at: dict[str, float] = {}       # namespace -> next publication
        self.loads: dict[str, _Load] = {}

    def tick(self, now: float) -> None:
        if self.interval <= 0:
            return
        b = self.broker
        for tenant in b.router.tenant_names():
            policy = b.auth.policy(tenant)
            if policy is None:
                if tenant != b.config.anonymous_tenant:
                    continue
                interval, parts = self.interval, None
            elif not policy.sys_enabled or not policy.sys_parts:
                continue
            else:
                interval, parts = policy.sys_interval, policy.sys_parts
            if now < self.next_at.get(tenant, 0.0):
                continue
            self.next_at[tenant] = now + interval
            self.publish(tenant, now, node=policy is None, parts=parts)

    def values(self, tenant: str, now: float, node: bool) -> dict[str, str]:
        """The tree for ``tenant``: the node's figures, or the tenant's own."""
        b = self.broker
        st = b.stats
        if node:
            t = b.totals()
            received, sent, bytes_in, bytes_out = (t["msgs_received"], t["msgs_sent"], t["bytes_received"],
                                                   t["bytes_sent"])
            sessions = b.session_count()
            connected = b.connected
            subs = b.subscription_count()
            retained = b.retained_count()
            spaces = b.router.all_figures()
            f = b.router.figures(tenant)
        else:
            f = b.router.figures(tenant)
            received, sent, bytes_in, bytes_out = f.closed
            for ch in f.live:
                received += ch.msgs_in
                sent += ch.msgs_out
                bytes_in += ch.bytes_in
                bytes_out += ch.bytes_out
            sessions = f.sessions
            connected = f.connected
            subs = f.subscriptions
            retained = f.retained
            spaces = [f]
        host = self._host(node, spaces) if node else self._host_tenant(tenant)
        if host:
            connected, sessions, subs = int(host["connected"]), int(host["sessions"]), int(host["subscriptions"])
            retained = int(host["retained"])
            received, sent = int(host["msgs_received"]), int(host["msgs_sent"])
            bytes_in, bytes_out = int(host["bytes_received"]), int(host["bytes_sent"])
        load = self.loads.setdefault(tenant, _Load())
        connects = st.connects if node else (int(host["connects"]) if host else f.connects)
        counters = {"messages/received": received, "messages/sent": sent, "bytes/received": bytes_in,
                    "bytes/sent": bytes_out, "connections": connects}
        if node:
            counters["publish/dropped"] = st.dropped_queue_full + st.dropped_expired + st.dropped_too_large
        load.update(now, counters)
        v = {
            "version": f"brokerd version {__version__}",
            "uptime": f"{int(now - b.started_at)} seconds",
            "clients/connected": connected,
            "clients/active": connected,
            "clients/disconnected": sessions - connected,
            "clients/inactive": sessions - connected,
            "clients/total": sessions,
            "messages/received": received,
            "messages/sent": sent,
            "messages/inflight": int(host["inflight"]) if host else sum(s.inflight for s in spaces),
            "messages/stored": int(host["queued"]) if host else sum(s.queued for s in spaces),
            "publish/messages/received": received,
            "publish/messages/sent": sent,
            "bytes/received": bytes_in,
            "bytes/sent": bytes_out,
            "subscriptions/count": subs,
            "retained messages/count": retained,
        }
        if not node:
            m = f.counters
            v["clients/maximum"] = m.connections_max
            v["publish/messages/dropped"] = m.queue_full + m.expired + m.too_large
            if host:      # the sum of the workers' maxima: at most that many at once
                v["clients/maximum"], v["publish/messages/dropped"] = int(host["clients_max"]), int(host["dropped"])
        if node:
            v["clients/maximum"] = st.clients_max
            v["clients/expired"] = st.sessions_expired
            v["publish/messages/dropped"] = st.dropped_queue_full + st.dropped_expired + st.dropped_too_large
            if host:      # the sum of the workers' maxima: at most that many at once
                v["clients/maximum"], v["clients/expired"] = int(host["clients_max"]), int(host["expired"])
                v["publish/messages/dropped"] = int(host["dropped"])
            try:
                la = os.getloadavg()
                v["load/system/1min"], v["load/system/5min"], v["load/system/15min"] = (f"{x:.2f}" for x in la)
            except OSError:
                pass
        for key, value in load.values.items():
            v["load/" + key] = f"{value:.2f}"
        return {k: str(val) for k, val in v.items()}

    def _host(self, node: bool, spaces) -> dict | None:
        """A worker's host's figures (--workers), or None: this node's own. The
        gauges a $SYS round computes go out with the worker's next heartbeat."""
        cluster = self.broker.cluster
        membership = getattr(cluster, "membership", None)
        if not node or membership is None or not membership.identity:
            return None
        st = self.broker.stats
        membership.extra_stats = {
            "inflight": sum(s.inflight for s in spaces), "queued": sum(s.queued for s in spaces),
            "clients_max": st.clients_max, "expired": st.sessions_expired,
            "dropped": st.dropped_queue_full + st.dropped_expired + st.dropped_too_large}
        host = membership.host_totals
        keys = ("connected", "sessions", "subscriptions", "retained", "msgs_received", "msgs_sent",
                "bytes_received", "bytes_sent", *membership.extra_stats)
        return host if all(k in host for k in keys) else None

    def _host_tenant(self, tenant: str) -> dict | None:
        """A worker's host's figures of ``tenant`` (--workers: its workers' summed through the
        cluster bus, every second), or None: this node's own."""
        membership = getattr(self.broker.cluster, "membership", None)
        if membership is None or not membership.identity:
            return None
        return membership.host_tenants.get(tenant)

    def publish(self, tenant: str, now: float, node: bool = True, parts=None) -> None:
        values = self.values(tenant, now, node)
        ns = self.broker.namespace(tenant)
        allowed = None
        if parts is not None:
            allowed = tuple(p for part in parts for p in PARTS.get(part, ()))
        for key, value in values.items():
            if allowed is not None and key not in ("version", "uptime") and not key.startswith(allowed):
                if ns.retained.get(PREFIX + key) is not None:
                    # a part the tenant turned off: its last value goes (it stood retained, stale, for good)
                    ns.retained.delete(PREFIX + key)
                continue
            self.broker.publish_internal(ns, Publish(PREFIX + key, value.encode(), 0, True), now)
        cluster = self.broker.cluster
        if node and cluster is not None and cluster.stats_totals:
            for key, value in self.cluster_values(cluster.stats_totals).items():
                self.broker.publish_internal(ns, Publish(CLUSTER_PREFIX + key, value.encode(), 0, True), now)

    @staticmethod
    def cluster_values(t: dict) -> dict[str, str]:
        """The whole cluster's figures (each node's, summed through the cluster bus)."""
        names = {"nodes": "nodes", "connected": "clients/connected", "sessions": "clients/total",
                 "subscriptions": "subscriptions/count", "retained": "retained messages/count",
                 "msgs_received": "messages/received", "msgs_sent": "messages/sent",
                 "bytes_received": "bytes/received", "bytes_sent": "bytes/sent"}
        return {name: str(int(t[key])) for key, name in names.items() if key in t}
