"""A brokerd node in a cluster: the parts wired together (asyncio side; the broker stays pure).

Each part does one job and names its collaborators in a ``typing.Protocol``
(``ports`` and the part's own module); this module builds them, runs their
asyncio tasks, and hands each frame from a link to the part it is for.

============================  =================================================
``membership.Membership``     who is in the cluster (a Redis key per node with
                              a TTL, refreshed every second), the figures the
                              nodes share
``announce.Announcer``        this node's routes, out on the event log
``eventlog.EventLog``         the others' events in (routes, nodes that left or
                              were adopted, retained messages); the route
                              snapshot, loaded and compacted
``routes.ClusterRoutes``      the whole route table (pure)
``peers.Peers``               the links to the other nodes (``link.Link``)
``requests.Requests``         what this node asked of others, until answered,
                              late or lost
``forwarding.Forwarder``      messages out to the nodes that want them, and in
``takeover.Takeover``         a CONNECT claims its client id, taking its
                              session over from the node that held it
``handoff.Handoff``           a stored session on the move, no message lost,
                              doubled or reordered
``adoption.Adoption``         a dead node's sessions and wills, orphans
``fencing.Fencing``           a node cut off from Redis lets go before the
                              others take over
============================  =================================================

The clock is passed in: ``clock()`` (the loop's in production) is the only
time the parts read, and timeouts are deadlines a timer round (every 0.5 s)
or an armed timer (a request's answer) compares with ``now``.
"""

import asyncio
import logging

from . import frames
from .adoption import Adoption
from .announce import Announcer
from .eventlog import COMPACT_EVERY, EventLog, retain_event
from .fencing import Fence, Fencing
from .forwarding import Forwarder
from .handoff import Handoff, handoff_of
from .membership import Membership
from .peers import LinkSettings, Peers
from .ports import Clock, ClusterBroker, ClusterBus, ClusterError, NodeAddresses, SessionStore, StoreDrain
from .requests import ANSWER, RELEASE, Requests
from .routes import ClusterRoutes
from .sessions import SessionLoader
from .takeover import Takeover

__all__ = ["ClusterError", "ClusterNode"]

log = logging.getLogger("brokerd.cluster")

HEARTBEAT = 1.0          # seconds between membership refreshes
TIMER_ROUND = 0.5        # seconds between rounds of deadlines (links, ACKs, holders, orphans)
# seconds between the starts of two reads of the event log, at the least: when the other nodes' route
# rounds come one after another (a connect storm on several workers), a read takes what came in the
# meantime from all of them in one call instead of one call per entry (with 6 workers, 15,000 CONNECTs
# were 5,215 reads); a read after a quiet spell is not delayed
READ_GAP = 0.01


class ClusterNode:
    """``ports.Cluster``: what the broker, the server, the admin API and ``$SYS`` call.

    ``forward`` and ``wait_for`` run per message: they are the forwarder's and
    the requests' own methods, bound here (no call in between).
    """

    def __init__(self, node_id: str, bus: ClusterBus, broker: ClusterBroker, *, loop, clock: Clock,
                 links: LinkSettings | None = None, peers=None, store: SessionStore | None = None,
                 writer: StoreDrain | None = None, addresses: NodeAddresses | None = None,
                 reference: str | None = None, flusher=None, budget=None, identity: dict | None = None):
        self.id = node_id
        self.bus = bus
        self.broker = broker
        self.loop = loop
        self.clock = clock
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self.requests = Requests()              # start() arms a timer for its deadlines
        self.routes = ClusterRoutes(node_id)
        self.membership = Membership(node_id, bus, broker, addresses, reference, identity=identity, clock=clock)
        members_of = self._members_of
        self.peers = peers if peers is not None else Peers(node_id, links, loop, clock, flusher, budget)
        send = self.peers.send
        self.fence = fence = Fence()
        self.announcer = Announcer(node_id, bus, broker, fence)
        self.sessions = SessionLoader(store, broker, self.announcer, clock)
        self.adoption = Adoption(node_id, bus, self.routes, broker, self.sessions, store, self.announcer,
                                 members_of, clock)
        self.eventlog = EventLog(node_id, bus, self.routes, broker, store, self.adoption, fence, self.announcer,
                                 members_of)
        self.handoff = Handoff(node_id, self.requests, send, self.announcer, self.routes, broker, members_of,
                               self.eventlog, fence, clock)
        self.eventlog.applied = self.handoff.answer_syncs
        self.eventlog.switched = self.handoff.switched
        self.forwarding = Forwarder(node_id, self.routes, self.requests, send, self.handoff,
                                    self.adoption.orphaned, broker, fence, clock)
        self.takeover = Takeover(node_id, bus, broker, self.sessions, self.handoff, self.announcer,
                                 self.requests, send, members_of, writer, fence, clock, loop.create_task)
        self.fencing = Fencing(node_id, fence, bus, broker, writer, self.membership, self.eventlog, self.handoff,
                               self.requests, self.announcer, clock)
        # per message: straight to the part that does it
        self.forward = self.forwarding.forward
        self.redeliver = self.forwarding.redeliver      # a shared group's message its member left: to another
        # what the broker reads per message before calling forward at all (Broker.publish): the
        # tenants with routes on other nodes, and those with sessions moving through this node
        self.remote_tenants = self.routes.tenants
        self.moving = self.handoff.moving
        self.wait_for = self.requests.wait_for
        self._on_publish = self.forwarding.on_publish
        self.peers.attach(self)
        self._tasks: list[asyncio.Task] = []
        self._former = None                     # what a former run of this id held (``Adoption.former_run``)

    # ======================================================= what others read

    @property
    def fenced(self) -> bool:
        return self.fence.fenced

    @property
    def members(self) -> dict[str, dict]:
        return self.membership.members

    def _members_of(self) -> dict[str, dict]:
        return self.membership.members

    @property
    def stats_totals(self) -> dict[str, float]:
        return self.membership.stats_totals

    @property
    def host_totals(self) -> dict[str, float]:
        """This host's figures (its workers' summed; {} unless it runs --workers)."""
        return self.membership.host_totals

    @property
    def last_event(self) -> str:
        return self.eventlog.last_event

    def other_node_url(self, scheme: str = "mqtt") -> str | None:
        return self.membership.other_node_url(scheme)

    # ============================================================ broker calls

    def route_dirty(self, tenant: str, filt: str) -> None:
        self.announcer.route_dirty(tenant, filt)

    def retained_changed(self, tenant: str, msg) -> None:
        """A client set or cleared a retained message here: every node keeps a copy."""
        if msg.topic.startswith("$SYS/"):
            return
        self.announcer.queue_event(retain_event(self.id, tenant, msg, self.broker.wall_offset))

    def claim(self, channel, tenant: str, cid: str, clean_start: bool, will, cont, live_only: bool = False) -> None:
        self.takeover.claim(channel, tenant, cid, clean_start, will, cont, live_only)

    def client_gone(self, tenant: str, cid: str, ended: bool, had_will: bool) -> None:
        self.takeover.client_gone(tenant, cid, ended, had_will)

    # ================================================================= start

    async def start(self) -> None:
        await self.join()
        self.requests.wake = self._arm
        for coro, name in ((self._heartbeat_loop(), "cluster-heartbeat"), (self._event_loop(), "cluster-events"),
                           (self.announcer.run(), "cluster-announce"), (self._compact_loop(), "cluster-compact"),
                           (self._timer_loop(), "cluster-timeouts")):
            self._tasks.append(self.loop.create_task(coro, name=name))
        if self._former is not None:
            # (a task: it runs once the server attached the cluster -- the wills go to every node)
            self._tasks.append(self.loop.create_task(self.adoption.take_up(self._former), name="cluster-former"))
            self._former = None
        log.info("node %s joined the cluster (%d other nodes, link %s)", self.id, len(self.members),
                 self.membership.link_address)

    async def join(self) -> None:
        """Listen for links, join the membership, load the route table, say
        "reset", adopt orphans, mark every local route to be announced --
        without the tasks and timers (``start`` adds them; a unit test drives
        ``heartbeat``, ``tick``, ``eventlog.read`` and ``announcer.flush``)."""
        self.membership.link_address = await self.peers.start()
        await self.membership.join()
        await self.eventlog.load_snapshot()
        await self.bus.heartbeat(self.membership.info())
        # what a former run of this id held, if it died unseen (``start`` takes it up once attached)
        self._former = await self.adoption.former_run()
        # a former node of this id that died was adopted once (reap:), or left gracefully (left:): this one
        # is a member now, and when it dies a survivor adopts it and publishes its wills -- a host's
        # workers take the same ids each time it starts, and those keys lived an hour
        await self.bus.forget_former()
        # anything a former incarnation of this node announced is void -- but the routes to the stored sessions
        # of one that died unseen, which this node takes up: the others refuse their messages until it says
        # "back" with its own routes (``start``)
        await self.bus.publish_events([{"t": "reset", "n": self.id, "keep": 1} if self._former else
                                       {"t": "reset", "n": self.id}])
        await self.adoption.adopt_orphans()
        self.announcer.all_dirty()

    async def stop(self, graceful: bool = True) -> None:
        """Leave the cluster: routes withdrawn, sessions left for adoption."""
        for t in self._tasks:
            t.cancel()
        pending = set(self._tasks)
        while pending:
            _, pending = await asyncio.wait(pending, timeout=0.5)
            for t in pending:
                t.cancel()          # again: Python 3.11's wait_for (redis-py's writes) can swallow a cancel
        for t in self._tasks:
            if not t.cancelled():
                t.exception()       # retrieved: nothing is logged for a task that failed as it stopped
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if graceful and not self.fenced:
            try:
                # its persistent sessions await adoption: the others refuse their messages meanwhile
                await self.bus.publish_events([{"t": "reset", "n": self.id, "keep": 1}])
                await self.bus.leave()
            except Exception as exc:
                log.warning("could not announce leaving the cluster: %s", exc)
        self.peers.close()
        await self.bus.close()

    # ================================================================= tasks

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT)
            await self.heartbeat()

    async def heartbeat(self) -> None:
        """One membership round: fence when the bus has been out of reach too
        long, rejoin when it is back, and let go of the nodes that are gone."""
        fencing = self.fencing
        try:
            members = await self.membership.poll()
        except Exception as exc:
            if fencing.lost(self.clock()):
                await fencing.fence(exc)
            return
        fencing.reached(self.clock())
        if fencing.fenced:
            await fencing.unfence()
        gone = self.membership.update(members)
        self.adoption.alive(members)
        for node in gone:
            self._node_gone(node)

    def _node_gone(self, node: str) -> None:
        """A node's membership expired. Its persistent sessions wait for a
        survivor to adopt them (``adoption``)."""
        log.warning("node %s left the cluster", node)
        self.adoption.awaiting(node)
        self.peers.drop(node)
        self.requests.fail(node)
        self.loop.create_task(self.adoption.reap(node))

    async def _event_loop(self) -> None:
        started = -READ_GAP
        while True:
            wait = started + READ_GAP - self.loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            started = self.loop.time()
            try:
                if await self.eventlog.read(block_ms=1000):
                    started = -READ_GAP         # behind (a full read): the rest at once
            except asyncio.CancelledError:
                raise
            except Exception:
                await asyncio.sleep(0.5)

    async def _compact_loop(self) -> None:
        """Now and then one node writes the route table as a snapshot to the
        store and trims the event log to the previous snapshot's position."""
        while True:
            await asyncio.sleep(COMPACT_EVERY)
            await self.eventlog.compact()

    async def _timer_loop(self) -> None:
        while True:
            await asyncio.sleep(TIMER_ROUND)
            self.tick(self.clock())

    def tick(self, now: float) -> None:
        """Deadlines: quiet links pinged, dead ones closed; holders whose
        session did not come flushed; requests unanswered failed; orphans no
        one adopted let go; refused TAKEOVERs summed up in the log."""
        self.peers.tick(now)
        self.handoff.expire(now)
        self.requests.expire(now)
        self.adoption.expire(now)
        self.takeover.refusals.tick(now)

    def _arm(self, deadline: float) -> None:
        """A request waits for its answer until ``deadline`` (the loop's clock):
        the timer is armed for the earliest such deadline."""
        if self._timer is not None and self._timer_at <= deadline:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = deadline
        self._timer = self.loop.call_at(deadline, self._on_timer)

    def _on_timer(self) -> None:
        at, self._timer = self._timer_at, None
        # armed for ``at``, it fired there (uvloop rounds a timer to the millisecond, either way)
        self.requests.expire(max(self.clock(), at))
        deadline = self.requests.next_deadline()
        if deadline is not None:
            self._arm(deadline)

    # =============================================================== links

    def peer_lost(self, node: str) -> None:
        """This node's link to ``node`` failed or closed: what it asked there fails."""
        self.requests.fail(node)

    async def look_up_member(self, node: str) -> bool:
        return await self.membership.look_up(node)

    def on_frame(self, link, f: tuple) -> None:
        """A frame from an authenticated link. An answer counts only on a link
        from the node it was asked of: ids are a counter, easy to guess."""
        kind = f[0]
        if kind == frames.PUBLISH:
            self._on_publish(link, *f[1:])
        elif kind == frames.ACK:
            self.requests.acked(f[1], link.peer, f[2] == 0)
        elif kind == frames.TAKEOVER:
            link.request_started()          # done once its lock is checked: the link is read meanwhile
            self.loop.create_task(self.takeover.on_takeover(link, f[1], f[2], f[3], link.request_done,
                                                            bool(f[4] & frames.LIVE_ONLY)))
        elif kind == frames.RELEASED:
            self.requests.answered(RELEASE, f[1], link.peer, f[2])
        elif kind == frames.HANDOFF:
            fields = handoff_of(f[2])
            if fields is None:
                link.fail(f"HANDOFF that is not one: {f[2][:40]!r}")
            else:
                self.loop.create_task(self.handoff.on_handoff(link, f[1], *fields))
        elif kind in (frames.HOLDING, frames.SYNCED):
            self.requests.answered(ANSWER, f[1], link.peer, f[2])
        elif kind == frames.SYNC:
            if not self.handoff.on_sync(link.peer, f[1], f[2]):
                link.fail(f"SYNC for {f[2][:40]!r}, which is no event id")
        else:
            link.fail(f"unexpected frame of type {kind}")

