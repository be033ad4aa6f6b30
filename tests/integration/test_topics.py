"""Topic names and filters: wildcards, $-topics, invalid filters and names."""

import pytest

from . import raw
from .helpers import V5, V311, MosqSub, connect, mosq_pub
from .raw import RawClient


def _publish_all(port, names):
    with connect(port, "topics-pub-" + names[0].replace("/", "_")[-40:], V311) as pub:
        for n in names:
            pub.publish(n, n.encode(), qos=1)


@pytest.mark.parametrize("version", [V311, V5])
def test_single_level_wildcard(broker, client_id, topic, version):
    with connect(broker.port(), client_id, version) as sub:
        sub.subscribe(f"{topic}/+/c", 1)
        _publish_all(broker.port(), [f"{topic}/b/c", f"{topic}/b/d/c", f"{topic}/c", f"{topic}//c", f"{topic}/x/c"])
        assert sorted(m.topic for m in sub.expect_n(3)) == [f"{topic}//c", f"{topic}/b/c", f"{topic}/x/c"]
        sub.expect_none(0.2)


@pytest.mark.parametrize("version", [V311, V5])
def test_multi_level_wildcard_includes_parent(broker, client_id, topic, version):
    """[MQTT-4.7.1-2]: "sport/#" also matches "sport"."""
    with connect(broker.port(), client_id, version) as sub:
        sub.subscribe(f"{topic}/a/#", 1)
        _publish_all(broker.port(), [f"{topic}/a", f"{topic}/a/b", f"{topic}/a/b/c", f"{topic}/ab", f"{topic}/b/a"])
        assert sorted(m.topic for m in sub.expect_n(3)) == [f"{topic}/a", f"{topic}/a/b", f"{topic}/a/b/c"]
        sub.expect_none(0.2)


def test_topics_are_case_sensitive_and_exact(broker, client_id, topic):
    with connect(broker.port(), client_id, V311) as sub:
        sub.subscribe(f"{topic}/Room", 1)
        _publish_all(broker.port(), [f"{topic}/room", f"{topic}/Room/", f"{topic}/Room ", f"{topic}/Room"])
        assert [m.topic for m in sub.expect_n(1)] == [f"{topic}/Room"]
        sub.expect_none(0.2)


def test_mosquitto_sub_wildcards(broker, topic):
    with MosqSub(broker.port(), f"{topic}/+/temp", f"{topic}/log/#", version="mqttv5") as sub:
        for t in (f"{topic}/k/temp", f"{topic}/k/hum", f"{topic}/log", f"{topic}/log/a/b"):
            mosq_pub(broker.port(), t, t, version="mqttv5")
        assert sorted(m["topic"] for m in sub.messages(3)) == \
            sorted([f"{topic}/k/temp", f"{topic}/log", f"{topic}/log/a/b"])
        sub.none(0.2)


@pytest.mark.parametrize("filt", ["#", "+/broker/#", "+/+/+"])
def test_sys_topics_not_matched_by_leading_wildcards(broker, client_id, filt):
    """[MQTT-4.7.2-1]: filters starting with a wildcard do not match topic names starting with "$"."""
    with connect(broker.port(), client_id, V311) as sub, connect(broker.port(), client_id + "s", V311) as sys_sub:
        sub.subscribe(filt, 0)
        sys_sub.subscribe("$SYS/broker/uptime", 0)
        sys_sub.expect(timeout=3)          # a $SYS publication happened meanwhile
        sys_sub.expect(timeout=3)
        seen = []
        while True:
            try:
                seen.append(sub.expect(timeout=0.05).topic)
            except AssertionError:
                break
        assert not [t for t in seen if t.startswith("$")]


def test_dollar_topics_reachable_by_explicit_filter(broker, client_id):
    with connect(broker.port(), client_id, V311) as sub:
        sub.subscribe("$SYS/broker/+", 0)
        assert sub.expect(timeout=3).topic.startswith("$SYS/broker/")


def test_unsubscribe_stops_delivery(broker, client_id, topic):
    with connect(broker.port(), client_id, V5) as sub:
        sub.subscribe(topic, 1)
        assert [c.value for c in sub.unsubscribe(topic)] == [0x00]
        mosq_pub(broker.port(), topic, "after")
        sub.expect_none(0.3)
        # 5.0 3.11.3: No subscription existed
        assert [c.value for c in sub.unsubscribe(topic)] == [0x11]


def test_subscribe_replaces_existing_subscription_qos(broker, client_id, topic):
    """[MQTT-3.8.4-3]: a SUBSCRIBE with an existing filter replaces it (new QoS), no duplicate deliveries."""
    with connect(broker.port(), client_id, V311) as sub:
        sub.subscribe(topic, 0)
        sub.subscribe(topic, 1)
        mosq_pub(broker.port(), topic, "x", qos=1)
        assert sub.expect().qos == 1
        sub.expect_none(0.2)


# --------------------------------------------------------------------------- invalid filters

INVALID_FILTERS = ["a/#/b", "a+", "a/b+/c", "#a", "a/b#", "++", "$share/grp", "$share//x", "$share/g+/x"]


@pytest.mark.parametrize("filt", INVALID_FILTERS)
@pytest.mark.parametrize("version,failure", [(4, 0x80), (5, 0x8F)])
def test_invalid_filter_gets_suback_failure(broker, client_id, topic, filt, version, failure):
    """Invalid topic filters: SUBACK failure (3.1.1 0x80, 5.0 0x8F) for that filter only; the
    valid filter in the same SUBSCRIBE is granted and works. (Both are allowed by the spec; the
    reference Mosquitto closes the connection instead. brokerd answers per filter.)"""
    with RawClient(broker.port()) as c:
        c.connect(client_id, version=version)
        c.send(raw.subscribe_packet(3, [(topic, 1), (filt, 1)], version))
        ack = c.expect(raw.SUBACK)
        assert ack.codes == [1, failure]
        mosq_pub(broker.port(), topic, "ok", qos=1)
        assert c.expect(raw.PUBLISH).payload == b"ok"


def test_paho_v5_invalid_shared_filter(broker, client_id):
    with connect(broker.port(), client_id, V5) as sub:
        assert [c.value for c in sub.subscribe("$share/onlygroup", 0)] == [0x8F]


# --------------------------------------------------------------------------- invalid names

@pytest.mark.parametrize("name", ["a/+", "a/#", "+", "#", "a/b/#"])
@pytest.mark.parametrize("version", [4, 5])
def test_publish_to_wildcard_topic_closes_only_that_connection(broker, client_id, topic, name, version):
    """[MQTT-3.3.2-2]: a PUBLISH topic name must not contain wildcards -> the server closes the
    connection (5.0: DISCONNECT 0x90 Topic Name invalid first). Other clients are unaffected."""
    with connect(broker.port(), client_id + "ok", V311) as other:
        other.subscribe(topic, 1)
        with RawClient(broker.port()) as c:
            c.connect(client_id, version=version)
            c.publish(name, b"bad", qos=1, pid=1)
            got = c.expect_closed()
            if version == 5:
                assert [(p.type, p.code) for p in got] == [(raw.DISCONNECT, 0x90)]
            else:
                assert got == []
        other.publish(topic, b"still-here", qos=1)
        assert other.expect().payload == b"still-here"


@pytest.mark.parametrize("version", [4, 5])
def test_publish_with_empty_topic_closes_connection(broker, client_id, version):
    """[MQTT-4.7.3-1] topic names are at least one character; 5.0: empty name without a Topic Alias
    is a Protocol Error (0x82, or the more specific 0x90)."""
    with RawClient(broker.port()) as c:
        c.connect(client_id, version=version)
        c.publish("", b"x", qos=0)
        got = c.expect_closed()
        if version == 5:
            assert len(got) == 1 and got[0].type == raw.DISCONNECT and got[0].code in (0x82, 0x90)


def test_broker_alive_after_many_bad_publishers(broker, client_id, topic):
    for i in range(5):
        with RawClient(broker.port()) as c:
            c.connect(f"{client_id}-{i}", version=5)
            c.publish("bad/#", b"x")
            c.expect_closed()
    assert broker.proc.poll() is None
    with MosqSub(broker.port(), topic) as sub:
        mosq_pub(broker.port(), topic, "alive")
        assert sub.messages(1)[0]["payload"] == "alive"



# --------------------------------------------------------------------------- depth

def _deep(prefix: str, levels: int, fill: str = "l") -> str:
    """``prefix`` and as many ``fill`` levels as make ``levels`` levels in all."""
    return "/".join([prefix] + [fill] * (levels - 1 - prefix.count("/")))


@pytest.mark.parametrize("version,failure", [(4, 0x80), (5, 0x8F)])
def test_topic_levels_are_bounded_like_mosquitto(broker, client_id, topic, version, failure):
    """Names and filters of up to 201 levels work (Mosquitto 2.0.11's limit: 200 "/"); deeper
    filters get a SUBACK failure, deeper names of retained messages close the connection as an
    invalid topic name (5.0: DISCONNECT 0x90; Mosquitto closes for any deep name; a message that
    is not retained passes here, as any message of its length). Each level is a node of the subscription and
    retained trees: before, a 1 MiB SUBSCRIBE of 15 filters of 32,000 levels grew the node by
    ~120 MB and a retained message on a 32,000-level topic by ~7 MB, each granted (0x00 / PUBACK)."""
    ok_name = _deep(topic, 201)
    with RawClient(broker.port()) as c:
        c.connect(client_id, version=version)
        c.send(raw.subscribe_packet(1, [(_deep(topic, 201, "+"), 1), (_deep(topic, 202, "+"), 1),
                                        (_deep(topic, 32000, "+"), 1), ("$share/g/" + _deep(topic, 202), 1),
                                        (_deep(topic, 200) + "/#", 1), (_deep(topic, 201) + "/#", 1)], version))
        assert c.expect(raw.SUBACK).codes == [1, failure, failure, failure, 1, failure]
        with RawClient(broker.port()) as p:
            p.connect(client_id + "p", version=version)
            p.publish(ok_name, b"deep", qos=1, pid=1, retain=True)
            assert p.expect(raw.PUBACK).pid == 1
            m = c.expect(raw.PUBLISH)           # (matching two of its subscriptions: one copy)
            assert (m.topic, m.payload) == (ok_name, b"deep")
            p.publish(_deep(topic, 202), b"passing", qos=1, pid=3)     # not retained: it costs no tree node
            assert p.expect(raw.PUBACK).pid == 3
            assert c.expect(raw.PUBLISH).payload == b"passing"      # (its "/#" subscription of 201 levels)
            p.publish(_deep(topic, 202), b"deeper", qos=1, pid=2, retain=True)
            closed = p.expect_closed()
            assert [(q.type, q.code) for q in closed] == ([(raw.DISCONNECT, 0x90)] if version == 5 else [])
        with pytest.raises(TimeoutError):
            c.recv(0.3)
    mosq_pub(broker.port(), ok_name, None, retain=True)
