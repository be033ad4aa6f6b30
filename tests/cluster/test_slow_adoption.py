"""A dead node's stored sessions adopted on a slow store (the HBase double answering every call
late): how long the adoption takes must not matter -- messages for the sessions not adopted yet are
refused until they are (the publisher sends them again), and no session ends up on two nodes.
Apart from test_failover.py, whose nodes they share the helpers of: these two take a minute or more
each, mostly waiting (on the shorter ORPHAN_TIMEOUT and REAP_LOCK the environment can set)."""

import re
import time

import pytest

from ..hbase_double import HBaseDoubleProcess
from ..integration.helpers import Client, connect
from ..integration.raw import PUBACK, RawClient
from ..mqtt import V5, PacketTypes, props
from .conftest import wait_until
from .test_failover import EXPIRY, adopted_by, persistent, ranges


@pytest.mark.slow
def test_a_slow_adoption_keeps_refusing_messages_for_the_sessions_not_adopted_yet(cluster, tmp_path, tag):
    """n2 dies holding 24 stored sessions and its store answers slowly (every HBase call 300 ms):
    n1 takes more than 20 s to adopt them all, longer than ORPHAN_TIMEOUT (10 s here). A QoS 1 message published on n1 for a session not
    adopted yet must be refused (the publisher sends it again) until the session is adopted, then
    delivered. Before, the survivors stopped refusing ORPHAN_TIMEOUT after the death,
    however far the adoption had got: the messages published then for the sessions still waiting
    were acknowledged for nobody, and lost (the survivor says "reaping" every 10 s now)."""
    gateway = HBaseDoubleProcess(tmp_path / "hbase.db").start()
    try:
        cluster.store = f"hbase://{gateway.address}?table_prefix=slow&timeout=10000"
        cluster.env = {"BROKERD_ORPHAN_TIMEOUT": "10"}
        n1, n2 = cluster.start(2)
        n = 24
        for i in range(n):
            c = persistent(n2.port(), f"{tag}-s{i}")
            c.subscribe(f"{tag}/{i}", qos=1)
            c.disconnect()
        gateway.control("latency", 300)
        n2.kill()
        died = time.monotonic()
        pub = RawClient(n1.port(), timeout=30)
        pub.connect(f"{tag}-pub", version=5)
        wait_until(lambda: "node n2 left the cluster" in n1.log or None, timeout=15,
                   message="n1 did not see n2 go")
        time.sleep(max(0.0, died + 5 + 12 - time.monotonic()))     # past ORPHAN_TIMEOUT after the death
        assert not re.search(r"adopted \d+ sessions of node n2", n1.log), "adopted too fast to show anything"
        pending = list(range(n))
        pid = 0
        while pending:
            refused = []
            for start in range(0, len(pending), 16):      # 16 at once (the broker's Receive Maximum: 32)
                sent = {}
                for i in pending[start:start + 16]:
                    pid = pid % 65535 + 1
                    sent[pid] = i
                    pub.publish(f"{tag}/{i}", b"for %d" % i, qos=1, pid=pid)
                for _ in sent:
                    ack = pub.expect(PUBACK)
                    if ack.code >= 0x80:
                        refused.append(sent[ack.pid])
            pending = sorted(refused)
            assert time.monotonic() - died < 240, f"messages for {ranges(pending)} still refused"
            if pending:
                time.sleep(1)
        adopted_by([n1], "n2", timeout=120)
        gateway.control("latency", 0)
        for i in range(n):
            c = persistent(n1.port(), f"{tag}-s{i}")
            assert c.expect(timeout=10).payload == b"for %d" % i, f"session {i} lost its message"
            c.disconnect()
    finally:
        gateway.stop()


@pytest.mark.slow
def test_a_slow_adoption_never_leaves_a_session_on_two_nodes(cluster, tmp_path, tag):
    """n3 dies holding 20 stored sessions and its store answers slowly (every HBase call 300 ms):
    the survivor adopting them locks all 20 client ids at once, then reads the sessions one after
    another -- past the time its locks lived (REAP_LOCK, 10 s here). A client whose session was not read yet
    then connects to the other survivor, which finds its id free and takes the session; the
    adopting survivor must not load it as well. Before, it did (and took the id in the registry):
    the session lived on both nodes, and a message the client got on one was still queued on
    the other, delivered a second time when the client came back there."""
    gateway = HBaseDoubleProcess(tmp_path / "hbase.db").start()
    try:
        cluster.store = f"hbase://{gateway.address}?table_prefix=twice&timeout=10000"
        cluster.env = {"BROKERD_REAP_LOCK": "10"}
        n1, n2, n3 = cluster.start(3)
        n = 20
        for i in range(n):
            c = persistent(n3.port(), f"{tag}-s{i}")
            c.subscribe(f"{tag}/{i}", qos=1)
            c.disconnect()
        r = cluster.redis.client()
        p = cluster.prefix
        tenant = next(k.decode().rsplit(":", 1)[1] for k in r.scan_iter(f"{p}:clients:*"))
        gateway.control("latency", 300)
        n3.kill()
        reaper_name = wait_until(lambda: (r.get(f"{p}:reap:n3") or b"").decode() or None, timeout=20,
                                 message="no survivor began adopting n3")
        reaper, other = (n1, n2) if reaper_name == "n1" else (n2, n1)
        wait_until(lambda: r.exists(*[f"{p}:lock:{tenant}:{tag}-s{i}" for i in range(n)]) or None, timeout=10,
                   message="the adoption took no lock")
        time.sleep(12)                                  # past REAP_LOCK after the locks were taken
        pending = [i for i in range(n) if r.hget(f"{p}:clients:{tenant}", f"{tag}-s{i}") == b"n3"]
        assert pending, "adopted too fast to show anything"
        i = pending[-1]
        deadline = time.monotonic() + 120
        while True:                     # refused while the id is locked by the adoption: the client tries again
            c = Client(f"{tag}-s{i}", V5, clean=False)
            c.connect(other.port(), properties=props(PacketTypes.CONNECT, SessionExpiryInterval=EXPIRY), wait=False)
            flags, code, _ = c.connack_result(timeout=30)       # (the CONNECT waits up to 5 s for the lock)
            if not code.is_failure:
                c._last_flags = flags
                break
            c.disconnect()
            assert code.value == 0x89, code
            assert time.monotonic() < deadline, "refused for 2 minutes"
            time.sleep(0.5)
        assert c.session_present
        adopted_by([reaper], "n3", timeout=120)
        gateway.control("latency", 0)
        time.sleep(1)
        pub = connect(reaper.port(), f"{tag}-pub", V5)
        pub.publish(f"{tag}/{i}", b"once", qos=1)
        assert c.expect(timeout=10).payload == b"once"
        c.disconnect()
        again = persistent(reaper.port(), f"{tag}-s{i}")
        assert again.session_present
        again.expect_none(2.0)
    finally:
        gateway.stop()
