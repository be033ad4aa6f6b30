"""brokerd's usage log (``--usage-dir``), what the Spark reports read: real
paho clients make traffic whose figures the test counts itself, then the
JSON Lines files are read back (every BROKERD_USAGE_INTERVAL seconds a new
file: 1 s here, a minute by default)."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ..controlplane import ControlPlane
from ..mqtt import V5, V311, PahoClient
from ..procs import ROOT, BrokerProcess

FIELDS = ("msgs_in_q0", "msgs_in_q1", "msgs_in_q2", "bytes_in", "msgs_out", "bytes_out", "dropped_queue_full",
          "dropped_expired", "dropped_no_subscribers", "acl_denied", "quota_rejected", "auth_failures")


def rows(directory: Path, dataset: str) -> list[dict]:
    out = []
    for path in sorted((directory / dataset).glob("date=*/*.jsonl")):
        for line in path.read_text().splitlines():
            out.append(json.loads(line))
    return out


def traffic_by(directory: Path, tenant: str) -> dict[str, dict]:
    """Per topic, the sums over every file and minute."""
    out: dict[str, dict] = {}
    for r in rows(directory, "traffic"):
        if r["tenant"] != tenant:
            continue
        acc = out.setdefault(r["topic"], dict.fromkeys(FIELDS, 0))
        for f in FIELDS:
            acc[f] += r[f]
    return out


def wait_for(fn, timeout=8.0):
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.2)


@pytest.fixture
def plane(tmp_path):
    (tmp_path / "console").mkdir()
    return ControlPlane(tmp_path / "console")


def test_traffic_and_connections_written_as_counted(plane, tmp_path):
    usage = tmp_path / "usage"
    secrets = plane.provision([
        {"slug": "acme", "default_acl": "deny", "devices": ["sub", "pub"],
         "acl": [{"topic": "t/#", "action": "both", "allow": True}]},
    ])
    env = dict(plane.env, BROKERD_USAGE_INTERVAL="1")
    node = BrokerProcess("--sys-interval", "0", "--usage-dir", str(usage), "--node-id", "u1", env=env).start()
    try:
        port = node.port()
        sub = PahoClient("usage-sub", version=V5, username="acme/sub", password=secrets["acme/sub"]).connect(port)
        sub.subscribe("t/a", qos=2)
        sub.subscribe("t/+", qos=0)                 # overlapping: one delivery per message still
        pub = PahoClient("usage-pub", version=V311, username="acme/pub", password=secrets["acme/pub"]).connect(port)
        sent = {0: 6, 1: 4, 2: 3}
        size_in = 0
        for qos, n in sent.items():
            for i in range(n):
                payload = b"x" * (10 + i)
                pub.publish("t/a", payload, qos=qos)
                size_in += len(payload)
        pub.publish("t/b/deep", b"nobody", qos=1)   # allowed, no subscriber
        pub.publish("forbidden", b"no", qos=1)      # ACL denies (3.1.1: dropped, PUBACK sent)
        sub.expect_n(13)
        with pytest.raises(ConnectionError):
            PahoClient("usage-bad", version=V311, username="acme/pub", password="wrong").connect(port)
        pub.disconnect()

        def settled():
            t = traffic_by(usage, "acme")
            return t if t.get("t/a", {}).get("msgs_out") == 13 and t.get("", {}).get("auth_failures") else None
        t = wait_for(settled)
        assert t, traffic_by(usage, "acme")
        a = t["t/a"]
        assert (a["msgs_in_q0"], a["msgs_in_q1"], a["msgs_in_q2"]) == (6, 4, 3)
        assert a["bytes_in"] == size_in
        assert (a["msgs_out"], a["bytes_out"]) == (13, size_in)
        assert t["t/b/deep"]["dropped_no_subscribers"] == 1 and t["t/b/deep"]["msgs_out"] == 0
        assert t["forbidden"]["acl_denied"] == 1 and t["forbidden"]["msgs_in_q1"] == 0
        assert t[""]["auth_failures"] == 1
        # the publisher's connection row
        conns = wait_for(lambda: [c for c in rows(usage, "connections") if c["client_id"] == "usage-pub"])
        (c,) = conns
        assert (c["tenant"], c["username"], c["node"], c["protocol"], c["ip"]) == (
            "acme", "acme/pub", "u1", "3.1.1", "127.0.0.1")
        assert c["msgs_in"] == 15 and c["bytes_in"] > size_in
        assert 0 < c["disconnected_at"] - c["connected_at"] < 60
        assert abs(c["disconnected_at"] - time.time()) < 30
    finally:
        node.stop()
    # the subscriber, still connected when the node stopped, is written on the way out
    (s,) = [c for c in rows(usage, "connections") if c["client_id"] == "usage-sub"]
    assert s["protocol"] == "5.0" and s["msgs_out"] == 13 and "shutting down" in s["reason"].lower()
    # only whole files, each in the partition of its date
    for path in usage.rglob("*"):
        assert not path.name.startswith("."), f"temporary file left: {path}"
        if path.suffix == ".jsonl":
            day = path.parent.name.removeprefix("date=")
            for line in path.read_text().splitlines():
                r = json.loads(line)
                ts = r.get("ts", r.get("disconnected_at"))
                assert time.strftime("%Y-%m-%d", time.gmtime(ts)) == day


def test_no_usage_dir_no_files(tmp_path):
    node = BrokerProcess("--sys-interval", "0", anonymous=True, env=dict(os.environ, VAR_DIR=str(tmp_path))).start()
    try:
        PahoClient("quiet").connect(node.port()).disconnect()
    finally:
        node.stop()
    assert not (tmp_path / "usage").exists()


@pytest.mark.parametrize("uri", ["hdfs://namenode:8020/mqtthub/usage", "s3a://bucket/usage"])
def test_a_usage_dir_brokerd_cannot_write_is_refused_at_start_up(tmp_path, uri):
    """brokerd writes the usage log with local file operations: given an HDFS or S3 URI it
    wrote ``./hdfs:/namenode:8020/...`` under its working directory and counted it as written."""
    proc = subprocess.run([sys.executable, "-m", "brokerd", "--listen", "mqtt://127.0.0.1:0", "--allow-anonymous",
                           "--usage-dir", uri], cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert f"--usage-dir {uri!r}: brokerd writes the usage log to a local directory" in proc.stderr
    assert list(tmp_path.iterdir()) == []             # nothing written where it started


def test_a_file_uri_usage_dir_is_the_local_directory(tmp_path):
    usage = tmp_path / "usage"
    node = BrokerProcess("--usage-dir", f"file://{usage}", "--sys-interval", "0").start()
    try:
        PahoClient("file-uri").connect(node.port()).disconnect()
    finally:
        node.stop()
    assert [c["client_id"] for c in rows(usage, "connections")] == ["file-uri"]


def _published(directory: Path) -> int:
    return sum(r["msgs_in_q1"] for r in rows(directory, "traffic") if r["topic"] == "cp/t")


def test_a_sigkill_loses_only_the_seconds_since_the_last_checkpoint(tmp_path):
    """Minutes of a minute (the default): every second the current minute's files are rewritten with
    the minute so far, each replacing the last, so after a SIGKILL the log holds everything counted up
    to a second before it, once; a node restarted in the same minute adds its own file, not over it."""
    usage = tmp_path / "usage"
    args = ("--sys-interval", "0", "--usage-dir", str(usage), "--node-id", "k1", "--usage-checkpoint", "1")
    node = BrokerProcess(*args).start()
    try:
        pub = PahoClient("cp-pub", version=V311).connect(node.port())
        for i in range(5):
            pub.publish("cp/t", b"%d" % i, qos=1)
        assert wait_for(lambda: _published(usage) == 5), rows(usage, "traffic")
        for i in range(7):
            pub.publish("cp/t", b"%d" % i, qos=1)
        pub.disconnect()
        assert wait_for(lambda: _published(usage) == 12 and any(
            c["client_id"] == "cp-pub" for c in rows(usage, "connections"))), rows(usage, "traffic")
    finally:
        node.kill()
    assert _published(usage) == 12                  # the checkpoints replaced each other: not 5 + 12
    (c,) = [c for c in rows(usage, "connections") if c["client_id"] == "cp-pub"]
    assert c["msgs_in"] == 12
    again = BrokerProcess(*args).start()
    try:
        pub = PahoClient("cp-pub2", version=V311).connect(again.port())
        for i in range(3):
            pub.publish("cp/t", b"%d" % i, qos=1)
        pub.disconnect()
        assert wait_for(lambda: _published(usage) == 15), rows(usage, "traffic")
    finally:
        again.stop()
    assert _published(usage) == 15
    assert not [p for p in usage.rglob(".*")], "temporary file left"


def test_a_negative_checkpoint_is_refused(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "brokerd", "--usage-dir", str(tmp_path), "--usage-checkpoint", "-1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "--usage-checkpoint" in proc.stderr


def test_the_last_minute_of_a_day_that_cannot_be_written_stays_in_its_day(tmp_path):
    """23:59's write fails; the next minute is the next day's. Merged into it (as a failed minute is
    within a day) its rows were counted on the next day: a daily report one day off. Now that minute
    waits with its own time and is written, in its own day's folder, before the next minute."""
    from brokerd.metrics.usage import UsageLog

    log = UsageLog(str(tmp_path), "n1", 0.0, interval=60.0)
    last = 1_780_012_800 - 60                                 # 2026-05-28 23:59 UTC
    for _ in range(3):
        log.published("acme", "t", 1, 10)
    batch = log._take(last)                                   # its write fails
    log._failed(batch, log._drop(batch[3]))
    log.published("acme", "t", 1, 10)
    log._write_pending()
    log.write(*log._take(last + 60))
    got = {(r["ts"], r["msgs_in_q1"]) for r in rows(tmp_path, "traffic")}
    assert got == {(last, 3), (last + 60, 1)}
    assert sorted(p.parent.name for p in (tmp_path / "traffic").glob("date=*/*.jsonl")) == \
        ["date=2026-05-28", "date=2026-05-29"]


def test_a_days_last_minute_written_in_part_is_not_counted_twice_when_written_again(tmp_path):
    """23:59's write fails, and so does its first try on its own: its traffic file is written, its
    connections file is not (the disk filled up between the two). The next try must replace that
    traffic file, not add another beside it: before, each try chose new files, and the day's
    figures counted the minute twice."""
    from brokerd.metrics.usage import UsageLog

    log = UsageLog(str(tmp_path), "n1", 0.0, interval=60.0)
    last = 1_780_012_800 - 60                                 # 2026-05-28 23:59 UTC
    for _ in range(3):
        log.published("acme", "t", 1, 10)
    log.connections.append({"tenant": "acme", "client_id": "c1", "disconnected_at": last + 30.0})
    batch = log._take(last)                                   # its write fails
    log._failed(batch, log._drop(batch[3]))
    real = log._file

    def full(dataset, *args, **kwargs):
        if dataset == "connections":
            raise OSError(28, "No space left on device")
        return real(dataset, *args, **kwargs)

    log._file = full
    with pytest.raises(OSError):
        log._write_pending()                                  # the traffic file only
    log._file = real
    log._write_pending()
    assert sum(r["msgs_in_q1"] for r in rows(tmp_path, "traffic")) == 3
    assert [r["client_id"] for r in rows(tmp_path, "connections")] == ["c1"]


def test_a_minute_that_cannot_be_written_leaves_no_checkpoint_to_count_twice(tmp_path):
    """The minute's last write fails (a full disk, say): its rows go into the next minute's files and
    its checkpoint file goes, or the reports would count the checkpointed part twice."""
    from brokerd.metrics.usage import UsageLog

    log = UsageLog(str(tmp_path), "n1", 0.0, interval=60.0, checkpoint=5.0)
    minute = 1_780_000_020 // 60 * 60
    for _ in range(4):
        log.published("acme", "t", 1, 10)
    log.write(*log._copy(minute))                           # a checkpoint: 4 so far
    assert sum(r["msgs_in_q1"] for r in rows(tmp_path, "traffic")) == 4
    log.published("acme", "t", 1, 10)
    batch = log._take(minute)                               # the minute's end; its write fails
    log._failed(batch, log._drop(batch[3]))
    assert rows(tmp_path, "traffic") == []
    log.published("acme", "t", 1, 10)
    log.write(*log._take(minute + 60))                      # the next minute holds all six
    (r,) = rows(tmp_path, "traffic")
    assert r["msgs_in_q1"] == 6 and r["ts"] == minute + 60
