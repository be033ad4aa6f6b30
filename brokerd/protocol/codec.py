"""MQTT 3.1 / 3.1.1 / 5.0 wire codec (sans-IO).

``FrameDecoder.feed(data)`` returns the complete packets in ``data`` (plus
whatever was left over from the previous call) and keeps only the incomplete
tail. The fixed header is checked against ``max_packet_size`` before the body
is buffered, so a peer cannot make us hold more than one maximum-size packet.

Before a CONNECT has been decoded (``version`` 0) the limit is
``max_connect_size`` instead: the peer is not authenticated yet, and a
CONNECT is a few hundred bytes (issue 16: 1,500 sockets each holding a 1 MB
CONNECT short of its last 10 bytes took 1.5 GB). A CONNECT refused that way
from its fixed header still sets ``version`` when its protocol level is in
the bytes at hand, so that a 5.0 client can be told why (CONNACK 0x95).

MQTT 5 User Properties are the one property the spec lets a packet repeat
without limit, and a 1 MiB packet holds 209,000 empty ones (200 ms of
decoding in the generic loop): they are decoded inline and at most
MAX_USER_PROPERTIES are accepted per packet (a CONNECT's and its will's
together); more is refused as ``PacketTooLarge`` (0x95: the packet is well
formed, so not 0x81, and it is larger than this server accepts -- the spec
has no code closer to "too many properties").

``encode(packet, version)`` returns bytes. The per-message paths
(``encode_publish`` and the 4-byte acks) are written out by hand; the rest
share a generic body builder.

Written for speed on the broker's hot path; the ``mqtt-codec`` package serves
as the independent reference in the differential tests for 3.1.1.
"""

from struct import Struct

from . import properties as P
from .errors import MalformedPacket, PacketTooLarge, ProtocolError, RemoteProtocolError
from .packets import (
    AUTH,
    CONNACK,
    CONNECT,
    DISCONNECT,
    MQTT5,
    MQTT31,
    MQTT311,
    PINGREQ,
    PINGRESP,
    PUBACK,
    PUBCOMP,
    PUBLISH,
    PUBREC,
    PUBREL,
    SUBACK,
    SUBSCRIBE,
    UNSUBACK,
    UNSUBSCRIBE,
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
    Will,
)

MAX_REMAINING_LENGTH = 268_435_455
MAX_PACKET_SIZE = MAX_REMAINING_LENGTH + 5
MAX_USER_PROPERTIES = 256       # per packet; other brokers document 10-20 (Alibaba IoT: 20)
# Topic names and filters have at most this many levels (200 "/"), Mosquitto's limit. Each level of a
# subscription or a retained message is a node of a tree: a 64 KiB filter of 32,000 levels cost ~8 MB
# and a 1 MiB SUBSCRIBE of 15 of them ~120 MB, before the limit.
MAX_TOPIC_LEVELS = 201


def too_deep(topic: str) -> bool:
    """Has ``topic`` (a name or a filter) more than MAX_TOPIC_LEVELS levels?"""
    return len(topic) >= MAX_TOPIC_LEVELS and topic.count("/") >= MAX_TOPIC_LEVELS

_U16 = Struct(">H")
_U32 = Struct(">I")
_PUB_HEAD1 = Struct(">BBH")     # PUBLISH fixed header (remaining length < 128), topic length
_PUB_HEAD2 = Struct(">BBBH")    # the same, remaining length < 16,384
_PINGREQ = Pingreq()
_PINGRESP = Pingresp()

# Required fixed-header flags per packet type (PUBLISH carries its own).
_FLAGS = {
    CONNECT: 0, CONNACK: 0, PUBACK: 0, PUBREC: 0, PUBREL: 2, PUBCOMP: 0, SUBSCRIBE: 2, SUBACK: 0,
    UNSUBSCRIBE: 2, UNSUBACK: 0, PINGREQ: 0, PINGRESP: 0, DISCONNECT: 0, AUTH: 0,
}


# ----------------------------------------------------------------------------
# primitive readers: (buf, i, end) -> (value, next_i); raise MalformedPacket
# ----------------------------------------------------------------------------

def _u8(buf, i, end):
    if i >= end:
        raise MalformedPacket("packet too short")
    return buf[i], i + 1


def _u16(buf, i, end):
    if i + 2 > end:
        raise MalformedPacket("packet too short")
    return (buf[i] << 8) | buf[i + 1], i + 2


def _u32(buf, i, end):
    if i + 4 > end:
        raise MalformedPacket("packet too short")
    return _U32.unpack_from(buf, i)[0], i + 4


def _varint(buf, i, end):
    value = 0
    shift = 0
    for _ in range(4):
        if i >= end:
            raise MalformedPacket("variable byte integer runs past the packet")
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            if not b and shift:
                raise MalformedPacket("variable byte integer not in its shortest form")
            return value, i
        shift += 7
    raise MalformedPacket("variable byte integer longer than 4 bytes")


def _binary(buf, i, end):
    n, i = _u16(buf, i, end)
    j = i + n
    if j > end:
        raise MalformedPacket("length-prefixed field runs past the packet")
    return bytes(buf[i:j]), j


def _utf8(buf, i, end):
    n, i = _u16(buf, i, end)
    j = i + n
    if j > end:
        raise MalformedPacket("string runs past the packet")
    return check_utf8(buf[i:j]), j


def check_utf8(raw) -> str:
    """Decode an MQTT UTF-8 string: well-formed, no surrogates, no U+0000."""
    try:
        s = raw.decode("utf-8") if type(raw) is bytes else bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedPacket("invalid UTF-8 string")
    if "\x00" in s:
        raise MalformedPacket("string contains U+0000")
    return s


def _text(buf, i, j) -> str:
    """The UTF-8 string in ``buf[i:j]`` (see ``check_utf8``)."""
    return check_utf8(buf[i:j]) if j > i else ""


def _properties(buf, i, end, kind, max_users=MAX_USER_PROPERTIES):
    """Decode a property block; returns (dict or None, next_i).

    User Properties (identifier 0x26, one byte) are decoded inline, at most
    ``max_users`` of them; the other properties, each allowed once, go
    through the generic path.
    """
    length, i = _varint(buf, i, end)
    if length == 0:
        return None, i
    stop = i + length
    if stop > end:
        raise MalformedPacket("properties run past the packet")
    props = {}
    users = None
    types = P.TYPES
    allowed = P.ALLOWED
    while i < stop:
        if buf[i] == 0x26:
            if users is None:
                users = props[0x26] = []
            if len(users) >= max_users:
                raise PacketTooLarge(f"more than {MAX_USER_PROPERTIES} user properties in one packet")
            k = i + 3
            if k > stop:
                raise MalformedPacket("user property runs past the properties")
            v = k + ((buf[i + 1] << 8) | buf[i + 2]) + 2
            if v > stop:
                raise MalformedPacket("user property runs past the properties")
            i = v + ((buf[v - 2] << 8) | buf[v - 1])
            if i > stop:
                raise MalformedPacket("user property runs past the properties")
            users.append((_text(buf, k, v - 2), _text(buf, v, i)))
            continue
        ident, i = _varint(buf, i, stop)
        wire = types.get(ident)
        if wire is None or kind not in allowed[ident]:
            raise MalformedPacket(f"property 0x{ident:02x} not valid in this packet")
        if wire == P.BYTE:
            value, i = _u8(buf, i, stop)
        elif wire == P.U16:
            value, i = _u16(buf, i, stop)
        elif wire == P.U32:
            value, i = _u32(buf, i, stop)
        elif wire == P.VARINT:
            value, i = _varint(buf, i, stop)
        elif wire == P.UTF8:
            value, i = _utf8(buf, i, stop)
        else:
            value, i = _binary(buf, i, stop)
        if ident == P.SUBSCRIPTION_IDENTIFIER and kind == P.PUBLISH:
            props.setdefault(ident, []).append(value)
        elif ident in props:
            raise RemoteProtocolError(f"property {P.NAMES[ident]} included more than once")
        else:
            props[ident] = value
    if i != stop:
        raise MalformedPacket("property length mismatch")
    return props, i


def decode_properties(buf, start, end, allowed):
    """A property block at ``buf[start:end]`` of a packet kind (``properties.PUBLISH``, ``WILL``...):
    (dict or None, the index after it). For blocks kept apart from their packet: stored wills,
    stored and forwarded messages."""
    return _properties(buf, start, end, allowed)


def connect_level(buf, start: int, end: int) -> int:
    """The protocol level of a CONNECT whose variable header starts at
    ``buf[start]`` (``end``: how far ``buf`` goes); 0 when it is not there yet
    or not an MQTT protocol name and level brokerd speaks."""
    if start + 2 > end:
        return 0
    n = (buf[start] << 8) | buf[start + 1]
    j = start + 2 + n
    if n not in (4, 6) or j >= end:
        return 0
    name = bytes(buf[start + 2:j])
    level = buf[j]
    if (name == b"MQTT" and level in (MQTT311, MQTT5)) or (name == b"MQIsdp" and level == MQTT31):
        return level
    return 0


# ----------------------------------------------------------------------------
# packet body decoders: (decoder, flags, buf, i, end) -> packet
# ----------------------------------------------------------------------------

def _d_connect(dec, flags, buf, i, end):
    if i + 10 <= end and buf[i:i + 6] == b"\x00\x04MQTT":
        # the usual header (3.1.1, 5.0) at once: the name, the level, the flags, the keepalive
        name = "MQTT"
        level = buf[i + 6]
        if level not in (MQTT311, MQTT5):
            raise UnsupportedProtocolVersion(level)
        cflags = buf[i + 7]
        keepalive = (buf[i + 8] << 8) | buf[i + 9]
        i += 10
    else:
        name, i = _utf8(buf, i, end)
        level, i = _u8(buf, i, end)
        if name == "MQTT":
            if level not in (MQTT311, MQTT5):
                raise UnsupportedProtocolVersion(level)
        elif name == "MQIsdp":
            if level != MQTT31:
                raise UnsupportedProtocolVersion(level)
        else:
            raise RemoteProtocolError(f"unknown protocol name {name!r}")
        cflags, i = _u8(buf, i, end)
        keepalive, i = _u16(buf, i, end)
    if cflags & 0x01:
        raise MalformedPacket("CONNECT reserved flag is set")
    dec.version = level
    props = None
    if level == MQTT5:
        props, i = _properties(buf, i, end, P.CONNECT)
    client_id, i = _utf8(buf, i, end)
    will = None
    will_qos = (cflags >> 3) & 3
    will_retain = bool(cflags & 0x20)
    if cflags & 0x04:
        if will_qos == 3:
            raise MalformedPacket("will QoS 3")
        wprops = None
        if level == MQTT5:
            used = len(props.get(P.USER_PROPERTY, ())) if props else 0
            wprops, i = _properties(buf, i, end, P.WILL, MAX_USER_PROPERTIES - used)
        wtopic, i = _utf8(buf, i, end)
        wpayload, i = _binary(buf, i, end)
        will = Will(wtopic, wpayload, will_qos, will_retain, wprops)
    elif will_qos or will_retain:
        raise MalformedPacket("will QoS/retain set without the will flag")
    username = password = None
    if cflags & 0x80:
        username, i = _utf8(buf, i, end)
    elif cflags & 0x40 and level != MQTT5:
        raise MalformedPacket("password flag set without the user name flag")
    if cflags & 0x40:
        password, i = _binary(buf, i, end)
    if i != end:
        raise MalformedPacket("trailing bytes after CONNECT payload")
    return Connect(client_id, bool(cflags & 0x02), keepalive, username, password, will, level, props, name)


def _d_connack(dec, flags, buf, i, end):
    ack, i = _u8(buf, i, end)
    if ack & 0xFE:
        raise MalformedPacket("CONNACK reserved flags set")
    code, i = _u8(buf, i, end)
    props = None
    if dec.version == MQTT5:
        props, i = _properties(buf, i, end, P.CONNACK)
    return Connack(bool(ack & 1), code, props)


def _d_ack(cls, kind):
    def decode(dec, flags, buf, i, end):
        pid, i = _u16(buf, i, end)
        if pid == 0:
            raise RemoteProtocolError("packet identifier 0")
        if dec.version != MQTT5:
            if i != end:
                raise MalformedPacket("acknowledgement longer than 2 bytes")
            return cls(pid)
        code = 0
        props = None
        if i < end:
            code, i = _u8(buf, i, end)
            if i < end:
                props, i = _properties(buf, i, end, kind)
        if i != end:
            raise MalformedPacket("trailing bytes after acknowledgement")
        return cls(pid, code, props)

    return decode


def _d_subscribe(dec, flags, buf, i, end):
    pid, i = _u16(buf, i, end)
    if pid == 0:
        raise MalformedPacket("packet identifier 0")
    props = None
    v5 = dec.version == MQTT5
    if v5:
        props, i = _properties(buf, i, end, P.SUBSCRIBE)
    topics = []
    while i < end:
        filt, i = _utf8(buf, i, end)
        opts, i = _u8(buf, i, end)
        qos = opts & 3
        if qos == 3:
            # 3.1.1 [MQTT-3.8.3-4]: malformed; 5.0 3.8.3.1: protocol error
            raise (RemoteProtocolError if v5 else MalformedPacket)("subscription QoS 3")
        if v5:
            if opts & 0xC0:
                raise MalformedPacket("subscription options reserved bits set")
            rh = (opts >> 4) & 3
            if rh == 3:
                raise RemoteProtocolError("retain handling 3")
            topics.append(SubscriptionRequest(filt, qos, bool(opts & 4), bool(opts & 8), rh))
        else:
            if opts & 0xFC:
                raise MalformedPacket("requested QoS byte reserved bits set")
            topics.append(SubscriptionRequest(filt, qos))
    if not topics:
        raise RemoteProtocolError("SUBSCRIBE without topic filters")
    return Subscribe(pid, topics, props)


def _d_suback(dec, flags, buf, i, end):
    pid, i = _u16(buf, i, end)
    props = None
    if dec.version == MQTT5:
        props, i = _properties(buf, i, end, P.SUBACK)
    return Suback(pid, list(buf[i:end]), props)


def _d_unsubscribe(dec, flags, buf, i, end):
    pid, i = _u16(buf, i, end)
    if pid == 0:
        raise MalformedPacket("packet identifier 0")
    props = None
    if dec.version == MQTT5:
        props, i = _properties(buf, i, end, P.UNSUBSCRIBE)
    topics = []
    while i < end:
        filt, i = _utf8(buf, i, end)
        topics.append(filt)
    if not topics:
        raise RemoteProtocolError("UNSUBSCRIBE without topic filters")
    return Unsubscribe(pid, topics, props)


def _d_unsuback(dec, flags, buf, i, end):
    pid, i = _u16(buf, i, end)
    props = None
    codes = []
    if dec.version == MQTT5:
        props, i = _properties(buf, i, end, P.UNSUBACK)
        codes = list(buf[i:end])
    elif i != end:
        raise MalformedPacket("trailing bytes after UNSUBACK")
    return Unsuback(pid, codes, props)


def _d_empty(packet):
    def decode(dec, flags, buf, i, end):
        if i != end:
            raise MalformedPacket("unexpected payload")
        return packet

    return decode


def _d_reason_only(cls, kind):
    def decode(dec, flags, buf, i, end):
        if dec.version != MQTT5:
            if i != end:
                raise MalformedPacket("unexpected payload")
            return cls()
        code = 0
        props = None
        if i < end:
            code, i = _u8(buf, i, end)
            if i < end:
                props, i = _properties(buf, i, end, kind)
        if i != end:
            raise MalformedPacket("trailing bytes")
        return cls(code, props)

    return decode


def _d_auth(dec, flags, buf, i, end):
    if dec.version != MQTT5:
        raise MalformedPacket("AUTH is an MQTT 5 packet")
    return _d_reason_only(Auth, P.AUTH)(dec, flags, buf, i, end)


def _d_reserved(dec, flags, buf, i, end):
    raise MalformedPacket("reserved packet type 0")


_DECODERS = [
    _d_reserved,
    _d_connect,
    _d_connack,
    None,  # PUBLISH: inline in feed()
    _d_ack(Puback, P.PUBACK),
    _d_ack(Pubrec, P.PUBREC),
    _d_ack(Pubrel, P.PUBREL),
    _d_ack(Pubcomp, P.PUBCOMP),
    _d_subscribe,
    _d_suback,
    _d_unsubscribe,
    _d_unsuback,
    _d_empty(_PINGREQ),
    _d_empty(_PINGRESP),
    _d_reason_only(Disconnect, P.DISCONNECT),
    _d_auth,
]


class UnsupportedProtocolVersion(RemoteProtocolError):
    """CONNECT names a protocol level we do not speak (CONNACK 0x84 / 1)."""

    reason_code = 0x84

    def __init__(self, level):
        super().__init__(f"unsupported protocol level {level}")
        self.level = level


class FrameDecoder:
    """Splits a byte stream into MQTT packets.

    ``version`` selects the 3.x or 5.0 body formats; decoding a CONNECT sets
    it. Errors after some complete packets were decoded are held back: the
    good packets are returned and ``error`` is set, to be raised by the
    caller (or the next ``feed``) once they have been handled.
    """

    __slots__ = ("max_packet_size", "max_connect_size", "version", "_buf", "error")

    def __init__(self, max_packet_size: int = MAX_PACKET_SIZE, version: int = 0, max_connect_size: int | None = None):
        self.max_packet_size = max_packet_size
        # the limit while no CONNECT has been decoded (version 0)
        self.max_connect_size = max_packet_size if max_connect_size is None else min(max_connect_size,
                                                                                      max_packet_size)
        self.version = version
        self._buf = b""
        self.error = None

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def discard(self) -> None:
        """Let go of the bytes of an incomplete packet (nothing more will be fed)."""
        self._buf = b""

    def peek_connect_level(self, data: bytes) -> int:
        """The protocol level of the CONNECT that the buffered bytes and ``data``
        begin (0: not yet known, or not a CONNECT), without decoding it."""
        head = self._buf[:16] + data[:16] if self._buf else data[:16]
        n = len(head)
        if n < 2 or head[0] >> 4 != CONNECT:
            return 0
        i = 1
        while i < n and i < 5 and head[i] & 0x80:
            i += 1
        return connect_level(head, i + 1, n)

    def feed(self, data: bytes) -> list:
        if self.error is not None:
            raise self.error
        buf = self._buf + data if self._buf else data
        n = len(buf)
        pos = 0
        out = []
        maxsize = self.max_packet_size if self.version else self.max_connect_size
        try:
            while n - pos >= 2:
                b0 = buf[pos]
                b = buf[pos + 1]
                if b < 0x80:
                    rl = b
                    start = pos + 2
                else:
                    rl = b & 0x7F
                    shift = 7
                    i = pos + 2
                    while True:
                        if i - pos > 4:
                            raise MalformedPacket("remaining length longer than 4 bytes")
                        if i >= n:
                            rl = -1
                            break
                        b = buf[i]
                        i += 1
                        rl |= (b & 0x7F) << shift
                        if not b & 0x80:
                            if not b:
                                raise MalformedPacket("remaining length not in its shortest form")
                            break
                        shift += 7
                    if rl < 0:
                        break
                    start = i
                end = start + rl
                if end - pos > maxsize:
                    if not self.version and b0 >> 4 == CONNECT:
                        self.version = connect_level(buf, start, n)    # for the refusal's format
                    raise PacketTooLarge(f"packet of {end - pos} bytes exceeds the maximum of {maxsize}")
                if end > n:
                    break
                ptype = b0 >> 4
                if ptype == 3:
                    # PUBLISH, inline: the per-message path.
                    qos = (b0 >> 1) & 3
                    if qos == 3:
                        raise MalformedPacket("PUBLISH with QoS 3")
                    dup = b0 & 8
                    if dup and not qos:
                        raise MalformedPacket("DUP set on a QoS 0 PUBLISH")
                    if start + 2 > end:
                        raise MalformedPacket("PUBLISH too short")
                    j = start + 2 + ((buf[start] << 8) | buf[start + 1])
                    if j > end:
                        raise MalformedPacket("topic runs past the packet")
                    try:
                        topic = buf[start + 2:j].decode("utf-8")
                    except UnicodeDecodeError:
                        raise MalformedPacket("topic name is not valid UTF-8")
                    if "\x00" in topic:
                        raise MalformedPacket("topic name contains U+0000")
                    pid = 0
                    if qos:
                        if j + 2 > end:
                            raise MalformedPacket("PUBLISH too short")
                        pid = (buf[j] << 8) | buf[j + 1]
                        if not pid:
                            raise MalformedPacket("packet identifier 0")
                        j += 2
                    props = None
                    if self.version == MQTT5:
                        props, j = _properties(buf, j, end, P.PUBLISH)
                    pkt = Publish(topic, buf[j:end], qos, bool(b0 & 1), bool(dup), pid, props)
                    if not qos and not b0 & 1:
                        # Already the bytes every subscriber of this protocol family gets
                        # (QoS 0, no retain flag): forward them instead of re-encoding.
                        if self.version != MQTT5:
                            pkt.enc3 = buf[pos:end]
                        elif props is None:
                            pkt.enc5 = buf[pos:end]
                    out.append(pkt)
                else:
                    if ptype == 0:
                        raise MalformedPacket("reserved packet type 0")
                    if (b0 & 0x0F) != _FLAGS[ptype]:
                        raise MalformedPacket(f"invalid fixed header flags for packet type {ptype}")
                    out.append(_DECODERS[ptype](self, b0 & 0x0F, buf, start, end))
                    if ptype == CONNECT:
                        maxsize = self.max_packet_size
                pos = end
        except ProtocolError as exc:
            self._buf = b""
            if out:
                self.error = exc
                return out
            raise
        self._buf = buf[pos:] if pos < n else b""
        return out


# ----------------------------------------------------------------------------
# encoders
# ----------------------------------------------------------------------------

def varint(n: int) -> bytes:
    if n < 0x80:
        return bytes((n,))
    if n < 0x4000:
        return bytes(((n & 0x7F) | 0x80, n >> 7))
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _s(value: str) -> bytes:
    raw = value.encode("utf-8")
    return _U16.pack(len(raw)) + raw


def _b(value: bytes) -> bytes:
    return _U16.pack(len(value)) + value


def encode_properties(props: dict | None) -> bytes:
    if not props:
        return b"\x00"
    parts = []
    types = P.TYPES
    for ident, value in props.items():
        wire = types[ident]
        values = value if type(value) is list else (value,)
        for v in values:
            head = bytes((ident,)) if ident < 0x80 else varint(ident)
            if wire == P.BYTE:
                parts.append(head + bytes((v,)))
            elif wire == P.U16:
                parts.append(head + _U16.pack(v))
            elif wire == P.U32:
                parts.append(head + _U32.pack(v))
            elif wire == P.VARINT:
                parts.append(head + varint(v))
            elif wire == P.UTF8:
                parts.append(head + _s(v))
            elif wire == P.BINARY:
                parts.append(head + _b(v))
            else:
                parts.append(head + _s(v[0]) + _s(v[1]))
    body = b"".join(parts)
    return varint(len(body)) + body


def _packet(b0: int, body: bytes) -> bytes:
    n = len(body)
    if n < 0x80:
        return bytes((b0, n)) + body
    return bytes((b0,)) + varint(n) + body


def publish_head(topic: bytes, qos: int, retain: bool, dup: bool, packet_id: int, props: bytes | None,
                 payload_len: int) -> bytes:
    """Fixed header + variable header of a PUBLISH; the payload follows it.

    ``topic`` is already UTF-8 encoded; ``props`` is an encoded property
    block for MQTT 5 or None for 3.x.
    """
    b0 = 0x30 | (qos << 1) | (1 if retain else 0) | (8 if dup else 0)
    tl = len(topic)
    if props is None:
        # 3.x, on every QoS 1/2 delivery: the fixed header and the topic length packed at once
        rl = tl + (4 if qos else 2) + payload_len
        if rl < 0x80:
            head = _PUB_HEAD1.pack(b0, rl, tl)
        elif rl < 0x4000:
            head = _PUB_HEAD2.pack(b0, (rl & 0x7F) | 0x80, rl >> 7, tl)
        else:
            head = bytes((b0,)) + varint(rl) + _U16.pack(tl)
        return head + topic + _U16.pack(packet_id) if qos else head + topic
    vh = bytes((tl >> 8, tl & 0xFF)) + topic
    if qos:
        vh += bytes((packet_id >> 8, packet_id & 0xFF))
    if props is not None:
        vh += props
    rl = len(vh) + payload_len
    if rl < 0x80:
        return bytes((b0, rl)) + vh
    return bytes((b0,)) + varint(rl) + vh


def encode_publish(pkt: Publish, version: int) -> bytes:
    props = encode_properties(pkt.properties) if version == MQTT5 else None
    return publish_head(pkt.topic.encode("utf-8"), pkt.qos, pkt.retain, pkt.dup, pkt.packet_id, props,
                        len(pkt.payload)) + pkt.payload


def encode_ack(kind: int, packet_id: int, reason_code: int = 0, props: dict | None = None,
               version: int = MQTT311) -> bytes:
    """PUBACK / PUBREC / PUBREL / PUBCOMP."""
    b0 = (kind << 4) | (2 if kind == PUBREL else 0)
    if version != MQTT5 or (reason_code == 0 and not props):
        return bytes((b0, 2, packet_id >> 8, packet_id & 0xFF))
    if not props:
        return bytes((b0, 3, packet_id >> 8, packet_id & 0xFF, reason_code))
    return _packet(b0, _U16.pack(packet_id) + bytes((reason_code,)) + encode_properties(props))


def _e_connect(p: Connect, version):
    level = p.protocol_level
    flags = 0
    if p.clean_start:
        flags |= 0x02
    if p.will is not None:
        flags |= 0x04 | (p.will.qos << 3) | (0x20 if p.will.retain else 0)
    if p.password is not None:
        flags |= 0x40
    if p.username is not None:
        flags |= 0x80
    name = "MQIsdp" if level == MQTT31 else "MQTT"
    parts = [_s(name), bytes((level, flags)), _U16.pack(p.keepalive)]
    if level == MQTT5:
        parts.append(encode_properties(p.properties))
    parts.append(_s(p.client_id))
    if p.will is not None:
        if level == MQTT5:
            parts.append(encode_properties(p.will.properties))
        parts.append(_s(p.will.topic))
        parts.append(_b(p.will.payload))
    if p.username is not None:
        parts.append(_s(p.username))
    if p.password is not None:
        parts.append(_b(p.password))
    return _packet(0x10, b"".join(parts))


def _e_connack(p: Connack, version):
    body = bytes((1 if p.session_present else 0, p.reason_code))
    if version == MQTT5:
        body += encode_properties(p.properties)
    return _packet(0x20, body)


def _e_subscribe(p: Subscribe, version):
    parts = [_U16.pack(p.packet_id)]
    if version == MQTT5:
        parts.append(encode_properties(p.properties))
    for t in p.topics:
        opts = t.qos
        if version == MQTT5:
            opts |= (4 if t.no_local else 0) | (8 if t.retain_as_published else 0) | (t.retain_handling << 4)
        parts.append(_s(t.filter) + bytes((opts,)))
    return _packet(0x82, b"".join(parts))


def _e_suback(p: Suback, version):
    body = _U16.pack(p.packet_id)
    if version == MQTT5:
        body += encode_properties(p.properties)
    return _packet(0x90, body + bytes(p.reason_codes))


def _e_unsubscribe(p: Unsubscribe, version):
    parts = [_U16.pack(p.packet_id)]
    if version == MQTT5:
        parts.append(encode_properties(p.properties))
    parts.extend(_s(t) for t in p.topics)
    return _packet(0xA2, b"".join(parts))


def _e_unsuback(p: Unsuback, version):
    body = _U16.pack(p.packet_id)
    if version == MQTT5:
        body += encode_properties(p.properties) + bytes(p.reason_codes)
    return _packet(0xB0, body)


def _e_reason_only(b0):
    def enc(p, version):
        if version != MQTT5 or (p.reason_code == 0 and not p.properties):
            return bytes((b0, 0))
        if not p.properties:
            return bytes((b0, 1, p.reason_code))
        return _packet(b0, bytes((p.reason_code,)) + encode_properties(p.properties))

    return enc


_ENCODERS = {
    CONNECT: _e_connect,
    CONNACK: _e_connack,
    PUBLISH: encode_publish,
    PUBACK: lambda p, v: encode_ack(PUBACK, p.packet_id, p.reason_code, p.properties, v),
    PUBREC: lambda p, v: encode_ack(PUBREC, p.packet_id, p.reason_code, p.properties, v),
    PUBREL: lambda p, v: encode_ack(PUBREL, p.packet_id, p.reason_code, p.properties, v),
    PUBCOMP: lambda p, v: encode_ack(PUBCOMP, p.packet_id, p.reason_code, p.properties, v),
    SUBSCRIBE: _e_subscribe,
    SUBACK: _e_suback,
    UNSUBSCRIBE: _e_unsubscribe,
    UNSUBACK: _e_unsuback,
    PINGREQ: lambda p, v: b"\xc0\x00",
    PINGRESP: lambda p, v: b"\xd0\x00",
    DISCONNECT: _e_reason_only(0xE0),
    AUTH: _e_reason_only(0xF0),
}


def encode(packet, version: int = MQTT311) -> bytes:
    """Encode any packet for a connection speaking ``version``."""
    if packet.type == CONNECT:
        version = packet.protocol_level
    return _ENCODERS[packet.type](packet, version)


def packet_size(body_len: int) -> int:
    """Total size on the wire of a packet whose remaining length is ``body_len``."""
    return 1 + len(varint(body_len)) + body_len
