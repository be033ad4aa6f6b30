"""This node's routes, announced on the cluster event log (asyncio side).

Each node announces how many subscriptions it has per topic filter (and how
many of those belong to stored sessions), and the members of its shared
groups; every node keeps the whole table (``routes.ClusterRoutes``, filled
by ``eventlog.EventLog``). A subscription marks its filter dirty; a round
publishes the changed counts in one batch, after the other events queued
meanwhile (a retained message, an adoption's "gone": they follow the routes
they concern), packed into a few entries of the log ("multi" events). What could not be published is announced again; what is
announced is recorded, so that a round publishes only what changed.

While a stored session moves (``handoff``), its filters' counts are frozen
at both ends and the route switch is one event: ``arrival`` and ``switch``
are the two locked steps the handoff takes here.
"""

import asyncio
import logging

from .ports import ClusterBroker, EventBus, FenceState

log = logging.getLogger("brokerd.cluster")

GATHER = 0.01           # seconds a round waits to gather a burst of subscriptions
PER_ENTRY = 256         # events of a round packed into one entry of the log (a "multi" event), at most ...
ENTRY_BYTES = 1 << 20   # ... and about this many bytes of them (an event larger than that goes alone): retained
                        # messages of up to --max-packet-size ride in them, and Redis refuses a field over 512 MB
RETRY = 0.5             # seconds after a failed round before the next
_NOTHING = (0, 0, {})   # a filter never announced
_UNKNOWN = (-1, -1, {})  # counts other nodes may not know: announced afresh, whatever they are


class Announcer:
    def __init__(self, node_id: str, bus: EventBus, broker: ClusterBroker, fence: FenceState):
        self.id = node_id
        self.bus = bus
        self.broker = broker
        self.fence = fence
        self.lock = asyncio.Lock()                    # a round and a handoff's steps, one at a time
        self.announced: dict[tuple, tuple] = {}       # (tenant, filter) -> (subs, durable, {group: members})
        self._dirty: set[tuple] = set()               # (tenant, filter) whose counts changed
        self._outbox: list[dict] = []                 # other events to publish, in order
        # (tenant, topic) -> the place in ``_outbox`` of its retained message's copy: one a topic, the newest
        # (while the bus is slow or out of reach the outbox holds no more than the retained messages themselves)
        self._retain_at: dict[tuple, int] = {}
        self._frozen: set[tuple] = set()              # (tenant, filter) not announced during a handoff
        self.wanted = asyncio.Event()                 # something to announce

    # ------------------------------------------------------------- changes

    def route_dirty(self, tenant: str, filt: str) -> None:
        self._dirty.add((tenant, filt))
        self.wanted.set()

    def queue_event(self, e: dict) -> None:
        if e.get("t") == "retain":
            key = (e["tn"], e["tp"])
            at = self._retain_at.get(key)
            if at is not None:
                # a newer retained message (or its clearing) for a topic whose copy is not published yet
                # replaces it: every node would have applied the two in turn and kept the second
                self._outbox[at] = e
                return
            self._retain_at[key] = len(self._outbox)
        self._outbox.append(e)
        self.wanted.set()

    def _requeue(self, outbox: list[dict]) -> None:
        """A round's events that could not be published go back before those queued meanwhile (a
        topic's retained message once: the newest, in the place of the first)."""
        queued, self._outbox, self._retain_at = self._outbox, [], {}
        for e in outbox:
            self.queue_event(e)
        for e in queued:
            self.queue_event(e)

    def all_dirty(self) -> None:
        """Every local route, announced afresh (joining)."""
        for key in self.broker.local_filters():
            self._dirty.add(key)
        self.wanted.set()

    async def back(self) -> None:
        """This node took up its former run's sessions (``Adoption.take_up``; it joined saying "reset"
        with "keep": the others refused their messages meanwhile): every route it has, in one "back"
        event -- the others replace what they held of this node with it, and stop refusing."""
        while True:
            async with self.lock:
                self.announced.clear()
                changes: list = []
                events = [e for key in self.broker.local_filters() for e in self.route_events(*key, changes=changes)]
                try:
                    await self.bus.publish_events([{"t": "back", "n": self.id, "e": events}])
                    return
                except Exception as exc:
                    self.announced.clear()
                    if self.fence.fenced:
                        return          # (rejoining, it says "reset" and announces afresh)
                    log.warning("could not announce this node's routes (%s); retrying", exc)
            await asyncio.sleep(RETRY)

    def forget(self) -> None:
        """Nothing announced counts any more (a fenced node rejoins: its "reset" voided it)."""
        self.announced.clear()

    def announced_filters(self, tenant: str) -> list[str]:
        return [f for (t, f) in self.announced if t == tenant]

    # --------------------------------------------------------------- rounds

    async def run(self) -> None:
        while True:
            await self.wanted.wait()
            await asyncio.sleep(GATHER)          # gather a burst of subscriptions into one round
            self.wanted.clear()
            if not await self.flush():
                await asyncio.sleep(RETRY)

    async def flush(self) -> bool:
        """Publish what changed; -> False when the bus failed (retried)."""
        async with self.lock:
            dirty, self._dirty = self._dirty, set()
            outbox, self._outbox, self._retain_at = self._outbox, [], {}
            if self._frozen:
                held = {item for item in dirty if item in self._frozen}
                if held:
                    dirty -= held
                    self._dirty |= held        # announced when the handoff is over
            events = []
            changes: list = []
            for item in dirty:
                events.extend(self.route_events(*item, changes=changes))
            events.extend(outbox)                  # after the routes (an adoption's "gone" follows its routes)
            if not events:
                return True
            try:
                if self.fence.fenced:
                    raise ConnectionError("fenced")
                await self.bus.publish_events(packed(self.id, events))
            except Exception as exc:
                # not announced: forget that it was, so that the retry (or the rejoin) announces it
                for key, before, now in changes:
                    if self.announced.get(key) == now:
                        if before is None:
                            self.announced.pop(key, None)
                        else:
                            self.announced[key] = before
                if not self.fence.fenced:
                    log.warning("could not announce routes (%s); retrying", exc)
                self._dirty |= dirty
                self._requeue(outbox)
                self.wanted.set()
                return False
        return True

    def route_events(self, tenant: str, filt: str, changes: list | None = None) -> list[dict]:
        """The events that announce this node's current counts for ``filt``;
        records them as announced (``changes`` gets (key, before, now) to undo
        that when the events could not be published)."""
        subs, durable, groups = self.broker.local_route_counts(tenant, filt)
        key = (tenant, filt)
        previous = self.announced.get(key)
        b_subs, b_durable, b_groups = previous if previous is not None else _NOTHING
        counts_changed = subs != b_subs or durable != b_durable
        if not counts_changed and groups == b_groups:
            return []
        now = (subs, durable, groups)
        alive = subs or durable or groups
        if changes is not None:
            changes.append((key, previous, now if alive else None))
        if alive:
            self.announced[key] = now
        else:
            self.announced.pop(key, None)
        events = []
        if counts_changed:
            events.append({"t": "route", "n": self.id, "tn": tenant, "f": filt, "s": subs, "d": durable})
        if groups or b_groups:
            for name in set(groups) | set(b_groups):
                m = groups.get(name, 0)
                if m != b_groups.get(name, 0):
                    events.append(group_event(self.id, tenant, name, filt, m))
        return events

    # ---------------------------------------------------- a session moving

    def freeze(self, keys: list[tuple]) -> None:
        """Old owner, before the handoff: these filters' counts wait for the switch."""
        self._frozen.update(keys)

    def unannounce(self, keys: list[tuple]) -> None:
        """New owner: the route switch ``arrival`` counted on may never be
        published (the old owner gave the handoff up); these filters' counts
        are announced afresh when thawed (counts are absolute: once more is harmless)."""
        for key in keys:
            self.announced[key] = _UNKNOWN

    def thaw(self, keys: list[tuple]) -> None:
        """The handoff is over (or did not happen): announce these filters' counts as they are."""
        self._frozen.difference_update(keys)
        for key in keys:
            self.route_dirty(*key)

    async def arrival(self, tenant: str, filters: list[str], then) -> dict:
        """New owner: freeze the session's filters and count it in as the old
        owner will announce it (once more each, of a stored session); runs
        ``then()`` before anything else can announce. -> {filter: [subs,
        durable]} announced here before."""
        counts = {}
        async with self.lock:
            for f in filters:
                key = (tenant, f)
                self._frozen.add(key)
                subs, durable, groups = self.announced.get(key, (0, 0, {}))
                counts[f] = [subs, durable]
                self.announced[key] = (subs + 1, durable + 1, groups)       # what the old owner will announce
            then()
        return counts

    async def switch(self, tenant: str, filters: list[str], peer: str, counts: dict) -> list[str]:
        """Old owner: this node's counts without the session and the new
        owner's with it, in one event -> its id(s) (raises when the bus failed)."""
        events = []
        async with self.lock:
            for f in filters:
                key = (tenant, f)
                self._frozen.discard(key)
                self._dirty.discard(key)
                events.extend(self.route_events(tenant, f))      # this node's counts, without the session
                subs, durable = counts.get(f, (0, 0))
                events.append({"t": "route", "n": peer, "tn": tenant, "f": f, "s": subs + 1, "d": durable + 1})
            return await self.bus.publish_events([{"t": "multi", "n": self.id, "e": events}])


def group_event(node: str, tenant: str, group: str, filt: str, members: int) -> dict:
    """The event of ``node``'s ``members`` of a shared group (negative: none of them online). "m" is
    their number, "off" says none is online: a node of a version before "off" (a cluster upgrading
    node by node) reads the group as it did -- a negative "m" it took for no member at all, and sent
    the group's messages to no node while its only members were offline."""
    if members < 0:
        return {"t": "group", "n": node, "tn": tenant, "g": group, "f": filt, "m": -members, "off": 1}
    return {"t": "group", "n": node, "tn": tenant, "g": group, "f": filt, "m": members}


def event_members(e: dict) -> int:
    """A group event's members, negative when none is online (``group_event``)."""
    return -e["m"] if e.get("off") else e["m"]


def packed(node: str, events: list[dict]) -> list[dict]:
    """A round's events, ``PER_ENTRY`` (and about ``ENTRY_BYTES``) to an entry
    of the log: a "multi" event, which every node applies whole and in order,
    as it applies a handoff's switch (one Redis entry to write, read and parse
    instead of one each -- a burst of CONNECTs announces a route each)."""
    if len(events) == 1:
        return events
    out: list[dict] = []
    part: list[dict] = []
    size = 0
    for e in events:
        p, x = e.get("p"), e.get("x")         # a retained message's payload and properties (base64)
        n = 128 + (len(p) if p else 0) + (len(x) if x else 0)
        if part and (len(part) == PER_ENTRY or size + n > ENTRY_BYTES):
            out.append({"t": "multi", "n": node, "e": part})
            part, size = [], 0
        part.append(e)
        size += n
    out.append({"t": "multi", "n": node, "e": part})
    return out
