"""``hbase://HOST:PORT?table_prefix=NAME``: HBase through its Thrift gateway.

Tables (``NAME_`` prefix, created when missing):

``sessions``  row ``tenant\\0client_id``; families ``s`` (expiry, disconnected
              at, will, will due), ``f`` (one column per subscription filter),
              ``r`` (incoming QoS 2 packet ids awaiting PUBREL).
``counters``  same row key; ``c:seq``, the session's queue sequence, advanced
              with ``atomicIncrement`` -- once per batch and queue, by the
              number of messages appended -- so several nodes appending to
              one queue never collide, and a publisher's messages (committed
              in order by the node it is connected to) stay in order. It is
              never deleted with the session, so queue row keys are never
              reused (HBase delete markers would hide a re-used key).
``queue``     row ``salt . reversed(client_id) \\0 tenant \\0 seq(8 bytes)``: a
              session's queue is one contiguous range (scanned in bounded
              batches, deleted by key once acknowledged), while the salt
              (``crc32 % 64``) and the reversed client id spread sessions --
              ``sensor-0001``, ``sensor-0002`` -- over regions.
``retained``  row ``tenant\\0topic``; family ``m``.

Query options: ``table_prefix`` (default ``brokerd``), ``timeout`` (ms,
default 10000), ``transport`` (``buffered`` | ``framed``), ``protocol``
(``binary`` | ``compact``), matching the gateway's settings.

HBase masks a put by a delete marker with the same millisecond timestamp.
Operations of a batch are folded per row first, row deletes are sent before
puts, and a row this store deleted less than 2 ms ago is not written again
before those 2 ms have passed. (On HBase 2 with ``NEW_VERSION_BEHAVIOR``
families the wait is unnecessary but harmless.)
"""

import time
import zlib
from collections import defaultdict
from urllib.parse import parse_qs, urlsplit

from .base import Store
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

FAMILIES = {
    "sessions": {"s": {"max_versions": 1}, "f": {"max_versions": 1}, "r": {"max_versions": 1}},
    "counters": {"c": {"max_versions": 1}},
    "queue": {"m": {"max_versions": 1}},
    "retained": {"m": {"max_versions": 1}},
}
SCAN_BATCH = 1000
DELETE_GUARD = 0.002          # seconds between deleting a row and writing it again


def session_key(tenant: str, client_id: str) -> bytes:
    return tenant.encode() + b"\0" + client_id.encode()


def queue_prefix(tenant: str, client_id: str) -> bytes:
    salt = zlib.crc32(session_key(tenant, client_id)) % 64
    return bytes((salt,)) + client_id[::-1].encode() + b"\0" + tenant.encode() + b"\0"


def _split_key(key: bytes) -> tuple[str, str]:
    tenant, _, cid = key.partition(b"\0")
    return tenant.decode(), cid.decode()


def _split_queue_key(key: bytes) -> tuple[str, str, int]:
    """salt . reversed(cid) \\0 tenant \\0 seq -> (tenant, cid, seq)"""
    rcid, _, tenant = key[1:-9].partition(b"\0")
    return tenant.decode(), rcid.decode()[::-1], int.from_bytes(key[-8:], "big")


def _num(v) -> str:
    return repr(v).encode() if isinstance(v, float) else str(v).encode()


class _Row:
    """The folded effect of a batch on one row."""

    __slots__ = ("delete", "puts", "dels")

    def __init__(self):
        self.delete = False
        self.puts: dict[bytes, bytes] = {}
        self.dels: set[bytes] = set()

    def put(self, col: bytes, value: bytes) -> None:
        self.puts[col] = value
        self.dels.discard(col)

    def remove(self, col: bytes) -> None:
        self.puts.pop(col, None)
        if not self.delete:
            self.dels.add(col)

    def drop(self) -> None:
        self.delete = True
        self.puts.clear()
        self.dels.clear()


class HBaseStore(Store):
    scheme = "hbase"
    remote = True

    def __init__(self, url: str):
        super().__init__(url)
        parts = urlsplit(url)
        if parts.scheme != "hbase" or not parts.hostname:
            raise ValueError(f"bad store URL {url!r}: expected hbase://HOST:PORT?table_prefix=NAME")
        self.host = parts.hostname
        self.port = parts.port or 9090
        opts = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        self.prefix = opts.pop("table_prefix", "brokerd")
        self.timeout = int(opts.pop("timeout", "10000"))
        self.transport = opts.pop("transport", "buffered")
        self.protocol = opts.pop("protocol", "binary")
        if opts:
            raise ValueError(f"bad store URL {url!r}: unknown option(s) {', '.join(opts)}")
        self.pool = None
        self._recent: dict[tuple, float] = {}     # (table, row) -> monotonic time of our delete

    # ---------------------------------------------------------- connection

    def _open(self):
        import happybase

        self.pool = happybase.ConnectionPool(1, host=self.host, port=self.port, table_prefix=self.prefix,
                                             timeout=self.timeout, transport=self.transport,
                                             protocol=self.protocol, autoconnect=False)
        with self.pool.connection() as conn:
            existing = {t.decode() if isinstance(t, bytes) else t for t in conn.tables()}
            for name, families in FAMILIES.items():
                if name not in existing:
                    try:
                        conn.create_table(name, families)
                    except Exception as exc:     # created meanwhile by another node
                        if "exists" not in str(exc).lower():
                            raise

    def _close(self):
        self.pool = None

    def _ping(self):
        with self.pool.connection() as conn:
            conn.tables()

    # --------------------------------------------------------------- write

    def _apply(self, ops):
        rows: dict[str, dict[bytes, _Row]] = {name: defaultdict(_Row) for name in FAMILIES}
        prefixes_to_clear: list[bytes] = []        # queues of sessions deleted in this batch
        appends: dict[bytes, list] = defaultdict(list)   # session key -> [(tenant, cid, entry)]
        sessions, queue, retained = rows["sessions"], rows["queue"], rows["retained"]
        for op in ops:
            kind = op[0]
            if kind in ("retain", "retain_del"):
                row = retained[session_key(op[1], op[2])]
                if kind == "retain_del":
                    row.drop()
                else:
                    m = op[3]
                    row.put(b"m:p", m.payload)
                    row.put(b"m:q", _num(m.qos))
                    for col, value in ((b"m:x", pack_props(m.properties)),
                                       (b"m:e", None if m.expiry_at is None else _num(m.expiry_at))):
                        if value is None:
                            row.remove(col)
                        else:
                            row.put(col, value)
                continue
            skey = session_key(op[1], op[2])
            srow = sessions[skey]
            if kind == "session":
                _, _, _, expiry, disc, will, due = op
                srow.put(b"s:e", _num(expiry))
                for col, value in ((b"s:d", None if disc is None else _num(disc)), (b"s:w", will),
                                   (b"s:u", None if due is None else _num(due))):
                    if value is None:
                        srow.remove(col)
                    else:
                        srow.put(col, value)
            elif kind == "session_del":
                srow.drop()
                for _, _, e in appends.pop(skey, ()):
                    e.seq = 0
                prefixes_to_clear.append(queue_prefix(op[1], op[2]))
            elif kind == "sub":
                s = op[3]
                srow.put(b"f:" + s.filter.encode(),
                         f"{s.qos},{int(s.no_local)},{int(s.rap)},{s.rh},{s.sub_id or ''}".encode())
            elif kind == "unsub":
                srow.remove(b"f:" + op[3].encode())
            elif kind == "rel":
                srow.put(b"r:" + _num(op[3]), b"1")
            elif kind == "rel_del":
                srow.remove(b"r:" + _num(op[3]))
            elif kind == "q":
                appends[skey].append((op[1], op[2], op[3]))
            elif kind == "q_state":
                e = op[3]
                if e.seq:
                    queue[queue_prefix(op[1], op[2]) + e.seq.to_bytes(8, "big")].put(b"m:f", _flags(e))
            elif kind == "q_del":
                e = op[3]
                if e.seq:
                    queue[queue_prefix(op[1], op[2]) + e.seq.to_bytes(8, "big")].drop()
                elif any(x is e for _, _, x in appends.get(skey, ())):
                    appends[skey] = [a for a in appends[skey] if a[2] is not e]   # never written
            else:
                raise ValueError(f"unknown journal operation {kind!r}")
        # Exceptions must leave the pool's context as they are: on a Thrift or
        # socket error happybase replaces the connection (Store._run turns
        # them into StoreError afterwards).
        with self.pool.connection() as conn:
            self._write(conn, rows, prefixes_to_clear, appends)

    def _write(self, conn, rows, prefixes_to_clear, appends):
        counters = conn.table("counters")
        queue_rows = rows["queue"]
        # sequence numbers, one increment per queue
        for skey, items in appends.items():
            last = counters.counter_inc(skey, b"c:seq", len(items))
            first = last - len(items) + 1
            for i, (tenant, cid, e) in enumerate(items):
                e.seq = first + i
                row = queue_rows[queue_prefix(tenant, cid) + e.seq.to_bytes(8, "big")]
                m = e.msg
                row.put(b"m:t", m.topic.encode())
                row.put(b"m:p", m.payload)
                row.put(b"m:f", _flags(e))
                for col, value in ((b"m:x", pack_props(m.properties)),
                                   (b"m:e", None if m.expiry_at is None else _num(m.expiry_at)),
                                   (b"m:i", (pack_ids(e.sub_ids) or "").encode() or None),
                                   (b"m:s", (pack_share(e.share) or "").encode() or None)):
                    if value is not None:
                        row.put(col, value)
        now = time.monotonic()
        # 1. deletes: whole rows, and the queues of deleted sessions
        for name in FAMILIES:
            table = conn.table(name)
            with table.batch() as b:
                for key, change in rows[name].items():
                    if change.delete:
                        b.delete(key)
                        self._recent[(name, key)] = now
        if prefixes_to_clear:
            queue = conn.table("queue")
            for prefix in prefixes_to_clear:
                with queue.batch(batch_size=SCAN_BATCH) as b:
                    for key, _ in queue.scan(row_prefix=prefix, columns=[b"m:f"], batch_size=SCAN_BATCH):
                        if key not in queue_rows or not queue_rows[key].puts:
                            b.delete(key)
        # 2. puts and column deletes, after any recent delete of the same row
        wait = 0.0
        for name in FAMILIES:
            for key, change in rows[name].items():
                if change.puts:
                    t = self._recent.get((name, key))
                    if t is not None:
                        wait = max(wait, t + DELETE_GUARD - time.monotonic())
        if wait > 0:
            time.sleep(wait)
        for name in FAMILIES:
            table = conn.table(name)
            with table.batch() as b:
                for key, change in rows[name].items():
                    if change.puts:
                        b.put(key, change.puts)
                    if change.dels:
                        b.delete(key, columns=list(change.dels))
                        self._recent[(name, key)] = time.monotonic()
        if len(self._recent) > 10000:
            cutoff = time.monotonic() - DELETE_GUARD
            self._recent = {k: t for k, t in self._recent.items() if t > cutoff}

    # ---------------------------------------------------------------- read

    def _session(self, key: bytes, data: dict) -> SessionRecord:
        tenant, cid = _split_key(key)
        disc = data.get(b"s:d")
        due = data.get(b"s:u")
        rec = SessionRecord(tenant, cid, int(data.get(b"s:e", b"0")), float(disc) if disc else None,
                            unpack_will(data.get(b"s:w")), float(due) if due else None)
        for col, value in data.items():
            if col.startswith(b"f:"):
                qos, nl, rap, rh, sid = value.decode().split(",")
                rec.subscriptions.append(SubscriptionRecord(col[2:].decode(), int(qos), nl == "1", rap == "1",
                                                            int(rh), int(sid) if sid else None))
            elif col.startswith(b"r:"):
                rec.awaiting_rel.add(int(col[2:]))
        return rec

    def _load(self):
        with self.pool.connection() as conn:
            sessions = {}
            for key, data in conn.table("sessions").scan(batch_size=SCAN_BATCH):
                if b"s:e" in data:
                    sessions[key] = self._session(key, data)
            for key, data in conn.table("counters").scan(batch_size=SCAN_BATCH):
                rec = sessions.get(key)
                if rec is not None:
                    rec.last_seq = int.from_bytes(data[b"c:seq"], "big", signed=True)
            for key, data in conn.table("queue").scan(batch_size=SCAN_BATCH):
                tenant, cid, seq = _split_queue_key(key)
                rec = sessions.get(session_key(tenant, cid))
                if rec is not None:
                    rec.queue.append(_entry(seq, data))
            retained = []
            for key, data in conn.table("retained").scan(batch_size=SCAN_BATCH):
                tenant, topic = _split_key(key)
                retained.append((tenant, topic, _retained(topic, data)))
        return list(sessions.values()), retained

    def _load_session(self, tenant, client_id):
        key = session_key(tenant, client_id)
        with self.pool.connection() as conn:
            data = conn.table("sessions").row(key)
            if b"s:e" not in data:
                return None
            rec = self._session(key, data)
            counter = conn.table("counters").row(key, columns=[b"c:seq"])
            if counter:
                rec.last_seq = int.from_bytes(counter[b"c:seq"], "big", signed=True)
            prefix = queue_prefix(tenant, client_id)
            rec.queue = [_entry(int.from_bytes(k[-8:], "big"), d)
                         for k, d in conn.table("queue").scan(row_prefix=prefix, batch_size=SCAN_BATCH)]
        return rec

    def _purge(self, now):
        n = 0
        with self.pool.connection() as conn:
            sessions = conn.table("sessions")
            gone = []
            for key, data in sessions.scan(columns=[b"s:e", b"s:d"], batch_size=SCAN_BATCH):
                exp, disc = int(data.get(b"s:e", b"0")), data.get(b"s:d")
                if disc and exp != 0xFFFFFFFF and float(disc) + exp <= now:
                    gone.append(key)
            for key in gone:
                tenant, cid = _split_key(key)
                self._apply([("session_del", tenant, cid)])
                n += 1
            for name in ("queue", "retained"):
                table = conn.table(name)
                with table.batch(batch_size=SCAN_BATCH) as b:
                    for key, data in table.scan(columns=[b"m:e"], batch_size=SCAN_BATCH):
                        exp = data.get(b"m:e")
                        if exp and float(exp) <= now:
                            b.delete(key)
                            n += 1
        return n


def _flags(e: QueueEntry) -> bytes:
    m = e.msg
    return bytes((m.qos | (4 if m.retain else 0), e.qos | (4 if e.retain else 0), e.state)) + e.pid.to_bytes(2, "big")


def _entry(seq: int, d: dict) -> QueueEntry:
    f = d[b"m:f"]
    exp = d.get(b"m:e")
    msg = StoredMessage(d[b"m:t"].decode(), d.get(b"m:p", b""), f[0] & 3, bool(f[0] & 4), unpack_props(d.get(b"m:x")),
                        float(exp) if exp else None)
    ids = d.get(b"m:i")
    share = d.get(b"m:s")
    return QueueEntry(seq, msg, f[1] & 3, bool(f[1] & 4), unpack_ids(ids.decode() if ids else None),
                      unpack_share(share.decode() if share else None), int.from_bytes(f[3:5], "big"), f[2])


def _retained(topic: str, d: dict) -> StoredMessage:
    exp = d.get(b"m:e")
    return StoredMessage(topic, d.get(b"m:p", b""), int(d.get(b"m:q", b"0")), True, unpack_props(d.get(b"m:x")),
                         float(exp) if exp else None)
