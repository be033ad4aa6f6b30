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
import time

from ..protocol import reason as rc
from ..protocol.codec import _properties, encode_properties
from ..protocol.packets import PUBLISH as PUBLISH_PROPS
from ..protocol.packets import Publish
from ..store.records import pack_will, unpack_will
from . import frames
from .bus import Bus
from .link import Link
from .routes import ClusterRoutes

log = logging.getLogger("brokerd.cluster")

HEARTBEAT = 1.0          # seconds between membership refreshes
ACK_TIMEOUT = 5.0        # how long a publisher waits for another node to store its message
RELEASE_TIMEOUT = 5.0    # how long a takeover waits for the old node
COMPACT_EVERY = 30.0
SNAPSHOT_KEY = "cluster.routes"


def _b64(raw: bytes | None) -> str | None:
    return base64.b64encode(raw).decode() if raw else None


def _unb64(text: str | None) -> bytes:
    return base64.b64decode(text) if text else b""


class ClusterNode:
    def __init__(self, server, url: str, link_host: str = "127.0.0.1", link_port: int = 0):
        self.server = server
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
        self._req = itertools.count(1)
        self._acks: dict[int, tuple] = {}             # req -> (waiter, deadline, peer)
        self._releases: dict[int, tuple] = {}         # req -> (future, node asked)
        self._announced: dict[tuple, tuple] = {}      # (tenant, filter) -> (subs, durable, {group: members})
        self._dirty: set[tuple] = set()
        self._dirty_event = asyncio.Event()
        self.last_event = "0-0"
        self.fenced = False
        self._last_ok = time.monotonic()
        self._tasks: list[asyncio.Task] = []
        self._link_server = None
        self.stats_totals: dict[str, float] = {}

    # ================================================================ start

    async def start(self) -> None:
        self._link_server = await self.loop.create_server(lambda: Link(self), self.link_host, self.link_port)
        port = self._link_server.sockets[0].getsockname()[1]
        self.link_address = f"{self.link_host}:{port}"
        self.members = await self.bus.members()
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
        return {"link": self.link_address, "mqtt": [lst.url for lst in self.server.bound], "admin": admin,
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
                await self.bus.publish_events([{"t": "reset", "n": self.id}])
                await self.bus.leave()
            except Exception as exc:
                log.warning("could not announce leaving the cluster: %s", exc)
        for link in list(self.links.values()):
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
        log.warning("node %s left the cluster", node)
        self.routes.drop_node(node)
        link = self.links.pop(node, None)
        if link is not None:
            link.close()
        self._fail_requests(node)
        self.loop.create_task(self._reap(node))

    async def _reap(self, node: str) -> None:
        """Adopt the stored sessions of a node that is gone (one survivor does)."""
        try:
            if not await self.bus.reap(node):
                return
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
        ns = self.broker.namespaces.get(tenant)
        if ns is not None and cid in ns.sessions:
            for filt in ns.sessions[cid].subscriptions:
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

    def _apply(self, e: dict) -> None:
        kind = e["t"]
        if kind == "route":
            self.routes.set_route(e["n"], e["tn"], e["f"], e["s"], e["d"])
        elif kind == "group":
            self.routes.set_group(e["n"], e["tn"], e["g"], e["f"], e["m"])
        elif kind == "reset":
            self.routes.drop_node(e["n"])
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
        self._dirty.add(("event", json.dumps(e, sort_keys=True)))
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
            dirty, self._dirty = self._dirty, set()
            events = []
            for item in dirty:
                if item[0] == "event":
                    events.append(json.loads(item[1]))
                    continue
                events.extend(self._route_events(*item))
            if not events or self.fenced:
                continue
            try:
                await self.bus.publish_events(events)
            except Exception as exc:
                log.warning("could not announce routes (%s); retrying", exc)
                self._dirty |= dirty
                self._dirty_event.set()
                await asyncio.sleep(0.5)

    def _route_events(self, tenant: str, filt: str) -> list[dict]:
        ns = self.broker.namespaces.get(tenant)
        route = ns.trie.get(filt) if ns is not None else None
        subs = len(route.subs) if route is not None else 0
        durable = sum(1 for s in route.subs if s.durable) if route is not None else 0
        groups = {name: len(g.members) for name, g in route.groups.items()} if route is not None else {}
        before = self._announced.get((tenant, filt), (0, 0, {}))
        now = (subs, durable, groups)
        if now == before:
            return []
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
        if not nodes and not rgroups:
            return (self._local_groups(ns, msg, groups, now) if groups else 0), []
        count = 0
        waits = []
        parts = self._parts(ns, msg, now)
        for node, durable in nodes.items():
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
        link = self.links.get(node)
        if link is not None and not link.closed:
            link.send(frame)
            return
        self._waiting.setdefault(node, []).append(frame)
        if node not in self._connecting:
            self._connecting[node] = self.loop.create_task(self._open_link(node))

    async def _open_link(self, node: str) -> None:
        try:
            info = self.members.get(node)
            if info is None:
                raise ConnectionError(f"node {node} is not a member")
            host, _, port = info["link"].rpartition(":")
            _, link = await self.loop.create_connection(lambda: Link(self, node), host, int(port))
            self.links[node] = link
            for frame in self._waiting.pop(node, ()):
                link.send(frame)
        except Exception as exc:
            log.warning("no link to node %s: %s", node, exc)
            self._waiting.pop(node, None)
            self._fail_requests(node)
        finally:
            self._connecting.pop(node, None)

    def link_accepted(self, link: Link) -> None:
        pass

    def link_lost(self, link: Link) -> None:
        if self.links.get(link.peer) is link:
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

    async def _timeout_loop(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            now = self.loop.time()
            for req, (waiter, deadline, _) in list(self._acks.items()):
                if deadline < now:
                    del self._acks[req]
                    if waiter is not None:
                        waiter(False)

    # ============================================================== frames in

    def on_frame(self, link: Link, f: tuple) -> None:
        kind = f[0]
        if kind == frames.PUBLISH:
            self._on_publish(link, *f[1:])
        elif kind == frames.ACK:
            entry = self._acks.pop(f[1], None)
            if entry is not None and entry[0] is not None:
                entry[0](f[2] == 0)
        elif kind == frames.TAKEOVER:
            self.loop.create_task(self._on_takeover(link, f[1], f[2], f[3]))
        elif kind == frames.RELEASED:
            entry = self._releases.pop(f[1], None)
            if entry is not None and not entry[0].done():
                entry[0].set_result(f[2] == 0)

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
        if journal is not None and not journal.healthy and req:
            link.send(frames.ack(req, rc.IMPLEMENTATION_SPECIFIC_ERROR))
            return
        before = len(journal.ops) if journal is not None else 0
        broker.receive_forward(broker.namespace(tenant), msg, group or None, gfilter or None, now)
        if not req:
            return
        if journal is not None and len(journal.ops) > before:
            journal.after_commit(lambda ok: link.send(frames.ack(req, 0 if ok else rc.IMPLEMENTATION_SPECIFIC_ERROR)))
        else:
            link.send(frames.ack(req, 0))

    async def _on_takeover(self, link, req, tenant, cid) -> None:
        found = self.broker.release(tenant, cid, self.loop.time())
        if found:
            for filt in self._announced_filters(tenant):
                self.route_dirty(tenant, filt)
            if self.server.writer is not None:
                await self.server.writer.drain(5.0)
        link.send(frames.released(req, 0 if found else 1))

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
                    await self._request_release(owner, tenant, cid)
                if not clean_start:
                    await self._load_session(tenant, cid)
                await self.bus.claim(tenant, cid, False, owner)
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
