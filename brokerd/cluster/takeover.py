"""Client ids across the cluster: a CONNECT claims its client id, taking the
session over from the node that holds it (asyncio side).

A Redis hash maps each client id to the node that holds its session (the
registry), and a short lock on the client id serialises CONNECTs. A CONNECT
for a session held elsewhere asks that node for it (TAKEOVER): that node
disconnects the old connection (0x8E), writes what it still owes to the
store and lets go (RELEASED) -- handing the session's messages over on the
way (``handoff.Handoff``) -- and this node loads the session from the
store. A node hands a session over only to the node that holds its client
id's lock. A client without a stored session registers its will, which a
survivor publishes should this node die (``adoption``).
"""

import asyncio
import logging
from functools import partial
from typing import Protocol

from ..protocol import reason as rc
from ..store.records import pack_will
from . import frames
from .announce import Announcer
from .handoff import RELEASE_TIMEOUT, Handoff
from .ports import ClaimingChannel, ClientBus, Clock, ClusterBroker, FenceState, StoreDrain
from .requests import LATE, LOST, RELEASE, Requests, ask

log = logging.getLogger("brokerd.cluster")

CONNECTING = 1           # protocol.channel's state of a connection whose CONNECT is being handled
# a RELEASED frame's code: released; the session was not here; refused (the asker does not hold the id's
# lock); released or not here, but not all this node wrote of it is in the store yet; not connected here,
# nothing let go (asked ``LIVE_ONLY``)
RELEASED, NOT_HERE, REFUSED, NOT_WRITTEN, NOT_LIVE = 0, 1, 2, 3, 4
WRITES_WAIT = RELEASE_TIMEOUT - 2.0      # seconds the old node waits for its writes: it answers in the asker's time


# seconds between two log lines of the TAKEOVERs refused from one node: the first is logged at once, the
# ones after it counted and summed up in one line per node this often (a member sending them without end
# wrote a line for each, as fast as it sent)
REFUSALS_LOG_EVERY = 5.0


class RefusalLog:
    """The TAKEOVERs refused from each node, in the log: the first at once,
    the rest in one line per node every ``REFUSALS_LOG_EVERY`` seconds
    (``tick``, from the node's timer round)."""

    def __init__(self):
        self.since: dict[str, float] = {}     # node -> when its last line was logged
        self.counts: dict[str, int] = {}      # node -> refusals since, not logged yet
        self.last: dict[str, tuple] = {}      # node -> (tenant, client id) of the last of them

    def refused(self, node: str, tenant: str, cid: str, now: float) -> None:
        if node not in self.since:
            log.warning("takeover of %s/%s refused: node %s does not hold the client id's lock", tenant, cid, node)
            self.since[node] = now
            return
        self.counts[node] = self.counts.get(node, 0) + 1
        self.last[node] = (tenant, cid)

    def tick(self, now: float) -> None:
        for node, since in list(self.since.items()):
            if now - since < REFUSALS_LOG_EVERY:
                continue
            n = self.counts.pop(node, 0)
            if not n:                       # quiet since its last line: the next refusal is logged at once
                del self.since[node]
                continue
            tenant, cid = self.last.pop(node)
            log.warning("%d more takeover%s refused in the last %.0f s: node %s does not hold the client ids' "
                        "locks (the last: %s/%s)", n, "" if n == 1 else "s", now - since, node, tenant, cid)
            self.since[node] = now


class SessionLoader(Protocol):
    async def load(self, tenant: str, cid: str, wills: bool = True) -> bool: ...
    async def stored_will(self, tenant: str, cid: str): ...


class Takeover:
    def __init__(self, node_id: str, bus: ClientBus, broker: ClusterBroker, sessions: SessionLoader,
                 handoff: Handoff, announcer: Announcer, requests: Requests, send, members_of,
                 writer: StoreDrain | None, fence: FenceState, clock: Clock, spawn):
        self.id = node_id
        self.bus = bus
        self.broker = broker
        self.sessions = sessions
        self.handoff = handoff
        self.announcer = announcer
        self.requests = requests
        self.send = send                  # send(node, frame): over this node's link to it
        self.members_of = members_of      # () -> the other members
        self.writer = writer
        self.fence = fence
        self.clock = clock
        self.spawn = spawn                # spawn(coroutine): run it as a task
        # the CONNECTs whose claim is in progress here, per client id (two may overlap), and those of them
        # whose id another node took meanwhile
        self.claiming: dict[tuple[str, str], list[ClaimingChannel]] = {}
        self.lost: set[ClaimingChannel] = set()
        # the last update each client id's closed connection sent to Redis (until it is done): a new CONNECT
        # of the id waits for it, as claims and disconnects go to Redis on connections of their own
        self.going: dict[tuple[str, str], asyncio.Future] = {}
        # the will or stored-session mark a CONNECT of the id is sending through redis-py's pool (until it is
        # done): its connection's disconnect update, on the bus's own line, waits for it -- else the update
        # could overtake it and leave the will registered (published when this node dies) or the mark set
        self.opening: dict[tuple[str, str], asyncio.Future] = {}
        self.refusals = RefusalLog()      # TAKEOVERs refused, in the log at most every few seconds a node

    # ========================================================== new owner

    def claim(self, channel: ClaimingChannel, tenant: str, cid: str, clean_start: bool, will, cont,
              live_only: bool = False) -> None:
        """CONNECT of ``cid`` on this node: take its session over from wherever
        it is, then ``cont(now)`` opens it here.

        ``live_only``: the tenant's connection quota admitted the CONNECT only in place of a live
        connection of ``cid`` on another node -- it takes over such a connection or is refused
        0x97, and nothing else changes (a session held there offline stays there).

        The common case -- the id was free or already here, no session to
        read from the store, nothing to wait for -- runs in a callback of the
        claim's future, not in a task of its own (a connect storm made one
        per CONNECT); anything else goes on in ``run_claim``."""
        key = (tenant, cid)
        if self.fence.fenced or key in self.going or live_only:
            self.spawn(self.run_claim(channel, tenant, cid, clean_start, will, cont, live_only=live_only))
            return
        self.claiming.setdefault(key, []).append(channel)
        try:
            tried = asyncio.ensure_future(self.bus.try_claim(tenant, cid))
        except Exception as exc:
            self._unavailable(channel, tenant, cid, exc)
            self._claim_over(channel, tenant, cid)
            return
        tried.add_done_callback(partial(self._tried, channel, tenant, cid, clean_start, will, cont))

    def _tried(self, channel: ClaimingChannel, tenant, cid, clean_start, will, cont, tried: asyncio.Future) -> None:
        """The claim's answer, for ``claim``: the common case here, the rest in ``run_claim``
        (which then ends the claim: ``later``)."""
        later = False
        try:
            if (tried.cancelled() or tried.exception() is not None or tried.result() is not None
                    or not (clean_start or self.broker.holds(tenant, cid))
                    or (clean_start and self.broker.holds_stored(tenant, cid))
                    or not (self.bus.registry_whole or self.broker.holds(tenant, cid))):
                self.spawn(self.run_claim(channel, tenant, cid, clean_start, will, cont, tried))
                later = True
                return
            if channel in self.lost:
                self._let_go(tenant, cid)
                return
            if channel.state != CONNECTING:
                return
            if self.fence.fenced:       # fenced while the claim was on its way: it refuses CONNECTs now
                channel.refuse(rc.SERVER_UNAVAILABLE, "this node is out of the cluster")
                return
            cont(self.clock())
            session = channel.session
            if (tenant, cid) in self.going or (session is not None and (session.durable or will is not None)):
                self.spawn(self._opened_later(channel, tenant, cid, will, session))
                later = True
        except Exception as exc:
            self._unavailable(channel, tenant, cid, exc)
        finally:
            if not later:
                self._claim_over(channel, tenant, cid)

    async def _opened_later(self, channel: ClaimingChannel, tenant, cid, will, session) -> None:
        try:
            await self._opened(channel, tenant, cid, will, session)
        except Exception as exc:
            self._unavailable(channel, tenant, cid, exc)
        finally:
            self._claim_over(channel, tenant, cid)

    async def run_claim(self, channel: ClaimingChannel, tenant, cid, clean_start, will, cont,
                        tried: asyncio.Future | None = None, live_only: bool = False) -> None:
        """A claim that waits (``tried``: the answer to the claim ``claim`` made already; ``live_only``:
        see ``claim``)."""
        key = (tenant, cid)
        if tried is None:
            if self.fence.fenced:
                channel.refuse(rc.SERVER_UNAVAILABLE, "this node is out of the cluster")
                return
            self.claiming.setdefault(key, []).append(channel)
        token = None
        try:
            if tried is None:
                going = self.going.get(key)
                if going is not None:               # the id's last connection here is still letting go of it
                    await asyncio.wait((going,))
                if live_only:
                    # only a live connection elsewhere makes room for it: the id is not claimed (it
                    # would be taken from whoever holds it) unless another node holds it
                    owner = await self.bus.owner(tenant, cid)
                    if not self._asks_live_only(owner):
                        self._over_quota(channel, tenant)
                        return
                else:
                    # the common case in one round trip: the client id was free, or already here
                    owner = await self.bus.try_claim(tenant, cid)
            else:
                owner = tried.result()
            if owner is not None:
                token = await self.bus.lock(tenant, cid)
                if token is None:
                    channel.refuse(rc.SERVER_BUSY, "the client id is being taken over")
                    return
                if channel.state != CONNECTING:     # the client went away (or was refused) while it waited:
                    return                          # nothing to take over from the node that holds the id
                owner = await self.bus.owner(tenant, cid)
                elsewhere = owner is not None and owner != self.id and owner in self.members_of()
                if live_only and not self._asks_live_only(owner):
                    self._over_quota(channel, tenant)
                    return
                if elsewhere:
                    self.handoff.expect(tenant, cid)
                    answer = await self._request_release(owner, tenant, cid, live_only)
                    if answer == NOT_WRITTEN:
                        # the session as stored lacks what the old node still writes (its store is slow or
                        # failing): loaded now, the messages it queued and acknowledged later would be missing
                        # here -- the client is refused and connects again (0x88)
                        channel.refuse(rc.SERVER_UNAVAILABLE, "the session's last writes are not stored yet")
                        return
                    if live_only and answer not in (RELEASED, None):
                        # no live connection there (it closed, or the session is offline: left where it
                        # is): no place in the quota. (No answer in time: the old node may have let go
                        # of it meanwhile -- the session is loaded here as without LIVE_ONLY, rather
                        # than held nowhere, its messages routed to no node, until the next CONNECT.)
                        self._over_quota(channel, tenant)
                        return
                if not clean_start:
                    await self.sessions.load(tenant, cid)
                elif not self.broker.holds(tenant, cid) and not await self._end_stored(tenant, cid):
                    # Clean Start: the session the other node let go of (or held when it died) is over --
                    # unless the store failed to take that
                    channel.refuse(rc.SERVER_UNAVAILABLE, "the session store is unavailable")
                    return
                self.handoff.flush_arriving(tenant, cid)
                await self.bus.claim(tenant, cid, False, owner)
            elif not self.broker.holds(tenant, cid):
                # free in the registry but perhaps stored: Redis may have lost its registry (restarted
                # empty) before anyone adopted the session -- the store, not the registry, is the truth
                if not clean_start:
                    await self.sessions.load(tenant, cid)
                elif not self.bus.registry_whole and not await self._end_stored(tenant, cid):
                    # (while the registry is whole, a stored session always has a record in it: a Clean
                    # Start of a free id -- the usual CONNECT -- does not read the store)
                    channel.refuse(rc.SERVER_UNAVAILABLE, "the session store is unavailable")
                    return
            # Clean Start of a stored session held here: ended (its connection taken over) before the new
            # one opens, and the CONNACK waits until that is durable ([MQTT-3.1.2-4])
            if (clean_start and channel.state == CONNECTING and self.broker.holds_stored(tenant, cid)
                    and self.broker.end_held(tenant, cid, self.clock()) and not await self._durable()):
                channel.refuse(rc.SERVER_UNAVAILABLE, "the session store is unavailable")
                return
            if channel in self.lost:
                # another node claimed the id while this one read the session from the store (on_takeover
                # found nothing to release then, and refused this CONNECT): what was read is theirs
                self._let_go(tenant, cid)
                return
            if channel.state != CONNECTING:         # the client went away meanwhile
                return
            if self.fence.fenced:
                # the node fenced itself while this claim waited (it dropped every session then): no session
                # opens here until it rejoins, not even one whose claim Redis answered late
                if not clean_start:
                    self._let_go(tenant, cid)
                channel.refuse(rc.SERVER_UNAVAILABLE, "this node is out of the cluster")
                return
            cont(self.clock())
            await self._opened(channel, tenant, cid, will, channel.session)
        except Exception as exc:
            self._unavailable(channel, tenant, cid, exc)
        finally:
            self._claim_over(channel, tenant, cid)
            if token is not None:
                try:
                    await self.bus.unlock(tenant, cid, token)
                except Exception:
                    pass

    async def _end_stored(self, tenant: str, cid: str) -> bool:
        """A Clean Start here of a session this node does not hold: the stored session of the id is
        over, in the store too -- not loaded again by the next CONNECT without it, elsewhere -- and the
        will it still owes goes now, as the session ends ([MQTT-3.1.2-4]; 3.1.4; as on a single node).
        -> whether the end is durable (False: the store failed; the CONNECT is refused)."""
        will_left = await self.sessions.stored_will(tenant, cid)
        if will_left is not None:
            self.broker.publish_gone_will(tenant, cid, will_left, self.clock())
        self.broker.discard_stored(tenant, cid)
        # the CONNACK (session present 0) waits until that is durable: a crash of this node before it
        # left the session in the store, loaded by the id's next CONNECT -- or adopted, its will again
        return await self._durable()

    async def _durable(self) -> bool:
        """Once what this node wrote so far is committed: whether it was (False: the store failed)."""
        done = asyncio.get_running_loop().create_future()
        self.broker.when_durable(lambda ok: done.done() or done.set_result(ok))
        return await done

    async def _opened(self, channel: ClaimingChannel, tenant, cid, will, session) -> None:
        """What follows opening ``session`` here (``cont``): the will of a connection it took over goes
        first; a stored session is marked this node's -- even if its connection closed since: it outlives
        the connection, and a survivor adopts only what is marked -- and the will of one that is not
        stored is registered while its connection is still open."""
        going = self.going.get((tenant, cid))
        if going is not None:               # cont took over a connection of the id here: its will goes first
            await asyncio.wait((going,))
        if session is not None and session.durable:
            await self._opening(tenant, cid, self.bus.mark_owned(tenant, cid))
        current = channel.session
        if will is not None and current is not None and not current.durable:
            await self._opening(tenant, cid, self.bus.set_will(tenant, cid, pack_will(will)))

    async def _opening(self, tenant, cid, update) -> None:
        """``update`` of ``_opened``, recorded in ``opening`` while it is on its way."""
        key = (tenant, cid)
        fut = asyncio.ensure_future(update)
        self.opening[key] = fut
        try:
            await fut
        finally:
            if self.opening.get(key) is fut:
                del self.opening[key]

    def _asks_live_only(self, owner: str | None) -> bool:
        """Whether ``owner`` is another member that answers a TAKEOVER's ``LIVE_ONLY`` (a node of an
        earlier version ignores the flag and would let go of an offline session as well)."""
        if owner is None or owner == self.id:
            return False
        info = self.members_of().get(owner)
        return info is not None and frames.LIVE_ONLY_FEATURE in (info.get("features") or ())

    def _over_quota(self, channel: ClaimingChannel, tenant: str) -> None:
        """A ``live_only`` claim found no live connection to take the place of: refused 0x97, counted
        among the tenant's quota refusals as a refusal at its admission is."""
        if channel.state == CONNECTING:
            self.broker.quota_refused(tenant)
            channel.refuse(rc.QUOTA_EXCEEDED, rc.NAMES.get(rc.QUOTA_EXCEEDED))

    def _unavailable(self, channel: ClaimingChannel, tenant, cid, exc: Exception) -> None:
        log.warning("CONNECT of %s/%s refused: cluster unavailable (%s)", tenant, cid, exc)
        if channel.state == CONNECTING:
            channel.refuse(rc.SERVER_UNAVAILABLE, "cluster unavailable")

    def _claim_over(self, channel: ClaimingChannel, tenant, cid) -> None:
        key = (tenant, cid)
        self.lost.discard(channel)
        claims = self.claiming[key]
        claims.remove(channel)
        if not claims:
            del self.claiming[key]
        self.handoff.done_expecting(tenant, cid)
        self.handoff.flush_arriving(tenant, cid)

    async def _request_release(self, node: str, tenant: str, cid: str, live_only: bool = False) -> int | None:
        """-> the old node's answer (``RELEASED``, ``NOT_HERE``, ``REFUSED``, ``NOT_WRITTEN``, ``NOT_LIVE``), None
        if none came."""
        flags = frames.LIVE_ONLY if live_only else 0
        answer = await ask(self.requests, RELEASE, node,
                           lambda r: self.send(node, frames.takeover(r, tenant, cid, flags)),
                           self.clock() + RELEASE_TIMEOUT)
        if answer is LATE:
            log.warning("node %s did not release %s/%s in time", node, tenant, cid)
            return None
        return None if answer is LOST else answer

    def _let_go(self, tenant: str, cid: str) -> None:
        """Forget a session copy this node loaded for a claim it lost (its store rows are the new owner's)."""
        if self.broker.release(tenant, cid, self.clock()):
            for filt in self.announcer.announced_filters(tenant):
                self.announcer.route_dirty(tenant, filt)

    def client_gone(self, tenant: str, cid: str, ended: bool, had_will: bool) -> None:
        """A connection closed here; ``ended``: its session is over too.

        A CONNECT of the same id still being opened here (it took this
        connection over) keeps the id: only the old will is let go of. A
        later CONNECT of the id waits for this update (``going``) before
        its claim, so that Redis sees the two in the order they happened."""
        key = (tenant, cid)
        claims = self.claiming.get(key)
        if claims is not None and any(ch.state == CONNECTING for ch in claims):
            ended = False
        if self.fence.fenced or not (ended or had_will):
            return

        # the bus's future itself (a wave of disconnects is a future each, not a task each); a failed update
        # is dropped, as it was
        try:
            opening = self.opening.get(key)
            if opening is None:
                update = asyncio.ensure_future(self.bus.gone(tenant, cid, ended, had_will))
            else:               # after the will or mark this connection's open is still sending
                update = asyncio.ensure_future(self._gone_after(opening, tenant, cid, ended, had_will))
        except Exception as exc:        # the connection's close goes on whatever the bus does
            log.warning("letting go of %s/%s in the cluster failed: %s", tenant, cid, exc)
            return
        going = self.going
        going[key] = update

        def done(f: asyncio.Future) -> None:
            if not f.cancelled():
                f.exception()           # retrieved, not logged as never retrieved
            if going.get(key) is f:
                del going[key]

        update.add_done_callback(done)

    async def _gone_after(self, opening: asyncio.Future, tenant, cid, ended, had_will) -> None:
        await asyncio.wait((opening,))
        await self.bus.gone(tenant, cid, ended, had_will)

    # ========================================================== old owner

    async def on_takeover(self, link, req: int, tenant: str, cid: str, checked=None, live_only: bool = False) -> None:
        """Another node takes a session of this one over (see ``handoff``) --
        only while it holds the client id's lock, as a CONNECT there does.
        ``checked()`` runs once the lock is checked (the link counts the
        requests waiting on Redis). ``live_only``: only if the session's client is
        connected here (else it stays, answered ``NOT_LIVE``)."""
        try:
            holder_node = await self.bus.lock_holder(tenant, cid)
        except Exception as exc:
            holder_node = None
            log.warning("takeover of %s/%s by node %s: lock unknown (%s)", tenant, cid, link.peer, exc)
        finally:
            if checked is not None:
                checked()
        if holder_node != link.peer:
            self.refusals.refused(link.peer, tenant, cid, self.clock())
            link.send(frames.released(req, REFUSED))
            return
        if live_only and not self.broker.holds_connected(tenant, cid):
            link.send(frames.released(req, NOT_LIVE))
            return
        claims = self.claiming.get((tenant, cid))
        if claims is not None:
            # a CONNECT of the id is being claimed here too (its claim found the id free, the other's found
            # it here): the other node holds the lock, so this one gives way -- before it opens a second copy
            for claiming in claims:
                self.lost.add(claiming)
                if claiming.state == CONNECTING:
                    claiming.refuse(rc.SERVER_BUSY, "the client id is being taken over by another node")
        holder = None
        if not self.fence.fenced and link.peer:
            filters = self.broker.handoff_filters(tenant, cid)
            if filters:
                holder = await self.handoff.begin(link, tenant, cid, filters)
        # from here on, what arrives for the session goes to the holder (no await in between)
        found = self.broker.release(tenant, cid, self.clock())
        if found:
            for filt in self.announcer.announced_filters(tenant):
                self.announcer.route_dirty(tenant, filt)
        written = True
        try:
            if holder is not None:
                await self.handoff.switch(holder)
            if self.writer is not None:
                # what this node wrote of the session (the messages it queued, their acks) must be in the
                # store before the other node loads it -- also when it let go of the session at an earlier
                # ask that found its writes still on their way (what other sessions write meanwhile is not
                # waited for)
                written = await self.writer.written(WRITES_WAIT)
        finally:
            if holder is not None:
                self.handoff.end(holder)
        link.send(frames.released(req, NOT_WRITTEN if not written else RELEASED if found else NOT_HERE))
