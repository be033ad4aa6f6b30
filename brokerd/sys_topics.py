"""The Mosquitto-compatible ``$SYS/broker/...`` tree, published on an interval.

Values are retained, QoS 0, as text, like Mosquitto's. Load figures are
exponentially damped moving averages of the per-minute rate over 1, 5 and 15
minutes. Differences from Mosquitto: ``messages/*`` count PUBLISH packets
(Mosquitto counts every packet type there), and there is no ``heap/*``.
"""

import math
import os

from . import __version__
from .protocol.packets import Publish

PREFIX = "$SYS/broker/"
WINDOWS = ((1, "1min"), (5, "5min"), (15, "15min"))


class SysTopics:
    def __init__(self, broker, interval: float, now: float):
        self.broker = broker
        self.interval = interval
        self.next_at = now
        self.last = None          # (time, counters) at the previous publication
        self.load: dict[str, float] = {}

    def tick(self, now: float) -> None:
        if self.interval <= 0 or now < self.next_at:
            return
        self.next_at = now + self.interval
        self.publish(now)

    def values(self, now: float) -> dict[str, str]:
        b = self.broker
        st = b.stats
        t = b.totals()
        sessions = b.session_count()
        counters = {
            "messages/received": t["msgs_received"],
            "messages/sent": t["msgs_sent"],
            "bytes/received": t["bytes_received"],
            "bytes/sent": t["bytes_sent"],
            "connections": st.connects,
            "publish/dropped": st.dropped_queue_full + st.dropped_expired + st.dropped_too_large,
        }
        self._update_load(now, counters)
        dropped = counters["publish/dropped"]
        v = {
            "version": f"brokerd version {__version__}",
            "uptime": f"{int(now - b.started_at)} seconds",
            "clients/connected": b.connected,
            "clients/active": b.connected,
            "clients/disconnected": sessions - b.connected,
            "clients/inactive": sessions - b.connected,
            "clients/total": sessions,
            "clients/maximum": st.clients_max,
            "clients/expired": st.sessions_expired,
            "messages/received": t["msgs_received"],
            "messages/sent": t["msgs_sent"],
            "messages/inflight": sum(len(s.inflight) for ns in b.namespaces.values() for s in ns.sessions.values()),
            "messages/stored": sum(len(s.queue) for ns in b.namespaces.values() for s in ns.sessions.values()),
            "publish/messages/received": t["msgs_received"],
            "publish/messages/sent": t["msgs_sent"],
            "publish/messages/dropped": dropped,
            "bytes/received": t["bytes_received"],
            "bytes/sent": t["bytes_sent"],
            "subscriptions/count": b.subscription_count(),
            "retained messages/count": b.retained_count(),
        }
        for key, value in self.load.items():
            v["load/" + key] = f"{value:.2f}"
        try:
            la = os.getloadavg()
            v["load/system/1min"], v["load/system/5min"], v["load/system/15min"] = (f"{x:.2f}" for x in la)
        except OSError:
            pass
        return {k: str(val) for k, val in v.items()}

    def _update_load(self, now: float, counters: dict) -> None:
        last = self.last
        self.last = (now, counters)
        if last is None:
            return
        dt = now - last[0]
        if dt <= 0:
            return
        for key, value in counters.items():
            per_min = (value - last[1][key]) * 60.0 / dt
            for minutes, label in WINDOWS:
                name = f"{key}/{label}"
                factor = math.exp(-dt / (minutes * 60.0))
                prev = self.load.get(name, per_min)
                self.load[name] = prev * factor + per_min * (1.0 - factor)

    def publish(self, now: float) -> None:
        values = self.values(now)
        b = self.broker
        for ns in list(b.namespaces.values()):
            if ns.name != b.config.anonymous_tenant:
                continue
            for key, value in values.items():
                msg = Publish(PREFIX + key, value.encode(), 0, True)
                b.publish_internal(ns, msg, now)
