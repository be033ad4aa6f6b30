"""Chaos, short enough for CI: a dependency of a running cluster is killed
with SIGKILL in the middle of a QoS 1 stream published on one node for a
persistent session on another, then comes back.

Each test shows the three promises: no message acknowledged to its publisher
is ever lost; clients meanwhile see clean reason codes (never a hang, never a
positive ack for a message that was not kept); the nodes recover by
themselves when the dependency returns. (SIGKILL of a node itself:
tests/cluster/test_failover.py; of the store on a single node:
tests/durability/test_store_outage.py.)
"""

import time
import uuid

import pytest

from ..cluster.conftest import Cluster, PacedPublisher, RedisServer, settle, wait_until
from ..durability.test_crash import drain, received_in_order
from ..hbase_double import HBaseDoubleProcess
from ..mqtt import V5, PacketTypes, PahoClient, props

pytestmark = pytest.mark.slow

TOTAL = 3000
RATE = 300


def persistent(port: int, client_id: str) -> PahoClient:
    c = PahoClient(client_id, V5, clean=False)
    c.connect(port, properties=props(PacketTypes.CONNECT, SessionExpiryInterval=3600))
    return c


def offline_subscriber(pub_node, sub_node, name: str) -> tuple[str, str]:
    """A persistent QoS 1 subscriber ``TAG-sub`` whose session ``sub_node`` stores, offline, and
    whose route ``pub_node`` knows; -> (TAG, its topic)."""
    tag = f"{name}-{uuid.uuid4().hex[:6]}"
    topic = f"{tag}/stream"
    sub = persistent(sub_node.port(), f"{tag}-sub")
    sub.subscribe(topic, qos=1)
    settle(PahoClient(f"{tag}-probe", V5).connect(pub_node.port()), topic, sub)
    sub.disconnect()
    time.sleep(0.2)
    return tag, topic


@pytest.fixture
def redis(tmp_path):
    server = RedisServer(tmp_path).start()
    yield server
    server.stop()


def test_sigkill_of_redis_mid_stream(redis, tmp_path):
    """Redis (the cluster bus) is SIGKILLed and comes back empty: both nodes fence (clients sent
    away with 0x9C / 0x8B, new CONNECTs 0x88), rejoin once it answers, and the subscriber's
    session, taken up again on either node, holds every acknowledged message."""
    cluster = Cluster(redis, tmp_path)
    try:
        n1, n2 = cluster.start(2, "--max-queued", str(TOTAL * 2))
        tag, topic = offline_subscriber(n1, n2, "chaos-redis")

        pub = PacedPublisher(n1.port(), topic, total=TOTAL, rate=RATE).start()
        pub.wait_acked(TOTAL // 4)
        redis.kill()
        pub.finish()                      # ends when the fenced node closes the connection
        acked_before = set(pub.acked)
        assert pub.disconnects and pub.disconnects[0] in (0x9C, 0x8B), f"publisher disconnected with {pub.disconnects}"
        for node in (n1, n2):
            wait_until(lambda node=node: "lost the cluster bus" in node.log, timeout=10,
                       message=f"a node did not fence:\n{node.log[-2000:]}")
        # while fenced: a clean refusal, not a hang
        late = PahoClient(f"{tag}-late", V5)
        late.connect(n2.port(), wait=False)
        _, rc, _ = late.connack_result()
        assert rc.value == 0x88, f"CONNACK {rc} while the bus is down"
        late.drop()

        redis.restart()
        for node in (n1, n2):
            wait_until(lambda node=node: "rejoined the cluster" in node.log, timeout=20,
                       message=f"a node did not rejoin:\n{node.log[-2000:]}")
        cluster.wait_connected()

        again = None
        deadline = time.monotonic() + 20
        while again is None:
            try:
                again = persistent(n1.port(), f"{tag}-sub")
            except ConnectionError:
                assert time.monotonic() < deadline, "the session never came back"
                time.sleep(0.5)
        assert again.session_present
        got = received_in_order(drain(again, idle=3.0))
        missing = sorted(acked_before - set(got))
        assert not missing, f"{len(missing)} acknowledged messages lost, first {missing[:20]}"
        # and the cluster routes across nodes again
        settle(PahoClient(f"{tag}-after", V5).connect(n2.port()), topic, again)
    finally:
        cluster.stop_all()


def test_sigkill_of_the_hbase_gateway_mid_stream(redis, tmp_path):
    """The shared store (HBase Thrift gateway double) is SIGKILLed for two seconds while node 1
    takes a stream for a session stored by node 2: messages that cannot be stored are refused
    (PUBACK 0x83), never acknowledged and lost; both nodes recover by themselves; the session,
    taken over on node 1, holds every acknowledged message."""
    gateway = HBaseDoubleProcess(tmp_path / "hbase.db").start()
    store = f"hbase://{gateway.address}?table_prefix=chaos{uuid.uuid4().hex[:6]}&timeout=2000"
    cluster = Cluster(redis, tmp_path, store=store)
    try:
        n1, n2 = cluster.start(2, "--max-queued", str(TOTAL * 2))
        tag, topic = offline_subscriber(n1, n2, "chaos-hbase")

        pub = PacedPublisher(n1.port(), topic, total=TOTAL, rate=RATE).start()
        pub.wait_acked(TOTAL // 4)
        gateway.kill()
        killed_at = pub.sent
        time.sleep(2.0)
        gateway.start()
        pub.finish()
        acked = pub.acked
        codes = pub.by_code()
        assert codes.get(0x83), f"nothing was refused while the store was down: {codes}"
        assert set(codes) <= {0x00, 0x10, 0x83}, f"unexpected reason codes {codes}"
        assert max(acked) > killed_at + 300, f"the stream was not acknowledged again after recovery: {codes}"

        try:
            again = persistent(n1.port(), f"{tag}-sub")    # taken over from node 2 through the store
        except ConnectionError as exc:
            raise AssertionError(f"{exc}\n{n1.log[-3000:]}\n{n2.log[-3000:]}") from None
        assert again.session_present
        got = received_in_order(drain(again, idle=3.0))
        missing = sorted(acked - set(got))
        assert not missing, f"{len(missing)} acknowledged messages lost, first {missing[:20]}; codes {codes}"
    finally:
        cluster.stop_all()
        gateway.stop()
