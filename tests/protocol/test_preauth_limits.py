"""What an unauthenticated peer, or a packet full of properties, may cost (issue 16).

- At most ``MAX_USER_PROPERTIES`` (256) User Properties per packet -- a
  CONNECT's and its will's together; one more is ``PacketTooLarge`` (0x95).
  They are decoded by an inline loop, and the rest of a packet past the cap
  is never looked at.
- Before a CONNECT is decoded the decoder's limit is ``max_connect_size``: a
  larger CONNECT is refused from its fixed header (v5: CONNACK 0x95, read
  from the protocol level in the same bytes; otherwise a plain close).
- The bytes of incomplete CONNECTs held by all channels of a broker are
  bounded by its ``PreauthBudget``: the channel whose bytes would pass it is
  closed, and every channel gives its share back when its CONNECT completes,
  times out or the connection goes.
- An address the failed-login throttle holds is refused (v5 CONNACK 0x9F,
  3.1.1 return code 3) before its CONNECT is decoded: a CONNECT whose
  properties are malformed gets 0x9F, not the close a malformed CONNECT gets.
"""

import pytest

from brokerd.protocol import properties as P
from brokerd.protocol.channel import CLOSED, NEW, ChannelLimits
from brokerd.protocol.codec import MAX_USER_PROPERTIES, FrameDecoder, encode
from brokerd.protocol.errors import MalformedPacket, PacketTooLarge
from brokerd.protocol.packets import (
    MQTT5,
    MQTT311,
    Connack,
    Connect,
    Publish,
    Subscribe,
    SubscriptionRequest,
    Will,
)
from brokerd.tenancy.control import FAIL_LIMIT, TenantControl

from .harness import Net
from .wire import frame, props, s

USER = P.USER_PROPERTY


def users(n: int) -> list:
    return [(f"k{i}", "v") for i in range(n)]


# ------------------------------------------------------------------ user properties (codec)


@pytest.mark.parametrize("make", [
    lambda u: Publish("t", b"x", 1, False, False, 7, {USER: u}),
    lambda u: Subscribe(3, [SubscriptionRequest("a/#", 1)], {USER: u}),
    lambda u: Connect("c", True, 60, None, None, None, MQTT5, {USER: u}),
], ids=["publish", "subscribe", "connect"])
def test_user_properties_up_to_the_cap_decode_and_one_more_is_refused(make):
    pkt = make(users(MAX_USER_PROPERTIES))
    version = 0 if pkt.type == 1 else MQTT5
    [got] = FrameDecoder(version=version).feed(encode(pkt, MQTT5))
    assert got.properties[USER] == users(MAX_USER_PROPERTIES)
    with pytest.raises(PacketTooLarge) as exc:
        FrameDecoder(version=version).feed(encode(make(users(MAX_USER_PROPERTIES + 1)), MQTT5))
    assert exc.value.reason_code == 0x95
    assert "user properties" in str(exc.value)


def test_a_connect_and_its_will_share_the_cap():
    def connect(n_connect, n_will):
        will = Will("w", b"bye", 0, False, {USER: users(n_will)} if n_will else None)
        return encode(Connect("c", True, 60, None, None, will, MQTT5, {USER: users(n_connect)}))

    [got] = FrameDecoder().feed(connect(200, 56))
    assert len(got.properties[USER]) + len(got.will.properties[USER]) == MAX_USER_PROPERTIES
    with pytest.raises(PacketTooLarge):
        FrameDecoder().feed(connect(200, 57))
    with pytest.raises(PacketTooLarge):
        FrameDecoder().feed(connect(MAX_USER_PROPERTIES, 1))


def test_the_flood_of_the_issue_stops_at_the_cap():
    """A 1 MiB PUBLISH of 209,000 empty user properties: refused once the 257th is reached;
    what follows is never parsed (it is malformed here, and that is not what is reported)."""
    flood = b"\x26\x00\x00\x00\x00" * 209_000 + b"\xff"      # ends in an unknown property id
    data = frame(0x30, s("t") + props(flood))
    assert len(data) > 1_000_000
    with pytest.raises(PacketTooLarge):
        FrameDecoder(version=MQTT5).feed(data)


@pytest.mark.parametrize("prop", [
    b"\x26",                          # no key length
    b"\x26\x00",                      # half a key length
    b"\x26\x00\x05ab",                # key runs past the block
    b"\x26\x00\x01a",                 # no value length
    b"\x26\x00\x01a\x00\x05ab",       # value runs past the block
    b"\x26\x00\x01a\x00\x01\xff",     # value not UTF-8
    b"\x26\x00\x01\x00\x00\x00",      # key with U+0000
])
def test_malformed_user_properties(prop):
    with pytest.raises(MalformedPacket):
        FrameDecoder(version=MQTT5).feed(frame(0x30, s("t") + props(prop)))


def test_user_properties_keep_their_order_and_duplicates_beside_other_properties():
    pairs = [("a", "1"), ("", ""), ("a", "2"), ("ключ", "значение")]
    p = {P.CONTENT_TYPE: "json", USER: pairs, P.MESSAGE_EXPIRY_INTERVAL: 9}
    [got] = FrameDecoder(version=MQTT5).feed(encode(Publish("t", b"", 0, False, False, 0, p), MQTT5))
    assert got.properties == p


# ------------------------------------------------------------------ CONNECT size (codec)


def test_a_connect_larger_than_max_connect_size_is_refused_from_its_fixed_header():
    big = encode(Connect("c", True, 60, None, b"x" * 5000, None, MQTT5))
    dec = FrameDecoder(max_packet_size=1 << 20, max_connect_size=1000)
    with pytest.raises(PacketTooLarge):
        dec.feed(big[:16])                 # the fixed header and the protocol level are enough
    assert dec.version == MQTT5            # for the CONNACK 0x95
    dec = FrameDecoder(max_packet_size=1 << 20, max_connect_size=1000)
    with pytest.raises(PacketTooLarge):
        dec.feed(big[:3])                  # the header alone: refused, version unknown
    assert dec.version == 0


def test_after_the_connect_the_maximum_packet_size_applies():
    dec = FrameDecoder(max_packet_size=1 << 20, max_connect_size=1000)
    publish = Publish("t", b"p" * 50_000)
    pkts = dec.feed(encode(Connect("c")) + encode(publish))      # in one read too
    assert [p.type for p in pkts] == [1, 3]
    assert dec.feed(encode(publish)) == [publish]
    # the smaller of the two limits wins
    assert FrameDecoder(max_packet_size=500, max_connect_size=1000).max_connect_size == 500


@pytest.mark.parametrize("head, level", [
    (encode(Connect("c", protocol_level=5)), 5),
    (encode(Connect("c", protocol_level=4)), 4),
    (encode(Connect("c", protocol_level=3, protocol_name="MQIsdp")), 3),
    (encode(Connect("c", protocol_level=5))[:8], 0),      # the level byte has not come yet
    (b"\x10\x80\x80\x01\x00\x04MQTT\x05", 5),            # a 3-byte Remaining Length
    (b"\x10\x0a\x00\x04HTTP\x05", 0),
    (b"\x30\x05\x00\x01t", 0),                           # not a CONNECT
])
def test_peek_connect_level(head, level):
    assert FrameDecoder().peek_connect_level(head) == level
    dec = FrameDecoder()
    assert dec.feed(head[:1]) == []
    assert dec.peek_connect_level(head[1:]) == level


# ------------------------------------------------------------------ the channel before CONNECT


def _big_connect(version: int, size: int) -> bytes:
    name = "MQIsdp" if version == 3 else "MQTT"
    return encode(Connect("big", True, 60, None, b"x" * size, None, version, None, name))


@pytest.mark.parametrize("version", [MQTT311, MQTT5])
def test_a_client_sending_a_too_large_connect_is_refused(version):
    net = Net(ChannelLimits(max_connect_size=4096))
    c = net.client(version)
    data = _big_connect(version, 10_000)
    got = c.send_raw(data[:100])
    assert c.closed and c.channel.state == CLOSED
    if version == MQTT5:
        assert got == [Connack(False, 0x95, got[0].properties)]
    else:
        assert got == []                   # 3.1.1 has no code for it: a plain close
    assert net.broker.preauth.used == 0
    # the same CONNECT under the limit is accepted
    net.client(version).connect("ok", username="u", password=b"x" * 3000)


def test_partial_connects_are_bounded_node_wide():
    net = Net(ChannelLimits(max_connect_size=4096, preauth_budget=10_000))
    budget = net.broker.preauth
    data = _big_connect(MQTT5, 3500)
    held = [net.client(MQTT5) for _ in range(2)]
    for c in held:
        assert c.send_raw(data[:-10]) == [] and not c.closed
    assert budget.used == 2 * (len(data) - 10)
    third = net.client(MQTT5)
    assert third.send_raw(data[:-10]) == []
    assert third.closed and third.channel.close_reason[0] == 0x89       # Server busy
    assert budget.used == 2 * (len(data) - 10) and budget.refused == 1
    # a CONNECT that arrives whole is never held: it gets in although the budget is full
    net.client(MQTT5).connect("whole")
    # the held ones give their bytes back as they complete, go, or time out
    assert held[0].send_raw(data[-10:])[0].reason_code == 0
    assert budget.used == len(data) - 10
    held[1].lose()
    assert budget.used == 0
    late = net.client(MQTT5)
    late.send_raw(data[:50])
    assert budget.used == 50
    net.advance(net.limits.connect_timeout + 1)
    assert late.closed and budget.used == 0


def test_trickled_connect_is_charged_as_it_grows():
    net = Net(ChannelLimits(preauth_budget=100_000))
    c = net.client(MQTT5)
    data = encode(Connect("trickle", True, 60, None, b"p" * 100, None, MQTT5))
    for i in range(len(data) - 1):
        c.send_raw(data[i:i + 1])
        assert net.broker.preauth.used == i + 1
    c.send_raw(data[-1:])
    assert c.channel.state != NEW and net.broker.preauth.used == 0


# ------------------------------------------------------------------ throttled addresses


def _throttled_net():
    net = Net()
    auth = net.broker.auth = TenantControl(allow_anonymous=True)
    for _ in range(FAIL_LIMIT):
        auth._failed(("addr", "192.0.2.7"), net.now)
    return net, auth


def _client_from(net, version, peer):
    c = net.client(version)
    c.channel.peer = peer
    return c


@pytest.mark.parametrize("version, code", [(MQTT5, 0x9F), (MQTT311, 3)])
def test_a_throttled_address_is_refused_before_its_connect_is_decoded(version, code):
    """Its CONNECT is malformed (v5: an unknown property after 200 user properties; 3.1.1: a
    client id that is not UTF-8): decoded, that is a plain close (0x81); refused first, it is
    CONNACK 0x9F / 3."""
    net, auth = _throttled_net()
    body = s("MQTT") + bytes([version, 0x02, 0, 60])
    if version == MQTT5:
        body += props(b"\x26\x00\x00\x00\x00" * 200 + b"\xff") + s("c")
    else:
        body += s(b"\xff")                                     # 3.1.1: a client id that is not UTF-8
    bad = frame(0x10, body) + b"\xff\xff"                     # trailing junk too
    c = _client_from(net, version, "192.0.2.7:4000")
    [ack] = c.send_raw(bad)
    assert ack.type == 2 and ack.reason_code == code
    assert c.closed and c.channel.decoder.buffered == 0
    assert auth.refused_throttled == 1 and net.stats.quota_refused == 1
    # the same bytes from another address are decoded: malformed, closed without a CONNACK
    other = _client_from(net, version, "192.0.2.8:4000")
    assert other.send_raw(bad) == [] and other.closed
    assert other.channel.close_reason[0] in (0x81, 0x82)
    # the throttle ends with its window
    net.advance(61)
    _client_from(net, version, "192.0.2.7:4001").connect("back")


def test_a_throttled_address_with_fewer_bytes_than_the_protocol_level_is_closed():
    net, _ = _throttled_net()
    c = _client_from(net, MQTT5, "192.0.2.7:4000")
    assert c.send_raw(b"\x10\x20\x00") == [] and c.closed
