"""Limits and hostile input: --max-connections, --connect-timeout, --max-packet-size, malformed
packets. Each must end only the offending connection; everyone else keeps working."""

import random
import socket
import time

import pytest

from ..procs import BrokerProcess
from . import raw
from .helpers import V5, V311, Client, MosqSub, connect, mosq_pub, wait_until
from .raw import CONNACK, DISCONNECT, RawClient


@pytest.fixture(scope="module")
def limited():
    """brokerd with --max-connections 2 and --connect-timeout 1 --max-packet-size 1024."""
    with BrokerProcess("--max-connections", "2", "--connect-timeout", "1", "--max-packet-size", "1024") as b:
        yield b


@pytest.fixture
def canary(broker, client_id, topic):
    """A subscriber/publisher pair that must keep working whatever another connection does."""
    sub = connect(broker.port(), client_id + "-canary", V311)
    sub.subscribe(topic + "/canary", 1)
    pub = connect(broker.port(), client_id + "-canary-pub", V5)

    def check():
        assert broker.proc.poll() is None, "broker process died"
        pub.publish(topic + "/canary", b"alive", qos=1)
        assert sub.expect().payload == b"alive"

    yield check
    sub.disconnect()
    pub.disconnect()


# --------------------------------------------------------------------------- connections

def test_max_connections(limited, client_id):
    """--max-connections 2: the third client is refused (v5 CONNACK 0x97 Quota exceeded, 3.1.1
    return code 3 Server unavailable); once one leaves, a new client gets in."""
    a = connect(limited.port(), client_id + "a", V5)
    b = connect(limited.port(), client_id + "b", V311)
    with RawClient(limited.port()) as c:
        ack = c.connect(client_id + "c", version=5)
        assert ack.code == 0x97
        c.expect_closed()
    with RawClient(limited.port()) as c:
        assert c.connect(client_id + "d", version=4).body == b"\x00\x03"
        c.expect_closed()
    p = Client(client_id + "e", V5)
    p.connect(limited.port(), wait=False)
    assert p.connack_result()[1].value == 0x97
    p.stop_loop()
    proc = mosq_pub(limited.port(), "t", "x", check=False)
    assert proc.returncode != 0 and "unavailable" in proc.stderr.lower()
    a.disconnect()
    time.sleep(0.1)
    d = connect(limited.port(), client_id + "f", V311)
    d.disconnect()
    b.disconnect()


def test_connect_timeout_closes_silent_socket(limited, client_id):
    """--connect-timeout 1: a socket that never sends CONNECT is closed after about a second."""
    with socket.create_connection(("127.0.0.1", limited.port())) as s:
        s.settimeout(4)
        t0 = time.monotonic()
        assert s.recv(10) == b""
        assert 0.9 <= time.monotonic() - t0 <= 2.5


def test_connect_timeout_closes_partial_connect(limited):
    with RawClient(limited.port()) as c:
        c.send(raw.connect_packet("partial", version=4)[:5])
        assert c.expect_closed(timeout=4) == []


def test_connect_timeout_does_not_touch_connected_clients(limited, client_id):
    c = connect(limited.port(), client_id, V311, keepalive=60)
    time.sleep(1.8)
    assert c.client.is_connected()
    c.disconnect()


def test_max_packet_size_for_311_with_mosquitto_pub(limited, client_id, topic):
    proc = mosq_pub(limited.port(), topic, "x" * 3000, qos=1, check=False)
    assert proc.returncode != 0
    ok = mosq_pub(limited.port(), topic, "x" * 500, qos=1, check=False)
    assert ok.returncode == 0


def test_max_packet_size_announced_by_remaining_length_alone(limited, client_id):
    """The size check uses the fixed header: a client announcing 100 kB is cut off before sending it."""
    with RawClient(limited.port()) as c:
        c.connect(client_id, version=5)
        c.send(b"\x30" + raw.varint(100_000) + b"\x00\x01a")
        got = c.expect_closed()
        assert [(p.type, p.code) for p in got] == [(DISCONNECT, 0x95)]


# --------------------------------------------------------------------------- malformed input

MALFORMED_V5 = {
    "publish-qos3": (b"\x36\x05\x00\x01a\x00\x01", 0x81),
    "reserved-type-0": (b"\x00\x00", 0x81),
    "subscribe-bad-flags": (b"\x80\x07\x00\x01\x00\x00\x01a\x00", 0x81),
    "remaining-length-5-bytes": (b"\x30\xff\xff\xff\xff\x01", 0x81),
    "topic-invalid-utf8": (b"\x30\x05\x00\x02\xc3\x28\x00", 0x81),
    "topic-with-nul": (b"\x30\x05\x00\x02a\x00\x00", 0x81),
    "property-not-allowed": (b"\x30\x0a\x00\x01a\x05\x11\x00\x00\x00\x05x", 0x81),
    "property-length-overrun": (b"\x30\x05\x00\x01a\x09\x01", 0x81),
    "second-connect": (raw.connect_packet("again", version=5), 0x82),
    "dup-on-qos0": (b"\x38\x04\x00\x01a\x00", 0x81),
    "pingreq-with-payload": (b"\xc0\x01\x00", 0x81),
    "server-only-packet": (b"\x20\x03\x00\x00\x00", 0x82),
}


@pytest.mark.parametrize("name", sorted(MALFORMED_V5))
def test_malformed_packet_v5_gets_disconnect_and_close(broker, client_id, canary, name):
    """5.0 4.13: malformed packet -> DISCONNECT 0x81, protocol error -> 0x82, then close; the
    broker keeps serving everyone else."""
    data, code = MALFORMED_V5[name]
    with RawClient(broker.port()) as c:
        c.connect(client_id, version=5)
        c.send(data)
        got = c.expect_closed()
        assert [(p.type, p.code) for p in got] == [(DISCONNECT, code)]
    canary()


@pytest.mark.parametrize("name", ["publish-qos3", "reserved-type-0", "subscribe-bad-flags", "second-connect",
                                  "topic-invalid-utf8", "remaining-length-5-bytes"])
def test_malformed_packet_v311_closes_connection(broker, client_id, canary, name):
    """3.1.1 [MQTT-4.8.0-1]: the server closes the connection (there is no DISCONNECT to send)."""
    data, _ = MALFORMED_V5[name]
    with RawClient(broker.port()) as c:
        c.connect(client_id, version=4)
        c.send(data)
        assert c.expect_closed() == []
    canary()


@pytest.mark.parametrize("data", [b"\xc0\x00", b"\x10\x02\x00\x04",
                                  b"\x10\x0c\x00\x04MQTT\x04\x03\x00\x3c\x00\x00",
                                  b"\x10\x0c\x00\x04MQTT\x05\x02\x00\x3c\x05\x00"])
def test_garbage_before_connect_closes_connection(broker, canary, data):
    """Not a CONNECT first (or a broken one): closed without a successful CONNACK."""
    with RawClient(broker.port()) as c:
        c.send(data)
        got = c.expect_closed()
        assert all(p.type == CONNACK and p.code != 0 for p in got)
    canary()


def test_http_request_on_mqtt_port_is_closed(limited):
    """An HTTP request on the MQTT port is never a CONNECT: closed (by the connect timeout at the latest)."""
    with RawClient(limited.port()) as c:
        c.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        got = c.expect_closed(timeout=4)
        assert all(p.type == CONNACK and p.code != 0 for p in got)


def test_v5_connect_with_bad_properties_refused(broker, canary):
    """A v5 CONNECT with Receive Maximum 0 is a Protocol Error: CONNACK 0x82 and close."""
    with RawClient(broker.port()) as c:
        ack = c.connect("rm0", version=5, props={raw.RECEIVE_MAXIMUM: 0})
        assert ack.code == 0x82
        c.expect_closed()
    canary()


def test_random_garbage_after_connect(broker, client_id, canary):
    """Deterministic random junk on 15 connections: each ends or survives on its own; the broker lives."""
    rng = random.Random(1234)
    for i in range(15):
        with RawClient(broker.port(), timeout=2) as c:
            c.connect(f"{client_id}-{i}", version=rng.choice([4, 5]))
            c.send(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64))))
            try:
                c.expect_closed(timeout=0.15)
            except AssertionError:
                pass    # an incomplete packet simply waits for more bytes
    canary()


def test_client_that_vanishes_mid_packet(broker, client_id, canary):
    with RawClient(broker.port()) as c:
        c.connect(client_id, version=4)
        c.send(raw.publish_packet("x/y", b"z" * 1000, 1, pid=1)[:300])
    canary()


def test_mosquitto_clients_still_work_after_abuse(broker, topic):
    for _ in range(3):
        with RawClient(broker.port()) as c:
            c.send(b"\xff" * 16)
            c.expect_closed()
    with MosqSub(broker.port(), topic, version="mqttv5") as sub:
        mosq_pub(broker.port(), topic, "fine", version="mqttv5")
        assert sub.messages(1)[0]["payload"] == "fine"


# --------------------------------------------------------------------------- node-wide queue budget

@pytest.mark.slow
def test_offline_session_queue_does_not_stall_other_publishers(broker_factory, client_id, topic):
    """--queue-budget 100000 (64 MB by default): one device offline with a persistent session
    collects ~180 kB of queued messages (within its own --max-queued). An unrelated, live
    publisher/subscriber pair must keep working. Regression: brokerd paused every connection that
    had published and, as offline queues never drain, never resumed them (found by this suite,
    fixed in 5e20aee)."""
    b = broker_factory("--queue-budget", "100000")
    live_sub = connect(b.port(), client_id + "-ls", V311)
    live_sub.subscribe(topic + "/live", 1)
    live_pub = connect(b.port(), client_id + "-lp", V311)
    live_pub.publish(topic + "/live", b"before", qos=1)
    assert live_sub.expect().payload == b"before"
    dev = connect(b.port(), client_id + "-dev", V311, clean=False)
    dev.subscribe(topic + "/dev", 1)
    dev.disconnect()
    feeder = Client(client_id + "-feed", V311)
    feeder.client.max_inflight_messages_set(500)
    feeder.connect(b.port())
    infos = [feeder.publish(topic + "/dev", b"y" * 200, qos=1, wait=False) for _ in range(400)]
    try:
        # the flood is in: 400 x 456 bytes of queue budget > 100000
        wait_until(lambda: sum(i.is_published() for i in infos) >= 200, timeout=4, message="flood not accepted")
        time.sleep(0.5)
        live_pub.publish(topic + "/live", b"after", qos=1, wait=False)
        assert live_sub.expect(timeout=3).payload == b"after"
        wait_until(lambda: all(i.is_published() for i in infos), timeout=4, message="feeder stalled")
    finally:
        for c in (live_sub, live_pub, feeder):
            c.stop_loop()


@pytest.mark.slow
def test_queue_budget_does_not_deadlock_a_subscriber_that_also_publishes(broker_factory, client_id, topic):
    """A device that publishes its status once and subscribes to commands (QoS 1) is sent a burst
    of 400 commands (~180 kB queued > --queue-budget 100000). It acks everything it gets and must
    eventually get all 400. Regression: brokerd paused reading from it (it had published), never
    read its PUBACKs, so its window never freed: it got ~35 and the node stalled (found by this
    suite, fixed in 5e20aee)."""
    b = broker_factory("--queue-budget", "100000")
    dev = connect(b.port(), client_id + "-dev", V311, manual_ack=True)
    dev.subscribe(topic + "/cmd", 1)
    dev.publish(topic + "/status", b"online", qos=1)
    feeder = Client(client_id + "-feed", V311)
    feeder.client.max_inflight_messages_set(500)
    feeder.connect(b.port())
    infos = [feeder.publish(topic + "/cmd", b"%04d" % i + b"y" * 196, qos=1, wait=False) for i in range(400)]
    try:
        # the device holds its 32-message window unacked while the burst queues up (> budget)
        got = dev.expect_n(32)
        wait_until(lambda: sum(i.is_published() for i in infos) >= 240, timeout=4, message="burst not accepted")
        time.sleep(0.3)
        for m in got:
            dev.ack(m)
        while len(got) < 400:
            m = dev.expect(timeout=3)
            dev.ack(m)
            got.append(m)
    finally:
        dev.stop_loop()
        feeder.stop_loop()


def test_non_minimal_remaining_length_not_forwarded(broker, client_id, topic):
    """5.0 [MQTT-1.5.5-1]: a Variable Byte Integer MUST use the minimum number of bytes. A PUBLISH
    whose Remaining Length is padded (0x8B 0x00 for 11) is malformed; whatever the server does
    with it, it must not send such bytes on to its subscribers. Regression: they were forwarded
    verbatim (found by this suite, fixed in 5e20aee)."""
    with RawClient(broker.port()) as sub, RawClient(broker.port()) as pub:
        sub.connect(client_id + "-s", version=5)
        sub.subscribe(topic, 0)
        pub.connect(client_id + "-p", version=5)
        body = raw.s(topic) + b"\x00" + b"hi"          # topic, empty properties, payload
        pub.send(b"\x30" + bytes((len(body) | 0x80, 0x00)) + body)
        try:
            sub.sock.settimeout(1)
            data = sub.sock.recv(4096)
        except TimeoutError:
            return                                     # dropped: fine
        assert data[1] < 0x80 or data[2] != 0x00, f"forwarded non-minimal encoding: {data[:4]!r}"
