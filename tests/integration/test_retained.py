"""Retained messages: set, replace, clear, delivery on subscribe, v5 Retain Handling and
Retain As Published, wildcards."""

import time

import pytest

from . import raw
from .helpers import V5, V311, MosqSub, PacketTypes, connect, mosq_pub, props, sub_opts
from .raw import PUBLISH, RawClient


@pytest.mark.parametrize("version", [V311, V5])
def test_retained_delivered_on_subscribe_with_retain_flag(broker, client_id, topic, version):
    mosq_pub(broker.port(), topic, "kept", qos=1, retain=True)
    with connect(broker.port(), client_id, version) as sub:
        sub.subscribe(topic, 1)
        m = sub.expect()
        assert (m.payload, m.retain, m.qos) == (b"kept", True, 1)
        sub.expect_none(0.2)


@pytest.mark.parametrize("version", ["mqttv311", "mqttv5", "mqttv31"])
def test_retained_with_mosquitto_clients(broker, topic, version):
    mosq_pub(broker.port(), topic, "r1", version=version, retain=True)
    sub = MosqSub(broker.port(), topic, version=version, count=1, wait=5).start(expect_suback=False)
    m = sub.messages(1)[0]
    assert (m["payload"], m["retain"]) == ("r1", 1)
    assert sub.wait() == 0


def test_retained_replaced_by_newer(broker, client_id, topic):
    mosq_pub(broker.port(), topic, "old", retain=True)
    mosq_pub(broker.port(), topic, "new", retain=True)
    with connect(broker.port(), client_id, V311) as sub:
        sub.subscribe(topic, 0)
        assert sub.expect().payload == b"new"
        sub.expect_none(0.2)


def test_empty_retained_clears_and_is_forwarded(broker, client_id, topic):
    """[MQTT-3.3.1-10/11]: a zero-length retained PUBLISH removes the retained message; current
    subscribers still receive it as a normal message."""
    mosq_pub(broker.port(), topic, "to-clear", retain=True)
    with connect(broker.port(), client_id + "live", V311) as live:
        live.subscribe(topic, 0)
        assert live.expect().retain
        mosq_pub(broker.port(), topic, None, retain=True)
        m = live.expect()
        assert (m.payload, m.retain) == (b"", False)
    with connect(broker.port(), client_id, V5) as sub:
        sub.subscribe(topic, 0)
        sub.expect_none(0.3)


def test_live_retained_publish_has_retain_flag_cleared_v311(broker, client_id, topic):
    """3.1.1 [MQTT-3.3.1-9]: a message sent because of an established subscription has RETAIN 0."""
    with connect(broker.port(), client_id, V311) as sub:
        sub.subscribe(topic, 0)
        mosq_pub(broker.port(), topic, "live", retain=True)
        m = sub.expect()
        assert (m.payload, m.retain) == (b"live", False)


def test_retained_qos_is_min_of_stored_and_granted(broker, client_id, topic):
    mosq_pub(broker.port(), topic, "q1", qos=1, retain=True)
    with connect(broker.port(), client_id + "a", V311) as a, connect(broker.port(), client_id + "b", V311) as b:
        a.subscribe(topic, 0)
        b.subscribe(topic, 2)
        assert a.expect().qos == 0
        assert b.expect().qos == 1


@pytest.mark.parametrize("version", [V311, V5])
def test_wildcard_subscribe_gets_every_matching_retained(broker, client_id, topic, version):
    names = [f"{topic}/a", f"{topic}/b/c", f"{topic}/d", f"{topic}/d/e/f"]
    for i, n in enumerate(names):
        mosq_pub(broker.port(), n, f"v{i}", retain=True)
    mosq_pub(broker.port(), f"{topic}x/other", "no", retain=True)
    with connect(broker.port(), client_id + "h", version) as sub:
        sub.subscribe(f"{topic}/#", 0)
        msgs = sub.expect_n(4)
        assert {m.topic: m.payload for m in msgs} == {n: f"v{i}".encode() for i, n in enumerate(names)}
        assert all(m.retain for m in msgs)
        sub.expect_none(0.2)
    with connect(broker.port(), client_id + "p", version) as sub:
        sub.subscribe(f"{topic}/+", 0)
        assert sorted(m.topic for m in sub.expect_n(2)) == [f"{topic}/a", f"{topic}/d"]
        sub.expect_none(0.2)
    with connect(broker.port(), client_id + "pp", version) as sub:
        sub.subscribe(f"{topic}/+/f", 0)
        # "+" matches exactly one level, "#" also matches its parent level
        sub.expect_none(0.2)
        sub.subscribe(f"{topic}/+/+/f", 0)
        assert sub.expect().topic == f"{topic}/d/e/f"
        sub.subscribe(f"{topic}/d/#", 0)
        assert sorted(m.topic for m in sub.expect_n(2)) == [f"{topic}/d", f"{topic}/d/e/f"]


def test_retained_survives_publisher_disconnect_and_is_per_topic(broker, client_id, topic):
    mosq_pub(broker.port(), f"{topic}/1", "one", retain=True)
    mosq_pub(broker.port(), f"{topic}/2", "two", retain=True)
    mosq_pub(broker.port(), f"{topic}/1", None, retain=True)
    with connect(broker.port(), client_id, V311) as sub:
        sub.subscribe(f"{topic}/#", 0)
        assert sub.expect().payload == b"two"
        sub.expect_none(0.2)


# --------------------------------------------------------------------------- MQTT 5 options

def test_v5_retain_handling_0_sends_on_every_subscribe(broker, client_id, topic):
    mosq_pub(broker.port(), topic, "rh0", retain=True)
    with connect(broker.port(), client_id, V5) as sub:
        sub.subscribe(topic, options=sub_opts(0, rh=0))
        assert sub.expect().payload == b"rh0"
        sub.subscribe(topic, options=sub_opts(1, rh=0))
        assert sub.expect().payload == b"rh0"


def test_v5_retain_handling_1_only_for_new_subscription(broker, client_id, topic):
    """5.0 3.8.3.1: Retain Handling 1 = send retained messages only if the subscription does not exist."""
    mosq_pub(broker.port(), topic, "rh1", retain=True)
    with connect(broker.port(), client_id, V5) as sub:
        sub.subscribe(topic, options=sub_opts(0, rh=1))
        assert sub.expect().payload == b"rh1"
        sub.subscribe(topic, options=sub_opts(1, rh=1))
        sub.expect_none(0.3)
        sub.unsubscribe(topic)
        sub.subscribe(topic, options=sub_opts(1, rh=1))
        assert sub.expect().payload == b"rh1"


def test_v5_retain_handling_2_never_sends(broker, client_id, topic):
    mosq_pub(broker.port(), topic, "rh2", retain=True)
    with connect(broker.port(), client_id, V5) as sub:
        sub.subscribe(topic, options=sub_opts(0, rh=2))
        sub.expect_none(0.3)
        # live messages still flow
        mosq_pub(broker.port(), topic, "live")
        assert sub.expect().payload == b"live"


def test_retained_only_with_mosquitto_sub(broker, topic):
    """mosquitto_sub --retained-only sees the retained message flagged as retained."""
    mosq_pub(broker.port(), topic, "ro", retain=True, version="mqttv5")
    sub = MosqSub(broker.port(), topic, version="mqttv5", args=["--retained-only"], wait=5).start(expect_suback=False)
    assert sub.messages(1)[0]["payload"] == "ro"
    sub.stop()


@pytest.mark.parametrize("rap", [False, True])
def test_v5_retain_as_published(broker, client_id, topic, rap):
    """5.0 3.8.3.1: with Retain As Published the live message keeps RETAIN=1, without it RETAIN=0."""
    with connect(broker.port(), client_id, V5) as sub:
        sub.subscribe(topic, options=sub_opts(1, rap=rap))
        with connect(broker.port(), client_id + "p", V5) as pub:
            pub.publish(topic, b"r", qos=1, retain=True)
            pub.publish(topic, b"n", qos=1, retain=False)
        a, b = sub.expect_n(2)
        assert (a.payload, a.retain) == (b"r", rap)
        assert (b.payload, b.retain) == (b"n", False)
    mosq_pub(broker.port(), topic, None, retain=True)


def test_v5_retained_message_expires(broker, client_id, topic):
    """5.0 3.3.2.3.3: a retained message is not delivered after its Message Expiry Interval."""
    with connect(broker.port(), client_id + "p", V5) as pub:
        pub.publish(topic + "/short", b"s", qos=1, retain=True,
                    properties=props(PacketTypes.PUBLISH, MessageExpiryInterval=1))
        pub.publish(topic + "/long", b"l", qos=1, retain=True,
                    properties=props(PacketTypes.PUBLISH, MessageExpiryInterval=100))
    time.sleep(2.1)
    with connect(broker.port(), client_id, V5) as sub:
        sub.subscribe(topic + "/#", 1)
        m = sub.expect()
        assert m.payload == b"l"
        # the interval sent on is what is left of it
        assert 95 <= m.properties.MessageExpiryInterval <= 98
        sub.expect_none(0.2)


def test_retained_not_sent_to_shared_subscription(broker, client_id, topic):
    """brokerd sends no retained messages when a shared subscription is made (each retained message
    would otherwise reach one arbitrary member per subscribe). Pinned as brokerd's choice: the
    reference Mosquitto 2.0.11 does send them."""
    mosq_pub(broker.port(), topic, "kept", retain=True)
    with connect(broker.port(), client_id, V5) as sub:
        sub.subscribe(f"$share/g/{topic}", 0)
        sub.expect_none(0.3)


def _payload(topic: str) -> bytes:
    return topic.encode() + b"." * 200        # 1,200 of them: past a connection's 64 KiB of output per iteration


def _publish_retained(port: int, topics: list[str], qos: int) -> None:
    with RawClient(port, timeout=30) as pub:
        pub.connect("retainer", version=4)
        pub.send(b"".join(raw.publish_packet(t, _payload(t), qos, True, pid=i + 1)
                          for i, t in enumerate(topics)))
        pub.send(b"\xc0\x00")                                   # PINGREQ: answered once all before it are done
        pub.expect(raw.PINGRESP, timeout=30, skip=(raw.PUBACK,))


def _read_retained(c: RawClient, n: int, ack: bool) -> dict:
    got = {}
    while len(got) < n:
        p = c.recv(10)
        assert p.type == PUBLISH, p
        assert p.retain
        got[p.topic] = p.payload
        if p.qos and ack:
            c.ack(raw.PUBACK, p.pid)
    return got


@pytest.mark.parametrize("qos,store", [(0, None), (1, None), (1, "sqlite")])
def test_wildcard_subscribe_gets_more_retained_than_the_queue_holds(broker_factory, tmp_path, client_id, qos, store):
    """A subscription matching more retained messages than the session's queue holds (here 20,
    default 1000) gets every one of them, sent as the connection takes them. Before, the broker
    made a list of every match at SUBSCRIBE and pushed them all at once into the session's
    bounded queue: 2,000 retained under ``fleet/#`` reached a subscriber as the first ~1,500
    (QoS 0) or ~1,000 (QoS 1) and the rest were dropped (counted as queue overflow)."""
    args = ["--max-queued", "20", "--max-inflight", "8"]
    if store:
        args += ["--store", f"sqlite:///{tmp_path}/b.sqlite3"]
    b = broker_factory(*args)
    topics = [f"fleet/{i % 7}/dev{i}" for i in range(600)] + [f"fleet/flat{i}" for i in range(600)]
    _publish_retained(b.port(), topics, qos)
    with RawClient(b.port(), timeout=10) as c:
        c.connect(client_id, version=5, clean=store is None, props={raw.SESSION_EXPIRY_INTERVAL: 60} if store else None)
        c.send(raw.subscribe_packet(1, [("fleet/#", 1)], 5, {raw.SUBSCRIPTION_IDENTIFIER: 3}))
        assert c.expect(raw.SUBACK).codes == [1]
        got = _read_retained(c, len(topics), ack=True)
        assert got == {t: _payload(t) for t in topics}
        with pytest.raises(TimeoutError):
            c.recv(0.3)


def test_retained_sent_as_the_window_frees_and_unsubscribe_stops_them(broker_factory, client_id):
    """QoS 1 retained messages past the window wait for PUBACKs, not in the queue: a client that
    acknowledges slowly still gets all of them; after UNSUBSCRIBE no more come ([MQTT-3.10.4-2])."""
    b = broker_factory("--max-queued", "10", "--max-inflight", "5")
    topics = [f"slow/{i}" for i in range(200)]
    _publish_retained(b.port(), topics, 1)
    with RawClient(b.port(), timeout=10) as c:
        c.connect(client_id, version=5)
        c.send(raw.subscribe_packet(1, [("slow/+", 1)], 5))
        c.expect(raw.SUBACK)
        first = [c.expect(PUBLISH) for _ in range(5)]
        with pytest.raises(TimeoutError):
            c.recv(0.5)                                         # the window (5) is full
        for p in first:
            c.ack(raw.PUBACK, p.pid)
        got = {p.topic for p in first} | set(_read_retained(c, 100, ack=True))
        assert len(got) == 105
        c.send(raw.packet(0xA2, b"\x00\x02\x00" + raw.s("slow/+")))
        # those in flight or queued before the UNSUBACK may still come (the window and the one that
        # found it full); then nothing
        late = set()
        while True:
            p = c.recv(5)
            if p.type == raw.UNSUBACK:
                break
            c.ack(raw.PUBACK, p.pid)
            late.add(p.topic)
        while True:
            try:
                p = c.recv(0.5)
            except TimeoutError:
                break
            c.ack(raw.PUBACK, p.pid)
            late.add(p.topic)
        assert len(late) <= 6 and not late & got


EXPIRY = {raw.SESSION_EXPIRY_INTERVAL: 300}


def _owed(c: RawClient, client_id: str, filt: str) -> set:
    """``c`` opens a persistent session subscribed to ``filt`` at QoS 1 and reads the window's 5
    retained messages without acknowledging them; -> their topics."""
    c.connect(client_id, version=5, clean=True, props=EXPIRY)
    c.send(raw.subscribe_packet(1, [(filt, 1)], 5))
    c.expect(raw.SUBACK)
    return {c.expect(PUBLISH).topic for _ in range(5)}


def _back(c: RawClient, client_id: str) -> list:
    """``c`` takes the persistent session of ``client_id`` back and reads what comes, acknowledging
    each QoS 1 message, until nothing comes for a second; -> their topics in order."""
    assert c.connect(client_id, version=5, clean=False, props=EXPIRY).session_present
    got = []
    while True:
        try:
            p = c.recv(1)
        except TimeoutError:
            return got
        got.append(p.topic)
        if p.qos:
            c.ack(raw.PUBACK, p.pid)


@pytest.mark.parametrize("store,takeover", [(None, False), ("sqlite", False), ("sqlite", True)])
def test_retained_messages_a_persistent_session_was_still_owed_at_disconnect_come_on_reconnect(
        broker_factory, tmp_path, client_id, store, takeover):
    """A persistent session's subscription matching more retained messages than the window lets
    out: the client drops its connection after the first few (or a new connection takes the
    session over). What it had not been sent yet comes when it is back (its session's state, as
    any message queued while it was away; Mosquitto queues them on SUBSCRIBE). Before, the rest
    were never sent: the client got only the five in flight again."""
    args = ["--max-inflight", "5", "--max-queued", "100"]
    if store:
        args += ["--store", f"sqlite:///{tmp_path}/b.sqlite3"]
    b = broker_factory(*args)
    topics = [f"owed/{i}" for i in range(40)]
    _publish_retained(b.port(), topics, 1)
    expiry = EXPIRY
    with RawClient(b.port(), timeout=10) as c:
        first = _owed(c, client_id, "owed/+")
        with pytest.raises(TimeoutError):
            c.recv(0.3)                                         # the window (5) is full
        c2 = RawClient(b.port(), timeout=10)
        if takeover:
            assert c2.connect(client_id, version=5, clean=False, props=expiry).session_present
            assert c.expect(raw.DISCONNECT).code == 0x8E        # Session taken over
    with c2 as c:
        if not takeover:
            assert c.connect(client_id, version=5, clean=False, props=expiry).session_present
        got = {}
        while len(got) < len(topics):
            p = c.recv(10)
            assert p.type == PUBLISH and p.retain and p.qos == 1, p
            assert p.dup == (p.topic in first), p
            got[p.topic] = p.payload
            c.ack(raw.PUBACK, p.pid)
        assert got == {t: _payload(t) for t in topics}
        with pytest.raises(TimeoutError):
            c.recv(0.3)


def test_retained_owed_at_disconnect_are_queued_only_while_the_queue_has_room(broker_factory, client_id):
    """The retained messages a session is still owed when its client goes fill its queue
    (``--max-queued``), no more: they push out nothing and a subscription to millions of them
    queues no more than the queue holds."""
    b = broker_factory("--max-inflight", "5", "--max-queued", "20")
    topics = [f"many/{i}" for i in range(300)]
    _publish_retained(b.port(), topics, 1)
    with RawClient(b.port(), timeout=10) as c:
        _owed(c, client_id, "many/+")
    with RawClient(b.port(), timeout=10) as c:
        got = _back(c, client_id)
        assert len(got) == 5 + 20, got                          # the window again, and a full queue
        assert len(set(got)) == len(got)


def test_retained_owed_at_disconnect_that_expired_meanwhile_take_no_room_in_the_queue(broker_factory, client_id):
    """The retained messages a session is still owed when its client goes are queued as far as its
    queue has room -- those that expired since the SUBSCRIBE are not: they would never be sent, and
    took the room of those that can. Before, 20 expired ones filled the queue (``--max-queued 20``)
    and the 10 that do not expire never came."""
    b = broker_factory("--max-inflight", "5", "--max-queued", "20")
    expiring = [f"owed/e{i}" for i in range(30)]
    kept = [f"owed/k{i}" for i in range(10)]
    with RawClient(b.port(), timeout=10) as pub:
        pub.connect("retainer", version=5)
        pub.send(b"".join(raw.publish_packet(t, _payload(t), 1, True, pid=i + 1, version=5,
                                             props={raw.MESSAGE_EXPIRY_INTERVAL: 1})
                          for i, t in enumerate(expiring)))
        pub.send(b"".join(raw.publish_packet(t, _payload(t), 1, True, pid=100 + i, version=5)
                          for i, t in enumerate(kept)))
        pub.send(b"\xc0\x00")                                   # PINGREQ: answered once all before it are done
        pub.expect(raw.PINGRESP, timeout=30, skip=(raw.PUBACK,))
    with RawClient(b.port(), timeout=10) as c:
        assert _owed(c, client_id, "owed/+") <= set(expiring)   # the window: not acknowledged
        time.sleep(1.5)                                         # every one of the 30 expires
    with RawClient(b.port(), timeout=10) as c:
        got = set(_back(c, client_id))
        assert set(kept) <= got, sorted(got)
