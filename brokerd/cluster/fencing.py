"""A node cut off from the bus fences itself before the others adopt its sessions.

The others declare a node dead when its membership key expires (the bus's
``ttl``, 5 s). A node that cannot reach the bus for longer than ``ttl`` -
1.5 s -- before that can happen -- disconnects its clients (v5: 0x9C Use
another server, with another node's address; else 0x8B), writes what it
owes, lets go of every session and every other node's routes, fails what it
waits for, and refuses new CONNECTs (0x88 / 3, ``takeover``) until the bus
answers again; then it says "reset" (whatever it announced is void),
reloads the route table and rejoins. A netsplit never leaves two nodes
holding one session.

It writes what it owes only until the others may adopt its sessions (its
key expires ``ttl`` after the last round that refreshed it; ``HANDOVER``
before that): what its store has not taken by then -- cut off from the
store too, or the store stalled -- is given up (``StoreWriter.abandon``),
never written over what the adopting node writes of those sessions.
Publishers that waited for it were told already (negative acks); an
acknowledged delivery whose removal is given up is sent again (QoS 1/2
redelivery, DUP). (A node cannot tell a netsplit from a Redis outage: if
Redis is down for everyone, every node fences until it is back.)

The decision takes ``now`` (``lost``, ``reached``): a unit test drives it
with a fake clock.
"""

import logging
from typing import Protocol

from ..protocol import reason as rc
from .ports import Clock, ClusterBroker, EventBus, StoreDrain

log = logging.getLogger("brokerd.cluster")

MARGIN = 1.5            # seconds before the others would declare this node dead that it fences itself
HANDOVER = 0.5          # seconds before they would that its store writes are given up


class Fence:
    """Whether this node is fenced off the cluster: read by every part (a
    plain attribute, read per message), written by ``Fencing`` only."""

    __slots__ = ("fenced",)

    def __init__(self):
        self.fenced = False


class FenceBus(EventBus, Protocol):
    ttl: float

    async def forget_former(self) -> None: ...


class OtherNodes(Protocol):
    def other_node_url(self, scheme: str = "mqtt") -> str | None: ...


class RouteTable(Protocol):
    """The other nodes' routes (``eventlog.EventLog``)."""

    def drop_all(self) -> None: ...

    async def reload(self) -> None: ...


class Arrivals(Protocol):
    """Sessions on the move (``handoff.Handoff``)."""

    def abort(self) -> None: ...


class Pending(Protocol):
    """Requests to other nodes (``requests.Requests``)."""

    def fail(self, node: str | None) -> None: ...


class Announced(Protocol):
    """What this node announced (``announce.Announcer``)."""

    def forget(self) -> None: ...


class Fencing:
    def __init__(self, node_id: str, state: Fence, bus: FenceBus, broker: ClusterBroker,
                 writer: StoreDrain | None, others: OtherNodes, table: RouteTable, arrivals: Arrivals,
                 pending: Pending, announced: Announced, clock: Clock):
        self.id = node_id
        self.state = state
        self.bus = bus
        self.broker = broker
        self.writer = writer
        self.others = others
        self.table = table
        self.arrivals = arrivals
        self.pending = pending
        self.announced = announced
        self.clock = clock
        self.last_ok = clock()                  # when the bus last answered a heartbeat round

    @property
    def fenced(self) -> bool:
        return self.state.fenced

    # ------------------------------------------------------------ decisions

    def lost(self, now: float) -> bool:
        """A heartbeat round failed at ``now``: must this node fence itself?"""
        return not self.fenced and now - self.last_ok > self.bus.ttl - MARGIN

    def reached(self, now: float) -> None:
        """A heartbeat round succeeded at ``now``."""
        self.last_ok = now

    # -------------------------------------------------------------- actions

    async def fence(self, exc) -> None:
        self.state.fenced = True
        log.error("lost the cluster bus (%s): this node fences itself -- clients go to other nodes, "
                  "sessions are left to them, new CONNECTs refused until it is back", exc)
        now = self.clock()
        ref = self.others.other_node_url()
        code = rc.USE_ANOTHER_SERVER if ref else rc.SERVER_SHUTTING_DOWN
        self.broker.disconnect_clients(code, "this node lost the cluster", now, ref)
        writer = self.writer
        if writer is not None:
            left = self.last_ok + self.bus.ttl - HANDOVER - self.clock()
            if left <= 0 or not await writer.drain(left):
                given = writer.abandon()
                if given:
                    log.error("the session store did not take %d writes before the other nodes may adopt "
                              "this node's sessions: given up, never written after them (the sessions are "
                              "theirs as the store has them)", given)
        self.broker.drop_all_sessions()
        self.table.drop_all()
        self.arrivals.abort()
        self.pending.fail(None)

    async def unfence(self) -> None:
        log.warning("cluster bus reachable again: node %s rejoins", self.id)
        # a survivor adopted this node while it was cut off (reap:): when it dies, it is adopted again
        await self.bus.forget_former()
        await self.bus.publish_events([{"t": "reset", "n": self.id}])
        self.announced.forget()
        await self.table.reload()
        self.state.fenced = False
        log.warning("node %s rejoined the cluster: accepting connections again", self.id)
