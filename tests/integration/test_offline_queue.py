"""Offline queue of persistent sessions: order after reconnect, --max-queued bound, drop policy
(QoS 0 first, then oldest), --max-queued-bytes, --no-queue-qos0."""

import pytest

from ..procs import BrokerProcess
from . import raw
from .helpers import V5, V311, MosqSub, PacketTypes, connect, mosq_pub, props
from .raw import PUBLISH, RawClient


@pytest.fixture(scope="module")
def q5():
    """brokerd with --max-queued 5."""
    with BrokerProcess("--max-queued", "5") as b:
        yield b


def _park(port, client_id, topic, version=V311, qos=1):
    """Create a persistent session subscribed to ``topic`` and leave it offline."""
    kw = {"properties": props(PacketTypes.CONNECT, SessionExpiryInterval=300)} if version == V5 else {}
    c = connect(port, client_id, version, clean=False, **kw)
    c.subscribe(topic, qos)
    c.disconnect()
    return kw


def _publish(port, client_id, topic, items):
    """items: [(payload, qos)]"""
    with connect(port, client_id + "-pub", V311) as pub:
        for payload, qos in items:
            pub.publish(topic, payload, qos=qos)


def _collect_raw(port, client_id, version=4, timeout=0.4):
    with RawClient(port) as c:
        props_ = {raw.SESSION_EXPIRY_INTERVAL: 300} if version == 5 else None
        assert c.connect(client_id, version=version, clean=False, props=props_).session_present
        got = []
        while True:
            try:
                p = c.recv(timeout=timeout)
            except TimeoutError:
                break
            if p.type == raw.PUBREL:
                c.ack(raw.PUBCOMP, p.pid)
                continue
            assert p.type == PUBLISH
            got.append((p.payload, p.qos))
            if p.qos == 1:
                c.ack(raw.PUBACK, p.pid)
            elif p.qos == 2:
                c.ack(raw.PUBREC, p.pid)
        c.disconnect()
    return got


@pytest.mark.parametrize("version", [4, 5])
def test_queued_messages_arrive_in_order_after_reconnect(broker, client_id, topic, version):
    _park(broker.port(), client_id, topic, V5 if version == 5 else V311, qos=2)
    items = [(b"%02d" % i, i % 3) for i in range(12)]
    _publish(broker.port(), client_id, topic, items)
    assert _collect_raw(broker.port(), client_id, version) == items


def test_queued_qos1_in_order_with_paho(broker, client_id, topic):
    _park(broker.port(), client_id, topic)
    _publish(broker.port(), client_id, topic, [(b"%d" % i, 1) for i in range(30)])
    c = connect(broker.port(), client_id, V311, clean=False)
    assert c.session_present
    assert [m.payload for m in c.expect_n(30)] == [b"%d" % i for i in range(30)]
    c.disconnect()


def test_queued_with_mosquitto_clients(broker, client_id, topic):
    MosqSub(broker.port(), topic, qos=1, client_id=client_id, args=["-c"]).start().stop()
    for i in range(5):
        mosq_pub(broker.port(), topic, f"q{i}", qos=1)
    sub = MosqSub(broker.port(), topic, qos=1, client_id=client_id, args=["-c"], count=5, wait=5)
    sub.start(expect_suback=False)
    assert [m["payload"] for m in sub.messages(5)] == [f"q{i}" for i in range(5)]
    assert sub.wait() == 0


def test_max_queued_keeps_the_newest(q5, client_id, topic):
    """--max-queued 5, 8 QoS 1 messages while offline: the oldest 3 are dropped."""
    _park(q5.port(), client_id, topic)
    _publish(q5.port(), client_id, topic, [(b"%d" % i, 1) for i in range(8)])
    assert _collect_raw(q5.port(), client_id) == [(b"%d" % i, 1) for i in range(3, 8)]


def test_drop_policy_qos0_first_then_oldest(q5, client_id, topic):
    """Full queue: a new message first pushes out the oldest QoS 0 message; with none queued a new
    QoS 0 message is itself dropped and a new QoS 1 message pushes out the oldest QoS 1."""
    _park(q5.port(), client_id, topic, qos=1)
    items = [(b"a", 0), (b"b", 1), (b"c", 0), (b"d", 1), (b"e", 0),   # full
             (b"f", 1), (b"g", 1), (b"h", 1),                         # push out a, c, e
             (b"i", 1),                                               # no QoS 0 left: pushes out b
             (b"j", 0)]                                               # dropped itself
    _publish(q5.port(), client_id, topic, items)
    got = _collect_raw(q5.port(), client_id)
    assert got == [(b"d", 1), (b"f", 1), (b"g", 1), (b"h", 1), (b"i", 1)]


def test_max_queued_bytes(broker_factory, client_id, topic):
    b = broker_factory("--max-queued-bytes", "100")
    _park(b.port(), client_id, topic)
    _publish(b.port(), client_id, topic, [(b"%d" % i + b"x" * 39, 1) for i in range(5)])   # 40 bytes each
    got = _collect_raw(b.port(), client_id)
    assert [p[:1] for p, _ in got] == [b"3", b"4"]


def test_no_queue_qos0(broker_factory, client_id, topic):
    b = broker_factory("--no-queue-qos0")
    _park(b.port(), client_id, topic, qos=1)
    _publish(b.port(), client_id, topic, [(b"zero", 0), (b"one", 1)])
    assert _collect_raw(b.port(), client_id) == [(b"one", 1)]


def test_queue_of_clean_session_is_discarded(broker, client_id, topic):
    _park(broker.port(), client_id, topic)
    _publish(broker.port(), client_id, topic, [(b"lost", 1)])
    c = connect(broker.port(), client_id, V311, clean=True)
    c.expect_none(0.3)
    c.disconnect()
