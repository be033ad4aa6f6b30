"""MQTT 5 features through Channel + Broker: topic aliases, maximum packet size, message
expiry, subscription options, subscription identifiers, problem information, DISCONNECT."""

import pytest

from brokerd.protocol import properties as P
from brokerd.protocol.channel import ChannelLimits
from brokerd.protocol.packets import Disconnect, Puback, Publish, Subscribe, SubscriptionRequest

from .harness import MQTT5, MQTT311, Net, UnknownAlias


def v5(net, cid, **kw):
    c = net.client(MQTT5)
    c.connect(cid, **kw)
    return c


# ----------------------------------------------------------------------------- inbound topic aliases


def test_inbound_topic_alias_set_and_use(net):
    sub = v5(net, "sub")
    sub.subscribe("#")
    pub = v5(net, "pub")
    pub.publish("a/long/topic", b"1", properties={P.TOPIC_ALIAS: 3})
    pub.publish("", b"2", properties={P.TOPIC_ALIAS: 3})
    pub.publish("other", b"3", properties={P.TOPIC_ALIAS: 3})  # re-map
    pub.publish("", b"4", qos=1, properties={P.TOPIC_ALIAS: 3})
    got = [(p.topic, p.payload) for p in sub.publishes()]
    assert got == [("a/long/topic", b"1"), ("a/long/topic", b"2"), ("other", b"3"), ("other", b"4")]
    # the alias is a hop-by-hop property: never forwarded
    assert all(P.TOPIC_ALIAS not in (p.properties or {}) for p in sub.history if p.type == 3)


@pytest.mark.parametrize("alias", [0, 65, 65535])
def test_inbound_topic_alias_out_of_range(net, alias):
    pub = v5(net, "pub")  # server Topic Alias Maximum is 64
    pub.publish("t", b"x", properties={P.TOPIC_ALIAS: alias})
    assert pub.server_disconnect().reason_code == 0x94
    assert pub.closed


def test_inbound_topic_alias_when_server_allows_none():
    net = Net(ChannelLimits(topic_alias_maximum=0))
    pub = v5(net, "pub")
    assert P.TOPIC_ALIAS_MAXIMUM not in (pub.history[0].properties or {})  # the CONNACK
    pub.publish("t", b"x", properties={P.TOPIC_ALIAS: 1})
    assert pub.server_disconnect().reason_code == 0x94


def test_inbound_unknown_topic_alias(net):
    pub = v5(net, "pub")
    pub.publish("", b"x", properties={P.TOPIC_ALIAS: 5})
    assert pub.server_disconnect().reason_code == 0x82
    assert pub.closed


def test_inbound_topic_aliases_do_not_survive_the_connection(net):
    pub = v5(net, "pub", clean=False, properties={P.SESSION_EXPIRY_INTERVAL: 60})
    pub.publish("t", b"x", properties={P.TOPIC_ALIAS: 1})
    pub.disconnect()
    again = v5(net, "pub", clean=False, properties={P.SESSION_EXPIRY_INTERVAL: 60})
    again.publish("", b"x", properties={P.TOPIC_ALIAS: 1})
    assert again.server_disconnect().reason_code == 0x82  # 5.0 3.3.2.3.4: aliases are per connection


# ----------------------------------------------------------------------------- outbound topic aliases


def test_outbound_topic_aliases_used_up_to_client_maximum(net):
    sub = v5(net, "sub", properties={P.TOPIC_ALIAS_MAXIMUM: 2})
    sub.subscribe("#", qos=1)
    pub = net.connect("pub")
    for round_ in range(3):
        for t in ("aaa", "bbb", "ccc"):
            pub.publish(t, b"%d" % round_)
    got = sub.publishes()  # the harness resolves aliases, failing on unknown ones
    assert [(p.topic, p.payload) for p in got] == [
        (t, b"%d" % r) for r in range(3) for t in ("aaa", "bbb", "ccc")
    ]
    aliases = [(p.properties or {}).get(P.TOPIC_ALIAS) for p in got]
    assert set(aliases) - {None} <= {1, 2}
    # after the first round the two aliased topics go out with an empty topic name
    raw = [p for p in sub.history if p.type == 3]
    assert sum(1 for p in raw if (p.properties or {}).get(P.TOPIC_ALIAS)) >= 6
    assert len(sub.aliases) == 2


def test_no_outbound_aliases_without_client_topic_alias_maximum(net):
    sub = v5(net, "sub")
    sub.subscribe("#", qos=1)
    pub = net.connect("pub")
    for _ in range(3):
        pub.publish("t", b"x", qos=1)
    for p in sub.publishes():
        assert p.topic == "t"
        assert P.TOPIC_ALIAS not in (p.properties or {})  # [MQTT-3.3.2-7] with Topic Alias Maximum 0


def test_outbound_alias_not_used_if_its_first_publish_was_dropped(net):
    """5.0 3.3.2.3.4: the sender may only use an alias with an empty topic once it has sent the mapping.
    A PUBLISH too large for the client is discarded [MQTT-3.1.2-25], so its mapping never arrived."""
    sub = v5(net, "sub", properties={P.TOPIC_ALIAS_MAXIMUM: 5, P.MAXIMUM_PACKET_SIZE: 100})
    sub.subscribe("big/topic", qos=1)
    pub = net.connect("pub")
    pub.publish("big/topic", b"x" * 200, qos=1)  # dropped: too large for the client
    pub.publish("big/topic", b"small", qos=1)
    [p] = sub.publishes()  # UnknownAlias raised here
    assert (p.topic, p.payload) == ("big/topic", b"small")


def test_outbound_aliases_reset_on_new_connection(net):
    props = {P.TOPIC_ALIAS_MAXIMUM: 5, P.SESSION_EXPIRY_INTERVAL: 60}
    sub = v5(net, "sub", properties=props)
    sub.subscribe("t", qos=1)
    pub = net.connect("pub")
    pub.publish("t", b"1")
    assert sub.publishes()[0].topic == "t"
    sub.disconnect()
    again = v5(net, "sub", clean=False, properties=props)
    pub.publish("t", b"2")
    [p] = again.publishes()
    assert p.topic == "t"  # sent in full again: the new connection has no aliases yet


def test_unknown_alias_detector_works():
    from brokerd.protocol.codec import encode

    net = Net()
    c = v5(net, "x")
    c.channel.out.append(encode(Publish("", b"", properties={P.TOPIC_ALIAS: 9}), MQTT5))
    with pytest.raises(UnknownAlias):
        c.recv()


# ----------------------------------------------------------------------------- client Maximum Packet Size


def test_deliveries_larger_than_client_maximum_packet_size_are_dropped(net):
    sub = v5(net, "sub", properties={P.MAXIMUM_PACKET_SIZE: 64, P.RECEIVE_MAXIMUM: 1})
    sub.subscribe("t", qos=1)
    pub = net.connect("pub")
    # QoS 1 PUBLISH to "t" from the server: 2 header + 2+1 topic + 2 pid + 1 props = 8 bytes + payload
    pub.publish("t", b"a" * 56, qos=1)  # exactly 64 bytes: fits
    pub.publish("t", b"b" * 57, qos=1)  # 65 bytes: dropped, as if it had been sent [MQTT-3.1.2-25]
    pub.publish("t", b"c" * 10, qos=0)
    got = sub.publishes()
    assert [len(p.payload) for p in got] == [56]
    sub.send(Puback(got[0].packet_id))
    # the dropped QoS 1 message took no slot of the window of 1
    assert [p.payload for p in sub.publishes()] == [b"c" * 10]
    assert net.stats.dropped_too_large == 1


def test_a_delivery_that_fits_without_a_new_topic_alias_is_sent_without_it(net):
    """[MQTT-3.1.2-25] drops a PUBLISH too large for the client's Maximum Packet Size. One that
    fits is not too large because the server would have added a Topic Alias to it (3 bytes): it
    goes without the alias (none is set up), and the next one that fits with it gets it."""
    sub = v5(net, "sub", properties={P.MAXIMUM_PACKET_SIZE: 64, P.TOPIC_ALIAS_MAXIMUM: 5})
    sub.subscribe("t", qos=1)
    pub = net.connect("pub")
    pub.publish("t", b"a" * 56, qos=1)  # 64 bytes without a Topic Alias, 67 with one
    pub.publish("t", b"b" * 10, qos=1)
    pub.publish("t", b"c" * 10, qos=1)
    got = sub.publishes()
    assert [(p.payload[:1], len(p.payload)) for p in got] == [(b"a", 56), (b"b", 10), (b"c", 10)]
    assert [(p.properties or {}).get(P.TOPIC_ALIAS) for p in got] == [None, 1, 1]
    assert [p.topic for p in got] == ["t", "t", "t"]    # (the harness resolved the last one's alias)
    assert net.stats.dropped_too_large == 0


def test_maximum_packet_size_applies_to_retained_on_subscribe(net):
    pub = net.connect("pub")
    pub.publish("r/big", b"x" * 500, retain=True)
    pub.publish("r/small", b"y", retain=True)
    sub = v5(net, "sub", properties={P.MAXIMUM_PACKET_SIZE: 100})
    sub.subscribe("r/#")
    assert [p.topic for p in sub.publishes()] == ["r/small"]


def test_server_disconnect_reason_string_omitted_when_too_large_for_client(net):
    # room for the CONNACK (11 bytes), not for a DISCONNECT with its reason string
    c = v5(net, "c", properties={P.MAXIMUM_PACKET_SIZE: 16})
    c.send(Publish("", b"x", properties={P.TOPIC_ALIAS: 7}))  # unknown alias -> 0x82
    d = c.server_disconnect()
    assert d == Disconnect(0x82)


def test_packet_larger_than_server_maximum():
    net = Net(ChannelLimits(max_packet_size=100))
    c = v5(net, "c")
    c.send(Publish("t", b"x" * 200))
    assert c.server_disconnect().reason_code == 0x95
    assert c.closed


# ----------------------------------------------------------------------------- message expiry


def test_expired_queued_messages_are_dropped_and_interval_rewritten(net):
    props = {P.SESSION_EXPIRY_INTERVAL: 1000}
    sub = v5(net, "sub", properties=props)
    sub.subscribe("t", qos=1)
    sub.disconnect()
    pub = v5(net, "pub")
    pub.publish("t", b"short", qos=1, properties={P.MESSAGE_EXPIRY_INTERVAL: 5})
    pub.publish("t", b"long", qos=1, properties={P.MESSAGE_EXPIRY_INTERVAL: 30})
    pub.publish("t", b"forever", qos=1)
    net.advance(10)
    again = v5(net, "sub", clean=False, properties=props)
    got = {p.payload: (p.properties or {}).get(P.MESSAGE_EXPIRY_INTERVAL) for p in again.publishes()}
    # 5.0 3.3.2.3.3: expired messages are not delivered; the others carry the time left
    assert got == {b"long": 20, b"forever": None}
    assert net.stats.dropped_expired == 1


def test_live_delivery_keeps_message_expiry(net):
    sub = v5(net, "sub")
    sub.subscribe("t")
    pub = v5(net, "pub")
    pub.publish("t", b"x", properties={P.MESSAGE_EXPIRY_INTERVAL: 42})
    [p] = sub.publishes()
    assert p.properties[P.MESSAGE_EXPIRY_INTERVAL] == 42


def test_expired_message_waiting_for_the_window_is_dropped(net):
    sub = v5(net, "sub", properties={P.RECEIVE_MAXIMUM: 1})
    sub.subscribe("t", qos=1)
    pub = v5(net, "pub")
    pub.publish("t", b"first", qos=1)
    pub.publish("t", b"stale", qos=1, properties={P.MESSAGE_EXPIRY_INTERVAL: 2})
    pub.publish("t", b"fresh", qos=1, properties={P.MESSAGE_EXPIRY_INTERVAL: 20})
    [first] = sub.publishes()
    net.advance(5)
    sub.send(Puback(first.packet_id))
    [p] = sub.publishes()
    assert p.payload == b"fresh"
    assert p.properties[P.MESSAGE_EXPIRY_INTERVAL] == 15


def test_expired_retained_message_is_not_sent(net):
    pub = v5(net, "pub")
    pub.publish("r", b"x", retain=True, properties={P.MESSAGE_EXPIRY_INTERVAL: 10})
    net.advance(5)
    s1 = v5(net, "s1")
    s1.subscribe("r")
    [p] = s1.publishes()
    assert (p.retain, p.properties[P.MESSAGE_EXPIRY_INTERVAL]) == (True, 5)
    net.advance(6)
    s2 = v5(net, "s2")
    s2.subscribe("r")
    assert s2.publishes() == []


def test_message_properties_forwarded(net):
    sub = v5(net, "sub")
    sub.subscribe("t")
    pub = v5(net, "pub")
    props = {
        P.PAYLOAD_FORMAT_INDICATOR: 1,
        P.CONTENT_TYPE: "text/plain",
        P.RESPONSE_TOPIC: "reply/1",
        P.CORRELATION_DATA: b"\x00\x01",
        P.USER_PROPERTY: [("b", "2"), ("a", "1"), ("b", "3")],
    }
    pub.publish("t", b"hi", properties=dict(props))
    [p] = sub.publishes()
    assert p.properties == props  # [MQTT-3.3.2-17] [MQTT-3.3.2-18]: user properties in order


def test_v5_properties_not_sent_to_311_subscriber(net):
    sub = net.connect("sub", version=MQTT311)
    sub.subscribe("t")
    pub = v5(net, "pub")
    pub.publish("t", b"hi", properties={P.USER_PROPERTY: [("k", "v")]})
    [p] = sub.publishes()
    assert p == Publish("t", b"hi")


# ----------------------------------------------------------------------------- subscription options


def test_no_local(net):
    c = v5(net, "c")
    c.subscribe("t", qos=1, no_local=True)
    other = v5(net, "other")
    c.publish("t", b"mine", qos=1)
    other.publish("t", b"theirs", qos=1)
    assert c.payloads() == [b"theirs"]  # [MQTT-3.8.3-3]


def test_no_local_with_an_overlapping_subscription_without_it(net):
    c = v5(net, "c")
    c.subscribe("t/#", qos=0, no_local=True)
    c.subscribe("t/+", qos=1)
    c.publish("t/a", b"mine", qos=1)
    [p] = c.publishes()
    assert (p.payload, p.qos) == (b"mine", 1)


def test_no_local_on_shared_subscription_is_protocol_error(net):
    c = v5(net, "c")
    c.send(Subscribe(1, [SubscriptionRequest("$share/g/t", 0, no_local=True)]))
    assert c.server_disconnect().reason_code == 0x82  # [MQTT-3.8.3-4]


@pytest.mark.parametrize(("rap", "expect"), [(True, True), (False, False)])
def test_retain_as_published(net, rap, expect):
    sub = v5(net, "sub")
    sub.subscribe("t", retain_as_published=rap)
    pub = v5(net, "pub")
    pub.publish("t", b"r", retain=True)
    pub.publish("t", b"n", retain=False)
    assert [(p.payload, p.retain) for p in sub.publishes()] == [(b"r", expect), (b"n", False)]


def test_retain_handling(net):
    pub = v5(net, "pub")
    pub.publish("r/1", b"kept", retain=True)
    c = v5(net, "c")
    # 0: retained messages at every subscribe
    c.subscribe("r/#", retain_handling=0)
    c.subscribe("r/#", retain_handling=0)
    assert c.payloads() == [b"kept", b"kept"]
    # 1: only when the subscription is new
    c.subscribe("r/+", retain_handling=1)
    c.subscribe("r/+", retain_handling=1)
    assert c.payloads() == [b"kept"]
    # 2: never
    c.subscribe("r/1", retain_handling=2)
    assert c.payloads() == []
    assert all(p.retain for p in c.history if p.type == 3)


def test_retained_messages_capped_at_subscription_qos(net):
    pub = v5(net, "pub")
    pub.publish("r", b"x", qos=2, retain=True)
    c = v5(net, "c")
    c.subscribe("r", qos=1)
    [p] = c.publishes()
    assert (p.qos, p.retain) == (1, True)


# ----------------------------------------------------------------------------- subscription identifiers


def test_subscription_identifier_delivered(net):
    c = v5(net, "c")
    c.subscribe("a/#", properties={P.SUBSCRIPTION_IDENTIFIER: 7})
    c.subscribe("b", properties={P.SUBSCRIPTION_IDENTIFIER: 268_435_455})
    c.subscribe("c")
    pub = v5(net, "pub")
    for t in ("a/x", "b", "c"):
        pub.publish(t, b"")
    got = [(p.topic, (p.properties or {}).get(P.SUBSCRIPTION_IDENTIFIER)) for p in c.publishes()]
    assert got == [("a/x", [7]), ("b", [268_435_455]), ("c", None)]


def test_subscription_identifier_on_retained(net):
    pub = v5(net, "pub")
    pub.publish("r", b"x", retain=True)
    c = v5(net, "c")
    c.subscribe("r", properties={P.SUBSCRIPTION_IDENTIFIER: 3})
    [p] = c.publishes()
    assert p.properties[P.SUBSCRIPTION_IDENTIFIER] == [3]


def test_overlapping_subscriptions_one_copy_at_max_qos_with_all_ids(net):
    c = v5(net, "c")
    c.subscribe("a/#", qos=0, properties={P.SUBSCRIPTION_IDENTIFIER: 1})
    c.subscribe("a/+", qos=2, properties={P.SUBSCRIPTION_IDENTIFIER: 2})
    c.subscribe("+/b", qos=1, properties={P.SUBSCRIPTION_IDENTIFIER: 3})
    c.subscribe("a/b", qos=1)
    pub = v5(net, "pub")
    pub.publish("a/b", b"x", qos=2)
    [p] = c.publishes()  # 5.0 3.3.4: one copy, the highest QoS, every identifier
    assert p.qos == 2
    assert sorted(p.properties[P.SUBSCRIPTION_IDENTIFIER]) == [1, 2, 3]


def test_overlapping_subscriptions_311_one_copy_at_max_qos(net):
    c = net.connect("c")
    c.subscribe("a/#", qos=0)
    c.subscribe("a/+", qos=1)
    pub = net.connect("pub")
    pub.publish("a/b", b"x", qos=2)
    [p] = c.publishes()  # 3.1.1 3.3.5: delivered respecting the maximum QoS of the matches
    assert p.qos == 1


def test_resubscribe_without_identifier_drops_it(net):
    c = v5(net, "c")
    c.subscribe("t", properties={P.SUBSCRIPTION_IDENTIFIER: 5})
    c.subscribe("t")
    v5(net, "pub").publish("t", b"x")
    [p] = c.publishes()
    assert P.SUBSCRIPTION_IDENTIFIER not in (p.properties or {})


# ----------------------------------------------------------------------------- problem information


def test_request_problem_information_0_suppresses_reason_strings(net):
    c = v5(net, "c", properties={P.REQUEST_PROBLEM_INFORMATION: 0})
    ack = c.publish("t", b"\xff", qos=1, properties={P.PAYLOAD_FORMAT_INDICATOR: 1}, pid=1)
    assert ack == Puback(1, 0x99)  # [MQTT-3.1.2-29]: no Reason String
    loud = v5(net, "loud")
    ack = loud.publish("t", b"\xff", qos=1, properties={P.PAYLOAD_FORMAT_INDICATOR: 1}, pid=1)
    assert ack.reason_code == 0x99 and ack.properties[P.REASON_STRING]


# ----------------------------------------------------------------------------- DISCONNECT


def test_disconnect_session_expiry_after_zero_is_protocol_error(net):
    c = v5(net, "c")
    c.disconnect(properties={P.SESSION_EXPIRY_INTERVAL: 10})
    assert c.server_disconnect().reason_code == 0x82  # 5.0 3.14.2.2.2
    assert c.closed


def test_disconnect_session_expiry_zero_after_zero_is_fine(net):
    c = v5(net, "c")
    c.disconnect(properties={P.SESSION_EXPIRY_INTERVAL: 0})
    assert c.server_disconnect() is None
    assert c.closed


def test_disconnect_can_shorten_the_session(net):
    c = v5(net, "c", properties={P.SESSION_EXPIRY_INTERVAL: 100})
    c.subscribe("t")
    c.disconnect(properties={P.SESSION_EXPIRY_INTERVAL: 0})
    again = net.client(MQTT5)
    assert (
        again.connect("c", clean=False, properties={P.SESSION_EXPIRY_INTERVAL: 100}).session_present is False
    )


def test_disconnect_can_lengthen_the_session(net):
    c = v5(net, "c", properties={P.SESSION_EXPIRY_INTERVAL: 10})
    c.subscribe("t", qos=1)
    c.disconnect(properties={P.SESSION_EXPIRY_INTERVAL: 100})
    net.advance(50)
    again = net.client(MQTT5)
    assert again.connect("c", clean=False, properties={P.SESSION_EXPIRY_INTERVAL: 10}).session_present


def test_server_shutdown_sends_disconnect_8b(net):
    c5 = v5(net, "c5")
    c3 = net.connect("c3")
    net.broker.shutdown(net.now)
    assert c5.server_disconnect().reason_code == 0x8B
    assert c5.closed and c3.closed
    assert c3.take() == []


def test_inflight_too_large_after_resume_is_discarded(net):
    """[MQTT-3.1.2-25]: a packet too large to send is discarded and the server behaves as if it
    had completed sending it -- so it must not keep occupying the client's Receive Maximum."""
    sub = v5(net, "sub", properties={P.SESSION_EXPIRY_INTERVAL: 100, P.RECEIVE_MAXIMUM: 1})
    sub.subscribe("t", qos=1)
    pub = net.connect("pub")
    pub.publish("t", b"x" * 500, qos=1)
    assert [len(p.payload) for p in sub.publishes()] == [500]
    sub.disconnect()  # leaves the message unacknowledged
    small = {P.SESSION_EXPIRY_INTERVAL: 100, P.RECEIVE_MAXIMUM: 1, P.MAXIMUM_PACKET_SIZE: 100}
    again = v5(net, "sub", clean=False, properties=small)
    assert again.publishes() == []  # too large now: not sent
    pub.publish("t", b"small", qos=1)
    assert again.payloads() == [b"small"]
