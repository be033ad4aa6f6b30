"""The cluster event log, read and compacted (asyncio side).

Every node applies the others' events, in the log's order, to its copy of
the route table (``routes.ClusterRoutes``): routes and shared groups, a node
that left or rejoined ("reset"), a dead node whose sessions were adopted
("gone"), and retained messages (every node keeps a copy). A joining node
loads the route snapshot from the store and reads the log from the
snapshot's position on; now and then one node (a lease on the bus) writes
the table as a new snapshot and trims the log to the previous one's
position, so the log stays short and a joining node reads little.
"""

import base64
import ctypes
import json
import logging
import os
import sys
from typing import Protocol

from ..protocol.codec import decode_properties, encode_properties
from ..protocol.packets import PUBLISH as PUBLISH_PROPS
from ..protocol.packets import Publish
from .announce import event_members
from .ports import ClusterBroker, EventBus, FenceState, LeaseBus, SessionStore
from .routes import ClusterRoutes, snapshot_group

log = logging.getLogger("brokerd.cluster")

COMPACT_EVERY = float(os.environ.get("BROKERD_COMPACT_INTERVAL", "30"))   # seconds between route snapshots
COMPACT_LEASE = max(1, int(COMPACT_EVERY * 0.8))   # whole seconds (Redis refuses an expiry of 0)
SNAPSHOT_KEY = "cluster.routes"
# Entries read from the log at a time. The announcer packs a round's events into entries of at most
# 256 events and about 1 MiB (``announce.ENTRY_BYTES``; a larger retained message goes alone): 16 of
# them are about 16 MiB at most. Before, a read took 1,000 -- about 1 GB when a node fell behind
# while large retained messages were published (a stopped or slow node, one joining).
READ_ENTRIES = 16
SNAPSHOT_EVENT_KEY = "cluster.routes.event"     # the snapshot's position, kept apart: read without the table

_malloc_trim = None                             # glibc: give the snapshot's freed heap back to the system
if sys.platform.startswith("linux"):
    try:
        _malloc_trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):           # another C library: what is freed stays in the process
        pass


def event_key(eid: str) -> tuple[int, int]:
    """A Redis Stream id, comparable: (milliseconds, sequence)."""
    ms, _, seq = eid.partition("-")
    return int(ms), int(seq or 0)


def _b64(raw: bytes | None) -> str | None:
    return base64.b64encode(raw).decode() if raw else None


def _unb64(text: str | None) -> bytes:
    return base64.b64decode(text) if text else b""


def retain_event(node: str, tenant: str, msg: Publish, wall_offset: float) -> dict:
    """The event that copies a retained message (an empty payload: cleared) to every node."""
    return {"t": "retain", "n": node, "tn": tenant, "tp": msg.topic, "q": msg.qos,
            "p": _b64(msg.payload), "x": _b64(encode_properties(msg.properties)) if msg.properties else None,
            "e": None if msg.expiry_at is None else msg.expiry_at + wall_offset}


def retained_message(e: dict, wall_offset: float) -> Publish | None:
    """The retained message a "retain" event carries (None: cleared)."""
    payload = _unb64(e.get("p"))
    if not payload:
        return None
    props = None
    raw = _unb64(e.get("x"))
    if raw:
        props, _ = decode_properties(raw, 0, len(raw), PUBLISH_PROPS)
    msg = Publish(e["tp"], payload, e["q"], True, False, 0, props)
    if e.get("e") is not None:
        msg.expiry_at = e["e"] - wall_offset
    return msg


class Orphans(Protocol):
    """Dead nodes' sessions awaiting adoption (``adoption.Adoption``)."""

    def awaiting(self, node: str) -> None: ...

    def reaping(self, node: str) -> None: ...

    def settled(self, node: str) -> None: ...


class OwnRoutes(Protocol):
    """What this node announced (``announce.Announcer``): its part of a snapshot."""

    announced: dict[tuple, tuple]


class LogBus(EventBus, LeaseBus, Protocol):
    pass


class EventLog:
    def __init__(self, node_id: str, bus: LogBus, routes: ClusterRoutes, broker: ClusterBroker,
                 store: SessionStore | None, orphans: Orphans, fence: FenceState, own: OwnRoutes,
                 members_of, applied=None):
        self.id = node_id
        self.bus = bus
        self.routes = routes
        self.broker = broker
        self.store = store
        self.orphans = orphans
        self.fence = fence
        self.own = own
        self.members_of = members_of      # () -> the other members (a snapshot names the live nodes)
        self.applied = applied            # applied() after a read that applied events (SYNCs wait for it)
        self.switched = None              # switched(node, tenant, filters): node moved those routes here
        self.last_event = "0-0"
        self.epoch = 0                    # reloads begun and ended: a read that overlapped one is dropped
        self.snapshot_at: str | None = None   # the log's position in the snapshot this node last wrote or loaded
        self.written: str | None = None       # ... in the one it last wrote
        self.trimmed: str | None = None       # where it last trimmed the log to

    # -------------------------------------------------------------- reading

    async def read(self, block_ms: int = 1000) -> bool:
        """Apply what the log holds after ``last_event`` (waits up to ``block_ms``; raises when the bus
        failed); -> whether there may be more already (a full read: read again at once)."""
        epoch = self.epoch
        events = await self.bus.read_events(self.last_event, block_ms=block_ms, count=READ_ENTRIES, own=self.id)
        if epoch != self.epoch:
            # the table was reloaded meanwhile (a fenced node rejoining): these events follow the old
            # position, and taking them would skip those between the snapshot and it
            return False
        for eid, e in events:
            self.last_event = eid
            if e is None or e.get("n") == self.id or self.fence.fenced:       # (None: one of ours, not parsed)
                continue
            try:
                self.apply(e)
            except Exception:
                log.exception("bad cluster event %r", e)
        if events and self.applied is not None:
            self.applied()
        return len(events) >= READ_ENTRIES

    def apply(self, e: dict) -> None:
        kind = e["t"]
        if kind == "multi":                 # several changes at once (a handoff): no message sees half of them
            mine: dict[str, set] = {}
            for sub in e["e"]:
                if sub.get("n") != self.id:
                    self.apply(sub)
                elif sub["t"] == "route":   # routes moved to this node: a session arriving here from e["n"]
                    mine.setdefault(sub["tn"], set()).add(sub["f"])
            if self.switched is not None:
                for tenant, filters in mine.items():
                    self.switched(e["n"], tenant, filters)
        elif kind == "route":
            self.routes.set_route(e["n"], e["tn"], e["f"], e["s"], e["d"])
        elif kind == "group":
            self.routes.set_group(e["n"], e["tn"], e["g"], e["f"], event_members(e))
        elif kind == "reset":               # a node leaves (keep: its sessions await adoption) or rejoins
            if e.get("keep") and e["n"] != self.id:
                self.orphans.awaiting(e["n"])
            else:
                self.orphans.settled(e["n"])
        elif kind == "back":                # a node took up its former run's sessions: its routes, all of them
            if e["n"] != self.id:
                self.routes.drop_node(e["n"])
                for sub in e["e"]:
                    self.apply(sub)
                self.orphans.orphaned.pop(e["n"], None)
        elif kind == "gone":                # node "of" is adopted: nothing of it awaits any more
            if e["of"] != self.id:
                self.orphans.settled(e["of"])
        elif kind == "reaping":             # node "of"'s sessions are still being adopted
            if e["of"] != self.id:
                self.orphans.reaping(e["of"])
        elif kind == "retain":
            self.broker.retained_copy(e["tn"], e["tp"], retained_message(e, self.broker.wall_offset))

    # ------------------------------------------------------------ snapshots

    async def load_snapshot(self) -> None:
        if self.store is None:
            return
        blob = await self.store.get_meta(SNAPSHOT_KEY)
        if not blob:
            return
        snap = json.loads(blob)
        members = self.members_of()
        self.routes.load(snap, exclude={self.id} | (set(snap.get("nodes", ())) - set(members)))
        self.last_event = self.snapshot_at = snap.get("event_id", "0-0")
        log.info("route snapshot loaded (%d routes, %d shared groups, events after %s)", len(snap.get("routes", ())),
                 len(snap.get("groups", ())), self.last_event)

    async def reload(self) -> None:
        """The table afresh: the snapshot, then the log from there (a fenced node rejoins)."""
        self.epoch += 1
        try:
            self.routes.clear()
            self.last_event = "0-0"
            await self.load_snapshot()
        finally:
            self.epoch += 1

    def _snapshot(self, at: str, prev_id: str) -> tuple[int, bytes]:
        """(routes, the snapshot as JSON): the table's copy is gone when this returns."""
        snap = self.routes.snapshot()
        for (tenant, filt), (subs, durable, groups) in self.own.announced.items():
            snap["routes"].append([self.id, tenant, filt, subs, durable])
            for name, members in groups.items():
                snapshot_group(snap, self.id, tenant, name, filt, members)
        snap["event_id"] = at
        snap["nodes"] = sorted(set(self.members_of()) | {self.id})
        snap["prev_id"] = prev_id
        return len(snap["routes"]), json.dumps(snap).encode()

    def drop_all(self) -> None:
        """Forget every other node's routes (this node fenced itself)."""
        for node in list(self.routes.nodes()):
            self.routes.drop_node(node)

    async def compact(self) -> None:
        """Write the route table as a snapshot and trim the log to the
        previous snapshot's position -- if this node holds the lease, and the
        log moved past the stored snapshot (a table nothing changed in is not
        written again: 100,000 routes are 5 MB of JSON and ~80 ms of this
        node's loop). Then, the log is trimmed to the snapshot this node wrote
        last, a round after writing it, as the next snapshot would have."""
        store = self.store
        if store is None or self.fence.fenced:
            return
        if self.last_event == self.snapshot_at:
            if self.last_event == self.written != self.trimmed:
                try:
                    if await self.bus.try_lease("compact", COMPACT_LEASE):
                        await self.bus.trim_events(self.written)
                        self.trimmed = self.written
                except Exception as exc:
                    log.warning("cluster event log not trimmed: %s", exc)
            return
        epoch = self.epoch
        try:
            stored = await store.get_meta(SNAPSHOT_EVENT_KEY)
            if stored is not None and stored.decode() == self.last_event:
                # another node stored this position: nothing to write, and the lease is left to the node
                # that wrote it, which trims the log to it a round later
                self.snapshot_at = self.last_event
                return
            if not await self.bus.try_lease("compact", COMPACT_LEASE):
                return
            # the previous snapshot's position, read apart from it (a store from before has only the snapshot),
            # and again now that the lease is this node's: another node may have written one since
            prev = await store.get_meta(SNAPSHOT_EVENT_KEY)
            if prev is not None:
                prev_id = prev.decode()
            else:
                old = await store.get_meta(SNAPSHOT_KEY)
                prev_id = json.loads(old).get("event_id", "0-0") if old else "0-0"
                del old
            if self.fence.fenced or self.epoch != epoch:
                return                  # the table was dropped or reloaded meanwhile: not one to store
            at = self.last_event
            if event_key(prev_id) >= event_key(at):
                # another node stored this position already (each node would write the same table once
                # in turn), or a later one: this node reads the log behind it and writes nothing older
                if prev_id == at:
                    self.snapshot_at = at
                return
            routes, blob = self._snapshot(at, prev_id)
            try:
                await store.put_meta(SNAPSHOT_KEY, blob)
            finally:
                del blob
                if _malloc_trim is not None:
                    # all of it: server.py keeps 16 MB at the heap's top for the message path's bursts, and
                    # the snapshot's freed heap lies there (measured: with that pad, nothing went back);
                    # a burst after it faults those pages in again, once per snapshot at most
                    _malloc_trim(0)
            # after the snapshot: should this node stop in between, the next trims to an older position
            await store.put_meta(SNAPSHOT_EVENT_KEY, at.encode())
            self.snapshot_at = self.written = at
            log.info("route snapshot written (%d routes, events up to %s)", routes, at)
            if prev_id != "0-0":
                await self.bus.trim_events(prev_id)
                self.trimmed = prev_id
        except Exception as exc:
            log.warning("route snapshot failed: %s", exc)
