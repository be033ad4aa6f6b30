"""In-memory stand-ins for what a cluster node works with -- the Redis bus,
the node links, the shared store, the broker -- and a fake clock, so that
the real parts of a node (``brokerd.cluster.node.ClusterNode`` and all it
wires: takeover, handoff, forwarding, requests, fencing, adoption, the
event log) run in a unit test without Redis, sockets or waiting. Each
double implements the Protocol of ``brokerd/cluster/ports.py`` it stands
for; the real-Redis, real-process tests are the other modules of this
package.

    clock = FakeClock()
    net = FakeNet(clock)                 # one bus, one store, one wire between the nodes
    a = await net.node("a")              # a joined ClusterNode (no tasks, no timers)
    await net.settle()                   # until quiet: frames delivered, announcements out, logs read
    clock.advance(1.0); net.tick()       # deadlines (what the node's timer round does)

Frames cross the wire as bytes (``frames`` encodes them, ``frames.FrameReader``
splits them again), in order per direction of each connection -- there are
two connections between two nodes, one each dialled -- and a direction can
be paused (a slow link) or a kind of frame lost.
"""

import asyncio
import json
from collections import deque

from brokerd.cluster import frames
from brokerd.cluster.eventlog import event_key
from brokerd.cluster.node import ClusterNode
from brokerd.protocol.packets import Publish
from brokerd.routing.topic import matches

ANY = object()


class FakeClock:
    """The node's clock: time moves when the test says so."""

    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


# ==================================================================== the bus


class BusState:
    """What Redis holds for the cluster (``bus.Bus``'s keys), shared by every node's FakeBus."""

    def __init__(self, clock: FakeClock):
        self.clock = clock
        self.nodes: dict[str, tuple] = {}      # node -> (info, expires at)
        self.events: list[tuple] = []          # (id, event as JSON)
        self.seq = 0
        self.clients: dict[str, dict] = {}     # tenant -> {client id: node}
        self.owned: dict[str, set] = {}        # node -> {(tenant, client id)} of stored sessions
        self.wills: dict[str, dict] = {}       # node -> {(tenant, client id): blob}
        self.locks: dict[tuple, str] = {}      # (tenant, client id) -> token
        self.leases: dict[str, str] = {}
        self.renewals = 0                      # renew_lease calls that kept a lease
        self.reaped: dict[str, str] = {}
        self.left: set[str] = set()
        self.conns: dict[str, dict] = {}
        self.stats: dict[str, dict] = {}
        self.host_tenants: dict[str, dict] = {}   # host -> {worker: {tenant: figures}}
        self.tokens = 0
        self.owner_batches = 0                 # owners() calls (a round trip each)
        self.registry = False                  # the ``registry`` key: a walk of the store found every session held


class FakeBus:
    """``ports.ClusterBus`` in memory. ``reachable = False``: every call fails
    as a Redis the node cannot reach would (a netsplit)."""

    url = "fake://bus"

    def __init__(self, state: BusState, node: str, ttl: float = 5.0):
        self.s = state
        self.node = node
        self.ttl = ttl
        self.reachable = True
        self.registry_whole = True             # as the last claim's answer said

    def _check(self) -> None:
        if not self.reachable:
            raise ConnectionError("the bus is unreachable (fake netsplit)")

    async def close(self) -> None:
        pass

    # -- membership
    async def heartbeat(self, info: dict) -> None:
        self._check()
        self.s.nodes[self.node] = (json.loads(json.dumps(info)), self.s.clock() + self.ttl)

    async def members(self) -> dict[str, dict]:
        self._check()
        now = self.s.clock()
        return {n: dict(info) for n, (info, until) in self.s.nodes.items() if until > now}

    async def leave(self) -> None:
        self._check()
        self.s.left.add(self.node)
        self.s.nodes.pop(self.node, None)

    async def forget_former(self) -> None:
        self._check()
        self.s.reaped.pop(self.node, None)
        self.s.left.discard(self.node)

    # -- events
    async def publish_events(self, events: list[dict]) -> list[str]:
        self._check()
        ids = []
        for e in events:
            self.s.seq += 1
            eid = f"{self.s.seq}-0"
            self.s.events.append((eid, json.dumps(e)))
            ids.append(eid)
        return ids

    async def read_events(self, after: str, block_ms: int = 1000, count: int = 1000,
                          own: str | None = None) -> list[tuple[str, dict | None]]:
        self._check()
        k = event_key(after)
        out = [(eid, json.loads(e)) for eid, e in self.s.events if event_key(eid) > k][:count]
        return [(eid, None if own is not None and e.get("n") == own else e) for eid, e in out]

    async def trim_events(self, min_id: str) -> None:
        self._check()
        k = event_key(min_id)
        self.s.events = [(eid, e) for eid, e in self.s.events if event_key(eid) >= k]

    # -- leases
    async def try_lease(self, name: str, seconds: int) -> bool:
        self._check()
        if name in self.s.leases:
            return False
        self.s.leases[name] = self.node
        return True

    async def renew_lease(self, name: str, seconds: int) -> bool:
        self._check()
        if self.s.leases.setdefault(name, self.node) != self.node:
            return False
        self.s.renewals += 1
        return True

    async def drop_lease(self, name: str) -> None:
        self._check()
        self.s.leases.pop(name, None)

    # -- client ids
    async def lock(self, tenant: str, client_id: str, wait: float = 5.0) -> str | None:
        self._check()
        if (tenant, client_id) in self.s.locks:
            return None                         # no waiting here: a held lock is busy
        self.s.tokens += 1
        token = self.s.locks[(tenant, client_id)] = f"{self.node}:{self.s.tokens}"
        return token

    async def lock_holder(self, tenant: str, client_id: str) -> str | None:
        self._check()
        token = self.s.locks.get((tenant, client_id))
        return token.rsplit(":", 1)[0] if token else None

    async def unlock(self, tenant: str, client_id: str, token: str) -> None:
        self._check()
        if self.s.locks.get((tenant, client_id)) == token:
            del self.s.locks[(tenant, client_id)]

    async def keep_lock(self, tenant: str, client_id: str, token: str, seconds: float) -> bool:
        self._check()
        return self.s.locks.get((tenant, client_id)) == token

    async def try_claim(self, tenant: str, client_id: str) -> str | None:
        self._check()
        self.registry_whole = self.s.registry
        if (tenant, client_id) in self.s.locks:
            return "!"
        owner = self.s.clients.get(tenant, {}).get(client_id)
        if owner and owner != self.node:
            return owner
        self.s.clients.setdefault(tenant, {})[client_id] = self.node
        return None

    async def registry_complete(self) -> None:
        self._check()
        self.s.registry = True

    async def owner(self, tenant: str, client_id: str) -> str | None:
        self._check()
        return self.s.clients.get(tenant, {}).get(client_id)

    async def owners(self, keys: list[tuple[str, str]]) -> list[str | None]:
        self._check()
        self.s.owner_batches += 1
        return [self.s.clients.get(tenant, {}).get(client_id) for tenant, client_id in keys]

    async def claim(self, tenant: str, client_id: str, durable: bool, previous: str | None) -> None:
        self._check()
        self.s.clients.setdefault(tenant, {})[client_id] = self.node
        if previous and previous != self.node:
            self.s.owned.get(previous, set()).discard((tenant, client_id))
        if durable:
            self.s.owned.setdefault(self.node, set()).add((tenant, client_id))
        else:
            self.s.owned.get(self.node, set()).discard((tenant, client_id))

    async def mark_owned(self, tenant: str, client_id: str) -> None:
        self._check()
        self.s.owned.setdefault(self.node, set()).add((tenant, client_id))

    async def set_will(self, tenant: str, client_id: str, blob: bytes | None) -> None:
        self._check()
        wills = self.s.wills.setdefault(self.node, {})
        if blob is None:
            wills.pop((tenant, client_id), None)
        else:
            wills[(tenant, client_id)] = blob

    async def gone(self, tenant: str, client_id: str, ended: bool, had_will: bool) -> None:
        self._check()
        if had_will:
            self.s.wills.get(self.node, {}).pop((tenant, client_id), None)
        if ended:
            if self.s.clients.get(tenant, {}).get(client_id) == self.node:
                del self.s.clients[tenant][client_id]
            self.s.owned.get(self.node, set()).discard((tenant, client_id))

    # -- adoption
    async def reap(self, node: str) -> bool:
        self._check()
        if node in self.s.reaped:
            return False
        self.s.reaped[node] = self.node
        return True

    async def left_gracefully(self, node: str) -> bool:
        self._check()
        return node in self.s.left

    async def owned(self, node: str) -> list[tuple[str, str]]:
        self._check()
        return sorted(self.s.owned.get(node, ()))

    async def take_wills(self, node: str) -> list[tuple[str, str, bytes]]:
        self._check()
        return [(t, c, blob) for (t, c), blob in self.s.wills.pop(node, {}).items()]

    async def forget_node(self, node: str) -> None:
        self._check()
        self.s.owned.pop(node, None)
        self.s.stats.pop(node, None)
        self.s.left.discard(node)

    # -- quotas, $SYS
    async def set_counts(self, counts: dict[str, int], alive: set[str]) -> dict[str, int]:
        self._check()
        for tenant, n in counts.items():
            self.s.conns.setdefault(tenant, {})[self.node] = n
        return {tenant: sum(v for node, v in self.s.conns[tenant].items() if node in alive) for tenant in counts}

    async def set_stats(self, stats: dict) -> None:
        self._check()
        self.s.stats[self.node] = {k: str(v) for k, v in stats.items()}

    async def all_stats(self) -> dict[str, dict]:
        self._check()
        return {n: dict(v) for n, v in self.s.stats.items()}

    async def set_host_tenants(self, host: str, figures: dict[str, dict]) -> dict[str, dict]:
        self._check()
        workers = self.s.host_tenants.setdefault(host, {})
        workers[self.node] = json.loads(json.dumps(figures))
        return json.loads(json.dumps(workers))

    async def drop_host_tenants(self, host: str, nodes: list[str]) -> None:
        self._check()
        for node in nodes:
            self.s.host_tenants.get(host, {}).pop(node, None)


# ================================================================== the store


class Record:
    """A stored session (``store.records.SessionRecord``, the parts the fakes use)."""

    def __init__(self, tenant: str, client_id: str, filters: list[str], will=None):
        self.tenant, self.client_id, self.filters, self.will = tenant, client_id, list(filters), will


class FakeStore:
    """``ports.SessionStore`` shared by the nodes. ``queues[(tenant, client id)]``
    is what a stored session was given, in order, whichever node held it --
    what its client gets."""

    durable = True

    def __init__(self):
        self.records: dict[tuple, Record] = {}
        self.queues: dict[tuple, list] = {}
        self.meta: dict[str, bytes] = {}
        self.loaded: list[tuple] = []          # (tenant, client id) of every session read with its queue
        self.pages: list[int] = []             # the size of every page of keys listed

    def add(self, tenant: str, client_id: str, filters: list[str]) -> None:
        self.records[(tenant, client_id)] = Record(tenant, client_id, filters)
        self.queues.setdefault((tenant, client_id), [])

    async def load(self):
        self.loaded += list(self.records)
        return [Record(r.tenant, r.client_id, r.filters, r.will) for r in self.records.values()], []

    async def load_session(self, tenant: str, client_id: str):
        self.loaded.append((tenant, client_id))
        r = self.records.get((tenant, client_id))
        return None if r is None else Record(r.tenant, r.client_id, r.filters, r.will)

    async def session_keys(self, after, limit: int) -> list[tuple[str, str]]:
        keys = sorted(k for k in self.records if after is None or k > tuple(after))[:limit]
        self.pages.append(len(keys))
        return keys

    async def get_meta(self, key: str) -> bytes | None:
        return self.meta.get(key)

    async def put_meta(self, key: str, value: bytes) -> None:
        self.meta[key] = value


class FakeWriter:
    """``ports.StoreDrain``: everything is written already -- unless ``stalled``: then a
    drain waits its whole timeout (not on the fake clock: only its length is recorded) and
    fails, and ``abandon`` gives up ``stalled`` writes."""

    def __init__(self):
        self.drains = 0
        self.stalled = 0
        self.timeouts: list[float] = []
        self.abandoned = 0

    async def drain(self, timeout: float = 10.0) -> bool:
        self.drains += 1
        self.timeouts.append(timeout)
        return not self.stalled

    async def written(self, timeout: float) -> bool:
        self.drains += 1
        return True

    def abandon(self) -> int:
        given, self.stalled = self.stalled, 0
        self.abandoned += given
        return given


# ================================================================= the broker


class NS:
    """A tenant's namespace as the broker hands it to ``forward``."""

    def __init__(self, name: str):
        self.name = name


class FakeBroker:
    """``ports.ClusterBroker``: the stored sessions held on this node (tenant,
    client id -> filters); a delivery to one appends its payload to the
    store's queue of the session, a QoS 1/2 one adds a store write that
    ``commit()`` makes durable (as the store writer would)."""

    wall_offset = 0.0

    def __init__(self, store: FakeStore):
        self.store = store
        self.sessions: dict[tuple, list] = {}
        self.ops = 0
        self.waiting: list = []               # when_durable callbacks until commit()
        self.refusing = False
        self.released: list[tuple] = []
        self.disconnected: list[tuple] = []
        self.wills: list[tuple] = []
        self.retained: dict[tuple, object] = {}
        self.remote: dict = {}

    def _deliver(self, tenant: str, cid: str, msg: Publish) -> None:
        self.store.queues.setdefault((tenant, cid), []).append(msg.payload)
        if msg.qos:
            self.ops += 1

    def commit(self, ok: bool = True) -> None:
        waiting, self.waiting, self.ops = self.waiting, [], 0
        for fn in waiting:
            fn(ok)

    # -- messages
    def forwarded(self, tenant, msg, group, gfilter, now) -> int:
        n = 0
        for (t, cid), filters in list(self.sessions.items()):
            if t == tenant and any(matches(f, msg.topic) for f in filters):
                self._deliver(t, cid, msg)
                n += 1
        return n

    def deliver_to_client(self, tenant, client_id, msg, now) -> bool:
        filters = self.sessions.get((tenant, client_id))
        if filters is None or not any(matches(f, msg.topic) for f in filters):
            return False
        self._deliver(tenant, client_id, msg)
        return True

    def deliver_shared(self, ns, group, msg, now) -> bool:
        return False

    def group_members(self, tenant, name, filt, exclude=None) -> int:
        return 0

    def deliver_group(self, tenant, name, filt, msg, now, exclude=None) -> bool:
        return False

    def publish_gone_will(self, tenant, client_id, will, now) -> None:
        self.wills.append((tenant, client_id, will))

    def retained_copy(self, tenant, topic, msg) -> None:
        self.retained[(tenant, topic)] = msg

    # -- sessions
    def release(self, tenant, client_id, now) -> bool:
        if self.sessions.pop((tenant, client_id), None) is None:
            return False
        self.released.append((tenant, client_id))
        return True

    def drop_all_sessions(self) -> None:
        self.sessions.clear()

    def discard_stored(self, tenant, client_id) -> None:
        pass

    def restore_sessions(self, records, now) -> bool:
        for rec in records:
            self.sessions[(rec.tenant, rec.client_id)] = list(rec.filters)
        return True

    def disconnect_clients(self, code, reason, now, server_reference) -> None:
        self.disconnected.append((code, server_reference))

    # -- the store's commits
    def store_refusing(self) -> bool:
        return self.refusing

    def writes_pending(self) -> int:
        return self.ops

    def when_durable(self, fn) -> None:
        self.waiting.append(fn)

    # -- queries
    def local_filters(self):
        return sorted({(t, f) for (t, _), filters in self.sessions.items() for f in filters})

    def local_route_counts(self, tenant, filt):
        n = sum(1 for (t, _), filters in self.sessions.items() if t == tenant and filt in filters)
        return n, n, {}

    def holds(self, tenant, client_id) -> bool:
        return (tenant, client_id) in self.sessions

    def holds_stored(self, tenant, client_id) -> bool:
        return (tenant, client_id) in self.sessions

    def holds_connected(self, tenant, client_id) -> bool:
        return False                      # (no client connects to the fake: its sessions are stored ones)

    def quota_refused(self, tenant) -> None:
        pass

    def end_held(self, tenant, client_id, now) -> bool:
        return self.sessions.pop((tenant, client_id), None) is not None

    def session_filters(self, tenant, client_id):
        filters = self.sessions.get((tenant, client_id))
        return None if filters is None else list(filters)

    def handoff_filters(self, tenant, client_id):
        return sorted(self.sessions.get((tenant, client_id), ()))

    def connection_counts(self):
        return {}

    def remote_connections(self, counts) -> None:
        self.remote = counts

    def node_stats(self):
        return {"sessions": len(self.sessions)}

    def tenant_stats(self):
        return {}

    def host_shares(self, others, workers, now, claims=None) -> None:
        self.shares = (others, workers)

    def rate_weights(self, now):
        return {}


class Connecting:
    """``ports.ClaimingChannel``: a CONNECT waiting for its client id; ``cont``
    opens its (stored) session."""

    def __init__(self):
        self.state = 1
        self.session = None
        self.refused: tuple | None = None
        self.opened = False

    def refuse(self, code: int, reason: str) -> None:
        self.refused = (code, reason)
        self.state = 3

    def cont(self, now: float) -> None:
        self.opened = True
        self.state = 2

        class Durable:
            durable = True

        self.session = Durable()


# =================================================================== the wire


class FakeLink:
    """One end of a connection as a node sees it: ``send`` goes back to the peer on the same connection."""

    def __init__(self, wire: "Wire", me: str, peer: str, dialler: str):
        self.wire, self.me, self.peer, self.dialler = wire, me, peer, dialler
        self.closed = False

    def send(self, frame: bytes) -> None:
        self.wire.post(self.me, self.peer, self.dialler, frame)

    def fail(self, why: str) -> None:
        self.wire.failures.append((self.me, self.peer, why))

    def request_started(self) -> None:
        pass

    def request_done(self) -> None:
        pass


class Wire:
    """The connections between the nodes: a frame is (from, to, which node dialled)."""

    def __init__(self):
        self.nodes: dict[str, ClusterNode] = {}
        self.queue: deque = deque()
        self.paused: set[tuple] = set()        # (from, to, dialler); ANY for any
        self.lost: list[tuple] = []            # (kind, from, to): frames of that kind dropped
        self.failures: list[tuple] = []
        self.seen: list[tuple] = []            # (from, to, kind) of every frame delivered

    def post(self, src: str, dst: str, dialler: str, frame: bytes) -> None:
        kind = frame[4]
        for k, s, d in self.lost:
            if k == kind and s in (src, ANY) and d in (dst, ANY):
                return
        self.queue.append((src, dst, dialler, frame))

    def pause(self, src, dst, dialler=ANY) -> None:
        self.paused.add((src, dst, dialler))

    def resume(self) -> None:
        self.paused.clear()

    def lose(self, kind: int, src=ANY, dst=ANY) -> None:
        self.lost.append((kind, src, dst))

    def _held(self, src, dst, dialler) -> bool:
        return any(s == src and d == dst and c in (dialler, ANY) for s, d, c in self.paused)

    def pump(self) -> int:
        """Deliver every frame that is not paused, in order per connection; -> how many."""
        n = 0
        while True:
            kept: deque = deque()
            progress = False
            while self.queue:
                src, dst, dialler, frame = item = self.queue.popleft()
                if self._held(src, dst, dialler):
                    kept.append(item)
                    continue
                node = self.nodes.get(dst)
                if node is not None:
                    reader = frames.FrameReader(node.peers.max_frame)
                    for f in reader.feed(frame):
                        self.seen.append((src, dst, f[0]))
                        node.on_frame(FakeLink(self, dst, src, dialler), f)
                progress = True
                n += 1
            self.queue = kept
            if not progress:
                return n


class FakePeers:
    """``peers.Peers`` over the Wire: a frame sent to a node goes on the connection this node dialled."""

    max_frame = 2 * 1024 * 1024

    def __init__(self, wire: Wire, node_id: str):
        self.wire, self.id = wire, node_id
        self.node = None
        self.closed = False

    def attach(self, node) -> None:
        self.node = node

    async def start(self) -> str:
        self.wire.nodes[self.id] = self.node
        return f"wire:{self.id}"

    def send(self, node: str, frame: bytes) -> None:
        if node not in self.wire.nodes or node not in self.node.members:
            asyncio.get_running_loop().call_soon(self.node.peer_lost, node)     # as a failed dial
            return
        self.wire.post(self.id, node, self.id, frame)

    def tick(self, now: float) -> None:
        pass

    def drop(self, node: str) -> None:
        pass

    def close(self) -> None:
        self.closed = True
        self.wire.nodes.pop(self.id, None)


# ==================================================================== a cluster


class FakeNet:
    """One bus, one store, one wire, and the nodes on them."""

    def __init__(self, clock: FakeClock | None = None):
        self.clock = clock or FakeClock()
        self.state = BusState(self.clock)
        self.store = FakeStore()
        self.wire = Wire()
        self.nodes: dict[str, ClusterNode] = {}
        self.deaf: set[str] = set()            # nodes that do not read the event log for now (lagging)

    async def node(self, node_id: str, store: bool = True, reference: str | None = None) -> ClusterNode:
        """A node built by the real wiring from fakes, joined (``ClusterNode.join``: no tasks)."""
        broker = FakeBroker(self.store)
        node = ClusterNode(node_id, FakeBus(self.state, node_id), broker, loop=asyncio.get_running_loop(),
                           clock=self.clock, peers=FakePeers(self.wire, node_id),
                           store=self.store if store else None, writer=FakeWriter(), reference=reference)
        await node.join()
        self.nodes[node_id] = node
        for other in self.nodes.values():          # every node knows every other (a heartbeat round)
            await other.heartbeat()
        return node

    async def step(self) -> int:
        """One round: frames delivered, tasks run, announcements published,
        event logs read, store writes committed; -> how much moved."""
        moved = self.wire.pump()
        for _ in range(5):
            await asyncio.sleep(0)
        for node in list(self.nodes.values()):
            if node.announcer.wanted.is_set():
                node.announcer.wanted.clear()
                if await node.announcer.flush():     # a failed round (fenced, no bus) is retried, moves nothing
                    moved += 1
            before = node.eventlog.last_event
            if node.bus.reachable and node.id not in self.deaf:
                await node.eventlog.read(block_ms=0)
            moved += node.eventlog.last_event != before
            if node.broker.waiting:
                node.broker.commit()
                moved += 1
        return moved

    async def settle(self, rounds: int = 200) -> None:
        """Rounds until nothing moves (three quiet rounds in a row)."""
        quiet = 0
        for _ in range(rounds):
            quiet = 0 if await self.step() else quiet + 1
            if quiet >= 3:
                return
        raise AssertionError("the fake cluster did not settle")

    def tick(self) -> None:
        """Every node's timer round at the clock's time."""
        for node in self.nodes.values():
            node.tick(self.clock())


class Ack:
    """The publisher's PUBACK: every part (each node that stores the message) answered; ``ok`` is their verdict."""

    def __init__(self, parts: int):
        self.parts = parts
        self.ok = True
        self.done = parts == 0

    def __call__(self, ok: bool) -> None:
        self.ok = self.ok and ok
        self.parts -= 1
        if self.parts == 0:
            self.done = True


def publish(node: ClusterNode, tenant: str, topic: str, payload: bytes, qos: int = 1) -> Ack:
    """A client of ``node`` publishes (no local subscribers): forwarded, its ACKs awaited."""
    msg = Publish(topic, payload, qos)
    _, waits = node.forward(NS(tenant), msg, [], node.clock())
    ack = Ack(len(waits))
    node.wait_for(waits, ack)
    return ack
