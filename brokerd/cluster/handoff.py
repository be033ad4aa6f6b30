"""A stored session moving between two nodes, without a message lost, doubled
or reordered (asyncio side; the clock comes in).

Every node's route table changes at its own pace, so for a while messages
for the session reach the old owner, the new one, or both. The old owner
asks the new one to hold what arrives for the session's filters (HANDOFF;
the new owner freezes their counts and answers HOLDING with what it had
announced), forwards to it what still arrives itself (PUBLISH flag TARGET),
and moves the routes from itself to the new owner in one event of the log;
once every node confirms, on its own link, that it applied that event (SYNC
/ SYNCED: nothing more can come by the old route), it lets the session go.
The new owner loads the session and adds what it held: first what came
through the old owner, then the rest. A holder at the new owner is flushed
when its claim ends (to the session if it is here now), or RELEASE_TIMEOUT
after it began if no claim is under way.

``Takeover`` (``takeover.py``) drives the steps; ``Forwarder`` hands this
class the messages for a moving session.
"""

import asyncio
import json
import logging
from collections import deque
from typing import Protocol

from ..routing.topic import matches
from . import frames
from .announce import Announcer
from .eventlog import event_key
from .peers import MAX_CONTROL_FRAME
from .ports import Clock, ClusterBroker, FenceState
from .requests import ACK_TIMEOUT, ANSWER, LATE, LOST, Requests, ask
from .routes import ClusterRoutes

log = logging.getLogger("brokerd.cluster")

RELEASE_TIMEOUT = 5.0    # how long a takeover waits for the old node (and the new one holds messages for it)
HANDOFF_TIMEOUT = 1.0    # how long the old owner waits for the new one to hold a moving session's messages
SYNC_TIMEOUT = 2.0       # how long it waits for the other nodes to switch routes


_NOT_JSON = object()


def _json(text: str):
    """``text`` parsed, or ``_NOT_JSON``: a peer's text nested deeper than the parser recurses (a
    HANDOFF of 100,000 "[") raised RecursionError, which no ``except ValueError`` caught."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return _NOT_JSON


def handoff_of(text: str) -> tuple[str, str, list[str]] | None:
    """(tenant, client id, filters) of a HANDOFF's text; None when it is not one."""
    d = _json(text)
    if not isinstance(d, dict):
        return None
    tenant, cid, filters = d.get("tenant"), d.get("client_id"), d.get("filters")
    if not (isinstance(tenant, str) and isinstance(cid, str) and isinstance(filters, list)
            and all(isinstance(f, str) and f for f in filters)):
        return None
    return tenant, cid, filters


def counts_of(text, filters: list[str]) -> dict | None:
    """{filter: [subs, durable]} of a HOLDING's text for ``filters``: ``{}``
    when the new owner does not hold, None when the text is not an answer."""
    d = _json(text)
    if d is _NOT_JSON:
        return None
    if d is None:
        return {}
    if not isinstance(d, dict) or set(d) != set(filters):
        return None
    for v in d.values():
        if not (isinstance(v, list) and len(v) == 2
                and all(type(n) is int and 0 <= n < 1 << 32 for n in v)):
            return None
    return d
# SYNCs of one node waiting here for their event (a SYNC is kept SYNC_TIMEOUT at most: its asker waits no
# longer); beyond, the oldest is dropped -- a member sending SYNCs for events no one wrote held them for ever
SYNCS_PER_NODE = 1024


class Holder:
    """A stored session on the move, at a node it leaves (``old`` is None:
    what arrives for its filters goes on to the new owner over ``link``) or
    at the node it comes to (what arrives is held: ``old``, forwarded by the
    old owner, and ``new``, the rest, until the session is loaded here)."""

    __slots__ = ("tenant", "cid", "filters", "link", "peer", "counts", "old", "new", "since", "switched")

    def __init__(self, tenant, cid, filters, link, peer, arriving: bool, since: float):
        self.tenant, self.cid, self.filters = tenant, cid, filters
        self.link, self.peer = link, peer
        self.counts: dict = {}
        self.old: list | None = [] if arriving else None        # [(msg, waiter or None)]
        self.new: list = []
        self.since = since
        # at the new owner: the old owner's route switch is applied here (before it, a message published
        # here that goes to the old owner by its route comes back from there: it is not held here as well)
        self.switched = False

    def wants(self, topic: str) -> bool:
        return any(matches(f, topic) for f in self.filters)


class LogPosition(Protocol):
    """How far this node applied the event log (``eventlog.EventLog``)."""

    last_event: str


class Handoff:
    def __init__(self, node_id: str, requests: Requests, send, announcer: Announcer, routes: ClusterRoutes,
                 broker: ClusterBroker, members_of, position: LogPosition, fence: FenceState, clock: Clock):
        self.id = node_id
        self.requests = requests
        self.send = send                          # send(node, frame): over this node's own link to it
        self.announcer = announcer
        self.routes = routes
        self.broker = broker
        self.members_of = members_of              # () -> the other members
        self.position = position
        self.fence = fence
        self.clock = clock
        self.moving: dict[str, list[Holder]] = {}     # tenant -> its sessions moving through this node
        self.arriving: dict[tuple, Holder] = {}       # (tenant, client id) -> holder, at the new owner
        self.expecting: set[tuple] = set()            # (tenant, client id) this node is taking over
        self.syncs: dict[str, deque] = {}             # node -> (event key, req, until) to answer once applied

    # ============================================================ old owner

    async def begin(self, link, tenant: str, cid: str, filters: list[str]) -> Holder | None:
        """The new owner (at the other end of ``link``) holds the session's messages from now on."""
        text = json.dumps({"tenant": tenant, "client_id": cid, "filters": filters})
        if len(text) > MAX_CONTROL_FRAME:
            log.warning("handoff of %s/%s: its %d filters are too long to hand over (%d bytes)", tenant, cid,
                        len(filters), len(text))
            return None
        keys = [(tenant, f) for f in filters]
        self.announcer.freeze(keys)
        answer = await ask(self.requests, ANSWER, link.peer, lambda r: link.send(frames.handoff(r, text)),
                           self.clock() + HANDOFF_TIMEOUT)
        counts = counts_of(answer, filters) if isinstance(answer, str) else {}
        if counts is None:
            link.fail(f"HOLDING for {tenant}/{cid} that is no answer to its HANDOFF")
        if not counts:
            self.announcer.thaw(keys)
            return None
        holder = Holder(tenant, cid, filters, link, link.peer, False, self.clock())
        holder.counts = counts
        self.moving.setdefault(tenant, []).append(holder)
        return holder

    async def switch(self, h: Holder) -> None:
        """Move the session's routes to the new owner in one event, then wait
        until every node applied it."""
        try:
            ids = await self.announcer.switch(h.tenant, h.filters, h.peer, h.counts)
        except Exception as exc:
            log.warning("handoff of %s/%s: could not switch routes (%s)", h.tenant, h.cid, exc)
            return
        peers = [n for n in self.members_of() if n != self.id]
        deadline = self.clock() + SYNC_TIMEOUT
        answers = await asyncio.gather(*(
            ask(self.requests, ANSWER, n, lambda r, n=n: self.send(n, frames.sync(r, ids[-1])), deadline)
            for n in peers))
        late = [n for n, a in zip(peers, answers, strict=True) if a is LATE or a is LOST]
        if late:
            log.warning("handoff of %s/%s: nodes %s did not confirm the route switch", h.tenant, h.cid, late)

    def end(self, h: Holder) -> None:
        """The session is gone from here: its routes are the new owner's in this node's table."""
        self._forget(h)
        for f in h.filters:
            subs, durable = h.counts.get(f, (0, 0))
            self.routes.set_route(h.peer, h.tenant, f, subs + 1, durable + 1)

    def _forget(self, h: Holder) -> None:
        holders = self.moving.get(h.tenant)
        if holders and h in holders:
            holders.remove(h)
            if not holders:
                del self.moving[h.tenant]

    # ============================================================ new owner

    def expect(self, tenant: str, cid: str) -> None:
        """This node takes ``cid`` over: a HANDOFF for it is welcome."""
        self.expecting.add((tenant, cid))

    def done_expecting(self, tenant: str, cid: str) -> None:
        self.expecting.discard((tenant, cid))

    async def on_handoff(self, link, req: int, tenant: str, cid: str, filters: list[str]) -> None:
        """Hold what arrives for a session this node is taking over (the
        HANDOFF's fields, checked by ``handoff_of``)."""
        if (tenant, cid) not in self.expecting or (tenant, cid) in self.arriving or self.fence.fenced:
            link.send(frames.holding(req, "null"))
            return

        def hold() -> None:
            h = Holder(tenant, cid, filters, link, link.peer, True, self.clock())
            self.moving.setdefault(tenant, []).append(h)
            self.arriving[(tenant, cid)] = h

        counts = await self.announcer.arrival(tenant, filters, hold)
        link.send(frames.holding(req, json.dumps(counts)))

    def flush_arriving(self, tenant: str, cid: str, ok: bool = True) -> None:
        """The session is here (or will not be): what was held goes to it. When
        it is not here (its load failed, the claim gave up, a clean start), what
        was held reached no session: the publishers are told, and send again."""
        h = self.arriving.pop((tenant, cid), None)
        if h is None:
            return
        self._forget(h)
        ok = ok and self.broker.holds(tenant, cid)
        now = self.clock()
        waiters = []
        for msg, waiter in h.old + h.new:
            if ok:
                self.broker.deliver_to_client(tenant, cid, msg, now)
            if waiter is not None:
                waiters.append(waiter)
        if h.old or h.new:
            log.info("handoff of %s/%s: %d messages came through the old node, %d held here", tenant, cid,
                     len(h.old), len(h.new))
        if waiters:
            if not ok:
                for w in waiters:
                    w(False)
            else:
                self.broker.when_durable(lambda done: [w(done) for w in waiters])
        keys = [(tenant, f) for f in h.filters]
        if not h.switched:
            # the old owner's route switch, which was to announce this node's counts, did not come (yet): it
            # gave the handoff up (its HOLDING late, lost, refused) or it is still on its way
            self.announcer.unannounce(keys)
        self.announcer.thaw(keys)

    def switched(self, node: str, tenant: str, filters: set) -> None:
        """The event that moves routes from ``node`` to this one (a handoff's switch) is applied here:
        what is published here for a session arriving from ``node`` is held here from now on."""
        for h in self.arriving.values():
            if h.peer == node and h.tenant == tenant and not filters.isdisjoint(h.filters):
                h.switched = True

    def came_through_old(self, tenant: str, cid: str, msg, waiter) -> bool:
        """A message the old owner sent on (TARGET): held, if the session is arriving."""
        h = self.arriving.get((tenant, cid))
        if h is None:
            return False
        h.old.append((msg, waiter))
        return True

    def expire(self, now: float) -> None:
        """Holders whose session did not come in time are flushed (to nobody); SYNCs no one waits for dropped."""
        self.expire_syncs(now)
        for (tenant, cid), h in list(self.arriving.items()):
            if (tenant, cid) not in self.expecting and h.since + RELEASE_TIMEOUT < now:
                self.flush_arriving(tenant, cid)

    def abort(self) -> None:
        """This node fenced itself: nothing held is delivered, its publishers are told."""
        for tenant, cid in list(self.arriving):
            self.flush_arriving(tenant, cid, ok=False)

    # ======================================================= either owner

    def held(self, holders: list[Holder], msg, parts: tuple, waits: list, sent_to=()) -> int:
        """A message published here for moving sessions (``holders``, of its
        tenant); -> how many wanted it (the ACKs of QoS 1/2 join ``waits``).
        ``sent_to``: the nodes it goes to by their routes. At the new owner, a
        message that also goes to the old owner (the session's route is still
        there) reaches the session through it -- delivered to it there, or sent
        back as TARGET -- and is not held here too (it was: delivered twice,
        the second time as new, out of order)."""
        count = 0
        for h in holders:
            if h.old is not None and not h.switched and h.peer in sent_to:
                continue
            if h.wants(msg.topic):
                waiter = None
                if msg.qos:
                    req = next(self.requests.ids)
                    waits.append(req)
                    self.requests.expect_ack(req, h.peer if h.old is None else self.id, self.clock() + ACK_TIMEOUT)
                    waiter = self.requests.resolver(req)
                self.hold(h, msg, parts, waiter)
                count += 1
        return count

    def wanting(self, tenant: str, topic: str) -> list[Holder] | None:
        holders = self.moving.get(tenant)
        return [h for h in holders if h.wants(topic)] if holders else None

    def hold(self, h: Holder, msg, parts: tuple, waiter) -> None:
        """A message for a moving session: on to its new owner, or kept until it is here."""
        if h.old is not None:
            h.new.append((msg, waiter))
            return
        req = 0
        if waiter is not None:
            req = next(self.requests.ids)
            self.requests.expect_ack(req, h.peer, self.clock() + ACK_TIMEOUT, waiter)
        qos, flags = parts[0], parts[1]
        h.link.send(frames.publish(req, qos, flags | frames.TARGET, *parts[2:], h.cid.encode(), b""))

    # ============================================================ any node

    def on_sync(self, node: str | None, req: int, eid: str) -> bool:
        """SYNC: answer once this node applied event ``eid``; False when ``eid``
        is no event id (the caller closes the link: it was kept, and every later
        pass over the waiting SYNCs failed on it)."""
        try:
            key = event_key(eid)
        except ValueError:
            return False
        if self.fence.fenced or key <= event_key(self.position.last_event):
            if node:
                self.send(node, frames.synced(req))
            return True
        waiting = self.syncs.get(node)
        if waiting is None:
            waiting = self.syncs[node] = deque(maxlen=SYNCS_PER_NODE)
        waiting.append((key, req, self.clock() + SYNC_TIMEOUT))
        return True

    def answer_syncs(self) -> None:
        """SYNCs whose event this node applied: answered over this node's own link to the asker."""
        if not self.syncs:
            return
        done = event_key(self.position.last_event)
        fenced = self.fence.fenced
        for node, waiting in list(self.syncs.items()):
            keep = []
            for entry in waiting:
                if fenced or entry[0] <= done:
                    if node:
                        self.send(node, frames.synced(entry[1]))
                else:
                    keep.append(entry)
            self._keep_syncs(node, waiting, keep)

    def expire_syncs(self, now: float) -> None:
        """SYNCs their asker no longer waits for (their event not applied here in time) are dropped."""
        for node, waiting in list(self.syncs.items()):
            self._keep_syncs(node, waiting, [e for e in waiting if e[2] >= now])

    def _keep_syncs(self, node, waiting: deque, keep: list) -> None:
        if len(keep) == len(waiting):
            return
        if keep:
            waiting.clear()
            waiting.extend(keep)
        else:
            del self.syncs[node]
