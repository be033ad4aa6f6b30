"""Who is in the cluster, and the figures the nodes share (asyncio side).

A Redis key per node with a TTL, refreshed every second, holds what the
others need of it: its link address, its MQTT URLs, its admin API and the
server reference clients are sent to; a node whose key is gone is dead.
Each round also publishes this node's connections per tenant (tenant
connection quotas count every node) and its counters, and sums everyone's
for the cluster-wide ``$SYS`` tree -- and, for a worker of a host that runs
``--workers N``, its host's workers' (``host`` and ``worker`` in each node's
info) for the host's ``$SYS/broker`` tree. What a round's failure means is
``fencing.Fencing``'s to decide; what a departure means, ``node``'s.
"""

import time

from redis.exceptions import RedisError

from .bus import redacted
from .frames import FEATURES
from .ports import ClusterBroker, ClusterError, MemberBus, NodeAddresses

RATE_CLAIMS = "rate_claims"     # in a worker's figures per tenant: its claims on the tenant's rates (not summed)


class Membership:
    def __init__(self, node_id: str, bus: MemberBus, broker: ClusterBroker, addresses: NodeAddresses | None,
                 reference: str | None = None, wall=time.time, identity: dict | None = None, clock=time.monotonic):
        self.id = node_id
        self.clock = clock
        self.bus = bus
        self.broker = broker
        self.addresses = addresses
        self.reference = reference          # --server-reference: where clients are sent (v5 0x9C)
        self.wall = wall
        self.link_address = ""              # HOST:PORT of this node's link listener
        self.members: dict[str, dict] = {}  # the other live nodes -> their info
        self.stats_totals: dict[str, float] = {}
        # {"host": its host's --node-id, "worker": slot} of a worker (--workers), else {}
        self.identity = identity if identity and identity.get("worker") is not None else {}
        self.host_totals: dict[str, float] = {}    # a worker's host: its workers' figures summed
        self.extra_stats: dict[str, float] = {}    # a worker's gauges its $SYS round computed (sys_topics)
        self.host_tenants: dict[str, dict] = {}    # a worker's host: each tenant's figures over its workers

    def info(self) -> dict:
        a = self.addresses
        if a is None:
            return {"link": self.link_address, "mqtt": [], "admin": None, "ref": self.reference,
                    "started": self.wall(), "features": list(FEATURES), **self.identity}
        return {"link": a.advertised(self.link_address), "mqtt": a.mqtt_urls(), "admin": a.admin_address(),
                "ref": self.reference, "started": self.wall(), "features": list(FEATURES), **self.identity}

    async def join(self) -> None:
        try:
            self.members = await self.bus.members()
        except (RedisError, OSError) as exc:
            raise ClusterError(f"cannot reach the cluster bus {redacted(self.bus.url)}: {exc}") from None
        self.members.pop(self.id, None)

    async def poll(self) -> dict[str, dict]:
        """One heartbeat round: refresh this node's key, read who is there,
        share the figures; -> the other members (raises when the bus failed)."""
        await self.bus.heartbeat(self.info())
        members = await self.bus.members()
        members.pop(self.id, None)
        await self._publish_counts()
        return members

    def update(self, members: dict[str, dict]) -> set[str]:
        """The members a round read; -> the nodes that are gone."""
        gone = set(self.members) - set(members)
        self.members = members
        return gone

    async def look_up(self, node: str) -> bool:
        """Whether ``node`` is a member now (a node that just joined may be newer than this list)."""
        members = await self.bus.members()
        if node in members:
            self.members.setdefault(node, members[node])
            return True
        return False

    async def _publish_counts(self) -> None:
        local = self.broker.connection_counts()
        alive = set(self.members) | {self.id}
        totals = await self.bus.set_counts(local, alive)
        self.broker.remote_connections({t: totals[t] - local.get(t, 0) for t in totals})
        await self.bus.set_stats({**self.broker.node_stats(), **self.extra_stats})
        totals_stats: dict[str, float] = {}
        host = self.identity.get("host")
        siblings = {n for n, info in self.members.items() if host is not None and info.get("host") == host}
        host_stats: dict[str, float] = {}
        for node, stats in (await self.bus.all_stats()).items():
            if node not in alive:
                continue                # gone, not reaped (yet, or ever: the cluster restarted under new ids)
            for k, v in stats.items():
                # retained messages are copied to every node: the cluster holds them once
                totals_stats[k] = max(totals_stats.get(k, 0), float(v)) if k == "retained" else \
                    totals_stats.get(k, 0) + float(v)
                if node in siblings or (host is not None and node == self.id):
                    # retained messages are copied to every node: the host holds them once
                    host_stats[k] = max(host_stats.get(k, 0), float(v)) if k == "retained" else \
                        host_stats.get(k, 0) + float(v)
        totals_stats["nodes"] = len(self.members) + 1
        self.stats_totals = totals_stats
        self.host_totals = host_stats
        if host is not None:
            await self._host_tenants(host, siblings)

    async def _host_tenants(self, host: str, siblings: set) -> None:
        """Each tenant's figures summed over the host's workers (its tenant $SYS trees)."""
        figures_here = self.broker.tenant_stats()
        for tenant, claims in self.broker.rate_weights(self.clock()).items():
            figures_here.setdefault(tenant, {})[RATE_CLAIMS] = claims
        workers = await self.bus.set_host_tenants(host, figures_here)
        summed: dict[str, dict] = {}
        others: dict[str, int] = {}     # each tenant's connections on the other workers (its rates are the host's)
        claims: dict[str, dict[str, float]] = {}    # the other workers' claims on each tenant's rates, summed
        gone = []
        for node, tenants in workers.items():
            if node != self.id and node not in siblings:
                gone.append(node)       # (a worker that just joined and is not listed yet writes again)
                continue
            for tenant, figures in tenants.items():
                theirs = figures.pop(RATE_CLAIMS, None)
                if node != self.id:
                    if figures.get("connected"):
                        others[tenant] = others.get(tenant, 0) + figures["connected"]
                    for name, w in (theirs or {}).items():
                        into_claims = claims.setdefault(tenant, {})
                        into_claims[name] = into_claims.get(name, 0.0) + w
                into = summed.setdefault(tenant, {})
                for k, v in figures.items():
                    # retained messages are copied to every node: the host holds them once
                    into[k] = max(into.get(k, 0), v) if k == "retained" else into.get(k, 0) + v
        self.host_tenants = summed
        self.broker.host_shares(others, len(siblings) + 1, self.clock(), claims)
        await self.bus.drop_host_tenants(host, gone)

    def other_node_url(self, scheme: str = "mqtt") -> str | None:
        """Where to send clients this node lets go: another host (this host's
        other workers share its listeners, and stop with it)."""
        host = self.identity.get("host")
        for info in self.members.values():
            if host is not None and info.get("host") == host:
                continue
            if info.get("ref") and scheme == "mqtt":
                return info["ref"]
            for url in info.get("mqtt", ()):
                if url.startswith(scheme + "://"):
                    return url.split("://", 1)[1].split("/", 1)[0]
        return None
