"""The HBase Thrift gateway test double behaves like the gateway, as happybase sees it.

These pin down the HBase semantics the store tests rely on (see the
double's docstring for what it does differently from HBase).
"""

import happybase
import pytest

from ..hbase_double import HBaseDouble, HBaseDoubleProcess, T

_n = iter(range(1_000_000))


@pytest.fixture(scope="module")
def double(tmp_path_factory):
    d = HBaseDouble(tmp_path_factory.mktemp("double") / "h.db").start()
    yield d
    d.stop()


@pytest.fixture
def conn(double):
    c = happybase.Connection("127.0.0.1", double.port, table_prefix=f"p{next(_n)}", timeout=5000)
    yield c
    c.close()


@pytest.fixture
def table(conn):
    conn.create_table("t", {"a": {"max_versions": 1}, "b": {}})
    return conn.table("t")


def test_tables(conn):
    assert conn.tables() == []
    conn.create_table("x", {"cf": {"max_versions": 1}})
    assert conn.tables() == [b"x"]
    with pytest.raises(T.AlreadyExists):
        conn.create_table("x", {"cf": {}})
    assert conn.table("x").families()[b"cf"]["max_versions"] == 1
    with pytest.raises(T.IOError):                      # must be disabled first
        conn.delete_table("x")
    conn.delete_table("x", disable=True)
    assert conn.tables() == []
    with pytest.raises(T.IOError, match="TableNotFound"):
        conn.table("x").row(b"r")
    with pytest.raises(T.IOError, match="TableNotFound"):
        conn.table("x").put(b"r", {b"cf:q": b"v"})


def test_put_get_delete(table):
    table.put(b"r1", {b"a:x": b"1", b"a:y": b"2", b"b:z": b"3"})
    assert table.row(b"r1") == {b"a:x": b"1", b"a:y": b"2", b"b:z": b"3"}
    assert table.row(b"r1", columns=[b"a"]) == {b"a:x": b"1", b"a:y": b"2"}
    assert table.row(b"r1", columns=[b"a:"]) == {b"a:x": b"1", b"a:y": b"2"}
    assert table.row(b"r1", columns=[b"b:z", b"a:y"]) == {b"a:y": b"2", b"b:z": b"3"}
    assert table.row(b"missing") == {}
    assert table.rows([b"r1", b"missing"]) == [(b"r1", {b"a:x": b"1", b"a:y": b"2", b"b:z": b"3"})]
    table.delete(b"r1", columns=[b"a:x"])
    assert table.row(b"r1") == {b"a:y": b"2", b"b:z": b"3"}
    table.delete(b"r1", columns=[b"b"])                # a whole family
    assert table.row(b"r1") == {b"a:y": b"2"}
    table.put(b"r1", {b"b:z": b"4"})
    table.delete(b"r1")                                 # happybase sends one family delete per family
    assert table.row(b"r1") == {}
    with pytest.raises(T.IOError, match="NoSuchColumnFamily"):
        table.put(b"r1", {b"nope:x": b"1"})


def test_a_batch_delete_wins_over_a_put_of_the_same_call(table):
    with table.batch() as b:
        b.put(b"r", {b"a:x": b"1", b"a:y": b"2"})
        b.delete(b"r", columns=[b"a:x"])
    assert table.row(b"r") == {b"a:y": b"2"}


def test_timestamps(table):
    table.put(b"r", {b"a:x": b"new"}, timestamp=200)
    table.put(b"r", {b"a:x": b"old"}, timestamp=100)   # an older version does not replace the latest
    assert table.row(b"r", include_timestamp=True) == {b"a:x": (b"new", 200)}
    assert table.row(b"r", timestamp=200) == {}         # cells older than 200 only
    assert table.row(b"r", timestamp=201) == {b"a:x": b"new"}


def test_counters(table):
    assert table.counter_inc(b"r", b"a:c") == 1
    assert table.counter_inc(b"r", b"a:c", 41) == 42
    assert table.counter_dec(b"r", b"a:c", 50) == -8
    assert table.row(b"r")[b"a:c"] == (-8).to_bytes(8, "big", signed=True)
    table.counter_set(b"r", b"a:c", 2 ** 63 - 1)
    assert table.counter_inc(b"r", b"a:c") == -2 ** 63           # Java long overflow
    table.put(b"r", {b"a:s": b"abc"})
    with pytest.raises(T.IOError):
        table.counter_inc(b"r", b"a:s")


def test_scan(table):
    keys = [bytes([i // 256, i % 256]) + b"k" for i in range(2500)]
    with table.batch(batch_size=1000) as b:
        for i, k in enumerate(reversed(keys)):
            b.put(k, {b"a:i": str(i).encode(), b"b:j": b"x"})
    table.put(b"\xff\xff", {b"b:j": b"only b"})
    got = [k for k, _ in table.scan(batch_size=300)]
    assert got == sorted(keys + [b"\xff\xff"])
    assert [k for k, _ in table.scan(columns=[b"a:i"], batch_size=1000)] == keys      # rows without a:i skipped
    assert [k for k, _ in table.scan(row_start=keys[10], row_stop=keys[20])] == keys[10:20]
    assert [k for k, _ in table.scan(row_prefix=b"\x01")] == [k for k in keys if k[0] == 1]
    assert [k for k, _ in table.scan(limit=7, batch_size=3)] == keys[:7]
    assert [k for k, _ in table.scan(row_prefix=b"\x02", reverse=True)] == [k for k in keys if k[0] == 2][::-1]
    assert [k for k, _ in table.scan(row_start=keys[5], row_stop=keys[2], reverse=True)] == keys[3:6][::-1]
    row = next(iter(table.scan(row_prefix=keys[0], sorted_columns=True)))[1]
    assert list(row) == [b"a:i", b"b:j"]
    parts = list(table.scan(row_prefix=keys[0], scan_batching=1))
    assert [list(d) for _, d in parts] == [[b"a:i"], [b"b:j"]]
    with pytest.raises(T.IOError):
        list(table.scan(filter=b"KeyOnlyFilter()"))


def test_scanner_sees_deletes_made_while_paging(table):
    with table.batch() as b:
        for i in range(50):
            b.put(b"%03d" % i, {b"a:x": b"1"})
    seen = []
    with table.batch(batch_size=10) as b:
        for k, _ in table.scan(batch_size=10):
            seen.append(k)
            b.delete(k)
    assert len(seen) == 50
    assert list(table.scan()) == []


def test_fault_injection(double, table):
    double.fail("mutateRows")
    with pytest.raises(T.IOError, match="injected"):
        table.put(b"r", {b"a:x": b"1"})
    table.put(b"r", {b"a:x": b"1"})
    assert table.row(b"r") == {b"a:x": b"1"}


def test_delete_markers(tmp_path):
    """With delete markers a put not newer than a delete stays hidden, as in HBase."""
    with HBaseDouble(tmp_path / "m.db", delete_markers=True) as d:
        c = happybase.Connection("127.0.0.1", d.port, timeout=5000)
        c.create_table("t", {"a": {"max_versions": 1}})
        t = c.table("t")
        t.put(b"r", {b"a:x": b"1"}, timestamp=100)
        t.delete(b"r", timestamp=200)
        t.put(b"r", {b"a:x": b"same ms"}, timestamp=200)
        assert t.row(b"r") == {}
        t.put(b"r", {b"a:x": b"later"}, timestamp=201)
        assert t.row(b"r") == {b"a:x": b"later"}
        t.delete(b"r", columns=[b"a:x"], timestamp=300)
        t.put(b"r", {b"a:x": b"masked"}, timestamp=250)
        assert t.row(b"r") == {}
        c.compact_table("t", major=True)                # markers go away
        t.put(b"r", {b"a:x": b"after compaction"}, timestamp=250)
        assert t.row(b"r") == {b"a:x": b"after compaction"}
        c.close()


def test_delete_markers_outlive_a_gateway_restart(tmp_path):
    """Markers are HBase's data, not the gateway's: a double started again on the
    same file still hides a put not newer than a delete (until a major compaction)."""
    with HBaseDouble(tmp_path / "m.db", delete_markers=True) as d:
        c = happybase.Connection("127.0.0.1", d.port, timeout=5000)
        c.create_table("t", {"a": {"max_versions": 1}})
        c.table("t").delete(b"r", timestamp=200)
        c.close()
    with HBaseDouble(tmp_path / "m.db", delete_markers=True) as d:
        c = happybase.Connection("127.0.0.1", d.port, timeout=5000)
        t = c.table("t")
        t.put(b"r", {b"a:x": b"same ms"}, timestamp=200)
        t.put(b"other", {b"a:x": b"unmarked row"}, timestamp=200)
        assert t.row(b"r") == {}
        assert t.row(b"other") == {b"a:x": b"unmarked row"}
        c.close()


def test_process_keeps_data_across_sigkill(tmp_path):
    with HBaseDoubleProcess(tmp_path / "p.db") as proc:
        c = happybase.Connection("127.0.0.1", proc.port, timeout=5000)
        c.create_table("t", {"a": {}})
        c.table("t").put(b"r", {b"a:x": b"kept"})
        c.close()
        port = proc.port
        proc.kill()
        proc.start()
        assert proc.port == port
        c = happybase.Connection("127.0.0.1", proc.port, timeout=5000)
        assert c.table("t").row(b"r") == {b"a:x": b"kept"}
        c.close()


def test_sigstop_returns_once_the_gateway_is_stopped(tmp_path):
    """``tests.procs.sigstop``: when it returns, every thread of the double's
    process is stopped, so a call sent then gets no answer (a plain
    ``os.kill(SIGSTOP)`` returns before the process has stopped: its
    connection threads went on answering for a moment, and
    test_contract's SIGSTOPped-gateway write was now and then served)."""
    import os
    import signal

    from ..procs import _states, sigstop

    proc = HBaseDoubleProcess(tmp_path / "h.db").start()
    c = happybase.Connection("127.0.0.1", proc.port, timeout=300)
    try:
        c.tables()                                   # a connection thread is serving us
        for _ in range(50):
            sigstop(proc.proc.pid)
            assert set(_states(proc.proc.pid)) <= set("TtZX")
            os.kill(proc.proc.pid, signal.SIGCONT)
        sigstop(proc.proc.pid)
        try:
            with pytest.raises(Exception, match="timed out"):
                c.tables()
        finally:
            os.kill(proc.proc.pid, signal.SIGCONT)
    finally:
        c.close()
        proc.kill()
