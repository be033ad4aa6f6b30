"""A CONNECT's claim and its connection's updates, on the real bus and a real Redis: what goes to Redis on
the bus's lines (claims, disconnect waves) and what goes through redis-py's pool (a will, a stored
session's mark) must reach Redis in the order the node decided them, and what waits on the lines must
stay bounded while Redis is slow."""

import asyncio

from brokerd.cluster.bus import Bus, key_of
from brokerd.cluster.takeover import Takeover
from brokerd.protocol.packets import Will

from .test_takeover_unit import Announcer, Broker, Channel, Fence, Handoff, Session


class SlowWillBus(Bus):
    """The real bus; registering a will waits for ``gate`` first (redis-py's pool busy in a storm, a
    connection being made): the will's HSET is not yet sent."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.gate = asyncio.Event()
        self.setting = asyncio.Event()

    async def set_will(self, tenant, cid, blob):
        self.setting.set()
        await self.gate.wait()
        await super().set_will(tenant, cid, blob)


def test_a_will_still_being_registered_when_its_client_drops_is_not_left_behind_in_redis(redis_server, tag):
    """A client with a will (no stored session) connects and drops while its will is being registered.
    Its disconnect's update (the will no longer owed, the id let go of) goes on the bus's own line, the
    will on redis-py's: the update must not overtake the will, or the will stays in ``wills:{node}`` --
    and a survivor publishes it when this node dies, for a client that left long before."""
    async def go():
        bus = SlowWillBus(redis_server.url(prefix=tag), "a")
        tasks = []

        def spawn(coro):
            tasks.append(asyncio.ensure_future(coro))
            return tasks[-1]

        t = Takeover("a", bus, Broker(), None, Handoff(), Announcer(), None, None, lambda: {}, None, Fence(),
                     lambda: 0.0, spawn)
        channel = Channel()

        def cont(now):                                   # registry._open_session: CONNACK sent
            channel.state = 2
            channel.session = Session(durable=False)

        try:
            await bus.registry_complete()                    # as a node's join does (its walk of the store)
            t.claim(channel, "acme", "dev", True, Will("fleet/dev/status", b"offline", 1), cont)
            await asyncio.wait_for(bus.setting.wait(), 5)    # the will's registration is on its way
            assert await bus.owner("acme", "dev") == "a"
            channel.session = None                           # the client drops (registry.channel_closed)
            channel.state = 4
            t.client_gone("acme", "dev", True, True)
            await asyncio.wait(list(t.going.values()), timeout=0.5)
            bus.gate.set()                                   # the will's HSET goes now
            await asyncio.wait_for(asyncio.gather(*tasks), 5)
            await asyncio.wait_for(asyncio.gather(*t.going.values(), return_exceptions=True), 5)
            assert t.going == {} and t.claiming == {}
            assert await bus.redis.hget(bus.k("wills", "a"), key_of("acme", "dev")) is None
            assert await bus.owner("acme", "dev") is None
        finally:
            await bus.close()

    asyncio.run(go())


def test_while_redis_is_stalled_the_claims_waiting_are_bounded_and_a_connect_over_the_bound_is_refused_at_once(
        redis_server, tag):
    """A connect storm while a claim call hangs on a stalled Redis: the claims made meanwhile wait for
    the next call, but only so many (bytes, ``CLAIMS_QUEUED_BYTES``); a CONNECT over that is answered at
    once (refused: cluster unavailable, the client retries) instead of queueing without end behind a
    backlog -- and the node takes claims again once the backlog has gone to Redis."""
    from redis.exceptions import ConnectionError as RedisConnectionError

    async def go():
        bus = Bus(redis_server.url(prefix=tag), "n1")
        batch = bus._claims.send
        stalled = asyncio.Event()
        calls = []

        async def stalling(items):              # the first call hangs until Redis answers again
            calls.append(len(items))
            if len(calls) == 1:
                await stalled.wait()
            return await batch(items)

        bus._claims.send = stalling
        bus._claims.max_bytes = 40 * (256 + len("t") + len("c000"))     # room for 40 such claims
        try:
            first = bus.try_claim("t", "first")
            await asyncio.sleep(0)                                       # its call is on its way (and hangs)
            storm = [bus.try_claim("t", f"c{i:03}") for i in range(400)]
            for _ in range(3):
                await asyncio.sleep(0)
            refused = [f for f in storm if f.done()]
            assert len(refused) >= 350, f"{len(refused)} of 400 claims answered while Redis is stalled"
            assert all(isinstance(f.exception(), RedisConnectionError) for f in refused)
            stalled.set()
            assert await first is None
            waited = [f for f in storm if f not in refused]
            assert await asyncio.gather(*waited) == [None] * len(waited)
            assert await bus.try_claim("t", "after") is None             # the backlog gone: claims go again
            assert await bus.owner("t", "after") == "n1"
            assert await bus.owner("t", "c399") is None                  # a refused claim took nothing
        finally:
            await bus.close()

    asyncio.run(go())
