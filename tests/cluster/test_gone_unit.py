"""A closed connection's registry update that fails (Redis unreachable, the bus closed): it is dropped
quietly -- nothing logged by asyncio as never retrieved -- and a later CONNECT of the same id, which
waits for it (``going``), goes on with its claim once it has failed."""

import asyncio
import gc

import pytest

from brokerd.cluster.bus import Bus
from brokerd.cluster.takeover import CONNECTING, Takeover


class Channel:
    def __init__(self):
        self.state, self.session, self.refused = CONNECTING, None, None

    def refuse(self, code, reason):
        self.refused, self.state = (code, reason), 4


class Broker:
    def holds(self, tenant, cid):
        return False


class Handoff:
    def done_expecting(self, tenant, cid):
        pass

    def flush_arriving(self, tenant, cid):
        pass


class Fence:
    fenced = False


class FutureBus:
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


def takeover(bus):
    return Takeover("a", bus, Broker(), None, Handoff(), None, None, None, lambda: {}, None, Fence(),
                    lambda: 0.0, asyncio.ensure_future)


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
        t = takeover(bus)
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
        bus = Bus("redis://127.0.0.1:1/0", "a")
        for line in bus._lines:
            line.closed = True
        t = takeover(bus)
        t.client_gone("acme", "dev", True, True)
        update = t.going[("acme", "dev")]
        await asyncio.wait((update,), timeout=5)
        assert update.done()
        del update
        await bus.close()
        return t

    t, errors = run_collecting_loop_errors(scenario)
    assert t.going == {} and errors == []
