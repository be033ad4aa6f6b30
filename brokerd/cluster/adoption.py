"""Sessions no live node holds: a dead node's, adopted by one survivor (asyncio side).

When a node's membership expires (or it left gracefully), one survivor --
the one that wins a key on the bus -- loads each stored session the dead
node held, under the client id's lock as a CONNECT would, so that they go
on receiving messages; it publishes the wills of the dead node's connected
clients (unless it left gracefully), once, and announces "gone". Until
then the dead node's routes to stored sessions are kept and QoS 1/2
messages for them refused (``forwarding``): the publisher is told and sends
again rather than being acknowledged for nobody -- for ORPHAN_TIMEOUT at
most without word of the adoption: the survivor adopting says "reaping"
every REAP_PROGRESS seconds while it goes on (a node of 100,000 stored
sessions takes minutes; before, the others stopped refusing after
ORPHAN_TIMEOUT whatever the survivor was doing, and a message for a session
not adopted yet was then acknowledged for nobody). A node joining a cluster
also adopts the stored sessions no live node holds (the whole cluster was
down, or Redis lost its registry), and a node started again under the id of
a run that died unseen (within the membership's TTL) takes up that run's
sessions and wills itself (``former_run``, ``take_up``): no survivor reaps it.
"""

import asyncio
import logging
import os
import time
from typing import Protocol

from ..store.records import unpack_will
from .ports import Clock, ClusterBroker, ReapBus, SessionStore
from .routes import ClusterRoutes

log = logging.getLogger("brokerd.cluster")

# how long messages for a dead node's sessions are refused awaiting word of their adoption (the same on every node)
ORPHAN_TIMEOUT = float(os.environ.get("BROKERD_ORPHAN_TIMEOUT", "30"))
REAP_PROGRESS = ORPHAN_TIMEOUT / 3     # the adopting survivor says "reaping" this often while it goes on
REAP_AT_ONCE = 32        # a dead node's sessions adopted at once (3,000 on sqlite: 3.1 s one by one, 1.8 s)
# seconds a client id's lock is waited for, and lives, while its session is adopted: kept alive every third
# of it until the session is loaded and claimed (a batch's reads wait for each other on the store: on a slow
# one the last of them came after the lock lapsed -- a CONNECT elsewhere took the session meanwhile, and this
# node loaded and claimed it as well: the session lived on two nodes)
REAP_LOCK = float(os.environ.get("BROKERD_REAP_LOCK", "30"))
ORPHANS_LEASE = 60       # seconds the "orphans" lease is held at a time (renewed while the walk goes on)
ORPHANS_PAGE = 1000      # stored sessions' keys read, and their owners asked of Redis, at a time


class SessionLoader(Protocol):
    async def load(self, tenant: str, cid: str, wills: bool = True, still_ours=None) -> bool: ...


class EventQueue(Protocol):
    def queue_event(self, e: dict) -> None: ...

    async def back(self) -> None:
        """This node's routes, all of them, in one "back" event (after ``Adoption.take_up``)."""


class Adoption:
    def __init__(self, node_id: str, bus: ReapBus, routes: ClusterRoutes, broker: ClusterBroker,
                 sessions: SessionLoader, store: SessionStore | None, events: EventQueue, members_of,
                 clock: Clock):
        self.id = node_id
        self.bus = bus
        self.routes = routes
        self.broker = broker
        self.sessions = sessions
        self.store = store
        self.events = events
        self.members_of = members_of            # () -> the other members
        self.clock = clock
        self.orphaned: dict[str, float] = {}     # dead node -> until when its sessions await adoption

    # ------------------------------------------------- what the others say

    def awaiting(self, node: str) -> None:
        """``node`` is gone; its stored sessions await a survivor (their routes kept, their messages refused)."""
        if self.routes.drop_node(node, keep_durable=True):
            self.orphaned[node] = self.clock() + ORPHAN_TIMEOUT

    def reaping(self, node: str) -> None:
        """A survivor is still adopting ``node``'s sessions: go on refusing their messages."""
        if node in self.orphaned:
            self.orphaned[node] = self.clock() + ORPHAN_TIMEOUT

    def settled(self, node: str) -> None:
        """``node``'s sessions were adopted (or it rejoined): nothing of it awaits any more."""
        self.routes.drop_node(node)
        self.orphaned.pop(node, None)

    def alive(self, members) -> None:
        """These nodes are members (back, restarted: each announces its routes afresh)."""
        for node in members:
            self.orphaned.pop(node, None)

    def expire(self, now: float) -> None:
        for node, until in list(self.orphaned.items()):
            if until < now:                  # nobody announced an adoption: stop refusing
                log.warning("no node announced adopting the sessions of node %s", node)
                self.routes.drop_node(node)
                del self.orphaned[node]

    # ------------------------------------------------------------ adopting

    async def reap(self, node: str) -> None:
        """Adopt the stored sessions of a node that is gone (one survivor does)."""
        try:
            if not await self.bus.reap(node):
                return                   # another survivor does it (and announces it)
        except Exception:
            log.exception("adopting the sessions of node %s failed", node)
            return
        progress = None
        try:
            graceful = await self.bus.left_gracefully(node)
            adopted = failed = 0
            owned = await self.bus.owned(node)
            progress = asyncio.ensure_future(self._say_reaping(node))
            for start in range(0, len(owned), REAP_AT_ONCE):
                # a few at once: each is mostly waiting for Redis and the store
                done = await asyncio.gather(*(self._adopt(node, tenant, cid, graceful)
                                              for tenant, cid in owned[start:start + REAP_AT_ONCE]),
                                            return_exceptions=True)
                for r in done:
                    if isinstance(r, BaseException):
                        if isinstance(r, asyncio.CancelledError):
                            raise r
                        failed += 1
                        if failed == 1:
                            log.error("adopting a session of node %s failed: %s", node, r)
                    elif r:
                        adopted += 1
            wills = 0
            if not graceful:
                now = self.clock()
                for tenant, cid, blob in await self.bus.take_wills(node):
                    will = unpack_will(blob)
                    if will is not None:
                        self.broker.publish_gone_will(tenant, cid, will, now)
                        wills += 1
            await self.bus.forget_node(node)
            log.warning("adopted %d sessions of node %s%s%s", adopted, node,
                        "" if graceful else f", published {wills} wills of its clients",
                        f" ({failed} failed: adopted by the next CONNECT of each or a node joining)" if failed else "")
        except Exception:
            log.exception("adopting the sessions of node %s failed", node)
        finally:
            if progress is not None:
                progress.cancel()
            self.settled(node)
            self.events.queue_event({"t": "gone", "n": self.id, "of": node})

    async def former_run(self) -> tuple | None:
        """Joining: a former run of this node id that died (SIGKILL) was not seen gone by the others when
        this one joined within its membership's TTL (a service manager's restart), and no survivor reaps
        it -- unless one saw it gone and holds the reap key. Then this node takes up what it held (``take_up``):
        -> (graceful, its stored sessions, its clients' wills), read now, before any client of this run
        registers its own; None when there is nothing to take up (called before ``forget_former``)."""
        if not await self.bus.reap(self.id):
            return None                          # a survivor adopts it (or did)
        graceful = await self.bus.left_gracefully(self.id)
        owned = await self.bus.owned(self.id)
        wills = [] if graceful else await self.bus.take_wills(self.id)
        if not owned and not wills:
            return None
        # until they are loaded, a message another node forwards here for them is refused (``forwarding``)
        self.orphaned[self.id] = float("inf")
        return graceful, owned, wills

    async def take_up(self, former: tuple) -> None:
        """The former run's stored sessions, loaded here as a survivor would adopt them (those a CONNECT
        loaded meanwhile left as they are), and its clients' wills published (the cluster attached)."""
        graceful, owned, wills = former
        adopted = 0
        progress = asyncio.ensure_future(self._say_reaping(self.id))   # the others go on refusing meanwhile
        try:
            for start in range(0, len(owned), REAP_AT_ONCE):
                done = await asyncio.gather(*(self._adopt(self.id, tenant, cid, graceful)
                                              for tenant, cid in owned[start:start + REAP_AT_ONCE]),
                                            return_exceptions=True)
                adopted += sum(1 for r in done if r is True)
                for r in done:
                    if isinstance(r, BaseException):
                        log.error("taking up a session of this node's former run failed: %s", r)
            now = self.clock()
            for tenant, cid, blob in wills:
                will = unpack_will(blob)
                if will is not None:
                    self.broker.publish_gone_will(tenant, cid, will, now)
            log.warning("took up %d sessions of this node's former run%s", adopted,
                        "" if graceful else f", published {len(wills)} wills of its clients")
        finally:
            progress.cancel()
            self.orphaned.pop(self.id, None)
            await self.events.back()

    async def _say_reaping(self, node: str) -> None:
        """While this node adopts ``node``'s sessions: the others (and this one) go on refusing
        messages for those not adopted yet."""
        while True:
            await asyncio.sleep(REAP_PROGRESS)
            self.reaping(node)
            self.events.queue_event({"t": "reaping", "n": self.id, "of": node})

    async def _adopt(self, node: str, tenant: str, cid: str, graceful: bool) -> bool:
        """One of dead ``node``'s sessions, under its client id's lock as a CONNECT would take it (kept
        alive while it waits: the store reads of the sessions adopted at once wait for each other)."""
        token = await self.bus.lock(tenant, cid, REAP_LOCK)
        keeper = asyncio.ensure_future(self._keep_lock(tenant, cid, token)) if token else None

        async def still_locked() -> bool:
            # once the session is read: the lock kept REAP_LOCK more for the restore and the claim -- or,
            # lapsed all the same (Redis lost it, keeping it failed), the session is left to whoever holds
            # the id now (a CONNECT elsewhere may have taken it meanwhile: loaded here too, it would live
            # on two nodes)
            if token is None or await self.bus.keep_lock(tenant, cid, token, REAP_LOCK):
                return True
            log.warning("the lock of %s/%s lapsed while its session was read: not adopted here", tenant, cid)
            return False

        try:
            if await self.bus.owner(tenant, cid) != node or (node == self.id and self.broker.holds(tenant, cid)):
                return False            # (this node's former run's: a CONNECT here loaded it meanwhile)
            if await self.sessions.load(tenant, cid, wills=not graceful, still_ours=still_locked):
                await self.bus.claim(tenant, cid, True, node)
                return True
            return False
        finally:
            if keeper is not None:
                keeper.cancel()
            if token:
                await self.bus.unlock(tenant, cid, token)

    async def _keep_lock(self, tenant: str, cid: str, token: str) -> None:
        while True:
            await asyncio.sleep(REAP_LOCK / 3)
            try:
                if not await self.bus.keep_lock(tenant, cid, token, REAP_LOCK):
                    log.warning("the lock of %s/%s lapsed while its session was being adopted", tenant, cid)
                    return
            except Exception as exc:
                log.warning("the lock of %s/%s not kept while its session is adopted: %s", tenant, cid, exc)

    async def adopt_orphans(self) -> None:
        """Stored sessions no live node holds (the whole cluster was down, or
        Redis lost its registry) come here, so that messages for them are
        queued again -- one node at a time does this check.

        The store's session keys are walked a page at a time (``ORPHANS_PAGE``),
        their owners asked of Redis in one round trip a page; only a session no
        live node holds is locked, loaded (with its queue) and claimed. The
        lease is renewed as the walk goes (it may outlast ``ORPHANS_LEASE``)."""
        store = self.store
        if store is None or not store.durable:
            await self.bus.registry_complete()          # nothing is stored: nothing can be missing
            return
        if not await self.bus.try_lease("orphans", ORPHANS_LEASE):
            return
        lease = _Lease(self.bus, "orphans")
        adopted = 0
        whole = False                                   # the walk went over every stored session
        try:
            after = None
            while await lease.keep():
                keys = await store.session_keys(after, ORPHANS_PAGE)
                if not keys:
                    whole = True
                    break
                after = keys[-1]
                alive = set(self.members_of()) | {self.id}
                cut = False                             # the lease went to another node midway
                for (tenant, cid), owner in zip(keys, await self.bus.owners(keys), strict=True):
                    if owner in alive:
                        continue
                    if not await lease.keep():
                        cut = True
                        break
                    if await self._adopt_orphan(tenant, cid, alive):
                        adopted += 1
                if cut:
                    break
                if len(keys) < ORPHANS_PAGE:
                    whole = True
                    break
            if adopted:
                log.warning("adopted %d stored sessions no live node held", adopted)
            if whole:
                # every stored session has a record in the registry now: a Clean Start of a client id it
                # calls free need not look in the store (``takeover``), until Redis loses this key with it
                await self.bus.registry_complete()
        finally:
            if lease.held:
                await self.bus.drop_lease("orphans")

    async def _adopt_orphan(self, tenant: str, cid: str, alive: set) -> bool:
        # under the client id's lock, as a CONNECT would take it
        token = await self.bus.lock(tenant, cid)
        try:
            owner = await self.bus.owner(tenant, cid)
            if owner in alive:
                return False
            rec = await self.store.load_session(tenant, cid)
            if rec is None:                      # deleted since it was listed
                return False
            self.broker.restore_sessions([rec], self.clock())
            await self.bus.claim(tenant, cid, True, owner)
            return True
        finally:
            if token:
                await self.bus.unlock(tenant, cid, token)


class _Lease:
    """The ``orphans`` lease while the walk goes on: renewed once a third of it has passed
    (real time: Redis expires it); ``held`` False once another node has it."""

    def __init__(self, bus: ReapBus, name: str):
        self.bus = bus
        self.name = name
        self.held = True
        self.renewed = time.monotonic()

    async def keep(self) -> bool:
        if self.held and time.monotonic() - self.renewed >= ORPHANS_LEASE / 3:
            self.held = await self.bus.renew_lease(self.name, ORPHANS_LEASE)
            self.renewed = time.monotonic()
            if not self.held:
                log.warning("the %s lease went to another node: this node stops adopting orphaned sessions",
                            self.name)
        return self.held
