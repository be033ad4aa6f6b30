"""``sqlite:///PATH``: the embedded default, one file on the node.

SQLAlchemy's URL convention: ``sqlite:///var/brokerd.db`` is relative to the
working directory, ``sqlite:////srv/brokerd.db`` absolute. Query options:
``synchronous=normal|full`` (default ``normal``: with WAL, every committed
batch survives a crash of the process -- SIGKILL included; ``full`` also
survives a power cut, at the cost of an fsync per batch).

Each journal batch is one transaction. Between two session operations
(which create or delete what the others apply to) the batch is applied kind
by kind, each kind in one ``executemany``: the queue's appends, then its
state changes, then its deletes, after the other kinds -- the order that
gives the same result as applying the operations one by one (an entry is
appended before anything else names it; the other kinds never touch the
queue). Under load a batch is mostly appends and acknowledgements of one
another's messages, interleaved: grouped, it is three statements, not one
per change of kind.

Queue entries are numbered from one counter for the whole file
(``counters``, advanced once per batch), not one per session: each
session's numbers still increase in append order and are never reused, the
counter's row serialises nodes sharing the file just as the sessions' rows
did, and a batch no longer updates a row per session it appends to (that
``UPDATE ... RETURNING`` was a third of the store's time under load). An
attempt at a batch that fails is rolled back, counter included: the entries
it numbered get seq 0 again, so a later ``q_del`` of an entry that was never
written (dropped by the writer) cannot delete the entry that took its number.

Schema 4: an entry's number is the queue row's rowid (``seq INTEGER PRIMARY
KEY``), so the acknowledgements of a batch delete their rows by number alone,
one lookup each, and appends go at the end of the table (schema 3 did both).
A row names its session by the session's number (``sessions.sid``, an integer
given once from the file's ``session_sid`` counter and never again), not by its
tenant and client id: the index that finds a session's entries (``entries_sid``)
holds an integer and a rowid per entry, where schema 3's held the two strings,
and an append binds and checks no strings -- its guard is the session's number,
found in ``sessions_sid``. A session is numbered when its first entry is
appended and keeps its number until it is deleted; made again, it has a new
one. The store's thread remembers the numbers it has read; an append whose
session another node deleted since (the guard finds no session of that number)
is written under the number the file has for it now, or not at all if the
session is gone. (Tried and not kept: rowids made of the session's number and
the counter's, a session's entries one range with no index -- the appends then
land in as many places in the table as there are sessions, and under load a
node took 4.5 % fewer messages a second, not more.)

A file of schema 1, 2 or 3 is upgraded when it is opened, in one transaction:
its sessions with entries are numbered, its queue table is rebuilt as
``entries`` -- every entry numbered again past every number the file gave (each
session's entries keep their order), the counter starting after them -- and
the rows of sessions that no longer exist are left behind.
Schema 1's per-session counter column is also renamed (``last_seq_v1``). A
brokerd of schema 1, 2 or 3 still running on the file fails its next queue
write ("no such table: queue": the store unavailable, its publishers get
negative acknowledgements) instead of writing entries no session would find.
An older brokerd refuses to open a file of a newer schema; any brokerd refuses
a schema it does not know. Stop every node sharing a file before upgrading them.
"""

import asyncio
import logging
import os
import sqlite3
import time
from urllib.parse import parse_qs, urlsplit

from .base import DATA_ERRORS, Store, StoreError
from .records import (
    DelayedMessage,
    QueueEntry,
    SessionRecord,
    StoredMessage,
    SubscriptionRecord,
    pack_ids,
    pack_props,
    pack_publisher,
    pack_share,
    unpack_ids,
    unpack_props,
    unpack_publisher,
    unpack_share,
    unpack_will,
)

# Python's sqlite3 binds int, float, str and bytearray as they are, but for any other value -- None
# and bytes included -- it first looks for an adapter by raising and clearing AttributeErrors
# (``__adapt__``, ``__conform__``): a tenth of the store thread's instructions under load, five
# such values a queue row. Registered, these two are found in its table at once and bound as they
# are (the same values: NULL, a BLOB). ``bytes.__bytes__`` (a C method: the object itself) rather
# than ``bytes`` (a constructor call, its arguments parsed): a third of the adapter's cost.
sqlite3.register_adapter(bytes, bytes.__bytes__)
sqlite3.register_adapter(type(None), lambda v: v)

log = logging.getLogger("brokerd.store")

# Checkpoints (WAL frames copied into the file, both synced: the only fsyncs of synchronous=normal)
# run on the store's thread right after a batch's commit has been reported, while the event loop
# sends what that commit released -- not inside the next COMMIT (SQLite's automatic checkpoint),
# which made the loop wait for two fsyncs every thousand pages. About every CHECKPOINT_FRAMES
# frames: the number of batch operations between two checkpoints follows the frames the last one
# found. SQLite's own checkpoint stays, at BACKSTOP_FRAMES, for what outruns that estimate.
CHECKPOINT_FRAMES = 1000          # SQLite's default wal_autocheckpoint
BACKSTOP_FRAMES = 4000

SCHEMA_VERSION = "4"
KNOWN = (None, "1", "2", "3", SCHEMA_VERSION)
COUNTER = "queue_seq"             # the last entry number given
SID_COUNTER = "session_sid"       # the last session number given

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS blobs (key TEXT PRIMARY KEY, value BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS sessions (
    tenant TEXT NOT NULL, client_id TEXT NOT NULL, expiry_interval INTEGER NOT NULL,
    disconnected_at REAL, will BLOB, will_due REAL, device TEXT, sid INTEGER, sent INTEGER, sent_at REAL,
    PRIMARY KEY (tenant, client_id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS subscriptions (
    tenant TEXT NOT NULL, client_id TEXT NOT NULL, filter TEXT NOT NULL,
    qos INTEGER NOT NULL, no_local INTEGER NOT NULL, rap INTEGER NOT NULL, rh INTEGER NOT NULL, sub_id INTEGER,
    PRIMARY KEY (tenant, client_id, filter)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS awaiting_rel (
    tenant TEXT NOT NULL, client_id TEXT NOT NULL, pid INTEGER NOT NULL,
    PRIMARY KEY (tenant, client_id, pid)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS retained (
    tenant TEXT NOT NULL, topic TEXT NOT NULL, payload BLOB NOT NULL, qos INTEGER NOT NULL,
    props BLOB, expiry_at REAL,
    PRIMARY KEY (tenant, topic));
CREATE TABLE IF NOT EXISTS delayed (
    id TEXT PRIMARY KEY, tenant TEXT NOT NULL, due REAL NOT NULL, topic TEXT NOT NULL, payload BLOB NOT NULL,
    qos INTEGER NOT NULL, retain INTEGER NOT NULL, props BLOB, owner TEXT, lease REAL) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS delayed_due ON delayed (due);
CREATE INDEX IF NOT EXISTS delayed_tenant ON delayed (tenant);
"""

# The queue (schema 4): an entry's number -- from the file's one counter, never reused -- is its
# rowid, so a delete finds its row by number alone; ``entries_sid`` (the entries of a session, in
# the order of their numbers: an index entry ends with the rowid) serves loading and deleting a
# session. Made (or rebuilt from an older layout's ``queue``) by ``_upgrade``, in its transaction.
ENTRIES = """
CREATE TABLE entries (
    seq INTEGER PRIMARY KEY, sid INTEGER NOT NULL,
    topic TEXT NOT NULL, payload BLOB NOT NULL, msg_qos INTEGER NOT NULL, msg_retain INTEGER NOT NULL,
    props BLOB, expiry_at REAL,
    qos INTEGER NOT NULL, retain INTEGER NOT NULL, sub_ids TEXT, share TEXT, pid INTEGER NOT NULL,
    state INTEGER NOT NULL)
"""
ENTRIES_INDEXES = ("CREATE INDEX entries_sid ON entries (sid)",
                   "CREATE INDEX entries_expiry ON entries (expiry_at) WHERE expiry_at IS NOT NULL")
ENTRY = "seq, topic, payload, msg_qos, msg_retain, props, expiry_at, qos, retain, sub_ids, share, pid, state"
SESSION_SID = "(SELECT sid FROM sessions WHERE tenant = ? AND client_id = ?)"

_SQL = {
    # ``sent`` holds with the disconnect it was written with (``sent_at``): an older brokerd sharing the
    # file writes disconnects without it, and what it sent then is not known (``SENT``)
    "session": "INSERT INTO sessions (tenant, client_id, expiry_interval, disconnected_at, will, will_due, device, "
               "sent, sent_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?4) ON CONFLICT (tenant, client_id) DO UPDATE "
               "SET expiry_interval = excluded.expiry_interval, disconnected_at = excluded.disconnected_at, "
               "will = excluded.will, will_due = excluded.will_due, device = excluded.device, sent = excluded.sent, "
               "sent_at = excluded.sent_at",
    # subscriptions and packet ids only for sessions that exist
    "sub": "INSERT OR REPLACE INTO subscriptions SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8 "
           "WHERE EXISTS (SELECT 1 FROM sessions WHERE tenant = ?1 AND client_id = ?2)",
    "unsub": "DELETE FROM subscriptions WHERE tenant = ? AND client_id = ? AND filter = ?",
    # queue entries only for sessions that exist (their number: a session made again has another)
    "q": "INSERT OR REPLACE INTO entries SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14 "
         "WHERE EXISTS (SELECT 1 FROM sessions WHERE sid = ?2)",
    "q_state": "UPDATE entries SET state = ? WHERE seq = ?",
    "seq": f"UPDATE counters SET value = value + ? WHERE name = '{COUNTER}' RETURNING value",
    "sid": f"UPDATE counters SET value = value + 1 WHERE name = '{SID_COUNTER}' RETURNING value",
    "rel": "INSERT OR IGNORE INTO awaiting_rel SELECT ?1, ?2, ?3 "
           "WHERE EXISTS (SELECT 1 FROM sessions WHERE tenant = ?1 AND client_id = ?2)",
    "rel_del": "DELETE FROM awaiting_rel WHERE tenant = ? AND client_id = ? AND pid = ?",
    "retain": "INSERT OR REPLACE INTO retained VALUES (?, ?, ?, ?, ?, ?)",
    "retain_del": "DELETE FROM retained WHERE tenant = ? AND topic = ?",
}

SENT = "CASE WHEN sent_at = disconnected_at THEN sent END"

_SESSION_TABLES = ("sessions", "subscriptions", "awaiting_rel")     # and its entries, first (by its number)


def _params(op: tuple) -> tuple:
    kind = op[0]
    if kind == "session":
        return op[1:9] if len(op) > 8 else (*op[1:], *(None,) * (9 - len(op)))    # (older forms: no device, sent)
    if kind == "sub":
        s = op[3]
        return (op[1], op[2], s.filter, s.qos, int(s.no_local), int(s.rap), s.rh, s.sub_id)
    if kind == "retain":
        m = op[3]
        return (op[1], op[2], m.payload, m.qos, pack_props(m.properties), m.expiry_at)
    return op[1:]


class SQLiteStore(Store):
    scheme = "sqlite"
    # a value SQLite cannot bind (InterfaceError), store (DataError) or that breaks a
    # constraint (IntegrityError); OperationalError (locked, I/O, no space) is the store's state
    data_errors = (*DATA_ERRORS, sqlite3.InterfaceError, sqlite3.DataError, sqlite3.IntegrityError)

    def __init__(self, url: str):
        super().__init__(url)
        parts = urlsplit(url)
        if parts.scheme != "sqlite" or not url.startswith("sqlite:///"):
            raise ValueError(f"bad store URL {url!r}: expected sqlite:///PATH")
        self.path = url[len("sqlite:///"):].split("?", 1)[0]
        if not self.path:
            raise ValueError(f"bad store URL {url!r}: no path")
        opts = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        self.synchronous = opts.pop("synchronous", "normal").upper()
        if self.synchronous not in ("NORMAL", "FULL"):
            raise ValueError(f"bad store URL {url!r}: synchronous must be normal or full")
        if opts:
            raise ValueError(f"bad store URL {url!r}: unknown option(s) {', '.join(opts)}")
        self.db: sqlite3.Connection | None = None
        self._since = 0                      # batch operations since the last checkpoint
        self._every = 2000                   # ... between two checkpoints (follows the frames they find)
        self._checkpoint_task: asyncio.Future | None = None
        self._checkpoint_ok = True
        # (tenant, client id) -> the session's number, as read or given on the store's thread
        # (emptied when a batch fails: the numbers it gave are gone)
        self._sids: dict = {}

    async def apply(self, ops: list, prepared=None) -> None:
        if not ops:
            return
        await self._run(self._apply, ops)
        if self._checkpoint_due(len(ops)) and self._checkpoint_task is None:
            # queued on the store's thread behind this batch, ahead of the next: the writer
            # reports this commit meanwhile
            task = self._checkpoint_task = asyncio.ensure_future(self._run(self._checkpoint))
            task.add_done_callback(self._checkpointed)

    async def close(self) -> None:
        if self._checkpoint_task is not None:
            await asyncio.wait([self._checkpoint_task])
        await super().close()

    def _checkpoint_due(self, ops: int) -> bool:
        self._since += ops
        if self._since < self._every:
            return False
        self._since = 0
        return True

    def _checkpointed(self, task) -> None:
        self._checkpoint_task = None
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            if self._checkpoint_ok:
                log.warning("session store: checkpoint failed (SQLite's own checkpoint remains): %s", exc)
            self._checkpoint_ok = False
            return
        self._checkpoint_ok = True
        self._calibrate(task.result())

    def _calibrate(self, frames: int) -> None:
        if frames > 0:
            self._every = min(max(int(self._every * CHECKPOINT_FRAMES / frames), 64), 1_000_000)

    def _checkpoint(self) -> int:
        """Copy the WAL's frames into the file (PASSIVE: never waits for another node's
        readers or writers) -> the frames the WAL held."""
        return self.db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()[1]

    def _open(self):
        directory = os.path.dirname(self.path)
        if directory:
            os.makedirs(directory, exist_ok=True)
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=30)
        try:
            _wal(db)
        except BaseException:
            db.close()
            raise
        db.execute(f"PRAGMA synchronous = {self.synchronous}")
        db.execute(f"PRAGMA wal_autocheckpoint = {BACKSTOP_FRAMES}")
        db.execute("PRAGMA busy_timeout = 30000")
        try:
            if db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'").fetchone():
                _check_version(db, self.path)        # before creating anything in a file it does not know
        except BaseException:
            db.close()
            raise
        db.executescript(SCHEMA)
        columns = {row[1] for row in db.execute("PRAGMA table_info(sessions)")}
        for column, kind in (("device", "TEXT"),     # files written before sessions kept their device
                             ("sent", "INTEGER"),    # ... before they kept what was sent (NULL: not known)
                             ("sent_at", "REAL")):
            if column not in columns:
                try:
                    db.execute(f"ALTER TABLE sessions ADD COLUMN {column} {kind}")
                except sqlite3.OperationalError as exc:    # another worker of the host added it a moment ago
                    if "duplicate column name" not in str(exc):
                        raise
        if "publisher" not in {row[1] for row in db.execute("PRAGMA table_info(delayed)")}:
            try:
                db.execute("ALTER TABLE delayed ADD COLUMN publisher TEXT")     # before delayed messages kept it
            except sqlite3.OperationalError as exc:    # another worker of the host added it a moment ago
                if "duplicate column name" not in str(exc):
                    raise
        try:
            db.execute("BEGIN IMMEDIATE")            # several nodes may open one file at once
            try:
                _upgrade(db, self.path)
                db.execute("COMMIT")
            except BaseException:
                _rollback(db)
                raise
        except BaseException:
            db.close()
            raise
        self.db = db

    def _close(self):
        if self.db is not None:
            self.db.close()
            self.db = None

    def _apply(self, ops):
        db = self.db
        numbered: list = []                  # the entries this attempt gave numbers to
        db.execute("BEGIN IMMEDIATE")
        try:
            appends, states, deletes = [], [], []
            queue = (appends, states, deletes, numbered, self._sids)
            append, delete = appends.append, deletes.append
            run = None                           # the run of another kind being gathered
            for op in ops:
                # by kind, in runs of one kind (groupby's runs, without an iterator per run: under
                # load a batch is appends and deletes interleaved, often one by one)
                kind = op[0]
                if kind == "q" or kind == "q_del" or kind == "q_state":
                    if run is not None:          # (a session operation first: it creates the queue)
                        _apply_run(db, run, queue)
                        run = None
                    if kind == "q":
                        append(op)
                    elif kind == "q_del":
                        delete(op)
                    else:
                        states.append(op)
                elif run is not None and kind == run[0][0]:
                    run.append(op)
                else:
                    if run is not None:
                        _apply_run(db, run, queue)
                    run = [op]
            if run is not None:
                _apply_run(db, run, queue)
            _apply_queue(db, queue)
            db.execute("COMMIT")
        except BaseException:
            # first (whatever the rollback does): the counters went back, so the numbers this
            # attempt gave its entries and its sessions will be given again
            for op in numbered:
                op[3].seq = 0
            self._sids.clear()
            _rollback(db)
            raise

    def _load(self):
        return _snapshot(self.db, self._read_all)

    def _load_session(self, tenant, client_id):
        return _snapshot(self.db, self._read_session, tenant, client_id)

    def _session_keys(self, after, limit):
        # keyset pagination on the primary key (tenant, client_id): each page one range of its index
        if after is None:
            rows = self.db.execute("SELECT tenant, client_id FROM sessions ORDER BY tenant, client_id LIMIT ?",
                                   (limit,))
        else:
            rows = self.db.execute("SELECT tenant, client_id FROM sessions WHERE (tenant, client_id) > (?, ?) "
                                   "ORDER BY tenant, client_id LIMIT ?", (after[0], after[1], limit))
        return [(t, c) for t, c in rows]

    def _read_all(self):
        db = self.db
        sessions = {}
        numbered = {}                        # session number -> its record
        for t, c, exp, disc, will, due, device, number, sent in db.execute(
                f"SELECT tenant, client_id, expiry_interval, disconnected_at, will, will_due, device, sid, {SENT} "
                "FROM sessions"):
            rec = sessions[(t, c)] = SessionRecord(t, c, exp, disc, unpack_will(will), due, device=device,
                                                   sent=sent)
            if number is not None:
                numbered[number] = rec
        for t, c, f, qos, nl, rap, rh, sid in db.execute("SELECT * FROM subscriptions"):
            rec = sessions.get((t, c))
            if rec is not None:
                rec.subscriptions.append(SubscriptionRecord(f, qos, bool(nl), bool(rap), rh, sid))
        for row in db.execute(f"SELECT sid, {ENTRY} FROM entries ORDER BY seq"):
            rec = numbered.get(row[0])
            if rec is not None:
                rec.queue.append(_entry(row[1:]))
        for t, c, pid in db.execute("SELECT * FROM awaiting_rel"):
            rec = sessions.get((t, c))
            if rec is not None:
                rec.awaiting_rel.add(pid)
        retained = [(t, topic, StoredMessage(topic, payload, qos, True, unpack_props(props), exp))
                    for t, topic, payload, qos, props, exp in db.execute("SELECT * FROM retained")]
        return list(sessions.values()), retained

    def _load_retained(self):
        return [(t, topic, StoredMessage(topic, payload, qos, True, unpack_props(props), exp))
                for t, topic, payload, qos, props, exp in self.db.execute("SELECT * FROM retained")]

    def _read_session(self, tenant, client_id):
        db = self.db
        key = (tenant, client_id)
        row = db.execute("SELECT tenant, client_id, expiry_interval, disconnected_at, will, will_due, device, sid, "
                         f"{SENT} FROM sessions WHERE tenant = ? AND client_id = ?", key).fetchone()
        if row is None:
            return None
        rec = SessionRecord(row[0], row[1], row[2], row[3], unpack_will(row[4]), row[5], device=row[6],
                            sent=row[8])
        for _, _, f, qos, nl, rap, rh, sid in db.execute(
                "SELECT * FROM subscriptions WHERE tenant = ? AND client_id = ?", key):
            rec.subscriptions.append(SubscriptionRecord(f, qos, bool(nl), bool(rap), rh, sid))
        if row[7] is not None:
            rec.queue = [_entry(r) for r in db.execute(
                f"SELECT {ENTRY} FROM entries WHERE sid = ? ORDER BY seq", (row[7],))]
        rec.awaiting_rel = {r[0] for r in db.execute(
            "SELECT pid FROM awaiting_rel WHERE tenant = ? AND client_id = ?", key)}
        return rec

    def _purge(self, now):
        db = self.db
        self._sids.clear()                   # (sessions it deletes; and another node's, which may be back)
        db.execute("BEGIN IMMEDIATE")
        try:
            gone = db.execute(
                "SELECT tenant, client_id FROM sessions WHERE disconnected_at IS NOT NULL "
                "AND expiry_interval != 4294967295 AND disconnected_at + expiry_interval <= ?", (now,)).fetchall()
            n = _delete_sessions(db, gone)
            # (a QoS 2 delivery stays: it may have been sent, and its receiver holds its packet id until
            # the flow ends -- it goes when acknowledged, or dropped unsent, as the broker decides)
            n += db.execute("DELETE FROM entries WHERE expiry_at IS NOT NULL AND expiry_at <= ? AND qos < 2",
                            (now,)).rowcount
            n += db.execute("DELETE FROM retained WHERE expiry_at IS NOT NULL AND expiry_at <= ?", (now,)).rowcount
            for table in ("subscriptions", "awaiting_rel"):
                n += db.execute(f"DELETE FROM {table} WHERE NOT EXISTS (SELECT 1 FROM sessions s WHERE "
                                f"s.tenant = {table}.tenant AND s.client_id = {table}.client_id)").rowcount
            n += db.execute("DELETE FROM entries WHERE NOT EXISTS (SELECT 1 FROM sessions s WHERE "
                            "s.sid = entries.sid)").rowcount
            db.execute("COMMIT")
        except BaseException:
            _rollback(db)
            raise
        return n

    def _ping(self):
        self.db.execute("SELECT 1").fetchone()

    # delayed messages: the due index bounds a claim to the rows due (``LIMIT``); a claim is one
    # write transaction, so nodes sharing the file never hold the same row in one lease

    def _delayed_add(self, items):
        self._tx(lambda db: db.executemany(
            "INSERT OR REPLACE INTO delayed (id, tenant, due, topic, payload, qos, retain, props, owner, lease, "
            "publisher) VALUES (?, ?, ?, ?, ?, ?, ?, ?, NULL, NULL, ?)",
            [(m.id, m.tenant, m.due, m.msg.topic, m.msg.payload, m.msg.qos, int(m.msg.retain),
              pack_props(m.msg.properties), pack_publisher(m.publisher)) for m in items]))

    def _delayed_claim(self, now, owner, until, limit):
        def claim(db):
            rows = db.execute("SELECT id, tenant, due, topic, payload, qos, retain, props, publisher FROM delayed "
                              "WHERE due <= ? AND (lease IS NULL OR lease <= ?) ORDER BY due, id LIMIT ?",
                              (now, now, limit)).fetchall()
            db.executemany("UPDATE delayed SET owner = ?, lease = ? WHERE id = ?", [(owner, until, r[0]) for r in rows])
            return [DelayedMessage(i, t, due, StoredMessage(topic, payload, qos, bool(retain), unpack_props(props)),
                                   unpack_publisher(publisher))
                    for i, t, due, topic, payload, qos, retain, props, publisher in rows]
        return self._tx(claim)

    def _delayed_done(self, items):
        self._tx(lambda db: db.executemany("DELETE FROM delayed WHERE id = ?", [(m.id,) for m in items]))

    def _delayed_purge(self, tenant):
        return self._tx(lambda db: db.execute("DELETE FROM delayed WHERE tenant = ?", (tenant,)).rowcount)

    def _delayed_counts(self):
        return dict(self.db.execute("SELECT tenant, count(*) FROM delayed GROUP BY tenant").fetchall())

    def _tx(self, fn):
        db = self.db
        db.execute("BEGIN IMMEDIATE")
        try:
            out = fn(db)
            db.execute("COMMIT")
        except BaseException:
            _rollback(db)
            raise
        return out

    def _get_meta(self, key):
        row = self.db.execute("SELECT value FROM blobs WHERE key = ?", (key,)).fetchone()
        return bytes(row[0]) if row else None

    def _put_meta(self, key, value):
        self.db.execute("INSERT OR REPLACE INTO blobs VALUES (?, ?)", (key, bytes(value)))


def _snapshot(db, fn, *args):
    """``fn(*args)``'s reads in one read transaction: the sessions and the entries they number
    as of one moment, whatever another node sharing the file commits meanwhile."""
    db.execute("BEGIN")
    try:
        return fn(*args)
    finally:
        _rollback(db)


def _rollback(db) -> None:
    """Roll the transaction back -- unless SQLite already has: on some errors (disk full,
    I/O) it rolls the whole transaction back itself, and a ROLLBACK then raises "no
    transaction is active" in place of the error that matters."""
    if db.in_transaction:
        db.execute("ROLLBACK")


_SESSION_KINDS = frozenset(("session", "session_del"))


def _apply_run(db, run: list, queue: tuple) -> None:
    """A run of operations of one kind other than the queue's, in one ``executemany``."""
    kind = run[0][0]
    if kind in _SESSION_KINDS:
        _apply_queue(db, queue)           # what the session operation applies to comes first
    if kind == "session_del":
        keys = [op[1:3] for op in run]
        _delete_sessions(db, keys)
        sids = queue[4]
        for key in keys:
            sids.pop(key, None)
    else:
        db.executemany(_SQL[kind], [_params(op) for op in run])


def _delete_sessions(db, keys: list) -> int:
    """Delete these sessions (tenant, client id), their entries first (found by their
    number) -> the rows deleted."""
    n = db.executemany(f"DELETE FROM entries WHERE sid = {SESSION_SID}", keys).rowcount
    for table in _SESSION_TABLES:
        n += db.executemany(f"DELETE FROM {table} WHERE tenant = ? AND client_id = ?", keys).rowcount
    return n


def _apply_queue(db, queue: tuple[list, list, list, list, dict]) -> None:
    """The queue operations gathered since the last session operation, emptied:
    appends, then state changes, then deletes -- an entry is appended before
    its state changes or its delete, whatever their order in the batch. (An
    append always takes a number no row has had, so no earlier state change or
    delete can name it; one of a number no row has -- seq 0 included -- changes
    nothing, in any order.)"""
    appends, states, deletes, numbered, sids = queue
    if appends:
        rows, plain, q1, expected = _append_rows(db, appends, _number(db, appends, numbered), sids)
        written = 0
        if q1:
            written += _many(db, _q1_appends, q1, 5)
        if plain:
            written += _many(db, _plain_appends, plain, 10)
        if rows:
            written += db.executemany(_SQL["q"], rows).rowcount
        if written != expected:
            _rewrite(db, appends, sids)
        appends.clear()
    if states:
        db.executemany(_SQL["q_state"], [(op[3].state, op[3].seq) for op in states])
        states.clear()
    if deletes:
        _many(db, _deletes, [op[3].seq for op in deletes], 1)
        deletes.clear()


# Multi-row statements. ``executemany`` runs its statement once per row: each run opens
# its cursors, binds, steps, halts and resets -- for the queue's append and delete, half
# of SQLite's work per message. One statement of k rows runs that once per k rows; its
# text is made for k in chunks of 64 and the binary digits of the rest (64, 32, ..., 1):
# a few statements, each prepared once (the connection's statement cache).
CHUNK = 64


# an append's guard: its session exists (found by its number: ``sessions_sid``)
_GUARD = "WHERE EXISTS (SELECT 1 FROM sessions s WHERE s.sid = v.column2)"


def _plain_appends(k: int) -> str:
    """The append of ``k`` entries without properties, only for sessions that exist (``_GUARD``)."""
    return ("INSERT OR REPLACE INTO entries SELECT v.column1, v.column2, v.column3, v.column4, v.column5, "
            "v.column6, NULL, NULL, v.column7, v.column8, NULL, NULL, v.column9, v.column10 FROM (VALUES "
            + ", ".join(["(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"] * k) + ") AS v " + _GUARD)


def _q1_appends(k: int) -> str:
    """The append of ``k`` plain entries of the usual kind: a QoS 1 message, not retained,
    delivered at QoS 1 without the retain flag, its PUBLISH owed -- those five values are
    the statement's constants, not bound for each row (``_plain_appends`` otherwise)."""
    return ("INSERT OR REPLACE INTO entries SELECT v.column1, v.column2, v.column3, v.column4, 1, 0, "
            "NULL, NULL, 1, 0, NULL, NULL, v.column5, 0 FROM (VALUES "
            + ", ".join(["(?, ?, ?, ?, ?)"] * k) + ") AS v " + _GUARD)


def _deletes(k: int) -> str:
    """The delete of ``k`` queue entries by number: rowids, each found at once. (Its
    number is the entry's alone in the file: the counter never gives one twice, and an
    entry whose batch failed was set back to 0, which no row has.)"""
    return "DELETE FROM entries WHERE seq IN (" + ", ".join(["?"] * k) + ")"


_TEXTS: dict = {}


def _many(db, make, values: list, width: int) -> int:
    """Run ``make(k)`` over ``values`` (``width`` a row, flat), ``CHUNK`` rows a statement at
    most -> the rows they changed."""
    rows = len(values) // width
    at = 0
    changed = 0
    while rows:
        k = CHUNK if rows >= CHUNK else 1 << (rows.bit_length() - 1)
        sql = _TEXTS.get((make, k))
        if sql is None:
            sql = _TEXTS[(make, k)] = make(k)
        changed += db.execute(sql, values[at:at + k * width]).rowcount
        at += k * width
        rows -= k
    return changed


def _append_rows(db, appends: list, seq: int, sids: dict) -> tuple[list, list, list, int]:
    """Number the appended entries ``seq + 1``, ``seq + 2``, ... in order (``entry.seq``),
    each row naming its session by the session's number -> (rows of the "q" statement; the
    values of ``_plain_appends``' rows one after the other: entries without properties,
    expiry, subscription ids or share group -- nearly all -- bound without their NULLs; the
    values of ``_q1_appends``' rows: the plain ones that are QoS 1 throughout, not
    retained, their PUBLISH owed -- bound without their constants; how many rows should
    be written: those of sessions that exist). One pass over the batch's appends."""
    rows, plain, q1 = [], [], []
    add = plain.extend
    add1 = q1.extend
    get = sids.get
    expected = len(appends)
    for op in appends:
        e = op[3]
        seq += 1
        e.seq = seq
        sid = get((op[1], op[2]))
        if sid is None:
            sid = _sid(db, sids, op[1], op[2])
            if not sid:
                expected -= 1            # no such session: numbered, not written (the guard)
        m = e.msg
        props, ids, share, expiry = m.properties, e.sub_ids, e.share, m.expiry_at
        if props or ids or share or expiry is not None:
            rows.append(_row(e, sid))
        elif e.qos == 1 and m.qos == 1 and not (m.retain or e.retain or e.state):
            add1((seq, sid, m.topic, m.payload, e.pid))
        else:
            add((seq, sid, m.topic, m.payload, m.qos, 1 if m.retain else 0, e.qos,
                 1 if e.retain else 0, e.pid, e.state))
    return rows, plain, q1, expected


def _row(e: QueueEntry, sid: int) -> tuple:
    """The values of the "q" statement for an entry of the session numbered ``sid``."""
    m = e.msg
    props, ids, share = m.properties, e.sub_ids, e.share
    return (e.seq, sid, m.topic, m.payload, m.qos, 1 if m.retain else 0,
            pack_props(props) if props else None, m.expiry_at, e.qos, 1 if e.retain else 0,
            pack_ids(ids) if ids else None, pack_share(share) if share else None, e.pid, e.state)


def _rewrite(db, appends: list, sids: dict) -> None:
    """Some of the appends just made were refused by their guard although their session was
    thought to exist: another node sharing the file deleted it (perhaps made it again, with
    another number) since this thread read its number. Each append not written is written
    under its session's number as the file has it now -- unless that session is gone (the
    entry is not written, as for any session that no longer exists)."""
    sids.clear()
    for op in appends:
        e = op[3]
        if db.execute("SELECT 1 FROM entries WHERE seq = ?", (e.seq,)).fetchone() is not None:
            continue
        sid = _sid(db, sids, op[1], op[2])
        if sid:
            db.execute(_SQL["q"], _row(e, sid))


def _sid(db, sids: dict, tenant: str, client_id: str) -> int:
    """The session's number, read from the file (given now if it has none: the file's
    counter, never given twice) and remembered -> 0 if there is no such session."""
    row = db.execute("SELECT sid FROM sessions WHERE tenant = ? AND client_id = ?", (tenant, client_id)).fetchone()
    if row is None:
        return 0
    sid = row[0]
    if sid is None:
        sid = db.execute(_SQL["sid"]).fetchone()[0]
        db.execute("UPDATE sessions SET sid = ? WHERE tenant = ? AND client_id = ?", (sid, tenant, client_id))
    sids[(tenant, client_id)] = sid
    return sid


def _number(db, run: list, numbered: list) -> int:
    """Take numbers for the appended entries from the file's counter, inside the
    batch's transaction: ordered across the nodes that share the file, never
    reused -> the number before the first (``_append_rows`` gives them out).
    The operations go on ``numbered`` (their entries reset if the batch fails).
    (An entry of a session that no longer exists is numbered too, and not written.)"""
    n = len(run)
    last = db.execute(_SQL["seq"], (n,)).fetchone()[0]
    numbered += run
    return last - n


def _wal(db, timeout: float = 30.0) -> None:
    """Switch the file to WAL. Changing the journal mode does not wait on the
    busy handler: when several nodes (a host's workers) open a new file at
    once, all but one are told "database is locked" at once. Retried here for
    as long as the connection's own busy timeout."""
    deadline = time.monotonic() + timeout
    delay = 0.005
    while True:
        try:
            db.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc) or time.monotonic() >= deadline:
                raise
        time.sleep(delay)
        delay = min(delay * 2, 0.25)


def _check_version(db, path: str) -> str | None:
    row = db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
    version = None if row is None else row[0]
    if version not in KNOWN:
        raise StoreError(f"{path}: schema version {version}, this brokerd knows 1, 2, 3 and {SCHEMA_VERSION} -- written "
                         f"by a newer brokerd? (a file is upgraded when opened, never downgraded)")
    return version


def _upgrade(db, path: str) -> None:
    """Mark a new file with the schema, upgrade one of schema 1 (numbered per
    session), 2 (numbers not the rowid) or 3 (rows naming their session by
    tenant and client id), refuse any other. In the caller's transaction
    (another node may be opening the file too)."""
    version = _check_version(db, path)
    if version == SCHEMA_VERSION and db.execute("SELECT 1 FROM counters WHERE name = ?", (COUNTER,)).fetchone():
        return
    row = db.execute("SELECT value FROM counters WHERE name = ?", (COUNTER,)).fetchone()
    start = row[0] if row else 0
    columns = {r[1] for r in db.execute("PRAGMA table_info(sessions)")}
    if "last_seq" in columns:
        # schema 1: numbered per session, up to last_seq (past the rows of entries since deleted);
        # renamed (the old queue goes too): a schema-1 brokerd still running on the file fails its next append
        start = max(start, db.execute("SELECT coalesce(max(last_seq), 0) FROM sessions").fetchone()[0])
        db.execute("ALTER TABLE sessions RENAME COLUMN last_seq TO last_seq_v1")
    if "sid" not in columns:
        db.execute("ALTER TABLE sessions ADD COLUMN sid INTEGER")
    db.execute("CREATE UNIQUE INDEX IF NOT EXISTS sessions_sid ON sessions (sid)")
    old = bool(db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'queue'").fetchone())
    if not db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'entries'").fetchone():
        db.execute(ENTRIES)
        for ddl in ENTRIES_INDEXES:
            db.execute(ddl)
    if old:
        # schema 1, 2 or 3: each session with entries is numbered (in the order of their keys),
        # its entries numbered again past every number the file gave (schema 1 numbered each
        # session from 1), in the order of its queue, as rowids; the entries of sessions that
        # no longer exist (never loaded) are left behind
        start = max(start, db.execute("SELECT coalesce(max(seq), 0) FROM queue").fetchone()[0])
        db.execute(
            "UPDATE sessions SET sid = n.r FROM (SELECT s.tenant, s.client_id, "
            "row_number() OVER (ORDER BY s.tenant, s.client_id) AS r FROM sessions s WHERE EXISTS "
            "(SELECT 1 FROM queue q WHERE q.tenant = s.tenant AND q.client_id = s.client_id)) AS n "
            "WHERE sessions.tenant = n.tenant AND sessions.client_id = n.client_id")
        moved = db.execute(
            f"INSERT INTO entries (sid, {ENTRY}) SELECT s.sid, "
            f"? + row_number() OVER (ORDER BY q.tenant, q.client_id, q.seq), q.topic, q.payload, q.msg_qos, "
            f"q.msg_retain, q.props, q.expiry_at, q.qos, q.retain, q.sub_ids, q.share, q.pid, q.state "
            f"FROM queue q JOIN sessions s ON s.tenant = q.tenant AND s.client_id = q.client_id",
            (start,)).rowcount
        start += max(moved, 0)
        db.execute("DROP TABLE queue")
    sids = db.execute("SELECT coalesce(max(sid), 0) FROM sessions").fetchone()[0]
    db.execute("INSERT OR REPLACE INTO counters VALUES (?, ?)", (SID_COUNTER, sids))
    db.execute("INSERT OR REPLACE INTO counters VALUES (?, ?)", (COUNTER, start))
    db.execute("INSERT OR REPLACE INTO meta VALUES ('schema', ?)", (SCHEMA_VERSION,))


def _entry(row) -> QueueEntry:
    (seq, topic, payload, mqos, mretain, props, exp, qos, retain, ids, share, pid, state) = row
    msg = StoredMessage(topic, payload, mqos, bool(mretain), unpack_props(props), exp)
    return QueueEntry(seq, msg, qos, bool(retain), unpack_ids(ids), unpack_share(share), pid, state)
