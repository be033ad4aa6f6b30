"""The SQLite store writes a batch's queue appends and acknowledgements in a few
statements, whatever the batch's size (issue 18: durable QoS 1 at half the
speed of memory://).

Under load a batch is mostly appends of new messages and deletes of the ones
their subscribers acknowledged. One statement per row (``executemany``) ran
SQLite's per-statement work -- cursors opened, parameters bound, the program
halted and reset -- for every message twice; multi-row statements of up to 64
rows do it once per 64. What each row does is unchanged: an append only for a
session that exists, a delete only of the entry it names.
"""

import pytest

from brokerd.protocol.packets import Will
from brokerd.store import StoreError

from .test_contract import T1, T2, SyncStore, entry, message, q, q_del, session


def counting(store: SyncStore) -> list:
    """The statements the store's connection runs from now on (their first words)."""
    seen: list = []
    store.store.db.set_trace_callback(lambda sql: seen.append(" ".join(sql.split()[:3])))
    return seen


def test_a_batch_of_appends_and_acks_is_a_few_statements_and_each_row_is_right(tmp_path):
    store = SyncStore(f"sqlite:///{tmp_path}/batch.db")
    try:
        store.apply([session("a"), session("b"), session("a", tenant=T2)])
        # a session is numbered with its first entry (a few statements, once for its life)
        firsts = [(t, c, entry(message("first"))) for t, c in ((T1, "a"), (T1, "b"), (T2, "a"))]
        store.apply([q(c, e, tenant=t) for t, c, e in firsts])
        store.apply([q_del(c, e, tenant=t) for t, c, e in firsts])
        # 103 appends (64 + 32 + 4 + 2 + 1), interleaved over three sessions, and 4 for a
        # session that does not exist (not written)
        es = {k: [] for k in ("a", "b", "T2a", "gone")}
        ops = []
        for i in range(107):
            k = ("a", "b", "T2a")[i % 3] if i < 103 else "gone"
            e = entry(message(f"t/{k}/{i}", b"%d" % i))
            es[k].append(e)
            ops.append(q("a", e, tenant=T2) if k == "T2a" else q(k, e))
        seen = counting(store)
        store.apply(ops)
        inserts = [s for s in seen if s.startswith("INSERT")]
        # BEGIN, the counter, the 4 appends' session looked up (it does not exist), 5 inserts, COMMIT
        assert len(inserts) == 5 and len(seen) == 12, seen
        assert seen.count("SELECT sid FROM") == 4
        assert store.session(T1, "a")["queue"] == es["a"]
        assert store.session(T1, "b")["queue"] == es["b"]
        assert store.session(T2, "a")["queue"] == es["T2a"]
        assert store.session(T1, "gone") is None

        # 70 acknowledgements (64 + 4 + 2), one of an entry of another tenant's
        # session of the same client id, one of an entry never written
        assert [len(es[k]) for k in ("a", "b", "T2a", "gone")] == [35, 34, 34, 4]
        acked = es["a"][:30] + es["b"][5:] + es["T2a"][:9] + es["gone"][:2]
        dels = [q_del("a", e, tenant=T2) if e in es["T2a"] else q_del("b" if e in es["b"] else "a", e)
                for e in acked]
        del seen[:]
        store.apply(dels)
        deletes = [s for s in seen if s.startswith("DELETE")]
        assert len(dels) == 70 and len(deletes) == 3 and len(seen) == 5, seen
        assert store.session(T1, "a")["queue"] == es["a"][30:]
        assert store.session(T1, "b")["queue"] == es["b"][:5]
        assert store.session(T2, "a")["queue"] == es["T2a"][9:]
    finally:
        store.close()


def test_appends_and_acks_of_one_batch_in_any_mix_leave_what_one_at_a_time_would(tmp_path):
    """Chunks of every size, each ack in a later batch than its append, the store
    reopened at the end: the same queues as one operation a batch gives."""
    one, many = SyncStore(f"sqlite:///{tmp_path}/one.db"), SyncStore(f"sqlite:///{tmp_path}/many.db")
    try:
        for store in (one, many):
            store.apply([session(f"s{i}") for i in range(5)])
        waiting = {"one": [], "many": []}
        for n in (1, 2, 3, 63, 64, 65, 130):
            for name, store in (("one", one), ("many", many)):
                es = [(f"s{i % 5}", entry(message(f"t/{n}/{i}", bytes(n)))) for i in range(n)]
                ops = [q(cid, e) for cid, e in es] + [q_del(cid, e) for cid, e in waiting[name][: n // 2]]
                waiting[name] = waiting[name][n // 2:] + es
                if name == "one":
                    for op in ops:
                        store.apply([op])
                else:
                    store.apply(ops)
        many.close()
        many = SyncStore(f"sqlite:///{tmp_path}/many.db")

        def topics(store):
            return {cid: [e.msg.topic for e in store.session(T1, cid)["queue"]] for cid in (f"s{i}" for i in range(5))}
        assert topics(many) == topics(one)
        assert sorted(t for ts in topics(many).values() for t in ts) == sorted(e.msg.topic for _, e in waiting["many"])
    finally:
        one.close()
        many.close()


def test_the_wal_stays_near_a_thousand_pages_under_a_steady_stream_of_batches(tmp_path):
    """Checkpoints run on the store's thread between batches (not inside a COMMIT):
    under a steady stream of appends and acknowledgements the WAL file is copied back
    and reused about every thousand pages, as with SQLite's own checkpoint -- it does
    not grow with what went through it (here about 40 MB), nor wait for SQLite's
    backstop (4,000 pages) -- and everything acknowledged is gone, the rest is kept."""
    import asyncio
    import os

    from brokerd.store import open_store

    path = tmp_path / "wal.db"

    async def stream():
        store = open_store(f"sqlite:///{path}")
        await store.open()
        try:
            await store.apply([session(f"c{i}") for i in range(50)])
            page = store.db.execute("PRAGMA page_size").fetchone()[0]
            sizes, prev = [], []
            for b in range(400):
                cur = [entry(message(f"t/{b}/{i}", bytes(2000))) for i in range(50)]
                await store.apply([q(f"c{i}", e) for i, e in enumerate(cur)]
                                  + [q_del(f"c{i}", e) for i, e in enumerate(prev)])
                prev = cur
                sizes.append(os.path.getsize(f"{path}-wal"))
            records, _ = await store.load()
            return page, sizes, [e.msg.topic for r in records for e in r.queue], prev
        finally:
            await store.close()

    page, sizes, left, last = asyncio.run(stream())
    assert max(sizes) <= 2500 * (page + 24), max(sizes) // (page + 24)
    assert sorted(left) == sorted(e.msg.topic for e in last)


def test_a_session_another_node_deleted_and_made_again_gets_the_entries_this_node_appends(tmp_path):
    """Two nodes on one file (a host's workers). Node A knows the session's number from its
    earlier appends; node B deletes the session and makes it again (a clean start on B: a
    new number). A's next appends are refused by their guard under the old number, then
    written under the new one -- not lost, and not left under a number no session holds. Once the session is deleted for good, A's appends are not written."""
    url = f"sqlite:///{tmp_path}/shared.db"
    a, b = SyncStore(url), SyncStore(url)
    try:
        a.apply([session("dev")])
        old = entry(message("before"))
        a.apply([q("dev", old)])
        b.apply([("session_del", T1, "dev"), session("dev")])
        mine = [entry(message(f"after/{i}")) for i in range(3)]
        a.apply([q("dev", e) for e in mine])
        sids = [r[0] for r in a.store.db.execute("SELECT sid FROM entries ORDER BY seq")]
        assert len(sids) == 3 and len(set(sids)) == 1            # all under the session's new number
        assert [e.msg.topic for e in b.session(T1, "dev")["queue"]] == ["after/0", "after/1", "after/2"]
        a.apply([q_del("dev", mine[0])])                 # its delete finds the row under the new number
        assert [e.msg.topic for e in b.session(T1, "dev")["queue"]] == ["after/1", "after/2"]

        b.apply([("session_del", T1, "dev")])
        lost = entry(message("to no one"))
        a.apply([q("dev", lost)])
        assert b.session(T1, "dev") is None
        assert a.store.db.execute("SELECT count(*) FROM entries").fetchone()[0] == 0
    finally:
        a.close()
        b.close()


def test_a_session_is_numbered_with_its_first_entry_and_a_number_is_never_given_twice(tmp_path):
    """The rows name their session by its number: given with the session's first entry, kept
    while it lives, and a session made again after a delete gets a new one -- the old
    session's entries are gone with it and none of its rows can be taken for the new one's."""
    store = SyncStore(f"sqlite:///{tmp_path}/numbers.db")

    def sid(cid):
        return store.store.db.execute("SELECT sid FROM sessions WHERE client_id = ?", (cid,)).fetchone()[0]
    try:
        store.apply([session("s1"), session("s2")])
        assert sid("s1") is None and sid("s2") is None
        store.apply([q("s1", entry(message("s1/0"))), q("s2", entry(message("s2/0"))), q("s1", entry(message("s1/1")))])
        first = {c: sid(c) for c in ("s1", "s2")}
        assert None not in first.values() and first["s1"] != first["s2"]
        store.apply([session("s1", expiry=60), q("s1", entry(message("s1/2")))])      # the same session
        assert sid("s1") == first["s1"]
        store.apply([("session_del", T1, "s1"), session("s1"), q("s1", entry(message("s1/new")))])
        assert sid("s1") not in first.values()
        assert [e.msg.topic for e in store.session(T1, "s1")["queue"]] == ["s1/new"]
        assert [e.msg.topic for e in store.session(T1, "s2")["queue"]] == ["s2/0"]
        store.close()
        store = SyncStore(f"sqlite:///{tmp_path}/numbers.db")          # the same after opening again
        assert [e.msg.topic for e in store.session(T1, "s1")["queue"]] == ["s1/new"]
        store.apply([session("s3"), q("s3", entry(message("s3/0")))])
        assert sid("s3") > max(first["s1"], first["s2"], sid("s1"))
    finally:
        store.close()


def test_a_batch_the_full_disk_undid_gives_no_number_twice_and_says_why(tmp_path):
    """Two nodes on one file. A batch on node A numbers session x with its first entry, then
    a session with a large will finds the disk full: SQLite undoes the whole transaction
    itself. Node A forgets the number it gave (the counter went back with the batch), so
    when node B numbers its own session y with that same number, A's retried append still
    goes to x -- not to y, another tenant's session -- and the error A reports is the disk's."""
    url = f"sqlite:///{tmp_path}/full.db"
    a, b = SyncStore(url), SyncStore(url)
    try:
        a.apply([session("x"), session("y", tenant=T2)])
        db = a.store.db
        pages = db.execute("PRAGMA page_count").fetchone()[0]
        db.execute(f"PRAGMA max_page_count = {pages + 2}")              # node A's disk nearly full
        x1 = entry(message("x/1"))
        batch = [q("x", x1), session("z", will=Will("last/will", b"w" * 200_000, 1, False, {}))]
        with pytest.raises(StoreError, match="database or disk is full"):
            a.apply(batch)
        assert x1.seq == 0
        db.execute("PRAGMA max_page_count = 1073741823")                  # space freed
        b.apply([q("y", entry(message("y/1")), tenant=T2)])
        a.apply(batch)                                                    # the writer retries it
        assert [e.msg.topic for e in b.session(T1, "x")["queue"]] == ["x/1"]
        assert [e.msg.topic for e in b.session(T2, "y")["queue"]] == ["y/1"]
    finally:
        a.close()
        b.close()
