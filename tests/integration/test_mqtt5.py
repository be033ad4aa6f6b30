"""MQTT 5 features: topic aliases, message expiry, request/response, user properties, payload
format / content type, subscription identifiers, No Local, Maximum Packet Size, reason strings,
Request Problem / Response Information."""

import time

import pytest
from paho.mqtt.reasoncodes import ReasonCode

from ..procs import BrokerProcess
from . import raw
from .helpers import V5, V311, Client, MosqSub, PacketTypes, connect, mosq_pub, props, sub_opts
from .raw import DISCONNECT, PUBACK, PUBLISH, RawClient


def pprops(**kw):
    return props(PacketTypes.PUBLISH, **kw)


@pytest.fixture(scope="module")
def small_broker():
    """brokerd with --max-packet-size 1024, --topic-alias-maximum 2 and --response-information."""
    with BrokerProcess("--max-packet-size", "1024", "--topic-alias-maximum", "2",
                       "--response-information", "reply/") as b:
        yield b


# --------------------------------------------------------------------------- topic aliases

def test_topic_alias_client_to_server(broker, client_id, topic):
    """5.0 3.3.2.3.4: the client sets alias 1 -> topic, then publishes with an empty topic + alias."""
    with connect(broker.port(), client_id + "s", V311) as sub, connect(broker.port(), client_id, V5) as pub:
        assert pub.connack_props.TopicAliasMaximum == 64
        sub.subscribe(topic + "/#", 1)
        pub.publish(topic + "/long/name", b"1", qos=1, properties=pprops(TopicAlias=1))
        pub.publish("", b"2", qos=1, properties=pprops(TopicAlias=1))
        pub.publish(topic + "/other", b"3", qos=1, properties=pprops(TopicAlias=1))   # remap
        pub.publish("", b"4", qos=1, properties=pprops(TopicAlias=1))
        got = [(m.topic, m.payload) for m in sub.expect_n(4)]
        assert got == [(topic + "/long/name", b"1"), (topic + "/long/name", b"2"),
                       (topic + "/other", b"3"), (topic + "/other", b"4")]


@pytest.mark.parametrize("alias", [0, 3])
def test_topic_alias_out_of_range_disconnects_0x94(small_broker, client_id, topic, alias):
    """[MQTT-3.3.2-9/10]: alias 0 or above the server's Topic Alias Maximum (2) -> DISCONNECT 0x94."""
    with RawClient(small_broker.port()) as c:
        assert c.connect(client_id, version=5).props[raw.TOPIC_ALIAS_MAXIMUM] == 2
        c.publish(topic, b"x", props={raw.TOPIC_ALIAS: alias})
        got = c.expect_closed()
        assert [(p.type, p.code) for p in got] == [(DISCONNECT, 0x94)]


def test_unknown_topic_alias_is_protocol_error(broker, client_id):
    with RawClient(broker.port()) as c:
        c.connect(client_id, version=5)
        c.publish("", b"x", props={raw.TOPIC_ALIAS: 7})
        got = c.expect_closed()
        assert len(got) == 1 and got[0].type == DISCONNECT and got[0].code in (0x82, 0x94)


def test_topic_alias_server_to_client(broker, client_id, topic):
    """The server may use aliases up to the client's Topic Alias Maximum: the first PUBLISH of a
    topic carries name + alias, later ones may carry only the alias; every PUBLISH must resolve."""
    with RawClient(broker.port()) as c:
        c.connect(client_id, version=5, props={raw.TOPIC_ALIAS_MAXIMUM: 1})
        c.subscribe(topic + "/#", 1)
        for t in ("a", "a", "b", "a", "b"):
            mosq_pub(broker.port(), f"{topic}/{t}", t, version="mqttv5")
        aliases: dict[int, str] = {}
        resolved = []
        for _ in range(5):
            p = c.expect(PUBLISH)
            alias = p.props.get(raw.TOPIC_ALIAS)
            if alias is not None:
                assert 1 <= alias <= 1
                if p.topic:
                    aliases[alias] = p.topic
                else:
                    assert alias in aliases, "alias used before it was set"
            name = p.topic or aliases[alias]
            resolved.append((name, p.payload))
        assert resolved == [(f"{topic}/{t}", t.encode()) for t in ("a", "a", "b", "a", "b")]


def test_no_topic_alias_to_client_that_did_not_allow_them(broker, client_id, topic):
    with RawClient(broker.port()) as c:
        c.connect(client_id, version=5)
        c.subscribe(topic, 0)
        for _ in range(3):
            mosq_pub(broker.port(), topic, "x", version="mqttv5")
        for _ in range(3):
            p = c.expect(PUBLISH)
            assert p.topic == topic and raw.TOPIC_ALIAS not in p.props


def test_topic_alias_not_consumed_by_oversized_message(broker, client_id, topic):
    """5.0 3.3.2.3.4: an alias mapping is only set by a PUBLISH that carries the topic name; an empty
    name with an alias the receiver never saw is a Protocol Error for it. A client with Topic Alias
    Maximum 5 and Maximum Packet Size 200: the first message on the topic is too large and not sent;
    the next one must carry the topic name. (Regression: found by this suite, fixed in 7882229.)"""
    with RawClient(broker.port()) as c:
        c.connect(client_id, version=5, props={raw.TOPIC_ALIAS_MAXIMUM: 5, raw.MAXIMUM_PACKET_SIZE: 200})
        c.subscribe(topic, 1)
        mosq_pub(broker.port(), topic, "x" * 500, version="mqttv5")
        mosq_pub(broker.port(), topic, "small", version="mqttv5")
        p = c.expect(PUBLISH)
        assert p.payload == b"small"
        assert p.topic == topic


# --------------------------------------------------------------------------- message expiry

def test_expired_queued_message_not_delivered(broker, client_id, topic):
    """5.0 3.3.2.3.3: a queued message whose expiry interval passed is not delivered; a live one is,
    with the interval reduced by the time it waited."""
    session = props(PacketTypes.CONNECT, SessionExpiryInterval=60)
    sub = connect(broker.port(), client_id, V5, clean=True, properties=session)
    sub.subscribe(topic, 1)
    sub.disconnect()
    with connect(broker.port(), client_id + "p", V5) as pub:
        pub.publish(topic, b"short", qos=1, properties=pprops(MessageExpiryInterval=1))
        pub.publish(topic, b"long", qos=1, properties=pprops(MessageExpiryInterval=60))
        pub.publish(topic, b"forever", qos=1)
    time.sleep(2.1)
    sub = connect(broker.port(), client_id, V5, clean=False, properties=session)
    a, b = sub.expect_n(2)
    assert (a.payload, b.payload) == (b"long", b"forever")
    assert 55 <= a.properties.MessageExpiryInterval <= 58
    assert not hasattr(b.properties, "MessageExpiryInterval")
    sub.expect_none(0.2)
    sub.disconnect()
    connect(broker.port(), client_id, V5).disconnect()


def test_message_expiry_forwarded_live(broker, client_id, topic):
    with connect(broker.port(), client_id, V5) as sub, connect(broker.port(), client_id + "p", V5) as pub:
        sub.subscribe(topic, 0)
        pub.publish(topic, b"x", properties=pprops(MessageExpiryInterval=30))
        assert 29 <= sub.expect().properties.MessageExpiryInterval <= 30


def test_message_expiry_with_mosquitto_clients(broker, client_id, topic):
    """mosquitto_pub -D publish message-expiry-interval 1 to an offline mosquitto_sub -c session."""
    MosqSub(broker.port(), topic, version="mqttv5", qos=1, client_id=client_id, args=["-c", "-x", "60"]).start().stop()
    mosq_pub(broker.port(), topic, "dies", "-D", "publish", "message-expiry-interval", "1", version="mqttv5", qos=1)
    mosq_pub(broker.port(), topic, "lives", "-D", "publish", "message-expiry-interval", "100", version="mqttv5", qos=1)
    time.sleep(2.1)
    sub = MosqSub(broker.port(), topic, version="mqttv5", qos=1, client_id=client_id, args=["-c", "-x", "0"],
                  fmt="%p %E", count=1, wait=5).start(expect_suback=False)
    payload, expiry = sub.messages(1)[0].split()
    assert payload == "lives" and 95 <= int(expiry) <= 98
    assert sub.wait() == 0


# --------------------------------------------------------------------------- properties passed through

def test_request_response_properties(broker, client_id, topic):
    """Response Topic and Correlation Data reach the responder, which answers on the response topic."""
    with connect(broker.port(), client_id + "r", V5) as responder, connect(broker.port(), client_id, V5) as req:
        responder.subscribe(topic + "/req", 1)
        req.subscribe(topic + "/resp/" + client_id, 1)
        req.publish(topic + "/req", b"ping", qos=1,
                    properties=pprops(ResponseTopic=topic + "/resp/" + client_id, CorrelationData=b"\x00id-42"))
        m = responder.expect()
        assert m.properties.ResponseTopic == topic + "/resp/" + client_id
        assert m.properties.CorrelationData == b"\x00id-42"
        responder.publish(m.properties.ResponseTopic, b"pong", qos=1,
                          properties=pprops(CorrelationData=m.properties.CorrelationData))
        r = req.expect()
        assert (r.payload, r.properties.CorrelationData) == (b"pong", b"\x00id-42")


@pytest.mark.parametrize("bad", [{raw.RESPONSE_TOPIC: "reply/#"}, {raw.RESPONSE_TOPIC: "reply/+/x"},
                                 {raw.PAYLOAD_FORMAT_INDICATOR: 2}])
def test_response_topic_wildcard_or_payload_format_above_1_is_a_protocol_error(broker, client_id, topic, bad):
    """[MQTT-3.3.2-14]: a Response Topic has no wildcard; 3.3.2.3.2: a Payload Format Indicator is
    0 or 1. The properties are forwarded as received, so the server would send them on: a PUBLISH
    carrying one is a Protocol Error (DISCONNECT 0x82, nothing forwarded), and a will carrying one
    is refused (CONNACK 0x82) -- as Mosquitto and EMQX do. (Before: forwarded to subscribers.)"""
    with RawClient(broker.port()) as sub, RawClient(broker.port()) as pub:
        sub.connect(client_id + "s", version=5)
        sub.subscribe(topic + "/#", 1)
        pub.connect(client_id, version=5)
        pub.publish(topic + "/req", b"x", qos=1, pid=1, props=bad)
        assert [(p.type, p.code) for p in pub.expect_closed()] == [(DISCONNECT, 0x82)]
        with RawClient(broker.port()) as w:
            ack = w.connect(client_id + "w", version=5, will=(topic + "/will", b"w", 1, False, bad))
            assert ack.code == 0x82
        with pytest.raises(TimeoutError):
            sub.expect(PUBLISH, timeout=0.3)
        # the canary: a valid Response Topic and Payload Format Indicator still go through
        with RawClient(broker.port()) as ok:
            ok.connect(client_id + "ok", version=5)
            ok.publish(topic + "/req", b"y", qos=1, pid=2,
                       props={raw.RESPONSE_TOPIC: topic + "/reply", raw.PAYLOAD_FORMAT_INDICATOR: 1})
            assert ok.expect(PUBACK).code == 0
        m = sub.expect(PUBLISH)
        assert m.payload == b"y" and m.props[raw.RESPONSE_TOPIC] == topic + "/reply"


def test_user_properties_order_and_duplicates_kept(broker, client_id, topic):
    """[MQTT-3.3.2-17/18]: user properties are forwarded unaltered, in order, duplicates included."""
    up = [("a", "1"), ("b", "2"), ("a", "3"), ("ключ", "значение")]
    with connect(broker.port(), client_id, V5) as sub, connect(broker.port(), client_id + "p", V5) as pub:
        sub.subscribe(topic, 1)
        pub.publish(topic, b"x", qos=1, properties=pprops(UserProperty=up))
        assert sub.expect().properties.UserProperty == up


def test_properties_from_mosquitto_pub(broker, client_id, topic):
    with connect(broker.port(), client_id, V5) as sub:
        sub.subscribe(topic, 1)
        mosq_pub(broker.port(), topic, "{}", "-D", "publish", "content-type", "application/json",
                 "-D", "publish", "payload-format-indicator", "1", "-D", "publish", "user-property", "k", "v",
                 "-D", "publish", "response-topic", topic + "/r", "-D", "publish", "correlation-data", "c1",
                 version="mqttv5", qos=1)
        p = sub.expect().properties
        assert (p.ContentType, p.PayloadFormatIndicator, p.UserProperty, p.ResponseTopic, p.CorrelationData) == \
            ("application/json", 1, [("k", "v")], topic + "/r", b"c1")


def test_properties_to_mosquitto_sub(broker, topic):
    with MosqSub(broker.port(), topic, version="mqttv5", fmt="%C|%F|%P|%R|%D|%p") as sub:
        with connect(broker.port(), "mq5-props-" + topic[-20:], V5) as pub:
            pub.publish(topic, b"body", qos=1, properties=pprops(
                ContentType="text/plain", PayloadFormatIndicator=1, UserProperty=[("x", "y")],
                ResponseTopic="r/t", CorrelationData=b"cd"))
        assert sub.messages(1)[0] == "text/plain|1|x:y|r/t|cd|body"


def test_properties_not_added_for_v311_subscriber(broker, client_id, topic):
    """A v5 message with properties reaches a 3.1.1 subscriber as a plain 3.1.1 PUBLISH."""
    with RawClient(broker.port()) as c:
        c.connect(client_id, version=4)
        c.subscribe(topic, 1)
        with connect(broker.port(), client_id + "p", V5) as pub:
            pub.publish(topic, b"plain", qos=1, properties=pprops(UserProperty=[("k", "v")], ContentType="x"))
        p = c.expect(PUBLISH)
        assert (p.topic, p.payload) == (topic, b"plain")


def test_invalid_utf8_with_payload_format_indicator_refused(broker, client_id, topic):
    """5.0 3.3.2.3.2: the server may check a payload marked UTF-8; if it does, PUBACK 0x99 and the
    message is not forwarded."""
    with connect(broker.port(), client_id + "s", V5) as sub, connect(broker.port(), client_id, V5) as pub:
        sub.subscribe(topic, 1)
        info = pub.publish(topic, b"\xff\xfe", qos=1, properties=pprops(PayloadFormatIndicator=1), wait=False)
        rc, p = pub.publish_result(info)
        assert rc.value == 0x99
        sub.expect_none(0.3)
        info = pub.publish(topic, "fine ✓".encode(), qos=1, properties=pprops(PayloadFormatIndicator=1), wait=False)
        assert pub.publish_result(info)[0].value == 0
        assert sub.expect().payload == "fine ✓".encode()


@pytest.mark.parametrize("qos", [1, 2])
def test_ack_of_a_payload_not_utf8_keeps_its_place_behind_acks_waiting_for_the_store(broker_factory, tmp_path,
                                                                                       client_id, topic, qos):
    """[MQTT-4.6.0-2/3]: PUBACKs (PUBRECs) go in the order of the PUBLISHes. With a store, the ack of
    a message for a stored session waits for the commit; the 0x99 of a PUBLISH behind it (Payload
    Format Indicator 1, payload not UTF-8) went at once, ahead of it: acks 2, 1, 3 for PUBLISHes 1, 2, 3."""
    b = broker_factory("--store", f"sqlite:///{tmp_path}/b.sqlite3")
    kind = PUBACK if qos == 1 else raw.PUBREC
    with RawClient(b.port()) as sub, RawClient(b.port()) as pub:
        sub.connect(client_id + "s", version=5, clean=True, props={raw.SESSION_EXPIRY_INTERVAL: 60})
        sub.subscribe(topic, 1)
        pub.connect(client_id, version=5)
        pub.send(raw.publish_packet(topic, b"1", qos, pid=1, version=5)
                 + raw.publish_packet(topic, b"\xff", qos, pid=2, version=5, props={raw.PAYLOAD_FORMAT_INDICATOR: 1})
                 + raw.publish_packet(topic, b"3", qos, pid=3, version=5))
        acks = [pub.expect(kind) for _ in range(3)]
        assert [(a.pid, a.code) for a in acks] == [(1, 0), (2, 0x99), (3, 0)]
        assert acks[1].props.get(raw.REASON_STRING) == "payload is not valid UTF-8"
        assert sorted(sub.expect(PUBLISH).payload for _ in range(2)) == [b"1", b"3"]


def test_no_matching_subscribers_reason_code(broker, client_id, topic):
    """5.0 3.4.2.1: PUBACK 0x10 No matching subscribers."""
    with connect(broker.port(), client_id, V5) as pub:
        info = pub.publish(topic + "/nobody", b"x", qos=1, wait=False)
        assert pub.publish_result(info)[0].value == 0x10


# --------------------------------------------------------------------------- reason strings / problem info

def test_reason_string_on_server_disconnect(broker, client_id):
    with RawClient(broker.port()) as c:
        c.connect(client_id, version=5)
        c.publish("bad/+", b"x")
        (d,) = c.expect_closed()
        assert d.code == 0x90 and d.props.get(raw.REASON_STRING)


@pytest.mark.parametrize("request_problem_info,has_reason", [(None, True), (1, True), (0, False)])
def test_request_problem_information(broker, client_id, topic, request_problem_info, has_reason):
    """5.0 3.1.2.11.7: with Request Problem Information 0 the server sends no Reason String on
    packets other than PUBLISH, CONNACK and DISCONNECT (here: PUBACK 0x99)."""
    cprops = {} if request_problem_info is None else {raw.REQUEST_PROBLEM_INFORMATION: request_problem_info}
    with RawClient(broker.port()) as c:
        c.connect(client_id, version=5, props=cprops)
        c.publish(topic, b"\xff", qos=1, pid=3, props={raw.PAYLOAD_FORMAT_INDICATOR: 1})
        ack = c.expect(PUBACK)
        assert ack.code == 0x99
        assert (raw.REASON_STRING in ack.props) == has_reason


@pytest.mark.parametrize("asked", [True, False])
def test_request_response_information(small_broker, client_id, asked):
    """5.0 3.1.2.11.6 / 3.2.2.3.15: Response Information only when the client asks for it."""
    cp = props(PacketTypes.CONNECT, RequestResponseInformation=1) if asked else None
    c = connect(small_broker.port(), client_id, V5, properties=cp)
    info = getattr(c.connack_props, "ResponseInformation", None)
    assert info == (f"reply/{client_id}" if asked else None)
    c.disconnect()


def test_no_response_information_without_configuration(broker, client_id):
    c = connect(broker.port(), client_id, V5, properties=props(PacketTypes.CONNECT, RequestResponseInformation=1))
    assert not hasattr(c.connack_props, "ResponseInformation")
    c.disconnect()


# --------------------------------------------------------------------------- subscription identifiers

def test_subscription_identifiers(broker, client_id, topic):
    """5.0 3.3.4: a message carries the identifiers of every matching subscription."""
    with connect(broker.port(), client_id, V5) as sub:
        sub.subscribe(topic + "/+", 1, properties=props(PacketTypes.SUBSCRIBE, SubscriptionIdentifier=5))
        sub.subscribe(topic + "/#", 1, properties=props(PacketTypes.SUBSCRIBE, SubscriptionIdentifier=700))
        sub.subscribe(topic + "/x/y", 1)
        mosq_pub(broker.port(), topic + "/a", "both", qos=1)
        mosq_pub(broker.port(), topic + "/x/y", "deep", qos=1)
        got = {}
        for m in sub.expect_n(2, timeout=3):
            got.setdefault(m.payload, set()).update(getattr(m.properties, "SubscriptionIdentifier", []))
        try:    # a server may also send one copy per matching subscription
            while True:
                m = sub.expect(timeout=0.2)
                got.setdefault(m.payload, set()).update(getattr(m.properties, "SubscriptionIdentifier", []))
        except AssertionError:
            pass
        assert got == {b"both": {5, 700}, b"deep": {700}}


def test_subscription_identifier_on_retained_and_with_mosquitto_sub(broker, topic):
    mosq_pub(broker.port(), topic, "kept", retain=True)
    sub = MosqSub(broker.port(), topic, version="mqttv5", fmt="%S %p", count=1, wait=5,
                  args=["-D", "subscribe", "subscription-identifier", "42"]).start(expect_suback=False)
    assert sub.messages(1) == ["42 kept"]
    mosq_pub(broker.port(), topic, None, retain=True)


def test_subscription_identifier_zero_is_protocol_error(broker, client_id, topic):
    with RawClient(broker.port()) as c:
        c.connect(client_id, version=5)
        c.send(raw.subscribe_packet(1, [(topic, 0)], 5, {raw.SUBSCRIPTION_IDENTIFIER: 0}))
        got = c.expect_closed()
        assert [(p.type, p.code) for p in got] == [(DISCONNECT, 0x82)]


# --------------------------------------------------------------------------- No Local

def test_no_local(broker, client_id, topic):
    """5.0 3.8.3.1: No Local = the server does not send a client its own messages."""
    with connect(broker.port(), client_id, V5) as me, connect(broker.port(), client_id + "o", V5) as other:
        me.subscribe(topic, options=sub_opts(1, no_local=True))
        me.publish(topic, b"mine", qos=1)
        other.publish(topic, b"theirs", qos=1)
        assert me.expect().payload == b"theirs"
        me.expect_none(0.2)


def test_no_local_off_by_default(broker, client_id, topic):
    with connect(broker.port(), client_id, V5) as me:
        me.subscribe(topic, 1)
        me.publish(topic, b"echo", qos=1)
        assert me.expect().payload == b"echo"


def test_no_local_on_shared_subscription_is_protocol_error(broker, client_id, topic):
    """[MQTT-3.8.3-4]: No Local on a shared subscription is a Protocol Error."""
    with RawClient(broker.port()) as c:
        c.connect(client_id, version=5)
        c.send(raw.subscribe_packet(1, [(f"$share/g/{topic}", 0x04 | 1)], 5))
        got = c.expect_closed()
        assert [(p.type, p.code) for p in got] == [(DISCONNECT, 0x82)]


# --------------------------------------------------------------------------- Maximum Packet Size

def test_server_maximum_packet_size_advertised_and_enforced_v5(small_broker, client_id, topic):
    """5.0 3.2.2.3.6 / [MQTT-3.1.2-24]: CONNACK carries Maximum Packet Size 1024; a larger PUBLISH
    gets DISCONNECT 0x95."""
    with connect(small_broker.port(), client_id + "s", V311) as watcher:
        watcher.subscribe(topic, 1)
        c = connect(small_broker.port(), client_id, V5)
        assert c.connack_props.MaximumPacketSize == 1024
        c.publish(topic, b"x" * 900, qos=0)
        assert watcher.expect().payload == b"x" * 900
        c.publish(topic, b"x" * 2000, qos=0, wait=False)
        rc, _ = c.expect_disconnect()
        assert rc.value == 0x95
        c.stop_loop()
        watcher.expect_none(0.2)


def test_server_maximum_packet_size_enforced_v311(small_broker, client_id, topic):
    c = connect(small_broker.port(), client_id, V311)
    c.publish(topic, b"x" * 2000, qos=1, wait=False)
    c.expect_disconnect()
    c.stop_loop()
    assert small_broker.proc.poll() is None


@pytest.mark.parametrize("qos", [0, 1])
def test_client_maximum_packet_size_respected(broker, client_id, topic, qos):
    """[MQTT-3.1.2-25]: the server must not send a packet larger than the client's Maximum Packet
    Size; such a message is dropped for that client only, and does not block later ones."""
    with connect(broker.port(), client_id, V5, properties=props(PacketTypes.CONNECT, MaximumPacketSize=256)) as small, \
            connect(broker.port(), client_id + "big", V5) as big, \
            connect(broker.port(), client_id + "p", V5) as pub:
        small.subscribe(topic, qos)
        big.subscribe(topic, qos)
        pub.publish(topic, b"L" * 1000, qos=qos)
        pub.publish(topic, b"small", qos=qos)
        assert small.expect().payload == b"small"
        small.expect_none(0.2)
        assert [m.payload for m in big.expect_n(2)] == [b"L" * 1000, b"small"]


def test_client_maximum_packet_size_with_mosquitto_sub(broker, topic):
    with MosqSub(broker.port(), topic, version="mqttv5", args=["-D", "connect", "maximum-packet-size", "100"]) as sub:
        mosq_pub(broker.port(), topic, "y" * 300, version="mqttv5")
        mosq_pub(broker.port(), topic, "tiny", version="mqttv5")
        assert [m["payload"] for m in sub.messages(1)] == ["tiny"]
        sub.none(0.2)


# --------------------------------------------------------------------------- misc server reason codes

def test_server_disconnect_reason_is_visible_to_paho(broker, client_id, topic):
    """paho reports the server's DISCONNECT reason (0x8E) to the application."""
    a = connect(broker.port(), client_id, V5)
    b = connect(broker.port(), client_id, V5)
    rc, _ = a.expect_disconnect()
    assert rc == ReasonCode(PacketTypes.DISCONNECT, identifier=0x8E)
    a.stop_loop()
    b.disconnect()


def test_v5_connack_properties_describe_server(broker, client_id):
    c = Client(client_id, V5).connect(broker.port())
    p = c.connack_props
    assert p.ReceiveMaximum == 32
    assert p.TopicAliasMaximum == 64
    assert p.MaximumPacketSize == 1048576
    c.disconnect()


def test_enhanced_authentication_not_supported(broker, client_id):
    """5.0 4.12: a CONNECT with an Authentication Method the server does not support gets CONNACK
    0x8C Bad authentication method."""
    with RawClient(broker.port()) as c:
        c.send(raw.connect_packet(client_id, version=5, props={0x15: "SCRAM-SHA-1"}))
        ack = c.expect(raw.CONNACK)
        assert ack.code == 0x8C
        c.expect_closed()


def test_pubrel_for_unknown_packet_id(broker, client_id):
    """5.0 3.7.2.1: PUBREL for a packet id the server does not know -> PUBCOMP 0x92."""
    with RawClient(broker.port()) as c:
        c.connect(client_id, version=5)
        c.ack(raw.PUBREL, 77)
        comp = c.expect(raw.PUBCOMP)
        assert (comp.pid, comp.code) == (77, 0x92)
        assert c.is_open()


def test_pubrel_for_an_unknown_pubrec_keeps_its_place_behind_pubrels_waiting_for_the_store(
        broker_factory, tmp_path, client_id, topic):
    """[MQTT-4.6.0-4]: PUBRELs go in the order of the PUBRECs. With a store, the PUBREL of a stored
    QoS 2 delivery waits for the commit of its new state; the PUBREL 0x92 answering a PUBREC for an
    unknown packet id behind it went at once, ahead of it (PUBRECs 1, 101 answered 101, 1)."""
    b = broker_factory("--store", f"sqlite:///{tmp_path}/b.sqlite3")
    with RawClient(b.port()) as sub, RawClient(b.port()) as pub:
        sub.connect(client_id + "s", version=5, props={raw.SESSION_EXPIRY_INTERVAL: 60})
        sub.subscribe(topic, 2)
        pub.connect(client_id, version=5)
        pub.publish(topic, b"x", qos=2, pid=1)
        m = sub.expect(PUBLISH)
        sub.send(raw.ack_packet(raw.PUBREC, m.pid, 5) + raw.ack_packet(raw.PUBREC, m.pid + 100, 5))
        rels = [sub.expect(raw.PUBREL) for _ in range(2)]
        assert [(r.pid, r.code) for r in rels] == [(m.pid, 0), (m.pid + 100, 0x92)]


def test_topic_alias_does_not_survive_reconnect(broker, client_id, topic):
    """[MQTT-3.3.2-7]: topic alias mappings belong to one network connection."""
    with RawClient(broker.port()) as c:
        c.connect(client_id, version=5)
        c.publish(topic, b"x", props={raw.TOPIC_ALIAS: 1})
        assert c.is_open(0.2)
    with RawClient(broker.port()) as c:
        c.connect(client_id, version=5)
        c.publish("", b"y", props={raw.TOPIC_ALIAS: 1})
        got = c.expect_closed()
        assert len(got) == 1 and got[0].type == DISCONNECT and got[0].code in (0x82, 0x94)


def test_resubscribe_replaces_subscription_identifier(broker, client_id, topic):
    """[MQTT-3.8.4-3]: a repeated SUBSCRIBE replaces the subscription, identifier included."""
    with connect(broker.port(), client_id, V5) as sub:
        sub.subscribe(topic, 1, properties=props(PacketTypes.SUBSCRIBE, SubscriptionIdentifier=9))
        sub.subscribe(topic, 1, properties=props(PacketTypes.SUBSCRIBE, SubscriptionIdentifier=10))
        mosq_pub(broker.port(), topic, "a", qos=1)
        assert sub.expect().properties.SubscriptionIdentifier == [10]
        sub.subscribe(topic, 1)
        mosq_pub(broker.port(), topic, "b", qos=1)
        assert not hasattr(sub.expect().properties, "SubscriptionIdentifier")


def test_suback_above_the_clients_maximum_packet_size(broker, client_id, topic):
    """[MQTT-3.1.2-24]: a SUBACK is never larger than the client's Maximum Packet Size. A SUBSCRIBE
    of 100 filters from a client that takes packets of 64 bytes at most cannot be answered (the
    SUBACK holds a reason code per filter, none may be left out): DISCONNECT 0x95 (Packet too
    large), and none of the filters subscribed -- not a 106-byte SUBACK, nor silence."""
    filters = [f"{topic}/{i}" for i in range(100)]
    small = {raw.MAXIMUM_PACKET_SIZE: 64, raw.SESSION_EXPIRY_INTERVAL: 60}
    with RawClient(broker.port()) as c:
        c.connect(client_id, version=5, props=small)
        c.send(raw.subscribe_packet(1, [(f, 1) for f in filters], 5))
        got = c.expect_closed()
        assert [(p.type, p.code) for p in got] == [(DISCONNECT, 0x95)]
        assert all(2 + len(p.body) <= 64 for p in got)
    with RawClient(broker.port()) as pub, RawClient(broker.port()) as c:
        assert c.connect(client_id, version=5, clean=False, props=small).session_present
        pub.connect(client_id + "p", version=5)
        pub.publish(filters[99], b"not subscribed")
        # a SUBACK that fits is sent: 59 filters, 64 bytes
        c.send(raw.subscribe_packet(2, [(f, 1) for f in filters[:59]], 5))
        ack = c.expect(raw.SUBACK)
        assert ack.codes == [1] * 59
        pub.publish(filters[0], b"subscribed")
        assert c.expect(PUBLISH).payload == b"subscribed"


def test_unsuback_above_the_clients_maximum_packet_size(broker, client_id, topic):
    """[MQTT-3.1.2-24], as for the SUBACK above: an UNSUBACK holds a reason code per filter too. An
    UNSUBSCRIBE of 100 filters from a client that takes packets of 64 bytes at most got a 105-byte
    UNSUBACK; now DISCONNECT 0x95 and none of the filters unsubscribed. One that fits is answered."""
    filters = [f"{topic}/{i}" for i in range(100)]
    small = {raw.MAXIMUM_PACKET_SIZE: 64, raw.SESSION_EXPIRY_INTERVAL: 60}
    unsubscribe = raw.UNSUBSCRIBE << 4 | 2
    with RawClient(broker.port()) as c:
        c.connect(client_id, version=5, props=small)
        for i in range(0, 100, 50):
            c.send(raw.subscribe_packet(i + 1, [(f, 1) for f in filters[i:i + 50]], 5))
            assert c.expect(raw.SUBACK).codes == [1] * 50
        c.send(raw.packet(unsubscribe, b"\x00\x07\x00" + b"".join(raw.s(f) for f in filters)))
        got = c.expect_closed()
        assert [(p.type, p.code) for p in got] == [(DISCONNECT, 0x95)]
        assert all(2 + len(p.body) <= 64 for p in got)
    with RawClient(broker.port()) as pub, RawClient(broker.port()) as c:
        assert c.connect(client_id, version=5, clean=False, props=small).session_present
        pub.connect(client_id + "p", version=5)
        pub.publish(filters[99], b"kept")  # (small: the client takes 64 bytes)
        assert c.expect(PUBLISH).payload == b"kept"
        # an UNSUBACK that fits is sent: 59 filters, 64 bytes
        c.send(raw.packet(unsubscribe, b"\x00\x08\x00" + b"".join(raw.s(f) for f in filters[:59])))
        ack = c.expect(raw.UNSUBACK)
        assert ack.codes == [0] * 59 and 2 + len(ack.body) == 64
