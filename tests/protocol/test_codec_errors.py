"""Malformed and forbidden input: each maps to the exception (and so the MQTT 5
reason code) the spec asks for.

Where the spec names the error class, the exact code is asserted:
- "Malformed Packet" (0x81) -> ``MalformedPacket``;
- "Protocol Error" (0x82) -> ``RemoteProtocolError`` that is not a ``MalformedPacket``.
Where the spec only says MUST/MUST NOT without naming a class (packet identifier 0,
the will flags, the 3.1.1-only rules), either code is accepted: both close the
connection, which is all 3.1.1 asks.
"""

import pytest

from brokerd.protocol import properties as P
from brokerd.protocol.codec import FrameDecoder, UnsupportedProtocolVersion, encode
from brokerd.protocol.errors import MalformedPacket, PacketTooLarge, RemoteProtocolError
from brokerd.protocol.packets import (
    MQTT5,
    MQTT311,
    Auth,
    Connack,
    Connect,
    Disconnect,
    Pingreq,
    Pingresp,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    SubscriptionRequest,
    Unsuback,
    Unsubscribe,
)

from .wire import EITHER, MALFORMED, PROTOCOL, frame, props, s


def connect_body(flags: int, payload: bytes, name="MQTT", level=4, keepalive=60, properties=b"") -> bytes:
    return s(name) + bytes([level, flags]) + keepalive.to_bytes(2, "big") + properties + payload


# (version the decoder runs at, bytes, expected codes)
CASES = {
    # --- fixed header
    "reserved packet type 0": (MQTT311, b"\x00\x00", {MALFORMED}),
    "reserved packet type 0 (v5)": (MQTT5, b"\x00\x00", {MALFORMED}),
    "remaining length of 5 bytes": (MQTT311, b"\x30\xff\xff\xff\xff\x01" + b"\x00" * 8, {MALFORMED}),
    "remaining length of 5 bytes, header only": (MQTT311, b"\x30\x80\x80\x80\x80", {MALFORMED}),
    # --- PUBLISH
    "PUBLISH QoS 3": (MQTT311, frame(0x36, s("t") + b"\x00\x01"), {MALFORMED}),
    "PUBLISH QoS 3 (v5)": (MQTT5, frame(0x36, s("t") + b"\x00\x01\x00"), {MALFORMED}),
    "PUBLISH DUP on QoS 0": (MQTT311, frame(0x38, s("t")), EITHER),
    "PUBLISH DUP on QoS 0 (v5)": (MQTT5, frame(0x38, s("t") + b"\x00"), EITHER),
    "PUBLISH topic invalid UTF-8": (MQTT311, frame(0x30, b"\x00\x02\xc3\x28"), {MALFORMED}),
    "PUBLISH topic with a UTF-16 surrogate": (MQTT311, frame(0x30, b"\x00\x03\xed\xa0\x80"), {MALFORMED}),
    "PUBLISH topic overlong encoding": (MQTT311, frame(0x30, b"\x00\x02\xc0\xaf"), {MALFORMED}),
    "PUBLISH topic with U+0000": (MQTT311, frame(0x30, b"\x00\x03a\x00b"), {MALFORMED}),
    "PUBLISH topic runs past the packet": (MQTT311, frame(0x30, b"\x00\x05ab"), {MALFORMED}),
    "PUBLISH of 1 byte": (MQTT311, frame(0x30, b"\x00"), {MALFORMED}),
    "PUBLISH QoS 1 without packet id": (MQTT311, frame(0x32, s("t") + b"\x00"), {MALFORMED}),
    "PUBLISH QoS 1 packet id 0": (MQTT311, frame(0x32, s("t") + b"\x00\x00"), EITHER),
    "PUBLISH QoS 2 packet id 0 (v5)": (MQTT5, frame(0x34, s("t") + b"\x00\x00\x00"), EITHER),
    "PUBLISH v5 without property length": (MQTT5, frame(0x30, s("t")), {MALFORMED}),
    "PUBLISH v5 duplicate property": (
        MQTT5,
        frame(0x30, s("t") + props(b"\x01\x00", b"\x01\x01")),
        {PROTOCOL},
    ),
    "PUBLISH v5 duplicate topic alias": (
        MQTT5,
        frame(0x30, s("t") + props(b"\x23\x00\x01", b"\x23\x00\x01")),
        {PROTOCOL},
    ),
    "PUBLISH v5 property not allowed (session expiry)": (
        MQTT5,
        frame(0x30, s("t") + props(b"\x11\x00\x00\x00\x01")),
        {MALFORMED},
    ),
    "PUBLISH v5 property not allowed (will delay)": (
        MQTT5,
        frame(0x30, s("t") + props(b"\x18\x00\x00\x00\x01")),
        {MALFORMED},
    ),
    "PUBLISH v5 unknown property 0x7f": (MQTT5, frame(0x30, s("t") + props(b"\x7f\x00")), {MALFORMED}),
    "PUBLISH v5 property block runs past packet": (MQTT5, frame(0x30, s("t") + b"\x05\x01"), {MALFORMED}),
    "PUBLISH v5 property value runs past block": (
        MQTT5,
        frame(0x30, s("t") + b"\x02\x02\x00" + b"\x00\x00\x00"),
        {MALFORMED},
    ),
    "PUBLISH v5 user property invalid UTF-8": (
        MQTT5,
        frame(0x30, s("t") + props(b"\x26" + s(b"\xff") + s("v"))),
        {MALFORMED},
    ),
    "PUBLISH v5 user property with U+0000": (
        MQTT5,
        frame(0x30, s("t") + props(b"\x26" + s("k") + s("\x00"))),
        {MALFORMED},
    ),
    "PUBLISH v5 content type with U+0000": (
        MQTT5,
        frame(0x30, s("t") + props(b"\x03" + s("a\x00"))),
        {MALFORMED},
    ),
    "PUBLISH v5 subscription identifier varint of 5 bytes": (
        MQTT5,
        frame(0x30, s("t") + props(b"\x0b\xff\xff\xff\xff\x01")),
        {MALFORMED},
    ),
    # --- CONNECT
    "CONNECT reserved flag": (0, frame(0x10, connect_body(0x03, s("c"))), {MALFORMED}),
    "CONNECT reserved flag (v5)": (
        0,
        frame(0x10, connect_body(0x03, b"\x00" + s("c"), level=5)),
        {MALFORMED},
    ),
    "CONNECT will QoS without will flag": (0, frame(0x10, connect_body(0x0A, s("c"))), EITHER),
    "CONNECT will retain without will flag": (0, frame(0x10, connect_body(0x22, s("c"))), EITHER),
    "CONNECT will QoS 3": (0, frame(0x10, connect_body(0x1E, s("c") + s("w") + s(b"x"))), {MALFORMED}),
    "CONNECT will QoS 3 (v5)": (
        0,
        frame(0x10, connect_body(0x1E, b"\x00" + s("c") + b"\x00" + s("w") + s(b"x"), level=5)),
        {MALFORMED},
    ),
    "CONNECT password without user name (3.1.1)": (
        0,
        frame(0x10, connect_body(0x42, s("c") + s(b"pw"))),
        EITHER,
    ),
    "CONNECT password without user name (3.1)": (
        0,
        frame(0x10, connect_body(0x42, s("c") + s(b"pw"), name="MQIsdp", level=3)),
        EITHER,
    ),
    "CONNECT user name flag without user name": (0, frame(0x10, connect_body(0x82, s("c"))), {MALFORMED}),
    "CONNECT trailing bytes": (0, frame(0x10, connect_body(0x02, s("c") + b"x")), {MALFORMED}),
    "CONNECT truncated client id": (0, frame(0x10, connect_body(0x02, b"\x00\x05ab")), {MALFORMED}),
    "CONNECT truncated before keepalive": (0, frame(0x10, s("MQTT") + b"\x04\x02\x00"), {MALFORMED}),
    "CONNECT client id invalid UTF-8": (0, frame(0x10, connect_body(0x02, s(b"\xfe"))), {MALFORMED}),
    "CONNECT user name with U+0000": (0, frame(0x10, connect_body(0x82, s("c") + s("u\x00"))), {MALFORMED}),
    "CONNECT will topic with U+0000": (
        0,
        frame(0x10, connect_body(0x06, s("c") + s("w\x00") + s(b"x"))),
        {MALFORMED},
    ),
    "CONNECT protocol name with U+0000": (
        0,
        frame(0x10, connect_body(0x02, s("c"), name="MQ\x00T")),
        {MALFORMED},
    ),
    "CONNECT v5 duplicate property": (
        0,
        frame(
            0x10,
            connect_body(
                0x02, s("c"), level=5, properties=props(b"\x11\x00\x00\x00\x01", b"\x11\x00\x00\x00\x02")
            ),
        ),
        {PROTOCOL},
    ),
    "CONNECT v5 property not allowed (topic alias)": (
        0,
        frame(0x10, connect_body(0x02, s("c"), level=5, properties=props(b"\x23\x00\x01"))),
        {MALFORMED},
    ),
    "CONNECT v5 will property in CONNECT (will delay)": (
        0,
        frame(0x10, connect_body(0x02, s("c"), level=5, properties=props(b"\x18\x00\x00\x00\x01"))),
        {MALFORMED},
    ),
    "CONNECT v5 CONNECT property in will (session expiry)": (
        0,
        frame(
            0x10,
            connect_body(
                0x06, s("c") + props(b"\x11\x00\x00\x00\x01") + s("w") + s(b""), level=5, properties=b"\x00"
            ),
        ),
        {MALFORMED},
    ),
    # --- SUBSCRIBE
    "SUBSCRIBE without topics": (MQTT311, frame(0x82, b"\x00\x01"), EITHER),
    "SUBSCRIBE requested QoS 3": (MQTT311, frame(0x82, b"\x00\x01" + s("a") + b"\x03"), {MALFORMED}),
    "SUBSCRIBE reserved bits in requested QoS byte": (
        MQTT311,
        frame(0x82, b"\x00\x01" + s("a") + b"\x04"),
        {MALFORMED},
    ),
    "SUBSCRIBE packet id 0": (MQTT311, frame(0x82, b"\x00\x00" + s("a") + b"\x00"), EITHER),
    "SUBSCRIBE topic without options byte": (MQTT311, frame(0x82, b"\x00\x01" + s("a")), {MALFORMED}),
    "SUBSCRIBE filter invalid UTF-8": (MQTT311, frame(0x82, b"\x00\x01" + s(b"\xc3") + b"\x00"), {MALFORMED}),
    "SUBSCRIBE v5 reserved option bits (bit 6)": (
        MQTT5,
        frame(0x82, b"\x00\x01\x00" + s("a") + b"\x40"),
        {MALFORMED},
    ),
    "SUBSCRIBE v5 reserved option bits (bit 7)": (
        MQTT5,
        frame(0x82, b"\x00\x01\x00" + s("a") + b"\x80"),
        {MALFORMED},
    ),
    "SUBSCRIBE v5 packet id 0": (MQTT5, frame(0x82, b"\x00\x00\x00" + s("a") + b"\x00"), EITHER),
    "SUBSCRIBE v5 duplicate subscription identifier": (
        MQTT5,
        frame(0x82, b"\x00\x01" + props(b"\x0b\x01", b"\x0b\x02") + s("a") + b"\x00"),
        {PROTOCOL},
    ),
    "SUBSCRIBE v5 property not allowed (topic alias)": (
        MQTT5,
        frame(0x82, b"\x00\x01" + props(b"\x23\x00\x01") + s("a") + b"\x00"),
        {MALFORMED},
    ),
    # MQTT 5.0 3.8.3.1 names these two Protocol Errors, and 3.8.3 the empty payload
    "SUBSCRIBE v5 QoS 3": pytest.param(
        MQTT5,
        frame(0x82, b"\x00\x01\x00" + s("a") + b"\x03"),
        {PROTOCOL},
        ),
    "SUBSCRIBE v5 retain handling 3": pytest.param(
        MQTT5,
        frame(0x82, b"\x00\x01\x00" + s("a") + b"\x30"),
        {PROTOCOL},
        ),
    "SUBSCRIBE v5 without topics": pytest.param(
        MQTT5,
        frame(0x82, b"\x00\x01\x00"),
        {PROTOCOL},
        ),
    # --- UNSUBSCRIBE
    "UNSUBSCRIBE without topics": (MQTT311, frame(0xA2, b"\x00\x01"), EITHER),
    "UNSUBSCRIBE packet id 0": (MQTT311, frame(0xA2, b"\x00\x00" + s("a")), EITHER),
    "UNSUBSCRIBE truncated filter": (MQTT311, frame(0xA2, b"\x00\x01\x00\x09ab"), {MALFORMED}),
    "UNSUBSCRIBE v5 without topics": pytest.param(
        MQTT5,
        frame(0xA2, b"\x00\x01\x00"),
        {PROTOCOL},
        ),
    # --- acknowledgements
    "PUBACK packet id 0": (MQTT311, b"\x40\x02\x00\x00", EITHER),
    "PUBREC packet id 0 (v5)": (MQTT5, b"\x50\x02\x00\x00", EITHER),
    "PUBACK of 1 byte": (MQTT311, b"\x40\x01\x00", {MALFORMED}),
    "PUBACK 3.1.1 with a reason code": (MQTT311, b"\x40\x03\x00\x01\x00", {MALFORMED}),
    "PUBCOMP 3.1.1 with trailing bytes": (MQTT311, b"\x70\x04\x00\x01\x00\x00", {MALFORMED}),
    "PUBACK v5 property not allowed (content type)": (
        MQTT5,
        frame(0x40, b"\x00\x01\x00" + props(b"\x03" + s("x"))),
        {MALFORMED},
    ),
    "PUBREL v5 duplicate reason string": (
        MQTT5,
        frame(0x62, b"\x00\x01\x00" + props(b"\x1f" + s("x"), b"\x1f" + s("y"))),
        {PROTOCOL},
    ),
    "PUBACK v5 properties run past the packet": (MQTT5, frame(0x40, b"\x00\x01\x00\x09\x1f"), {MALFORMED}),
    # --- packets without a body
    "PINGREQ with a body": (MQTT311, b"\xc0\x01\x00", {MALFORMED}),
    "PINGRESP with a body": (MQTT5, b"\xd0\x01\x00", {MALFORMED}),
    "DISCONNECT 3.1.1 with a body": (MQTT311, b"\xe0\x01\x00", {MALFORMED}),
    "AUTH on a 3.1.1 connection": (MQTT311, b"\xf0\x00", {MALFORMED}),
    "DISCONNECT v5 property not allowed (topic alias)": (
        MQTT5,
        frame(0xE0, b"\x00" + props(b"\x23\x00\x01")),
        {MALFORMED},
    ),
    "AUTH v5 property not allowed (session expiry)": (
        MQTT5,
        frame(0xF0, b"\x18" + props(b"\x11\x00\x00\x00\x01")),
        {MALFORMED},
    ),
    # --- server-to-client packets (a client-side decoder)
    "CONNACK reserved flags": (MQTT311, b"\x20\x02\x02\x00", {MALFORMED}),
}


@pytest.mark.parametrize(("version", "data", "codes"), CASES.values(), ids=CASES.keys())
def test_malformed_input(version, data, codes):
    dec = FrameDecoder(version=version)
    with pytest.raises(RemoteProtocolError) as exc:
        dec.feed(data)
    err = exc.value
    assert err.reason_code in codes, f"{type(err).__name__}({err}) -> 0x{err.reason_code:02x}"
    # the exception class agrees with the code
    assert isinstance(err, MalformedPacket) == (err.reason_code == MALFORMED)
    assert dec.buffered == 0


@pytest.mark.parametrize(("version", "data", "codes"), CASES.values(), ids=CASES.keys())
def test_malformed_input_fed_byte_by_byte(version, data, codes):
    """The same error comes out however the bytes arrive, and not before they can be judged."""
    dec = FrameDecoder(version=version)
    with pytest.raises(RemoteProtocolError) as exc:
        for i in range(len(data)):
            assert dec.feed(data[i : i + 1]) == []
    assert exc.value.reason_code in codes


# ----------------------------------------------------------------------------- fixed-header flags


def _valid(ptype: int) -> tuple[int, bytes]:
    v = MQTT5
    samples = {
        1: (0, encode(Connect("c"))),
        2: (v, encode(Connack(False, 0), v)),
        3: (v, encode(Publish("t"), v)),
        4: (v, encode(Puback(1), v)),
        5: (v, encode(Pubrec(1), v)),
        6: (v, encode(Pubrel(1), v)),
        7: (v, encode(Pubcomp(1), v)),
        8: (v, encode(Subscribe(1, [SubscriptionRequest("a")]), v)),
        9: (v, encode(Suback(1, [0]), v)),
        10: (v, encode(Unsubscribe(1, ["a"]), v)),
        11: (v, encode(Unsuback(1, [0]), v)),
        12: (v, encode(Pingreq(), v)),
        13: (v, encode(Pingresp(), v)),
        14: (v, encode(Disconnect(), v)),
        15: (v, encode(Auth(), v)),
    }
    return samples[ptype]


# Required flags [MQTT 3.1.1 2.2.2 / 5.0 2.1.3]: PUBREL, SUBSCRIBE, UNSUBSCRIBE 0b0010, the others 0.
_REQUIRED = {1: 0, 2: 0, 4: 0, 5: 0, 6: 2, 7: 0, 8: 2, 9: 0, 10: 2, 11: 0, 12: 0, 13: 0, 14: 0, 15: 0}


@pytest.mark.parametrize("ptype", sorted(_REQUIRED))
def test_valid_flags_decode(ptype):
    version, data = _valid(ptype)
    assert data[0] & 0x0F == _REQUIRED[ptype]
    assert len(FrameDecoder(version=version).feed(data)) == 1


@pytest.mark.parametrize("flags", range(16))
@pytest.mark.parametrize("ptype", sorted(_REQUIRED))
def test_bad_fixed_header_flags(ptype, flags):
    if flags == _REQUIRED[ptype]:
        return
    version, data = _valid(ptype)
    bad = bytes([(ptype << 4) | flags]) + data[1:]
    with pytest.raises(MalformedPacket):
        FrameDecoder(version=version).feed(bad)


# ----------------------------------------------------------------------------- CONNECT protocol name / level


@pytest.mark.parametrize(
    ("name", "level"), [("MQTT", 3), ("MQTT", 6), ("MQTT", 0), ("MQTT", 255), ("MQIsdp", 4), ("MQIsdp", 5)]
)
def test_unsupported_protocol_level(name, level):
    with pytest.raises(UnsupportedProtocolVersion) as exc:
        FrameDecoder().feed(frame(0x10, connect_body(0x02, s("c"), name=name, level=level)))
    assert exc.value.reason_code == 0x84
    assert exc.value.level == level


@pytest.mark.parametrize("name", ["MQTX", "mqtt", "", "MQIsdpX", "MQ"])
def test_unknown_protocol_name(name):
    with pytest.raises(RemoteProtocolError) as exc:
        FrameDecoder().feed(frame(0x10, connect_body(0x02, s("c"), name=name)))
    assert not isinstance(exc.value, UnsupportedProtocolVersion)
    assert exc.value.reason_code in EITHER


def test_password_without_user_name_is_fine_in_v5():
    data = frame(0x10, connect_body(0x42, b"\x00" + s("c") + s(b"pw"), level=5))
    [c] = FrameDecoder().feed(data)
    assert (c.username, c.password) == (None, b"pw")


def test_empty_strings_are_valid():
    # zero-length strings are fine in the codec; whether they are acceptable is up to the channel
    data = frame(0x10, connect_body(0xC2, s("") + s("") + s(b"")))
    [c] = FrameDecoder().feed(data)
    assert (c.client_id, c.username, c.password) == ("", "", b"")


# ----------------------------------------------------------------------------- deferred errors


def test_good_packets_before_garbage_are_returned():
    good = encode(Publish("a", b"1"), MQTT311) + encode(Pingreq())
    dec = FrameDecoder(version=MQTT311)
    out = dec.feed(good + b"\x36\x03\x00\x01t")  # QoS 3 PUBLISH after two good packets
    assert out == [Publish("a", b"1"), Pingreq()]
    assert isinstance(dec.error, MalformedPacket)
    assert dec.buffered == 0
    # the error is raised on the next feed, whatever it brings
    with pytest.raises(MalformedPacket):
        dec.feed(encode(Pingreq()))


def test_deferred_error_across_feeds():
    dec = FrameDecoder(version=MQTT311)
    data = encode(Pingreq()) + b"\x00\x00"
    assert dec.feed(data[:1]) == []
    assert dec.feed(data[1:]) == [Pingreq()]
    assert isinstance(dec.error, MalformedPacket)


def test_error_without_good_packets_raises_at_once():
    dec = FrameDecoder(version=MQTT311)
    with pytest.raises(MalformedPacket):
        dec.feed(b"\x00\x00" + encode(Pingreq()))
    assert dec.error is None


def test_too_large_after_good_packet_is_deferred():
    dec = FrameDecoder(max_packet_size=100, version=MQTT311)
    assert dec.feed(encode(Pingreq()) + b"\x30\xff\x7f") == [Pingreq()]
    assert isinstance(dec.error, PacketTooLarge)


def test_error_code_of_duplicate_property_is_protocol_error_not_malformed():
    data = frame(0x30, s("t") + props(b"\x02\x00\x00\x00\x01", b"\x02\x00\x00\x00\x01"))
    with pytest.raises(RemoteProtocolError) as exc:
        FrameDecoder(version=MQTT5).feed(data)
    assert type(exc.value) is RemoteProtocolError
    assert exc.value.reason_code == PROTOCOL
    assert "message_expiry_interval" in str(exc.value)


def test_every_property_is_refused_outside_its_packets():
    """Each property id, in a PUBLISH where it does not belong, is Malformed (5.0 2.2.2.2)."""
    values = {
        P.BYTE: b"\x00",
        P.U16: b"\x00\x01",
        P.U32: b"\x00\x00\x00\x01",
        P.VARINT: b"\x01",
        P.UTF8: s("x"),
        P.BINARY: s(b"x"),
        P.PAIR: s("k") + s("v"),
    }
    for ident, wire in P.TYPES.items():
        data = frame(0x30, s("t") + props(bytes([ident]) + values[wire]))
        dec = FrameDecoder(version=MQTT5)
        if P.PUBLISH in P.ALLOWED[ident]:
            assert len(dec.feed(data)) == 1
        else:
            with pytest.raises(MalformedPacket):
                dec.feed(data)
