"""Codec round trips: encode -> FrameDecoder.feed gives back the same packets,
whatever way the byte stream is cut into chunks."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from brokerd.protocol import properties as P
from brokerd.protocol.codec import FrameDecoder, encode, encode_ack, encode_publish, packet_size, varint
from brokerd.protocol.errors import PacketTooLarge
from brokerd.protocol.packets import (
    MQTT5,
    MQTT31,
    MQTT311,
    PUBACK,
    PUBREL,
    Connack,
    Connect,
    Disconnect,
    Pingreq,
    Puback,
    Publish,
    Pubrel,
    Subscribe,
    SubscriptionRequest,
)

from . import strategies as s

FAST = settings(
    derandomize=True, max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def decode_all(data: bytes, version: int) -> list:
    dec = FrameDecoder(version=version)
    out = dec.feed(data)
    assert dec.buffered == 0
    assert dec.error is None
    return out


# ----------------------------------------------------------------------------- single packets


@pytest.mark.parametrize("level", [MQTT31, MQTT311, MQTT5])
@FAST
@given(data=st.data())
def test_connect_round_trip(level, data):
    pkt = data.draw(s.connects(level))
    dec = FrameDecoder()
    assert dec.feed(encode(pkt)) == [pkt]
    # decoding a CONNECT selects the body format of what follows
    assert dec.version == level


@pytest.mark.parametrize("level", [MQTT311, MQTT5])
@FAST
@given(data=st.data())
def test_every_packet_type_round_trips(level, data):
    pkt = data.draw(s.packets(level))
    assert decode_all(encode(pkt, level), level) == [pkt]


@pytest.mark.parametrize("level", [MQTT311, MQTT5])
@settings(derandomize=True, max_examples=100, deadline=None)
@given(data=st.data())
def test_byte_at_a_time_gives_the_same_packets(level, data):
    pkts = data.draw(st.lists(s.packets(level), min_size=1, max_size=4))
    stream = b"".join(encode(p, level) for p in pkts)
    dec = FrameDecoder(version=level)
    got = []
    for i in range(len(stream)):
        got.extend(dec.feed(stream[i : i + 1]))
    assert got == pkts
    assert dec.buffered == 0


@pytest.mark.parametrize("level", [MQTT311, MQTT5])
@FAST
@given(data=st.data())
def test_arbitrary_chunking_of_a_stream(level, data):
    connect = data.draw(s.connects(level))
    pkts = [connect] + data.draw(st.lists(s.packets(level), min_size=1, max_size=12))
    stream = b"".join(encode(p, level) for p in pkts)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=12)))
    dec = FrameDecoder()  # version comes from the CONNECT at the start of the stream
    got = []
    prev = 0
    for cut in [*cuts, len(stream)]:
        got.extend(dec.feed(stream[prev:cut]))
        prev = cut
    assert got == pkts
    assert dec.buffered == 0


def test_empty_feed_returns_nothing():
    dec = FrameDecoder(version=MQTT311)
    assert dec.feed(b"") == []
    assert dec.feed(b"\xc0") == []  # half a fixed header is kept
    assert dec.buffered == 1
    assert dec.feed(b"\x00") == [Pingreq()]


# ----------------------------------------------------------------------------- encodings worth pinning down


@FAST
@given(n=st.integers(0, 268_435_455))
def test_varint_is_minimal_and_round_trips(n):
    enc = varint(n)
    assert len(enc) == (1 if n < 128 else 2 if n < 16384 else 3 if n < 2_097_152 else 4)
    value, shift = 0, 0
    for b in enc:
        value |= (b & 0x7F) << shift
        shift += 7
    assert value == n
    assert packet_size(n) == 1 + len(enc) + n


@pytest.mark.parametrize("n", [3, 127, 128, 16383, 16384, 2_097_151, 2_097_152])
def test_remaining_length_boundaries(n):
    pkt = Publish("t", b"x" * (n - 3))  # topic length (2) + "t" (1) + payload = n
    data = encode(pkt, MQTT311)
    assert len(data) == packet_size(n)
    assert decode_all(data, MQTT311) == [pkt]


def test_fixed_encodings():
    assert encode(Pingreq()) == b"\xc0\x00"
    assert encode(Disconnect(), MQTT311) == b"\xe0\x00"
    assert encode(Disconnect(), MQTT5) == b"\xe0\x00"
    assert encode(Disconnect(0x04), MQTT5) == b"\xe0\x01\x04"
    assert encode(Puback(7), MQTT311) == b"\x40\x02\x00\x07"
    assert encode(Pubrel(7), MQTT311) == b"\x62\x02\x00\x07"
    assert encode_ack(PUBACK, 7, 0x10, None, MQTT5) == b"\x40\x03\x00\x07\x10"
    assert encode_ack(PUBREL, 0x1234, 0, None, MQTT5) == b"\x62\x02\x12\x34"
    # a 3.1.1 ack never carries a reason code, whatever it is given
    assert encode_ack(PUBACK, 7, 0x10, None, MQTT311) == b"\x40\x02\x00\x07"
    assert encode(Connack(True, 0), MQTT311) == b"\x20\x02\x01\x00"
    assert encode(Connack(False, 0), MQTT5) == b"\x20\x03\x00\x00\x00"
    sub = Subscribe(1, [SubscriptionRequest("a", 1, True, True, 2)])
    assert encode(sub, MQTT5) == b"\x82\x07\x00\x01\x00\x00\x01a" + bytes([0b101101])
    assert encode(sub, MQTT311) == b"\x82\x06\x00\x01\x00\x01a\x01"  # v5 options dropped for 3.1.1
    assert encode(Connect("c", protocol_level=MQTT31, keepalive=10)) == (
        b"\x10\x0f\x00\x06MQIsdp\x03\x02\x00\x0a\x00\x01c"
    )


def test_encode_publish_matches_generic_encode():
    p = Publish("a/b", b"payload", 1, True, True, 9, {P.USER_PROPERTY: [("k", "v")]})
    assert encode_publish(p, MQTT5) == encode(p, MQTT5)
    assert encode_publish(p, MQTT311) == encode(p, MQTT311)
    # 3.1.1 drops the properties
    assert decode_all(encode(p, MQTT311), MQTT311) == [Publish("a/b", b"payload", 1, True, True, 9)]


def test_user_properties_keep_order_and_duplicates():
    ups = [("a", "1"), ("a", "1"), ("b", "2"), ("a", "3")]
    p = Publish("t", b"", properties={P.USER_PROPERTY: ups})
    assert decode_all(encode(p, MQTT5), MQTT5)[0].properties[P.USER_PROPERTY] == ups


def test_multiple_subscription_identifiers_in_publish():
    p = Publish("t", b"", properties={P.SUBSCRIPTION_IDENTIFIER: [1, 268_435_455, 77]})
    assert decode_all(encode(p, MQTT5), MQTT5) == [p]


def test_unicode_topic_and_payload_untouched():
    topic = "日本/😀/ü/\u200b"
    p = Publish(topic, "😀".encode() + b"\xff\x00", 2, False, False, 65535)
    assert decode_all(encode(p, MQTT5), MQTT5) == [p]


def test_decoder_accepts_bytearray_and_memoryview_chunks():
    data = encode(Publish("t", b"abc", 1, packet_id=3), MQTT311)
    dec = FrameDecoder(version=MQTT311)
    out = dec.feed(bytearray(data[:3])) + dec.feed(bytes(data[3:]))
    assert [(p.topic, bytes(p.payload), p.packet_id) for p in out] == [("t", b"abc", 3)]


# ----------------------------------------------------------------------------- maximum packet size


def test_max_packet_size_is_checked_from_the_fixed_header_alone():
    # 0xFF 0xFF 0xFF 0x7F = 268,435,455: a 256 MiB PUBLISH announced in 5 bytes
    dec = FrameDecoder(max_packet_size=1024, version=MQTT311)
    with pytest.raises(PacketTooLarge) as exc:
        dec.feed(b"\x30\xff\xff\xff\x7f")
    assert exc.value.reason_code == 0x95
    assert dec.buffered == 0


def test_max_packet_size_checked_before_the_header_completes_reading_body():
    dec = FrameDecoder(max_packet_size=1024, version=MQTT311)
    # header says 2000 bytes of body; only 10 bytes of it arrived
    with pytest.raises(PacketTooLarge):
        dec.feed(b"\x30" + varint(2000) + b"\x00\x01t" + b"x" * 7)
    assert dec.buffered == 0


@pytest.mark.parametrize("version", [MQTT311, MQTT5])
def test_max_packet_size_counts_the_whole_packet(version):
    pkt = Publish("t", b"x" * 100)
    data = encode(pkt, version)
    assert FrameDecoder(max_packet_size=len(data), version=version).feed(data) == [pkt]
    with pytest.raises(PacketTooLarge):
        FrameDecoder(max_packet_size=len(data) - 1, version=version).feed(data)


def test_buffer_stays_bounded_while_a_large_packet_trickles_in():
    dec = FrameDecoder(max_packet_size=10_000, version=MQTT311)
    pkt = Publish("t", b"y" * 9000)
    data = encode(pkt, MQTT311)
    got = []
    for i in range(0, len(data), 1000):
        got += dec.feed(data[i : i + 1000])
        assert dec.buffered <= 10_000
    assert got == [pkt]


def test_too_large_packet_after_good_ones_is_deferred():
    """A stream with small packets then one announcing too much: the small ones come out."""
    ok = encode(Pingreq())
    dec = FrameDecoder(max_packet_size=64, version=MQTT311)
    out = dec.feed(ok + ok + b"\x30\x80\x01")  # 128 bytes announced
    assert out == [Pingreq(), Pingreq()]
    assert isinstance(dec.error, PacketTooLarge)
    with pytest.raises(PacketTooLarge):
        dec.feed(b"")


def test_connect_of_every_level_sets_decoder_version():
    for level in (MQTT31, MQTT311, MQTT5):
        dec = FrameDecoder()
        c = Connect("x", protocol_level=level, protocol_name="MQIsdp" if level == MQTT31 else "MQTT")
        pub = Publish("t", b"p", properties={P.CONTENT_TYPE: "x"} if level == MQTT5 else None)
        assert dec.feed(encode(c) + encode(pub, level)) == [c, pub]
