"""The store writer (group commit) against real backends: an operation the store can
never take is dropped, counted and logged, and never blocks the writes behind it; an
unavailable store is waited for, and nothing is dropped because of it.

The poisoned operation is built by hand: the admin API now refuses the input that made
one (a Message Expiry Interval of -1, which the store's encoding of properties cannot
hold), but any other path to such a value must not stop the node's store either. Before
the writer knew the two kinds of failure apart, it retried the poisoned batch ahead of
everything else until a restart: every persistent QoS 1 message of every tenant got 0x83.
"""

import asyncio
import sqlite3

import pytest

from brokerd.protocol import properties as P
from brokerd.store import Journal, open_store
from brokerd.store.records import QueueEntry, StoredMessage
from brokerd.store.writer import StoreWriter

NOW = 1_700_000_000.0


class _Broker:
    """What the writer tells the broker: the batch generations made durable."""

    def __init__(self):
        self.generations: list[int] = []

    def committed(self, generation: int, now: float) -> None:
        self.generations.append(generation)


def retain(tenant: str, topic: str, payload: bytes = b"v", expiry=None) -> tuple:
    props = None if expiry is None else {P.MESSAGE_EXPIRY_INTERVAL: expiry}
    return ("retain", tenant, topic, StoredMessage(topic, payload, 1, True, props, None))


def poisoned(topic: str = "bad/expiry") -> tuple:
    """A retained message whose Message Expiry Interval is out of the u32 range: what an
    admin publish with ``message_expiry: -1`` used to hand the store."""
    return retain("tenant-bad", topic, b"never stored", expiry=-1)


async def _writer(url: str):
    store = open_store(url)
    await store.open()
    journal = Journal()
    writer = StoreWriter(store, journal, _Broker(), asyncio.get_running_loop())
    writer.start()
    return store, journal, writer


async def _retained(store) -> dict:
    return {(t, topic): m.payload for t, topic, m in await store.load_retained()}


@pytest.fixture(params=["sqlite", "hbase"])
def url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/writer.db"
    return request.getfixturevalue("hbase_url")


def test_a_write_the_store_can_never_take_is_dropped_and_the_rest_written(url, caplog):
    """A batch of 40 good operations with two poisoned ones among them (one alone in a batch
    of its own as well): the 40 are written in order -- a later write of a topic wins, a delete
    after the poisoned one deletes -- the two are dropped and counted, each with an error
    logged; the batch's callbacks hear "durable"; the store stays healthy and the writes of
    the next batches go through at once."""
    async def go():
        store, journal, writer = await _writer(url)
        try:
            ops = [retain("tenant-a", f"t/{i}", b"v%d" % i) for i in range(40)]
            ops.insert(13, poisoned("bad/1"))
            ops.insert(31, poisoned("bad/2"))
            ops += [retain("tenant-a", "t/5", b"rewritten"), ("retain_del", "tenant-a", "t/6")]
            acks: list = []
            for op in ops:
                journal.add(op)
            journal.after_commit(acks.append)
            assert await writer.drain(10), "the batch with poisoned operations was never written"
            assert acks == [True] and journal.healthy
            got = await _retained(store)
            assert ("tenant-bad", "bad/1") not in got and ("tenant-bad", "bad/2") not in got
            assert got[("tenant-a", "t/5")] == b"rewritten" and ("tenant-a", "t/6") not in got
            assert len(got) == 39 and got[("tenant-a", "t/39")] == b"v39"
            assert writer.dropped == 2 and "bad/2" in writer.last_dropped
            # alone, then followed by good writes in later batches: none of them waits behind it
            journal.add(poisoned("bad/3"))
            assert await writer.drain(10)
            journal.add(retain("tenant-b", "after", b"ok"))
            assert await writer.drain(10)
            assert (await _retained(store))[("tenant-b", "after")] == b"ok"
            assert writer.dropped == 3 and journal.healthy
        finally:
            await writer.stop()
            await store.close()

    with caplog.at_level("ERROR", logger="brokerd.store"):
        asyncio.run(asyncio.wait_for(go(), 60))
    dropped = [r for r in caplog.records if "can never take" in r.getMessage()]
    assert len(dropped) == 3 and "bad/1" in dropped[0].getMessage()


def test_the_ack_of_a_dropped_append_deletes_nothing_else(url):
    """An append the store can never take, in a batch with another append to the same
    queue: the other one is written, the poisoned one dropped -- and its number, given by
    the attempt that failed and rolled back, is not the number of the one written: its
    acknowledgement (the broker sent it: the batch was "durable") deletes nothing else."""
    async def go():
        store, journal, writer = await _writer(url)
        try:
            bad = QueueEntry(0, StoredMessage("q/bad", b"x", 1, False, {P.MESSAGE_EXPIRY_INTERVAL: -1}, None), 1)
            good = QueueEntry(0, StoredMessage("q/good", b"y", 1, False, None, None), 1)
            for op in (("session", "tenant-a", "dev", 3600, None, None, None, None),
                       ("q", "tenant-a", "dev", bad), ("q", "tenant-a", "dev", good)):
                journal.add(op)
            assert await writer.drain(10)
            assert writer.dropped == 1 and journal.healthy
            journal.add(("q_del", "tenant-a", "dev", bad))
            assert await writer.drain(10)
            rec = await store.load_session("tenant-a", "dev")
            assert [e.msg.topic for e in rec.queue] == ["q/good"]
        finally:
            await writer.stop()
            await store.close()

    asyncio.run(asyncio.wait_for(go(), 60))


def test_an_unavailable_store_is_waited_for_not_dropped(tmp_path):
    """The SQLite file locked by another process's transaction ("database is locked": the
    store's state, not the data's): the batch's callbacks hear "not durable" (publishers get
    their negative acks), the journal is unhealthy, the operations are kept and retried; when
    the lock goes they are written and nothing was dropped."""
    url = f"sqlite:///{tmp_path}/locked.db"

    async def go():
        store, journal, writer = await _writer(url)
        other = sqlite3.connect(store.path, isolation_level=None)
        try:
            store.db.execute("PRAGMA busy_timeout = 50")
            other.execute("BEGIN EXCLUSIVE")
            acks: list = []
            journal.add(retain("tenant-a", "while/locked", b"kept"))
            journal.after_commit(acks.append)
            for _ in range(200):
                if acks:
                    break
                await asyncio.sleep(0.02)
            assert acks == [False] and not journal.healthy
            other.execute("ROLLBACK")
            assert await writer.drain(10)
            assert journal.healthy and writer.dropped == 0
            assert (await _retained(store))[("tenant-a", "while/locked")] == b"kept"
        finally:
            other.close()
            await writer.stop()
            await store.close()

    asyncio.run(asyncio.wait_for(go(), 60))


@pytest.mark.parametrize("kind", ["sqlite", "hbase"])
def test_writes_given_up_by_a_fenced_node_are_never_written_later(kind, tmp_path, request):
    """What a node that fenced itself gives up (``abandon``: the others may adopt its
    sessions from the store as it is) is not written when the store is back -- it would
    land over what they wrote since -- its callbacks hear "not durable", and the journal
    is found healthy again (nothing is left to retry: the store is pinged); the next write
    goes through at once, on HBase too (whose pipelined batches are refused after a failure
    until one is written alone). The store is cut off by a locked file (SQLite) or a proxy
    in front of the HBase double that is stopped."""
    from ..cluster.conftest import TcpProxy

    proxy = None
    if kind == "sqlite":
        url = f"sqlite:///{tmp_path}/fenced.db"
    else:
        double = request.getfixturevalue("hbase_double")
        proxy = TcpProxy(double.port).start()
        url = f"hbase://127.0.0.1:{proxy.port}?table_prefix=f{tmp_path.name[-8:].replace('-', '')}&timeout=1000"

    async def go():
        store, journal, writer = await _writer(url)
        other = None
        try:
            if kind == "sqlite":
                other = sqlite3.connect(store.path, isolation_level=None)
                store.db.execute("PRAGMA busy_timeout = 50")
                other.execute("BEGIN EXCLUSIVE")
            else:
                proxy.stop()
            acks: list = []
            journal.add(retain("tenant-a", "stale", b"from before the fence"))
            journal.after_commit(acks.append)
            for _ in range(300):
                if acks:
                    break
                await asyncio.sleep(0.02)
            assert acks == [False] and not journal.healthy
            journal.add(retain("tenant-a", "stale2", b"gathered, not taken yet"))
            journal.after_commit(acks.append)
            given = writer.abandon()
            assert given >= 2 and acks == [False, False]
            if kind == "sqlite":
                other.execute("ROLLBACK")
            else:
                proxy.start()
            for _ in range(300):
                if journal.healthy:
                    break
                await asyncio.sleep(0.02)
            assert journal.healthy, journal.error
            journal.add(retain("tenant-a", "after", b"written"))
            journal.after_commit(acks.append)
            assert await writer.drain(10)
            assert acks == [False, False, True]
            await asyncio.sleep(2.5)            # longer than the writer's longest backoff: a retry would be in
            got = await _retained(store)
            assert got.get(("tenant-a", "after")) == b"written"
            assert ("tenant-a", "stale") not in got and ("tenant-a", "stale2") not in got
            assert writer.abandoned == given and writer.dropped == 0
        finally:
            if other is not None:
                other.close()
            await writer.stop()
            await store.close()

    try:
        asyncio.run(asyncio.wait_for(go(), 60))
    finally:
        if proxy is not None:
            proxy.stop()
