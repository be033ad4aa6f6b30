"""Shared subscriptions ($share/GROUP/FILTER): one delivery per message per group, round robin,
failover when a member leaves."""

from collections import Counter

import pytest

from ..procs import BrokerProcess
from . import raw
from .helpers import V5, V311, MosqSub, connect, mosq_pub
from .raw import PUBACK, PUBLISH, RawClient


@pytest.fixture(scope="module")
def random_broker():
    with BrokerProcess("--shared-subscription-strategy", "random") as b:
        yield b


def _members(port, client_id, n, filt, versions=(V5,), qos=1):
    ms = []
    for i in range(n):
        c = connect(port, f"{client_id}-m{i}", versions[i % len(versions)])
        assert [rc.value for rc in c.subscribe(filt, qos)] == [qos]
        ms.append(c)
    return ms


def _drain(clients, timeout=0.3):
    got = {}
    for i, c in enumerate(clients):
        got[i] = []
        try:
            while True:
                got[i].append(c.expect(timeout=timeout).payload)
        except AssertionError:
            pass
    return got


@pytest.mark.parametrize("versions", [(V5,), (V311,), (V5, V311)])
def test_round_robin_each_message_to_exactly_one_member(broker, client_id, topic, versions):
    members = _members(broker.port(), client_id, 3, f"$share/grp/{topic}/#", versions)
    try:
        with connect(broker.port(), client_id + "p", V5) as pub:
            for i in range(12):
                pub.publish(f"{topic}/x", b"%d" % i, qos=1)
        got = _drain(members)
        everything = sorted(p for ps in got.values() for p in ps)
        assert everything == sorted(b"%d" % i for i in range(12))      # each exactly once
        assert sorted(len(ps) for ps in got.values()) == [4, 4, 4]      # round robin
    finally:
        for m in members:
            m.disconnect()


def test_random_strategy_still_delivers_each_once(random_broker, client_id, topic):
    members = _members(random_broker.port(), client_id, 3, f"$share/g/{topic}")
    try:
        with connect(random_broker.port(), client_id + "p", V5) as pub:
            for i in range(20):
                pub.publish(topic, b"%d" % i, qos=1)
        got = _drain(members)
        assert Counter(p for ps in got.values() for p in ps) == Counter(b"%d" % i for i in range(20))
    finally:
        for m in members:
            m.disconnect()


def test_groups_are_independent_and_coexist_with_plain_subscribers(broker, client_id, topic):
    a = _members(broker.port(), client_id + "a", 2, f"$share/A/{topic}")
    b = _members(broker.port(), client_id + "b", 2, f"$share/B/{topic}")
    plain = connect(broker.port(), client_id + "plain", V311)
    plain.subscribe(topic, 1)
    try:
        with connect(broker.port(), client_id + "p", V5) as pub:
            for i in range(4):
                pub.publish(topic, b"%d" % i, qos=1)
        assert sum(len(v) for v in _drain(a).values()) == 4
        assert sum(len(v) for v in _drain(b).values()) == 4
        assert len(_drain([plain])[0]) == 4
    finally:
        for m in a + b + [plain]:
            m.disconnect()


def test_failover_when_a_member_disconnects(broker, client_id, topic):
    """After a member leaves, every later message goes to the remaining member(s); none is lost."""
    m0, m1 = _members(broker.port(), client_id, 2, f"$share/g/{topic}")
    with connect(broker.port(), client_id + "p", V5) as pub:
        for i in range(4):
            pub.publish(topic, b"a%d" % i, qos=1)
        first = _drain([m0, m1])
        assert len(first[0]) == 2 and len(first[1]) == 2
        m0.drop()
        for i in range(4):
            pub.publish(topic, b"b%d" % i, qos=1)
        assert sorted(m.payload for m in m1.expect_n(4)) == [b"b%d" % i for i in range(4)]
    m1.disconnect()


def test_unacked_qos1_of_departed_member_goes_to_another(broker, client_id, topic):
    """5.0 4.8.2: when the session of a member ends with a QoS 1 message unacknowledged, the
    server SHOULD send it to another member."""
    with RawClient(broker.port()) as silent:
        silent.connect(client_id + "-silent", version=5)
        silent.subscribe(f"$share/g/{topic}", 1)
        other = connect(broker.port(), client_id + "-other", V5)
        other.subscribe(f"$share/g/{topic}", 1)
        with connect(broker.port(), client_id + "p", V5) as pub:
            for i in range(4):
                pub.publish(topic, b"%d" % i, qos=1)
        unacked = [silent.expect(PUBLISH).payload for _ in range(2)]
        got = [m.payload for m in other.expect_n(2)]
    # silent's connection (session expiry 0) is gone without acking
    got += [m.payload for m in other.expect_n(2)]
    assert sorted(got) == [b"0", b"1", b"2", b"3"]
    assert set(unacked) <= set(got)
    other.disconnect()


def test_unfinished_qos2_of_ended_member_not_sent_to_another(broker, client_id, topic):
    """5.0 [MQTT-4.8.2-5]: a QoS 2 message the server was sending to a member whose session then ends
    MUST NOT be sent to any other member (it may already have been processed). The reference
    Mosquitto does not re-send it. (Regression: found by this suite, fixed in 7882229.)"""
    with RawClient(broker.port()) as silent:
        silent.connect(client_id + "-silent", version=5)
        silent.subscribe(f"$share/g/{topic}", 2)
        other = connect(broker.port(), client_id + "-other", V5)
        other.subscribe(f"$share/g/{topic}", 2)
        with connect(broker.port(), client_id + "p", V5) as pub:
            pub.publish(topic, b"q2-a", qos=2)
            pub.publish(topic, b"q2-b", qos=2)
        got_silent = silent.expect(PUBLISH)
        silent.ack(raw.PUBREC, got_silent.pid)        # processed, PUBREL/PUBCOMP never finished
        silent.expect(raw.PUBREL)
        got_other = other.expect().payload
    assert {got_silent.payload, got_other} == {b"q2-a", b"q2-b"}
    other.expect_none(0.5)
    other.disconnect()


def test_negative_puback_discards_shared_message(broker, client_id, topic):
    """5.0 [MQTT-4.8.2-6]: PUBACK >= 0x80 from the chosen member: the message is discarded, not
    sent to another member."""
    with RawClient(broker.port()) as refuser:
        refuser.connect(client_id + "-no", version=5)
        refuser.subscribe(f"$share/g/{topic}", 1)
        other = connect(broker.port(), client_id + "-other", V5)
        other.subscribe(f"$share/g/{topic}", 1)
        with connect(broker.port(), client_id + "p", V5) as pub:
            pub.publish(topic, b"0", qos=1)
            pub.publish(topic, b"1", qos=1)
        p = refuser.expect(PUBLISH)
        refuser.send(raw.ack_packet(PUBACK, p.pid, 5, code=0x83))
        other_got = other.expect().payload
        assert other_got != p.payload
        other.expect_none(0.4)
    other.disconnect()


def test_shared_subscription_with_mosquitto_sub(broker, topic):
    a = MosqSub(broker.port(), f"$share/ms/{topic}", version="mqttv5", qos=1).start()
    b = MosqSub(broker.port(), f"$share/ms/{topic}", version="mqttv311", qos=1).start()
    try:
        for i in range(6):
            mosq_pub(broker.port(), topic, f"m{i}", qos=1)
        ga = [m["payload"] for m in a.messages(3)]
        gb = [m["payload"] for m in b.messages(3)]
        assert sorted(ga + gb) == [f"m{i}" for i in range(6)]
        a.none(0.2)
        b.none(0.1)
    finally:
        a.stop()
        b.stop()


def test_unsubscribe_from_shared_group(broker, client_id, topic):
    m0, m1 = _members(broker.port(), client_id, 2, f"$share/g/{topic}")
    assert [rc.value for rc in m0.unsubscribe(f"$share/g/{topic}")] == [0]
    with connect(broker.port(), client_id + "p", V5) as pub:
        for i in range(3):
            pub.publish(topic, b"%d" % i, qos=1)
    assert len(m1.expect_n(3)) == 3
    m0.expect_none(0.2)
    m0.disconnect()
    m1.disconnect()
