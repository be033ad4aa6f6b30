"""HBase applies the rows of a ``mutateRows`` one by one: a region server can
fail (or the gateway, or brokerd, die) between two rows of one batch. The
store must be right anyway -- nothing acknowledged lost, nothing twice, no
rows of a deleted session coming back -- whether the writer then retries the
batch (what ``StoreWriter`` does) or the node crashes and another starts on
the same tables.

The faithful gateway double (``tests/hbase_double.py``: rows applied one by
one, delete markers on) injects the fault after each possible number of rows.
"""

import time

import pytest

from brokerd.store import StoreError

from .test_contract import (
    NOW,
    T1,
    T2,
    SyncStore,
    entry,
    expected,
    message,
    q,
    q_del,
    retained_msg,
    session,
    sub,
)

FANOUT = ("s0", "s1", "s2")


@pytest.fixture
def double(tmp_path):
    from ..hbase_double import HBaseDouble

    d = HBaseDouble(tmp_path / "hbase.db", delete_markers=True).start()
    yield d
    d.stop()


def _queue_ids(store, cid):
    rec = store.load_session(T1, cid)
    return None if rec is None else [e.msg.payload for e in rec.queue]


def _setup(store):
    """Sessions with acknowledged (committed) queues: what must survive."""
    acked = {cid: [entry(message(payload=f"{cid}-old{i}".encode())) for i in range(3)] for cid in FANOUT}
    store.apply([session(cid) for cid in FANOUT] + [q(cid, e) for cid in FANOUT for e in acked[cid]])
    return acked


def _batch(acked):
    """A batch like the broker's: a message fanned out to three queues, a delivered
    message acknowledged by each subscriber, a new session with its subscription,
    a retained message."""
    new = {cid: entry(message(payload=f"{cid}-new".encode())) for cid in FANOUT}
    ops = [q(cid, new[cid]) for cid in FANOUT] + [q_del(cid, acked[cid][0]) for cid in FANOUT]
    ops += [session("fresh"), sub("fresh", "a/#"), ("retain", T2, "r", retained_msg("r"))]
    return new, ops


@pytest.mark.parametrize("call", [0, 1])       # which multi-row mutateRows of the batch fails
@pytest.mark.parametrize("after", [1, 2])      # after how many of its rows
@pytest.mark.parametrize("then", ["retry", "crash"])
def test_a_fault_between_rows_of_a_batch_loses_no_acknowledged_message_and_duplicates_none(double, call, after,
                                                                                          then):
    url = f"hbase://{double.address}?table_prefix=f{call}{after}{then}"
    store = SyncStore(url)
    try:
        acked = _setup(store)
        new, ops = _batch(acked)
        double.fail_between_rows(after, skip=call)
        with pytest.raises(StoreError):
            store.apply(ops)
        assert double.calls["row_faults"] == 1
        if then == "retry":              # StoreWriter: the failed batch again, ahead of newer ops
            later = {cid: entry(message(payload=f"{cid}-later".encode())) for cid in FANOUT}
            store.apply(ops + [q(cid, later[cid]) for cid in FANOUT])
            for cid in FANOUT:
                assert _queue_ids(store, cid) == [e.msg.payload for e in acked[cid][1:]] + [
                    new[cid].msg.payload, later[cid].msg.payload]
            assert store.session(T1, "fresh") == expected("fresh", subscriptions=[sub("fresh", "a/#")[3]])
            assert store.retained() == {(T2, "r"): retained_msg("r")}
            return
    finally:
        store.close()
    # crash: nothing of the failed batch was acknowledged; another node starts on the tables
    other = SyncStore(url)
    try:
        for cid in FANOUT:
            got = _queue_ids(other, cid)
            assert len(got) == len(set(got)), f"a message twice in {cid}'s queue: {got}"
            old = [e.msg.payload for e in acked[cid]]
            assert set(old[1:]) <= set(got), f"acknowledged messages of {cid} lost: {got}"
            assert set(got) <= set(old) | {new[cid].msg.payload}
            # the node goes on: appends after the crash come after everything there
            after_crash = entry(message(payload=b"after"))
            other.apply([q(cid, after_crash)])
            queue = other.load_session(T1, cid).queue
            assert queue[-1].msg.payload == b"after"
            assert [e.seq for e in queue] == sorted({e.seq for e in queue})
    finally:
        other.close()


@pytest.mark.parametrize("after", [1, 2, 5])
def test_a_session_deleted_with_a_fault_between_rows_leaves_nothing_for_the_next_session(double, after):
    """An expired session is purged; the gateway fails after ``after`` rows of the
    deletion and the node dies. The deletion is done again later (the next purge);
    a new session of the same client id then starts empty -- none of the old
    session's messages are delivered to it."""
    url = f"hbase://{double.address}?table_prefix=d{after}"
    store = SyncStore(url)
    old = [entry(message(payload=f"old{i}".encode())) for i in range(8)]
    try:
        store.apply([session("dev", expiry=50, disconnected_at=NOW - 100), sub("dev", "a/#")]
                    + [q("dev", e) for e in old])
        double.fail_between_rows(after)
        with pytest.raises(StoreError):
            store.purge(NOW)
    finally:
        store.close()
    other = SyncStore(url)                 # a node after the crash
    try:
        other.purge(NOW)
        assert other.load_session(T1, "dev") is None
        other.apply([session("dev")])
        fresh = entry(message(payload=b"new"))
        other.apply([q("dev", fresh)])
        assert other.session(T1, "dev") == expected("dev", queue=[fresh])
        assert fresh.seq > max(e.seq for e in old)        # no sequence of the old session reused
    finally:
        other.close()


@pytest.mark.parametrize("then", ["deleted", "made_again"])
def test_rows_appended_for_a_session_another_node_deleted_never_reach_a_later_session(double, then):
    """Two nodes on one set of tables. Node A's batch reads that session ``dev``
    exists; node B then deletes it (its expiry, the purge; ``made_again``: a clean
    start there) and A's queue rows land after B's deletion -- HBase has no
    transaction across rows to stop that. A later session of the client id starts
    without them, whichever node loads it, and the purge removes them."""
    import happybase

    url = f"hbase://{double.address}?table_prefix=race{then[0]}"
    a, b = SyncStore(url), SyncStore(url)
    try:
        a.apply([session("dev"), sub("dev", "a/#")])
        numbered = a.store._number

        def b_deletes_meanwhile(conn, appends, *reserved):   # after A read the session, before its writes
            b.store._apply([("session_del", T1, "dev")] + ([session("dev")] if then == "made_again" else []))
            return numbered(conn, appends, *reserved)

        a.store._number = b_deletes_meanwhile
        a.apply([q("dev", entry(message(payload=b"late%d" % i))) for i in range(3)])
        a.store._number = numbered
        if then == "deleted":
            assert b.load_session(T1, "dev") is None
            b.apply([session("dev")])                # the client id's next session
        assert b.session(T1, "dev") == expected("dev")
        assert a.session(T1, "dev") == expected("dev")
        later = entry(message(payload=b"later"))
        a.apply([q("dev", later)])
        assert b.session(T1, "dev") == expected("dev", queue=[later])
        b.purge(NOW)
        conn = happybase.Connection("127.0.0.1", double.port, table_prefix=f"race{then[0]}", timeout=5000)
        try:
            assert [d[b"m:p"] for _, d in conn.table("queue").scan()] == [b"later"]
        finally:
            conn.close()
    finally:
        a.close()
        b.close()


def test_rows_written_by_an_earlier_version_stay_their_sessions(double):
    """Rows without a generation (an earlier brokerd, e.g. a node not yet upgraded
    in a rolling upgrade) belong to their session, whether it has a generation or not."""
    import happybase

    from brokerd.store.hbase import queue_prefix, session_key

    store = SyncStore(f"hbase://{double.address}?table_prefix=legacy")
    conn = happybase.Connection("127.0.0.1", double.port, table_prefix="legacy", timeout=5000)
    try:
        store.apply([session("new")])
        conn.table("sessions").put(session_key(T1, "old"), {b"s:e": b"3600"})
        flags = {b"m:t": b"a/b", b"m:f": b"\x01\x01\x00\x00\x00"}
        for cid in ("old", "new"):
            conn.table("queue").put(queue_prefix(T1, cid) + (5).to_bytes(8, "big"), {**flags, b"m:p": cid.encode()})
        store.purge(NOW)
        for cid in ("old", "new"):
            assert [e.msg.payload for e in store.load_session(T1, cid).queue] == [cid.encode()]
        assert sorted(len(rec.queue) for rec in store.load()[0]) == [1, 1]
    finally:
        conn.close()
        store.close()


def test_the_double_applies_mutate_rows_row_by_row(double):
    """The double's own behaviour the tests above rely on: rows before the fault stay."""
    import happybase

    conn = happybase.Connection("127.0.0.1", double.port, table_prefix="rbr", timeout=5000)
    try:
        conn.create_table("t", {"a": {"max_versions": 1}})
        table = conn.table("t")
        double.fail_between_rows(2)
        with pytest.raises(Exception, match="after 2 of 4 rows"), table.batch() as b:
            for i in range(4):
                b.put(b"r%d" % i, {b"a:x": b"%d" % i})
        assert [k for k, _ in table.scan()] == [b"r0", b"r1"]
        before = double.calls["calls"].get("mutateRows", 0)
        table.put(b"r9", {b"a:x": b"9"})
        assert double.calls["calls"]["mutateRows"] == before + 1
    finally:
        conn.close()


# ------------------------------------------------------------------ round trips

@pytest.mark.parametrize("fanout", [1, 10, 100])
def test_round_trips_per_stored_message_at_fan_out(tmp_path, fanout):
    """A batch of 100 stored messages (100, 10 or 1 publishes fanned out to 1, 10
    or 100 persistent queues): one read of which sessions exist, one counter
    increment for the whole batch, one mutateRows -- <= 0.05 calls per stored
    message -- and with 10 ms a call the batch takes those round trips, not
    one per queue."""
    from ..hbase_double import HBaseDouble

    with HBaseDouble(tmp_path / "h.db", delete_markers=True) as double:
        store = SyncStore(f"hbase://{double.address}?table_prefix=rt")
        try:
            subs = [f"sub{i}" for i in range(fanout)]
            store.apply([session(cid) for cid in subs])

            def batch(per_queue):
                t0 = time.monotonic()
                store.apply([q(cid, entry(message(payload=b"%d" % i))) for i in range(per_queue) for cid in subs])
                return time.monotonic() - t0

            per_queue = 100 // fanout
            batch(1)                          # the first batch seeds the counters
            before = double.calls["total"]
            batch(per_queue)
            calls = double.calls["total"] - before
            assert calls <= 3, double.calls["calls"]
            assert calls / (per_queue * fanout) <= 0.05
            # round trips, not rows: one message to each queue, at 0 then 10 ms a call
            # (an increment per queue, one after another, would add 0.01 s per queue)
            took = batch(1)
            double.faults.latency = 0.010
            slower = batch(1) - took
            assert slower < 0.25, f"+{slower:.3f}s with 10 ms a call"
            assert len(store.load_session(T1, subs[-1]).queue) == per_queue + 3
        finally:
            store.close()


def test_a_big_batch_goes_in_parallel_parts_and_a_failed_part_is_retried_whole(tmp_path):
    """300 new queue rows in one batch with parallel=4: four mutateRows at once
    (each a contiguous key range), so with 100 ms a call the batch takes about
    two round trips (the existence read beside the counter increment, then the
    parts), not six. A part that fails fails the batch; the writer's retry
    leaves every message once."""
    from ..hbase_double import HBaseDouble

    with HBaseDouble(tmp_path / "h.db", delete_markers=True) as double:
        store = SyncStore(f"hbase://{double.address}?table_prefix=par&parallel=4")
        try:
            subs = [f"s{i:03d}" for i in range(300)]
            store.apply([session(cid) for cid in subs])
            store.apply([q(cid, entry(message(payload=b"first"))) for cid in subs])   # seeds the counter
            before = double.calls["calls"]["mutateRows"]
            double.faults.latency = 0.1
            t0 = time.monotonic()
            store.apply([q(cid, entry(message(payload=b"second"))) for cid in subs])
            took = time.monotonic() - t0
            double.faults.latency = 0.0
            assert double.calls["calls"]["mutateRows"] - before == 4
            assert took < 0.45, f"{took:.2f}s: the parts went one after another"
            third = [q(cid, entry(message(payload=b"third"))) for cid in subs]
            double.fail("mutateRows")
            with pytest.raises(StoreError):
                store.apply(third)
            store.apply(third)
            for cid in (subs[0], subs[150], subs[-1]):
                assert [e.msg.payload for e in store.load_session(T1, cid).queue] == [b"first", b"second", b"third"]
            assert sum(len(rec.queue) for rec in store.load()[0]) == 900
        finally:
            store.close()


def test_queued_messages_leave_one_delete_marker_each_their_acknowledgement(double):
    """A queued message is a new row: written with puts only. (Removing the
    optional columns it does not have left four delete markers per message for
    HBase's compactions.) Its acknowledgement deletes the row: one marker."""
    store = SyncStore(f"hbase://{double.address}?table_prefix=mk")
    try:
        store.apply([session("dev")])
        entries = [entry(message(payload=b"%d" % i)) for i in range(10)]
        store.apply([q("dev", e) for e in entries])
        markers = double.handler.db.execute(
            "SELECT count(*) FROM markers WHERE tbl = ?", (b"mk_queue",)).fetchone()[0]
        assert markers == 0
        store.apply([q_del("dev", e) for e in entries])
        markers = double.handler.db.execute(
            "SELECT count(*) FROM markers WHERE tbl = ?", (b"mk_queue",)).fetchone()[0]
        assert markers == 10
        assert store.load_session(T1, "dev").queue == []
    finally:
        store.close()


def test_the_counters_table_does_not_grow_with_client_id_churn(double):
    """One counter for every queue: client-id churn adds no rows to the counters
    table, the per-session counters of earlier versions are collected by the
    purge, and a session made again under an old client id never reuses a sequence."""
    import happybase

    store = SyncStore(f"hbase://{double.address}?table_prefix=churn")
    try:
        old = {}
        for i in range(30):
            cid = f"dev{i}"
            old[cid] = entry(message(payload=b"x"))
            store.apply([session(cid, expiry=10, disconnected_at=NOW - 100), q(cid, old[cid])])
        store.apply([session("live"), q("live", entry())])
        conn = happybase.Connection("127.0.0.1", double.port, table_prefix="churn", timeout=5000)
        try:
            # an earlier version's per-session counter
            conn.table("counters").counter_inc(b"%s\0legacy" % T1.encode(), b"c:seq", 3)
            assert store.purge(NOW) >= 30
            assert [k for k, _ in conn.table("counters").scan()] == [b"seq"]
        finally:
            conn.close()
        again = entry(message(payload=b"y"))
        store.apply([session("dev7"), q("dev7", again)])
        assert again.seq > old["dev7"].seq
        assert store.session(T1, "dev7") == expected("dev7", queue=[again])
    finally:
        store.close()
