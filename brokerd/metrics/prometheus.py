"""Prometheus exposition of a node's figures (``GET /metrics`` on the admin port).

Each node exposes itself (Prometheus scrapes every node, as it would scrape
every Mosquitto or EMQX node); ``tenant`` is a label, ``node`` too so that
sums over a cluster read naturally. Built at scrape time from the same
figures the admin API serves (``node_figures``): nothing is counted twice.
"""

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from . import node_figures
from .counters import DROP_REASONS

__all__ = ["CONTENT_TYPE_LATEST", "exposition", "registry_for"]


class NodeCollector:
    def __init__(self, server):
        self.server = server

    def describe(self):
        return []

    def collect(self):
        snap = node_figures(self.server)
        node = snap["node"]
        tenants = snap["tenants"]

        def gauge(name, doc, key):
            g = GaugeMetricFamily(name, doc, labels=["node", "tenant"])
            for tenant, t in tenants.items():
                g.add_metric([node, tenant], t[key])
            return g

        def counter(name, doc, key):
            c = CounterMetricFamily(name, doc, labels=["node", "tenant"])
            for tenant, t in tenants.items():
                c.add_metric([node, tenant], t[key])
            return c

        yield gauge("brokerd_connections", "Connected clients", "connections")
        yield gauge("brokerd_connections_max", "Most clients connected at once since the node started",
                    "connections_max")
        yield counter("brokerd_connects", "Accepted CONNECTs", "connects")
        yield counter("brokerd_disconnects", "Closed connections", "disconnects")
        for direction, key in (("received", "messages_in"), ("sent", "messages_out")):
            c = CounterMetricFamily(f"brokerd_messages_{direction}", f"PUBLISH packets {direction}",
                                    labels=["node", "tenant", "qos"])
            for tenant, t in tenants.items():
                for qos, n in t[key].items():
                    c.add_metric([node, tenant, qos], n)
            yield c
        yield counter("brokerd_bytes_received", "Bytes read from clients", "bytes_in")
        yield counter("brokerd_bytes_sent", "Bytes written to clients", "bytes_out")
        c = CounterMetricFamily("brokerd_messages_dropped", "Messages dropped or refused, by reason",
                                labels=["node", "tenant", "reason"])
        for tenant, t in tenants.items():
            for reason in DROP_REASONS:
                c.add_metric([node, tenant, reason], t["dropped"][reason])
        yield c
        yield counter("brokerd_auth_failures", "CONNECTs refused for bad credentials", "auth_failures")
        yield gauge("brokerd_retained_messages", "Retained messages", "retained")
        yield gauge("brokerd_subscriptions", "Subscriptions of the sessions on the node", "subscriptions")
        yield gauge("brokerd_queued_messages", "Messages queued for sessions", "queued")
        yield gauge("brokerd_inflight_messages", "QoS 1/2 messages sent and not yet acknowledged", "inflight")
        lat = snap["latency"]
        h = HistogramMetricFamily("brokerd_delivery_latency_seconds",
                                  "From reading a PUBLISH to writing it to every local subscriber (1 in 64)",
                                  labels=["node"])
        h.add_metric([node], [(str(le) if le != "+Inf" else "+Inf", n) for le, n in lat["buckets"]], lat["sum"])
        yield h
        g = GaugeMetricFamily("brokerd_event_loop_lag_seconds", "Worst event-loop lag of the last 5 s",
                              labels=["node"])
        g.add_metric([node], snap["loop_lag"])
        yield g
        store = snap["store"]
        c = CounterMetricFamily("brokerd_store_writes_dropped", "Store writes dropped because the store can "
                                "never take them (a data error; logged), never retried", labels=["node"])
        c.add_metric([node], store["writes_dropped"])
        yield c
        c = CounterMetricFamily("brokerd_store_writes_given_up", "Store writes a fenced node gave up: not taken "
                                "by the store before the others could adopt its sessions (logged)", labels=["node"])
        c.add_metric([node], store.get("writes_given_up", 0))
        yield c
        g = GaugeMetricFamily("brokerd_store_healthy", "1 while the session store takes writes", labels=["node"])
        g.add_metric([node], 1 if store["healthy"] else 0)
        yield g
        admin = snap.get("admin")
        if admin is not None:
            g = GaugeMetricFamily("brokerd_admin_connections", "Open admin API connections", labels=["node"])
            g.add_metric([node], admin["connections"])
            yield g
            c = CounterMetricFamily("brokerd_admin_refused", "Admin API connections and requests refused or "
                                    "cut, by reason", labels=["node", "reason"])
            for reason in ("refused", "timed_out", "rejected"):
                c.add_metric([node, reason], admin[reason])
            yield c
        g = GaugeMetricFamily("brokerd_up", "1 when the node serves clients, 0 when fenced off the cluster",
                              labels=["node"])
        g.add_metric([node], 1 if snap["health"] == "ok" else 0)
        yield g


def registry_for(server) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NodeCollector(server))
    ProcessCollector(registry=registry)          # process_cpu_seconds_total, _resident_memory_bytes, _open_fds
    return registry


def exposition(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
