"""A node joining a cluster adopts the stored sessions no live node holds
(``Adoption.adopt_orphans``: the whole cluster was down, or Redis lost its
registry) -- walking the store's session keys a page at a time, asking the
bus who holds a page's client ids in one call, and reading (queue and all)
only the sessions it adopts -- driven with the fakes of ``fakes.py``.
(test_orphans.py does it with real nodes, Redis and SQLite.)
"""

import asyncio
import logging

import pytest

from brokerd.cluster import adoption

from .fakes import Connecting, FakeNet, publish


def run(coro):
    asyncio.run(asyncio.wait_for(coro, 30))


@pytest.fixture
def small_pages(monkeypatch):
    monkeypatch.setattr(adoption, "ORPHANS_PAGE", 4, raising=False)


async def held_by(net, node, cid: str, filt: str) -> None:
    """A stored session of ``t/cid`` subscribed to ``filt``, its client connected to ``node``."""
    net.store.add("t", cid, [filt])
    conn = Connecting()
    node.claim(conn, "t", cid, False, None, conn.cont)
    await net.settle()
    assert conn.opened


def test_a_joining_node_adopts_only_the_sessions_no_live_node_holds_and_reads_only_those(small_pages, caplog):
    """``a`` holds 9 stored sessions; 6 others are orphans (3 nobody holds, 3 of a node that is
    gone). ``b`` joins: it adopts the 6 -- messages for them are queued again -- and reads
    those 6 from the store, not one of ``a``'s (before: every stored session with its queue,
    ``store.load``), asking the bus about their holders once per page of keys."""
    async def go():
        net = FakeNet()
        a = await net.node("a")
        for i in range(9):
            await held_by(net, a, f"live-{i}", f"live/{i}")
        orphans = [f"nobody-{i}" for i in range(3)] + [f"dead-{i}" for i in range(3)]
        for cid in orphans:
            net.store.add("t", cid, [f"o/{cid}"])
        for cid in orphans[3:]:                          # held by a node whose membership is gone
            net.state.clients.setdefault("t", {})[cid] = "z"
            net.state.owned.setdefault("z", set()).add(("t", cid))
        net.store.loaded.clear()
        net.store.pages.clear()
        net.state.owner_batches = 0
        with caplog.at_level(logging.WARNING, logger="brokerd.cluster"):
            b = await net.node("b")
        await net.settle()

        assert sorted(net.store.loaded) == sorted(("t", cid) for cid in orphans)
        assert net.store.pages == [4, 4, 4, 3]           # 15 keys, 4 at a time
        assert net.state.owner_batches == 4
        assert "adopted 6 stored sessions no live node held" in caplog.text
        assert set(b.broker.sessions) == {("t", cid) for cid in orphans}
        assert len(a.broker.sessions) == 9
        for cid in orphans:
            assert net.state.clients["t"][cid] == "b"
            assert ("t", cid) in net.state.owned["b"]
        assert not net.state.owned["z"]
        assert net.state.locks == {} and net.state.leases == {}
        # they receive again, wherever the publisher is; a's sessions still on a
        ack = publish(a, "t", "o/dead-1", b"for an orphan")
        ack2 = publish(b, "t", "live/3", b"for a live one")
        await net.settle()
        assert ack.done and ack.ok and ack2.done and ack2.ok
        assert net.store.queues[("t", "dead-1")] == [b"for an orphan"]
        assert net.store.queues[("t", "live-3")] == [b"for a live one"]

    run(go())


def test_the_walk_keeps_its_lease_and_stops_once_another_node_has_it(small_pages, monkeypatch):
    """The walk renews the ``orphans`` lease as it goes (here: at every step); if another
    node holds it meanwhile, this one stops, leaving that node's lease in place."""
    monkeypatch.setattr(adoption, "ORPHANS_LEASE", 0, raising=False)   # renewed at every step
    async def go():
        net = FakeNet()
        for i in range(10):
            net.store.add("t", f"o-{i}", [f"o/{i}"])
        keys = net.store.session_keys

        async def listed(after, limit):
            page = await keys(after, limit)
            if len(net.store.pages) == 2:
                net.state.leases["orphans"] = "other"     # b's lease ran out, another node took it
            return page

        net.store.session_keys = listed
        b = await net.node("b")
        assert set(b.broker.sessions) == {("t", f"o-{i}") for i in range(4)}     # the first page only
        assert net.state.renewals >= 5
        assert net.state.leases == {"orphans": "other"}

    run(go())


def test_a_dead_nodes_session_that_fails_to_load_does_not_stop_the_adoption_of_the_others(caplog):
    """``z`` died holding 70 stored sessions; reading one of them fails. The survivor adopts the
    69 others (a few at once) and says how many failed. Before, the first failure ended the
    adoption: every session after it in the list stayed orphaned until its client connected
    again or a node joined."""
    async def go():
        net = FakeNet()
        b = await net.node("b")
        cids = [f"dead-{i:02d}" for i in range(70)]
        for cid in cids:
            net.store.add("t", cid, [f"o/{cid}"])
            net.state.clients.setdefault("t", {})[cid] = "z"
            net.state.owned.setdefault("z", set()).add(("t", cid))
        real = net.store.load_session

        async def flaky(tenant, cid):
            if cid == "dead-03":
                raise OSError("the store refused the read")
            return await real(tenant, cid)

        net.store.load_session = flaky
        with caplog.at_level(logging.WARNING, logger="brokerd.cluster"):
            await b.adoption.reap("z")
        assert set(b.broker.sessions) == {("t", cid) for cid in cids if cid != "dead-03"}
        assert "adopted 69 sessions of node z" in caplog.text and "(1 failed" in caplog.text
        assert net.state.clients["t"]["dead-03"] == "z"          # left for its next CONNECT or a joining node
        assert net.state.locks == {}

    run(go())


def test_a_session_whose_lock_lapsed_while_it_was_read_is_left_to_the_connect_that_took_it(caplog):
    """``z`` died holding a stored session; ``b`` adopts it, and its store read is slow. Meanwhile
    the client id's lock lapses anyway (Redis lost it -- a failover, a restart --, or keeping it
    failed for REAP_LOCK), and a CONNECT on ``a`` takes the id and loads the session. ``b`` must
    not load and claim it as well once its read is back. Before, the keeper only logged that the
    lock had lapsed and ``b`` went on: the session lived on both nodes, the registry named ``b``,
    and what ``a``'s client was given was queued again on ``b``."""
    async def go():
        net = FakeNet()
        a = await net.node("a")
        b = await net.node("b")
        net.store.add("t", "dead-0", ["o/dead-0"])
        net.state.clients.setdefault("t", {})["dead-0"] = "z"
        net.state.owned.setdefault("z", set()).add(("t", "dead-0"))
        real = net.store.load_session
        reading, answer = asyncio.Event(), asyncio.Event()

        async def slow(tenant, cid):
            if not reading.is_set():                     # b's read, the first: slow
                reading.set()
                await answer.wait()
            return await real(tenant, cid)

        net.store.load_session = slow
        with caplog.at_level(logging.WARNING, logger="brokerd.cluster"):
            reap = asyncio.ensure_future(b.adoption.reap("z"))
            await reading.wait()
            assert net.state.locks.pop(("t", "dead-0")).startswith("b:")      # the lock lapses
            conn = Connecting()
            a.claim(conn, "t", "dead-0", False, None, conn.cont)
            await net.settle()
            assert conn.opened and ("t", "dead-0") in a.broker.sessions
            answer.set()
            await reap
            await net.settle()
        assert ("t", "dead-0") not in b.broker.sessions
        assert net.state.clients["t"]["dead-0"] == "a"
        assert ("t", "dead-0") in net.state.owned["a"] and ("t", "dead-0") not in net.state.owned.get("b", ())
        assert net.state.locks == {}
        ack = publish(b, "t", "o/dead-0", b"once")                 # b forwards it to a's session
        await net.settle()
        assert ack.done and ack.ok
        assert net.store.queues[("t", "dead-0")] == [b"once"]

    run(go())
