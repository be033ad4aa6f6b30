"""QoS 0/1/2 in both directions, packet identifiers, inflight window, Receive Maximum,
DUP redelivery on session resumption, QoS downgrade."""

import socket
import threading
import time

import pytest

from ..procs import BrokerProcess
from . import raw
from .helpers import V5, V311, Client, MosqSub, PacketTypes, connect, mosq_pub, props
from .raw import PUBACK, PUBCOMP, PUBLISH, PUBREC, PUBREL, RawClient


@pytest.fixture(scope="module")
def window_broker():
    """brokerd with a tiny outgoing inflight window (--max-inflight 2)."""
    with BrokerProcess("--max-inflight", "2") as b:
        yield b


# --------------------------------------------------------------------------- end to end

@pytest.mark.parametrize("qos", [0, 1, 2])
@pytest.mark.parametrize("pub_v,sub_v", [(V311, V311), (V311, V5), (V5, V311), (V5, V5)])
def test_qos_end_to_end_paho(broker, client_id, topic, qos, pub_v, sub_v):
    with connect(broker.port(), client_id + "s", sub_v) as sub, connect(broker.port(), client_id + "p", pub_v) as pub:
        assert [c.value for c in sub.subscribe(topic, 2)] == [2]
        for i in range(3):
            pub.publish(topic, f"m{i}".encode(), qos=qos)
        msgs = sub.expect_n(3)
        assert [(m.payload, m.qos) for m in msgs] == [(b"m0", qos), (b"m1", qos), (b"m2", qos)]
        sub.expect_none(0.2)


@pytest.mark.parametrize("qos", [0, 1, 2])
@pytest.mark.parametrize("version", ["mqttv311", "mqttv5"])
def test_qos_end_to_end_mosquitto_clients(broker, topic, qos, version):
    with MosqSub(broker.port(), topic, version=version, qos=2) as sub:
        mosq_pub(broker.port(), topic, f"q{qos}", version=version, qos=qos)
        m = sub.messages(1)[0]
        assert (m["payload"], m["qos"]) == (f"q{qos}", qos)
        if qos:
            assert m["mid"] > 0


@pytest.mark.parametrize("sub_qos,pub_qos", [(0, 1), (0, 2), (1, 2), (1, 0), (2, 1)])
@pytest.mark.parametrize("version", [V311, V5])
def test_delivery_qos_is_minimum_of_publish_and_subscription(broker, client_id, topic, sub_qos, pub_qos, version):
    """[MQTT-3.8.4-6]: messages are delivered at min(publish QoS, granted QoS)."""
    with connect(broker.port(), client_id + "s", version) as sub, connect(broker.port(), client_id + "p", V311) as pub:
        sub.subscribe(topic, sub_qos)
        pub.publish(topic, b"x", qos=pub_qos)
        assert sub.expect().qos == min(sub_qos, pub_qos)


# --------------------------------------------------------------------------- on the wire

@pytest.mark.parametrize("version", [4, 5])
def test_inbound_acks_carry_the_packet_id(broker, client_id, topic, version):
    """QoS 1 -> PUBACK(pid); QoS 2 -> PUBREC(pid), PUBREL(pid) -> PUBCOMP(pid)."""
    with RawClient(broker.port()) as c:
        c.connect(client_id, version=version)
        c.publish(topic, b"a", qos=1, pid=0x1234)
        assert c.expect(PUBACK).pid == 0x1234
        c.publish(topic, b"b", qos=2, pid=0xBEEF)
        assert c.expect(PUBREC).pid == 0xBEEF
        c.ack(PUBREL, 0xBEEF)
        assert c.expect(PUBCOMP).pid == 0xBEEF


@pytest.mark.parametrize("version", [4, 5])
def test_outbound_qos2_flow_and_distinct_packet_ids(broker, client_id, topic, version):
    with RawClient(broker.port()) as c:
        c.connect(client_id, version=version)
        assert c.subscribe(topic, 2) == [2]
        with connect(broker.port(), client_id + "p", V311) as pub:
            for i in range(3):
                pub.publish(topic, b"%d" % i, qos=2)
        got = [c.expect(PUBLISH) for _ in range(3)]
        assert [p.payload for p in got] == [b"0", b"1", b"2"]
        assert all(p.qos == 2 and not p.dup and p.pid for p in got)
        assert len({p.pid for p in got}) == 3
        for p in got:
            c.ack(PUBREC, p.pid)
            assert c.expect(PUBREL).pid == p.pid
            c.ack(PUBCOMP, p.pid)
        assert c.is_open()


@pytest.mark.parametrize("version", [4, 5])
def test_inbound_qos2_duplicate_is_delivered_once(broker, client_id, topic, version):
    """[MQTT-4.3.3]: a re-sent QoS 2 PUBLISH (DUP) before PUBREL must not be delivered twice."""
    with connect(broker.port(), client_id + "s", V311) as sub, RawClient(broker.port()) as c:
        sub.subscribe(topic, 2)
        c.connect(client_id, version=version)
        c.publish(topic, b"once", qos=2, pid=7)
        assert c.expect(PUBREC).pid == 7
        c.publish(topic, b"once", qos=2, pid=7, dup=True)
        assert c.expect(PUBREC).pid == 7
        c.ack(PUBREL, 7)
        assert c.expect(PUBCOMP).pid == 7
        assert sub.expect().payload == b"once"
        sub.expect_none(0.3)


def test_inbound_qos2_resent_after_reconnect_is_delivered_once(broker, client_id, topic):
    """The id of an unreleased QoS 2 message lives in the session: resending it after a reconnect
    (clean session 0) completes the flow without a second delivery."""
    with connect(broker.port(), client_id + "s", V311) as sub:
        sub.subscribe(topic, 2)
        with RawClient(broker.port()) as c:
            c.connect(client_id, version=4, clean=False)
            c.publish(topic, b"x", qos=2, pid=9)
            assert c.expect(PUBREC).pid == 9
        with RawClient(broker.port()) as c:
            assert c.connect(client_id, version=4, clean=False).session_present
            c.publish(topic, b"x", qos=2, pid=9, dup=True)
            assert c.expect(PUBREC).pid == 9
            c.ack(PUBREL, 9)
            assert c.expect(PUBCOMP).pid == 9
        assert sub.expect().payload == b"x"
        sub.expect_none(0.3)
    with RawClient(broker.port()) as c:
        c.connect(client_id, version=4, clean=True)


# --------------------------------------------------------------------------- redelivery

@pytest.mark.parametrize("version", [4, 5])
def test_unacked_qos1_redelivered_with_dup_after_reconnect(broker, client_id, topic, version):
    """[MQTT-4.4.0-1]: on resumption the server re-sends unacknowledged PUBLISH with DUP=1 and
    the original packet ids, in the original order."""
    cprops = {raw.SESSION_EXPIRY_INTERVAL: 60} if version == 5 else None
    with RawClient(broker.port()) as c:
        c.connect(client_id, version=version, clean=False, props=cprops)
        c.subscribe(topic, 1)
        mosq_pub(broker.port(), topic, "one", qos=1)
        mosq_pub(broker.port(), topic, "two", qos=1)
        first = [c.expect(PUBLISH) for _ in range(2)]
        assert not any(p.dup for p in first)
    # dropped without acking; come back
    with RawClient(broker.port()) as c:
        ack = c.connect(client_id, version=version, clean=False, props=cprops)
        assert ack.session_present
        again = [c.expect(PUBLISH) for _ in range(2)]
        assert [(p.pid, p.payload, p.dup, p.qos) for p in again] == \
            [(p.pid, p.payload, True, 1) for p in first]
        for p in again:
            c.ack(PUBACK, p.pid)
        assert c.is_open(0.3)
    with RawClient(broker.port()) as c:
        assert c.connect(client_id, version=version, clean=False, props=cprops).session_present
        assert c.is_open(0.3)  # nothing more is re-sent once acknowledged
        assert not c.buf
    with RawClient(broker.port()) as c:
        c.connect(client_id, version=version, clean=True)


@pytest.mark.parametrize("version", [4, 5])
def test_unacked_pubrel_resent_after_reconnect(broker, client_id, topic, version):
    """QoS 2 outbound: PUBREC sent, PUBCOMP never -> PUBREL is re-sent on resumption."""
    cprops = {raw.SESSION_EXPIRY_INTERVAL: 60} if version == 5 else None
    with RawClient(broker.port()) as c:
        c.connect(client_id, version=version, clean=False, props=cprops)
        c.subscribe(topic, 2)
        mosq_pub(broker.port(), topic, "q2", qos=2)
        p = c.expect(PUBLISH)
        c.ack(PUBREC, p.pid)
        assert c.expect(PUBREL).pid == p.pid
    with RawClient(broker.port()) as c:
        c.connect(client_id, version=version, clean=False, props=cprops)
        assert c.expect(PUBREL).pid == p.pid
        c.ack(PUBCOMP, p.pid)
        assert c.is_open(0.3)
        assert not c.buf
    with RawClient(broker.port()) as c:
        c.connect(client_id, version=version, clean=True)


def test_paho_sees_dup_redelivery(broker, client_id, topic):
    """A paho subscriber that never acked (manual ack) gets the message again, DUP set, after reconnecting."""
    sub = connect(broker.port(), client_id, V311, clean=False, manual_ack=True)
    sub.subscribe(topic, 1)
    mosq_pub(broker.port(), topic, "again", qos=1)
    m = sub.expect()
    assert not m.dup
    sub.drop()
    sub = connect(broker.port(), client_id, V311, clean=False)
    m2 = sub.expect()
    assert (m2.payload, m2.dup, m2.mid) == (b"again", True, m.mid)
    sub.expect_none(0.3)
    sub.disconnect()
    connect(broker.port(), client_id, V311, clean=True).disconnect()


# --------------------------------------------------------------------------- flow control

def test_inflight_window_limits_unacked_messages(window_broker, client_id, topic):
    """--max-inflight 2: a subscriber that does not ack holds at most 2 messages; each ack releases one."""
    sub = connect(window_broker.port(), client_id, V311, manual_ack=True)
    sub.subscribe(topic, 1)
    with connect(window_broker.port(), client_id + "p", V311) as pub:
        for i in range(6):
            pub.publish(topic, b"%d" % i, qos=1)
    got = sub.expect_n(2)
    sub.expect_none(0.4)
    sub.ack(got[0])
    got += sub.expect_n(1)
    sub.expect_none(0.3)
    for m in got[1:]:
        sub.ack(m)
    while len(got) < 6:
        m = sub.expect()
        got.append(m)
        sub.ack(m)
    assert [m.payload for m in got] == [b"%d" % i for i in range(6)]
    sub.disconnect()


@pytest.mark.parametrize("version", [V311, V5])
def test_many_qos1_to_slow_subscriber_arrive_in_order(window_broker, client_id, topic, version):
    """60 QoS 1 messages through a window of 2 to a subscriber that takes its time: all, in order."""
    got = []
    done = threading.Event()

    sub = Client(client_id, version)

    def slow(client, userdata, msg):
        time.sleep(0.005)
        got.append(msg.payload)
        if len(got) == 60:
            done.set()

    sub.client.on_message = slow
    sub.connect(window_broker.port())
    sub.subscribe(topic, 1)
    pub = Client(client_id + "p", V311)
    pub.client.max_inflight_messages_set(60)
    with pub.connect(window_broker.port()):
        infos = [pub.publish(topic, b"%d" % i, qos=1, wait=False) for i in range(60)]
        for info in infos:
            info.wait_for_publish(10)
    assert done.wait(10), f"{len(got)} of 60 arrived"
    assert got == [b"%d" % i for i in range(60)]
    sub.disconnect()


def test_v5_receive_maximum_from_client_is_honoured(broker, client_id, topic):
    """5.0 [MQTT-3.3.4-9]: the server sends at most Receive Maximum unacknowledged QoS 1/2 PUBLISHes."""
    sub = connect(broker.port(), client_id, V5, manual_ack=True,
                  properties=props(PacketTypes.CONNECT, ReceiveMaximum=3))
    sub.subscribe(topic, 2)
    with connect(broker.port(), client_id + "p", V5) as pub:
        for i in range(8):
            pub.publish(topic, b"%d" % i, qos=1)
    got = sub.expect_n(3)
    sub.expect_none(0.4)
    sub.ack(got[0])
    got += sub.expect_n(1)
    sub.expect_none(0.3)
    for m in got[1:]:
        sub.ack(m)
    while len(got) < 8:
        m = sub.expect()
        got.append(m)
        sub.ack(m)
    assert [m.payload for m in got] == [b"%d" % i for i in range(8)]
    sub.disconnect()


def test_v5_receive_maximum_counts_qos2_until_pubcomp(broker, client_id, topic):
    """5.0 [MQTT-4.9.0-2]: a QoS 2 message uses a slot of the client's Receive Maximum until PUBCOMP."""
    with RawClient(broker.port()) as c:
        c.connect(client_id, version=5, props={raw.RECEIVE_MAXIMUM: 2})
        c.subscribe(topic, 2)
        with connect(broker.port(), client_id + "p", V5) as pub:
            for i in range(4):
                pub.publish(topic, b"%d" % i, qos=2)
        a, b = c.expect(PUBLISH), c.expect(PUBLISH)
        assert c.is_open(0.3) and not c.buf
        c.ack(PUBREC, a.pid)
        assert c.expect(PUBREL).pid == a.pid
        assert c.is_open(0.3) and not c.buf      # still inflight until PUBCOMP
        c.ack(PUBCOMP, a.pid)
        assert c.expect(PUBLISH).payload == b"2"
        assert c.is_open(0.3) and not c.buf
        c.ack(PUBREC, b.pid)
        assert c.expect(PUBREL).pid == b.pid
        c.ack(PUBCOMP, b.pid)
        assert c.expect(PUBLISH).payload == b"3"


def test_v5_receive_maximum_advertised(window_broker, client_id):
    c = connect(window_broker.port(), client_id, V5)
    assert c.connack_props.ReceiveMaximum == 2
    c.disconnect()


def test_v5_client_exceeding_receive_maximum_is_disconnected(window_broker, client_id, topic):
    """5.0 [MQTT-3.3.4-7/8]: more unacknowledged QoS 2 PUBLISHes than the server's Receive Maximum
    (2) -> DISCONNECT 0x93."""
    with RawClient(window_broker.port()) as c:
        c.connect(client_id, version=5)
        for pid in (1, 2, 3):
            c.publish(topic, b"x", qos=2, pid=pid)
        got = c.expect_closed()
        assert [p.type for p in got] == [PUBREC, PUBREC, raw.DISCONNECT]
        assert got[-1].code == 0x93


def test_qos0_not_held_back_by_full_window(window_broker, client_id, topic):
    """QoS 0 messages are not subject to the inflight window."""
    sub = connect(window_broker.port(), client_id, V311, manual_ack=True)
    sub.subscribe(topic, 1)
    with connect(window_broker.port(), client_id + "p", V311) as pub:
        pub.publish(topic, b"a", qos=1)
        pub.publish(topic, b"b", qos=1)
        sub.expect_n(2)
        pub.publish(topic, b"c", qos=0)
        assert sub.expect().payload == b"c"
    sub.disconnect()


def test_v311_client_with_many_qos2_in_flight_is_served(broker, client_id, topic):
    """3.1.1 has no Receive Maximum: a client with 40 QoS 2 PUBLISHes in flight at once did nothing
    wrong and must not be disconnected; the reference Mosquitto 2.0.11 PUBRECs all 40 and stays
    connected. (Regression: brokerd applied --max-inflight to 3.1.1 clients and dropped them with
    0x93; found by this suite, fixed in 7882229.)"""
    with connect(broker.port(), client_id + "s", V311) as sub:
        sub.subscribe(topic, 2)
        with RawClient(broker.port()) as c:
            c.connect(client_id, version=4)
            c.send(b"".join(raw.publish_packet(topic, b"%d" % i, 2, pid=i + 1) for i in range(40)))
            recs = [c.expect(PUBREC).pid for _ in range(40)]
            assert recs == list(range(1, 41))
            for pid in recs:
                c.ack(PUBREL, pid)
            assert sorted(c.expect(PUBCOMP).pid for _ in range(40)) == recs
        assert len(sub.expect_n(40)) == 40



def test_a_client_that_keeps_sending_after_a_protocol_error_reads_the_disconnect(window_broker, client_id, topic):
    """A v5 client over Receive Maximum whose PUBLISHes keep arriving, and which is slow to read
    what it is sent, must still read DISCONNECT 0x93, not a connection reset. Closing a socket
    that has unread input makes the kernel send RST and drop what it had not sent yet -- the
    DISCONNECT, queued behind the messages the client had not read. The server half-closes,
    drains the client's input until the client closes (or briefly), then closes."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)     # a client slow to take its input
    sock.connect(("127.0.0.1", window_broker.port()))
    c = RawClient(window_broker.port(), sock=sock)
    with c:
        c.connect(client_id, version=5)
        c.send(raw.subscribe_packet(1, [(topic, 0)], version=5))
        assert c.recv().type == raw.SUBACK
        with connect(window_broker.port(), client_id + "-pub", V311) as pub:
            for _ in range(200):               # 2 MB the subscriber does not read yet
                pub.publish(topic, b"m" * 10_000, qos=0)
            pub.publish(topic, b"end", qos=1)

            def flood():                       # the 3rd QoS 2 PUBLISH breaks the window (2); 1 MB more follows
                try:
                    for pid in range(1, 1000):
                        c.sock.sendall(raw.publish_packet(topic, b"x" * 1000, qos=2, pid=pid, version=5))
                except OSError:
                    pass

            sender = threading.Thread(target=flood, daemon=True)
            sender.start()
            time.sleep(1.0)                    # the server answered and closed before we read
            got = c.expect_closed(timeout=15)
            sender.join(5)
        kinds = [p.type for p in got]
        assert kinds and kinds[-1] == raw.DISCONNECT, f"{len(kinds)} packets, the last {kinds[-3:]}"
        assert got[-1].code == 0x93
