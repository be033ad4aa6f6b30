"""The client-id claim against a takeover from another node, with the
collaborators as small fakes so the race's window is held open on purpose.

A CONNECT here whose claim found the id free reads the session from the store
before opening it; a CONNECT of the same id on another node, whose claim found
the id here, asks this node to release it meanwhile. The release found nothing
to let go of, the other node opened the session -- and then this one opened a
second copy: one client id connected on two nodes (found by
tests/cluster/test_sessions.py::test_a_burst_of_connects_keeps_one_session_per_client_id
with persistent twins, about one run in five)."""

import asyncio
import gc
import socket

import pytest

from brokerd.cluster.bus import Bus as RealBus
from brokerd.cluster.takeover import CONNECTING, Takeover
from brokerd.protocol import reason as rc
from brokerd.protocol.packets import Will


class Channel:
    def __init__(self):
        self.state = CONNECTING
        self.session = None
        self.refused = None

    def refuse(self, code, reason):
        self.refused = (code, reason)
        self.state = 4                    # closed


class Broker:
    def __init__(self):
        self.sessions: set = set()
        self.released: list = []
        self.discarded: list = []       # stored sessions a Clean Start ended

    def holds(self, tenant, cid):
        return (tenant, cid) in self.sessions

    def handoff_filters(self, tenant, cid):
        return None

    def release(self, tenant, cid, now):
        self.released.append((tenant, cid))
        found = (tenant, cid) in self.sessions
        self.sessions.discard((tenant, cid))
        return found
    def discard_stored(self, tenant, cid):
        self.discarded.append((tenant, cid))

    def holds_stored(self, tenant, cid):
        return False                    # (what is held here is not in a store: a Clean Start ends it at once)

    def when_durable(self, fn):
        fn(True)                        # (no store: written at once)


class Sessions:
    """``load`` waits for ``gate``: the store read in its thread."""

    def __init__(self, broker):
        self.broker = broker
        self.gate = asyncio.Event()

    async def load(self, tenant, cid, wills=True):
        await self.gate.wait()
        self.broker.sessions.add((tenant, cid))
        return True

    async def stored_will(self, tenant, cid):
        return None


class Bus:
    registry_whole = True                 # Redis has not lost its registry

    async def try_claim(self, tenant, cid):
        return None                       # free: this node is its owner now

    async def lock_holder(self, tenant, cid):
        return "b"                        # the other node holds the id's lock: its takeover is genuine

    async def mark_owned(self, tenant, cid):
        pass

    async def set_will(self, tenant, cid, will):
        pass


class Handoff:
    def done_expecting(self, tenant, cid):
        pass

    def flush_arriving(self, tenant, cid):
        pass


class Announcer:
    def __init__(self):
        self.dirty: list = []

    def announced_filters(self, tenant):
        return ["fleet/#"]

    def route_dirty(self, tenant, filt):
        self.dirty.append((tenant, filt))


class Link:
    peer = "b"

    def __init__(self):
        self.sent: list = []

    def send(self, frame):
        self.sent.append(frame)


class Fence:
    fenced = False


def takeover(broker, sessions, announcer, bus=None):
    return Takeover("a", bus or Bus(), broker, sessions, Handoff(), announcer, None, None, lambda: {}, None, Fence(),
                    lambda: 0.0, asyncio.ensure_future)


def test_a_takeover_during_the_claims_store_read_wins_and_no_second_copy_opens_here():
    async def scenario():
        broker, announcer = Broker(), Announcer()
        sessions = Sessions(broker)
        t = takeover(broker, sessions, announcer)
        channel, opened = Channel(), []
        claim = asyncio.ensure_future(t.run_claim(channel, "acme", "dev", False, None, opened.append))
        await asyncio.sleep(0)                          # the claim now reads the session from the store
        link = Link()
        await t.on_takeover(link, 7, "acme", "dev")     # node b takes the id meanwhile
        assert channel.refused == (rc.SERVER_BUSY, "the client id is being taken over by another node")
        assert len(link.sent) == 1                      # RELEASED: nothing here yet, b loads it from the store
        sessions.gate.set()                             # the store read ends
        await claim
        return broker, announcer, opened, t

    broker, announcer, opened, t = asyncio.run(scenario())
    assert opened == []                                 # the session was not opened here
    assert broker.sessions == set()                     # and the copy it read was let go of
    assert ("acme", "fleet/#") in announcer.dirty       # its routes withdrawn
    assert t.claiming == {} and t.lost == set()


def test_a_claim_nobody_contests_opens_the_session():
    async def scenario():
        broker, announcer = Broker(), Announcer()
        sessions = Sessions(broker)
        sessions.gate.set()
        t = takeover(broker, sessions, announcer)
        channel, opened = Channel(), []
        await t.run_claim(channel, "acme", "dev", False, None, opened.append)
        return broker, opened, channel, t

    broker, opened, channel, t = asyncio.run(scenario())
    assert opened == [0.0] and channel.refused is None and broker.sessions == {("acme", "dev")}
    assert t.claiming == {} and t.lost == set()


class GoneBus(Bus):
    def __init__(self):
        self.gones: list = []

    async def gone(self, tenant, cid, ended, had_will):
        self.gones.append((tenant, cid, ended, had_will))


def test_a_connection_taken_over_by_the_second_of_two_overlapping_claims_leaves_the_id_registered():
    """Two CONNECTs of one id claim it here at once: B reads its stored session, C (clean) opens first,
    then B's open takes C over. C's disconnect must let go of its will only, not of the id B now holds
    (``claiming`` names only the last claim made: C's, gone by then)."""
    async def scenario():
        broker, announcer, bus = Broker(), Announcer(), GoneBus()
        sessions = Sessions(broker)                     # B's store read waits for the gate
        t = takeover(broker, sessions, announcer, bus)
        b, c = Channel(), Channel()

        def open_b(now):
            t.client_gone("acme", "dev", True, True)   # B's open closes C (a clean session: it ends)

        def open_c(now):
            c.state = 2                                 # connected

        claim_b = asyncio.ensure_future(t.run_claim(b, "acme", "dev", False, None, open_b))
        await asyncio.sleep(0)                          # B reads the store
        await t.run_claim(c, "acme", "dev", True, None, open_c)
        sessions.gate.set()
        await claim_b
        await asyncio.gather(*t.going.values())
        return bus.gones, t

    gones, t = asyncio.run(scenario())
    assert gones == [("acme", "dev", False, True)]     # the will dropped, the id kept
    assert t.claiming == {} and t.going == {}


def test_a_connection_that_closes_while_its_own_claim_ends_lets_go_of_its_id():
    """CONNECT and DISCONNECT in one read: the connection closes inside its own open (``cont``). Its
    clean session is over: the id is let go of."""
    async def scenario():
        broker, announcer, bus = Broker(), Announcer(), GoneBus()
        sessions = Sessions(broker)
        sessions.gate.set()
        t = takeover(broker, sessions, announcer, bus)
        channel = Channel()

        def open_and_close(now):
            channel.state = 4                           # accepted, then closed by its DISCONNECT
            t.client_gone("acme", "dev", True, False)

        await t.run_claim(channel, "acme", "dev", True, None, open_and_close)
        await asyncio.gather(*t.going.values())
        return bus.gones

    assert asyncio.run(scenario()) == [("acme", "dev", True, False)]


def test_a_takeover_refuses_every_claim_of_the_id_in_progress_here():
    async def scenario():
        broker, announcer = Broker(), Announcer()
        sessions = Sessions(broker)                     # both claims read the store until the gate opens
        t = takeover(broker, sessions, announcer)
        first, second, opened = Channel(), Channel(), []
        claims = [asyncio.ensure_future(t.run_claim(ch, "acme", "dev", False, None, opened.append))
                  for ch in (first, second)]
        await asyncio.sleep(0)
        await t.on_takeover(Link(), 7, "acme", "dev")   # node b takes the id meanwhile
        sessions.gate.set()
        await asyncio.gather(*claims)
        return broker, opened, first, second, t

    broker, opened, first, second, t = asyncio.run(scenario())
    busy = (rc.SERVER_BUSY, "the client id is being taken over by another node")
    assert first.refused == busy and second.refused == busy
    assert opened == [] and broker.sessions == set()
    assert t.claiming == {} and t.lost == set()


class LockedBus(Bus):
    """The id is node b's and its lock is held: ``lock`` waits for ``free``."""

    def __init__(self):
        self.free = asyncio.Event()
        self.claimed: list = []

    async def try_claim(self, tenant, cid):
        return "b"

    async def lock(self, tenant, cid, wait=5.0):
        await self.free.wait()
        return "a:1"

    async def owner(self, tenant, cid):
        return "b"

    async def claim(self, tenant, cid, durable, previous):
        self.claimed.append((tenant, cid))

    async def unlock(self, tenant, cid, token):
        pass


def test_a_claim_whose_client_went_away_while_it_waited_for_the_lock_takes_nothing_over():
    async def scenario():
        broker, announcer, bus = Broker(), Announcer(), LockedBus()
        sessions = Sessions(broker)
        sessions.gate.set()
        t = takeover(broker, sessions, announcer, bus)
        channel, opened = Channel(), []
        claim = asyncio.ensure_future(t.run_claim(channel, "acme", "dev", False, None, opened.append))
        await asyncio.sleep(0)                          # waiting for the id's lock
        channel.state = 4                               # the client closed its connection meanwhile
        bus.free.set()
        await claim
        return broker, bus, opened, t

    broker, bus, opened, t = asyncio.run(scenario())
    assert bus.claimed == [] and broker.sessions == set() and opened == []
    assert t.claiming == {}


# ---- a closed connection's registry update that fails (Redis unreachable, the bus closed): it is dropped
# quietly -- nothing logged by asyncio as never retrieved -- and a later CONNECT of the same id, which
# waits for it (``going``), goes on with its claim once it has failed


class FutureBus(Bus):
    """``gone`` as the real bus's: a plain def returning a future the test settles."""

    def __init__(self):
        self.updates: list[asyncio.Future] = []
        self.claims: list = []

    def gone(self, tenant, cid, ended, had_will):
        fut = asyncio.get_running_loop().create_future()
        self.updates.append(fut)
        return fut

    async def try_claim(self, tenant, cid):
        self.claims.append((tenant, cid))
        return None


def run_collecting_loop_errors(scenario):
    errors = []

    async def go():
        asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: errors.append(ctx["message"]))
        out = await scenario()
        gc.collect()                    # a future whose exception nobody retrieved reports it when freed
        await asyncio.sleep(0)
        return out

    return asyncio.run(go()), errors


@pytest.mark.parametrize("outcome", ["error", "cancelled"])
def test_a_failed_gone_update_is_dropped_quietly_and_a_later_connect_of_the_id_waits_for_it(outcome):
    async def scenario():
        bus = FutureBus()
        t = takeover(Broker(), None, None, bus=bus)
        t.client_gone("acme", "dev", True, True)
        assert set(t.going) == {("acme", "dev")}
        channel = Channel()
        claim = asyncio.ensure_future(t.run_claim(channel, "acme", "dev", True, None, lambda now: None))
        for _ in range(5):
            await asyncio.sleep(0)
        assert bus.claims == []                         # the claim waits for the update of the id
        (update,) = bus.updates
        if outcome == "error":
            update.set_exception(ConnectionError("the cluster bus is closed"))
        else:
            update.cancel()                             # as Batches._call does when its call is cancelled
        del update
        bus.updates.clear()
        await asyncio.wait_for(claim, 5)
        return bus, t, channel

    (bus, t, channel), errors = run_collecting_loop_errors(scenario)
    assert bus.claims == [("acme", "dev")] and channel.refused is None
    assert t.going == {}
    assert errors == []                                 # no "Future exception was never retrieved"


def test_a_gone_update_on_a_closed_bus_fails_quietly():
    """The real bus (no Redis needed: its lines are closed, so the batch call fails at once)."""
    async def scenario():
        bus = RealBus("redis://127.0.0.1:1/0", "a")
        for line in bus._lines:
            line.closed = True
        t = takeover(Broker(), None, None, bus=bus)
        t.client_gone("acme", "dev", True, True)
        update = t.going[("acme", "dev")]
        await asyncio.wait((update,), timeout=5)
        assert update.done()
        del update
        await bus.close()
        return t

    t, errors = run_collecting_loop_errors(scenario)
    assert t.going == {} and errors == []


# ---- ``claim``, the CONNECT's way in: the common case (the id free, nothing to read from the store) is
# answered in a callback of the claim's future; the rest goes on in ``run_claim``, with the same outcome


class Session:
    def __init__(self, durable):
        self.durable = durable


class RecordingBus(LockedBus):
    """The id free (``held_by`` None) or node b's; the will and ownership updates recorded."""

    def __init__(self, held_by=None, fails=False):
        super().__init__()
        self.free.set()
        self.held_by, self.fails = held_by, fails
        self.wills: list = []
        self.owned: list = []

    async def try_claim(self, tenant, cid):
        if self.fails:
            raise ConnectionError("redis down")
        return self.held_by

    async def mark_owned(self, tenant, cid):
        self.owned.append((tenant, cid))

    async def set_will(self, tenant, cid, will):
        self.wills.append((tenant, cid))


@pytest.mark.parametrize("case", ["free", "free with a will", "durable", "held by b", "stored", "bus down",
                                  "client gone", "open fails", "registry lost"])
def test_a_claim_through_claim_ends_as_it_would_in_run_claim(case):
    async def scenario():
        broker = Broker()
        sessions = Sessions(broker)
        sessions.gate.set()
        bus = RecordingBus(held_by="b" if case == "held by b" else None, fails=case == "bus down")
        # "registry lost": Redis restarted empty since a walk of the store -- a free id may be stored
        bus.registry_whole = case != "registry lost"
        spawned = []

        def spawn(coro):
            spawned.append(asyncio.ensure_future(coro))
            return spawned[-1]

        t = Takeover("a", bus, broker, sessions, Handoff(), Announcer(), None, None, lambda: {}, None, Fence(),
                     lambda: 0.0, spawn)
        channel, opened = Channel(), []

        def cont(now):
            if case == "open fails":
                raise RuntimeError("the session could not be opened")
            opened.append(now)
            channel.state = 2                               # connected
            channel.session = Session(durable=case in ("durable", "stored"))

        will = Will("fleet/dev/status", b"offline", 1) if case == "free with a will" else None
        # "durable": a clean start with a session expiry (nothing to read); "stored": one to read first
        t.claim(channel, "acme", "dev", case != "stored", will, cont)
        if case == "client gone":
            channel.state = 4
        for _ in range(10):
            await asyncio.sleep(0)
        await asyncio.gather(*spawned)
        return broker, bus, t, channel, opened, spawned

    broker, bus, t, channel, opened, spawned = asyncio.run(scenario())
    assert t.claiming == {} and t.lost == set()
    if case in ("bus down", "open fails"):
        assert opened == [] and channel.refused == (rc.SERVER_UNAVAILABLE, "cluster unavailable")
        return
    if case == "client gone":
        assert opened == [] and channel.refused is None
        return
    assert opened == [0.0] and channel.refused is None
    assert bus.wills == ([("acme", "dev")] if case == "free with a will" else [])
    assert bus.owned == ([("acme", "dev")] if case in ("durable", "stored") else [])
    assert bus.claimed == ([("acme", "dev")] if case == "held by b" else [])
    assert broker.discarded == ([("acme", "dev")] if case in ("held by b", "registry lost") else [])  # Clean Start
    assert broker.sessions == ({("acme", "dev")} if case == "stored" else set())
    # a task only where something is awaited after the answer: the store read, the lock, the will, the mark
    # (a free id's Clean Start reads the store only while the registry may lack a stored session)
    assert (len(spawned) > 0) == (case != "free")


class DropAfterOpen:
    """A client whose connection drops in the event-loop iteration its claim is answered in, or just
    after its CONNACK: the socket event that ends it (``registry.channel_closed``: the channel's session
    gone) is made ready on a real socket pair, so the loop -- asyncio's or uvloop's -- runs it where it
    would run a client's reset."""

    def __init__(self, t, channel, when):
        self.t, self.channel, self.when = t, channel, when
        self.opened = False
        self.r, self.w = socket.socketpair()
        self.r.setblocking(False)
        asyncio.get_running_loop().add_reader(self.r.fileno(), self.lost)

    def cont(self, now):                 # registry._open_session: CONNACK sent, a stored session open
        self.channel.state = 2
        self.channel.session = Session(durable=True)
        self.opened = True
        if self.when == "after its CONNACK":
            self.w.send(b"x")

    def lost(self):
        asyncio.get_running_loop().remove_reader(self.r.fileno())
        self.channel.session = None
        self.channel.state = 4
        self.t.client_gone("acme", "dev", False, False)    # a stored session: not ended, no will

    def close(self):
        self.r.close()
        self.w.close()


@pytest.mark.parametrize("when", ["with its claim's answer", "after its CONNACK"])
@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_stored_session_opened_here_is_marked_this_nodes_even_if_its_client_drops_at_once(loop, when):
    """A survivor adopts a dead node's stored sessions from the node's marks: a session whose CONNACK went
    out must be marked, whatever its connection does next (found by a review: the mark was read from the
    channel a loop iteration later, after the drop had taken the session off it)."""
    async def scenario():
        bus = RecordingBus()
        answer = asyncio.get_running_loop().create_future()
        bus.try_claim = lambda tenant, cid: answer          # as the real bus: the batch's future
        t = Takeover("a", bus, Broker(), None, Handoff(), Announcer(), None, None, lambda: {}, None, Fence(),
                     lambda: 0.0, asyncio.ensure_future)
        channel = Channel()
        client = DropAfterOpen(t, channel, when)
        t.claim(channel, "acme", "dev", True, None, client.cont)     # clean start, a session expiry
        await asyncio.sleep(0)
        answer.set_result(None)
        if when == "with its claim's answer":
            client.w.send(b"x")
        for _ in range(10):
            await asyncio.sleep(0.001)
        client.close()
        return bus, t, channel, client.opened

    if loop == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            bus, t, channel, opened = runner.run(scenario())
    else:
        bus, t, channel, opened = asyncio.run(scenario())
    assert channel.state == 4 and channel.session is None     # the client dropped
    # (a drop the loop runs before the claim's answer: nothing opened, nothing to mark -- uvloop's order)
    assert opened or when == "with its claim's answer"
    assert bus.owned == ([("acme", "dev")] if opened else [])
    assert t.claiming == {}


@pytest.mark.parametrize("stored", [False, True], ids=["clean", "stored"])
def test_a_claim_answered_after_the_node_fenced_itself_opens_nothing(stored):
    """A CONNECT's claim is on its way (a batch call to a slow Redis) when the node fences itself (its
    heartbeats failed): the node has dropped every session and refuses CONNECTs until it rejoins. The
    claim's late answer must not open a session on it after all: the CONNECT is refused."""
    async def scenario():
        bus = RecordingBus()
        answer = asyncio.get_running_loop().create_future()
        bus.try_claim = lambda tenant, cid: answer          # as the real bus: the batch's future
        broker = Broker()
        sessions = Sessions(broker)
        sessions.gate.set()
        fence = Fence()
        spawned = []

        def spawn(coro):
            spawned.append(asyncio.ensure_future(coro))
            return spawned[-1]

        t = Takeover("a", bus, broker, sessions, Handoff(), Announcer(), None, None, lambda: {}, None, fence,
                     lambda: 0.0, spawn)
        channel, opened = Channel(), []
        t.claim(channel, "acme", "dev", not stored, None, opened.append)
        await asyncio.sleep(0)
        fence.fenced = True                                  # Fencing.fence: sessions dropped, CONNECTs refused
        answer.set_result(None)                              # the claim's late answer: the id was free
        for _ in range(10):
            await asyncio.sleep(0)
        await asyncio.gather(*spawned)
        return t, channel, opened

    t, channel, opened = asyncio.run(scenario())
    assert opened == []
    assert channel.refused == (rc.SERVER_UNAVAILABLE, "this node is out of the cluster")
    assert t.claiming == {}


def test_refused_takeovers_are_logged_once_then_summed_per_node(caplog):
    """The first refusal from a node is a line at once; those after it one line
    per node every REFUSALS_LOG_EVERY s with their count; after a quiet spell
    the next is a line at once again."""
    from brokerd.cluster.takeover import REFUSALS_LOG_EVERY, RefusalLog

    refusals = RefusalLog()
    lines = lambda: [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]   # noqa: E731
    with caplog.at_level("WARNING", logger="brokerd.cluster"):
        for i in range(1000):
            refusals.refused("n3", "t", f"c{i}", 0.001 * i)
        refusals.refused("n2", "t", "x", 0.5)
        refusals.tick(1.0)
        assert lines() == ["takeover of t/c0 refused: node n3 does not hold the client id's lock",
                           "takeover of t/x refused: node n2 does not hold the client id's lock"]
        refusals.tick(REFUSALS_LOG_EVERY + 0.1)
        assert lines()[2:] == [f"999 more takeovers refused in the last {REFUSALS_LOG_EVERY:.0f} s: node n3 does "
                               "not hold the client ids' locks (the last: t/c999)"]
        refusals.tick(2 * REFUSALS_LOG_EVERY + 1)     # quiet: nothing to sum up, n2 and n3 forgotten
        assert len(lines()) == 3 and refusals.since == {}
        refusals.refused("n3", "t", "again", 2 * REFUSALS_LOG_EVERY + 2)
        assert lines()[3:] == ["takeover of t/again refused: node n3 does not hold the client id's lock"]
