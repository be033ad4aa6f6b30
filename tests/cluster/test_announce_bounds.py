"""The copies of retained messages a node sends the others on the cluster event log (``announce.Announcer``),
on the real bus and a real Redis of the test's own: what waits to be published stays bounded while Redis is out
of reach, and a round of large retained messages is not one entry Redis refuses, again and again, with every
route announcement of the node behind it."""

import asyncio

from brokerd.cluster.announce import ENTRY_BYTES, Announcer
from brokerd.cluster.bus import Bus
from brokerd.cluster.eventlog import retain_event, retained_message
from brokerd.protocol.packets import Publish

from .conftest import RedisServer


class NoRoutes:
    """The broker's side of the announcer, with no subscription here: only retained copies are published."""

    def local_filters(self):
        return []

    def local_route_counts(self, tenant, filt):
        return 0, 0, {}


class Unfenced:
    fenced = False


def copy(node: str, topic: str, payload: bytes) -> dict:
    """The event a retained PUBLISH (an empty payload: clearing it) on ``node`` queues."""
    return retain_event(node, "acme", Publish(topic, payload, 1, True), 0.0)


async def retained_in_log(url: str) -> dict[str, bytes | None]:
    """What another node makes of the log, read from its start: topic -> retained payload (None: cleared)."""
    reader = Bus(url, "reader")
    try:
        after, seen = "0", {}
        while True:
            got = await reader.read_events(after, block_ms=100)
            if not got:
                return seen
            for eid, e in got:
                after = eid
                for one in e["e"] if e["t"] == "multi" else [e]:
                    msg = retained_message(one, 0.0)
                    seen[one["tp"]] = None if msg is None else msg.payload
    finally:
        await reader.close()


def test_retained_copies_queued_while_redis_is_out_of_reach_are_one_per_topic_and_the_newest_is_published(
        tmp_path):
    """A device fleet keeps publishing retained status messages while the node cannot reach Redis: the
    copies waiting for the bus are one per topic (the newest), not one per PUBLISH -- and once Redis is
    back the other nodes get every topic's last retained message, a cleared one cleared."""
    redis = RedisServer(tmp_path).start()

    async def go():
        bus = Bus(redis.url(prefix="b"), "n1")
        announcer = Announcer("n1", bus, NoRoutes(), Unfenced())
        try:
            assert await announcer.flush()                     # the bus works
            redis.kill()
            for round_ in range(5):
                for i in range(600):                           # 3,000 retained PUBLISHes on 10 topics
                    announcer.queue_event(copy("n1", f"fleet/{i % 10}/status", f"{round_}:{i}".encode()))
                announcer.queue_event(copy("n1", "fleet/3/status", b""))     # fleet/3's cleared, last
                assert not await announcer.flush()             # Redis out of reach: kept for the next round
                assert len(announcer._outbox) == 10
            redis.restart()
            assert await announcer.flush()
            assert len(announcer._outbox) == 0
        finally:
            await bus.close()
        seen = await retained_in_log(redis.url(prefix="b"))
        assert seen == {f"fleet/{t}/status": None if t == 3 else f"4:{590 + t}".encode() for t in range(10)}

    try:
        asyncio.run(go())
    finally:
        redis.stop()


def test_a_round_of_large_retained_messages_goes_in_entries_redis_takes(tmp_path):
    """Retained messages of up to --max-packet-size ride in the log; a round packs events into entries, and
    an entry's field is one bulk string to Redis, which refuses one over ``proto-max-bulk-len`` (512 MB by
    default; the least it can be set to, 1 MB, here). Three 500 kB retained messages in one round went in
    one 2 MB entry: refused, retried, refused -- and the node's route announcements waited behind it for
    good. Now an entry holds about ``ENTRY_BYTES`` at most, and the three arrive whole."""
    redis = RedisServer(tmp_path).start()
    redis.client().config_set("proto-max-bulk-len", 1 << 20)
    big = [bytes([65 + i]) * 500_000 for i in range(3)]
    assert 2 * len(big[0]) * 4 // 3 > ENTRY_BYTES

    async def go():
        bus = Bus(redis.url(prefix="b"), "n1")
        announcer = Announcer("n1", bus, NoRoutes(), Unfenced())
        try:
            for i, payload in enumerate(big):
                announcer.queue_event(copy("n1", f"camera/{i}/frame", payload))
            announcer.queue_event(copy("n1", "fleet/0/status", b"online"))
            assert await announcer.flush()
        finally:
            await bus.close()
        return await retained_in_log(redis.url(prefix="b"))

    try:
        seen = asyncio.run(go())
    finally:
        redis.stop()
    assert seen == {"camera/0/frame": big[0], "camera/1/frame": big[1], "camera/2/frame": big[2],
                    "fleet/0/status": b"online"}
