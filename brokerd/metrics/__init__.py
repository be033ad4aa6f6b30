"""What a node measures, and the figures (``node_figures``) the admin API, Prometheus and the
history share (issue #7).

Counting costs the per-message path almost nothing: messages and bytes are
counted per connection by the channels (QoS 1/2 on their own, QoS 0 is the
rest), drops and denials where they happen (node ``Stats`` and the tenant's
``TenantCounters``); everything else -- sums over connections and tenants,
rates, percentiles -- is computed when somebody asks (``node_figures``), at most
a few times a second.

Latency: one PUBLISH in 64 is timed from the moment the broker takes it
(decoded, authorised) to the moment every local subscriber's bytes were
written to its socket (a callback queued after the writes of that loop
round). Messages that wait in a queue (offline or slow subscribers) are not
in it.
"""

import asyncio
import os
import resource
from time import perf_counter

from .counters import DROP_REASONS, TenantCounters

__all__ = ["DROP_REASONS", "TenantCounters", "Histogram", "LatencySampler", "LoopMonitor", "node_figures"]

LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
SAMPLE_MASK = 63                    # one in 64


class Histogram:
    __slots__ = ("bounds", "counts", "sum", "count")

    def __init__(self, bounds=LATENCY_BUCKETS):
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)       # the last one: above every bound
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        i = 0
        for bound in self.bounds:
            if value <= bound:
                break
            i += 1
        self.counts[i] += 1
        self.sum += value
        self.count += 1

    def cumulative(self) -> list[list]:
        """[[le, count of values <= le], ..., ["+Inf", count]]."""
        out, total = [], 0
        for bound, n in zip(self.bounds, self.counts, strict=False):
            total += n
            out.append([bound, total])
        out.append(["+Inf", self.count])
        return out

    def as_dict(self) -> dict:
        return {"buckets": self.cumulative(), "sum": round(self.sum, 6), "count": self.count}


class LatencySampler:
    """``broker.sampler``: counts PUBLISHes, times one in 64."""

    __slots__ = ("n", "loop", "histogram")

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.n = 0
        self.loop = loop
        self.histogram = Histogram()

    def start(self, now: float) -> None:
        """The sampled message is being dispatched: the callback runs after
        this round's socket writes. (``now``, the loop's time when its bytes
        were read, is too coarse under uvloop -- milliseconds, once per
        round -- so the clock is perf_counter from here.)"""
        self.loop.call_soon(self._done, perf_counter())

    def _done(self, t0: float) -> None:
        self.histogram.observe(max(0.0, perf_counter() - t0))


class LoopMonitor:
    """Event-loop lag: how late a 0.25 s timer fires; the worst of the last 5 s."""

    PERIOD = 0.25
    WINDOW = 20                     # periods

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.recent: list[float] = []
        self.max_ever = 0.0
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = self.loop.create_task(self._run(), name="loop-lag")

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _run(self) -> None:
        while True:
            t = self.loop.time()
            await asyncio.sleep(self.PERIOD)
            lag = max(0.0, self.loop.time() - t - self.PERIOD)
            self.recent.append(lag)
            if len(self.recent) > self.WINDOW:
                del self.recent[0]
            self.max_ever = max(self.max_ever, lag)

    @property
    def lag(self) -> float:
        return max(self.recent, default=0.0)


def process_stats() -> dict:
    """CPU seconds (user + system) and resident memory of this process."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    rss = 0
    try:
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        rss = ru.ru_maxrss * 1024
    fds = None
    try:
        fds = len(os.listdir("/proc/self/fd"))
    except OSError:
        pass
    return {"cpu_seconds": round(ru.ru_utime + ru.ru_stime, 3), "memory_rss": rss, "open_fds": fds}




def _totals(m: TenantCounters, channels, subs: int, queued: int, inflight: int, retained: int,
            connections_max: int) -> dict:
    msgs_in, msgs_out, bytes_in, bytes_out = m.msgs_in, m.msgs_out, m.bytes_in, m.bytes_out
    q1_in, q2_in, q1_out, q2_out = m.q1_in, m.q2_in, m.q1_out, m.q2_out
    for ch in channels:
        msgs_in += ch.msgs_in
        msgs_out += ch.msgs_out
        bytes_in += ch.bytes_in
        bytes_out += ch.bytes_out
        q1_in += ch.qos_in[1]
        q2_in += ch.qos_in[2]
        q1_out += ch.qos_out[1]
        q2_out += ch.qos_out[2]
    return {
        "connections": len(channels), "connections_max": connections_max,
        "connects": m.connects, "disconnects": m.disconnects,
        "messages_in": {"0": msgs_in - q1_in - q2_in, "1": q1_in, "2": q2_in},
        "messages_out": {"0": msgs_out - q1_out - q2_out, "1": q1_out, "2": q2_out},
        "bytes_in": bytes_in, "bytes_out": bytes_out,
        "dropped": {r: getattr(m, r) for r in DROP_REASONS},
        "auth_failures": m.auth_failures, "retained": retained,
        "subscriptions": subs, "queued": queued, "inflight": inflight,
    }


def add_totals(into: dict, t: dict) -> None:
    """Sum ``t`` into ``into`` (both TOTALS dicts); connections_max adds too (an upper bound)."""
    for key, value in t.items():
        if isinstance(value, dict):
            sub = into.setdefault(key, {})
            for k, v in value.items():
                sub[k] = sub.get(k, 0) + v
        elif isinstance(value, int | float) and not isinstance(value, bool):
            into[key] = into.get(key, 0) + value


def node_figures(server) -> dict:
    """This node's figures: TOTALS for the node and for each tenant, plus the process's."""
    b = server.broker
    tenants = {}
    node: dict = {}
    for f in b.router.all_figures():
        t = _totals(f.counters, f.live, f.subscriptions, f.queued, f.inflight, f.retained, f.counters.connections_max)
        tenants[f.name] = t
        add_totals(node, t)
    if not tenants:
        add_totals(node, _totals(TenantCounters(), (), 0, 0, 0, 0, 0))
    _rule_drops(server, tenants, node)
    st = b.stats
    node["connections_max"] = st.clients_max
    # the node's own drop counters also count what no tenant was known for
    node["dropped"] = {"queue_full": st.dropped_queue_full, "expired": st.dropped_expired,
                       "too_large": st.dropped_too_large, "no_subscribers": st.dropped_no_subscribers,
                       "acl_denied": st.denied_publish + st.denied_subscribe, "quota": st.quota_refused}
    node["auth_failures"] = st.auth_failures
    node["connects"] = st.connects
    node["disconnects"] = st.disconnects
    cluster = server.cluster
    lag = server.loop_monitor.lag if server.loop_monitor is not None else 0.0
    sampler = b.sampler
    node.update({
        "node": server.config.node_id,
        **(server.identity() if hasattr(server, "identity") else {}),   # host, worker (--workers)
        "health": "fenced" if cluster is not None and cluster.fenced else "ok",
        "uptime": round(server.loop.time() - b.started_at, 1),
        "loop_lag": round(lag, 6),
        "latency": sampler.histogram.as_dict() if sampler is not None else Histogram().as_dict(),
        **process_stats(),
        "store": store_stats(server),
        "tenants": tenants,
    })
    if getattr(server, "admin", None) is not None:
        node["admin"] = server.admin.http.as_dict()
    return node


def _rule_drops(server, tenants: dict, node: dict) -> None:
    """What the rules' actions dropped, per tenant: webhook requests and telemetry rows pushed out
    of their full buffers (the console raises an alarm while it grows). From the rules' counters: a
    rule edited since starts again from 0 (the console counts a fall as no drops)."""
    engine = getattr(server, "rule_engine", None)
    total = 0
    for slug, t in tenants.items():
        states = engine.states.get(slug, {}) if engine is not None else {}
        t["rule_actions_dropped"] = n = sum(s.dropped for s in states.values())
        total += n
    node["rule_actions_dropped"] = total


def store_stats(server) -> dict:
    """The session store's health, the writes it could never take (dropped, not retried) and
    those a fenced node gave up (``StoreWriter.abandon``)."""
    writer = getattr(server, "writer", None)
    if writer is None:
        return {"backend": server.config.store.split(":", 1)[0], "healthy": True, "error": None,
                "writes": 0, "writes_dropped": 0, "last_dropped": None, "writes_given_up": 0}
    journal = writer.journal
    return {"backend": writer.store.scheme, "healthy": journal.healthy, "error": journal.error,
            "writes": writer.ops_written, "writes_dropped": writer.dropped, "last_dropped": writer.last_dropped,
            "writes_given_up": writer.abandoned}
