"""Pipelined write batches on HBase (``pipeline=``, brokerd/store/hbase.py
"Pipelining"; the writer's side in brokerd/store/writer.py): the next batch is
prepared and sent while the previous one is in flight, and none of the
guarantees of one-batch-at-a-time may be lost -- a delete never overtakes the
write it deletes, a batch sees the sessions an earlier one made, sequence
numbers stay in batch order, and when a batch fails no acknowledgement of a
later one is released before it.

Against the gateway double (delete markers on), whose ``slow`` fault holds one
call back so that the next batch's calls overtake it, as they can on a cluster.
"""

import asyncio
import time

import pytest

from brokerd.store import Journal, open_store
from brokerd.store.writer import StoreWriter

from .test_contract import T1, entry, message, q, q_del, session, sub


@pytest.fixture
def double(tmp_path):
    from ..hbase_double import HBaseDouble

    d = HBaseDouble(tmp_path / "hbase.db", delete_markers=True).start()
    yield d
    d.stop()


async def _opened(url):
    store = open_store(url)
    await store.open()
    return store


async def _pipelined(store, first: list, second: list) -> None:
    """``first`` and ``second`` as the writer sends them with pipelining: the
    second prepared and sent once the first is prepared, the first still in flight."""
    prepared = asyncio.get_running_loop().create_future()
    one = asyncio.ensure_future(store.apply(first, prepared))
    await prepared
    two = asyncio.ensure_future(store.apply(second, asyncio.get_running_loop().create_future()))
    await asyncio.gather(one, two)


def _payloads(rec) -> list:
    return [] if rec is None else [e.msg.payload for e in rec.queue]


def test_an_acknowledgement_never_overtakes_the_write_it_deletes(double):
    """A message is appended by a batch whose write is held back (300 ms); the
    next batch, sent meanwhile, acknowledges it (a queued message dropped before
    its commit does that). The delete must land after the write: no row left
    behind for the next start of the session to deliver again."""
    async def go():
        store = await _opened(f"hbase://{double.address}?table_prefix=ack&pipeline=2")
        try:
            await store.apply([session("s0")])
            e = entry(message(payload=b"m1"))
            double.faults.slow("mutateRows", 0.3)
            await _pipelined(store, [q("s0", e)], [q_del("s0", e)])
            assert e.seq
            assert _payloads(await store.load_session(T1, "s0")) == []
        finally:
            await store.close()
    asyncio.run(go())


def test_a_batch_sees_the_session_the_batch_before_it_made(double):
    """A session is made (with its generation) by a batch held back in flight;
    the next batch appends a message to it. The append must wait for the session
    row -- read before it, it finds no session and drops the message -- and the
    message then belongs to that session's generation."""
    async def go():
        store = await _opened(f"hbase://{double.address}?table_prefix=gen&pipeline=2")
        try:
            e = entry(message(payload=b"first"))
            double.faults.slow("mutateRows", 0.3)
            await _pipelined(store, [session("s1"), sub("s1", "a/#")], [q("s1", e)])
            rec = await store.load_session(T1, "s1")
            assert [s.filter for s in rec.subscriptions] == ["a/#"]
            assert _payloads(rec) == [b"first"]
            assert _payloads(await store.load_session(T1, "s1")) == _payloads((await store.load())[0][0])
        finally:
            await store.close()
    asyncio.run(go())


def test_batches_in_flight_overlap_and_keep_their_sequence_order(double):
    """Four batches appending to one queue, each held back a little less than the
    one before (so the later ones land first): with pipeline=4 they are in flight
    together -- the double serves their mutateRows at the same time, where one
    batch at a time never has two -- and the queue still reads in the order the
    batches were taken."""
    async def go():
        store = await _opened(f"hbase://{double.address}?table_prefix=seq&pipeline=4")
        try:
            await store.apply([session("s2")])
            await store.apply([q("s2", entry(message(payload=b"seed")))])     # seeds the counter
            loop = asyncio.get_running_loop()
            for delay in (0.4, 0.3, 0.2, 0.1):
                double.faults.slow("mutateRows", delay)
            tasks = []
            for i in range(4):
                prepared = loop.create_future()
                tasks.append(asyncio.ensure_future(store.apply(
                    [q("s2", entry(message(payload=b"%d-%d" % (i, j)))) for j in range(3)], prepared)))
                await prepared
            await asyncio.gather(*tasks)
            at_once = double.faults.most_at_once.get("mutateRows", 0)
            assert at_once >= 2, f"the batches went one after another: {at_once} mutateRows served at once"
            assert _payloads(await store.load_session(T1, "s2")) == [b"seed"] + [b"%d-%d" % (i, j) for i in range(4)
                                                                              for j in range(3)]
        finally:
            await store.close()
    asyncio.run(go())


def test_acknowledgements_and_new_messages_go_in_one_round_of_mutate_rows(double):
    """The steady state -- a batch of acknowledgements and new messages, queue
    rows only -- is one existence read, one counter increment beside it and one
    mutateRows (its deletes and puts touch different rows): 3 calls for 100
    messages acknowledged and 100 stored, not 4."""
    async def go():
        store = await _opened(f"hbase://{double.address}?table_prefix=one&parallel=1")
        try:
            subs = [f"c{i}" for i in range(10)]
            await store.apply([session(cid) for cid in subs])
            old = [(cid, entry(message(payload=b"old"))) for cid in subs for _ in range(10)]
            await store.apply([q(cid, e) for cid, e in old])
            before = double.calls["total"]
            await store.apply([q_del(cid, e) for cid, e in old] +
                              [q(cid, entry(message(payload=b"new"))) for cid in subs for _ in range(10)])
            assert double.calls["total"] - before == 3, double.calls["calls"]
            assert {cid: _payloads(await store.load_session(T1, cid)) for cid in subs[:2]} == \
                {cid: [b"new"] * 10 for cid in subs[:2]}
        finally:
            await store.close()
    asyncio.run(go())


class _Broker:
    def __init__(self):
        self.generations: list[int] = []

    def commit_done(self, generation: int, now: float) -> None:
        self.generations.append(generation)


def test_a_failed_batch_releases_no_acknowledgement_of_the_batch_after_it(double):
    """Batch A's write is held back and then fails; batch B, taken while A was in
    flight, is written meanwhile. B's publishers must not hear "durable" before
    A's: both hear the failure, the generation made durable never passes A's
    until A is written, and the writer's retry writes both, in order."""
    async def go():
        loop = asyncio.get_running_loop()
        store = await _opened(f"hbase://{double.address}?table_prefix=fail&pipeline=2")
        broker = _Broker()
        journal = Journal()
        writer = StoreWriter(store, journal, broker, loop)
        writer.start()
        heard: list = []
        try:
            await store.apply([session("s3")])
            await store.apply([q("s3", entry(message(payload=b"seed")))])
            journal.committed = 0
            before = double.calls["calls"].get("mutateRows", 0)
            double.faults.slow("mutateRows", 0.4)
            double.fail("mutateRows")                      # A's write: held back, then refused
            gen_a = journal.generation
            journal.add(q("s3", entry(message(payload=b"A"))))
            journal.after_commit(lambda ok: heard.append(("A", ok)))
            await _until(lambda: double.calls["calls"].get("mutateRows", 0) > before)   # A in flight
            gen_b = journal.generation
            journal.add(q("s3", entry(message(payload=b"B"))))
            journal.after_commit(lambda ok: heard.append(("B", ok)))
            await _until(lambda: len(heard) == 2)
            assert heard == [("A", False), ("B", False)]
            assert gen_b > gen_a and broker.generations == []
            assert await writer.drain(10)
            assert broker.generations and min(broker.generations) > gen_b
            assert _payloads(await store.load_session(T1, "s3")) == [b"seed", b"A", b"B"]
        finally:
            await writer.stop()
            await store.close()
    asyncio.run(go())


async def _until(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)
