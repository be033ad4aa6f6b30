"""A stored session moving between nodes, and requests that are never
answered -- the cluster's real parts driven with a fake bus, a fake wire, a
fake store and a fake clock (``fakes.py``): no Redis, no socket, no wait.
(test_sessions.py runs the same handoff between real processes over Redis.)

Three nodes: ``a`` holds the stored session of ``t/dev`` (filter ``x/#``),
``c`` publishes QoS 1 messages to ``x/1``, and the client reconnects on ``b``.
What the session was given is the store's queue of it, whichever node gave it.
"""

import asyncio
import logging
import re

from brokerd.cluster import frames
from brokerd.cluster.handoff import HANDOFF_TIMEOUT, RELEASE_TIMEOUT, SYNC_TIMEOUT
from brokerd.cluster.node import ClusterNode
from brokerd.cluster.requests import ACK_TIMEOUT, ANSWER, LATE, ask

from .fakes import (
    BusState,
    Connecting,
    FakeBroker,
    FakeBus,
    FakeClock,
    FakeNet,
    FakePeers,
    FakeStore,
    Wire,
    publish,
)

SESSION = ("t", "dev")


def run(coro):
    asyncio.run(asyncio.wait_for(coro, 30))


async def three_nodes():
    """a, b, c joined; the client of t/dev connected to a, its session stored; c routes x/1 to a."""
    net = FakeNet()
    a, b, c = [await net.node(n) for n in "abc"]
    net.store.add(*SESSION, ["x/#"])
    first = Connecting()
    a.claim(first, *SESSION, False, None, first.cont)
    await net.settle()
    assert first.opened and a.broker.holds(*SESSION)
    assert c.routes.match("t", "x/1") == ({"a": True}, [])
    return net, a, b, c


def handoff_counts(caplog) -> tuple[int, int]:
    """(through the old node, held at the new one) from the new owner's log line."""
    for rec in caplog.records:
        m = re.search(r"handoff of t/dev: (\d+) messages came through the old node, (\d+) held here",
                      rec.getMessage())
        if m:
            return int(m[1]), int(m[2])
    return 0, 0


def test_messages_during_a_handoff_are_neither_lost_nor_doubled_nor_reordered(caplog):
    """A message for every round of the takeover, in its four windows: a
    gives it to the session (before it lets go); a sends it on to b (c reads
    the log late and still routes to a); b holds it (c switched, the session
    is not loaded yet); b gives it to the session. The session gets each
    once, in the order published, and every publisher is acknowledged."""

    async def go():
        net, a, b, c = await three_nodes()
        sent = []

        async def one():
            sent.append(publish(c, "t", "x/1", b"%d" % len(sent)))
            await net.step()
            assert len(sent) < 200, "the takeover never finished"

        for _ in range(3):
            await one()
        net.deaf.add("c")
        second = Connecting()
        b.claim(second, *SESSION, False, None, second.cont)
        while a.broker.holds(*SESSION):          # a gives them to the session
            await one()
        for _ in range(3):                        # a sends them on to b
            await one()
        net.deaf.clear()
        while not second.opened:                  # c switches to b, which holds them
            await one()
        for _ in range(3):                        # b gives them to the session
            await one()
        await net.settle()
        assert net.store.queues[SESSION] == [b"%d" % i for i in range(len(sent))]
        assert all(ack.done and ack.ok for ack in sent)
        assert b.broker.holds(*SESSION) and not a.broker.holds(*SESSION)
        assert c.routes.match("t", "x/1") == ({"b": True}, [])
        assert a.routes.match("t", "x/1") == ({"b": True}, [])
        assert net.state.clients["t"]["dev"] == "b"
        assert not a.handoff.moving and not b.handoff.moving and not b.handoff.arriving
        assert not a.requests.asks and not b.requests.asks and not c.requests.acks

    with caplog.at_level(logging.INFO, logger="brokerd.cluster"):
        run(go())
    through_old, held = handoff_counts(caplog)
    assert through_old > 0 and held > 0, "the takeover did not go through both of the handoff's paths"


def test_what_the_new_owner_held_for_a_session_it_could_not_load_is_refused(caplog):
    """The same takeover, but the stored session is gone when b loads it (a
    store that lost it, a load that failed): what b held for it reached no
    session, so its publishers get a negative ack and send again -- they
    were acknowledged as stored (a loss). Everything acknowledged is in the
    session's stored queue."""

    async def go():
        net, a, b, c = await three_nodes()
        sent = []

        async def one():
            sent.append(publish(c, "t", "x/1", b"%d" % len(sent)))
            await net.step()
            assert len(sent) < 200, "the takeover never finished"

        for _ in range(3):
            await one()
        net.deaf.add("c")
        net.store.records.clear()                 # b's load of the session will find nothing
        second = Connecting()
        b.claim(second, *SESSION, False, None, second.cont)
        while a.broker.holds(*SESSION):
            await one()
        for _ in range(3):
            await one()
        net.deaf.clear()
        while not second.opened:                  # c switches to b, which holds them
            await one()
        await net.settle()
        assert all(ack.done for ack in sent)
        acked = [i for i, ack in enumerate(sent) if ack.ok]
        refused = [i for i, ack in enumerate(sent) if not ack.ok]
        queue = net.store.queues[SESSION]
        assert [b"%d" % i for i in acked if b"%d" % i not in queue] == [], "acknowledged, never stored"
        assert refused, "no message was held for the session at b"

    with caplog.at_level(logging.INFO, logger="brokerd.cluster"):
        run(go())


def test_a_slow_link_to_the_old_owner_does_not_reorder(caplog):
    """c's link to a stalls while the routes switch: c sends the next messages
    to b, whose confirmation (SYNCED) to a waits behind the stalled ones on
    the same link -- so a lets the session go only after it sent them on, and
    b gives the session those first, then what came to it directly."""

    async def go():
        net, a, b, c = await three_nodes()
        net.wire.pause("c", "a")
        second = Connecting()
        b.claim(second, *SESSION, False, None, second.cont)
        acks = []
        for i in range(10):
            acks.append(publish(c, "t", "x/1", b"%d" % i))
            await net.step()
        assert c.routes.match("t", "x/1") == ({"b": True}, []), "c did not switch to b meanwhile"
        assert not second.opened and a.handoff.moving, "a let go before c confirmed the switch"
        net.wire.resume()
        await net.settle()
        assert second.opened
        assert net.store.queues[SESSION] == [b"%d" % i for i in range(10)]
        assert all(ack.done and ack.ok for ack in acks)

    with caplog.at_level(logging.INFO, logger="brokerd.cluster"):
        run(go())
    through_old, held = handoff_counts(caplog)
    assert through_old > 0 and held > 0


def test_the_new_owner_never_holding_the_handoff_fails_at_its_deadline(caplog):
    """b's HOLDING never comes: a waits HANDOFF_TIMEOUT by the clock -- not a
    moment less -- then lets the session go without a handoff (its routes
    announced as they are) and b loads it from the store."""

    async def go():
        net, a, b, c = await three_nodes()
        net.wire.lose(frames.HANDOFF, "a", "b")
        second = Connecting()
        b.claim(second, *SESSION, False, None, second.cont)
        await net.settle()
        assert a.broker.holds(*SESSION) and not second.opened
        assert list(a.requests.asks.values())[0][3] == "b"
        net.clock.advance(HANDOFF_TIMEOUT - 0.01)
        net.tick()
        await net.settle()
        assert a.broker.holds(*SESSION) and not second.opened
        net.clock.advance(0.01)
        net.tick()
        await net.settle()
        assert second.opened and b.broker.holds(*SESSION) and not a.broker.holds(*SESSION)
        assert not a.requests.asks and not a.handoff.moving
        assert ("t", "x/#") not in a.announcer.announced
        assert c.routes.match("t", "x/1") == ({"b": True}, [])
        assert net.state.clients["t"]["dev"] == "b"

    with caplog.at_level(logging.INFO, logger="brokerd.cluster"):
        run(go())
    assert handoff_counts(caplog) == (0, 0)


def test_a_holding_that_is_no_answer_closes_the_link_and_the_session_moves_without_a_handoff():
    """b answers the HANDOFF with counts that are not counts of the session's
    filters (a bug, a rogue member): a took them and raised in the takeover's
    task when it came to announce them -- the session stayed on a, and b's
    CONNECT waited its whole release timeout. Now a closes the link, moves
    the session without a handoff, and b loads it from the store."""

    async def go():
        net, a, b, c = await three_nodes()
        net.wire.lose(frames.HOLDING, "b", "a")
        second = Connecting()
        b.claim(second, *SESSION, False, None, second.cont)
        await net.settle()
        [req] = a.requests.asks
        net.wire.lost.clear()
        net.wire.post("b", "a", "a", frames.holding(req, '{"x/#": ["many", 1]}'))
        await net.settle()
        assert [why for me, peer, why in net.wire.failures if (me, peer) == ("a", "b")], net.wire.failures
        assert second.opened and b.broker.holds(*SESSION) and not a.broker.holds(*SESSION)
        assert not a.handoff.moving and ("t", "x/#") not in a.announcer.announced
        assert c.routes.match("t", "x/1") == ({"b": True}, [])
        ack = publish(c, "t", "x/1", b"after")
        await net.settle()
        assert ack.done and ack.ok and net.store.queues[SESSION][-1:] == [b"after"]

    run(go())


def test_a_holding_that_comes_too_late_leaves_the_session_routed_to_its_new_owner():
    """b holds for the session (HOLDING), but its answer reaches a after
    HANDOFF_TIMEOUT (a slow link) or never: a moves the session without a
    handoff. b had counted the session in as the route switch would announce
    it -- and no switch came, so no node ever learnt that b has the session's
    route: c's messages for it went nowhere (acknowledged to their publisher,
    never in the session's queue) until the session subscribed again. Now b
    announces the counts itself when no switch came."""

    async def go():
        net, a, b, c = await three_nodes()
        net.wire.lose(frames.HOLDING, "b", "a")
        second = Connecting()
        b.claim(second, *SESSION, False, None, second.cont)
        await net.settle()
        net.clock.advance(HANDOFF_TIMEOUT)
        net.tick()
        await net.settle()
        assert second.opened and b.broker.holds(*SESSION) and not a.broker.holds(*SESSION)
        assert c.routes.match("t", "x/1") == ({"b": True}, [])
        ack = publish(c, "t", "x/1", b"after")
        await net.settle()
        assert ack.done and ack.ok and net.store.queues[SESSION][-1:] == [b"after"]

    run(go())


def test_a_release_that_never_comes_fails_at_its_deadline(caplog):
    """a's RELEASED is lost: b waits RELEASE_TIMEOUT by the clock, says so,
    and loads the session from the store (the store, not the registry, is the truth)."""

    async def go():
        net, a, b, c = await three_nodes()
        net.wire.lose(frames.RELEASED, "a", "b")
        second = Connecting()
        b.claim(second, *SESSION, False, None, second.cont)
        await net.settle()
        assert not a.broker.holds(*SESSION) and not second.opened
        net.clock.advance(RELEASE_TIMEOUT - 0.01)
        net.tick()
        await net.settle()
        assert not second.opened
        net.clock.advance(0.01)
        net.tick()
        await net.settle()
        assert second.opened and b.broker.holds(*SESSION)
        assert not b.requests.asks

    with caplog.at_level(logging.WARNING, logger="brokerd.cluster"):
        run(go())
    assert any("did not release t/dev in time" in r.getMessage() for r in caplog.records)


def test_a_route_switch_some_node_never_confirms_waits_sync_timeout():
    """c never answers SYNC: a waits SYNC_TIMEOUT by the clock before letting
    the session go, holding (and sending on to b) what still arrives."""

    async def go():
        net, a, b, c = await three_nodes()
        net.wire.lose(frames.SYNCED, "c", "a")
        second = Connecting()
        b.claim(second, *SESSION, False, None, second.cont)
        await net.settle()
        assert a.handoff.moving and not second.opened
        net.clock.advance(SYNC_TIMEOUT - 0.01)
        net.tick()
        await net.settle()
        assert a.handoff.moving and not second.opened
        net.clock.advance(0.01)
        net.tick()
        await net.settle()
        assert second.opened and not a.handoff.moving and not b.handoff.arriving

    run(go())


def test_acks_that_never_come_fail_at_the_deadline():
    """The node that stores a message never acknowledges it: the publisher's
    ack stays open until ACK_TIMEOUT has passed by the clock, then fails
    (it is told, and sends again); an ACK from another node than the one
    asked counts for nothing; a lost link fails its requests at once."""

    async def go():
        net, a, b, c = await three_nodes()
        net.wire.lose(frames.ACK, "a", "c")
        ack = publish(c, "t", "x/1", b"0")
        await net.settle()
        assert net.store.queues[SESSION] == [b"0"] and not ack.done
        (req,) = c.requests.acks
        c.on_frame(type("Link", (), {"peer": "b"})(), (frames.ACK, req, 0))     # forged: b was not asked
        assert not ack.done
        net.clock.advance(ACK_TIMEOUT)
        net.tick()
        assert not ack.done                            # the deadline itself: not yet past
        net.clock.advance(0.01)
        net.tick()
        assert ack.done and not ack.ok
        assert not c.requests.acks
        lost = publish(c, "t", "x/1", b"1")
        assert not lost.done
        c.peer_lost("a")
        assert lost.done and not lost.ok

    run(go())


def test_a_holder_whose_session_never_comes_is_flushed_at_its_deadline():
    """b holds messages for a session it expected, and no claim is under way
    any more: the holder is flushed RELEASE_TIMEOUT after it began (by the
    clock, not before) -- to nobody, the session is not here, so its
    publisher gets a negative ack."""

    async def go():
        net, a, b, c = await three_nodes()
        net.wire.lose(frames.RELEASED, "a", "b")
        second = Connecting()
        b.claim(second, *SESSION, False, None, second.cont)
        await net.settle()
        held = publish(c, "t", "x/1", b"late")       # c switched to b: held there
        await net.settle()
        assert b.handoff.arriving and not held.done
        since = b.handoff.arriving[SESSION].since
        b.handoff.done_expecting(*SESSION)            # as if the claim had given up
        net.clock.now = since + RELEASE_TIMEOUT
        net.tick()
        assert b.handoff.arriving                     # the deadline itself: not yet past
        net.clock.advance(0.01)
        net.tick()
        await net.settle()
        assert not b.handoff.arriving and not b.handoff.moving and held.done
        assert b"late" not in net.store.queues[SESSION]
        # nobody stored it: the publisher is told so (and sends again) -- it was acknowledged as stored
        assert not held.ok, "a message no session received was acknowledged to its publisher"

    run(go())


def test_an_unanswered_ask_fails_at_its_deadline_on_the_loops_timer():
    """In production the clock is the loop's and an ask's deadline arms a
    timer (no timer round runs here): the ask ends LATE at its deadline, not before."""

    async def go():
        loop = asyncio.get_running_loop()
        node = ClusterNode("n1", FakeBus(BusState(FakeClock()), "n1"), FakeBroker(FakeStore()), loop=loop,
                           clock=loop.time, peers=FakePeers(Wire(), "n1"))
        node.requests.wake = node._arm           # as start() wires it
        t = loop.time()
        got = await asyncio.wait_for(ask(node.requests, ANSWER, "n2", lambda req: None, t + 0.05), 10)
        assert got is LATE and loop.time() >= t + 0.05
        assert not node.requests.asks and node._timer is None

    run(go())
