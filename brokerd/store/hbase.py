"""``hbase://HOST:PORT?table_prefix=NAME``: HBase through its Thrift gateway.

Tables (``NAME_`` prefix, created when missing):

``sessions``  row ``tenant\\0client_id``; families ``s`` (expiry, disconnected
              at, will, will due, device, generation, entries sent), ``f`` (one column per subscription filter),
              ``r`` (incoming QoS 2 packet ids awaiting PUBREL).
``counters``  one row, ``seq``: ``c:seq``, the queue sequence of every
              queue, advanced with ``atomicIncrement`` once per batch by the
              number of messages the batch appends, whatever its fan-out. So
              several nodes appending to one queue never collide, a batch
              committed after another has higher numbers (a publisher's
              messages stay in order, whichever node it is on), and a number
              is never given twice: queue row keys are never reused (HBase
              delete markers would hide a re-used key) and there is no
              per-session counter to collect. (Rows of other keys are the
              per-session counters of earlier versions: the purge deletes
              them; the first increment moves the counter above them.)
``queue``     row ``salt . reversed(client_id) \\0 tenant \\0 seq(8 bytes)``: a
              session's queue is one contiguous range (scanned in bounded
              batches, deleted by key once acknowledged), while the salt
              (``crc32 % 64``) and the reversed client id spread sessions --
              ``sensor-0001``, ``sensor-0002`` -- over regions.
``retained``  row ``tenant\\0topic``; family ``m``.
``delayed``   row ``due(ms, 8 bytes) . id``: messages of ``$delayed/...``, in due
              order, so the due ones are one bounded scan from the start of
              the table; ``m:c`` is its claim (``lease end|owner``), taken
              with ``checkAndPut`` against the value read, so of two nodes
              claiming one message only one succeeds.

Generations. HBase has no transaction across rows: node A may read that a
session exists, node B then delete it (its expiry, the purge, a clean start
there), and A's queue rows for it land after B's deletion scanned the queue.
So every session row has a generation, ``s:g`` (8 random bytes, made when
the session is created; a session deleted and made again gets a new one), and
every queue row the generation it was appended for, ``m:g`` (read with the
batch's check that its sessions exist). A session loads only the rows of its
own generation, and the purge deletes rows whose session is gone or of
another generation: rows appended in that race never reach a later session of
the client id. (Rows without ``m:g`` -- written by an earlier version -- are
their session's.)

Query options: ``table_prefix`` (default ``brokerd``), ``timeout`` (ms,
default 10000), ``transport`` (``buffered`` | ``framed``), ``protocol``
(``binary`` | ``compact``), matching the gateway's settings; ``compression``,
``regions``, ``purge_pace`` (see ``families``, ``_open``, the purge), and
``parallel`` (default 4): the connections a write batch uses at once -- a
table's rows of one batch, ``PART_ROWS`` or more a part, go as that many
``mutateRows`` in parallel (``_send``), and the sequence is reserved beside
the existence read (``_reserve_aside``); ``pipeline`` (default 2): write
batches in flight at once.

Pipelining. A write batch is prepared on the store thread -- which sessions
exist, its sequence numbers, its rows folded (``_prepare``) -- and sent on a
delivery thread (``_deliver``), so the next batch is prepared and sent while
the previous one is in flight (``StoreWriter`` commits them in order). The
store thread prepares batches one at a time, in order: a later batch's
sequence numbers are higher. A batch that reads or writes a row an earlier
batch in flight writes -- a session row it changes, a queue row it writes or
deletes (an acknowledgement of a message still being written), the queue of a
session it deletes -- waits until that batch is written, so rows change in
batch order and no delete overtakes the write it deletes; a 2 ms delete guard
(below) applies as before. If that batch failed, or any batch failed since,
batches are refused until the writer has written the failed ones again one
at a time (``_broken``).

HBase masks a put by a delete marker with the same millisecond timestamp.
Operations of a batch are folded per row first, row deletes are sent before
puts, and a row this store deleted less than 2 ms ago is not written again
before those 2 ms have passed. (On HBase 2 with ``NEW_VERSION_BEHAVIOR``
families the wait is unnecessary but harmless.)
"""

import concurrent.futures
import logging
import os
import threading
import time
import zlib
from collections import defaultdict
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


# Column families, as created (``python -m brokerd.store.hbase ddl`` prints them
# as HBase shell commands, pre-split). One version everywhere: nothing reads an
# older one. ROW bloom filters: every point read (a session, the probe for a
# queue row, a counter) asks for one row key. No column-family TTL: nothing
# here expires after a fixed time -- sessions by their own expiry interval
# (or never, 0xFFFFFFFF), messages by their own Message Expiry Interval --
# so a TTL would delete live data; the paced purge (``_purge``) removes them.
# ``compression`` (URL option, default NONE) is the codec the region servers
# have (SNAPPY, ZSTD, LZ4, GZ).
def families(compression: str = "NONE") -> dict:
    base = {"max_versions": 1, "bloom_filter_type": "ROW", "compression": compression}
    return {
        "sessions": {"s": base, "f": base, "r": base},
        "counters": {"c": {**base, "in_memory": True}},     # small, hot: kept in the block cache first
        "queue": {"m": base},
        "retained": {"m": base},
        "meta": {"m": base},
        "delayed": {"m": base},
    }


FAMILIES = families()
log = logging.getLogger("brokerd.store")

FAMILY_NAMES = {name: [f.encode() for f in fams] for name, fams in FAMILIES.items()}
DELETE_ORDER = ("queue", "delayed", "retained", "meta", "counters", "sessions")     # children first
SEQ_ROW = b"seq"              # the counters table's one live row
SCAN_BATCH = 1000
SEEDED = 1 << 56              # a counter below this has not been seeded (a new table)
SALTS = 64                    # the queue table's salt byte: crc32(session key) % SALTS
PURGE_PACE = 5000             # rows a second the purge scans, at most (URL option purge_pace)
PART_ROWS = 64                # rows of one table a write batch sends per call, at least, when it sends several
PIPELINE = 2                  # write batches in flight at once (URL option pipeline)
EARLIER_FAILED = "an earlier write batch failed: this one is written again after it"


def _seed() -> int:
    """The counter's start: wall-clock milliseconds << 18 (about 2^59 today),
    above every per-session counter of earlier versions, whose rows may still
    be in queues; 2^63 is reached in the year 3000."""
    return (time.time_ns() // 1_000_000) << 18
DELETE_GUARD = 0.002          # seconds between deleting a row and writing it again


def session_key(tenant: str, client_id: str) -> bytes:
    return tenant.encode() + b"\0" + client_id.encode()


def queue_prefix(tenant: str, client_id: str) -> bytes:
    salt = zlib.crc32(session_key(tenant, client_id)) % SALTS
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


class _Batch:
    """A write batch folded per row (``_fold``), to send (``_send_batch``), and
    what it writes, for the batches prepared after it while it is in flight:
    ``keys`` -- (table, row) of the sessions and retained rows it changes;
    ``qtouch`` -- (session key, seq) of the queue rows it writes or deletes."""

    __slots__ = ("rows", "cleared", "keys", "qtouch", "qsessions", "before", "done", "failed")

    def __init__(self, rows: dict, cleared: list, qtouch: set):
        self.rows = rows
        self.cleared = cleared
        self.keys = {(name, key) for name, table in rows.items() if name != "queue"
                     for key, change in table.items() if change.delete or change.puts or change.dels}
        self.qtouch = qtouch
        self.qsessions = {skey for skey, _ in qtouch}
        self.before: list = []                 # the batches in flight when it was prepared
        self.done = threading.Event()
        self.failed = False

    def conflicts(self, rows: set, qtouch: set, dropped: set) -> bool:
        """Must a batch that reads or writes these wait until this one is written?"""
        # (a session this one deletes is in ``keys``: any later operation of that
        # session reads its row; a session the later one deletes, in ``dropped``)
        return (not self.keys.isdisjoint(rows) or not self.qtouch.isdisjoint(qtouch)
                or not self.qsessions.isdisjoint(dropped))


def _queue_only(rows: dict) -> bool:
    """Does a folded batch change queue rows only, none both deleted and written?"""
    for name, table in rows.items():
        for change in table.values():
            if name != "queue":
                if change.delete or change.puts or change.dels:
                    return False
            elif change.delete and (change.puts or change.dels):
                return False
    return True


def _touches(ops) -> tuple[set, set, set]:
    """What a batch reads or writes, before it is folded: (table, row) of the
    sessions and retained rows; (session key, seq) of queue rows already
    numbered; the sessions it deletes (with their queues)."""
    rows, qtouch, dropped = set(), set(), set()
    for op in ops:
        kind = op[0]
        if kind in ("retain", "retain_del"):
            rows.add(("retained", session_key(op[1], op[2])))
            continue
        skey = session_key(op[1], op[2])
        rows.add(("sessions", skey))
        if kind == "session_del":
            dropped.add(skey)
        elif kind in ("q", "q_state", "q_del") and op[3].seq:
            qtouch.add((skey, op[3].seq))
    return rows, qtouch, dropped


class HBaseStore(Store):
    scheme = "hbase"
    remote = True
    pipeline = PIPELINE

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
        self.compression = opts.pop("compression", "NONE").upper()
        try:
            self.regions = int(opts.pop("regions", "16"))
            self.purge_pace = float(opts.pop("purge_pace", str(PURGE_PACE)))
            self.parallel = int(opts.pop("parallel", "4"))
            self.pipeline = int(opts.pop("pipeline", str(PIPELINE)))
        except ValueError:
            self.regions = self.purge_pace = self.parallel = self.pipeline = 0
        if not 1 <= self.regions <= SALTS or not self.purge_pace > 0 or not 1 <= self.parallel <= 16 \
                or not 1 <= self.pipeline <= 8:
            raise ValueError(f"bad store URL {url!r}: regions is 1..{SALTS}, purge_pace a number > 0, "
                             f"parallel 1..16, pipeline 1..8")
        if opts:
            raise ValueError(f"bad store URL {url!r}: unknown option(s) {', '.join(opts)}")
        self.pool = None
        self.purge_pool = None                    # the purge's own connection (its own thread: _run_aside)
        self._recent: dict[tuple, float] = {}     # (table, row) -> monotonic time of our delete
        self._recent_lock = threading.Lock()
        self._senders: concurrent.futures.ThreadPoolExecutor | None = None
        self._delivery: concurrent.futures.ThreadPoolExecutor | None = None    # sends prepared batches
        self._flight: list[_Batch] = []           # batches prepared and not yet written, oldest first
        self._flight_lock = threading.Lock()
        self._broken = False                      # a batch failed: refuse pipelined ones (``_prepare``)
        self._purge_from: dict[str, bytes] = {}   # table -> where an interrupted purge pass resumes
        self._stopping = False
        self._purge_stop = False

    # ---------------------------------------------------------- connection

    def _open(self):
        import happybase
        from Hbase_thrift import AlreadyExists, IllegalArgument  # the IDL module happybase loads

        self.data_errors = (*DATA_ERRORS, IllegalArgument)     # HBase refused the values themselves

        def pool(size):
            return happybase.ConnectionPool(size, host=self.host, port=self.port, table_prefix=self.prefix,
                                            timeout=self.timeout, transport=self.transport,
                                            protocol=self.protocol, autoconnect=False)

        # a connection for the store thread, each delivery thread (a batch in
        # flight) and each sender thread (a batch's other parts, ``_send``; one
        # more for the sequence reserved beside the existence read)
        senders = self.pipeline * (self.parallel - 1) + 1 if self.parallel > 1 else 0
        self.pool = pool(1 + self.pipeline + senders)
        self.purge_pool = pool(1)
        if self._delivery is None:
            self._delivery = concurrent.futures.ThreadPoolExecutor(self.pipeline,
                                                                   thread_name_prefix="store-hbase-deliver")
        if senders and self._senders is None:
            self._senders = concurrent.futures.ThreadPoolExecutor(senders, thread_name_prefix="store-hbase-send")
        with self.pool.connection() as conn:
            existing = {t.decode() if isinstance(t, bytes) else t for t in conn.tables()}
            for name, fams in families(self.compression).items():
                if name not in existing:
                    try:
                        conn.create_table(name, fams)
                    except AlreadyExists:          # created meanwhile by another node
                        pass
            regions = len(conn.client.getTableRegions(conn._table_name("queue")))
        if regions < self.regions:
            log.warning("hbase: table %s_queue has %d region(s), fewer than regions=%d: the Thrift gateway "
                        "cannot create tables pre-split; create them with `python -m brokerd.store.hbase ddl "
                        "--prefix %s --regions %d` (HBase shell commands) before the first start",
                        self.prefix, regions, self.regions, self.prefix, self.regions)

    def _close(self):
        self.pool = self.purge_pool = None
        for executor in (self._senders, self._delivery):
            if executor is not None:
                executor.shutdown(wait=False)
        self._senders = self._delivery = None

    async def close(self) -> None:
        self._stopping = True                      # a purge pass under way stops at its next page
        await super().close()

    def _ping(self):
        with self.pool.connection() as conn:
            conn.tables()

    def _get_meta(self, key):
        with self.pool.connection() as conn:
            return conn.table("meta").row(key.encode(), columns=[b"m:v"]).get(b"m:v")

    def _put_meta(self, key, value):
        with self.pool.connection() as conn:
            conn.table("meta").put(key.encode(), {b"m:v": bytes(value)})

    # --------------------------------------------------------------- write

    async def apply(self, ops: list, prepared=None) -> None:
        """Prepare the batch on the store thread (reads, numbering, folding: in
        batch order), then send its mutations on a delivery thread, so the next
        batch can be prepared and sent while this one is in flight (module
        docstring, "Pipelining"). ``prepared`` (a future) is resolved once the
        store thread is done with this batch."""
        if not ops:
            return
        try:
            batch = await self._run(self._prepare, ops, prepared is not None)
        finally:
            if prepared is not None and not prepared.done():
                prepared.set_result(None)
        if batch is not None:
            await self._run_in(self._delivery, self._deliver, batch)

    def _apply(self, ops):
        # Exceptions must leave the pool's context as they are: on a Thrift or
        # socket error happybase replaces the connection (Store._run turns
        # them into StoreError afterwards).
        batch = self._prepare(ops)
        if batch is not None:
            self._deliver(batch)

    def _prepare(self, ops, pipelined: bool = False) -> "_Batch | None":
        """Wait for the batches in flight this one depends on, then fold it (its
        reads and numbering included); -> the batch to send, registered in flight.
        After a failure, pipelined batches are refused until the writer writes
        the failed ones again, one batch at a time (``pipelined`` False)."""
        if not pipelined:
            self._broken = False
        elif self._broken:
            raise StoreError(EARLIER_FAILED)
        try:
            touches = _touches(ops)
            with self._flight_lock:
                before = list(self._flight)
            for f in before:
                if f.conflicts(*touches):
                    f.done.wait()
                    if f.failed:
                        raise StoreError(EARLIER_FAILED)
            with self.pool.connection() as conn:
                batch = self._fold(conn, ops)
        except BaseException:
            self._broken = True
            raise
        if batch is None:
            return None
        batch.before = before
        with self._flight_lock:
            self._flight.append(batch)
        return batch

    def _deliver(self, batch: "_Batch") -> None:
        """Send a prepared batch on this delivery thread's own connection."""
        try:
            if self._broken or any(f.failed for f in batch.before):
                raise StoreError(EARLIER_FAILED)
            with self.pool.connection() as conn:
                self._send_batch(conn, batch)
        except BaseException:
            batch.failed = self._broken = True
            raise
        finally:
            with self._flight_lock:
                self._flight.remove(batch)
            batch.before = []
            batch.done.set()

    def _write(self, conn, ops):
        """Fold the batch per row, then: number the appends, delete, write
        (the purge's deletions: not pipelined)."""
        batch = self._fold(conn, ops)
        if batch is not None:
            self._send_batch(conn, batch)

    def _fold(self, conn, ops) -> "_Batch | None":
        """Read which sessions exist, number the appends, fold the operations
        per row: -> what to send (None: nothing)."""
        rows: dict[str, dict[bytes, _Row]] = {name: defaultdict(_Row) for name in FAMILIES}
        sessions, queue, retained = rows["sessions"], rows["queue"], rows["retained"]
        appends: dict[bytes, list] = defaultdict(list)   # session key -> [(prefix, entry)] in order
        in_batch: dict[int, bytes] = {}                  # id(entry) -> session key, for appends of this batch
        cleared: list[bytes] = []                        # queue prefixes of sessions deleted in this batch
        qtouch: set[tuple] = set()                       # (session key, seq) of the queue rows it writes
        reserved = self._reserve_aside(ops)              # the sequence numbers, meanwhile
        try:
            alive, gens = self._alive(conn, ops)         # session key -> exists / its generation (as the batch goes on)
        finally:
            last = reserved.result() if reserved is not None else None
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
                    _put_or_remove(row, b"m:x", pack_props(m.properties))
                    _put_or_remove(row, b"m:e", None if m.expiry_at is None else _num(m.expiry_at))
                continue
            skey = session_key(op[1], op[2])
            if kind == "session":
                alive[skey] = True
                if gens.get(skey) is None:               # a new session (none stored, or deleted above)
                    gens[skey] = os.urandom(8)
                srow = sessions[skey]
                if gens[skey]:
                    srow.put(b"s:g", gens[skey])
                expiry, disc, will, due = op[3:7]
                device = op[7] if len(op) > 7 else None
                sent = op[8] if len(op) > 8 else None
                srow.put(b"s:e", _num(expiry))
                # with the disconnect it holds for (an older brokerd writes disconnects without it)
                _put_or_remove(srow, b"s:n", None if sent is None or disc is None else _num(sent) + b"@" + _num(disc))
                _put_or_remove(srow, b"s:v", device.encode() if device else None)
                _put_or_remove(srow, b"s:d", None if disc is None else _num(disc))
                _put_or_remove(srow, b"s:w", will)
                _put_or_remove(srow, b"s:u", None if due is None else _num(due))
                continue
            if kind == "session_del":
                alive[skey] = False
                gens[skey] = None
                sessions[skey].drop()
                for _, e in appends.pop(skey, ()):
                    in_batch.pop(id(e), None)
                    e.seq = 0
                prefix = queue_prefix(op[1], op[2])
                for key in [k for k in queue if k.startswith(prefix)]:
                    del queue[key]                       # changes to rows that are about to go
                cleared.append(prefix)
                continue
            if not alive.get(skey):
                if kind == "q":
                    op[3].seq = 0                        # a session that does not exist: nothing to write
                continue
            srow = sessions[skey]
            if kind == "sub":
                sub = op[3]
                srow.put(b"f:" + sub.filter.encode(),
                         f"{sub.qos},{int(sub.no_local)},{int(sub.rap)},{sub.rh},{sub.sub_id or ''}".encode())
            elif kind == "unsub":
                srow.remove(b"f:" + op[3].encode())
            elif kind == "rel":
                srow.put(b"r:" + _num(op[3]), b"1")
            elif kind == "rel_del":
                srow.remove(b"r:" + _num(op[3]))
            elif kind == "q":
                e = op[3]
                appends[skey].append((queue_prefix(op[1], op[2]), e))
                in_batch[id(e)] = skey
            elif kind in ("q_state", "q_del"):
                e = op[3]
                if id(e) in in_batch:
                    # appended in this very batch: the append writes its state;
                    # a delete means it is never written at all
                    if kind == "q_del":
                        owner = in_batch.pop(id(e))
                        appends[owner] = [a for a in appends[owner] if a[1] is not e]
                elif e.seq:
                    qtouch.add((skey, e.seq))
                    key = queue_prefix(op[1], op[2]) + e.seq.to_bytes(8, "big")
                    if kind == "q_del":
                        queue[key].drop()
                    else:
                        queue[key].put(b"m:f", _flags(e))
            else:
                raise ValueError(f"unknown journal operation {kind!r}")
        # sequence numbers: one increment per queue, for entries not numbered by
        # an earlier, failed attempt at this batch (whose keys a retry rewrites)
        self._number(conn, appends, last)
        for skey, items in appends.items():
            gen = gens.get(skey)
            for prefix, e in items:
                qtouch.add((skey, e.seq))
                row = queue[prefix + e.seq.to_bytes(8, "big")]
                # a new key (sequences are never reused; a retry writes the same
                # cells again): puts only -- deleting the columns it does not
                # have would cost a delete marker each, on every message
                puts = row.puts
                if gen:
                    puts[b"m:g"] = gen                   # whose queue row it is (module docstring, "Generations")
                m = e.msg
                puts[b"m:t"] = m.topic.encode()
                puts[b"m:p"] = m.payload
                puts[b"m:f"] = _flags(e)
                if m.properties:
                    puts[b"m:x"] = pack_props(m.properties)
                if m.expiry_at is not None:
                    puts[b"m:e"] = _num(m.expiry_at)
                if e.sub_ids:
                    puts[b"m:i"] = pack_ids(e.sub_ids).encode()
                if e.share:
                    puts[b"m:s"] = pack_share(e.share).encode()
        # a state change of a stored row must not create a partial row
        missing = self._missing_queue_rows(conn, queue, appends)
        for key in missing:
            del queue[key]
        if not cleared and not any(rows.values()):
            return None
        return _Batch(rows, cleared, qtouch)

    def _send_batch(self, conn, batch: "_Batch") -> None:
        """Deletes, then puts, as ``_fold`` left them."""
        from Hbase_thrift import BatchMutation, Mutation  # the IDL module happybase loads
        rows, cleared = batch.rows, batch.cleared
        if not cleared and _queue_only(rows):
            self._send_queue(conn, rows["queue"])
            return
        # 1. deletes, children before parents: the rows of the deleted sessions'
        # queues, then the session rows. HBase applies the
        # rows of a call one by one; a failure (or a crash) between two rows
        # leaves a session that is still there with part of its queue gone --
        # the deletion is retried (purge, clean start) -- never queue rows
        # without a session, which a new session of that client id would load.
        deleted: list[tuple] = []
        if cleared:
            table = conn.table("queue")
            for prefix in cleared:
                with table.batch(batch_size=SCAN_BATCH) as b:
                    for key, _ in table.scan(row_prefix=prefix, columns=[b"m:f"], batch_size=SCAN_BATCH):
                        b.delete(key, columns=[b"m"])
        for name in DELETE_ORDER:
            fams = [Mutation(isDelete=True, column=f) for f in FAMILY_NAMES[name]]
            bms = [BatchMutation(row=key, mutations=fams) for key, change in rows[name].items() if change.delete]
            self._send(conn, name, bms)
            if name != "queue":                          # queue keys are never written again
                deleted += [(name, bm.row) for bm in bms]
        self._note_deleted(deleted)
        # 2. puts and column deletes, once the guard time after our deletes of those rows is over;
        # parents before children (a session's row before its queue's rows)
        wait = 0.0
        for name in FAMILIES:
            for key, change in rows[name].items():
                if change.puts:
                    wait = max(wait, self._since_delete(name, key))
        if wait > 0:
            time.sleep(wait)
        removed = []
        received = []       # incoming QoS 2 ids (``r:``): written last (below)
        for name in FAMILIES:
            bms = []
            for key, change in rows[name].items():
                if change.puts or change.dels:
                    puts = change.puts
                    if name == "sessions" and any(c[:2] == b"r:" for c in puts):
                        received.append(BatchMutation(row=key, mutations=[
                            Mutation(column=c, value=v) for c, v in puts.items() if c[:2] == b"r:"]))
                        puts = {c: v for c, v in puts.items() if c[:2] != b"r:"}
                    muts = [Mutation(column=c, value=v) for c, v in puts.items()]
                    if change.dels:
                        muts += [Mutation(isDelete=True, column=c) for c in change.dels]
                        removed.append((name, key))
                    if muts:
                        bms.append(BatchMutation(row=key, mutations=muts))
            self._send(conn, name, bms)
        # 3. an incoming QoS 2 id says "routed: a copy of this PUBLISH is not routed again". Its
        # queue rows and retained message come first: a crash between the two then routes the copy
        # the publisher sends (it had no PUBREC) once more -- at least once -- where the other way
        # round the copy was taken for a duplicate, and the message was lost
        self._send(conn, "sessions", received)
        self._note_deleted(removed)

    def _send_queue(self, conn, queue: dict) -> None:
        """A batch that changes queue rows only -- acknowledgements and new
        messages, the steady state: its deletes and puts in one round of
        ``mutateRows`` (no row is in both; the rows are independent, and queue
        keys are never written again after a delete, so no order or delete
        guard applies between them)."""
        from Hbase_thrift import BatchMutation, Mutation  # the IDL module happybase loads
        family = [Mutation(isDelete=True, column=b"m")]
        bms, removed = [], []
        wait = 0.0
        for key, change in queue.items():
            if change.delete:
                bms.append(BatchMutation(row=key, mutations=family))
            elif change.puts or change.dels:
                muts = [Mutation(column=c, value=v) for c, v in change.puts.items()]
                if change.dels:
                    muts += [Mutation(isDelete=True, column=c) for c in change.dels]
                    removed.append(("queue", key))
                wait = max(wait, self._since_delete("queue", key))
                bms.append(BatchMutation(row=key, mutations=muts))
        if wait > 0:
            time.sleep(wait)
        self._send(conn, "queue", bms)
        self._note_deleted(removed)

    def _send(self, conn, name: str, bms: list) -> None:
        """One table's row mutations of a batch: one ``mutateRows``, or with
        ``PART_ROWS`` rows or more a part, up to ``parallel`` calls at once, on
        as many connections, each a contiguous range of row keys (so rows of one
        region stay in one call), as an HBase client sends per region server.
        The rows are independent: HBase applies each on its own anyway."""
        if not bms:
            return
        table = conn.table(name).name
        parts = min(self.parallel, len(bms) // PART_ROWS)
        if parts <= 1:
            conn.client.mutateRows(table, bms, {})
            return
        bms.sort(key=lambda bm: bm.row)
        size = -(-len(bms) // parts)
        futures = [self._senders.submit(self._send_part, table, bms[i:i + size])
                   for i in range(size, len(bms), size)]
        errors = []
        try:
            conn.client.mutateRows(table, bms[:size], {})
        except Exception as exc:
            errors.append(exc)
        for f in futures:
            try:
                f.result()
            except Exception as exc:
                errors.append(exc)
        if errors:
            raise errors[0]

    def _send_part(self, table: bytes, bms: list) -> None:
        with self.pool.connection() as conn:          # this sender thread's own connection
            conn.client.mutateRows(table, bms, {})

    def _reserve_aside(self, ops):
        """With sender threads: reserve numbers for every new entry of the batch
        on one of them while the store thread reads which sessions exist (one
        round trip less in line). -> a future of the last number, or None.
        Numbers of entries then dropped (their session is gone) stay unused."""
        if self._senders is None:
            return None
        n = sum(1 for op in ops if op[0] == "q" and not op[3].seq)
        if not n:
            return None

        def reserve():
            with self.pool.connection() as conn:
                return n, _reserve(conn.table("counters"), SEQ_ROW, n)
        return self._senders.submit(reserve)

    def _number(self, conn, appends, reserved=None) -> None:
        """Give the batch's new queue entries their sequence numbers: one
        increment of the one counter for the whole batch, however many queues
        it fans out to (``_reserve``), each queue's entries in append order.
        ``reserved``: ``(n, last)``, a range taken already (``_reserve_aside``)."""
        fresh = [e for items in appends.values() for _, e in items if not e.seq]
        if not fresh:
            return
        if reserved is None or reserved[0] < len(fresh):
            reserved = len(fresh), _reserve(conn.table("counters"), SEQ_ROW, len(fresh))
        n, last = reserved
        for i, e in enumerate(fresh):
            e.seq = last - n + 1 + i

    def _since_delete(self, name: str, key: bytes) -> float:
        """How long to wait before writing a row this store deleted (0: no need)."""
        t = self._recent.get((name, key))
        return 0.0 if t is None else t + DELETE_GUARD - time.monotonic()

    def _note_deleted(self, keys: list) -> None:
        now = time.monotonic()
        with self._recent_lock:
            for k in keys:
                self._recent[k] = now
            if len(self._recent) > 10000:
                cutoff = now - DELETE_GUARD
                self._recent = {k: t for k, t in self._recent.items() if t > cutoff}

    def _alive(self, conn, ops) -> tuple[dict, dict]:
        """Which sessions the batch touches before deleting them exist, and their
        generations (b"": a session written by an earlier version; None: none stored)."""
        unknown = []
        seen = set()
        for op in ops:
            if op[0] in ("retain", "retain_del"):
                continue
            skey = session_key(op[1], op[2])
            if skey in seen:
                continue
            seen.add(skey)
            if op[0] != "session_del":
                unknown.append(skey)
        alive, gens = {}, {}
        if unknown:
            found = dict(conn.table("sessions").rows(unknown, columns=[b"s:e", b"s:g"]))
            for k in unknown:
                data = found.get(k, {})
                alive[k] = b"s:e" in data
                gens[k] = data.get(b"s:g", b"") if alive[k] else None
        return alive, gens

    def _missing_queue_rows(self, conn, queue, appends) -> list[bytes]:
        """Rows of ``queue`` that only change flags but do not exist (acknowledged already)."""
        written = {p + e.seq.to_bytes(8, "big") for items in appends.values() for p, e in items}
        probe = [k for k, ch in queue.items() if ch.puts and not ch.delete and k not in written]
        if not probe:
            return []
        found = dict(conn.table("queue").rows(probe, columns=[b"m:t"]))
        return [k for k in probe if b"m:t" not in found.get(k, {})]

    # ---------------------------------------------------------------- read

    def _session(self, key: bytes, data: dict) -> SessionRecord:
        tenant, cid = _split_key(key)
        disc = data.get(b"s:d")
        due = data.get(b"s:u")
        device = data.get(b"s:v")
        sent, _, sent_at = data.get(b"s:n", b"").partition(b"@")
        if not disc or sent_at != disc:
            sent = None
        rec = SessionRecord(tenant, cid, int(data.get(b"s:e", b"0")), float(disc) if disc else None,
                            unpack_will(data.get(b"s:w")), float(due) if due else None,
                            device=device.decode() if device else None, sent=int(sent) if sent else None)
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
            sessions, gens = {}, {}
            for key, data in conn.table("sessions").scan(batch_size=SCAN_BATCH):
                if b"s:e" in data:
                    sessions[key] = self._session(key, data)
                    gens[key] = data.get(b"s:g", b"")
            for key, data in conn.table("queue").scan(batch_size=SCAN_BATCH):
                tenant, cid, seq = _split_queue_key(key)
                skey = session_key(tenant, cid)
                rec = sessions.get(skey)
                if rec is not None and b"m:t" in data and _owned(data, gens[skey]):
                    rec.queue.append(_entry(seq, data))
            retained = []
            for key, data in conn.table("retained").scan(batch_size=SCAN_BATCH):
                tenant, topic = _split_key(key)
                retained.append((tenant, topic, _retained(topic, data)))
        return list(sessions.values()), retained

    def _load_retained(self):
        with self.pool.connection() as conn:
            return [(*_split_key(key), _retained(_split_key(key)[1], data))
                    for key, data in conn.table("retained").scan(batch_size=SCAN_BATCH)]

    def _load_session(self, tenant, client_id):
        key = session_key(tenant, client_id)
        with self.pool.connection() as conn:
            data = conn.table("sessions").row(key)
            if b"s:e" not in data:
                return None
            rec = self._session(key, data)
            gen = data.get(b"s:g", b"")
            prefix = queue_prefix(tenant, client_id)
            rec.queue = [_entry(int.from_bytes(k[-8:], "big"), d)
                         for k, d in conn.table("queue").scan(row_prefix=prefix, batch_size=SCAN_BATCH)
                         if b"m:t" in d and _owned(d, gen)]
        return rec

    def _session_keys(self, after, limit):
        # row keys in order from just after ``after`` (its key followed by a 0 byte: the next key
        # there can be), the expiry cell alone (a few bytes a row; a row without one is no session:
        # ``_load``), at most ``limit`` rows fetched
        start = session_key(*after) + b"\0" if after is not None else None
        with self.pool.connection() as conn:
            return [_split_key(key) for key, _ in conn.table("sessions").scan(
                row_start=start, columns=[b"s:e"], limit=limit, batch_size=min(SCAN_BATCH, limit))]

    # --------------------------------------------------------------- purge
    # Off the write path: on the store's second thread (``_run_aside``) and its
    # own connection, a pass scans each table once, paced to ``purge_pace`` rows
    # a second, deleting what expired page by page. A pass that fails or is
    # stopped resumes where it was; in a cluster one node at a time runs it
    # (the server's lease in Redis).

    async def purge(self, now: float) -> int:
        self._purge_stop = False
        return await self._run_aside(self._purge, now)

    def stop_purge(self) -> None:
        """Stop the pass under way at its next page (it resumes there next time)."""
        self._purge_stop = True

    def _purge(self, now):
        n = 0
        with self.purge_pool.connection() as conn:
            n += self._purge_table(conn, "sessions", [b"s:e", b"s:d"], now, self._purge_sessions)
            n += self._purge_table(conn, "queue", [b"m:f", b"m:e", b"m:g"], now, _purge_queue_rows)
            n += self._purge_table(conn, "retained", [b"m:e"], now, _purge_expired_rows)
            self._purge_table(conn, "counters", [b"c:seq"], now, _purge_old_counters)
        return n

    def _purge_table(self, conn, name, columns, now, page_fn) -> int:
        """One paced pass over ``name`` from where the last one stopped; ``page_fn``
        deletes the expired rows of each page. -> rows deleted."""
        table = conn.table(name)
        n = 0
        page: list = []
        started = time.monotonic()
        scanned = 0
        for key, data in table.scan(row_start=self._purge_from.get(name) or None, columns=columns,
                                    batch_size=SCAN_BATCH):
            page.append((key, data))
            if len(page) < SCAN_BATCH:
                continue
            n += page_fn(conn, table, page, now)
            self._purge_from[name] = page[-1][0] + b"\0"       # resume after the last row done
            scanned += len(page)
            page = []
            if self._stopping or self._purge_stop:
                return n
            pause = started + scanned / self.purge_pace - time.monotonic()
            if pause > 0:
                time.sleep(pause)
        if page:
            n += page_fn(conn, table, page, now)
        self._purge_from.pop(name, None)                         # the pass is complete
        return n

    def _purge_sessions(self, conn, table, page, now) -> int:
        gone = []
        for key, data in page:
            exp, disc = int(data.get(b"s:e", b"0")), data.get(b"s:d")
            if disc and exp != 0xFFFFFFFF and float(disc) + exp <= now:
                gone.append(("session_del", *_split_key(key)))
        if gone:
            self._write(conn, gone)
        return len(gone)

    # ---------------------------------------------------------- delayed

    def _delayed_add(self, items):
        with self.pool.connection() as conn, conn.table("delayed").batch() as b:
            for m in items:
                cols = {b"m:t": m.tenant.encode(), b"m:n": m.msg.topic.encode(), b"m:p": m.msg.payload,
                        b"m:f": bytes((m.msg.qos | (4 if m.msg.retain else 0),))}
                props = pack_props(m.msg.properties)
                if props:
                    cols[b"m:x"] = props
                if m.publisher:
                    cols[b"m:o"] = pack_publisher(m.publisher).encode()
                b.put(_delayed_key(m.due, m.id), cols)

    def _delayed_claim(self, now, owner, until, limit):
        from Hbase_thrift import Mutation  # the IDL module happybase loads

        claim = f"{until!r}|{owner}".encode()
        out = []
        with self.pool.connection() as conn:
            table = conn.table("delayed")
            stop = (int(now * 1000) + 1).to_bytes(8, "big")
            rows = list(table.scan(row_stop=stop, limit=limit + 64, batch_size=min(SCAN_BATCH, limit + 64)))
            for key, d in rows:
                if len(out) >= limit:
                    break
                held = d.get(b"m:c")
                if b"m:t" not in d or held and float(held.split(b"|", 1)[0]) > now:
                    continue
                if conn.client.checkAndPut(table.name, key, b"m:c", held, Mutation(column=b"m:c", value=claim), {}):
                    f = d[b"m:f"][0]
                    msg = StoredMessage(d[b"m:n"].decode(), d.get(b"m:p", b""), f & 3, bool(f & 4),
                                        unpack_props(d.get(b"m:x")))
                    out.append(DelayedMessage(key[8:].decode(), d[b"m:t"].decode(),
                                              int.from_bytes(key[:8], "big") / 1000, msg,
                                              unpack_publisher(d.get(b"m:o", b"").decode() or None)))
        return out

    def _delayed_done(self, items):
        with self.pool.connection() as conn, conn.table("delayed").batch() as b:
            for m in items:
                b.delete(_delayed_key(m.due, m.id))

    def _delayed_purge(self, tenant):
        # a deleted tenant is rare: the table's scan (rows are keyed by due time, not tenant)
        t = tenant.encode()
        n = 0
        with self.pool.connection() as conn:
            table = conn.table("delayed")
            keys = [key for key, d in table.scan(columns=[b"m:t"], batch_size=SCAN_BATCH) if d.get(b"m:t") == t]
            with table.batch() as b:
                for key in keys:
                    b.delete(key)
                    n += 1
        return n

    def _delayed_counts(self):
        counts: dict[str, int] = {}
        with self.pool.connection() as conn:
            for _, d in conn.table("delayed").scan(columns=[b"m:t"], batch_size=SCAN_BATCH):
                t = d[b"m:t"].decode()
                counts[t] = counts.get(t, 0) + 1
        return counts


def _owned(data: dict, gen: bytes) -> bool:
    """Is this queue row (its cells) its session's, whose generation is ``gen``?
    A row without one was written by an earlier version: its session's."""
    g = data.get(b"m:g")
    return g is None or g == gen


def _purge_expired_rows(conn, table, page, now) -> int:
    expired = [key for key, data in page if data.get(b"m:e") and float(data[b"m:e"]) <= now]
    if expired:
        with table.batch() as b:
            for key in expired:
                b.delete(key, columns=[b"m"])
    return len(expired)


def _purge_queue_rows(conn, table, page, now) -> int:
    """Expired messages, and rows no session owns (module docstring, "Generations"): their
    session is gone, or was deleted and made again (another generation)."""
    skeys = {}
    for key, _ in page:
        tenant, cid, _ = _split_queue_key(key)
        skeys[key] = session_key(tenant, cid)
    found = dict(conn.table("sessions").rows(list(set(skeys.values())), columns=[b"s:e", b"s:g"]))
    gone = []
    for key, data in page:
        owner = found.get(skeys[key], {})
        # (an expired QoS 2 delivery stays, as in the SQLite store's purge)
        if data.get(b"m:e") and float(data[b"m:e"]) <= now and (data.get(b"m:f") or b"\0\0")[1] & 3 != 2 or b"s:e" not in owner \
                or not _owned(data, owner.get(b"s:g", b"")):
            gone.append(key)
    if gone:
        with table.batch() as b:
            for key in gone:
                b.delete(key, columns=[b"m"])
    return len(gone)


def _purge_old_counters(conn, table, page, now) -> int:
    """The per-session counters of earlier versions (every row but ``SEQ_ROW``)."""
    old = [key for key, _ in page if key != SEQ_ROW]
    if old:
        with table.batch() as b:
            for key in old:
                b.delete(key, columns=[b"c"])
    return len(old)


def _reserve(counters, key: bytes, n: int) -> int:
    """Reserve ``n`` sequence numbers; -> the last. A counter below SEEDED (a new
    table) is moved up to ``_seed()`` first; reservers racing there each still get
    their own range: every increment's range is its own, and the second one adds
    at least ``n``."""
    last = counters.counter_inc(key, b"c:seq", n)
    if last < SEEDED:
        last = counters.counter_inc(key, b"c:seq", max(_seed(), n))
    return last


def _delayed_key(due: float, id_: str) -> bytes:
    return round(due * 1000).to_bytes(8, "big") + id_.encode()


def _put_or_remove(row: _Row, col: bytes, value: bytes | None) -> None:
    if value is None:
        row.remove(col)
    else:
        row.put(col, value)


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


# ------------------------------------------------------------------ DDL

def split_keys(regions: int) -> list[bytes]:
    """The queue table's split points: ``regions`` ranges of the salt byte, as even as 64 salts allow."""
    return [bytes(((i * SALTS) // regions,)) for i in range(1, regions)]


_SHELL_FAMILY = {"max_versions": "VERSIONS", "bloom_filter_type": "BLOOMFILTER", "compression": "COMPRESSION",
                 "in_memory": "IN_MEMORY"}


def tenant_split_keys(tenants) -> list[bytes]:
    """Split points of ``sessions`` and ``retained`` (rows keyed ``tenant \\0 ...``):
    each tenant named starts a region -- its rows, and those of the tenants
    sorting after it up to the next one named."""
    return sorted({t.encode() + b"\0" for t in tenants if t})


def ddl(prefix: str, regions: int, compression: str = "NONE", tenants=()) -> str:
    """HBase shell commands creating the tables as ``_open`` would, the queue
    table pre-split on its salt byte (the Thrift1 gateway cannot pass split keys),
    ``sessions`` and ``retained`` at the ``tenants`` given (``tenant_split_keys``)."""
    lines = []
    for name, fams in families(compression.upper()).items():
        specs = []
        for fam, opts in fams.items():
            kv = ", ".join(f"{_SHELL_FAMILY[k]} => {_shell_value(v)}" for k, v in opts.items())
            specs.append(f"{{NAME => '{fam}', {kv}}}")
        keys = []
        if name == "queue" and regions > 1:
            keys = [f'"\\x{k[0]:02x}"' for k in split_keys(regions)]
        elif name in ("sessions", "retained"):
            keys = [_shell_bytes(k) for k in tenant_split_keys(tenants)]
        splits = ", SPLITS => [" + ", ".join(keys) + "]" if keys else ""
        lines.append(f"create '{prefix}_{name}', {', '.join(specs)}{splits}")
    return "\n".join(lines) + "\n"


def _shell_bytes(key: bytes) -> str:
    """A row key as an HBase shell (JRuby) double-quoted string."""
    return '"' + "".join(chr(b) if 0x30 <= b <= 0x39 or 0x41 <= b <= 0x5A or 0x61 <= b <= 0x7A or b in b"-_."
                         else f"\\x{b:02x}" for b in key) + '"'


def _shell_value(v) -> str:
    if isinstance(v, bool):
        return "'true'" if v else "'false'"
    return str(v) if isinstance(v, int) else f"'{v}'"


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m brokerd.store.hbase",
                                 description="HBase shell commands that create brokerd's tables, pre-split.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("ddl", help="print the create commands (pipe them into `hbase shell -n`)")
    d.add_argument("--prefix", default="brokerd", help="the store URL's table_prefix (default brokerd)")
    d.add_argument("--regions", type=int, default=16, help=f"queue table regions, 1..{SALTS} (default 16)")
    d.add_argument("--compression", default="NONE", help="NONE, SNAPPY, ZSTD, LZ4 or GZ (the region servers' codecs)")
    d.add_argument("--tenant-splits", default="", metavar="T1,T2,...",
                   help="split sessions and retained at these tenants (big tenants: a region each from the start)")
    args = ap.parse_args(argv)
    if not 1 <= args.regions <= SALTS:
        ap.error(f"--regions is 1..{SALTS}")
    print(ddl(args.prefix, args.regions, args.compression, args.tenant_splits.split(",")), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
