"""Fencing -- a node cut off from the bus lets go before the others take
over, and rejoins when the bus is back -- driven with a fake bus and a fake
clock (``fakes.py``): no Redis, no socket, no wait. (test_failover.py cuts a
real node off a real Redis through a proxy.)

``a`` holds the stored session of ``t/dev`` (``x/#``), ``b`` the one of
``t/dev2`` (``y/#``); ``b`` sends clients elsewhere to ``b.example.net:1883``.
"""

import asyncio
import json

import pytest

from brokerd.cluster import frames
from brokerd.cluster.eventlog import SNAPSHOT_EVENT_KEY, SNAPSHOT_KEY, event_key
from brokerd.cluster.fencing import HANDOVER, MARGIN
from brokerd.cluster.node import HEARTBEAT
from brokerd.protocol import reason as rc

from .fakes import Connecting, FakeNet, publish

REF = "b.example.net:1883"


def run(coro):
    asyncio.run(asyncio.wait_for(coro, 30))


async def two_nodes():
    net = FakeNet()
    a = await net.node("a")
    b = await net.node("b", reference=REF)
    for node, cid, filt in ((a, "dev", "x/#"), (b, "dev2", "y/#")):
        net.store.add("t", cid, [filt])
        conn = Connecting()
        node.claim(conn, "t", cid, False, None, conn.cont)
        await net.settle()
        assert conn.opened
    assert a.routes.match("t", "y/1") == ({"b": True}, []) and b.routes.match("t", "x/1") == ({"a": True}, [])
    return net, a, b


def counted_writes(store) -> list:
    """The keys of the store's meta writes from now on, in order."""
    put = store.put_meta
    writes: list = []

    async def counted(key, value):
        writes.append(key)
        await put(key, value)

    store.put_meta = counted
    return writes


async def one_more_route(net, node) -> None:
    """A stored session subscribed to z/# connects to ``node``: its route goes on the log."""
    extra = Connecting()
    net.store.add("t", "dev3", ["z/#"])
    node.claim(extra, "t", "dev3", False, None, extra.cont)
    await net.settle()


async def beat_at(net, node, t: float) -> None:
    net.clock.now = t
    await node.heartbeat()


def test_a_node_fences_itself_once_the_bus_is_out_of_reach_for_ttl_minus_margin():
    """The bus stops answering a: heartbeats fail, and a stays in service for
    ttl - MARGIN (3.5 s) after the last round that succeeded -- a short outage
    changes nothing -- then fences: its clients sent to b (0x9C with b's
    reference), its writes drained, its sessions and b's routes dropped, what
    it waited for failed; it refuses CONNECTs and takes on no QoS 1 message.
    b declares it dead only at ttl (5 s) and adopts its session: never two
    nodes holding one session."""

    async def go():
        net, a, b = await two_nodes()
        net.wire.lose(frames.ACK, "b", "a")
        pending = publish(a, "t", "y/1", b"for b")       # a waits for b's ACK
        await net.settle()
        assert not pending.done
        limit = a.bus.ttl - MARGIN
        t0 = net.clock()
        await beat_at(net, a, t0)
        a.bus.reachable = False
        for dt in (HEARTBEAT, 2 * HEARTBEAT, 3.0):       # a short outage ...
            await beat_at(net, a, t0 + dt)
        a.bus.reachable = True
        await beat_at(net, a, t0 + 3.2)                  # ... is forgotten once the bus answers
        a.bus.reachable = False
        t1 = t0 + 3.2
        for dt in (1.0, 2.0, 3.0, limit):
            await beat_at(net, a, t1 + dt)
            assert not a.fenced, f"fenced {dt} s after the last round that reached the bus"
        assert a.broker.holds("t", "dev") and not a.broker.disconnected
        await beat_at(net, a, t1 + limit + 0.01)
        assert a.fenced
        assert a.broker.disconnected == [(rc.USE_ANOTHER_SERVER, REF)]
        assert a.sessions.store is net.store and a.fencing.writer.drains >= 1
        assert not a.broker.sessions
        assert a.routes.nodes() == set()
        assert pending.done and not pending.ok
        refused = Connecting()
        a.claim(refused, "t", "new", True, None, refused.cont)
        await net.step()
        assert refused.refused[0] == rc.SERVER_UNAVAILABLE and not refused.opened
        late = publish(b, "t", "x/1", b"for a")        # b still routes x/# to a: a must not take it on
        await net.settle()
        assert late.done and not late.ok
        # b: a's membership lives until its last refresh + ttl
        await beat_at(net, b, t1 + a.bus.ttl - 0.01)
        assert "a" in b.members and not b.broker.holds("t", "dev")
        await beat_at(net, b, t1 + a.bus.ttl)
        assert "a" not in b.members
        await net.settle()
        assert b.broker.holds("t", "dev") and not a.broker.holds("t", "dev")
        assert net.state.clients["t"]["dev"] == "b"

    run(go())


def test_a_fenced_node_writes_only_until_the_others_may_adopt_its_sessions():
    """a's store is stalled as it fences: it waits for its writes only until HANDOVER
    before its membership would expire (the last round that reached the bus + ttl), then
    gives up what is left (``abandon``), before b may adopt the session. Fencing later than
    that (its loop held up) it gives them up at once."""

    async def go():
        net, a, b = await two_nodes()
        t0 = net.clock()
        await beat_at(net, a, t0)
        a.bus.reachable = False
        writer = a.fencing.writer
        writer.stalled = 3
        fenced_at = t0 + a.bus.ttl - MARGIN + 0.01
        await beat_at(net, a, fenced_at)
        assert a.fenced and writer.abandoned == 3
        assert writer.timeouts[-1] == pytest.approx(t0 + a.bus.ttl - HANDOVER - fenced_at)
        assert not a.broker.sessions

        net2, c, _ = await two_nodes()
        t0 = net2.clock()
        await beat_at(net2, c, t0)
        c.bus.reachable = False
        c.fencing.writer.stalled = 2
        await beat_at(net2, c, t0 + c.bus.ttl)                # the round came late: b may adopt already
        assert c.fenced and c.fencing.writer.abandoned == 2 and c.fencing.writer.timeouts == []

    run(go())


def test_without_another_node_to_send_them_to_clients_are_told_the_server_shuts_down():
    async def go():
        net = FakeNet()
        a = await net.node("a")
        a.bus.reachable = False
        await beat_at(net, a, net.clock() + a.bus.ttl)
        assert a.fenced and a.broker.disconnected == [(rc.SERVER_SHUTTING_DOWN, None)]

    run(go())


def test_a_fenced_node_rejoins_when_the_bus_answers_and_reloads_the_route_table():
    """While a is fenced, b adopts a's session, compacts the log into a
    snapshot and trims it. When the bus answers a again, a says "reset"
    (what it announced before is void), reloads the table from the snapshot
    and the log after it -- b's routes, the adopted one among them --, and
    accepts CONNECTs again; its new session's route reaches b."""

    async def go():
        net, a, b = await two_nodes()
        t0 = net.clock()
        await beat_at(net, a, t0)
        a.bus.reachable = False
        await beat_at(net, a, t0 + a.bus.ttl)
        assert a.fenced
        await beat_at(net, b, t0 + a.bus.ttl)
        await net.settle()
        assert b.broker.holds("t", "dev")
        await b.eventlog.compact()
        net.state.leases.clear()
        extra = Connecting()                             # one more route, after the first snapshot
        net.store.add("t", "dev3", ["z/#"])
        b.claim(extra, "t", "dev3", False, None, extra.cont)
        await net.settle()
        await b.eventlog.compact()                       # trims the log to the first snapshot
        assert len(net.state.events) < net.state.seq
        assert a.routes.nodes() == set()
        a.bus.reachable = True
        await beat_at(net, a, t0 + a.bus.ttl + 2)
        assert not a.fenced
        assert json.loads(net.state.events[-1][1]) == {"t": "reset", "n": "a"}
        assert not a.announcer.announced
        for topic in ("x/1", "y/1", "z/1"):
            assert a.routes.match("t", topic) == ({"b": True}, []), topic
        await beat_at(net, b, net.clock() + HEARTBEAT)     # b sees a back
        assert "a" in b.members
        await net.settle()
        back = Connecting()
        net.store.add("t", "dev4", ["w/#"])
        a.claim(back, "t", "dev4", False, None, back.cont)
        await net.settle()
        assert back.opened and a.broker.holds("t", "dev4")
        assert b.routes.match("t", "w/1") == ({"a": True}, [])
        ack = publish(b, "t", "w/1", b"again")
        await net.settle()
        assert ack.done and ack.ok and net.store.queues[("t", "dev4")] == [b"again"]

    run(go())


def test_a_fenced_node_answers_route_switches_at_once():
    """A SYNC that reaches a fenced node is answered at once: it applies no
    event any more, and a handoff elsewhere must not wait for it."""

    async def go():
        net, a, b = await two_nodes()
        a.bus.reachable = False
        await beat_at(net, a, net.clock() + a.bus.ttl)
        assert a.fenced
        net.wire.queue.clear()
        a.on_frame(type("Link", (), {"peer": "b"})(), (frames.SYNC, 7, "999999-0"))
        assert list(net.wire.queue) == [("a", "b", "a", frames.synced(7))] and not a.handoff.syncs

    run(go())


def test_a_read_of_the_log_in_flight_while_the_node_rejoins_skips_no_event():
    """A fenced node's event loop reads on (and applies nothing) while it is cut off. When it
    rejoins, its table is reloaded from the snapshot and read again from there -- but a read already
    waiting on the bus then comes back with what follows the old position. Taking it skipped every
    event between the snapshot and that position for good (here: b's route y/#)."""
    from brokerd.cluster.eventlog import EventLog, event_key
    from brokerd.cluster.fencing import Fence
    from brokerd.cluster.routes import ClusterRoutes

    class BlockingLog:                        # XREAD BLOCK on a log in memory
        def __init__(self):
            self.events, self.new = [], asyncio.Event()

        def add(self, e):
            self.events.append((f"{len(self.events) + 1}-0", e))
            self.new.set()

        async def read_events(self, after, block_ms=1000, count=1000, own=None):
            while True:
                out = [(i, e) for i, e in self.events if event_key(i) > event_key(after)]
                if out or not block_ms:
                    return out
                self.new.clear()
                await self.new.wait()

    def route(f):
        return {"t": "route", "n": "b", "tn": "t", "f": f, "s": 1, "d": 0}

    async def go():
        bus, fence, routes = BlockingLog(), Fence(), ClusterRoutes("a")
        log = EventLog("a", bus, routes, None, None, None, fence, None, dict)
        bus.add(route("x/#"))
        await log.read()
        fence.fenced = True                   # a fences itself: b's routes dropped
        log.drop_all()
        bus.add(route("y/#"))
        await log.read()                      # read while fenced: nothing applied, the position moves on
        waiting = asyncio.ensure_future(log.read())
        await asyncio.sleep(0)
        await log.reload()                    # a rejoins (no store: the log from its start)
        fence.fenced = False
        bus.add(route("z/#"))                 # the waiting read comes back
        await waiting
        await log.read(block_ms=0)            # what the reload left to read
        assert [f for f in ("x/1", "y/1", "z/1") if routes.match("t", f)[0]] == ["x/1", "y/1", "z/1"]

    run(go())


def test_stop_ends_a_task_that_let_a_cancel_go_by():
    """Python 3.11's wait_for (redis-py wraps each write in one) can swallow a cancel that lands as
    the write completes: the node's task reads on. Stopping the node cancels it again: stop returns."""

    async def go():
        net = FakeNet()
        a = await net.node("a")
        swallowed = []

        async def reads_on():                  # as the event loop when the cancel was swallowed
            while True:
                try:
                    await asyncio.sleep(0.05)
                except asyncio.CancelledError:
                    if swallowed:
                        raise
                    swallowed.append(True)

        task = asyncio.ensure_future(reads_on())
        a._tasks.append(task)
        await asyncio.sleep(0)
        stopping = asyncio.ensure_future(a.stop())
        try:
            await asyncio.wait_for(asyncio.shield(stopping), 5)     # (shielded: not ended by the wait's end)
        finally:
            task.cancel()
        assert swallowed and task.cancelled()

    run(go())


def test_the_route_snapshot_is_written_again_only_once_the_log_moved_and_trims_to_the_last_position():
    """b compacts: the table as a snapshot and, apart, the log's position in it. Asked again with
    nothing new in the log, it writes nothing (100,000 routes are 5 MB of JSON a time). One more
    route, and it writes a new snapshot and trims the log to the first one's position, read from
    the small key, not from the table; a round later, with nothing new, to the second's."""

    async def go():
        net, a, b = await two_nodes()
        await b.eventlog.compact()
        at = net.store.meta[SNAPSHOT_EVENT_KEY].decode()
        assert at == b.eventlog.last_event == json.loads(net.store.meta[SNAPSHOT_KEY])["event_id"]
        writes = counted_writes(net.store)
        net.state.leases.clear()
        await b.eventlog.compact()
        await a.eventlog.compact()              # a loaded none, but the store has its position already
        assert writes == []
        writes.clear()
        net.state.leases.clear()
        await b.eventlog.compact()
        assert writes == []
        await one_more_route(net, b)
        net.state.leases.clear()
        await b.eventlog.compact()
        assert writes == [SNAPSHOT_KEY, SNAPSHOT_EVENT_KEY]
        snap = json.loads(net.store.meta[SNAPSHOT_KEY])
        assert snap["prev_id"] == at and snap["event_id"] == b.eventlog.last_event != at
        assert any(r[:3] == ["b", "t", "z/#"] for r in snap["routes"])
        assert min(event_key(eid) for eid, _ in net.state.events) == event_key(at)
        # a round later, with nothing new: no snapshot, and the log trimmed to the last one's position
        writes.clear()
        net.state.leases.clear()
        await b.eventlog.compact()
        assert writes == []
        assert [eid for eid, _ in net.state.events] == [snap["event_id"]]

    run(go())


def test_after_a_change_one_node_of_three_writes_the_snapshot_whoever_holds_the_lease_next():
    """The lease goes round three nodes; a route changes once: one snapshot in all, not one per node
    (each 5 MB at 100,000 routes), and the log trimmed to it the round after."""

    async def go():
        net, a, b = await two_nodes()
        c = await net.node("c")
        await net.settle()
        writes = counted_writes(net.store)
        for node in (a, b, c):
            net.state.leases.clear()
            await node.eventlog.compact()
        assert writes.count(SNAPSHOT_KEY) == 1
        await one_more_route(net, c)
        writes.clear()
        for order in ((b, a, c), (a, c, b)):        # a round: the lease expired, each node compacts once
            net.state.leases.clear()
            for node in order:
                await node.eventlog.compact()
        assert writes.count(SNAPSHOT_KEY) == 1
        snap = json.loads(net.store.meta[SNAPSHOT_KEY])
        assert any(r[:3] == ["c", "t", "z/#"] for r in snap["routes"])
        # the others left the lease alone: its writer trimmed the log to it the round after
        assert [eid for eid, _ in net.state.events] == [snap["event_id"]]

    run(go())


def test_a_store_written_before_the_position_key_is_compacted_from_the_snapshot_it_holds():
    """A store from before holds the snapshot only: its position is read from it, the log trimmed to
    it, and the key written for the next time."""

    async def go():
        net, a, b = await two_nodes()
        await b.eventlog.compact()
        at = net.store.meta.pop(SNAPSHOT_EVENT_KEY).decode()
        await one_more_route(net, b)
        net.state.leases.clear()
        await b.eventlog.compact()
        assert json.loads(net.store.meta[SNAPSHOT_KEY])["prev_id"] == at
        assert net.store.meta[SNAPSHOT_EVENT_KEY].decode() == b.eventlog.last_event != at
        assert min(event_key(eid) for eid, _ in net.state.events) == event_key(at)

    run(go())


def test_a_node_fenced_while_it_reads_the_last_position_stores_no_snapshot_of_its_dropped_table():
    """b fences itself (its copy of the others' routes dropped) while its compaction waits for the
    store: what it would write lacks a's routes, so it writes nothing, and a joining node still
    finds a's routes."""

    async def go():
        net, a, b = await two_nodes()
        get = net.store.get_meta

        async def fenced_meanwhile(key):
            b.eventlog.fence.fenced = True
            b.eventlog.drop_all()
            return await get(key)

        net.store.get_meta = fenced_meanwhile
        await b.eventlog.compact()
        net.store.get_meta = get
        assert SNAPSHOT_KEY not in net.store.meta
        net.state.leases.clear()
        await a.eventlog.compact()
        c = await net.node("c")
        assert c.routes.match("t", "x/1") == ({"a": True}, [])

    run(go())
