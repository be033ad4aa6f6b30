"""HBase tables as created: column-family settings stated in code, and the
queue table pre-split on its salt byte by the DDL the store prints (the
Thrift1 gateway cannot pass split keys, so the store warns at start-up when
the queue table has fewer regions than ``regions``)."""

import bisect
import logging

import happybase
import pytest

from brokerd.store.hbase import (
    SALTS,
    ddl,
    families,
    main,
    queue_prefix,
    session_key,
    split_keys,
    tenant_split_keys,
)

from .test_contract import SyncStore


@pytest.fixture
def double(tmp_path):
    from ..hbase_double import HBaseDouble

    d = HBaseDouble(tmp_path / "hbase.db", delete_markers=True).start()
    yield d
    d.stop()


def test_tables_are_created_with_the_stated_family_settings(double):
    store = SyncStore(f"hbase://{double.address}?table_prefix=cf&compression=snappy")
    store.close()
    conn = happybase.Connection("127.0.0.1", double.port, table_prefix="cf", timeout=5000)
    try:
        assert sorted(conn.tables()) == sorted(n.encode() for n in families())
        for name, fams in families("SNAPPY").items():
            got = conn.table(name).families()
            assert set(got) == {f.encode() for f in fams}
            for fam in fams:
                d = got[fam.encode()]
                assert d["max_versions"] == 1
                assert d["bloom_filter_type"] == b"ROW"
                assert d["compression"] == b"SNAPPY"
                assert d["time_to_live"] == -1            # no TTL set (HBase: FOREVER): expiry is per row
                assert d["in_memory"] == (name == "counters")
    finally:
        conn.close()


def test_the_queue_table_is_split_evenly_on_the_salt():
    keys = split_keys(16)
    assert keys == [bytes((i * 4,)) for i in range(1, 16)]
    assert split_keys(1) == []
    assert len(split_keys(SALTS)) == SALTS - 1
    # every session's queue is one contiguous range inside one region
    salts = {queue_prefix("t", f"sensor-{i:04d}")[0] for i in range(1000)}
    assert len(salts) == SALTS


def test_ddl_prints_the_shell_commands(capsys):
    assert main(["ddl", "--prefix", "prod", "--regions", "4", "--compression", "zstd"]) == 0
    out = capsys.readouterr().out
    assert out == ddl("prod", 4, "ZSTD")
    lines = out.splitlines()
    assert len(lines) == len(families())
    queue = next(ln for ln in lines if ln.startswith("create 'prod_queue'"))
    assert queue.endswith('SPLITS => ["\\x10", "\\x20", "\\x30"]')
    assert "COMPRESSION => 'ZSTD'" in queue and "VERSIONS => 1" in queue and "BLOOMFILTER => 'ROW'" in queue
    assert "IN_MEMORY => 'true'" in next(ln for ln in lines if "prod_counters" in ln)
    with pytest.raises(SystemExit):
        main(["ddl", "--regions", "65"])


def test_sessions_and_retained_can_be_split_at_big_tenants(capsys):
    """Their keys start with the tenant (no salt: see docs/operations.md): the DDL
    splits them where the operator names tenants, each named one starting a region."""
    assert main(["ddl", "--prefix", "p", "--tenant-splits", "globex,acme"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for table in ("sessions", "retained"):
        line = next(ln for ln in lines if ln.startswith(f"create 'p_{table}'"))
        assert line.endswith('SPLITS => ["acme\\x00", "globex\\x00"]')
    assert "SPLITS" not in next(ln for ln in lines if ln.startswith("create 'p_counters'"))
    assert "SPLITS" not in ddl("p", 4).splitlines()[0]             # none named: sessions not split
    keys = tenant_split_keys(["globex", "acme"])

    def region(tenant, rest):                 # a session's (client id) or a retained message's (topic) row
        return bisect.bisect_right(keys, session_key(tenant, rest))

    assert region("aaa", "x") == 0
    assert {region("acme", c) for c in ("", "dev-1", "\uffff")} == {1}
    assert region("acme-eu", "a/b") == 1 and region("b", "x") == 1      # up to the next tenant named
    assert {region("globex", c) for c in ("", "sensors/#")} == {2} and region("zeta", "x") == 2


def test_a_queue_table_that_is_not_pre_split_is_reported_at_start(double, caplog):
    caplog.set_level(logging.WARNING, logger="brokerd.store")
    SyncStore(f"hbase://{double.address}?table_prefix=ps&regions=8").close()
    assert "has 1 region(s), fewer than regions=8" in caplog.text
    assert "python -m brokerd.store.hbase ddl --prefix ps --regions 8" in caplog.text
    caplog.clear()
    double.presplit("ps_queue", split_keys(8))           # what the DDL's SPLITS leave
    SyncStore(f"hbase://{double.address}?table_prefix=ps&regions=8").close()
    assert "region(s)" not in caplog.text


def test_bad_store_options_are_refused():
    from brokerd.store import open_store

    for bad in ("regions=0", "regions=65", "purge_pace=0", "purge_pace=x", "parallel=0", "parallel=17", "parallel=x",
                "pipeline=0", "pipeline=9", "pipeline=x"):
        with pytest.raises(ValueError, match="bad store URL"):
            open_store(f"hbase://127.0.0.1:9090?{bad}")
    assert open_store("hbase://127.0.0.1:9090?pipeline=4").pipeline == 4
