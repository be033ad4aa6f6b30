"""A brokerd node in a cluster (asyncio side; the broker stays pure).

What the node does, and with what:

- **Membership** -- a Redis key per node with a TTL, refreshed every second
  (its link address and MQTT URLs inside); a node whose key is gone is dead.
- **Routes** -- each node announces, on the cluster event log (a Redis
  Stream), how many subscriptions (and how many of stored sessions) it has per
  topic filter, and its shared-group members; every node keeps the whole
  table (``routes.ClusterRoutes``). A joining node loads the route snapshot
  from the store and replays the log from there; a node compacts the log
  into a new snapshot every 30 s.
- **Forwarding** -- a message goes once to every other node with a matching
  route, over a direct TCP link (``link.Link``). When that node holds stored
  sessions for it, the publisher is acknowledged only once that node has
  stored it too (a request id and an ACK frame).
- **Sessions** -- a Redis hash maps each client id to the node that holds its
  session. A CONNECT for a session held elsewhere takes it over: that node
  disconnects the old connection (0x8E), writes what it still owes to the
  store and lets go; this node loads the session from the store. The sessions
  of a dead node are adopted by one survivor, which also publishes the wills
  of its connected clients.
- **Handoff** -- while a stored session moves, messages for it must neither
  be lost nor doubled nor reordered, though every node's route table changes
  at its own pace. The old owner asks the new one to hold what arrives for
  the session's filters (HANDOFF / HOLDING), forwards to it what still
  arrives itself, and moves the routes from itself to the new owner in one
  event of the log; once every node confirms, on its own link, that it
  applied that event (SYNC / SYNCED: nothing more can come by the old route),
  it lets the session go (RELEASED). The new owner loads the session and
  adds what it held: first what came through the old owner, then the rest.
- **Fencing** -- a node that cannot reach Redis for longer than it takes the
  others to declare it dead disconnects its clients (v5: 0x9C Use another
  server, with the address of another node), lets go of its sessions and
  refuses new CONNECTs (0x88 / 3) until Redis is back: a netsplit never leaves
  two nodes holding one session.
"""

import asyncio
import base64
import itertools
import json
import logging
import os
import ssl
import time

from redis.exceptions import RedisError

from ..protocol import reason as rc
from ..protocol.codec import _properties, encode_properties
from ..protocol.packets import PUBLISH as PUBLISH_PROPS
from ..protocol.packets import Publish
from ..routing.topic import matches
from ..store.records import pack_will, unpack_will
from . import frames
from .bus import Bus, redacted
from .link import HANDSHAKE_TIMEOUT, Link
from .routes import ClusterRoutes

log = logging.getLogger("brokerd.cluster")

HEARTBEAT = 1.0          # seconds between membership refreshes
ACK_TIMEOUT = 5.0        # how long a publisher waits for another node to store its message
RELEASE_TIMEOUT = 5.0    # how long a takeover waits for the old node
HANDOFF_TIMEOUT = 1.0    # how long the old owner waits for the new one to hold a moving session's messages
SYNC_TIMEOUT = 2.0       # how long it waits for the other nodes to switch routes
COMPACT_EVERY = float(os.environ.get("BROKERD_COMPACT_INTERVAL", "30"))   # seconds between route snapshots
ORPHAN_TIMEOUT = 30.0    # how long messages for a dead node's sessions are refused awaiting their adoption
SNAPSHOT_KEY = "cluster.routes"
MAX_CONTROL_FRAME = 1024 * 1024     # bytes of a HANDOFF / HOLDING (a session's filters); larger: no handoff
LINK_RETRY = 1.0                    # seconds after a failed link attempt before dialling that node again
WAITING_BYTES = 16 * 1024 * 1024    # frames held for a node while its link is being opened
MAX_UNAUTHENTICATED = 64            # accepted links not yet authenticated, in all ...
MAX_UNAUTHENTICATED_PER_ADDRESS = 8     # ... and from one IP address: beyond, a new socket is closed at once


class ClusterError(Exception):
    """The node cannot join its cluster (said in one line, at start-up)."""


def link_tls(config) -> tuple:
    """(server, client) SSL contexts of mutual TLS on the node links, or (None, None).

    Either side presents its certificate and requires one the cluster's CA
    signed; that is what makes a peer a member (host names are not checked:
    nodes reach each other at addresses a certificate seldom names, so the CA
    must be the cluster's own)."""
    if not config.cluster_tls_cert:
        return None, None
    try:
        server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=config.cluster_tls_ca)
        server.load_cert_chain(config.cluster_tls_cert, config.cluster_tls_key)
        server.verify_mode = ssl.CERT_REQUIRED
        client = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=config.cluster_tls_ca)
        client.load_cert_chain(config.cluster_tls_cert, config.cluster_tls_key)
    except (OSError, ssl.SSLError) as exc:
        raise ClusterError(f"cluster link TLS (--cluster-tls-cert/-key/-ca): {exc}") from None
    client.check_hostname = False
    client.verify_mode = ssl.CERT_REQUIRED
    return server, client


def _event_key(eid: str) -> tuple[int, int]:
    ms, _, seq = eid.partition("-")
    return int(ms), int(seq or 0)


class _Holder:
    """A stored session on the move, at a node it leaves (``old`` is None:
    what arrives for its filters goes on to the new owner over ``link``) or
    at the node it comes to (what arrives is held: ``old``, forwarded by the
    old owner, and ``new``, the rest, until the session is loaded here)."""

    __slots__ = ("tenant", "cid", "filters", "link", "peer", "counts", "old", "new", "since")

    def __init__(self, tenant, cid, filters, link, peer, arriving: bool, since: float):
        self.tenant, self.cid, self.filters = tenant, cid, filters
        self.link, self.peer = link, peer
        self.counts: dict = {}
        self.old: list | None = [] if arriving else None        # [(msg, waiter or None)]
        self.new: list = []
        self.since = since

    def wants(self, topic: str) -> bool:
        return any(matches(f, topic) for f in self.filters)


class _Join:
    """Calls ``done(all ok)`` after ``n`` calls."""

    __slots__ = ("n", "ok", "done")

    def __init__(self, n: int, done):
        self.n, self.ok, self.done = n, True, done

    def __call__(self, ok: bool) -> None:
        self.ok = self.ok and ok
        self.n -= 1
        if self.n == 0:
            self.done(self.ok)


def _b64(raw: bytes | None) -> str | None:
    return base64.b64encode(raw).decode() if raw else None


def _unb64(text: str | None) -> bytes:
    return base64.b64decode(text) if text else b""


class ClusterNode:
    def __init__(self, server, url: str, link_host: str = "127.0.0.1", link_port: int = 0):
        config = server.config
        self.server = server
        self.secret = config.link_secret()            # the cluster secret links prove (None: mutual TLS only)
        self.tls_server, self.tls_client = link_tls(config)
        # a forwarded message is at most an MQTT packet plus its tenant, shared group and filter names
        self.max_frame = max(config.max_packet_size, MAX_CONTROL_FRAME) + 4 * 65536
        self._accepted: set[Link] = set()             # authenticated links other nodes opened to this one
        self._unauthenticated: dict[str, int] = {}    # IP address -> accepted links still proving themselves
        self.broker = server.broker
        self.loop = server.loop
        self.flusher = server.flusher
        self.id = server.config.node_id
        self.bus = Bus(url, self.id, ttl=5.0)
        self.routes = ClusterRoutes(self.id)
        self.link_host, self.link_port = link_host, link_port
        self.link_address = ""
        self.members: dict[str, dict] = {}
        self.links: dict[str, Link] = {}             # links this node opened, by peer
        self._connecting: dict[str, asyncio.Task] = {}
        self._waiting: dict[str, list[bytes]] = {}    # frames for a peer whose link is being opened
        self._waiting_bytes: dict[str, int] = {}      # ... and their size
        self._retry_at: dict[str, float] = {}         # peer -> when its link may be dialled again
        self._req = itertools.count(1)
        self._acks: dict[int, tuple] = {}             # req -> (waiter, deadline, peer)
        self._releases: dict[int, tuple] = {}         # req -> (future, node asked)
        self._answers: dict[int, tuple] = {}          # req -> (future, node asked): HOLDING and SYNCED
        self._holders: dict[str, list[_Holder]] = {}  # tenant -> its sessions moving through this node
        self._arriving: dict[tuple, _Holder] = {}     # (tenant, client id) -> holder, at the new owner
        self._claiming: set[tuple] = set()            # (tenant, client id) this node is taking over
        self._frozen: set[tuple] = set()              # (tenant, filter) not announced during a handoff
        self._syncs: list[tuple] = []                 # (event id, node, req) to answer once applied
        self._announce_lock = asyncio.Lock()
        self._announced: dict[tuple, tuple] = {}      # (tenant, filter) -> (subs, durable, {group: members})
        self._dirty: set[tuple] = set()                # (tenant, filter) whose counts changed
        self._outbox: list[dict] = []                  # other events to publish, in order
        self._orphaned: dict[str, float] = {}          # dead node -> until when its sessions await adoption
        self._dirty_event = asyncio.Event()
        self.last_event = "0-0"
        self.fenced = False
        self._last_ok = time.monotonic()
        self._tasks: list[asyncio.Task] = []
        self._link_server = None
        self.stats_totals: dict[str, float] = {}

    # ================================================================ start

    async def start(self) -> None:
        tls = {"ssl": self.tls_server, "ssl_handshake_timeout": HANDSHAKE_TIMEOUT} if self.tls_server else {}
        self._link_server = await self.loop.create_server(lambda: Link(self), self.link_host, self.link_port,
                                                          **tls)
        port = self._link_server.sockets[0].getsockname()[1]
        self.link_address = f"{self.link_host}:{port}"
        try:
            self.members = await self.bus.members()
        except (RedisError, OSError) as exc:
            raise ClusterError(f"cannot reach the cluster bus {redacted(self.bus.url)}: {exc}") from None
        self.members.pop(self.id, None)
        await self._load_snapshot()
        await self.bus.heartbeat(self.info())
        # anything a former incarnation of this node announced is void
        await self.bus.publish_events([{"t": "reset", "n": self.id}])
        await self._adopt_orphans()
        for ns in self.broker.namespaces.values():
            for filt, _ in ns.trie.items():
                self._dirty.add((ns.name, filt))
        self._dirty_event.set()
        for coro, name in ((self._heartbeat_loop(), "cluster-heartbeat"), (self._event_loop(), "cluster-events"),
                           (self._announce_loop(), "cluster-announce"), (self._compact_loop(), "cluster-compact"),
                           (self._timeout_loop(), "cluster-timeouts")):
            self._tasks.append(self.loop.create_task(coro, name=name))
        log.info("node %s joined the cluster (%d other nodes, link %s)", self.id, len(self.members),
                 self.link_address)

    def info(self) -> dict:
        admin = self.server.admin.address if self.server.admin is not None else None
        mqtt = [f"{lst.scheme}://{self.server.advertised(f'{lst.host}:{lst.port}')}{lst.path}"
                for lst in self.server.bound]
        return {"link": self.server.advertised(self.link_address), "mqtt": mqtt,
                "admin": admin and self.server.advertised(admin), "ref": self.server.config.server_reference,
                "started": time.time()}

    async def _load_snapshot(self) -> None:
        store = self.server.store
        if store is None:
            return
        blob = await store.get_meta(SNAPSHOT_KEY)
        if not blob:
            return
        snap = json.loads(blob)
        self.routes.load(snap, exclude={self.id} | (set(snap.get("nodes", ())) - set(self.members)))
        self.last_event = snap.get("event_id", "0-0")
        log.info("route snapshot loaded (%d routes, %d shared groups, events after %s)", len(snap.get("routes", ())),
                 len(snap.get("groups", ())), self.last_event)

    async def stop(self, graceful: bool = True) -> None:
        """Leave the cluster: routes withdrawn, sessions left for adoption."""
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            try:
                await t
            except (asyncio.CancelledError, Exception):
                pass
        if graceful and not self.fenced:
            try:
                # its persistent sessions await adoption: the others refuse their messages meanwhile
                await self.bus.publish_events([{"t": "reset", "n": self.id, "keep": 1}])
                await self.bus.leave()
            except Exception as exc:
                log.warning("could not announce leaving the cluster: %s", exc)
        for link in [*self.links.values(), *self._accepted]:
            link.close()
        if self._link_server is not None:
            self._link_server.close()
        await self.bus.close()

    # ========================================================== membership

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT)
            try:
                await self.bus.heartbeat(self.info())
                members = await self.bus.members()
                members.pop(self.id, None)
                await self._publish_counts()
            except Exception as exc:
                if not self.fenced and time.monotonic() - self._last_ok > self.bus.ttl - 1.5:
                    await self._fence(exc)
                continue
            self._last_ok = time.monotonic()
            if self.fenced:
                await self._unfence()
            gone = set(self.members) - set(members)
            self.members = members
            for node in members:
                self._orphaned.pop(node, None)     # back (restarted): it announces its routes afresh
            for node in gone:
                self._node_gone(node)

    async def _publish_counts(self) -> None:
        auth = self.broker.auth
        local = {ns.name: len(ns.channels) for ns in self.broker.namespaces.values()}
        totals = await self.bus.set_counts(local)
        if hasattr(auth, "remote_connected"):
            auth.remote_connected = {t: totals[t] - local.get(t, 0) for t in totals}
        b = self.broker
        t = b.totals()
        await self.bus.set_stats({"connected": b.connected, "sessions": b.session_count(),
                                  "subscriptions": b.subscription_count(), "retained": b.retained_count(),
                                  "msgs_received": t["msgs_received"], "msgs_sent": t["msgs_sent"],
                                  "bytes_received": t["bytes_received"], "bytes_sent": t["bytes_sent"]})
        totals_stats: dict[str, float] = {}
        for stats in (await self.bus.all_stats()).values():
            for k, v in stats.items():
                totals_stats[k] = totals_stats.get(k, 0) + float(v)
        totals_stats["nodes"] = len(self.members) + 1
        self.stats_totals = totals_stats

    def _node_gone(self, node: str) -> None:
        """A node's membership expired. Its persistent sessions wait for a
        survivor to adopt them: until that survivor announced them (its "gone"
        event), QoS 1/2 messages for them are refused (the publisher is told,
        and sends again) instead of being acknowledged for nobody."""
        log.warning("node %s left the cluster", node)
        if self.routes.drop_node(node, keep_durable=True):
            self._orphaned[node] = self.loop.time() + ORPHAN_TIMEOUT
        link = self.links.pop(node, None)
        if link is not None:
            link.close()
        self._fail_requests(node)
        self.loop.create_task(self._reap(node))

    async def _reap(self, node: str) -> None:
        """Adopt the stored sessions of a node that is gone (one survivor does)."""
        try:
            if not await self.bus.reap(node):
                return                   # another survivor does it (and announces it)
        except Exception:
            log.exception("adopting the sessions of node %s failed", node)
            return
        try:
            graceful = await self.bus.left_gracefully(node)
            adopted = 0
            for tenant, cid in await self.bus.owned(node):
                token = await self.bus.lock(tenant, cid)
                try:
                    if await self.bus.owner(tenant, cid) != node:
                        continue
                    if await self._load_session(tenant, cid, wills=not graceful):
                        await self.bus.claim(tenant, cid, True, node)
                        adopted += 1
                finally:
                    if token:
                        await self.bus.unlock(tenant, cid, token)
            wills = 0
            if not graceful:
                now = self.loop.time()
                for tenant, cid, blob in await self.bus.take_wills(node):
                    will = unpack_will(blob)
                    if will is not None:
                        self.broker.publish_gone_will(tenant, cid, will, now)
                        wills += 1
            await self.bus.forget_node(node)
            log.warning("adopted %d sessions of node %s%s", adopted, node,
                        "" if graceful else f", published {wills} wills of its clients")
        except Exception:
            log.exception("adopting the sessions of node %s failed", node)
        finally:
            self._apply({"t": "gone", "n": self.id, "of": node})
            self._queue_event({"t": "gone", "n": self.id, "of": node})

    async def _adopt_orphans(self) -> None:
        """Stored sessions no live node holds (the whole cluster was down, or
        Redis lost its registry) come here, so that messages for them are
        queued again -- one node at a time does this check."""
        store = self.server.store
        if store is None or not store.durable:
            return
        if not await self.bus.redis.set(self.bus.k("orphans"), self.id, nx=True, ex=60):
            return
        try:
            records, _ = await store.load()
            alive = set(self.members) | {self.id}
            adopted = 0
            for rec in records:
                # under the client id's lock, as a CONNECT would take it
                token = await self.bus.lock(rec.tenant, rec.client_id)
                try:
                    owner = await self.bus.owner(rec.tenant, rec.client_id)
                    if owner in alive:
                        continue
                    self.broker.persist.restore(self.broker, [rec], [], self.loop.time())
                    await self.bus.claim(rec.tenant, rec.client_id, True, owner)
                    adopted += 1
                finally:
                    if token:
                        await self.bus.unlock(rec.tenant, rec.client_id, token)
            if adopted:
                log.warning("adopted %d stored sessions no live node held", adopted)
        finally:
            await self.bus.redis.delete(self.bus.k("orphans"))

    def _holds(self, tenant: str, cid: str) -> bool:
        ns = self.broker.namespaces.get(tenant)
        return ns is not None and cid in ns.sessions

    async def _load_session(self, tenant: str, cid: str, wills: bool = True) -> bool:
        """Bring a stored session into this node (takeover or adoption)."""
        store, persist = self.server.store, self.broker.persist
        if store is None or persist is None:
            return False
        rec = await store.load_session(tenant, cid)
        if rec is None:
            return False
        if not wills:
            rec.will = None
        persist.restore(self.broker, [rec], [], self.loop.time())
        if self._holds(tenant, cid):
            for filt in self.broker.namespaces[tenant].sessions[cid].subscriptions:
                self.route_dirty(tenant, filt)
            return True
        return False

    # ============================================================== fencing

    async def _fence(self, exc) -> None:
        self.fenced = True
        log.error("lost the cluster bus (%s): this node fences itself -- clients go to other nodes, "
                  "sessions are left to them, new CONNECTs refused until it is back", exc)
        now = self.loop.time()
        ref = self.other_node_url()
        code = rc.USE_ANOTHER_SERVER if ref else rc.SERVER_SHUTTING_DOWN
        for ch in list(self.broker.channels):
            ch.disconnect(code, "this node lost the cluster", now, will=False, server_reference=ref)
        if self.server.writer is not None:
            await self.server.writer.drain(5.0)
        self.broker.drop_all_sessions()
        for node in list(self.routes.nodes()):
            self.routes.drop_node(node)
        for tenant, cid in list(self._arriving):
            self._flush_arriving(tenant, cid, ok=False)
        self._fail_requests(None)

    async def _unfence(self) -> None:
        log.warning("cluster bus reachable again: node %s rejoins", self.id)
        await self.bus.publish_events([{"t": "reset", "n": self.id}])
        self._announced.clear()
        await self._reload_routes()
        self.fenced = False

    async def _reload_routes(self) -> None:
        self.routes = ClusterRoutes(self.id)
        self.last_event = "0-0"
        await self._load_snapshot()

    def other_node_url(self, scheme: str = "mqtt") -> str | None:
        for info in self.members.values():
            if info.get("ref") and scheme == "mqtt":
                return info["ref"]
            for url in info.get("mqtt", ()):
                if url.startswith(scheme + "://"):
                    return url.split("://", 1)[1].split("/", 1)[0]
        return None

    # ================================================================ events

    async def _event_loop(self) -> None:
        while True:
            try:
                events = await self.bus.read_events(self.last_event, block_ms=1000)
            except asyncio.CancelledError:
                raise
            except Exception:
                await asyncio.sleep(0.5)
                continue
            for eid, e in events:
                self.last_event = eid
                if e.get("n") == self.id or self.fenced:
                    continue
                try:
                    self._apply(e)
                except Exception:
                    log.exception("bad cluster event %r", e)
            if self._syncs and events:
                self._answer_syncs()

    def _apply(self, e: dict) -> None:
        kind = e["t"]
        if kind == "multi":                 # several changes at once (a handoff): no message sees half of them
            for sub in e["e"]:
                if sub.get("n") != self.id:
                    self._apply(sub)
        elif kind == "route":
            self.routes.set_route(e["n"], e["tn"], e["f"], e["s"], e["d"])
        elif kind == "group":
            self.routes.set_group(e["n"], e["tn"], e["g"], e["f"], e["m"])
        elif kind == "reset":               # a node leaves (keep: its sessions await adoption) or rejoins
            if e.get("keep") and e["n"] != self.id:
                if self.routes.drop_node(e["n"], keep_durable=True):
                    self._orphaned[e["n"]] = self.loop.time() + ORPHAN_TIMEOUT
            else:
                self.routes.drop_node(e["n"])
                self._orphaned.pop(e["n"], None)
        elif kind == "gone":                # node "of" is adopted: nothing of it awaits any more
            if e["of"] != self.id:
                self.routes.drop_node(e["of"])
                self._orphaned.pop(e["of"], None)
        elif kind == "retain":
            ns = self.broker.namespace(e["tn"])
            payload = _unb64(e.get("p"))
            if not payload:
                ns.retained.delete(e["tp"])
                return
            props = None
            raw = _unb64(e.get("x"))
            if raw:
                props, _ = _properties(raw, 0, len(raw), PUBLISH_PROPS)
            msg = Publish(e["tp"], payload, e["q"], True, False, 0, props)
            if e.get("e") is not None:
                msg.expiry_at = e["e"] - self.broker.wall_offset
            ns.retained.set(e["tp"], msg)

    def retained_changed(self, tenant: str, msg: Publish) -> None:
        """A client set or cleared a retained message here: every node keeps a copy."""
        if msg.topic.startswith("$SYS/"):
            return
        e = {"t": "retain", "n": self.id, "tn": tenant, "tp": msg.topic, "q": msg.qos,
             "p": _b64(msg.payload), "x": _b64(encode_properties(msg.properties)) if msg.properties else None,
             "e": None if msg.expiry_at is None else msg.expiry_at + self.broker.wall_offset}
        self._queue_event(e)

    def _queue_event(self, e: dict) -> None:
        self._outbox.append(e)
        self._dirty_event.set()

    # ========================================================= announcements

    def route_dirty(self, tenant: str, filt: str) -> None:
        self._dirty.add((tenant, filt))
        self._dirty_event.set()

    async def _announce_loop(self) -> None:
        while True:
            await self._dirty_event.wait()
            await asyncio.sleep(0.01)          # gather a burst of subscriptions into one round
            self._dirty_event.clear()
            failed = False
            async with self._announce_lock:
                dirty, self._dirty = self._dirty, set()
                outbox, self._outbox = self._outbox, []
                if self._frozen:
                    held = {item for item in dirty if item in self._frozen}
                    if held:
                        dirty -= held
                        self._dirty |= held        # announced when the handoff is over
                events = []
                changes: list = []
                for item in dirty:
                    events.extend(self._route_events(*item, changes=changes))
                events.extend(outbox)                  # after the routes (an adoption's "gone" follows its routes)
                if not events:
                    continue
                try:
                    if self.fenced:
                        raise ConnectionError("fenced")
                    await self.bus.publish_events(events)
                except Exception as exc:
                    # not announced: forget that it was, so that the retry (or the rejoin) announces it
                    for key, before, now in changes:
                        if self._announced.get(key) == now:
                            if before is None:
                                self._announced.pop(key, None)
                            else:
                                self._announced[key] = before
                    if not self.fenced:
                        log.warning("could not announce routes (%s); retrying", exc)
                    self._dirty |= dirty
                    self._outbox[:0] = outbox
                    self._dirty_event.set()
                    failed = True
            if failed:
                await asyncio.sleep(0.5)

    def _route_events(self, tenant: str, filt: str, changes: list | None = None) -> list[dict]:
        """The events that announce this node's current counts for ``filt``;
        records them as announced (``changes`` gets (key, before, now) to undo
        that when the events could not be published)."""
        ns = self.broker.namespaces.get(tenant)
        route = ns.trie.get(filt) if ns is not None else None
        subs = len(route.subs) if route is not None else 0
        durable = sum(1 for s in route.subs if s.durable) if route is not None else 0
        groups = {name: len(g.members) for name, g in route.groups.items()} if route is not None else {}
        before = self._announced.get((tenant, filt), (0, 0, {}))
        now = (subs, durable, groups)
        if now == before:
            return []
        if changes is not None:
            changes.append(((tenant, filt), self._announced.get((tenant, filt)), now if (subs or durable or groups) else None))
        if subs or durable or groups:
            self._announced[(tenant, filt)] = now
        else:
            self._announced.pop((tenant, filt), None)
        events = []
        if (subs, durable) != before[:2]:
            events.append({"t": "route", "n": self.id, "tn": tenant, "f": filt, "s": subs, "d": durable})
        for name in set(groups) | set(before[2]):
            if groups.get(name, 0) != before[2].get(name, 0):
                events.append({"t": "group", "n": self.id, "tn": tenant, "g": name, "f": filt,
                               "m": groups.get(name, 0)})
        return events

    async def _compact_loop(self) -> None:
        """Now and then one node writes the route table as a snapshot to the
        store and trims the event log to the previous snapshot's position."""
        while True:
            await asyncio.sleep(COMPACT_EVERY)
            store = self.server.store
            if store is None or self.fenced:
                continue
            try:
                if not await self.bus.redis.set(self.bus.k("compact"), self.id, nx=True,
                                                ex=int(COMPACT_EVERY * 0.8)):
                    continue
                snap = self.routes.snapshot()
                for (tenant, filt), (subs, durable, groups) in self._announced.items():
                    snap["routes"].append([self.id, tenant, filt, subs, durable])
                    for name, members in groups.items():
                        snap["groups"].append([self.id, tenant, name, filt, members])
                old = await store.get_meta(SNAPSHOT_KEY)
                snap["event_id"] = self.last_event
                snap["nodes"] = sorted(set(self.members) | {self.id})
                snap["prev_id"] = json.loads(old).get("event_id", "0-0") if old else "0-0"
                await store.put_meta(SNAPSHOT_KEY, json.dumps(snap).encode())
                log.info("route snapshot written (%d routes, events up to %s)", len(snap["routes"]),
                         snap["event_id"])
                if snap["prev_id"] != "0-0":
                    await self.bus.trim_events(snap["prev_id"])
            except Exception as exc:
                log.warning("route snapshot failed: %s", exc)

    # =========================================================== forwarding

    def forward(self, ns, msg: Publish, groups: list, now: float) -> tuple[int, list]:
        """Send ``msg`` to the other nodes that want it and decide the shared
        groups cluster-wide (local members through the broker). -> (deliveries
        counted, [request ids whose ACK the publisher waits for])."""
        if self.fenced or msg.topic.startswith("$SYS/"):
            return self._local_groups(ns, msg, groups, now), []
        nodes, rgroups = self.routes.match(ns.name, msg.topic)
        holders = self._holders.get(ns.name) if self._holders else None
        if not nodes and not rgroups and not holders:
            return (self._local_groups(ns, msg, groups, now) if groups else 0), []
        count = 0
        waits = []
        parts = self._parts(ns, msg, now)
        if holders:
            for h in holders:
                if h.wants(msg.topic):
                    waiter = None
                    if msg.qos:
                        req = next(self._req)
                        self._wait_ack(req, h.peer if h.old is None else self.id, waits)
                        waiter = self._resolver(req)
                    self._hold(h, msg, parts, waiter)
                    count += 1
        for node, durable in nodes.items():
            if node in self._orphaned:
                if durable and msg.qos:          # for sessions awaiting adoption: refused (see _node_gone)
                    req = next(self._req)
                    waits.append(req)
                    self._acks[req] = (None, 0.0, node)      # fails at the next timeout round
                continue
            req = next(self._req) if durable and msg.qos else 0
            self._send(node, frames.publish(req, *parts))
            if req:
                self._wait_ack(req, node, waits)
            count += 1
        local = {(g.name, g.filter): g for g in groups}
        for gname, filt, members in rgroups:
            group = local.pop((gname, filt), None)
            target = self.routes.pick_group_node(ns.name, gname, filt, members, len(group.members) if group else 0)
            if target is None:
                if group is not None and self.broker.deliver_shared(ns, group, msg, now):
                    count += 1
                continue
            req = next(self._req) if msg.qos else 0
            self._send(target, frames.publish(req, *parts, gname.encode(), filt.encode()))
            if req:
                self._wait_ack(req, target, waits)
            count += 1
        return count + self._local_groups(ns, msg, list(local.values()), now), waits

    def _resolver(self, req: int):
        """A waiter that completes the request ``req`` (as its ACK would)."""
        def resolve(ok: bool) -> None:
            entry = self._acks.pop(req, None)
            if entry is not None and entry[0] is not None:
                entry[0](ok)
        return resolve

    def _hold(self, h: _Holder, msg: Publish, parts: tuple, waiter) -> None:
        """A message for a moving session: on to its new owner, or kept until it is here."""
        if h.old is not None:
            h.new.append((msg, waiter))
            return
        req = 0
        if waiter is not None:
            req = next(self._req)
            self._acks[req] = (waiter, self.loop.time() + ACK_TIMEOUT, h.peer)
        qos, flags = parts[0], parts[1]
        h.link.send(frames.publish(req, qos, flags | frames.TARGET, *parts[2:], h.cid.encode(), b""))

    def _local_groups(self, ns, msg, groups, now) -> int:
        return sum(1 for g in groups if self.broker.deliver_shared(ns, g, msg, now))

    @staticmethod
    def _parts(ns, msg: Publish, now: float) -> tuple:
        """The fields of a PUBLISH frame for ``msg`` (after the request id)."""
        expiry = -1 if msg.expiry_at is None else max(0, int(msg.expiry_at - now))
        raw = msg.enc3
        if raw is not None and not msg.qos and not msg.retain:
            # its 3.x wire form goes as it is: the receiving node sends those bytes on
            return 0, frames.RAW, expiry, ns.name.encode(), msg.topic.encode(), b"", raw
        props = encode_properties(msg.properties) if msg.properties else b""
        return msg.qos, 1 if msg.retain else 0, expiry, ns.name.encode(), msg.topic.encode(), props, msg.payload

    def _wait_ack(self, req: int, node: str, waits: list) -> None:
        waits.append(req)
        self._acks[req] = (None, self.loop.time() + ACK_TIMEOUT, node)

    def wait_for(self, reqs: list, waiter) -> None:
        """Run ``waiter(ok)`` for each ACK of ``reqs`` (or its failure)."""
        for req in reqs:
            entry = self._acks.get(req)
            if entry is not None:
                self._acks[req] = (waiter, entry[1], entry[2])

    def _send(self, node: str, frame: bytes) -> None:
        """To ``node`` over this node's link to it, opened if need be. While a
        link is being opened its frames wait (at most WAITING_BYTES); for a
        second after an attempt failed, frames to that node are dropped (a
        request among them fails at its timeout) instead of dialling it again
        for every message."""
        link = self.links.get(node)
        if link is not None and not link.closed:
            link.send(frame)
            return
        if self._retry_at.get(node, 0.0) > self.loop.time():
            return
        waiting = self._waiting.setdefault(node, [])
        if self._waiting_bytes.get(node, 0) + len(frame) > WAITING_BYTES:
            return
        waiting.append(frame)
        self._waiting_bytes[node] = self._waiting_bytes.get(node, 0) + len(frame)
        if node not in self._connecting:
            self._connecting[node] = self.loop.create_task(self._open_link(node))

    async def _open_link(self, node: str) -> None:
        try:
            info = self.members.get(node)
            if info is None:
                raise ConnectionError(f"node {node} is not a member")
            host, _, port = info["link"].rpartition(":")
            tls = {"ssl": self.tls_client, "ssl_handshake_timeout": HANDSHAKE_TIMEOUT} if self.tls_client else {}
            _, link = await asyncio.wait_for(self.loop.create_connection(
                lambda: Link(self, node), host.strip("[]"), int(port), **tls), HANDSHAKE_TIMEOUT)
            if not await link.ready:
                link.close()
                raise ConnectionError("the link was not authenticated")
            self.links[node] = link
            self._retry_at.pop(node, None)
            self._waiting_bytes.pop(node, None)
            for frame in self._waiting.pop(node, ()):
                link.send(frame)
        except Exception as exc:
            log.warning("no link to node %s: %s (next attempt in %g s at the earliest)", node, exc, LINK_RETRY)
            self._retry_at[node] = self.loop.time() + LINK_RETRY
            self._waiting.pop(node, None)
            self._waiting_bytes.pop(node, None)
            self._fail_requests(node)
        finally:
            self._connecting.pop(node, None)

    def link_socket_opened(self, link: Link) -> bool:
        """An accepted socket, not authenticated yet: whether it may try (bounded in
        all and per address, so sockets that never finish cannot crowd out a node)."""
        pending = self._unauthenticated
        if (sum(pending.values()) >= MAX_UNAUTHENTICATED
                or pending.get(link.address, 0) >= MAX_UNAUTHENTICATED_PER_ADDRESS):
            log.warning("cluster link from %s refused: too many links not yet authenticated", link.address)
            return False
        pending[link.address] = pending.get(link.address, 0) + 1
        link.counted = True
        return True

    def _uncount(self, link: Link) -> None:
        if link.counted:
            link.counted = False
            n = self._unauthenticated.get(link.address, 0) - 1
            if n > 0:
                self._unauthenticated[link.address] = n
            else:
                self._unauthenticated.pop(link.address, None)

    def admit(self, link: Link) -> None:
        """An accepted link proved the secret: admit it if the node it names is a
        member (a node that just joined may be newer than this node's list)."""
        if link.claimed in self.members:
            link.admitted()
            return

        async def look_up():
            try:
                members = await self.bus.members()
            except Exception as exc:
                link.fail(f"membership unknown ({exc})")
                return
            if link.claimed in members:
                self.members.setdefault(link.claimed, members[link.claimed])
                link.admitted()
            else:
                link.fail(f"node {link.claimed!r} is not a member of the cluster")

        self.loop.create_task(look_up())

    def link_accepted(self, link: Link) -> None:
        self._uncount(link)
        self._accepted.add(link)
        log.info("cluster link from node %s (%s) authenticated", link.peer, link.address)

    def link_lost(self, link: Link) -> None:
        self._uncount(link)
        self._accepted.discard(link)
        if link.peer is not None and self.links.get(link.peer) is link:
            del self.links[link.peer]
            self._fail_requests(link.peer)

    def _fail_requests(self, node: str | None) -> None:
        for req, (waiter, _, peer) in list(self._acks.items()):
            if node is None or peer == node:
                del self._acks[req]
                if waiter is not None:
                    waiter(False)
        for fut, peer in list(self._releases.values()):
            if not fut.done() and (node is None or peer == node):
                fut.set_result(False)
        for fut, peer in list(self._answers.values()):
            if not fut.done() and (node is None or peer == node):
                fut.set_result(None)

    async def _timeout_loop(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            now = self.loop.time()
            for link in [*self.links.values(), *self._accepted]:
                link.tick(now)
            for (tenant, cid), h in list(self._arriving.items()):
                if (tenant, cid) not in self._claiming and h.since + RELEASE_TIMEOUT < now:
                    self._flush_arriving(tenant, cid)
            for req, (waiter, deadline, _) in list(self._acks.items()):
                if deadline < now:
                    del self._acks[req]
                    if waiter is not None:
                        waiter(False)
            for node, until in list(self._orphaned.items()):
                if until < now:                  # nobody announced an adoption: stop refusing
                    log.warning("no node announced adopting the sessions of node %s", node)
                    self.routes.drop_node(node)
                    del self._orphaned[node]

    # ============================================================== frames in

    def on_frame(self, link: Link, f: tuple) -> None:
        """A frame from an authenticated link. An answer counts only on a link
        from the node it was asked of: ids are a counter, easy to guess."""
        kind = f[0]
        if kind == frames.PUBLISH:
            self._on_publish(link, *f[1:])
        elif kind == frames.ACK:
            entry = self._acks.get(f[1])
            if entry is not None and entry[2] == link.peer:
                del self._acks[f[1]]
                if entry[0] is not None:
                    entry[0](f[2] == 0)
        elif kind == frames.TAKEOVER:
            self.loop.create_task(self._on_takeover(link, f[1], f[2], f[3]))
        elif kind == frames.RELEASED:
            entry = self._releases.get(f[1])
            if entry is not None and entry[1] == link.peer:
                del self._releases[f[1]]
                if not entry[0].done():
                    entry[0].set_result(f[2] == 0)
        elif kind == frames.HANDOFF:
            self.loop.create_task(self._on_handoff(link, f[1], f[2]))
        elif kind in (frames.HOLDING, frames.SYNCED):
            entry = self._answers.get(f[1])
            if entry is not None and entry[1] == link.peer:
                del self._answers[f[1]]
                if not entry[0].done():
                    entry[0].set_result(f[2])
        elif kind == frames.SYNC:
            self._syncs.append((f[2], link.peer, f[1]))
            self._answer_syncs()
        else:
            link.fail(f"unexpected frame of type {kind}")

    def _on_publish(self, link, req, qos, flags, expiry, tenant, topic, props, payload, group, gfilter) -> None:
        now = self.loop.time()
        if flags & frames.RAW:
            # the 3.x QoS 0 wire form: PUBLISH header, remaining length, topic, payload
            raw = payload
            i = 2
            while raw[i - 1] & 0x80:
                i += 1
            msg = Publish(topic, raw[i + 2 + len(topic.encode()):], 0, False)
            msg.enc3 = raw
        else:
            properties = None
            if props:
                properties, _ = _properties(props, 0, len(props), PUBLISH_PROPS)
            msg = Publish(topic, payload, qos, bool(flags & 1), False, 0, properties)
        if expiry >= 0:
            msg.expiry_at = now + expiry
        broker = self.broker
        journal = broker.journal
        if req and (self.fenced or (journal is not None and not journal.healthy)):
            # a fenced node dropped its sessions (the others adopt them): it must not take on
            # anything it could lose -- the publisher's node answers its client with the error
            link.send(frames.ack(req, rc.IMPLEMENTATION_SPECIFIC_ERROR))
            return
        before = len(journal.ops) if journal is not None else 0
        wanting = None
        if flags & frames.TARGET:
            # for one session that moved: the node it left sends what still came there
            h = self._arriving.get((tenant, group))
            if h is not None:
                h.old.append((msg, self._acker(link, req) if req else None))
                return
            ns = broker.namespaces.get(tenant)
            session = ns.sessions.get(group) if ns is not None else None
            if session is not None:
                broker.deliver_to(session, msg, now)
        else:
            broker.receive_forward(broker.namespace(tenant), msg, group or None, gfilter or None, now)
            if self._holders and not group:
                holders = self._holders.get(tenant)
                if holders:
                    wanting = [h for h in holders if h.wants(topic)]
        stored = journal is not None and len(journal.ops) > before
        if not req:
            if wanting:
                parts = (qos, flags, expiry, tenant.encode(), topic.encode(), props, payload)
                for h in wanting:
                    self._hold(h, msg, parts, None)
            return
        if not wanting:
            if stored:
                journal.after_commit(self._acker(link, req))
            else:
                link.send(frames.ack(req, 0))
            return
        join = _Join(int(stored) + len(wanting), self._acker(link, req))
        if stored:
            journal.after_commit(join)
        parts = (qos, flags, expiry, tenant.encode(), topic.encode(), props, payload)
        for h in wanting:
            self._hold(h, msg, parts, join)

    @staticmethod
    def _acker(link, req: int):
        return lambda ok: link.send(frames.ack(req, 0 if ok else rc.IMPLEMENTATION_SPECIFIC_ERROR))

    async def _on_takeover(self, link, req, tenant, cid) -> None:
        """Another node takes a session of this one over (see Handoff above) --
        only while it holds the client id's lock, as a CONNECT there does."""
        try:
            holder_node = await self.bus.lock_holder(tenant, cid)
        except Exception as exc:
            holder_node = None
            log.warning("takeover of %s/%s by node %s: lock unknown (%s)", tenant, cid, link.peer, exc)
        if holder_node != link.peer:
            log.warning("takeover of %s/%s refused: node %s does not hold the client id's lock", tenant, cid,
                        link.peer)
            link.send(frames.released(req, 2))
            return
        ns = self.broker.namespaces.get(tenant)
        session = ns.sessions.get(cid) if ns is not None else None
        holder = None
        if session is not None and session.durable and not self.fenced and link.peer:
            filters = sorted({sub.filter for sub in session.subscriptions.values() if sub.group is None})
            if filters:
                holder = await self._begin_handoff(link, tenant, cid, filters)
        # from here on, what arrives for the session goes to the holder (no await in between)
        found = self.broker.release(tenant, cid, self.loop.time())
        if found:
            for filt in self._announced_filters(tenant):
                self.route_dirty(tenant, filt)
        try:
            if holder is not None:
                await self._switch_routes(holder)
            if found and self.server.writer is not None:
                await self.server.writer.drain(5.0)
        finally:
            if holder is not None:
                self._end_forwarding(holder)
        link.send(frames.released(req, 0 if found else 1))

    async def _ask(self, node: str, send, timeout: float):
        """Send a request (``send(req)``) and wait for its HOLDING/SYNCED answer (None: none came)."""
        req = next(self._req)
        fut = self.loop.create_future()
        self._answers[req] = (fut, node)
        send(req)
        try:
            return await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            return None
        finally:
            self._answers.pop(req, None)

    async def _begin_handoff(self, link, tenant: str, cid: str, filters: list[str]) -> "_Holder | None":
        """Old owner: the new owner holds the session's messages from now on."""
        text = json.dumps({"tenant": tenant, "client_id": cid, "filters": filters})
        if len(text) > MAX_CONTROL_FRAME:
            log.warning("handoff of %s/%s: its %d filters are too long to hand over (%d bytes)", tenant, cid,
                        len(filters), len(text))
            return None
        keys = [(tenant, f) for f in filters]
        self._frozen.update(keys)
        answer = await self._ask(link.peer, lambda r: link.send(frames.handoff(r, text)), HANDOFF_TIMEOUT)
        counts = json.loads(answer) if isinstance(answer, str) else None
        if not counts:
            self._frozen.difference_update(keys)
            for key in keys:
                self.route_dirty(*key)
            return None
        holder = _Holder(tenant, cid, filters, link, link.peer, False, self.loop.time())
        holder.counts = counts
        self._holders.setdefault(tenant, []).append(holder)
        return holder

    async def _switch_routes(self, h: _Holder) -> None:
        """Old owner: move the session's routes to the new owner in one event,
        then wait until every node applied it."""
        events = []
        async with self._announce_lock:
            for f in h.filters:
                key = (h.tenant, f)
                self._frozen.discard(key)
                self._dirty.discard(key)
                events.extend(self._route_events(h.tenant, f))      # this node's counts, without the session
                subs, durable = h.counts.get(f, (0, 0))
                events.append({"t": "route", "n": h.peer, "tn": h.tenant, "f": f, "s": subs + 1, "d": durable + 1})
            try:
                ids = await self.bus.publish_events([{"t": "multi", "n": self.id, "e": events}])
            except Exception as exc:
                log.warning("handoff of %s/%s: could not switch routes (%s)", h.tenant, h.cid, exc)
                return
        peers = [n for n in self.members if n != self.id]
        answers = await asyncio.gather(*(
            self._ask(n, lambda r, n=n: self._send(n, frames.sync(r, ids[-1])), SYNC_TIMEOUT) for n in peers))
        late = [n for n, a in zip(peers, answers, strict=True) if a is None]
        if late:
            log.warning("handoff of %s/%s: nodes %s did not confirm the route switch", h.tenant, h.cid, late)

    def _end_forwarding(self, h: _Holder) -> None:
        holders = self._holders.get(h.tenant)
        if holders and h in holders:
            holders.remove(h)
            if not holders:
                del self._holders[h.tenant]
        for f in h.filters:
            subs, durable = h.counts.get(f, (0, 0))
            self.routes.set_route(h.peer, h.tenant, f, subs + 1, durable + 1)

    async def _on_handoff(self, link, req: int, text: str) -> None:
        """New owner: hold what arrives for a session this node is taking over."""
        d = json.loads(text)
        tenant, cid, filters = d["tenant"], d["client_id"], d["filters"]
        if (tenant, cid) not in self._claiming or (tenant, cid) in self._arriving or self.fenced:
            link.send(frames.holding(req, "null"))
            return
        counts = {}
        async with self._announce_lock:
            for f in filters:
                key = (tenant, f)
                self._frozen.add(key)
                subs, durable, groups = self._announced.get(key, (0, 0, {}))
                counts[f] = [subs, durable]
                self._announced[key] = (subs + 1, durable + 1, groups)       # what the old owner will announce
            h = _Holder(tenant, cid, filters, link, link.peer, True, self.loop.time())
            self._holders.setdefault(tenant, []).append(h)
            self._arriving[(tenant, cid)] = h
        link.send(frames.holding(req, json.dumps(counts)))

    def _flush_arriving(self, tenant: str, cid: str, ok: bool = True) -> None:
        """New owner: the session is here (or will not be): what was held goes to it."""
        h = self._arriving.pop((tenant, cid), None)
        if h is None:
            return
        holders = self._holders.get(tenant)
        if holders and h in holders:
            holders.remove(h)
            if not holders:
                del self._holders[tenant]
        ns = self.broker.namespaces.get(tenant)
        session = ns.sessions.get(cid) if ns is not None and ok else None
        now = self.loop.time()
        waiters = []
        for msg, waiter in h.old + h.new:
            if session is not None:
                self.broker.deliver_to(session, msg, now)
            if waiter is not None:
                waiters.append(waiter)
        if h.old or h.new:
            log.info("handoff of %s/%s: %d messages came through the old node, %d held here", tenant, cid,
                     len(h.old), len(h.new))
        journal = self.broker.journal
        if waiters:
            if not ok:
                for w in waiters:
                    w(False)
            elif journal is not None:
                journal.after_commit(lambda done: [w(done) for w in waiters])
            else:
                for w in waiters:
                    w(True)
        for f in h.filters:
            self._frozen.discard((tenant, f))
            self.route_dirty(tenant, f)

    def _answer_syncs(self) -> None:
        """SYNCs whose event this node applied: answered over this node's own link to the asker."""
        done = _event_key(self.last_event)
        keep = []
        for eid, node, req in self._syncs:
            if self.fenced or _event_key(eid) <= done:
                if node:
                    self._send(node, frames.synced(req))
            else:
                keep.append((eid, node, req))
        self._syncs = keep

    def _announced_filters(self, tenant: str) -> list[str]:
        return [f for (t, f) in self._announced if t == tenant]

    # ========================================================== client ids

    def claim(self, channel, tenant: str, cid: str, clean_start: bool, will, cont) -> None:
        """CONNECT of ``cid`` on this node: take its session over from wherever
        it is, then ``cont(now)`` opens it here."""
        self.loop.create_task(self._claim(channel, tenant, cid, clean_start, will, cont))

    async def _claim(self, channel, tenant, cid, clean_start, will, cont) -> None:
        if self.fenced:
            channel.refuse(rc.SERVER_UNAVAILABLE, "this node is out of the cluster")
            return
        token = None
        key = (tenant, cid)
        try:
            # the common case in one round trip: the client id was free, or already here
            owner = await self.bus.try_claim(tenant, cid)
            if owner is not None:
                token = await self.bus.lock(tenant, cid)
                if token is None:
                    channel.refuse(rc.SERVER_BUSY, "the client id is being taken over")
                    return
                owner = await self.bus.owner(tenant, cid)
                if owner is not None and owner != self.id and owner in self.members:
                    self._claiming.add(key)
                    await self._request_release(owner, tenant, cid)
                if not clean_start:
                    await self._load_session(tenant, cid)
                self._flush_arriving(tenant, cid)
                await self.bus.claim(tenant, cid, False, owner)
            elif not clean_start and not self._holds(tenant, cid):
                # free in the registry but perhaps stored: Redis may have lost its registry (restarted
                # empty) before anyone adopted the session -- the store, not the registry, is the truth
                await self._load_session(tenant, cid)
            if channel.state != 1:         # CONNECTING: the client went away meanwhile
                return
            cont(self.loop.time())
            session = channel.session
            if session is not None and session.durable:
                await self.bus.mark_owned(tenant, cid)
            if will is not None and session is not None and not session.durable:
                await self.bus.set_will(tenant, cid, pack_will(will))
        except Exception as exc:
            log.warning("CONNECT of %s/%s refused: cluster unavailable (%s)", tenant, cid, exc)
            if channel.state == 1:
                channel.refuse(rc.SERVER_UNAVAILABLE, "cluster unavailable")
        finally:
            self._claiming.discard(key)
            self._flush_arriving(tenant, cid)
            if token is not None:
                try:
                    await self.bus.unlock(tenant, cid, token)
                except Exception:
                    pass

    async def _request_release(self, node: str, tenant: str, cid: str) -> bool:
        req = next(self._req)
        fut = self.loop.create_future()
        self._releases[req] = (fut, node)
        self._send(node, frames.takeover(req, tenant, cid))
        try:
            return await asyncio.wait_for(fut, RELEASE_TIMEOUT)
        except TimeoutError:
            log.warning("node %s did not release %s/%s in time", node, tenant, cid)
            return False
        finally:
            self._releases.pop(req, None)

    def client_gone(self, tenant: str, cid: str, ended: bool, had_will: bool) -> None:
        """A connection closed here; ``ended``: its session is over too."""
        if self.fenced or not (ended or had_will):
            return

        async def update():
            try:
                await self.bus.gone(tenant, cid, ended, had_will)
            except Exception:
                pass

        self.loop.create_task(update())
