"""Forwarding between nodes (``brokerd.cluster.forwarding``), driven with the
fakes of ``fakes.py``: no Redis, no socket, no wait.

A node skips the cluster's route table for a tenant no other node has a
route in (a one-node cluster pays nothing per message for it); a route
without wildcards counts as much as one with them."""

import asyncio

import pytest

from .fakes import Connecting, FakeNet, publish


def run(coro):
    asyncio.run(asyncio.wait_for(coro, 30))


async def holding(net, node, tenant: str, cid: str, filters: list[str]) -> None:
    net.store.add(tenant, cid, filters)
    conn = Connecting()
    node.claim(conn, tenant, cid, False, None, conn.cont)
    await net.settle()
    assert conn.opened


@pytest.mark.parametrize("qos", [0, 1])
@pytest.mark.parametrize("filt", ["y/1", "y/+"], ids=["exact", "wildcard"])
def test_a_message_reaches_the_other_node_whose_only_route_in_the_tenant_is_its_filter(qos, filt):
    """b holds the only session of tenant t, subscribed to ``y/1`` or ``y/+``:
    a message a client of a publishes to y/1 is stored for it on b (QoS 1: and
    the publisher's ack waits for b's)."""

    async def go():
        net = FakeNet()
        a = await net.node("a")
        b = await net.node("b")
        await holding(net, b, "t", "dev", [filt])
        ack = publish(a, "t", "y/1", b"for b", qos)
        if qos:
            assert not ack.done                  # b has not stored it yet
        await net.settle()
        assert net.store.queues[("t", "dev")] == [b"for b"]
        assert ack.done and ack.ok
        ack = publish(a, "t", "z/1", b"no one's", qos)      # a topic b has no route for: not sent
        await net.settle()
        assert net.store.queues[("t", "dev")] == [b"for b"] and ack.done

    run(go())


def test_a_tenant_without_routes_on_other_nodes_sends_nothing():
    """Tenant u has routes only on b's tenant t: a's message to u goes nowhere."""

    async def go():
        net = FakeNet()
        a = await net.node("a")
        b = await net.node("b")
        await holding(net, b, "t", "dev", ["y/1"])
        ack = publish(a, "u", "y/1", b"other tenant", 1)
        assert ack.done and ack.ok
        await net.settle()
        assert net.store.queues[("t", "dev")] == []

    run(go())
