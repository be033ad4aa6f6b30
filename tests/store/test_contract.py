"""The store contract: one suite, run over every backend.

``MemoryStore`` is the reference; ``SQLiteStore`` and ``HBaseStore`` must
behave the same where the contract says so. HBase runs on the Thrift gateway
test double (``tests/hbase_double.py``), or on a real gateway when
``BROKERD_TEST_HBASE=HOST:PORT`` is set (each test gets its own table prefix).

What the contract does not fix, and so is not checked: the values of queue
sequence numbers (only that one session's are strictly increasing in append
order and never reused while the session lives), ``SessionRecord.last_seq``,
the order of subscriptions, and the row count ``purge`` returns (only "some"
when something expired, 0 when nothing did).

The backend bugs this suite found (orphan rows for missing sessions, stale
sequence numbers in retried batches, partial HBase rows) are fixed; their
tests remain as regression tests.
"""

import asyncio
import gc
import os
import random
import signal
import threading
import time
import traceback

import pytest

from brokerd.protocol import properties as P
from brokerd.protocol.packets import Will
from brokerd.store import StoreError, open_store
from brokerd.store.records import QueueEntry, StoredMessage, SubscriptionRecord, pack_will

from ..procs import sigstop

BACKENDS = ("memory", "sqlite", "hbase")
NEVER = 0xFFFFFFFF
NOW = 1_700_000_000.0          # "now" for purge tests (records hold wall-clock times)
T1, T2 = "tenant-a", "tenant-b"


all_backends = pytest.mark.parametrize("backend", BACKENDS)


# ------------------------------------------------------------------ driving

def run(coro, timeout=60.0):
    """Run one store coroutine to completion (never hangs the suite).

    A StoreError is raised again as a fresh one carrying the original
    traceback as text: the original's frames can hold a half-iterated
    happybase scanner, whose clean-up would otherwise run at some random
    garbage collection (once inside pytest's own traceback formatting, which
    crashed CPython's AST builder)."""
    async def bounded():
        return await asyncio.wait_for(coro, timeout)
    try:
        return asyncio.run(bounded())
    except StoreError as exc:
        text = "".join(traceback.format_exception(exc))
    gc.collect()
    raise StoreError(text)


class SyncStore:
    """A store driven synchronously, one ``asyncio.run`` per call."""

    def __init__(self, url: str):
        self.url = url
        self.store = open_store(url)
        run(self.store.open())

    def apply(self, ops, timeout=60.0):
        run(self.store.apply(list(ops)), timeout)

    def load(self):
        return run(self.store.load())

    def load_session(self, tenant, cid):
        return run(self.store.load_session(tenant, cid))

    def session_keys(self, after, limit):
        return run(self.store.session_keys(after, limit))

    def walk_keys(self, limit, between=None) -> list[list[tuple[str, str]]]:
        """Every session key, ``limit`` at a time as a node walks them (``between(pages)`` after each page)."""
        pages, after = [], None
        while True:
            page = self.session_keys(after, limit)
            assert len(page) <= limit
            if not page:
                return pages
            pages.append(page)
            after = page[-1]
            if between is not None:
                between(pages)

    def purge(self, now):
        return run(self.store.purge(now))

    def ping(self, timeout=60.0):
        run(self.store.ping(), timeout)

    def close(self):
        run(self.store.close())

    # views
    def sessions(self) -> dict:
        """{(tenant, cid): view} from load(), checking each queue is in strictly increasing seq order."""
        sessions, _ = self.load()
        out = {}
        for rec in sessions:
            seqs = [e.seq for e in rec.queue]
            assert seqs == sorted(set(seqs)), f"queue of {rec.client_id!r} not in strictly increasing seq order"
            assert (rec.tenant, rec.client_id) not in out
            out[(rec.tenant, rec.client_id)] = view(rec)
        return out

    def session(self, tenant, cid):
        """The view of one session, through load_session() and load() (which must agree)."""
        one = view(self.load_session(tenant, cid))
        assert self.sessions().get((tenant, cid)) == one
        return one

    def retained(self) -> dict:
        _, retained = self.load()
        out = {(t, topic): m for t, topic, m in retained}
        assert len(out) == len(retained)
        return out


def view(rec):
    """What the contract promises about a SessionRecord."""
    if rec is None:
        return None
    return {
        "tenant": rec.tenant, "client_id": rec.client_id, "expiry": rec.expiry_interval,
        "disconnected_at": rec.disconnected_at, "will": rec.will, "will_due": rec.will_due,
        "subscriptions": sorted(rec.subscriptions, key=lambda s: s.filter),
        "queue": list(rec.queue), "awaiting_rel": set(rec.awaiting_rel),
    }


def expected(cid, tenant=T1, expiry=3600, disconnected_at=None, will=None, will_due=None, subscriptions=(),
             queue=(), awaiting_rel=()):
    return {
        "tenant": tenant, "client_id": cid, "expiry": expiry, "disconnected_at": disconnected_at,
        "will": will, "will_due": will_due, "subscriptions": sorted(subscriptions, key=lambda s: s.filter),
        "queue": list(queue), "awaiting_rel": set(awaiting_rel),
    }


# ------------------------------------------------------------------ records and ops

def message(topic="sensors/1/temp", payload=b"21.5", qos=1, retain=False, properties=None, expiry_at=None):
    return StoredMessage(topic, payload, qos, retain, properties, expiry_at)


def entry(msg=None, qos=1, **kw) -> QueueEntry:
    return QueueEntry(0, msg or message(), qos, **kw)


def session(cid, tenant=T1, expiry=3600, disconnected_at=None, will=None, will_due=None):
    return ("session", tenant, cid, expiry, disconnected_at, pack_will(will), will_due)


def q(cid, e, tenant=T1):
    return ("q", tenant, cid, e)


def q_state(cid, e, tenant=T1):
    return ("q_state", tenant, cid, e)


def q_del(cid, e, tenant=T1):
    return ("q_del", tenant, cid, e)


def sub(cid, filt, tenant=T1, **kw):
    return ("sub", tenant, cid, SubscriptionRecord(filt, **kw))


RICH_PROPS = {
    P.PAYLOAD_FORMAT_INDICATOR: 1,
    P.MESSAGE_EXPIRY_INTERVAL: 3600,
    P.CONTENT_TYPE: "application/json; charset=ütf-8",
    P.RESPONSE_TOPIC: "replies/😀/x",
    P.CORRELATION_DATA: bytes(range(256)),
    P.USER_PROPERTY: [("k", "v"), ("k", "v2"), ("", ""), ("ключ", "значение")],
    P.SUBSCRIPTION_IDENTIFIER: [1, 268435455],
}

WILL = Will("last/will/ü", b"\x00bye\xff", 1, True, {
    P.WILL_DELAY_INTERVAL: 30, P.USER_PROPERTY: [("k", "v"), ("k", "v2")],
    P.CORRELATION_DATA: b"\x00\x01", P.CONTENT_TYPE: "text/plain", P.MESSAGE_EXPIRY_INTERVAL: 60})


def rich_entries():
    """Entries using every field of QueueEntry and StoredMessage."""
    return [
        entry(message("a/b/c", b'{"t": 21.5}', 2, True, RICH_PROPS, NOW + 3600.125), qos=1, retain=True,
              sub_ids=(1, 268435455)),
        entry(message("a/ü/😀", b"", 0), qos=0, share=("grp", "a/+/😀")),
        entry(message("bin", random.Random(7).randbytes(65536), 2, False, {P.USER_PROPERTY: [("only", "one")]}),
              qos=2, sub_ids=(5,), share=("g", "x/y/#"), pid=65535, state=1),
        entry(message("expiring", b"x", 1, False, None, NOW + 0.5), qos=1, pid=1),
    ]


# ------------------------------------------------------------------ fixtures

@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param


@pytest.fixture
def url(backend, tmp_path, request):
    if backend == "memory":
        return "memory://"
    if backend == "sqlite":
        return f"sqlite:///{tmp_path}/s.db"
    return request.getfixturevalue("hbase_url")


@pytest.fixture
def store(url):
    s = SyncStore(url)
    yield s
    s.close()


# ------------------------------------------------------------------ sessions

def test_session_create_update_round_trip(store):
    assert store.sessions() == {}
    assert store.load_session(T1, "dev-1") is None
    store.apply([session("dev-1", expiry=3600, disconnected_at=NOW + 0.25, will=WILL, will_due=NOW + 30.5)])
    assert store.session(T1, "dev-1") == expected("dev-1", expiry=3600, disconnected_at=NOW + 0.25, will=WILL,
                                                  will_due=NOW + 30.5)
    # reconnected: no disconnect time, a will without properties, no delay
    plain = Will("t", b"", 0, False, None)
    store.apply([session("dev-1", expiry=NEVER, will=plain)])
    assert store.session(T1, "dev-1") == expected("dev-1", expiry=NEVER, will=plain)
    # no will at all, expiry 0
    store.apply([session("dev-1", expiry=0, disconnected_at=NOW)])
    assert store.session(T1, "dev-1") == expected("dev-1", expiry=0, disconnected_at=NOW)


def test_session_keeps_what_was_sent_with_its_disconnect(store):
    """The highest entry number sent to the client, written with the disconnect (``SessionRecord.sent``):
    kept, replaced by the next write, and not known (None) for a record written without it."""
    store.apply([session("dev", disconnected_at=NOW) + (None, 12345678901)])
    assert store.load_session(T1, "dev").sent == 12345678901
    store.apply([session("dev") + (None, None)])           # connected again: not known
    assert store.load_session(T1, "dev").sent is None
    store.apply([session("dev", disconnected_at=NOW) + (None, 7)])
    assert [r.sent for r in store.load()[0]] == [7]
    store.apply([session("dev", disconnected_at=NOW)])      # an op of an older form: not known
    assert store.load_session(T1, "dev").sent is None


@pytest.mark.parametrize("backend", ["sqlite", "hbase"])
def test_what_was_sent_is_not_known_after_a_disconnect_written_by_an_older_brokerd(backend, url, store):
    """An older brokerd sharing the store (a rolling upgrade) writes a session's disconnect without
    what it sent: the number written before with another disconnect no longer holds."""
    store.apply([session("dev", disconnected_at=NOW) + (None, 42)])
    assert store.load_session(T1, "dev").sent == 42
    later = NOW + 60.5
    if backend == "sqlite":
        import sqlite3

        db = sqlite3.connect(url[len("sqlite:///"):])
        db.execute("INSERT INTO sessions (tenant, client_id, expiry_interval, disconnected_at, will, will_due, device) "
                   "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (tenant, client_id) DO UPDATE SET "
                   "expiry_interval = excluded.expiry_interval, disconnected_at = excluded.disconnected_at, "
                   "will = excluded.will, will_due = excluded.will_due, device = excluded.device",
                   (T1, "dev", 3600, later, None, None, None))
        db.commit()
        db.close()
    else:
        import happybase

        from brokerd.store.hbase import session_key

        conn = happybase.Connection(store.store.host, store.store.port, table_prefix=store.store.prefix)
        conn.table("sessions").put(session_key(T1, "dev"), {b"s:e": b"3600", b"s:d": repr(later).encode()})
        conn.close()
    rec = store.load_session(T1, "dev")
    assert (rec.disconnected_at, rec.sent) == (later, None)
    assert [r.sent for r in store.load()[0]] == [None]


def test_session_update_keeps_subscriptions_queue_and_packet_ids(store):
    e = entry()
    store.apply([session("dev"), sub("dev", "a/#", qos=1), q("dev", e), ("rel", T1, "dev", 7)])
    store.apply([session("dev", expiry=60, disconnected_at=NOW, will=WILL, will_due=NOW + 30)])
    assert store.session(T1, "dev") == expected(
        "dev", expiry=60, disconnected_at=NOW, will=WILL, will_due=NOW + 30,
        subscriptions=[SubscriptionRecord("a/#", 1)], queue=[e], awaiting_rel={7})


def test_session_del_removes_everything_and_a_new_session_starts_empty(store):
    e1, e2 = entry(), entry(message("other"))
    store.apply([session("dev", will=WILL, will_due=NOW), sub("dev", "a/#"), sub("dev", "b"), q("dev", e1),
                 q("dev", e2), ("rel", T1, "dev", 1), ("rel", T1, "dev", 2), session("keep"), sub("keep", "k")])
    store.apply([("session_del", T1, "dev")])
    assert store.load_session(T1, "dev") is None
    assert set(store.sessions()) == {(T1, "keep")}
    store.apply([session("dev")])
    assert store.session(T1, "dev") == expected("dev")
    e3 = entry(message("new"))
    store.apply([q("dev", e3)])
    assert store.session(T1, "dev")["queue"] == [e3]
    assert store.session(T1, "keep")["subscriptions"] == [SubscriptionRecord("k")]


def test_session_del_and_recreate_in_one_batch(store):
    old, new = entry(message("old")), entry(message("new"))
    store.apply([session("dev"), sub("dev", "old/#"), q("dev", old), ("rel", T1, "dev", 3)])
    store.apply([("session_del", T1, "dev"), session("dev", expiry=10), sub("dev", "new/#"), q("dev", new)])
    assert store.session(T1, "dev") == expected("dev", expiry=10, subscriptions=[SubscriptionRecord("new/#")],
                                                queue=[new])


@all_backends
def test_session_del_after_q_state_in_one_batch(store):
    """PUBREC, then the client reconnects with Clean Start, within one group commit."""
    e, other = entry(qos=2, pid=1), entry(qos=1)
    store.apply([session("dev"), q("dev", e), q("dev", other)])
    e.state = 1
    store.apply([q_state("dev", e), ("session_del", T1, "dev"), session("dev")])
    assert store.session(T1, "dev") == expected("dev")


def test_session_del_of_unknown_session_is_harmless(store):
    store.apply([("session_del", T1, "nobody")])
    assert store.sessions() == {}


# ------------------------------------------------------------------ subscriptions

def test_subscriptions_add_replace_remove(store):
    store.apply([session("dev"),
                 sub("dev", "a/+/c", qos=1),
                 sub("dev", "a/#", qos=2, no_local=True, rap=True, rh=2, sub_id=7),
                 sub("dev", "$share/grp/x/#", qos=1, sub_id=268435455),
                 sub("dev", "colon:in/filtér/😀", qos=0, rh=1)])
    store.apply([sub("dev", "a/+/c", qos=0, sub_id=3),          # replaces
                 ("unsub", T1, "dev", "a/#"),
                 ("unsub", T1, "dev", "never/subscribed")])
    assert store.session(T1, "dev")["subscriptions"] == sorted([
        SubscriptionRecord("a/+/c", 0, sub_id=3),
        SubscriptionRecord("$share/grp/x/#", 1, sub_id=268435455),
        SubscriptionRecord("colon:in/filtér/😀", 0, rh=1),
    ], key=lambda s: s.filter)
    # a replacement drops what the new subscription does not have
    store.apply([sub("dev", "a/+/c", qos=2)])
    assert SubscriptionRecord("a/+/c", 2) in store.session(T1, "dev")["subscriptions"]


# ------------------------------------------------------------------ queue

def test_queue_append_round_trips_every_field_in_seq_order(store):
    entries = rich_entries()
    store.apply([session("dev"), q("dev", entries[0]), q("dev", entries[1])])
    store.apply([q("dev", entries[2])])
    store.apply([q("dev", entries[3])])
    seqs = [e.seq for e in entries]
    assert all(s > 0 for s in seqs) and seqs == sorted(set(seqs)), seqs
    assert store.session(T1, "dev")["queue"] == entries


def test_queue_seqs_are_per_session_and_not_reused_after_deletes(store):
    a = [entry(message(f"a{i}")) for i in range(3)]
    b = [entry(message(f"b{i}")) for i in range(3)]
    store.apply([session("a"), session("b"), q("a", a[0]), q("b", b[0]), q("a", a[1])])
    store.apply([q("b", b[1]), q_del("a", a[1])])
    store.apply([q("a", a[2]), q("b", b[2])])
    assert a[0].seq < a[1].seq < a[2].seq
    assert b[0].seq < b[1].seq < b[2].seq
    assert store.session(T1, "a")["queue"] == [a[0], a[2]]
    assert store.session(T1, "b")["queue"] == b


def test_q_state(store):
    e1, e2 = entry(qos=2, pid=10), entry(qos=2, pid=11)
    store.apply([session("dev"), q("dev", e1), q("dev", e2)])
    e2.state = 1
    store.apply([q_state("dev", e2)])
    queue = store.session(T1, "dev")["queue"]
    assert [(e.seq, e.state) for e in queue] == [(e1.seq, 0), (e2.seq, 1)]
    assert queue == [e1, e2]


def test_q_del(store):
    es = [entry(message(f"m{i}")) for i in range(4)]
    store.apply([session("dev")] + [q("dev", e) for e in es])
    store.apply([q_del("dev", es[1])])
    assert store.session(T1, "dev")["queue"] == [es[0], es[2], es[3]]
    store.apply([q_del("dev", es[0]), q_del("dev", es[3]), q_del("dev", es[1])])   # es[1] again: harmless
    assert store.session(T1, "dev")["queue"] == [es[2]]


def test_append_and_delete_of_the_same_entry_in_one_batch(store):
    gone, kept, later = entry(message("gone")), entry(message("kept")), entry(message("later"))
    store.apply([session("dev"), q("dev", gone), q("dev", kept), q_del("dev", gone)])
    assert store.session(T1, "dev")["queue"] == [kept]
    store.apply([q("dev", later), q_del("dev", later), q_del("dev", kept)])
    assert store.session(T1, "dev")["queue"] == []



@pytest.mark.parametrize("same_batch", [False, True], ids=["later-batch", "same-batch"])
@all_backends
def test_q_state_of_an_acknowledged_entry_is_ignored(store, same_batch):
    e, other = entry(qos=2, pid=1), entry(qos=2, pid=2)
    store.apply([session("dev"), q("dev", e), q("dev", other)])
    e.state = 1
    if same_batch:
        store.apply([q_del("dev", e), q_state("dev", e)])
    else:
        store.apply([q_del("dev", e)])
        store.apply([q_state("dev", e)])
    assert store.session(T1, "dev")["queue"] == [other]


@all_backends
def test_a_batch_applied_again_after_a_failure_q_del(store):
    """StoreWriter re-applies a failed batch -- the same op objects, plus what
    was gathered meanwhile; entries numbered by the failed attempt carry its seq."""
    store.apply([session("dev")])
    dropped, kept = entry(message("dropped")), entry(message("kept"))
    dropped.seq, kept.seq = 1000, 1001           # left by the failed attempt
    store.apply([q("dev", dropped), q("dev", kept), q_del("dev", dropped)])
    assert store.session(T1, "dev")["queue"] == [kept]


@all_backends
def test_a_batch_applied_again_after_a_failure_q_state(store):
    store.apply([session("dev")])
    e = entry(qos=2, pid=4)
    e.seq = 1000                                  # left by the failed attempt
    e.state = 1
    store.apply([q("dev", e), q_state("dev", e)])
    assert store.session(T1, "dev")["queue"] == [e]
    assert e.state == 1


def test_a_large_batch_and_long_queues_read_back_in_order(store):
    big = [entry(message(f"big/{i}", i.to_bytes(4, "big")), pid=i % 65536) for i in range(5000)]
    small = [entry(message(f"small/{i}")) for i in range(1500)]
    store.apply([session("big"), session("small")] + [q("big", e) for e in big])
    for i in range(0, len(small), 500):
        store.apply([q("small", e) for e in small[i:i + 500]])
    seqs = [e.seq for e in big]
    assert seqs == sorted(set(seqs))
    sessions = store.sessions()
    assert sessions[(T1, "big")]["queue"] == big
    assert sessions[(T1, "small")]["queue"] == small
    # ack every other one in one batch
    store.apply([q_del("big", e) for e in big[::2]])
    assert view(store.load_session(T1, "big"))["queue"] == big[1::2]
    assert view(store.load_session(T1, "small"))["queue"] == small
    # deleting the session clears its long queue (HBase: a prefix scan in batches)
    store.apply([("session_del", T1, "big"), session("big")])
    assert store.session(T1, "big") == expected("big")
    assert view(store.load_session(T1, "small"))["queue"] == small


# ------------------------------------------------------------------ order within a batch
# A backend may apply a batch in another order than its operations' (SQLite: kind by kind,
# between session operations); the result must be that of applying them one by one.

def test_append_delete_and_append_again_to_one_queue_in_one_batch(store):
    old = entry(message("old"))
    store.apply([session("dev"), q("dev", old)])
    a, b, c = entry(message("a"), qos=2, pid=1), entry(message("b")), entry(message("c"))
    a.state = 1
    store.apply([q("dev", a), q_del("dev", old), q_del("dev", a), q("dev", b), q_state("dev", a), q_del("dev", b),
                 q("dev", c), q_del("dev", old)])
    assert store.session(T1, "dev")["queue"] == [c]


def test_appends_after_a_session_del_in_one_batch_are_not_written(store):
    old = entry(message("old"), qos=2, pid=1)
    store.apply([session("dev"), q("dev", old)])
    old.state = 1
    store.apply([q("dev", entry(message("before"))), ("session_del", T1, "dev"), q("dev", entry(message("after"))),
                 q_state("dev", old), q_del("dev", old)])
    assert store.load_session(T1, "dev") is None
    assert store.sessions() == {}
    fresh = entry(message("fresh"))
    store.apply([session("dev"), q("dev", fresh)])
    assert store.session(T1, "dev")["queue"] == [fresh]


def test_acks_of_entries_of_a_session_deleted_and_created_again_in_one_batch(store, backend):
    """The acknowledgements of the old session's entries, after the session was ended and
    started again (Clean Start) in the same batch, touch nothing of the new one."""
    if backend == "memory":
        pytest.skip("memory:// numbers each life of a session from 1 (the contract allows it)")
    a = entry(message("a"))
    store.apply([session("dev"), q("dev", a)])
    b, c = entry(message("b")), entry(message("c"))
    store.apply([q("dev", b), ("session_del", T1, "dev"), session("dev", expiry=60), q("dev", c), q_del("dev", a),
                 q_del("dev", b), sub("dev", "x/#")])
    assert store.session(T1, "dev") == expected("dev", expiry=60, subscriptions=[SubscriptionRecord("x/#")],
                                                queue=[c])


def _random_script(rnd: random.Random, n: int) -> list:
    """Operations as the broker would journal them, over three sessions: (kind, cid, entry
    index). Acknowledgements and state changes name entries appended earlier, acknowledged
    or not, of the session as it is now or of one that has ended and not started again
    (the contract leaves open what a stale one does to a session started again)."""
    alive: set = set()
    life = {"s1": 0, "s2": 0, "s3": 0}       # how many times each session started
    appended: dict[int, tuple] = {}          # entry index -> (its session, which life)
    script = []
    for _ in range(n):
        cid = rnd.choice(("s1", "s2", "s3"))
        r = rnd.random()
        if cid not in alive and r < 0.3:     # appended to a session that is gone: not written
            appended[len(script)] = (cid, life[cid])
            script.append(("q", cid, len(script)))
        elif r < 0.08 or cid not in alive:
            if cid not in alive:
                life[cid] += 1
            script.append(("session", cid, None))
            alive.add(cid)
        elif r < 0.12:
            script.append(("session_del", cid, None))
            alive.discard(cid)
        elif r < 0.55 or not appended:
            appended[len(script)] = (cid, life[cid])
            script.append(("q", cid, len(script)))
        else:
            named = [k for k, (c, n) in appended.items() if c not in alive or n == life[c]]
            if not named:
                continue
            k = rnd.choice(named)
            script.append((rnd.choice(("q_del", "q_del", "q_state")), appended[k][0], k))
    return script


def _run_script(stores: list, script: list, cuts: list) -> dict:
    """Apply ``script`` in the batches ``cuts`` gives, batches taking turns on ``stores``
    (several nodes on one database); -> the queues (topics, states) read back."""
    entries: dict[int, QueueEntry] = {}
    batches, start = [], 0
    for end in [*cuts, len(script)]:
        batches.append(script[start:end])
        start = end
    for i, batch in enumerate(batches):
        ops = []
        for kind, cid, k in batch:
            if kind == "session":
                ops.append(session(cid))
            elif kind == "session_del":
                ops.append(("session_del", T1, cid))
            elif kind == "q":
                entries[k] = entry(message(f"m{k}"), qos=2, pid=k % 65535 + 1)
                ops.append(q(cid, entries[k]))
            else:
                if kind == "q_state":
                    entries[k].state = 1          # as the broker does before journalling it
                ops.append((kind, T1, cid, entries[k]))
        stores[i % len(stores)].apply(ops)
    return {cid: [(e.msg.topic, e.state) for e in v["queue"]] for (t, cid), v in stores[0].sessions().items()}


def _one_at_a_time(script: list) -> dict:
    """The queues the reference store (memory) leaves, applying ``script`` one operation at a time."""
    reference = SyncStore("memory://")
    try:
        return _run_script([reference], script, list(range(1, len(script))))
    finally:
        reference.close()


@pytest.mark.parametrize("seed", range(4))
def test_any_batching_gives_the_result_of_one_operation_at_a_time(url, tmp_path, seed):
    """Random scripts of appends, acknowledgements, state changes, session ends and
    restarts, cut into random batches, give the queues that the reference store (memory)
    gives applying them one at a time."""
    rnd = random.Random(seed)
    script = _random_script(rnd, 400)
    want = _one_at_a_time(script)
    cuts = sorted(rnd.sample(range(1, len(script)), 25))
    s = SyncStore(url)
    try:
        assert _run_script([s], script, cuts) == want
    finally:
        s.close()
    assert any(want.values())            # the script leaves something queued


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("backend", ["sqlite"])
def test_any_batching_over_two_nodes_gives_the_result_of_one_at_a_time(url, seed):
    rnd = random.Random(100 + seed)
    script = _random_script(rnd, 400)
    want = _one_at_a_time(script)
    cuts = sorted(rnd.sample(range(1, len(script)), 40))
    a, b = SyncStore(url), SyncStore(url)
    try:
        assert _run_script([a, b], script, cuts) == want
    finally:
        a.close()
        b.close()


def test_a_batch_that_fails_midway_leaves_nothing_and_numbers_nothing(store, backend):
    """A batch is atomic where the store can make it so (SQLite): an operation the store
    cannot take rolls back everything before it, and the entries that batch numbered are
    unnumbered (seq 0) -- their numbers will be given to other entries."""
    if backend != "sqlite":
        pytest.skip("atomic batches: SQLite")
    kept = entry(message("kept"))
    store.apply([session("dev"), q("dev", kept)])
    first, bad = entry(message("first")), entry(message("bad", properties={P.MESSAGE_EXPIRY_INTERVAL: -1}))
    with pytest.raises(StoreError):
        store.apply([q("dev", first), q_del("dev", kept), session("other"), q("dev", bad)])
    assert first.seq == 0 and bad.seq == 0
    assert set(store.sessions()) == {(T1, "dev")}
    assert store.session(T1, "dev")["queue"] == [kept]


# ------------------------------------------------------------------ ops of sessions that do not exist

# q: a new entry; q-resent: an entry that carries a seq already (appended before, or numbered by a
# batch that failed and is being applied again, as StoreWriter does)
OP_KINDS = ("sub", "unsub", "q", "q-resent", "q_state", "q_del", "rel", "rel_del")

def _ghost_op(kind, cid, e):
    if kind == "sub":
        return sub(cid, "ghost/#", qos=1)
    if kind == "unsub":
        return ("unsub", T1, cid, "ghost/#")
    if kind == "q":
        return q(cid, entry(message("ghost")))
    if kind == "q-resent":
        return q(cid, e)
    if kind in ("q_state", "q_del"):
        return (kind, T1, cid, e)
    return (kind, T1, cid, 42)


def _unknown_session_params():
    for b in BACKENDS:
        for kind in OP_KINDS:
            for scenario in ("never-created", "deleted"):
                yield pytest.param(b, kind, scenario, id=f"{b}-{kind}-{scenario}")


@pytest.mark.parametrize("backend,kind,scenario", list(_unknown_session_params()))
def test_ops_of_a_session_that_does_not_exist_are_ignored(store, kind, scenario):
    """The op is dropped: the session does not appear, and when a session of
    that name is created later it starts empty (and loads)."""
    e = entry(qos=2, pid=9)
    if scenario == "deleted":
        store.apply([session("ghost"), q("ghost", e)])         # e gets a real seq
        store.apply([("session_del", T1, "ghost")])
    else:
        e.seq = 5                                              # as if it had been appended once
    e.state = 1
    store.apply([_ghost_op(kind, "ghost", e)])
    assert store.sessions() == {}
    assert store.load_session(T1, "ghost") is None
    store.apply([session("ghost")])
    assert store.session(T1, "ghost") == expected("ghost")


# ------------------------------------------------------------------ incoming QoS 2 packet ids

def test_awaiting_rel(store):
    store.apply([session("dev"), ("rel", T1, "dev", 1), ("rel", T1, "dev", 2), ("rel", T1, "dev", 65535),
                 ("rel", T1, "dev", 1)])
    assert store.session(T1, "dev")["awaiting_rel"] == {1, 2, 65535}
    store.apply([("rel_del", T1, "dev", 2), ("rel_del", T1, "dev", 9)])
    assert store.session(T1, "dev")["awaiting_rel"] == {1, 65535}
    store.apply([("rel_del", T1, "dev", 1), ("rel", T1, "dev", 2), ("rel_del", T1, "dev", 65535)])
    assert store.session(T1, "dev")["awaiting_rel"] == {2}


# ------------------------------------------------------------------ retained

def retained_msg(topic, payload=b"on", qos=1, properties=None, expiry_at=None):
    return StoredMessage(topic, payload, qos, True, properties, expiry_at)


def test_retained_set_replace_delete(store):
    a1 = retained_msg("home/lamp", b"on", 1, RICH_PROPS, NOW + 60.5)
    b1 = retained_msg("home/lamp", b"other tenant", 2)
    u1 = retained_msg("dom/ü/😀", bytes(range(256)), 0, {P.CONTENT_TYPE: "x"})
    store.apply([("retain", T1, "home/lamp", a1), ("retain", T2, "home/lamp", b1), ("retain", T1, "dom/ü/😀", u1)])
    assert store.retained() == {(T1, "home/lamp"): a1, (T2, "home/lamp"): b1, (T1, "dom/ü/😀"): u1}
    # replace: properties and expiry of the old message must not survive
    a2 = retained_msg("home/lamp", b"off", 0)
    store.apply([("retain", T1, "home/lamp", a2), ("retain_del", T2, "home/lamp"), ("retain_del", T1, "none")])
    assert store.retained() == {(T1, "home/lamp"): a2, (T1, "dom/ü/😀"): u1}
    # delete then set again, across batches and within one
    a3 = retained_msg("home/lamp", b"on again", 2, {P.USER_PROPERTY: [("a", "b")]})
    store.apply([("retain_del", T1, "home/lamp")])
    store.apply([("retain", T1, "home/lamp", a3)])
    assert store.retained()[(T1, "home/lamp")] == a3
    a4 = retained_msg("home/lamp", b"4")
    store.apply([("retain_del", T1, "home/lamp"), ("retain", T1, "home/lamp", a4)])
    assert store.retained()[(T1, "home/lamp")] == a4
    store.apply([("retain", T1, "dom/ü/😀", a4), ("retain_del", T1, "dom/ü/😀")])
    assert store.retained() == {(T1, "home/lamp"): a4}


# ------------------------------------------------------------------ load_session, tenants, unicode

def test_load_session_sees_only_its_session(store):
    names = [(T1, "c"), (T1, "c2"), (T1, "2c"), (T2, "c"), (T1, "cc"), (T1 + "x", "c")]
    contents = {}
    ops = []
    for i, (t, c) in enumerate(names):
        e = entry(message(f"{t}/{c}"))
        s = SubscriptionRecord(f"{t}/{c}/#", 1)
        ops += [session(c, tenant=t, expiry=100 + i), ("sub", t, c, s), q(c, e, tenant=t), ("rel", t, c, i + 1)]
        contents[(t, c)] = expected(c, tenant=t, expiry=100 + i, subscriptions=[s], queue=[e], awaiting_rel={i + 1})
    store.apply(ops)
    for (t, c), want in contents.items():
        assert store.session(t, c) == want
    assert store.load_session(T1, "c3") is None
    assert store.load_session("tenant", "c") is None
    assert store.sessions() == contents


def test_same_client_id_in_two_tenants_stays_apart(store):
    ea, eb = [entry(message(f"a{i}")) for i in range(3)], [entry(message(f"b{i}")) for i in range(2)]
    store.apply([session("dev", tenant=T1, expiry=1), session("dev", tenant=T2, expiry=2),
                 sub("dev", "a/#", tenant=T1), sub("dev", "b/#", tenant=T2, qos=2)]
                + [q("dev", e, tenant=T1) for e in ea] + [q("dev", e, tenant=T2) for e in eb]
                + [("rel", T1, "dev", 1), ("rel", T2, "dev", 2)])
    assert store.session(T1, "dev") == expected("dev", T1, 1, subscriptions=[SubscriptionRecord("a/#")], queue=ea,
                                                awaiting_rel={1})
    want_b = expected("dev", T2, 2, subscriptions=[SubscriptionRecord("b/#", 2)], queue=eb, awaiting_rel={2})
    assert store.session(T2, "dev") == want_b
    store.apply([q_del("dev", ea[0], tenant=T1), ("session_del", T1, "dev")])
    assert store.sessions() == {(T2, "dev"): want_b}


def test_session_keys_list_every_session_once_in_pages_in_order(store):
    """``session_keys``: the keys of every stored session, of every tenant, in ascending order, a
    bounded page at a time -- none missed or repeated across pages, whatever the page size --
    without their subscriptions or queues; deleted sessions are not listed."""
    names = [(T1, "c"), (T1, "c2"), (T1, "2c"), (T2, "c"), (T1, "cc"), (T1 + "x", "c"), (T1, "Gerät 🚀"),
             (T1, "c\u00ff"), ("Mandant-Ü", "dev"), (T2, "a" * 200)] + [(T2, f"sensor-{i:03d}") for i in range(25)]
    ops = []
    for t, c in names:
        ops += [session(c, tenant=t), sub(c, f"{c}/#", tenant=t), q(c, entry(message(f"{t}/{c}")), tenant=t)]
    ops += [session("gone", tenant=T1), q("gone", entry(), tenant=T1), ("session_del", T1, "gone")]
    store.apply(ops)
    want = sorted(names)
    assert store.session_keys(None, 1000) == want
    for limit in (1, 3, 7, len(names) - 1, len(names)):
        pages = store.walk_keys(limit)
        assert all(len(p) == limit for p in pages[:-1])
        assert [k for p in pages for k in p] == want
    assert store.session_keys(want[-1], 10) == []
    assert store.session_keys((T2, "c"), 2) == [(T2, "sensor-000"), (T2, "sensor-001")]
    assert store.session_keys((T1, "c"), 2) == [(T1, "c2"), (T1, "cc")]      # strictly after, not after a prefix
    assert store.session_keys(("", ""), 3) == want[:3]
    assert store.session_keys(None, 0) == []


def test_session_keys_walk_while_sessions_come_and_go(store):
    """A session that exists throughout a walk is listed exactly once, however the others
    change between its pages (created before or after the walk's position, deleted)."""
    store.apply([session(f"dev-{i:02d}") for i in range(0, 40, 2)])

    def change(pages):
        if len(pages) == 2:
            store.apply([session("dev-01"), session("dev-39"), ("session_del", T1, "dev-00"),
                         ("session_del", T1, "dev-30")])
    listed = [k for p in store.walk_keys(5, change) for k in p]
    assert len(listed) == len(set(listed)) and listed == sorted(listed)
    lasting = {(T1, f"dev-{i:02d}") for i in range(2, 40, 2)} - {(T1, "dev-30")}
    assert lasting <= set(listed)
    assert (T1, "dev-39") in listed and (T1, "dev-01") not in listed and (T1, "dev-30") not in listed


def test_session_keys_on_hbase_skip_rows_that_are_no_session(hbase_url):
    """A sessions row without its expiry cell (cells of a session deleted meanwhile) is no
    session -- ``load`` and ``load_session`` skip it -- and is not listed either."""
    import happybase

    from brokerd.store.hbase import session_key

    store = SyncStore(hbase_url)
    try:
        store.apply([session("a"), session("c")])
        conn = happybase.Connection(store.store.host, store.store.port, table_prefix=store.store.prefix)
        conn.table("sessions").put(session_key(T1, "b"), {b"f:x/#": b"1,0,0,0,", b"r:7": b""})
        conn.close()
        assert store.load_session(T1, "b") is None
        assert store.session_keys(None, 10) == [(T1, "a"), (T1, "c")]
        assert [k for p in store.walk_keys(1) for k in p] == [(T1, "a"), (T1, "c")]
    finally:
        store.close()


def test_unicode_tenant_and_client_ids(store):
    t, c = "Mandant-Ü/ñ", "Gerät 🚀/κλ:ε"
    e = entry(message("θέμα/😀", "ünï".encode()))
    s = SubscriptionRecord("θέμα/#", 2, sub_id=1)
    r = retained_msg("θέμα/😀", b"x")
    store.apply([session(c, tenant=t, will=WILL), ("sub", t, c, s), q(c, e, tenant=t), ("rel", t, c, 5),
                 ("retain", t, "θέμα/😀", r)])
    assert store.session(t, c) == expected(c, tenant=t, will=WILL, subscriptions=[s], queue=[e], awaiting_rel={5})
    assert store.retained() == {(t, "θέμα/😀"): r}
    store.apply([q_del(c, e, tenant=t), ("unsub", t, c, s.filter), ("rel_del", t, c, 5),
                 ("retain_del", t, "θέμα/😀")])
    assert store.session(t, c) == expected(c, tenant=t, will=WILL)
    assert store.retained() == {}


# ------------------------------------------------------------------ purge

def test_purge(store):
    keep_q = [entry(message("future", expiry_at=NOW + 100)), entry(message("no expiry"))]
    drop_q = [entry(message("past", expiry_at=NOW - 1)), entry(message("exactly now", expiry_at=NOW))]
    store.apply([
        session("expired", expiry=50, disconnected_at=NOW - 100, will=WILL, will_due=NOW - 70),
        sub("expired", "x"), q("expired", entry()), ("rel", T1, "expired", 1),
        session("expired-exactly", expiry=50, disconnected_at=NOW - 50),
        session("expiry-0", expiry=0, disconnected_at=NOW - 0.001),
        session("never", expiry=NEVER, disconnected_at=NOW - 10 ** 9),
        session("connected", expiry=10),
        session("not-yet", expiry=50, disconnected_at=NOW - 49.5),
        session("mixed", expiry=NEVER, disconnected_at=NOW - 5),
        q("mixed", drop_q[0]), q("mixed", keep_q[0]), q("mixed", drop_q[1]), q("mixed", keep_q[1]),
        q("connected", entry(message("past", expiry_at=NOW - 1000))),
        ("retain", T1, "r/past", retained_msg("r/past", expiry_at=NOW - 1)),
        ("retain", T1, "r/now", retained_msg("r/now", expiry_at=NOW)),
        ("retain", T1, "r/future", retained_msg("r/future", expiry_at=NOW + 1)),
        ("retain", T1, "r/forever", retained_msg("r/forever")),
    ])
    assert store.purge(NOW) > 0
    sessions = store.sessions()
    assert set(sessions) == {(T1, c) for c in ("never", "connected", "not-yet", "mixed")}
    assert sessions[(T1, "mixed")]["queue"] == keep_q
    assert sessions[(T1, "connected")]["queue"] == []
    assert set(store.retained()) == {(T1, "r/future"), (T1, "r/forever")}
    assert store.purge(NOW) == 0
    # a purged session's name starts empty
    store.apply([session("expired")])
    assert store.session(T1, "expired") == expected("expired")


# ------------------------------------------------------------------ durability

def test_durable_across_close_and_reopen(backend, url, store):
    if backend == "memory":
        pytest.skip("memory:// is not durable")
    entries = rich_entries()
    store.apply([session("dev", expiry=NEVER, disconnected_at=NOW, will=WILL, will_due=NOW + 30),
                 sub("dev", "a/#", qos=2, sub_id=4), ("rel", T1, "dev", 77),
                 ("retain", T1, "r", retained_msg("r", b"x", 1, RICH_PROPS, NOW + 1))]
                + [q("dev", e) for e in entries])
    before = store.sessions(), store.retained()
    store.close()
    again = SyncStore(url)
    try:
        assert (again.sessions(), again.retained()) == before
        later = entry(message("later"))
        again.apply([q("dev", later)])
        assert later.seq > entries[-1].seq
        assert again.session(T1, "dev")["queue"] == entries + [later]
    finally:
        again.close()
    store.store = open_store(url)        # the fixture closes it again
    run(store.store.open())


# ------------------------------------------------------------------ nodes; HBase gateway failures

@pytest.mark.parametrize("backend", ["sqlite", "hbase"])
def test_two_nodes_append_to_one_queue(url):
    """Two stores on one database -- two brokerd nodes -- appending to one queue."""
    a, b = SyncStore(url), SyncStore(url)
    try:
        a.apply([session("shared")])
        committed = []
        for node, n in ((a, 3), (b, 2), (a, 1), (b, 4), (b, 1), (a, 2)):
            es = [entry(message(f"{id(node)}-{i}")) for i in range(n)]
            node.apply([q("shared", e) for e in es])
            assert not committed or es[0].seq > committed[-1].seq
            committed += es
        # concurrently: every seq distinct, each node's own batches in order
        per_node = {a: [], b: []}

        def append(node):
            for i in range(15):
                es = [entry(message(f"c{i}")) for _ in range(3)]
                node.apply([q("shared", e) for e in es])
                per_node[node] += es

        threads = [threading.Thread(target=append, args=(node,)) for node in (a, b)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        for es in per_node.values():
            assert [e.seq for e in es] == sorted({e.seq for e in es})
        everything = sorted(committed + per_node[a] + per_node[b], key=lambda e: e.seq)
        assert len({e.seq for e in everything}) == len(everything)
        assert a.session(T1, "shared")["queue"] == everything
        assert b.session(T1, "shared")["queue"] == everything
    finally:
        a.close()
        b.close()


@pytest.fixture
def own_double(tmp_path):
    """A gateway double of the test's own, to kill."""
    from ..hbase_double import HBaseDoubleProcess

    proc = HBaseDoubleProcess(tmp_path / "hbase.db", delete_markers=True).start()
    yield proc
    proc.kill()


def test_hbase_gateway_killed_fails_fast_and_loses_nothing(own_double):
    store = SyncStore(f"hbase://{own_double.address}?table_prefix=k&timeout=3000")
    before = [entry(message(f"m{i}")) for i in range(5)]
    try:
        store.apply([session("dev", will=WILL), sub("dev", "a/#")] + [q("dev", e) for e in before])
        store.apply([("retain", T1, "r", retained_msg("r"))])
        own_double.kill()
        t0 = time.monotonic()
        with pytest.raises(StoreError):
            store.apply([q("dev", entry(message("while down")))], timeout=30)
        with pytest.raises(StoreError):
            store.apply([q("dev", entry(message("while down")))], timeout=30)
        with pytest.raises(StoreError):
            store.load()
        assert time.monotonic() - t0 < 10, "a dead gateway must fail fast, not hang"
    finally:
        store.close()
    own_double.start()                 # same file, same port
    fresh = SyncStore(f"hbase://{own_double.address}?table_prefix=k&timeout=3000")
    try:
        assert fresh.session(T1, "dev") == expected("dev", will=WILL, subscriptions=[SubscriptionRecord("a/#")],
                                                    queue=before)
        assert fresh.retained() == {(T1, "r"): retained_msg("r")}
        after = entry(message("after"))
        fresh.apply([q("dev", after)])
        assert after.seq > before[-1].seq
    finally:
        fresh.close()


def test_hbase_same_store_works_after_the_gateway_restarts(own_double):
    """Regression (fixed in dddea46): HBaseStore wrapped every exception in
    StoreError inside ``with pool.connection()``, so happybase's pool never
    replaced the broken connection and apply() failed with BrokenPipeError
    until some unwrapped call (load_session, ping, purge) happened."""
    store = SyncStore(f"hbase://{own_double.address}?table_prefix=k&timeout=3000")
    try:
        before = [entry(message(f"m{i}")) for i in range(3)]
        store.apply([session("dev")] + [q("dev", e) for e in before])
        own_double.kill()
        with pytest.raises(StoreError):
            store.apply([q("dev", entry(message("while down")))], timeout=30)
        own_double.start()             # same file, same port
        after = entry(message("after"))
        store.apply([q("dev", after)], timeout=30)       # what StoreWriter does: apply again
        assert store.load()[0][0].queue == before + [after]
    finally:
        store.close()


def test_hbase_gateway_that_stops_answering(own_double):
    """A gateway that hangs (SIGSTOP): the call fails after the timeout, and
    once the gateway answers again the store's results are right.

    Regression (fixed in dddea46): the timed-out connection stayed in the pool
    with the late reply unread, and thriftpy2 does not check sequence ids, so
    every later call read the reply of the call before it."""
    store = SyncStore(f"hbase://{own_double.address}?table_prefix=s&timeout=1000")
    try:
        first = [entry(message(f"m{i}")) for i in range(3)]
        store.apply([session("dev")] + [q("dev", e) for e in first])
        sigstop(own_double.proc.pid)
        try:
            t0 = time.monotonic()
            with pytest.raises(StoreError):
                store.apply([sub("dev", "stalled/#")], timeout=30)
            assert time.monotonic() - t0 < 8
        finally:
            os.kill(own_double.proc.pid, signal.SIGCONT)
        time.sleep(0.3)                  # the gateway answers the stalled call, to nobody
        later = [entry(message(f"later{i}")) for i in range(3)]
        for e in later:
            store.apply([q("dev", e)], timeout=30)
        rec = store.session(T1, "dev")
        assert rec["queue"] == first + later
        assert [e.seq for e in first + later] == sorted({e.seq for e in first + later})
    finally:
        store.close()


@pytest.fixture
def inproc_double(tmp_path):
    """A gateway double in this process, for fault injection."""
    from ..hbase_double import HBaseDouble

    double = HBaseDouble(tmp_path / "hbase.db", delete_markers=True).start()
    yield double
    double.stop()


def test_hbase_retried_batch_after_a_failed_write(inproc_double):
    """The StoreWriter sequence: a batch fails after its appends were numbered
    (counter incremented, queue rows refused); the broker drops one of those
    messages meanwhile (queue full, expiry); the writer re-applies the failed
    batch followed by the new ops."""
    store = SyncStore(f"hbase://{inproc_double.address}?table_prefix=r")
    try:
        store.apply([session("dev")])
        dropped, kept = entry(message("dropped")), entry(message("kept"))
        failed = [q("dev", dropped), q("dev", kept)]
        inproc_double.fail("mutateRows")
        with pytest.raises(StoreError):
            store.apply(failed)
        store.apply(failed + [q_del("dev", dropped)])
        assert store.session(T1, "dev")["queue"] == [kept]
    finally:
        store.close()


def test_named_values_round_trip(store):
    """get_meta/put_meta: the cluster keeps its route snapshot there."""
    assert run(store.store.get_meta("routes")) is None
    blob = bytes(range(256)) * 100
    run(store.store.put_meta("routes", blob))
    run(store.store.put_meta("other", b"x"))
    assert run(store.store.get_meta("routes")) == blob
    run(store.store.put_meta("routes", b"replaced"))
    assert run(store.store.get_meta("routes")) == b"replaced"
    assert run(store.store.get_meta("other")) == b"x"


# ------------------------------------------------------------------ delayed messages ($delayed/...)

def delayed(i, due, tenant=T1, msg=None):
    from brokerd.store.records import DelayedMessage
    return DelayedMessage(f"d{i:04d}", tenant, due, msg or message(f"later/{i}", f"p{i}".encode()))


def test_delayed_messages_round_trip_in_due_order_and_only_when_due(store):
    st = store.store
    rich = message("a/ü/😀", random.Random(3).randbytes(5000), 2, True, {
        P.USER_PROPERTY: [("k", "v"), ("k", "v2")], P.CONTENT_TYPE: "text/plain", P.MESSAGE_EXPIRY_INTERVAL: 60})
    items = [delayed(1, NOW + 30), delayed(2, NOW + 10, msg=rich), delayed(3, NOW + 20, tenant=T2)]
    run(st.delayed_add(items))
    assert run(st.delayed_counts()) == {T1: 2, T2: 1}
    assert run(st.delayed_claim(NOW + 5, "n1", 30, 100)) == []          # nothing due yet
    got = run(st.delayed_claim(NOW + 25, "n1", 30, 100))
    assert [(m.id, m.tenant, m.due, m.msg) for m in got] == [("d0002", T1, NOW + 10, rich),
                                                             ("d0003", T2, NOW + 20, items[2].msg)]
    # claimed messages stay (counted) until done
    assert run(st.delayed_counts()) == {T1: 2, T2: 1}
    run(st.delayed_done(got))
    assert run(st.delayed_counts()) == {T1: 1}
    assert [m.id for m in run(st.delayed_claim(NOW + 60, "n1", 30, 100))] == ["d0001"]


def test_delayed_messages_due_at_the_same_time_are_claimed_in_the_order_of_their_ids(store):
    """A node's ids sort in the order it took its messages, and the loop's clock is millisecond-grained:
    ties of ``due`` come out in id order, not stored order (SQLite broke them by its index, at random)."""
    st = store.store
    run(st.delayed_add([delayed(3, NOW + 1), delayed(1, NOW + 1), delayed(4, NOW + 2), delayed(2, NOW + 1)]))
    assert [m.id for m in run(st.delayed_claim(NOW + 5, "n1", 30, 100))] == ["d0001", "d0002", "d0003", "d0004"]


def test_a_deleted_tenants_delayed_messages_are_purged_and_no_one_elses(store):
    st = store.store
    run(st.delayed_add([delayed(1, NOW + 10), delayed(2, NOW + 20, tenant=T2), delayed(3, NOW + 30)]))
    assert run(st.delayed_purge(T1)) == 2
    assert run(st.delayed_counts()) == {T2: 1}
    assert [m.id for m in run(st.delayed_claim(NOW + 60, "n1", 30, 100))] == ["d0002"]
    assert run(st.delayed_purge(T1)) == 0


def test_a_delayed_claim_is_bounded_and_a_claimed_message_is_not_given_again_before_its_lease_ends(store):
    st = store.store
    run(st.delayed_add([delayed(i, NOW + i) for i in range(25)]))
    first = run(st.delayed_claim(NOW + 100, "n1", 30, 10))
    assert [m.id for m in first] == [f"d{i:04d}" for i in range(10)]          # the earliest, at most 10
    second = run(st.delayed_claim(NOW + 100, "n2", 30, 100))
    assert [m.id for m in second] == [f"d{i:04d}" for i in range(10, 25)]     # not the held ones
    assert run(st.delayed_claim(NOW + 120, "n3", 30, 100)) == []               # leases run to NOW + 130
    run(st.delayed_done(second))
    # the first holder died without deleting: after its lease another node gets them
    again = run(st.delayed_claim(NOW + 131, "n3", 30, 100))
    assert [m.id for m in again] == [f"d{i:04d}" for i in range(10)]
    run(st.delayed_done(again))
    assert run(st.delayed_counts()) == {}


def test_a_delayed_message_keeps_its_publisher_for_the_rules(store):
    """Who published it (client id, user name, device) comes back with the claim: the tenant's
    rules run on the release as on that client's publish; a message without one stays without."""
    from brokerd.store.records import DelayedMessage

    st = store.store
    who = ("dev-ü-1", "acme/d1", "d1")
    run(st.delayed_add([DelayedMessage("d0001", T1, NOW + 1, message("a/b", b"x"), who),
                        delayed(2, NOW + 2), DelayedMessage("d0003", T1, NOW + 3, message("a/c", b"y"),
                                                            (None, None, None))]))
    got = run(st.delayed_claim(NOW + 5, "n1", 30, 10))
    assert [(m.id, m.publisher) for m in got] == [("d0001", who), ("d0002", None), ("d0003", (None, None, None))]


def test_a_delayed_table_of_an_older_file_gains_the_publisher_column(tmp_path):
    """A SQLite file written before delayed messages kept their publisher: opened, its pending
    messages are claimed (no publisher) and new ones keep theirs."""
    import sqlite3

    from brokerd.store.records import DelayedMessage

    path = tmp_path / "old.db"
    a = SyncStore(f"sqlite:///{path}")
    run(a.store.delayed_add([delayed(1, NOW + 1)]))
    a.close()
    db = sqlite3.connect(path)
    db.executescript("CREATE TABLE d2 AS SELECT id, tenant, due, topic, payload, qos, retain, props, owner, lease "
                     "FROM delayed; DROP TABLE delayed; ALTER TABLE d2 RENAME TO delayed;")
    db.close()
    b = SyncStore(f"sqlite:///{path}")
    try:
        run(b.store.delayed_add([DelayedMessage("d0002", T1, NOW + 2, message("a/b", b"x"), ("c", "u", "d"))]))
        got = run(b.store.delayed_claim(NOW + 5, "n", 30, 10))
        assert [(m.id, m.publisher) for m in got] == [("d0001", None), ("d0002", ("c", "u", "d"))]
    finally:
        b.close()


@pytest.mark.parametrize("backend", ["sqlite", "hbase"])
def test_delayed_messages_survive_close_and_reopen(url):
    a = SyncStore(url)
    run(a.store.delayed_add([delayed(1, NOW + 1), delayed(2, NOW + 2, tenant=T2)]))
    a.close()
    b = SyncStore(url)
    try:
        assert run(b.store.delayed_counts()) == {T1: 1, T2: 1}
        assert [m.id for m in run(b.store.delayed_claim(NOW + 5, "n", 30, 10))] == ["d0001", "d0002"]
    finally:
        b.close()


@pytest.mark.parametrize("backend", ["sqlite", "hbase"])
def test_two_nodes_claiming_at_once_never_get_the_same_delayed_message(url):
    """Two stores on one database -- two brokerd nodes -- claiming the same due messages concurrently."""
    a, b = SyncStore(url), SyncStore(url)
    try:
        run(a.store.delayed_add([delayed(i, NOW + i / 10) for i in range(60)]))
        got = {a: [], b: []}

        def claim(node, name):
            for _ in range(20):
                got[node] += run(node.store.delayed_claim(NOW + 100, name, 30, 7))

        threads = [threading.Thread(target=claim, args=(node, name)) for node, name in ((a, "na"), (b, "nb"))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        ids = [m.id for m in got[a] + got[b]]
        assert sorted(ids) == [f"d{i:04d}" for i in range(60)]           # each exactly once
    finally:
        a.close()
        b.close()


def test_purge_keeps_an_expired_qos2_delivery(store):
    """The purge took every expired queue row, a QoS 2 delivery sent and not completed among them
    (PUBLISH sent, or PUBREL owed). Its receiver holds the packet id until the flow ends; after a
    restart the node, not knowing it any more, gave the id to a new message, which the receiver
    took for the old one again and never delivered ([MQTT-4.3.3-10]). A QoS 2 delivery stays until
    the broker ends it; an expired QoS 1 one still goes."""
    q2 = message("q2", qos=2, expiry_at=NOW - 1)
    sent = entry(q2, qos=2, pid=7)
    owed = entry(q2, qos=2, pid=8, state=1)
    store.apply([session("q2", expiry=NEVER, disconnected_at=NOW - 5),
                 q("q2", sent), q("q2", owed), q("q2", entry(message("q1", expiry_at=NOW - 1)))])
    assert store.purge(NOW) > 0
    assert store.session(T1, "q2")["queue"] == [sent, owed]
