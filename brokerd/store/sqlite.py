"""``sqlite:///PATH``: the embedded default, one file on the node.

SQLAlchemy's URL convention: ``sqlite:///var/brokerd.db`` is relative to the
working directory, ``sqlite:////srv/brokerd.db`` absolute. Query options:
``synchronous=normal|full`` (default ``normal``: with WAL, every committed
batch survives a crash of the process -- SIGKILL included; ``full`` also
survives a power cut, at the cost of an fsync per batch).

Each journal batch is one transaction; runs of operations of the same kind
go through ``executemany``.
"""

import os
import sqlite3
from itertools import groupby
from urllib.parse import parse_qs, urlsplit

from .base import DATA_ERRORS, Store, StoreError
from .records import (
    QueueEntry,
    SessionRecord,
    StoredMessage,
    SubscriptionRecord,
    pack_ids,
    pack_props,
    pack_share,
    unpack_ids,
    unpack_props,
    unpack_share,
    unpack_will,
)

SCHEMA_VERSION = "1"

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS blobs (key TEXT PRIMARY KEY, value BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS sessions (
    tenant TEXT NOT NULL, client_id TEXT NOT NULL, expiry_interval INTEGER NOT NULL,
    disconnected_at REAL, will BLOB, will_due REAL, last_seq INTEGER NOT NULL DEFAULT 0, device TEXT,
    PRIMARY KEY (tenant, client_id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS subscriptions (
    tenant TEXT NOT NULL, client_id TEXT NOT NULL, filter TEXT NOT NULL,
    qos INTEGER NOT NULL, no_local INTEGER NOT NULL, rap INTEGER NOT NULL, rh INTEGER NOT NULL, sub_id INTEGER,
    PRIMARY KEY (tenant, client_id, filter)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS queue (
    tenant TEXT NOT NULL, client_id TEXT NOT NULL, seq INTEGER NOT NULL,
    topic TEXT NOT NULL, payload BLOB NOT NULL, msg_qos INTEGER NOT NULL, msg_retain INTEGER NOT NULL,
    props BLOB, expiry_at REAL,
    qos INTEGER NOT NULL, retain INTEGER NOT NULL, sub_ids TEXT, share TEXT, pid INTEGER NOT NULL,
    state INTEGER NOT NULL);
CREATE UNIQUE INDEX IF NOT EXISTS queue_key ON queue (tenant, client_id, seq);
CREATE INDEX IF NOT EXISTS queue_expiry ON queue (expiry_at) WHERE expiry_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS awaiting_rel (
    tenant TEXT NOT NULL, client_id TEXT NOT NULL, pid INTEGER NOT NULL,
    PRIMARY KEY (tenant, client_id, pid)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS retained (
    tenant TEXT NOT NULL, topic TEXT NOT NULL, payload BLOB NOT NULL, qos INTEGER NOT NULL,
    props BLOB, expiry_at REAL,
    PRIMARY KEY (tenant, topic));
"""

_SQL = {
    "session": "INSERT INTO sessions (tenant, client_id, expiry_interval, disconnected_at, will, will_due, device) "
               "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (tenant, client_id) DO UPDATE SET "
               "expiry_interval = excluded.expiry_interval, disconnected_at = excluded.disconnected_at, "
               "will = excluded.will, will_due = excluded.will_due, device = excluded.device",
    # subscriptions and packet ids only for sessions that exist
    "sub": "INSERT OR REPLACE INTO subscriptions SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8 "
           "WHERE EXISTS (SELECT 1 FROM sessions WHERE tenant = ?1 AND client_id = ?2)",
    "unsub": "DELETE FROM subscriptions WHERE tenant = ? AND client_id = ? AND filter = ?",
    "q": "INSERT OR REPLACE INTO queue VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    "q_state": "UPDATE queue SET state = ? WHERE tenant = ? AND client_id = ? AND seq = ?",
    "seq": "UPDATE sessions SET last_seq = last_seq + ? WHERE tenant = ? AND client_id = ? RETURNING last_seq",
    "q_del": "DELETE FROM queue WHERE tenant = ? AND client_id = ? AND seq = ?",
    "rel": "INSERT OR IGNORE INTO awaiting_rel SELECT ?1, ?2, ?3 "
           "WHERE EXISTS (SELECT 1 FROM sessions WHERE tenant = ?1 AND client_id = ?2)",
    "rel_del": "DELETE FROM awaiting_rel WHERE tenant = ? AND client_id = ? AND pid = ?",
    "retain": "INSERT OR REPLACE INTO retained VALUES (?, ?, ?, ?, ?, ?)",
    "retain_del": "DELETE FROM retained WHERE tenant = ? AND topic = ?",
}

_SESSION_TABLES = ("sessions", "subscriptions", "queue", "awaiting_rel")


def _params(op: tuple) -> tuple:
    kind = op[0]
    if kind == "session":
        return op[1:8] if len(op) > 7 else (*op[1:7], None)
    if kind == "sub":
        s = op[3]
        return (op[1], op[2], s.filter, s.qos, int(s.no_local), int(s.rap), s.rh, s.sub_id)
    if kind == "q":
        e = op[3]
        m = e.msg
        return (op[1], op[2], e.seq, m.topic, m.payload, m.qos, int(m.retain), pack_props(m.properties), m.expiry_at,
                e.qos, int(e.retain), pack_ids(e.sub_ids), pack_share(e.share), e.pid, e.state)
    if kind == "q_state":
        return (op[3].state, op[1], op[2], op[3].seq)
    if kind == "q_del":
        return (op[1], op[2], op[3].seq)
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

    def _open(self):
        directory = os.path.dirname(self.path)
        if directory:
            os.makedirs(directory, exist_ok=True)
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=30)
        db.execute("PRAGMA journal_mode = WAL")
        db.execute(f"PRAGMA synchronous = {self.synchronous}")
        db.execute("PRAGMA busy_timeout = 30000")
        db.executescript(SCHEMA)
        columns = {row[1] for row in db.execute("PRAGMA table_info(sessions)")}
        if "device" not in columns:          # files written before sessions kept their device
            db.execute("ALTER TABLE sessions ADD COLUMN device TEXT")
        row = db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
        if row is None:
            db.execute("INSERT INTO meta VALUES ('schema', ?)", (SCHEMA_VERSION,))
        elif row[0] != SCHEMA_VERSION:
            raise StoreError(f"{self.path}: schema version {row[0]}, this brokerd writes {SCHEMA_VERSION}")
        self.db = db

    def _close(self):
        if self.db is not None:
            self.db.close()
            self.db = None

    def _apply(self, ops):
        db = self.db
        db.execute("BEGIN IMMEDIATE")
        try:
            for kind, run in groupby(ops, key=lambda op: op[0]):
                if kind == "session_del":
                    keys = [op[1:3] for op in run]
                    for table in _SESSION_TABLES:
                        db.executemany(f"DELETE FROM {table} WHERE tenant = ? AND client_id = ?", keys)
                elif kind == "q":
                    run = list(run)
                    _number(db, run)
                    db.executemany(_SQL[kind], [_params(op) for op in run if op[3].seq])
                else:
                    db.executemany(_SQL[kind], [_params(op) for op in run])
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def _load(self):
        db = self.db
        sessions = {}
        for t, c, exp, disc, will, due, last, device in db.execute(
                "SELECT tenant, client_id, expiry_interval, disconnected_at, will, will_due, last_seq, device "
                "FROM sessions"):
            sessions[(t, c)] = SessionRecord(t, c, exp, disc, unpack_will(will), due, last_seq=last, device=device)
        for t, c, f, qos, nl, rap, rh, sid in db.execute("SELECT * FROM subscriptions"):
            rec = sessions.get((t, c))
            if rec is not None:
                rec.subscriptions.append(SubscriptionRecord(f, qos, bool(nl), bool(rap), rh, sid))
        for row in db.execute("SELECT * FROM queue ORDER BY tenant, client_id, seq"):
            rec = sessions.get((row[0], row[1]))
            if rec is not None:
                rec.queue.append(_entry(row))
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

    def _load_session(self, tenant, client_id):
        db = self.db
        key = (tenant, client_id)
        row = db.execute("SELECT tenant, client_id, expiry_interval, disconnected_at, will, will_due, last_seq, device "
                         "FROM sessions WHERE tenant = ? AND client_id = ?", key).fetchone()
        if row is None:
            return None
        rec = SessionRecord(row[0], row[1], row[2], row[3], unpack_will(row[4]), row[5], last_seq=row[6],
                            device=row[7])
        for _, _, f, qos, nl, rap, rh, sid in db.execute(
                "SELECT * FROM subscriptions WHERE tenant = ? AND client_id = ?", key):
            rec.subscriptions.append(SubscriptionRecord(f, qos, bool(nl), bool(rap), rh, sid))
        rec.queue = [_entry(r) for r in db.execute(
            "SELECT * FROM queue WHERE tenant = ? AND client_id = ? ORDER BY seq", key)]
        rec.awaiting_rel = {r[0] for r in db.execute(
            "SELECT pid FROM awaiting_rel WHERE tenant = ? AND client_id = ?", key)}
        return rec

    def _purge(self, now):
        db = self.db
        db.execute("BEGIN IMMEDIATE")
        try:
            gone = db.execute(
                "SELECT tenant, client_id FROM sessions WHERE disconnected_at IS NOT NULL "
                "AND expiry_interval != 4294967295 AND disconnected_at + expiry_interval <= ?", (now,)).fetchall()
            n = 0
            for table in _SESSION_TABLES:
                n += db.executemany(f"DELETE FROM {table} WHERE tenant = ? AND client_id = ?", gone).rowcount
            n += db.execute("DELETE FROM queue WHERE expiry_at IS NOT NULL AND expiry_at <= ?", (now,)).rowcount
            n += db.execute("DELETE FROM retained WHERE expiry_at IS NOT NULL AND expiry_at <= ?", (now,)).rowcount
            for table in ("subscriptions", "queue", "awaiting_rel"):
                n += db.execute(f"DELETE FROM {table} WHERE NOT EXISTS (SELECT 1 FROM sessions s WHERE "
                                f"s.tenant = {table}.tenant AND s.client_id = {table}.client_id)").rowcount
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return n

    def _ping(self):
        self.db.execute("SELECT 1").fetchone()

    def _get_meta(self, key):
        row = self.db.execute("SELECT value FROM blobs WHERE key = ?", (key,)).fetchone()
        return bytes(row[0]) if row else None

    def _put_meta(self, key, value):
        self.db.execute("INSERT OR REPLACE INTO blobs VALUES (?, ?)", (key, bytes(value)))


def _number(db, run: list) -> None:
    """Give the appended entries their sequence numbers from their sessions'
    counters, inside the batch's transaction (so concurrent writers of one
    queue -- several nodes on one file -- never collide and stay ordered).
    Entries of sessions that no longer exist keep seq 0 and are not written."""
    counts: dict[tuple, list] = {}
    for op in run:
        counts.setdefault((op[1], op[2]), []).append(op[3])
    for (tenant, cid), entries in counts.items():
        row = db.execute(_SQL["seq"], (len(entries), tenant, cid)).fetchone()
        if row is None:
            for e in entries:
                e.seq = 0
            continue
        first = row[0] - len(entries) + 1
        for i, e in enumerate(entries):
            e.seq = first + i


def _entry(row) -> QueueEntry:
    (_, _, seq, topic, payload, mqos, mretain, props, exp, qos, retain, ids, share, pid, state) = row
    msg = StoredMessage(topic, payload, mqos, bool(mretain), unpack_props(props), exp)
    return QueueEntry(seq, msg, qos, bool(retain), unpack_ids(ids), unpack_share(share), pid, state)
