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
