"""Stored sessions no live node holds -- the whole cluster was down, or Redis
lost its registry -- are adopted by a node joining, with real nodes, a real
Redis and a shared SQLite store; and the bus calls that walk uses
(``Bus.owners``: a page of client ids' holders in one round trip,
``Bus.renew_lease``). test_orphans_unit.py shows which sessions the walk
reads from the store."""

import asyncio
import uuid

from brokerd.cluster.bus import Bus

from ..mqtt import V311, PahoClient
from .conftest import Cluster, wait_until


def test_a_joining_node_adopts_the_stored_sessions_no_live_node_holds(redis_server, tmp_path, tag):
    first = Cluster(redis_server, tmp_path)
    second = Cluster(redis_server, tmp_path, store=first.store)     # the same store, a bus that knows nothing
    try:
        n1 = first.node()
        for cid in ("a", "b"):
            c = PahoClient(f"{tag}-{cid}", V311, clean=False).connect(n1.port())
            c.subscribe(f"{tag}/{cid}", qos=1)
            c.disconnect()
        assert n1.stop() == 0                  # the whole cluster down: nobody adopts them
        m1 = second.node()
        wait_until(lambda: "adopted 2 stored sessions no live node held" in m1.log, timeout=10,
                   message=f"the orphaned sessions were not adopted:\n{m1.log}")
        pub = PahoClient(f"{tag}-pub", V311).connect(m1.port())
        pub.publish(f"{tag}/a", b"queued for a", qos=1)
        live = PahoClient(f"{tag}-live", V311, clean=False).connect(m1.port())
        live.subscribe(f"{tag}/live", qos=1)
        # a node joining now: m1 holds every stored session, there is nothing to adopt
        m2 = second.node()
        assert "no live node held" not in m2.log, m2.log
        a = PahoClient(f"{tag}-a", V311, clean=False).connect(m2.port())
        assert a.session_present
        assert a.expect(timeout=10).payload == b"queued for a"
        pub.publish(f"{tag}/live", b"still m1's", qos=1)
        assert live.expect(timeout=10).payload == b"still m1's"
        for c in (a, pub, live):
            c.disconnect()
    finally:
        first.stop_all()
        second.stop_all()


def test_the_bus_tells_a_page_of_holders_at_once_and_renews_its_lease(redis_server):
    async def go():
        url = redis_server.url(0, f"o{uuid.uuid4().hex[:10]}")
        n1, n2 = Bus(url, "n1"), Bus(url, "n2")
        try:
            await n1.claim("t1", "a", True, None)
            await n2.claim("t2", "a", True, None)
            await n2.claim("t1", "ü/😀", False, None)
            keys = [("t1", "a"), ("t2", "a"), ("t1", "nobody"), ("t3", "a"), ("t1", "ü/😀"), ("t2", "a")]
            assert await n1.owners(keys) == ["n1", "n2", None, None, "n2", "n2"]
            assert await n1.owners([]) == []

            # whether the registry knows every stored session comes with each claim's answer, alone or in a batch
            assert await n1.try_claim("t1", "c1") is None and not n1.registry_whole
            await n2.registry_complete()                # a walk of the store found every session held
            assert await n1.try_claim("t1", "c2") is None and n1.registry_whole
            assert await asyncio.gather(n1.try_claim("t1", "c3"), n1.try_claim("t1", "a")) == [None, None]
            assert n1.registry_whole
            await n1.redis.delete(n1.k("registry"))     # Redis lost it (restarted empty, the registry too)
            assert await asyncio.gather(n1.try_claim("t1", "c4"), n1.try_claim("t1", "c5")) == [None, None]
            assert not n1.registry_whole

            assert await n1.try_lease("orphans", 2)
            assert await n1.renew_lease("orphans", 60)
            assert 50_000 < await n1.redis.pttl(n1.k("orphans")) <= 60_000
            assert not await n2.renew_lease("orphans", 60)       # n1's: n2 neither takes nor extends it
            assert not await n2.try_lease("orphans", 60)
            await n1.drop_lease("orphans")
            assert await n2.try_lease("orphans", 60)
        finally:
            await n1.close()
            await n2.close()

    asyncio.run(asyncio.wait_for(go(), 30))
