"""CONNECT / CONNACK, refusals, the first-packet rule, keepalive and CONNECT timeouts."""

import pytest

from brokerd.protocol import properties as P
from brokerd.protocol.channel import ChannelLimits
from brokerd.protocol.codec import encode, varint
from brokerd.protocol.packets import (
    Connack,
    Connect,
    Disconnect,
    Pingreq,
    Pingresp,
    Publish,
    Subscribe,
    SubscriptionRequest,
    Will,
)

from .harness import MQTT5, MQTT31, MQTT311, Net
from .wire import s

# ----------------------------------------------------------------------------- accepted


def test_311_connack_bytes(net):
    c = net.client(MQTT311)
    c.channel.receive_data(encode(Connect("dev1", keepalive=30)), net.now)
    assert b"".join(c.channel.out) == b"\x20\x02\x00\x00"
    assert c.hooks.calls == ["wake"]
    assert c.take() == [Connack(False, 0)]
    assert not c.closed


def test_31_connect_accepted(net):
    c = net.client(MQTT31)
    ack = c.connect("dev1")
    assert ack == Connack(False, 0)


def test_31_connack_first_byte_is_reserved(net):
    """MQTT 3.1 (CONNACK, variable header byte 1): "Reserved values. Not used." Session Present only
    exists from 3.1.1 on, so a 3.1 client resuming a session must still see 0x00 there."""
    net.client(MQTT31).connect("dev", clean=False)
    net.clients[-1].lose()
    ack = net.client(MQTT31).connect("dev", clean=False)
    assert ack == Connack(False, 0)


def test_v5_connack_advertises_server_limits():
    net = Net(ChannelLimits(max_inflight=20, topic_alias_maximum=10, max_packet_size=5000))
    ack = net.client(MQTT5).connect("dev1", keepalive=30)
    assert ack.reason_code == 0
    assert ack.session_present is False
    props = ack.properties
    assert props[P.RECEIVE_MAXIMUM] == 20
    assert props[P.TOPIC_ALIAS_MAXIMUM] == 10
    assert props[P.MAXIMUM_PACKET_SIZE] == 5000
    assert P.ASSIGNED_CLIENT_IDENTIFIER not in props
    assert P.SERVER_KEEP_ALIVE not in props


def test_packets_pipelined_behind_connect_are_handled(net):
    sub = net.connect("sub")
    sub.subscribe("t", qos=0)
    c = net.client(MQTT311)
    got = c.send(Connect("pub"), Subscribe(1, [SubscriptionRequest("x")]), Publish("t", b"hi"), Pingreq())
    assert [type(p).__name__ for p in got] == ["Connack", "Suback", "Pingresp"]
    assert sub.payloads() == [b"hi"]


def test_311_empty_client_id_with_clean_session_gets_an_id(net):
    ack = net.client(MQTT311).connect("", clean=True)
    assert ack == Connack(False, 0)


# ----------------------------------------------------------------------------- client identifier refusals


def test_311_empty_client_id_without_clean_session_is_refused(net):
    c = net.client(MQTT311)
    ack = c.connect("", clean=False, expect=2)  # 0x02 identifier rejected [MQTT-3.1.3-8]
    assert ack.session_present is False
    assert c.closed


@pytest.mark.parametrize("clean", [True, False])
def test_31_empty_client_id_is_refused(net, clean):
    c = net.client(MQTT31)
    c.connect("", clean=clean, expect=2)
    assert c.closed


def test_31_client_id_length_limit(net):
    assert net.client(MQTT31).connect("x" * 23).reason_code == 0
    c = net.client(MQTT31)
    c.connect("y" * 24, expect=2)
    assert c.closed


def test_311_long_client_id_is_allowed(net):
    assert net.client(MQTT311).connect("z" * 200).reason_code == 0


def test_v5_empty_client_id_gets_assigned_identifier(net):
    c = net.client(MQTT5)
    ack = c.connect("", properties={P.SESSION_EXPIRY_INTERVAL: 60})
    assigned = ack.properties[P.ASSIGNED_CLIENT_IDENTIFIER]
    assert assigned
    c.subscribe("keep", qos=1)
    c.disconnect()
    # the assigned identifier names the session
    again = net.client(MQTT5)
    ack = again.connect(assigned, clean=False, properties={P.SESSION_EXPIRY_INTERVAL: 60})
    assert ack.session_present is True
    assert P.ASSIGNED_CLIENT_IDENTIFIER not in (ack.properties or {})


def test_v5_empty_client_id_without_clean_start_is_accepted(net):
    ack = net.client(MQTT5).connect("", clean=False)
    assert ack.reason_code == 0 and ack.session_present is False
    assert ack.properties[P.ASSIGNED_CLIENT_IDENTIFIER]


def test_assigned_identifiers_are_unique(net):
    ids = {net.client(MQTT5).connect("").properties[P.ASSIGNED_CLIENT_IDENTIFIER] for _ in range(5)}
    assert len(ids) == 5


# ----------------------------------------------------------------------------- keepalive negotiation


@pytest.mark.parametrize("version", [MQTT31, MQTT311])
def test_3x_keepalive_above_maximum_is_refused(version):
    net = Net(ChannelLimits(max_keepalive=100))
    c = net.client(version)
    c.connect("k", keepalive=101, expect=2)
    assert c.closed
    assert net.client(version).connect("k2", keepalive=100).reason_code == 0
    assert net.client(version).connect("k3", keepalive=0).reason_code == 0


@pytest.mark.parametrize(("asked", "told"), [(0, 100), (101, 100), (65535, 100), (100, None), (1, None)])
def test_v5_server_keep_alive(asked, told):
    net = Net(ChannelLimits(max_keepalive=100))
    ack = net.client(MQTT5).connect("k", keepalive=asked)
    assert ack.reason_code == 0
    assert (ack.properties or {}).get(P.SERVER_KEEP_ALIVE) == told


def test_v5_server_keep_alive_is_enforced():
    """The client must use the Server Keep Alive (5.0 3.2.2.3.14): 1.5 x 100 s."""
    net = Net(ChannelLimits(max_keepalive=100))
    c = net.client(MQTT5)
    c.connect("k", keepalive=0)
    net.advance(150)
    assert not c.closed
    net.advance(1)
    assert c.closed
    assert c.server_disconnect().reason_code == 0x8D


# ----------------------------------------------------------------------------- other refusals


def test_v5_authentication_method_is_refused(net):
    c = net.client(MQTT5)
    ack = c.connect("a", properties={P.AUTHENTICATION_METHOD: "SCRAM-SHA-1"}, expect=0x8C)
    assert ack.session_present is False
    assert c.closed


@pytest.mark.parametrize(("level_byte", "name"), [(6, "MQTT"), (3, "MQTT"), (4, "MQIsdp"), (2, "MQTT")])
def test_unsupported_protocol_level_gets_311_connack_1(net, level_byte, name):
    c = net.client(MQTT311)
    body = s(name) + bytes([level_byte, 0x02, 0, 60]) + s("c")
    c.send_raw(b"\x10" + varint(len(body)) + body)
    # 3.1.1 [MQTT-3.1.2-2]: CONNACK 0x01 then close; 5.0 allows 0x84, 3.1.1 format is readable by all
    assert c.take() == [Connack(False, 1)]
    assert c.closed


def test_unknown_protocol_name_closes(net):
    c = net.client(MQTT311)
    body = s("HTTP") + bytes([4, 0x02, 0, 60]) + s("c")
    c.send_raw(b"\x10" + varint(len(body)) + body)
    assert c.closed
    assert c.take() == []


@pytest.mark.parametrize(
    "prop",
    [
        {P.RECEIVE_MAXIMUM: 0},
        {P.MAXIMUM_PACKET_SIZE: 0},
        {P.REQUEST_PROBLEM_INFORMATION: 2},
        {P.REQUEST_RESPONSE_INFORMATION: 2},
    ],
)
def test_v5_invalid_connect_property_values_are_protocol_errors(net, prop):
    c = net.client(MQTT5)
    c.connect("p", properties=prop, expect=0x82)
    assert c.closed


@pytest.mark.parametrize(("version", "code"), [(MQTT311, 5), (MQTT31, 5), (MQTT5, 0x87)])
def test_not_authorized(version, code):
    net = Net(allow_anonymous=False)
    c = net.client(version)
    c.connect("x", expect=code)
    assert c.closed
    assert net.stats.auth_failures == 1


@pytest.mark.parametrize(("version", "code"), [(MQTT311, 3), (MQTT5, 0x97)])
def test_connection_limit(version, code):
    net = Net(max_connections=1)
    net.connect("one")
    c = net.client(version)
    c.connect("two", expect=code)
    assert c.closed


@pytest.mark.parametrize("topic", ["a/+", "#", ""])
def test_invalid_will_topic(net, topic):
    c3 = net.client(MQTT311)
    c3.send(Connect("w3", will=Will(topic, b"x")))
    assert c3.closed
    assert c3.take() == []  # 3.1.1: just close
    c5 = net.client(MQTT5)
    c5.connect("w5", will=Will(topic, b"x"), expect=0x90)
    assert c5.closed


def test_will_payload_not_utf8_with_format_indicator(net):
    c = net.client(MQTT5)
    c.connect("w", will=Will("t", b"\xff", properties={P.PAYLOAD_FORMAT_INDICATOR: 1}), expect=0x99)
    assert c.closed


def test_malformed_connect_closes_without_connack(net):
    c = net.client(MQTT5)
    body = s("MQTT") + bytes([5, 0x03, 0, 60, 0]) + s("c")  # reserved flag set
    c.send_raw(b"\x10" + varint(len(body)) + body)
    assert c.closed
    assert c.take() in ([], [Connack(False, 0x81)])  # 5.0 3.1.4: MAY send CONNACK 0x81


def test_refused_connack_has_session_present_0(net):
    """[MQTT-3.2.2-4]/[MQTT-3.2.2-6]: a refusal never claims a session."""
    lim = Net(ChannelLimits(max_keepalive=10))
    lim.connect("pers", clean=False, keepalive=5).disconnect()
    c = lim.client(MQTT311)
    ack = c.connect("pers", clean=False, keepalive=11, expect=2)
    assert ack.session_present is False


def test_response_information():
    net = Net(ChannelLimits(response_information="reply/"))
    ack = net.client(MQTT5).connect("dev", properties={P.REQUEST_RESPONSE_INFORMATION: 1})
    assert ack.properties[P.RESPONSE_INFORMATION] == "reply/dev"
    ack = net.client(MQTT5).connect("dev2")
    assert P.RESPONSE_INFORMATION not in ack.properties


def test_session_expiry_capped_by_server():
    net = Net(ChannelLimits(max_session_expiry=60))
    ack = net.client(MQTT5).connect("s", properties={P.SESSION_EXPIRY_INTERVAL: 3600})
    assert ack.properties[P.SESSION_EXPIRY_INTERVAL] == 60
    ack = net.client(MQTT5).connect("s2", properties={P.SESSION_EXPIRY_INTERVAL: 30})
    assert P.SESSION_EXPIRY_INTERVAL not in ack.properties


# ----------------------------------------------------------------------------- packet order


@pytest.mark.parametrize(
    "first", [Pingreq(), Publish("t", b"x"), Subscribe(1, [SubscriptionRequest("a")]), Disconnect()]
)
def test_first_packet_must_be_connect(net, first):
    c = net.client(MQTT311)
    c.send(first)
    assert c.closed
    assert c.take() == []


def test_first_packet_not_connect_then_connect_is_ignored(net):
    c = net.client(MQTT311)
    c.send(Pingreq(), Connect("late"))
    assert c.closed
    assert c.take() == []
    assert net.broker.session_count() == 0


def test_second_connect_v5_is_protocol_error(net):
    c = net.client(MQTT5)
    c.connect("twice")
    c.send(Connect("twice", protocol_level=MQTT5))
    assert c.server_disconnect().reason_code == 0x82
    assert c.closed


def test_second_connect_311_closes(net):
    c = net.client(MQTT311)
    c.connect("twice")
    c.send(Connect("twice"))
    assert c.closed
    assert c.take() == []


def test_second_connect_with_bad_level_is_still_a_protocol_error(net):
    """[MQTT-3.1.0-2]: a second CONNECT is a Protocol Error (0x82), whatever it contains."""
    c = net.client(MQTT5)
    c.connect("twice")
    body = s("MQTT") + bytes([7, 0x02, 0, 60]) + s("c")
    c.send_raw(b"\x10" + varint(len(body)) + body)
    assert c.closed
    assert c.server_disconnect().reason_code == 0x82


@pytest.mark.parametrize("pkt", [Connack(False, 0), Pingresp()])
def test_server_only_packets_from_a_client_are_protocol_errors(net, pkt):
    c = net.client(MQTT5)
    c.connect("x")
    c.send(pkt)
    assert c.server_disconnect().reason_code == 0x82
    assert c.closed


def test_auth_without_method_is_protocol_error(net):
    from brokerd.protocol.packets import Auth

    c = net.client(MQTT5)
    c.connect("x")
    c.send(Auth(0x19))
    assert c.server_disconnect().reason_code == 0x82


def test_nothing_is_read_after_close(net):
    c = net.client(MQTT5)
    c.connect("x")
    c.disconnect()
    assert c.closed
    c.send(Pingreq())
    assert c.take() == []


# ----------------------------------------------------------------------------- timers


def test_connect_timeout():
    net = Net(ChannelLimits(connect_timeout=5))
    c = net.client(MQTT311)
    net.advance(5)
    assert not c.closed
    net.advance(0.5)
    assert c.closed
    assert c.take() == []


def test_connect_timeout_counts_from_the_socket_not_partial_bytes():
    net = Net(ChannelLimits(connect_timeout=5))
    c = net.client(MQTT311)
    data = encode(Connect("slow"))
    net.advance(3)
    c.send_raw(data[:4])  # a trickle of CONNECT does not buy more time
    net.advance(3)
    assert c.closed


def test_connect_timeout_does_not_apply_once_connected():
    net = Net(ChannelLimits(connect_timeout=5))
    c = net.connect("x", keepalive=0)
    net.advance(1000)
    assert not c.closed


@pytest.mark.parametrize("version", [MQTT311, MQTT5])
def test_keepalive_timeout_after_one_and_a_half_times(version):
    net = Net()
    c = net.client(version)
    c.connect("ka", keepalive=10)
    net.advance(15)
    assert not c.closed
    net.advance(0.01)
    assert c.closed
    d = c.server_disconnect()
    if version == MQTT5:
        assert d.reason_code == 0x8D
    else:
        assert d is None


def test_any_packet_resets_keepalive(net):
    c = net.client(MQTT311)
    c.connect("ka", keepalive=10)
    for _ in range(5):
        net.advance(14)
        assert c.send(Pingreq()) == [Pingresp()]
    net.advance(14)
    c.send(Publish("t", b""))
    net.advance(14)
    assert not c.closed


def test_keepalive_zero_never_times_out(net):
    c = net.connect("ka0", keepalive=0)
    net.advance(10**6)
    assert not c.closed


def test_pingreq_gets_pingresp_bytes(net):
    c = net.connect("p")
    c.send(Pingreq())
    assert c.take() == [Pingresp()]


@pytest.mark.parametrize("props", [{P.AUTHENTICATION_METHOD: "SCRAM-SHA-1"}, {P.RECEIVE_MAXIMUM: 0}])
def test_refusal_connack_respects_client_maximum_packet_size(net, props):
    """[MQTT-3.2.2-19]: the Server MUST NOT send a Reason String if it would make the CONNACK larger
    than the client's Maximum Packet Size ([MQTT-3.1.2-24] for every packet)."""
    c = net.client(MQTT5)
    c.channel.receive_data(
        encode(Connect("x", protocol_level=MQTT5, properties={P.MAXIMUM_PACKET_SIZE: 20, **props})), net.now
    )
    data = b"".join(c.channel.out)
    assert data[0] == 0x20
    assert len(data) <= 20, c.take()


def test_v5_session_expiry_never():
    net = Net()
    props = {P.SESSION_EXPIRY_INTERVAL: 0xFFFFFFFF}
    c = net.client(MQTT5)
    c.connect("forever", properties=props)
    c.lose()
    net.advance(10**9)
    assert net.client(MQTT5).connect("forever", clean=False, properties=props).session_present


def test_connection_lost_before_connect_is_harmless(net):
    c = net.client(MQTT311)
    c.send_raw(encode(Connect("x"))[:5])
    c.lose()
    assert net.broker.session_count() == 0
    assert net.connect("x").closed is False
