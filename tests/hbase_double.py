"""A TEST DOUBLE of the HBase Thrift gateway (Thrift1 ``Hbase`` service) -- not HBase.

It serves the IDL that happybase ships (``happybase/Hbase.thrift``) with
thriftpy2 on 127.0.0.1, so that ``HBaseStore`` (and happybase itself) can be
tested without a JVM. The data lives in one SQLite file (or ``:memory:``):
killing the double's process and starting it again on the same file behaves
like a Thrift gateway dying in front of a live HBase -- open connections and
scanners are gone, committed cells are not.

Two ways to run it::

    double = HBaseDouble("/tmp/h.db").start()     # in-process, daemon threads
    double.port; double.fail("mutateRows"); double.stop()

    python -m tests.hbase_double --port 0 --data /tmp/h.db
    # prints "hbase-double ready port=NNNN", serves until killed

What it does like HBase (1.x/2.x Thrift1 gateway over ``max_versions=1``
families):

- tables with column families (``getColumnDescriptors`` names end in ``:``),
  ``createTable`` raises ``AlreadyExists``, ``deleteTable`` needs the table
  disabled first, reads and writes of a disabled table or an unknown table
  raise ``IOError`` (``TableNotFoundException`` / ``TableNotEnabledException``);
  a column of an unknown family raises ``IOError`` (``NoSuchColumnFamilyException``);
- cells keep their latest version only, with a millisecond timestamp; a put
  with an older explicit timestamp than the stored cell is a no-op, the
  ``*Ts`` deletes remove cells whose timestamp is <= the given one, the ``*Ts``
  reads return cells older than the given timestamp (``setTimeRange(0, ts)``);
- a column ``b"fam"`` (no colon) means the whole family, in deletes, gets and
  scans; ``b"fam:"`` is treated the same way (HBase 0.94 semantics and what
  happybase documents; HBase >= 0.96 reads ``fam:`` as the empty qualifier --
  happybase itself never sends it: ``batch.delete(row)`` sends ``b"fam"``);
- ``mutateRows``: within one call the deletes win over the puts (HBase applies
  the puts, then the deletes, with the same current timestamp); ``mutateRow``
  applies deletes, then puts;
- ``atomicIncrement`` / ``increment``: 8-byte big-endian signed cells;
  incrementing a cell of another width raises ``IOError``;
- scanners: rows sorted by key (bytes order), ``startRow`` inclusive,
  ``stopRow`` exclusive, column filter (rows with no matching cell are
  skipped), ``reversed``, ``batchSize`` (partial rows), ``sortColumns``;
  results are fetched from the table as the client pages through them;
  scanner ids live in the gateway process (a restart invalidates them:
  ``IllegalArgument``);
- ``mutateRows`` applies its rows each on its own, never atomically as a
  whole (HBase: each region server applies its rows; one may fail while
  others succeeded), and a fault can be injected between two rows: the rows
  before it stay written (``fail_between_rows``, ``--fault-rows N``). Rows
  are committed -- visible to other calls -- up to ``ROWS_PER_TX`` at a time,
  as a region server's mini-batch of rows becomes visible at once (MVCC);
- unexpected failures are answered with ``IOError`` instead of a dropped
  connection; in-process, ``fail(api, times)`` injects ``IOError`` failures.

For measuring round trips rather than Python: every Thrift call is counted
per API (``calls``; ``control("calls")`` on the process's control port) and
may be delayed (``--latency-ms``: the gateway-to-region-server round trip of
a real cluster, 0.5-2 ms), outside the data lock so concurrent calls overlap.

``delete_markers=True`` (``--delete-markers``) adds HBase's delete markers:
a delete leaves a marker at its timestamp, and a later put of that cell (or
family) whose timestamp is not newer -- the same millisecond -- stays hidden
until a ``majorCompact``. Off by default, because whether two calls fall in
one millisecond depends on scheduling: tests that need it must arrange it.

What it does differently (be careful when a test passes only here):

- without ``delete_markers`` a put right after a delete of the same cell is
  always visible;
- filter strings (``filterString``) are refused with ``IOError``;
  ``getRowOrBefore`` and ``getRegionInfo`` are not implemented (``IOError``);
- regions are only a list of split keys for ``getTableRegions`` (one region
  unless ``presplit`` set them); nothing is served per region.
"""

import argparse
import importlib.util
import itertools
import os
import select
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import thriftpy2
from thriftpy2.protocol import TBinaryProtocolFactory, TCompactProtocolFactory
from thriftpy2.server import TThreadedServer
from thriftpy2.thrift import TProcessor
from thriftpy2.transport import TBufferedTransportFactory, TFramedTransportFactory, TServerSocket, TSocket


def _idl():
    """The ``Hbase_thrift`` module: happybase's, if it is loaded already."""
    mod = sys.modules.get("Hbase_thrift")
    if mod is None:
        spec = importlib.util.find_spec("happybase")
        path = Path(spec.submodule_search_locations[0]) / "Hbase.thrift"
        mod = thriftpy2.load(str(path), module_name="Hbase_thrift")
    return mod


Hbase_thrift = _idl()
T = Hbase_thrift
LATEST = 0x7FFFFFFFFFFFFFFF            # HConstants.LATEST_TIMESTAMP
ROWS_PER_TX = 64                       # rows of a mutateRows applied (and made visible) together

SCHEMA = """
CREATE TABLE IF NOT EXISTS tables (name BLOB PRIMARY KEY, enabled INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS families (
    tbl BLOB NOT NULL, name BLOB NOT NULL, max_versions INTEGER, compression TEXT, in_memory INTEGER,
    bloom_filter_type TEXT, bloom_filter_vector_size INTEGER, bloom_filter_nb_hashes INTEGER,
    block_cache_enabled INTEGER, time_to_live INTEGER,
    PRIMARY KEY (tbl, name)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS cells (
    tbl BLOB NOT NULL, row BLOB NOT NULL, col BLOB NOT NULL, value BLOB NOT NULL, ts INTEGER NOT NULL,
    PRIMARY KEY (tbl, row, col)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS markers (          -- delete markers: col is fam:qual, or fam for a whole family
    tbl BLOB NOT NULL, row BLOB NOT NULL, col BLOB NOT NULL, ts INTEGER NOT NULL,
    PRIMARY KEY (tbl, row, col)) WITHOUT ROWID;
"""


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _family_range(family: bytes) -> tuple[bytes, bytes]:
    """Column names of one family: ``fam:`` <= col < ``fam;``."""
    return family + b":", family + b";"


def _split(column: bytes) -> tuple[bytes, bytes | None]:
    """``fam:qual`` -> (fam, qual); ``fam`` or ``fam:`` -> (fam, None): the whole family."""
    fam, sep, qual = column.partition(b":")
    if not sep or not qual:
        return fam, None
    return fam, qual


class _Scanner:
    __slots__ = ("table", "start", "start_inclusive", "stop", "columns", "before", "batch", "sort",
                 "reverse", "pending", "done")

    def __init__(self, table, start, stop, columns, before, batch, sort, reverse):
        self.table = table
        self.start = start or b""
        self.start_inclusive = True
        self.stop = stop or None
        self.columns = columns
        self.before = before
        self.batch = batch
        self.sort = sort
        self.reverse = reverse
        self.pending: list = []
        self.done = False


class Handler:
    """The ``Hbase`` service over SQLite; one lock, one transaction per call."""

    def __init__(self, path: str, delete_markers: bool = False):
        self.path = str(path)
        self.delete_markers = delete_markers
        self.db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        if self.path != ":memory:":
            self.db.execute("PRAGMA journal_mode = WAL")
            self.db.execute("PRAGMA synchronous = NORMAL")
        self.db.executescript(SCHEMA)
        # (table, row) of every row with a delete marker: a put reads the markers of
        # its row only if it has some (a new row -- every queued message -- has none)
        self.marked = set(self.db.execute("SELECT DISTINCT tbl, row FROM markers"))
        self.lock = threading.Lock()
        self.scanners: dict[int, _Scanner] = {}
        self._ids = itertools.count(1)
        self.row_fault = None      # (table, rows in the call) -> fail after how many rows, or None (see _Faults)
        self.splits: dict[bytes, list] = {}   # table -> split keys (HBaseDouble.presplit: what `create ... SPLITS` did)

    def close(self):
        with self.lock:
            self.db.close()

    # ----------------------------------------------------------- plumbing

    def __getattr__(self, api):
        if api in T.Hbase.thrift_services:
            def unsupported(*args):
                raise T.IOError(message=f"{api} is not implemented by the HBase test double")
            return unsupported
        raise AttributeError(api)

    def _tx(self, fn, *args):
        """Run ``fn`` in one transaction; unexpected errors become IOError."""
        with self.lock:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                result = fn(*args)
            except BaseException as exc:
                self.db.execute("ROLLBACK")
                if isinstance(exc, (T.IOError, T.IllegalArgument, T.AlreadyExists)):
                    raise
                if isinstance(exc, Exception):
                    raise T.IOError(message=f"{type(exc).__name__}: {exc}") from exc
                raise
            self.db.execute("COMMIT")
            return result

    def _table(self, name: bytes, enabled: bool = True) -> bytes:
        row = self.db.execute("SELECT enabled FROM tables WHERE name = ?", (name,)).fetchone()
        if row is None:
            raise T.IOError(message=f"org.apache.hadoop.hbase.TableNotFoundException: {name.decode(errors='replace')}")
        if enabled and not row[0]:
            raise T.IOError(message=f"org.apache.hadoop.hbase.TableNotEnabledException: "
                                    f"{name.decode(errors='replace')} is disabled")
        return name

    def _families(self, table: bytes) -> set[bytes]:
        return {r[0] for r in self.db.execute("SELECT name FROM families WHERE tbl = ?", (table,))}

    def _check_family(self, table: bytes, family: bytes, families: set | None = None) -> None:
        if family not in (families if families is not None else self._families(table)):
            raise T.IOError(message=f"org.apache.hadoop.hbase.regionserver.NoSuchColumnFamilyException: "
                                    f"Column family {family.decode(errors='replace')} does not exist in region "
                                    f"{table.decode(errors='replace')}")

    # -------------------------------------------------------------- admin

    def getTableNames(self):
        return self._tx(lambda: [r[0] for r in self.db.execute("SELECT name FROM tables ORDER BY name")])

    def isTableEnabled(self, name):
        def run():
            self._table(name, enabled=False)
            return bool(self.db.execute("SELECT enabled FROM tables WHERE name = ?", (name,)).fetchone()[0])
        return self._tx(run)

    def enableTable(self, name):
        def run():
            self._table(name, enabled=False)
            self.db.execute("UPDATE tables SET enabled = 1 WHERE name = ?", (name,))
        self._tx(run)

    def disableTable(self, name):
        def run():
            self._table(name, enabled=False)
            self.db.execute("UPDATE tables SET enabled = 0 WHERE name = ?", (name,))
        self._tx(run)

    def compact(self, name):
        self._tx(self._table, name, False)

    def majorCompact(self, name):
        def run():
            self._table(name, enabled=False)
            self.db.execute("DELETE FROM markers WHERE tbl = ?", (name,))
            self.marked = {m for m in self.marked if m[0] != name}
        self._tx(run)

    def createTable(self, name, descriptors):
        def run():
            if not name:
                raise T.IllegalArgument(message="table name is empty")
            if self.db.execute("SELECT 1 FROM tables WHERE name = ?", (name,)).fetchone():
                raise T.AlreadyExists(message=f"table name already in use: {name.decode(errors='replace')}")
            if not descriptors:
                raise T.IllegalArgument(message="a table needs at least one column family")
            self.db.execute("INSERT INTO tables VALUES (?, 1)", (name,))
            for d in descriptors:
                fam = d.name.rstrip(b":")
                if not fam or b":" in fam:
                    raise T.IllegalArgument(message=f"bad column family name {d.name!r}")
                self.db.execute("INSERT INTO families VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                                (name, fam, d.maxVersions, _text(d.compression), int(bool(d.inMemory)),
                                 _text(d.bloomFilterType), d.bloomFilterVectorSize, d.bloomFilterNbHashes,
                                 int(bool(d.blockCacheEnabled)), d.timeToLive))
        self._tx(run)

    def deleteTable(self, name):
        def run():
            self._table(name, enabled=False)
            if self.db.execute("SELECT enabled FROM tables WHERE name = ?", (name,)).fetchone()[0]:
                raise T.IOError(message=f"org.apache.hadoop.hbase.TableNotDisabledException: "
                                        f"{name.decode(errors='replace')}")
            for table in ("tables", "families", "cells", "markers"):
                self.db.execute(f"DELETE FROM {table} WHERE {'name' if table == 'tables' else 'tbl'} = ?", (name,))
            self.marked = {m for m in self.marked if m[0] != name}
        self._tx(run)

    def getColumnDescriptors(self, name):
        def run():
            self._table(name, enabled=False)
            out = {}
            for (fam, mv, comp, mem, bft, bfvs, bfnh, bce, ttl) in self.db.execute(
                    "SELECT name, max_versions, compression, in_memory, bloom_filter_type, bloom_filter_vector_size,"
                    " bloom_filter_nb_hashes, block_cache_enabled, time_to_live FROM families WHERE tbl = ?"
                    " ORDER BY name", (name,)):
                out[fam + b":"] = T.ColumnDescriptor(
                    name=fam + b":", maxVersions=mv, compression=comp, inMemory=bool(mem), bloomFilterType=bft,
                    bloomFilterVectorSize=bfvs, bloomFilterNbHashes=bfnh, blockCacheEnabled=bool(bce),
                    timeToLive=ttl)
            return out
        return self._tx(run)

    def getTableRegions(self, name):
        def run():
            self._table(name, enabled=False)
            bounds = [b"", *self.splits.get(name, ()), b""]
            return [T.TRegionInfo(startKey=lo, endKey=hi, id=i + 1, name=name + b"," + lo + b",%d.double" % (i + 1),
                                  version=1, serverName=b"127.0.0.1", port=0)
                    for i, (lo, hi) in enumerate(zip(bounds, bounds[1:], strict=False))]
        return self._tx(run)

    # -------------------------------------------------------------- reads

    def _column_clause(self, table: bytes, columns) -> tuple[str, list]:
        if not columns:
            return "", []
        families = self._families(table)
        parts, args = [], []
        for c in columns:
            fam, qual = _split(c)
            self._check_family(table, fam, families)
            if qual is None:
                lo, hi = _family_range(fam)
                parts.append("(col >= ? AND col < ?)")
                args += [lo, hi]
            else:
                parts.append("col = ?")
                args.append(fam + b":" + qual)
        return " AND (" + " OR ".join(parts) + ")", args

    def _row_cells(self, table, row, columns=None, before=None) -> list:
        where, args = self._column_clause(table, columns)
        if before is not None:
            where += " AND ts < ?"
            args.append(before)
        return self.db.execute(f"SELECT col, value, ts FROM cells WHERE tbl = ? AND row = ?{where} ORDER BY col",
                               [table, row, *args]).fetchall()

    @staticmethod
    def _result(row: bytes, cells, sort: bool = False):
        if sort:
            return T.TRowResult(row=row, sortedColumns=[T.TColumn(columnName=c, cell=T.TCell(value=v, timestamp=ts))
                                                        for c, v, ts in cells])
        return T.TRowResult(row=row, columns={c: T.TCell(value=v, timestamp=ts) for c, v, ts in cells})

    def _get_rows(self, table, rows, columns=None, before=None):
        def run():
            self._table(table)
            out = []
            for row in rows:
                cells = self._row_cells(table, row, columns, before)
                if cells:
                    out.append(self._result(row, cells))
            return out
        return self._tx(run)

    def getRow(self, table, row, attributes=None):
        return self._get_rows(table, [row])

    def getRowWithColumns(self, table, row, columns, attributes=None):
        return self._get_rows(table, [row], columns)

    def getRowTs(self, table, row, timestamp, attributes=None):
        return self._get_rows(table, [row], None, timestamp)

    def getRowWithColumnsTs(self, table, row, columns, timestamp, attributes=None):
        return self._get_rows(table, [row], columns, timestamp)

    def getRows(self, table, rows, attributes=None):
        return self._get_rows(table, rows)

    def getRowsWithColumns(self, table, rows, columns, attributes=None):
        return self._get_rows(table, rows, columns)

    def getRowsTs(self, table, rows, timestamp, attributes=None):
        return self._get_rows(table, rows, None, timestamp)

    def getRowsWithColumnsTs(self, table, rows, columns, timestamp, attributes=None):
        return self._get_rows(table, rows, columns, timestamp)

    def _cell(self, table, row, column, before=None):
        def run():
            self._table(table)
            fam, qual = _split(column)
            self._check_family(table, fam)
            cells = self._row_cells(table, row, [column], before)
            return [T.TCell(value=v, timestamp=ts) for _, v, ts in cells[:1]] if qual is not None else \
                [T.TCell(value=v, timestamp=ts) for _, v, ts in cells]
        return self._tx(run)

    def get(self, table, row, column, attributes=None):
        return self._cell(table, row, column)

    def getVer(self, table, row, column, versions, attributes=None):
        return self._cell(table, row, column)[:max(versions, 0)]

    def getVerTs(self, table, row, column, timestamp, versions, attributes=None):
        return self._cell(table, row, column, timestamp)[:max(versions, 0)]

    # ------------------------------------------------------------- writes

    def _put(self, table, row, column, value, ts):
        if self.delete_markers and (table, row) in self.marked:
            fam = column.partition(b":")[0]
            marker = self.db.execute("SELECT max(ts) FROM markers WHERE tbl = ? AND row = ? AND col IN (?, ?)",
                                     (table, row, fam, column)).fetchone()[0]
            if marker is not None and marker >= ts:
                return                      # masked by a delete marker (until a major compaction)
        self.db.execute("INSERT INTO cells VALUES (?, ?, ?, ?, ?) ON CONFLICT (tbl, row, col) DO UPDATE SET "
                        "value = excluded.value, ts = excluded.ts WHERE excluded.ts >= cells.ts",
                        (table, row, column, value, ts))

    def _put_many(self, table, puts, ts):
        """``_put`` for many cells: one read of their rows' delete markers, one statement."""
        if self.delete_markers and puts:
            rows = {row for row, _, _ in puts if (table, row) in self.marked}
            marks: dict = {}
            for row in rows:
                for col, mts in self.db.execute("SELECT col, ts FROM markers WHERE tbl = ? AND row = ?", (table, row)):
                    marks[(row, col)] = mts
            if marks:
                puts = [(row, column, value) for row, column, value in puts
                        if max(marks.get((row, column), -1), marks.get((row, column.partition(b":")[0]), -1)) < ts]
        self.db.executemany("INSERT INTO cells VALUES (?, ?, ?, ?, ?) ON CONFLICT (tbl, row, col) DO UPDATE SET "
                            "value = excluded.value, ts = excluded.ts WHERE excluded.ts >= cells.ts",
                            [(table, row, column, value, ts) for row, column, value in puts])

    def _delete(self, table, row, column, ts=LATEST):
        """Delete a column (``fam:qual``) or a whole family (``fam``), versions <= ts."""
        fam, qual = _split(column)
        if self.delete_markers:
            self.db.execute("INSERT INTO markers VALUES (?, ?, ?, ?) ON CONFLICT (tbl, row, col) DO UPDATE SET "
                            "ts = max(ts, excluded.ts)",
                            (table, row, fam if qual is None else fam + b":" + qual,
                             _now_ms() if ts == LATEST else ts))
            self.marked.add((table, row))
        if qual is None:
            lo, hi = _family_range(fam)
            self.db.execute("DELETE FROM cells WHERE tbl = ? AND row = ? AND col >= ? AND col < ? AND ts <= ?",
                            (table, row, lo, hi, ts))
        else:
            self.db.execute("DELETE FROM cells WHERE tbl = ? AND row = ? AND col = ? AND ts <= ?",
                            (table, row, fam + b":" + qual, ts))

    def _delete_many(self, table, deletes, ts=LATEST):
        """``_delete`` for many ``(row, column)``: one statement per kind."""
        if not deletes:
            return
        cols, fams = [], []
        for row, column in deletes:
            fam, qual = _split(column)
            if qual is None:
                fams.append((row, fam))
            else:
                cols.append((row, fam + b":" + qual))
        if self.delete_markers:
            mts = _now_ms() if ts == LATEST else ts
            self.db.executemany("INSERT INTO markers VALUES (?, ?, ?, ?) ON CONFLICT (tbl, row, col) DO UPDATE SET "
                                "ts = max(ts, excluded.ts)", [(table, row, col, mts) for row, col in fams + cols])
            self.marked.update((table, row) for row, _ in deletes)
        if fams:
            self.db.executemany("DELETE FROM cells WHERE tbl = ? AND row = ? AND col >= ? AND col < ? AND ts <= ?",
                                [(table, row, *_family_range(fam), ts) for row, fam in fams])
        if cols:
            self.db.executemany("DELETE FROM cells WHERE tbl = ? AND row = ? AND col = ? AND ts <= ?",
                                [(table, row, col, ts) for row, col in cols])

    def _mutate(self, table, batches, timestamp, puts_first):
        def check():
            self._table(table)
            families = self._families(table)
            for row, mutations in batches:
                if row is None:
                    raise T.IllegalArgument(message="row is null")
                for m in mutations or ():
                    self._check_family(table, _split(m.column or b"")[0], families)

        def run(rows):
            now = _now_ms()
            ts = now if timestamp is None or timestamp == LATEST else timestamp
            dts = LATEST if timestamp is None else timestamp
            puts, deletes = [], []
            for row, mutations in rows:
                for m in mutations or ():
                    fam, qual = _split(m.column or b"")
                    if m.isDelete:
                        deletes.append((row, m.column))
                    elif qual is not None:           # HBase ignores a put without qualifier (logs a warning)
                        puts.append((row, fam + b":" + qual, m.value if m.value is not None else b""))
            if not puts_first:
                self._delete_many(table, deletes, dts)
            self._put_many(table, puts, ts)
            if puts_first:                           # rows are independent: each row's puts, then its deletes
                self._delete_many(table, deletes, dts)

        self._tx(check)                               # a bad table, row or family fails the call first
        if not puts_first:                            # mutateRow: one row, atomic
            self._tx(run, batches)
            return
        # mutateRows: rows on their own, like HBase -- a region server applies the
        # rows of its regions in mini-batches, another server may fail: a failure
        # between rows leaves the earlier rows written. Applied (and committed, so
        # visible to other calls) ROWS_PER_TX rows at a time, as a region server's
        # mini-batch becomes visible at once; a fault injected after row N commits
        # rows 1..N first.
        grouped: dict[bytes, list] = {}
        for row, mutations in batches:
            grouped.setdefault(row, []).extend(mutations or ())
        rows = list(grouped.items())
        fault = self.row_fault(table, len(rows)) if self.row_fault is not None and len(rows) > 1 else None
        done = rows if fault is None else rows[:fault]
        for i in range(0, len(done), ROWS_PER_TX):
            self._tx(run, done[i:i + ROWS_PER_TX])
        if fault is not None:
            raise T.IOError(message=f"injected failure of mutateRows after {fault} of {len(rows)} rows "
                                    f"(HBase test double)")

    def mutateRow(self, table, row, mutations, attributes=None):
        self._mutate(table, [(row, mutations)], None, puts_first=False)

    def mutateRowTs(self, table, row, mutations, timestamp, attributes=None):
        self._mutate(table, [(row, mutations)], timestamp, puts_first=False)

    def mutateRows(self, table, batches, attributes=None):
        self._mutate(table, [(b.row, b.mutations) for b in batches or ()], None, puts_first=True)

    def mutateRowsTs(self, table, batches, timestamp, attributes=None):
        self._mutate(table, [(b.row, b.mutations) for b in batches or ()], timestamp, puts_first=True)

    def deleteAll(self, table, row, column, attributes=None):
        self.deleteAllTs(table, row, column, LATEST)

    def deleteAllTs(self, table, row, column, timestamp, attributes=None):
        def run():
            self._table(table)
            self._check_family(table, _split(column)[0])
            self._delete(table, row, column, timestamp)
        self._tx(run)

    def deleteAllRow(self, table, row, attributes=None):
        self.deleteAllRowTs(table, row, LATEST)

    def deleteAllRowTs(self, table, row, timestamp, attributes=None):
        def run():
            self._table(table)
            for fam in self._families(table):
                self._delete(table, row, fam, timestamp)
        self._tx(run)

    def _increment(self, table, row, column, amount):
        self._table(table)
        fam, qual = _split(column)
        self._check_family(table, fam)
        if qual is None:
            raise T.IllegalArgument(message="atomicIncrement needs a column qualifier")
        col = fam + b":" + qual
        cur = self.db.execute("SELECT value FROM cells WHERE tbl = ? AND row = ? AND col = ?",
                              (table, row, col)).fetchone()
        if cur is not None and len(cur[0]) != 8:
            raise T.IOError(message="org.apache.hadoop.hbase.DoNotRetryIOException: Field is not a long, "
                                    f"it's {len(cur[0])} bytes wide")
        value = (int.from_bytes(cur[0], "big", signed=True) if cur else 0) + amount
        value = (value + 2**63) % 2**64 - 2**63        # Java long arithmetic
        self._put(table, row, col, value.to_bytes(8, "big", signed=True), _now_ms())
        return value

    def atomicIncrement(self, table, row, column, value):
        return self._tx(self._increment, table, row, column, value)

    def increment(self, inc):
        self._tx(self._increment, inc.table, inc.row, inc.column, inc.ammount)

    def incrementRows(self, incs):
        def run():
            for inc in incs or ():
                self._increment(inc.table, inc.row, inc.column, inc.ammount)
        self._tx(run)

    def append(self, app):
        def run():
            self._table(app.table)
            families = self._families(app.table)
            out = []
            now = _now_ms()
            for column, value in zip(app.columns or (), app.values or (), strict=False):
                fam, qual = _split(column)
                self._check_family(app.table, fam, families)
                col = fam + b":" + (qual or b"")
                cur = self.db.execute("SELECT value FROM cells WHERE tbl = ? AND row = ? AND col = ?",
                                      (app.table, app.row, col)).fetchone()
                new = (cur[0] if cur else b"") + value
                self._put(app.table, app.row, col, new, now)
                out.append(T.TCell(value=new, timestamp=now))
            return out
        return self._tx(run)

    def checkAndPut(self, table, row, column, value, mput, attributes=None):
        def run():
            self._table(table)
            fam, qual = _split(column)
            self._check_family(table, fam)
            cur = self.db.execute("SELECT value FROM cells WHERE tbl = ? AND row = ? AND col = ?",
                                  (table, row, fam + b":" + (qual or b""))).fetchone()
            if (cur[0] if cur else None) != (value or None):
                return False
            mfam, mqual = _split(mput.column)
            self._check_family(table, mfam)
            if mput.isDelete:
                self._delete(table, row, mput.column)
            else:
                self._put(table, row, mfam + b":" + (mqual or b""), mput.value or b"", _now_ms())
            return True
        return self._tx(run)

    # ----------------------------------------------------------- scanners

    def _open(self, table, start, stop, columns, before=None, batch=None, sort=False, reverse=False,
              filter_string=None):
        def run():
            self._table(table)
            if filter_string:
                raise T.IOError(message="filter strings are not supported by the HBase test double")
            self._column_clause(table, columns)          # unknown families fail now, like HBase
            sid = next(self._ids)
            self.scanners[sid] = _Scanner(table, start, stop, list(columns or ()), before,
                                          batch if batch and batch > 0 else None, bool(sort), bool(reverse))
            return sid
        return self._tx(run)

    def scannerOpenWithScan(self, table, scan, attributes=None):
        return self._open(table, scan.startRow, scan.stopRow, scan.columns, scan.timestamp, scan.batchSize,
                          scan.sortColumns, scan.reversed, scan.filterString)

    def scannerOpen(self, table, start, columns, attributes=None):
        return self._open(table, start, None, columns)

    def scannerOpenWithStop(self, table, start, stop, columns, attributes=None):
        return self._open(table, start, stop, columns)

    def scannerOpenWithPrefix(self, table, prefix, columns, attributes=None):
        return self._open(table, prefix, _increment_bytes(prefix), columns)

    def scannerOpenTs(self, table, start, columns, timestamp, attributes=None):
        return self._open(table, start, None, columns, timestamp)

    def scannerOpenWithStopTs(self, table, start, stop, columns, timestamp, attributes=None):
        return self._open(table, start, stop, columns, timestamp)

    def _fill(self, sc: _Scanner, n: int) -> None:
        """Read up to ``n`` more rows of the scanner's range into ``sc.pending``."""
        where, args = self._column_clause(sc.table, sc.columns)
        if sc.before is not None:
            where += " AND ts < ?"
            args.append(sc.before)
        if sc.reverse:
            bounds = ""
            bargs = []
            if sc.start:
                bounds += " AND row <= ?" if sc.start_inclusive else " AND row < ?"
                bargs.append(sc.start)
            if sc.stop:
                bounds += " AND row > ?"
                bargs.append(sc.stop)
            order = "DESC"
        else:
            bounds = " AND row >= ?" if sc.start_inclusive else " AND row > ?"
            bargs = [sc.start]
            if sc.stop:
                bounds += " AND row < ?"
                bargs.append(sc.stop)
            order = "ASC"
        rows = [r[0] for r in self.db.execute(
            f"SELECT DISTINCT row FROM cells WHERE tbl = ?{bounds}{where} ORDER BY row {order} LIMIT ?",
            [sc.table, *bargs, *args, n])]
        if not rows:
            sc.done = True
            return
        for row in rows:
            cells = self._row_cells(sc.table, row, sc.columns, sc.before)
            step = sc.batch or len(cells) or 1
            for i in range(0, len(cells), step):
                sc.pending.append(self._result(row, cells[i:i + step], sc.sort))
        sc.start, sc.start_inclusive = rows[-1], False

    def scannerGetList(self, sid, n):
        def run():
            sc = self.scanners.get(sid)
            if sc is None:
                raise T.IllegalArgument(message="scanner ID is invalid")
            self._table(sc.table)
            out = []
            while len(out) < n:
                if not sc.pending:
                    if sc.done:
                        break
                    self._fill(sc, max(n - len(out), 1))
                    continue
                out.append(sc.pending.pop(0))
            return out
        return self._tx(run)

    def scannerGet(self, sid):
        return self.scannerGetList(sid, 1)

    def scannerClose(self, sid):
        def run():
            if self.scanners.pop(sid, None) is None:
                raise T.IllegalArgument(message="scanner ID is invalid")
        self._tx(run)


def _text(v):
    return v.decode() if isinstance(v, bytes) else v


def _increment_bytes(b: bytes) -> bytes | None:
    b = bytearray(b)
    for i in range(len(b) - 1, -1, -1):
        if b[i] != 0xFF:
            b[i] += 1
            return bytes(b[:i + 1])
    return None


class _Faults:
    """The handler as the processor sees it: every Thrift call counted
    (``calls``, per API), delayed by ``latency_ms`` (outside the data lock,
    like a network round trip: concurrent calls overlap), and injectable
    failures:

    - ``fail("mutateRows")`` makes the next ``mutateRows`` raise ``IOError``
      before touching the data (a region server refusing the write);
    - ``fail_between_rows(after, times, skip)``: the next ``times``
      ``mutateRows`` calls of more than ``after`` rows (after ``skip`` such
      calls) write their first ``after`` rows, then raise ``IOError`` (one
      region server took its rows, another failed);
    - ``fail_rows_every(n)``: from now on every ``n``-th ``mutateRows`` of two
      rows or more fails halfway through its rows (``--fault-rows N``);
    - ``slow(api, seconds, times)``: the next ``times`` calls of ``api`` wait
      ``seconds`` more before they are applied (a region server busy with one
      write while the next arrives: calls overtaking each other).
    """

    def __init__(self, handler: Handler, latency_ms: float = 0.0):
        self.handler = handler
        self.latency = latency_ms / 1000.0
        self.pending: dict[str, int] = {}
        self.slowed: dict[str, list] = {}      # api -> extra seconds of its next calls
        self.calls: dict[str, int] = {}
        self.lock = threading.Lock()
        self._between: list[int] = []          # pending between-rows faults: rows to write first
        self._every = 0
        self._multi = 0                        # multi-row mutateRows calls seen (for fail_rows_every)
        self.row_faults = 0                    # between-rows faults injected so far
        self.running: dict[str, int] = {}      # api -> calls of it being served now
        self.most_at_once: dict[str, int] = {}  # api -> the most calls of it ever served at once
        handler.row_fault = self._row_fault

    def fail(self, api: str, times: int = 1) -> None:
        if api not in T.Hbase.thrift_services:
            raise ValueError(f"no such Hbase call: {api}")
        with self.lock:
            self.pending[api] = self.pending.get(api, 0) + times

    def slow(self, api: str, seconds: float, times: int = 1) -> None:
        if api not in T.Hbase.thrift_services:
            raise ValueError(f"no such Hbase call: {api}")
        with self.lock:
            self.slowed.setdefault(api, []).extend([seconds] * times)

    def fail_between_rows(self, after: int = 1, times: int = 1, skip: int = 0) -> None:
        if after < 1:
            raise ValueError("after must be >= 1 (a failure before the first row is fail('mutateRows'))")
        with self.lock:
            self._between += [[after, skip] for _ in range(times)]

    def fail_rows_every(self, n: int) -> None:
        with self.lock:
            self._every = max(int(n), 0)
            self._multi = 0

    def _row_fault(self, table, total: int) -> int | None:
        """Does this ``mutateRows`` of ``total`` rows fail, after how many rows?
        (The pending fault met first in row order: a between-rows fault at its
        row count, or, every ``n``-th call, the middle row.)"""
        with self.lock:
            half = total // 2 if self._every and self._multi % self._every == 0 else None
            head = self._between[0] if self._between else None
            if head is not None and head[0] < total and (half is None or head[0] <= half):
                if head[1]:                        # not this call: a later one
                    head[1] -= 1
                else:
                    self._between.pop(0)
                    self.row_faults += 1
                    return head[0]
            if half:
                self.row_faults += 1
                return half
        return None

    def snapshot(self) -> dict:
        with self.lock:
            return {"calls": dict(self.calls), "total": sum(self.calls.values()), "row_faults": self.row_faults}

    def reset(self) -> None:
        with self.lock:
            self.calls.clear()

    def __getattr__(self, api):
        fn = getattr(self.handler, api)

        def call(*args):
            with self.lock:
                self.calls[api] = self.calls.get(api, 0) + 1
                n = self.pending.get(api, 0)
                if n:
                    self.pending[api] = n - 1
                if api in ("mutateRows", "mutateRowsTs") and len(args) > 1 and len(args[1] or ()) > 1:
                    self._multi += 1
                extra = self.slowed[api].pop(0) if self.slowed.get(api) else 0.0
                self.running[api] = running = self.running.get(api, 0) + 1
                self.most_at_once[api] = max(self.most_at_once.get(api, 0), running)
            try:
                if self.latency or extra:
                    time.sleep(self.latency + extra)
                if n:
                    raise T.IOError(message=f"injected failure of {api} (HBase test double)")
                return fn(*args)
            finally:
                with self.lock:
                    self.running[api] -= 1
        return call


class _Control:
    """A line protocol on 127.0.0.1 for a double in another process (tests, bench):
    ``calls`` -> JSON of the call counts; ``reset``; ``latency MS``;
    ``fault-rows N`` (see ``_Faults.fail_rows_every``); ``fail API [TIMES]``;
    ``between AFTER [TIMES]``. Each answered with one line (``ok`` or JSON)."""

    def __init__(self, faults: "_Faults", host: str):
        self.faults = faults
        self.sock = socket.create_server((host, 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True, name="hbase-double-control").start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._client, args=(conn,), daemon=True).start()

    def _client(self, conn):
        with conn, conn.makefile("rw") as f:
            for line in f:
                f.write(self.command(line.split()) + "\n")
                f.flush()

    def command(self, words: list[str]) -> str:
        import json

        try:
            cmd = words[0]
            if cmd == "calls":
                return json.dumps(self.faults.snapshot())
            if cmd == "reset":
                self.faults.reset()
            elif cmd == "latency":
                self.faults.latency = float(words[1]) / 1000.0
            elif cmd == "fault-rows":
                self.faults.fail_rows_every(int(words[1]))
            elif cmd == "fail":
                self.faults.fail(words[1], int(words[2]) if len(words) > 2 else 1)
            elif cmd == "between":
                self.faults.fail_between_rows(int(words[1]), int(words[2]) if len(words) > 2 else 1)
            else:
                return f"error: unknown command {cmd!r}"
            return "ok"
        except (IndexError, ValueError) as exc:
            return f"error: {exc}"

    def close(self):
        self.sock.close()


def control(address: str, *words) -> str:
    """Send one command to a double's control port (``HOST:PORT``); -> its answer line."""
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), 5) as s, s.makefile("rw") as f:
        f.write(" ".join(map(str, words)) + "\n")
        f.flush()
        return f.readline().strip()


# ------------------------------------------------------------------ server

class _ServerSocket(TServerSocket):
    """Binds the given port -- 0 included -- and exposes the real one as ``port``."""

    def _init_sock(self):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # restart on the same port (TIME_WAIT)
        self.sock = sock

    def listen(self):
        super().listen()
        self.port = self.sock.getsockname()[1]

    def accept(self):
        client = super().accept()
        # answers go out at once: with Nagle's algorithm, an answer written in two
        # pieces (a scanner's rows past the transport's buffer) waited for the
        # client's delayed ACK, 40 ms, a stall the gateway's network would not add
        client.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return client


class _Server(TThreadedServer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, daemon=True, **kwargs)
        self.clients: set = set()
        self.clients_lock = threading.Lock()

    def serve(self):
        while not self.closed:
            try:
                client = self.trans.accept()
            except OSError:
                if self.closed:
                    return
                raise
            with self.clients_lock:
                self.clients.add(client)
            threading.Thread(target=self.handle, args=(client,), daemon=True, name="hbase-double-conn").start()

    def handle(self, client: TSocket):
        itrans = self.itrans_factory.get_transport(client)
        otrans = self.otrans_factory.get_transport(client)
        iprot = self.iprot_factory.get_protocol(itrans)
        oprot = self.oprot_factory.get_protocol(otrans)
        try:
            while not self.closed:
                self.processor.process(iprot, oprot)
        except Exception:        # client went away, or we are stopping
            pass
        finally:
            with self.clients_lock:
                self.clients.discard(client)
            try:
                itrans.close()
            except (AttributeError, OSError):  # close() closed it at the same moment (not thread-safe)
                pass

    def close(self):
        self.closed = True
        self.trans.close()
        with self.clients_lock:
            clients = list(self.clients)
        for c in clients:                      # like a gateway process dying: every connection drops
            try:
                c.close()
            except (AttributeError, OSError):  # its handler thread closed it at the same moment
                pass                           # (thriftpy2's TSocket.close is not thread-safe)


class HBaseDouble:
    """The double in this process: ``HBaseDouble(path).start()``; ``.port``; ``.stop()``."""

    def __init__(self, path=":memory:", host="127.0.0.1", port=0, transport="buffered", protocol="binary",
                 delete_markers=False, latency_ms=0.0):
        self.path = str(path)
        self.delete_markers = delete_markers
        self.latency_ms = latency_ms
        self.host = host
        self.port = port
        self.transport = transport
        self.protocol = protocol
        self.handler: Handler | None = None
        self.faults: _Faults | None = None
        self.control: _Control | None = None
        self.server: _Server | None = None
        self.thread: threading.Thread | None = None

    def start(self) -> "HBaseDouble":
        self.handler = Handler(self.path, self.delete_markers)
        sock = _ServerSocket(host=self.host, port=self.port, client_timeout=None)
        trans = {"buffered": TBufferedTransportFactory, "framed": TFramedTransportFactory}[self.transport]()
        proto = {"binary": TBinaryProtocolFactory, "compact": TCompactProtocolFactory}[self.protocol](
            decode_response=False)
        self.faults = _Faults(self.handler, self.latency_ms)
        self.server = _Server(TProcessor(T.Hbase, self.faults), sock, itrans_factory=trans, iprot_factory=proto)
        sock.listen()
        self.port = sock.port
        self.thread = threading.Thread(target=self.server.serve, daemon=True, name="hbase-double")
        self.thread.start()
        return self

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def fail(self, api: str, times: int = 1) -> None:
        """The next ``times`` calls of ``api`` raise ``IOError`` (changing nothing)."""
        self.faults.fail(api, times)

    def fail_between_rows(self, after: int = 1, times: int = 1, skip: int = 0) -> None:
        """The next ``times`` ``mutateRows`` of more than ``after`` rows (after ``skip``
        such calls) write ``after`` rows, then fail."""
        self.faults.fail_between_rows(after, times, skip)

    def presplit(self, table: str, keys: list[bytes]) -> None:
        """The table's regions start at ``keys`` (as the HBase shell's ``create ..., SPLITS``
        leaves them: Thrift1 cannot pass split keys); ``getTableRegions`` reports them."""
        self.handler.splits[table.encode()] = list(keys)

    @property
    def calls(self) -> dict:
        """Thrift calls served so far: ``{"calls": {api: n}, "total": n, "row_faults": n}``."""
        return self.faults.snapshot()

    def serve_control(self) -> int:
        """Open the control port (see ``_Control``); -> its number."""
        self.control = _Control(self.faults, self.host)
        return self.control.port

    def stop(self) -> None:
        if self.control is not None:
            self.control.close()
            self.control = None
        if self.server is not None:
            self.server.close()
            self.thread.join(5)
            self.handler.close()
            self.server = self.thread = self.handler = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


class HBaseDoubleProcess:
    """The double as a child process (``python -m tests.hbase_double``), so a
    test can SIGKILL it and start it again on the same data file and port."""

    READY = "hbase-double ready port="

    def __init__(self, data, port: int = 0, host: str = "127.0.0.1", timeout: float = 15.0,
                 delete_markers: bool = False, latency_ms: float = 0.0, fault_rows: int = 0):
        self.data = str(data)
        self.host = host
        self.port = port
        self.timeout = timeout
        self.delete_markers = delete_markers
        self.latency_ms = latency_ms
        self.fault_rows = fault_rows
        self.control_port = 0
        self.proc: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> "HBaseDoubleProcess":
        root = Path(__file__).resolve().parent.parent
        cmd = [sys.executable, "-m", "tests.hbase_double", "--host", self.host, "--port", str(self.port),
               "--data", self.data, "--latency-ms", str(self.latency_ms), "--fault-rows", str(self.fault_rows),
               "--control"]
        if self.delete_markers:
            cmd.append("--delete-markers")
        deadline = time.monotonic() + self.timeout
        while True:
            self.proc = subprocess.Popen(cmd, cwd=root, stdout=subprocess.PIPE, text=True,
                                         env=dict(os.environ, PYTHONUNBUFFERED="1"))
            line = ""
            while time.monotonic() < deadline and self.proc.poll() is None:
                if select.select([self.proc.stdout], [], [], 0.1)[0]:
                    line = self.proc.stdout.readline()
                    break
            if line.startswith(self.READY):
                ready = dict(w.split("=", 1) for w in line.split()[2:])
                self.port = int(ready["port"])
                self.control_port = int(ready.get("control", 0))
                return self
            self.kill()
            if time.monotonic() >= deadline:      # the port may still be held briefly after a kill: retry
                raise RuntimeError(f"the HBase double did not start: {cmd}")
            time.sleep(0.2)

    def kill(self, sig=signal.SIGKILL) -> None:
        """Kill the gateway (SIGKILL: no goodbye to its clients) and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()
        self.proc = None

    def control(self, *words) -> str:
        """One command to the double's control port (see ``_Control``): ``control("calls")``."""
        return control(f"{self.host}:{self.control_port}", *words)

    def calls(self) -> dict:
        """Thrift calls served since the start (or the last ``reset``)."""
        import json

        return json.loads(self.control("calls"))

    def restart(self) -> "HBaseDoubleProcess":
        self.kill()
        return self.start()

    def stop(self) -> None:
        self.kill(signal.SIGTERM)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.kill()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m tests.hbase_double",
                                 description="A test double of the HBase Thrift1 gateway (not HBase).")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--data", default=":memory:", help="SQLite file holding the tables (default: in memory)")
    ap.add_argument("--transport", choices=("buffered", "framed"), default="buffered")
    ap.add_argument("--protocol", choices=("binary", "compact"), default="binary")
    ap.add_argument("--delete-markers", action="store_true",
                    help="hide puts not newer than a delete of the same cell (same millisecond), like HBase")
    ap.add_argument("--latency-ms", type=float, default=0.0,
                    help="added to every Thrift call (a gateway and region server round trip)")
    ap.add_argument("--fault-rows", type=int, default=0, metavar="N",
                    help="every N-th mutateRows of 2+ rows fails halfway through its rows (0: never)")
    ap.add_argument("--control", action="store_true",
                    help="open a control port (call counts, faults, latency), printed as control=PORT")
    args = ap.parse_args(argv)
    double = HBaseDouble(args.data, args.host, args.port, args.transport, args.protocol,
                         args.delete_markers, args.latency_ms).start()
    if args.fault_rows:
        double.faults.fail_rows_every(args.fault_rows)
    extra = f" control={double.serve_control()}" if args.control else ""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    print(f"hbase-double ready port={double.port}{extra}", flush=True)
    stop.wait()
    double.stop()
    os._exit(0)


if __name__ == "__main__":
    main()
